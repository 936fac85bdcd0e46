// Programmatic dependent launch in the CUDA backend (lib/cuda/launch.cuh): each kernel is launched
// while its predecessor still runs and must wait for it on the device.
//
// On a device ("[gpu]"; the PDL cases also need compute capability 9.0+, else they say so and stop):
//   - a chain of dependent kernels (each reads what the one before wrote) gives the CPU's result bit for
//     bit, launched eagerly and through CUDA graphs (a kernel that read before its wait could see a stale
//     input, off by a whole addend; the window is short — the next kernel starts as the previous grid
//     exits — so a missing wait is caught by the source check tests/lint/check_pdl_waits.py, not here);
//   - a span captured from the backend's stream holds programmatic edges between its kernels with PDL
//     on, and none with it off (the attribute survives stream capture);
//   - whole decodes (qwen3moe, gpt-oss; prompt and single-token steps, CUDA graphs on; all on the GPU
//     and hybrid with experts in RAM) give bitwise the logits of a context created with MOEINFER_CUDA_PDL=0.
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/graph.h"
#include "cuda/cuda_backend.h"
#include "context_pair.h"
#include "cuda_test_util.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using moe::Tensor;
using moe::Type;
using moe::test::Device;
using moe::test::CudaContextPair;
using moe::test::fresh_rng;
using moe::test::kPairSteps;
using moe::test::random_f32;
using moe::test::require_ok;
using moe::test::run_seed;
using moe::test::ScopedEnv;
using moe::test::pair_model_options;
using moe::test::TinyModel;

#define MOE_PDL_OR_SKIP(be)                                                   \
    do {                                                                      \
        if (!(be).pdl_enabled()) {                                            \
            WARN("skipped: the device has no PDL (compute capability < 9.0)"); \
            return;                                                           \
        }                                                                     \
    } while (0)

// y = x + c + c + ... (kSteps ADD nodes, each reading the previous one's output).
constexpr int kSteps = 128;
constexpr int64_t kN = int64_t{1} << 20;  // 4 MiB per operand: each kernel spans several waves

struct Chain {
    moe::Graph g;
    Tensor* x = nullptr;
    Tensor* y = nullptr;
};

// Builds the chain on a fresh random constant operand c and returns c's values.
template <typename Rng>
std::vector<float> build_chain(Device& dev, Chain& ch, Rng& rng) {
    std::vector<float> cv = random_f32(rng, static_cast<size_t>(kN), 0.5f, 1.5f);
    Tensor* c = dev.leaf(Type::F32, {kN}, cv.data());
    ch.x = ch.g.input(Type::F32, {kN}, "x");
    Tensor* y = ch.x;
    for (int i = 0; i < kSteps; ++i) y = ch.g.add(y, c);
    ch.g.set_output(y);
    ch.y = y;
    const moe::AllocPlan plan = moe::plan_allocation(ch.g);
    moe::bind_allocation(ch.g, plan, dev.alloc(plan.arena_size));
    return cv;
}

// Programmatic edges in a graph captured from the backend's stream while it computes `nodes` eagerly.
size_t programmatic_edges(Device& dev, const moe::Graph& g) {
    cudaStream_t s = dev.be().compute_stream();
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    const moe::Status st = dev.be().compute(g.nodes());
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    require_ok(st);
    size_t n = 0;
    REQUIRE(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n) == cudaSuccess);
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    REQUIRE(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n) == cudaSuccess);
    size_t programmatic = 0;
    for (size_t i = 0; i < n; ++i) programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
    REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
    return programmatic;
}

}  // namespace

