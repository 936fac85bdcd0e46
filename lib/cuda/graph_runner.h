// Runs spans of CUDA nodes as CUDA graphs, so that token generation (hundreds of small kernels per
// token) is not bound by kernel launches.
//
// A span is cut into chunks of consecutive nodes. Each chunk's kernels are captured from the stream
// (cudaStreamBeginCapture) into a graph, instantiated once and cached under the chunk's place in the
// span; the next time the chunk's signature (graph_signature.h) is the same, the cached executable is
// launched without capturing; when it differs, the chunk is captured again and the executable updated
// in place (cudaGraphExecUpdate; re-instantiated when the update is refused, e.g. a kernel more or
// less). Chunks are launched as soon as they are ready, so the GPU runs one while the next is prepared.
//
// Where the cuts go is learned per span identity: a node whose signature changed between two runs
// (a decode step's KV-cache write and attention: n_kv and the cache row move every token) is
// "volatile" until it has stayed the same for kQuietRuns runs of its span (with the stable KV
// addressing, core/models/model_graph.h, the attention changes once per 256 tokens: stable again soon
// after). While the device is idle when a span arrives (the host is the bottleneck: hybrid decoding,
// whose experts the host computes), chunks are maximal runs of stable or of volatile nodes: stable chunks
// replay with no capture at all; short volatile runs are launched eagerly (capturing and updating a few
// kernels costs more than launching them), longer ones are captured and updated. While the device is
// still busy with earlier work (all-GPU decoding, after a step's first span), volatile nodes join the
// chunks around them and those are captured and updated every step: programmatic dependent launch
// (launch.cuh) overlaps consecutive kernels inside a graph, but not across two graph launches or a graph
// and an eager launch, and the host's extra capture work runs in the device's shadow. (H100, PERF.md
// 2026-11-26: merged, all-GPU tg128 +3-5%; always merged, hybrid tg128 -4..-10%.)
//
// Anything that goes wrong with a graph (capture, instantiation, launch) sends the chunk to the eager
// path, which reports node errors exactly as without graphs. Not thread-safe (one per backend, which
// is driven by one thread at a time).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "cuda/graph_signature.h"

namespace moe::cuda {

// Counters since the runner was made (for tests and diagnostics).
struct GraphStats {
    uint64_t replays = 0;         // chunks launched from the cache without capturing
    uint64_t updates = 0;         // chunks captured again and updated in place
    uint64_t instantiations = 0;  // chunks captured and instantiated anew
    uint64_t failures = 0;        // captures, instantiations or launches that failed (then run eagerly)
    uint64_t eager_nodes = 0;     // nodes launched without a graph
    uint64_t merged_spans = 0;    // spans run with their volatile nodes merged into the chunks around them
};

class GraphRunner {
public:
    // Queues the kernels of node i of the span being run on `stream` (eagerly or into a capture),
    // returning its Status.
    using LaunchFn = std::function<Status(size_t i)>;

    // Chunks of at most kMaxChunk nodes (of equal lengths where volatile nodes are merged); volatile runs
    // shorter than kMinVolatileGraph run eagerly; at most kMaxEntries cached executables and kMaxPlans
    // learned span layouts (least recently used ones are dropped). A warm 48-layer decode step is 7 spans
    // (the scheduler hands a step over at the expert blocks of layers 0, 1, 3, 7, ...:
    // CudaBackend::cut_after) of 1-2 chunks when merged; a 94-layer model (Qwen3-235B) alternating prompt
    // ubatches and decode steps needs a few dozen layouts and executables.
    static constexpr size_t kMaxChunk = 128;
    static constexpr size_t kMinGraph = 2;
    static constexpr size_t kMinVolatileGraph = 4;
    static constexpr size_t kMaxEntries = 1024;
    static constexpr size_t kMaxPlans = 256;
    static constexpr uint8_t kQuietRuns = 16;

    GraphRunner(cudaStream_t stream, LaunchFn launch) : stream_(stream), launch_(std::move(launch)) {}
    ~GraphRunner();
    GraphRunner(const GraphRunner&) = delete;
    GraphRunner& operator=(const GraphRunner&) = delete;

    // Queues the kernels of `nodes` in order. REQUIRES: every node launches kernels (no NONE / VIEW),
    // the stream is not capturing, and the kernels need no allocation or synchronisation (scratch is
    // sized beforehand). `state`: words of backend state the kernels' arguments depend on besides
    // the nodes (the scratch block), part of every chunk's signature. `extra`: empty, or per node
    // what its launch computes besides the node itself (graph_signature.h).
    Status run(std::span<Tensor* const> nodes, std::span<const uint64_t> state, std::span<const NodeExtra> extra = {});

    const GraphStats& stats() const { return stats_; }

    // Whether volatile nodes join the chunks around them: kWhenDeviceBusy (default, above), or always /
    // never (tests).
    enum class Merge : uint8_t { kWhenDeviceBusy, kAlways, kNever };
    void set_merge(Merge m) { merge_ = m; }

private:
    struct Plan {
        std::vector<uint64_t> last;   // node hashes of the previous run
        std::vector<uint8_t> quiet;   // runs since the node's signature last changed, up to kQuietRuns
        uint64_t used = 0;
        bool is_volatile(size_t i) const { return quiet[i] < kQuietRuns; }
    };
    struct Entry {
        std::vector<uint64_t> words;  // state + the chunk's words when exec was made or last updated
        cudaGraphExec_t exec = nullptr;
        bool uncapturable = false;    // capturing these words failed: run them eagerly
        uint64_t used = 0;
    };

    Plan& plan_for(uint64_t identity, size_t n);
    // True when the chunk was queued through a graph; false: nothing of it was queued.
    // Chunks are nodes [a, b) of the span being run.
    bool run_chunk(uint64_t key, size_t a, size_t b, std::span<const uint64_t> state, std::span<const uint64_t> words);
    cudaGraph_t capture(size_t a, size_t b);
    Entry& insert(uint64_t key);
    Status eager(size_t a, size_t b);

    cudaStream_t stream_;
    LaunchFn launch_;
    SpanSignature sig_;
    std::unordered_map<uint64_t, Plan> plans_;
    std::unordered_map<uint64_t, Entry> entries_;
    uint64_t tick_ = 0;
    Merge merge_ = Merge::kWhenDeviceBusy;
    GraphStats stats_;
};

}  // namespace moe::cuda
