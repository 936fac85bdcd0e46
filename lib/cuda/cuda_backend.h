// The CUDA backend: device buffers, pinned host buffers, a compute stream, a copy stream, a stream for
// copies from other GPUs, and relays that upload through other GPUs' host links.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/backend_config.h"
#include "core/upload_share.h"
#include "cuda/fusion_plan.h"
#include "cuda/graph_runner.h"
#include "cuda/upload_relay.h"

namespace moe::cuda {

// Device memory (cudaMalloc on `device`), counted by DeviceMemoryMeter::of("cuda") (core/device_memory.h).
class DeviceBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, int device, size_t size);
    ~DeviceBuffer() override;
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return false; }

private:
    DeviceBuffer(Backend* b, int device, void* data, size_t size) : Buffer(b), device_(device), data_(data), size_(size) {}
    int device_;
    void* data_;
    size_t size_;
};

// Page-locked host memory (cudaHostAlloc, portable: pinned for every GPU of the process, as host-resident
// weights and staged activations serve the backends of several GPUs): weights that stay in RAM but may be
// uploaded. Pinned memory roughly doubles H2D bandwidth over pageable (mmap'd) memory.
class PinnedHostBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, size_t size);
    ~PinnedHostBuffer() override;
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return true; }

private:
    PinnedHostBuffer(Backend* b, void* data, size_t size) : Buffer(b), data_(data), size_(size) {}
    void* data_;
    size_t size_;
};

// The CUDA backend. compute() queues each node's kernels on the compute stream (asynchronously; a
// node's Status covers its arguments and launch); synchronize() waits and reports what only the device
// could find (an out-of-range id). The copy helpers run on the copy stream and are ordered against the
// compute stream with events, never with a device-wide synchronisation.
//
// compute() runs spans through CUDA graphs (graph_runner.h) unless they are disabled: by the
// backend option cuda_graphs=off (or MOEINFER_CUDA_GRAPHS=0) when the backend is created, or set_graphs_enabled().
// Results are bitwise the same either way; graphs only remove launch overhead.
//
// compute() also runs common runs of small nodes as one launch (fusion_plan.h: q/k/v products of one
// activation, residual add + norm, router top-k + softmax; norms hand their result to the products
// that read it already quantised), unless cuda_fusion=off (MOEINFER_CUDA_FUSION=0) at creation or
// set_fusion_enabled(false). Fused launches compute each node's result with the same arithmetic up
// to the order of float sums (RMS norms); the backend-consistency tests hold either way.
//
// On devices of compute capability 9.0+ kernels can be launched with programmatic dependent launch
// (launch.cuh: each kernel is launched before its predecessor in the stream has completed, and waits
// for it on the device): on by default (cuda_backend.cu, kPdlByDefault); cuda_pdl=off (MOEINFER_CUDA_PDL=0)
// at creation, or set_pdl_enabled(false), turns it off.
// Results are bitwise the same either way; PDL only hides the gap between kernels.
//
// A backend owns one GPU (device()): its streams, events, cuBLAS handle and workspace, scratch, graph
// executables and its device's properties (SM count, PDL support) are made on that GPU, and every
// public call makes it current for its duration (device_scope.h), restoring the caller's device, so
// backends on several GPUs can be driven from one thread in any order. Kernel attributes (dynamic
// shared memory above 48 KiB) are set before each launch, on the current device, so they hold on every
// GPU. What it allocates on the host (pinned buffers, registered ranges, the error word) is portable.
class CudaBackend final : public Backend {
public:
    // The switches of `config` (graphs, fusion, PDL, pull copies); create(device) reads them from the
    // environment as a context without backend_options does. `device`: the CUDA ordinal;
    // INVALID_ARGUMENT naming it when there is no such GPU, FAILED_PRECONDITION when there is none.
    static StatusOr<std::unique_ptr<Backend>> create(int device, const BackendConfig& config);
    static StatusOr<std::unique_ptr<Backend>> create(int device);
    ~CudaBackend() override;

    const char* name() const override { return "cuda"; }
    bool is_host() const override { return false; }
    bool supports_op(const Tensor& node) const override;
    StatusOr<std::unique_ptr<Buffer>> alloc_buffer(size_t size) override;
    StatusOr<std::unique_ptr<Buffer>> alloc_pinned_host_buffer(size_t size);
    Status compute(std::span<Tensor* const> nodes) override;
    Status synchronize() override;
    // At the expert blocks of layers 0, 1, 3, 7, ... (step_cut_after: after the up/gate GEMV when decoding,
    // after the down product in prefills), where the fusion plan joins nothing across, so the device starts
    // on the first layers while the host prepares the rest.
    bool cut_after(const Tensor& node) const override { return step_cut_after(node); }