TEST_CASE("PDL launches keep a chain of dependent kernels in order", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    dev.be().set_pdl_enabled(true);  // stays off on devices without PDL
    MOE_PDL_OR_SKIP(dev.be());
    auto rng = fresh_rng(4242);
    const std::vector<float> xv = random_f32(rng, static_cast<size_t>(kN), -1.0f, 1.0f);
    Chain ch;
    const std::vector<float> cv = build_chain(dev, ch, rng);
    std::vector<float> want(xv);
    for (int i = 0; i < kSteps; ++i) {
        for (size_t j = 0; j < want.size(); ++j) want[j] = want[j] + cv[j];
    }
    const auto run = [&] {
        dev.poison(*ch.y);
        dev.upload(ch.x->data, xv.data(), ch.x->n_bytes());
        require_ok(dev.be().compute(ch.g.nodes()));
        require_ok(dev.be().synchronize());
        const std::vector<uint8_t> got = dev.download(*ch.y);
        REQUIRE(got.size() == want.size() * sizeof(float));
        return std::memcmp(got.data(), want.data(), got.size()) == 0;
    };
    INFO("seed " << run_seed());
    dev.be().set_graphs_enabled(false);
    CHECK(run());
    dev.be().set_graphs_enabled(true);
    const uint64_t replays = dev.be().graph_stats().replays;
    for (int i = 0; i < 3; ++i) CHECK(run());  // captured, then replayed
    CHECK(dev.be().graph_stats().replays > replays);
}

TEST_CASE("PDL launches keep a chain of small early-triggering kernels in order", "[gpu]") {
    // y <- rms_norm(y + c) * w, 64 times, on one row of 2048: each step is one fused row chain on a few
    // blocks, which lets the next step launch right after its own wait (pdl_grid_sync_small) and reads
    // the previous step's result. A step run early would read a stale row: the bits would differ from
    // the run without PDL.
    MOE_GPU_OR_SKIP();
    Device dev;
    dev.be().set_pdl_enabled(true);
    MOE_PDL_OR_SKIP(dev.be());
    constexpr int kChain = 64;
    constexpr int64_t kRow = 2048;
    auto rng = fresh_rng(4244);
    const std::vector<float> xv = random_f32(rng, static_cast<size_t>(kRow), -2.0f, 2.0f);
    const std::vector<float> cv = random_f32(rng, static_cast<size_t>(kRow), -1.0f, 1.0f);
    const std::vector<float> wv = random_f32(rng, static_cast<size_t>(kRow), 0.5f, 1.5f);
    Tensor* c = dev.leaf(Type::F32, {kRow}, cv.data());
    Tensor* w = dev.leaf(Type::F32, {kRow}, wv.data());
    moe::Graph g;
    Tensor* x = g.input(Type::F32, {kRow, 1}, "x");
    Tensor* y = x;
    for (int i = 0; i < kChain; ++i) y = g.rms_norm(g.add(y, c), w, 1e-6f);
    g.set_output(y);
    const moe::AllocPlan plan = moe::plan_allocation(g);
    moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
    const auto run = [&] {
        dev.poison(*y);
        dev.upload(x->data, xv.data(), x->n_bytes());
        require_ok(dev.be().compute(g.nodes()));
        require_ok(dev.be().synchronize());
        return dev.download(*y);
    };
    dev.be().set_pdl_enabled(false);
    dev.be().set_graphs_enabled(false);
    const std::vector<uint8_t> want = run();
    // The chain itself, against float64 on the host (|err| <= 1e-3: 64 normalisations in float).
    std::vector<double> ref(xv.begin(), xv.end());
    for (int i = 0; i < kChain; ++i) {
        double ss = 0.0;
        for (int64_t j = 0; j < kRow; ++j) {
            ref[static_cast<size_t>(j)] += cv[static_cast<size_t>(j)];
            ss += ref[static_cast<size_t>(j)] * ref[static_cast<size_t>(j)];
        }
        const double scale = 1.0 / std::sqrt(ss / static_cast<double>(kRow) + 1e-6);
        for (int64_t j = 0; j < kRow; ++j) ref[static_cast<size_t>(j)] *= scale * wv[static_cast<size_t>(j)];
    }
    std::vector<float> got(static_cast<size_t>(kRow));
    std::memcpy(got.data(), want.data(), want.size());
    double worst = 0.0;
    for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::fabs(got[j] - ref[j]));
    INFO("seed " << run_seed() << ", worst error " << worst);
    CHECK(worst <= 1e-3);
    dev.be().set_pdl_enabled(true);
    CHECK(run() == want);  // eager
    dev.be().set_graphs_enabled(true);
    for (int i = 0; i < 3; ++i) CHECK(run() == want);  // captured, then replayed
}

