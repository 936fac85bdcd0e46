// On a GPU: backend options reach the CUDA backend (each switch, the environment as the fallback of a key
// left out, the string winning over it), and a hybrid context measures its offload thresholds at
// creation: figures in a plausible range, thresholds equal to the documented formula on the reported
// figures (computed here in float64), an explicit min_batch reported as an override, and
// offload_calibration=off giving the fixed thresholds back. Skipped without a CUDA device.
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <string>

#include "common/tiny_model.h"
#include "cuda/cuda_backend.h"
#include "context_pair.h"
#include "cuda_test_util.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using moe::test::ScopedEnv;
using moe::test::TinyModel;

struct CudaCtx {
    moe_context* ctx = nullptr;
    CudaCtx(const TinyModel& m, const char* options, const char* overrides = nullptr,
            const moe_sched_policy* policy = nullptr) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 256;
        p.n_ubatch = 64;
        p.device = MOE_DEVICE_CUDA;
        p.backend_options = options;
        p.tensor_overrides = overrides;
        p.policy = policy;
        const moe_status s = moe_context_create(m.get(), &p, &ctx);
        INFO(moe_last_error());
        REQUIRE(s == MOE_STATUS_OK);
    }
    ~CudaCtx() { moe_context_free(ctx); }
    moe::cuda::CudaBackend& backend() const { return static_cast<moe::cuda::CudaBackend&>(*ctx->device); }
    moe_sched_stats stats() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
        return st;
    }
};

}  // namespace

TEST_CASE("backend options reach the CUDA backend, the environment filling in keys left out", "[gpu]") {
    MOE_GPU_OR_SKIP();
    const TinyModel m("qwen3moe", "cuda_backend_options", 11, moe::test::pair_model_options(MOE_TYPE_Q8_0));
    {
        const CudaCtx c(m, "cuda_graphs=off,cuda_fusion=off,cuda_pdl=off,cuda_pull_copies=always");
        CHECK_FALSE(c.backend().graphs_enabled());
        CHECK_FALSE(c.backend().fusion_enabled());
        CHECK_FALSE(c.backend().pdl_enabled());
        CHECK(c.backend().pull_copies() == moe::PullCopies::ALWAYS);
    }
    {
        const CudaCtx c(m, "cuda_pull_copies=never");
        CHECK(c.backend().graphs_enabled());
        CHECK(c.backend().fusion_enabled());
        CHECK(c.backend().pull_copies() == moe::PullCopies::NEVER);
    }
    const ScopedEnv graphs("MOEINFER_CUDA_GRAPHS", "0");
    const ScopedEnv fusion("MOEINFER_CUDA_FUSION", "0");
    {
        const CudaCtx c(m, nullptr);
        CHECK_FALSE(c.backend().graphs_enabled());
        CHECK_FALSE(c.backend().fusion_enabled());
    }
    const CudaCtx c(m, "cuda_graphs=on");
    CHECK(c.backend().graphs_enabled());
    CHECK_FALSE(c.backend().fusion_enabled());
}

TEST_CASE("hybrid CUDA contexts measure their offload thresholds at creation", "[gpu]") {
    MOE_GPU_OR_SKIP();
    const TinyModel m("qwen3moe", "cuda_thresholds", 12, moe::test::pair_model_options(MOE_TYPE_Q8_0, 1152));
    const double E = m.info().n_expert, k = m.info().n_expert_used;
    const CudaCtx c(m, nullptr, "exps=CPU");
    const moe_sched_stats st = c.stats();
    INFO("link " << st.offload_link_gbps << " GB/s");
    // PCIe 3 x4 .. NVLink-C2C: 1 to 1000 GB/s.
    CHECK(st.offload_link_gbps > 1.0);
    CHECK(st.offload_link_gbps < 1000.0);
    CHECK(st.offload_min_batch_source[MOE_OFFLOAD_MUL_MAT] == MOE_THRESHOLD_DEFAULT);  // no dense weight in RAM
    for (int op : {MOE_OFFLOAD_MUL_MAT_ID, MOE_OFFLOAD_MOE_UP_GATE}) {
        INFO(moe_offload_op_name(op) << ": host " << st.offload_host_gbps[op] << ", device "
                                     << st.offload_device_gbps[op] << " GB/s x tokens, threshold "
                                     << st.offload_min_batch[op]);
        REQUIRE(st.offload_min_batch_source[op] == MOE_THRESHOLD_MEASURED);
        const double L = st.offload_link_gbps, H = st.offload_host_gbps[op], D = st.offload_device_gbps[op];
        CHECK(H > 0.0);
        // No D > H: this tiny model's products are launch-bound on the GPU, and a 32-core host with the int8
        // tiles matched them (2026-11-27, 2 x H200 machine: host 66.0, device 65.7 GB/s x tokens); the
        // threshold is then the cap, as the formula below says.
        CHECK(D > 0.0);
        const double saved = 1.0 / H - (D > 0.0 ? 1.0 / D : 0.0);
        const double cap = double(1 << 24);
        const double x = saved <= 0.0 ? cap : (1.0 / L) / saved * E / k;
        if (std::abs(x - std::round(x)) > 1e-9 * x) {
            CHECK(st.offload_min_batch[op] == std::clamp(std::ceil(x), 1.0, cap));
        } else {
            CHECK(std::abs(st.offload_min_batch[op] - x) <= 1.0);
        }
    }
    moe_sched_policy pol;
    moe_sched_policy_init(&pol);
    REQUIRE(moe_context_get_policy(c.ctx, &pol) == MOE_STATUS_OK);
    CHECK(pol.offload[MOE_OFFLOAD_MUL_MAT_ID].min_batch == st.offload_min_batch[MOE_OFFLOAD_MUL_MAT_ID]);

    pol.offload[MOE_OFFLOAD_MUL_MAT_ID].min_batch = 17;
    const CudaCtx o(m, nullptr, "exps=CPU", &pol);
    CHECK(o.stats().offload_min_batch[MOE_OFFLOAD_MUL_MAT_ID] == 17);
    CHECK(o.stats().offload_min_batch_source[MOE_OFFLOAD_MUL_MAT_ID] == MOE_THRESHOLD_OVERRIDE);

    const CudaCtx f(m, "offload_calibration=off", "exps=CPU");
    const moe_sched_stats fs = f.stats();
    CHECK(fs.offload_link_gbps == 0.0);
    for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        CHECK(fs.offload_min_batch_source[op] == MOE_THRESHOLD_DEFAULT);
        CHECK(fs.offload_min_batch[op] == (op == MOE_OFFLOAD_MUL_MAT ? 32 : static_cast<int32_t>(32 * E / k)));
    }
}

#endif  // MOEINFER_HAS_CUDA