    // Queues a copy of n bytes from host memory to device memory of this backend on the compute stream
    // (not behind uploads on the copy stream): after every compute queued before the call, before
    // every compute queued after it. src_host must stay valid and unchanged until synchronize() or a
    // fence marked after the copy (for pinned memory the copy is truly asynchronous).
    Status copy_to_device(void* dst_dev, const void* src_host, size_t n) override;
    // Queues a copy of n bytes from device memory to host memory on the compute stream, after every
    // compute queued before the call. The bytes are in place after synchronize() or a later fence.
    Status copy_to_host(void* dst_host, const void* src_dev, size_t n) override;
    // Two or more regions: a kernel gathers them into a device staging block (grow-only; growing it
    // synchronises), then one copy to the host, both on the compute stream.
    Status gather_to_host(void* dst_host, std::span<const DeviceRegion> regions) override;

    StatusOr<std::unique_ptr<Buffer>> alloc_host_buffer(size_t size) override { return alloc_pinned_host_buffer(size); }
    // cudaHostRegister (portable; read-only for a read-only mapping, where the device supports it:
    // UNIMPLEMENTED otherwise), counted in the process's "cuda" HostRegistry so that contexts share a
    // range; cudaHostUnregister when its last holder lets go.
    StatusOr<std::unique_ptr<Buffer>> register_host(void* p, size_t n, bool read_only) override;
    size_t free_memory() const override;
    StatusOr<uint64_t> mark_compute() override;
    // On the copy stream; with upload relays, the relays' shares of a large copy through them
    // (core/upload_share.h evens out the bytes each link carried).
    Status upload(void* dst_dev, const void* src_host, size_t n, uint64_t after) override;
    Status read_now(void* dst_host, const void* src_dev, size_t n) override;
    Status wait_fence(uint64_t fence) override;
    Status order_after_uploads() override;
    // cudaDeviceEnablePeerAccess from this GPU to the peer's, where cudaDeviceCanAccessPeer says it can
    // (false where it cannot, the peer is no CUDA backend, or the GPU has as many peers as it may);
    // enabled once per process and pair. The same GPU: true (its own memory).
    StatusOr<bool> enable_peer_access(Backend& peer) override;
    // cudaMemcpyPeerAsync on this backend's peer stream, which waits for an event recorded on the peer's
    // compute stream; this compute stream and the peer's wait for an event recorded after the copy.
    Status copy_from_peer(void* dst_dev, Backend& peer, const void* src_dev, size_t n) override;
    // A relay through the partner's GPU (cuda/upload_relay.h: kRelaySlots slots of kRelaySlotBytes there),
    // with peer access enabled both ways; false where the GPUs have none, the partner is this GPU or no
    // CUDA backend, or (measure) the peer link is under twice the partner's host link. Idempotent.
    StatusOr<bool> add_upload_relay(Backend& partner, bool measure) override;
    uint64_t relayed_bytes() const override { return relayed_bytes_; }
    // Whether compute() uses CUDA graphs (default: on, unless cuda_graphs=off at create()).
    // REQUIRES: nothing queued by compute() is still capturing (always true between calls).
    void set_graphs_enabled(bool on) { graphs_enabled_ = on; }
    bool graphs_enabled() const { return graphs_enabled_; }
    // Whether compute() fuses nodes (default: on, unless cuda_fusion=off at create()).
    void set_fusion_enabled(bool on) { fusion_enabled_ = on; }
    bool fusion_enabled() const { return fusion_enabled_; }
    // Whether kernels are launched with PDL (default: on, unless cuda_pdl=off at create()).
    // Always off on devices below compute capability 9.0.
    void set_pdl_enabled(bool on) { pdl_enabled_ = on && pdl_supported_; }
    bool pdl_enabled() const { return pdl_enabled_; }
    // When copy_to_device pulls page-locked bytes with a kernel instead of a DMA copy (mapped_copy.cuh).
    // WHILE_UPLOADING (the default): only while weight uploads are in flight on the copy stream, which
    // a DMA copy would queue behind; without them the DMA copy is faster (hybrid TG measured 10% slower
    // with every copy pulled). cuda_pull_copies=never / always (core/backend_config.h) selects the others.
    using PullCopies = moe::PullCopies;
    void set_pull_copies(PullCopies mode) { pull_copies_ = mode; }
    PullCopies pull_copies() const { return pull_copies_; }
    // The launches of the last compute(), and counts since create() (for tests and diagnostics).
    const FusionPlan& last_plan() const { return plan_; }
    struct FusionStats {
        uint64_t fused[kFusedKinds] = {};  // launches per FusedKind (kNone: nodes launched alone)
        uint64_t q8_reused = 0;  // GEMV launches that took their activation from a norm's Q8 slot
    };
    const FusionStats& fusion_stats() const { return fusion_stats_; }
    const GraphStats& graph_stats() const { return graphs_->stats(); }
    // Whether the graph runner merges volatile nodes into the chunks around them (GraphRunner::Merge; tests).
    void set_graph_merge(GraphRunner::Merge m) { graphs_->set_merge(m); }