TEST_CASE("PDL launches become programmatic edges under stream capture", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    dev.be().set_pdl_enabled(true);  // stays off on devices without PDL
    MOE_PDL_OR_SKIP(dev.be());
    auto rng = fresh_rng(4243);
    Chain ch;
    (void)build_chain(dev, ch, rng);
    dev.be().set_graphs_enabled(false);  // launches go straight to the stream being captured
    require_ok(dev.be().compute(ch.g.nodes()));  // sizes everything first: a capture must not allocate
    require_ok(dev.be().synchronize());
    CHECK(programmatic_edges(dev, ch.g) == kSteps - 1);
    dev.be().set_pdl_enabled(false);
    CHECK(programmatic_edges(dev, ch.g) == 0);
}

TEST_CASE("cuda contexts give the same logits with and without PDL", "[gpu]") {
    MOE_GPU_OR_SKIP();
    std::mt19937 rng(static_cast<uint32_t>(run_seed()));
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch << ", seed " << run_seed());
        const bool oss = std::strcmp(arch, "gpt-oss") == 0;
        const TinyModel model(arch, "moe_cuda_pdl", rng(),
                              pair_model_options(oss ? MOE_TYPE_MXFP4 : MOE_TYPE_Q8_0, oss ? 2880 : 1152));
        const ScopedEnv graphs("MOEINFER_CUDA_GRAPHS", "1");
        const CudaContextPair pair(model, "MOEINFER_CUDA_PDL");
        REQUIRE_FALSE(pair.off_backend().pdl_enabled());
        REQUIRE(pair.on_backend().graphs_enabled());
        REQUIRE(pair.off_backend().graphs_enabled());
        MOE_PDL_OR_SKIP(pair.on_backend());
        pair.expect_same_logits(model.info().n_vocab, rng, kPairSteps);
        CHECK(pair.on_backend().graph_stats().replays > 0);  // the single-token steps replayed captured graphs
    }
}

// Hybrid contexts (experts in RAM): PDL must also keep kernels behind the copy stream's uploads (events),
// the host parts' results (every activation copy pulled by a kernel reading page-locked memory here) and
// the split's sums. Expert uploads from 4 tokens on, a fixed split: the same work on both sides.
TEST_CASE("hybrid cuda contexts give the same logits with and without PDL", "[gpu]") {
    MOE_GPU_OR_SKIP();
    std::mt19937 rng(static_cast<uint32_t>(run_seed()));
    const ScopedEnv pull("MOEINFER_CUDA_PULL_COPIES", "1");
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        const TinyModel model(arch, "moe_cuda_pdl_hybrid", rng(), pair_model_options(MOE_TYPE_Q8_0));
        for (const int32_t split : {0, 3}) {
            INFO(arch << ", split " << split << ", seed " << run_seed());
            moe_sched_policy pol;
            moe_sched_policy_init(&pol);
            REQUIRE(moe_sched_policy_parse_offload(&pol, "all=4") == MOE_STATUS_OK);
            pol.expert_copy = MOE_EXPERT_COPY_ACTIVE_PREFETCH;
            pol.expert_split = split;
            const CudaContextPair pair(model, "MOEINFER_CUDA_PDL", "exps=CPU", &pol);
            REQUIRE_FALSE(pair.off_backend().pdl_enabled());
            MOE_PDL_OR_SKIP(pair.on_backend());
            pair.expect_same_logits(model.info().n_vocab, rng, kPairSteps);
        }
    }
}

#endif  // MOEINFER_HAS_CUDA