    cudaStream_t compute_stream() const { return compute_stream_; }
    cudaStream_t copy_stream() const { return copy_stream_; }
    int device() const { return device_; }
    int n_sm() const { return n_sm_; }

private:
    explicit CudaBackend(int device) : device_(device) {}
    // Queues launch i of plan_ (eagerly or into a capture); the Status names its node on failure.
    // Never allocates or synchronises. REQUIRES: scratch holds scratch_bytes(node) and the slots.
    Status launch_item(size_t i);
    size_t scratch_bytes(const Tensor& node) const;
    Status ensure_scratch(size_t bytes);
    Status regrow(void*& block, size_t& size, size_t bytes, const char* what);

    int device_;
    int n_sm_ = 0;
    cudaStream_t compute_stream_ = nullptr;
    cudaStream_t copy_stream_ = nullptr;
    cudaEvent_t copy_mark_ = nullptr;     // recorded on the copy stream; the compute stream waits on it
    // copy_from_peer: copies from another GPU run here, neither behind weight uploads (copy stream) nor
    // holding up compute queued before them. peer_ready_ is recorded on this compute stream when another
    // backend copies from this GPU; peer_done_ after a copy into it.
    cudaStream_t peer_stream_ = nullptr;
    cudaEvent_t peer_ready_ = nullptr;
    cudaEvent_t peer_done_ = nullptr;
    // Upload relays (add_upload_relay) and the bytes each link carried lately: [0] this GPU's own, [1 + r]
    // relay r.
    static constexpr size_t kRelaySlotBytes = UploadShareLimits{}.chunk;  // a relayed piece fills one slot
    static constexpr int kRelaySlots = 4;
    std::vector<std::unique_ptr<UploadRelay>> relays_;
    LinkShares links_;
    uint64_t relayed_bytes_ = 0;
    // Compute fences: fence f is fences_[f % kFences], re-recorded every kFences marks. Waiting on a
    // re-recorded event waits for later compute than asked (only ever queued before the waiter), so a
    // stale fence is conservative, never wrong.
    static constexpr int kFences = 64;
    cudaEvent_t fences_[kFences] = {};
    uint64_t next_fence_ = 1;
    cudaEvent_t readback_done_ = nullptr;
    cublasHandle_t cublas_ = nullptr;     // bound to compute_stream_, with cublas_workspace_
    void* cublas_workspace_ = nullptr;    // fixed, so that cuBLAS never allocates (in a capture)
    void* scratch_ = nullptr;             // device memory for kernels' temporaries, grow-only
    size_t scratch_size_ = 0;
    void* gather_ = nullptr;              // device staging of gather_to_host, grow-only
    size_t gather_size_ = 0;
    unsigned int* error_flags_ = nullptr;      // mapped pinned host word (host address)
    unsigned int* error_flags_dev_ = nullptr;  // the same word's device address
    // Split-K attention: per (row tile, KV head) arrival counters, zero between launches (the last
    // block of a tile resets its own).
    unsigned int* attn_counters_ = nullptr;
    bool graphs_enabled_ = true;
    bool fusion_enabled_ = true;
    bool pdl_supported_ = false;  // compute capability 9.0+
    bool pdl_enabled_ = false;
    KquantGemv kquant_gemv_ = BackendConfig{}.kquant_gemv;  // OpContext::kquant_gemv
    FloatGemv float_gemv_ = BackendConfig{}.float_gemv;     // OpContext::float_gemv
    PullCopies pull_copies_ = PullCopies::WHILE_UPLOADING;
    ExpertGemmDecode expert_decode_ = BackendConfig{}.expert_gemm_decode;  // OpContext::expert_decode
    std::unique_ptr<GraphRunner> graphs_;
    std::vector<Tensor*> kernel_nodes_;  // compute()'s nodes that launch kernels (reused storage)
    FusionPlan plan_;                    // compute()'s launches
    std::vector<Tensor*> launch_nodes_;  // plan_.items[i].node
    std::vector<NodeExtra> extras_;      // per launch: what it computes besides its node
    void* slots_ = nullptr;              // Q8 activation slots of plan_, inside the scratch block
    FusionStats fusion_stats_;
};

// Number of usable CUDA devices (0 when there is no driver or no GPU).
int device_count();
// OK when CUDA device `device` exists; INVALID_ARGUMENT naming it and the devices there are otherwise
// (FAILED_PRECONDITION when there is none at all).
Status check_device(int device);

// Registers "cuda" in the backend registry (called by the generated backends_init.cpp).
void register_backend();

}  // namespace moe::cuda
