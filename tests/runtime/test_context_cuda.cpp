// All-GPU contexts (MOE_DEVICE_CUDA) against the CPU path, through the public C API, on small
// synthetic models of both architectures. Tolerance as in tests/python/test_forward_cuda.py:
// batches of more than 8 tokens use BF16 tensor cores (~4e-3 relative per product), so per token
// cosine > 0.999 and max |gpu - cpu| <= 3e-2 * max |cpu|. A token whose top-k router logits nearly
// tie may legitimately pick another expert under that rounding (a few % of tokens on these tiny
// random models), so up to 10% of the rows of a token stream may miss the bound; more means a wrong op.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/logits_check.h"
#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "../cuda/context_pair.h"
#include "cuda/cuda_backend.h"
#include "runtime/context.h"
#endif

#if MOEINFER_HAS_CUDA
namespace {

using moe::test::rows_off;

struct Ctx {
    moe_context* ctx = nullptr;
    ~Ctx() { moe_context_free(ctx); }
};

std::vector<float> decode(moe_context* ctx, const std::vector<int32_t>& tokens, int32_t n_vocab) {
    REQUIRE(moe_decode(ctx, tokens.data(), nullptr, static_cast<int32_t>(tokens.size()), 1) == MOE_STATUS_OK);
    const float* logits = nullptr;
    int32_t rows = 0, nv = 0;
    REQUIRE(moe_get_logits(ctx, &logits, &rows, &nv) == MOE_STATUS_OK);
    REQUIRE(nv == n_vocab);
    return std::vector<float>(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
}

// Writes and loads a tiny synthetic model (head_dim 64: the CUDA attention kernels cover 32..256).
moe_model* load_tiny(const std::string& path, const char* arch, int32_t expert_type, uint64_t seed,
                     moe_model_info* info, float skew = 0.0f, int32_t n_layer = 0) {
    moe_synth_params sp;
    REQUIRE(moe_synth_params_init(&sp, arch) == MOE_STATUS_OK);
    sp.preset = "tiny";
    sp.head_dim = 64;
    sp.expert_type = expert_type;
    sp.dense_type = MOE_TYPE_Q8_0;
    sp.routing_skew = skew;
    sp.n_layer = n_layer;
    sp.seed = seed;
    REQUIRE(moe_synth_write(path.c_str(), &sp) == MOE_STATUS_OK);
    moe_model* model = nullptr;
    REQUIRE(moe_model_load(path.c_str(), nullptr, &model) == MOE_STATUS_OK);
    moe_model_info_init(info);
    REQUIRE(moe_model_get_info(model, info) == MOE_STATUS_OK);
    return model;
}


}  // namespace
#endif

TEST_CASE("cuda contexts match the cpu path", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
    return;
#else
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        for (int32_t expert_type : {MOE_TYPE_Q8_0, MOE_TYPE_Q4_0, MOE_TYPE_MXFP4}) {
            INFO(arch << " expert type " << moe_type_name(expert_type));
            // The system temp dir, not the build tree: GPU tests may run from a binary built elsewhere.
            const std::string path = (std::filesystem::temp_directory_path() / (std::string("moe_cuda_ctx_") + arch + ".gguf")).string();
            moe_model_info info;
            moe_model* model = load_tiny(path, arch, expert_type, rng(), &info);

            moe_context_params p;
            moe_context_params_init(&p);
            p.n_ctx = 256;
            p.n_ubatch = 32;
            p.device = MOE_DEVICE_CPU;  // the reference (the default, auto, would pick the GPU here)
            Ctx cpu, gpu;
            REQUIRE(moe_context_create(model, &p, &cpu.ctx) == MOE_STATUS_OK);
            p.device = MOE_DEVICE_CUDA;
            REQUIRE(moe_context_create(model, &p, &gpu.ctx) == MOE_STATUS_OK);

            std::uniform_int_distribution<int32_t> tok(0, info.n_vocab - 1);
            // The 10% allowance counts over the whole stream (65 tokens), not per batch: one flipped
            // router choice can take 2 rows of a 17-token batch out of the bound.
            size_t off = 0, rows = 0;
            for (int n : {40, 5, 1, 1, 1, 17}) {  // prefill past the GEMM threshold, then GEMV sizes
                std::vector<int32_t> tokens(static_cast<size_t>(n));
                for (auto& t : tokens) t = tok(rng);
                off += rows_off(decode(gpu.ctx, tokens, info.n_vocab), decode(cpu.ctx, tokens, info.n_vocab), info.n_vocab);
                rows += tokens.size();
            }
            INFO(off << " of " << rows << " rows outside the bound");
            CHECK(off * 10 <= rows);
            moe_context_free(cpu.ctx);
            moe_context_free(gpu.ctx);
            cpu.ctx = gpu.ctx = nullptr;
            moe_model_free(model);
        }
    }
#endif
}

TEST_CASE("hybrid cuda contexts match the cpu path", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
    return;
#else
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        const std::string path =
            (std::filesystem::temp_directory_path() / (std::string("moe_cuda_hybrid_") + arch + ".gguf")).string();
        // 6 layers: 18 expert uploads per ubatch, so the slot ring is reused within every ubatch.
        moe_model_info info;
        moe_model* model = load_tiny(path, arch, MOE_TYPE_Q8_0, rng(), &info, 0.5f, 6);
        std::uniform_int_distribution<int32_t> tok(0, info.n_vocab - 1);
        std::vector<std::vector<int32_t>> batches;
        for (int n : {40, 5, 1, 1, 17}) {
            std::vector<int32_t> t(static_cast<size_t>(n));
            for (auto& x : t) x = tok(rng);
            batches.push_back(t);
        }
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 256;
        p.n_ubatch = 32;
        p.device = MOE_DEVICE_CPU;  // the reference (the default, auto, would pick the GPU here)
        Ctx cpu;
        REQUIRE(moe_context_create(model, &p, &cpu.ctx) == MOE_STATUS_OK);
        std::vector<std::vector<float>> want;
        for (const auto& b : batches) want.push_back(decode(cpu.ctx, b, info.n_vocab));

        struct Config {
            const char* overrides;
            const char* offload;
            int32_t copy;
            int32_t dup;
            int32_t slots = 0;  // offload budget in upload slots (0: automatic, 8); 4 is the minimum
            int32_t split = 0;  // expert_split: experts per layer on the host (-1: automatic)
        };
        const Config configs[] = {
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_FULL, 1},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_ACTIVE_ONLY, 1},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_ACTIVE_ONLY, 0},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_ACTIVE_PREFETCH, 1},
            {"ffn_(up|gate|down)_exps\\.weight=CPU", nullptr, MOE_EXPERT_COPY_FULL, 0},
            {"blk\\.0\\.=CPU", "all=2", MOE_EXPERT_COPY_FULL, 1},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_FULL, 1, 4},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_ACTIVE_PREFETCH, 0, 4},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_FULL, 1, 0, 3},
            {"exps=CPU", "all=4", MOE_EXPERT_COPY_ACTIVE_PREFETCH, 0, 4, 5},
            {"ffn_(up|gate|down)_exps\\.weight=CPU", "all=4", MOE_EXPERT_COPY_FULL, 1, 0, MOE_EXPERT_SPLIT_AUTO},
        };
        int32_t down_index = -1;
        REQUIRE(moe_model_find_tensor(model, "blk.0.ffn_down_exps.weight", &down_index) == MOE_STATUS_OK);
        moe_tensor_info down;
        moe_tensor_info_init(&down);
        REQUIRE(moe_model_get_tensor(model, down_index, &down) == MOE_STATUS_OK);
        for (const Config& c : configs) {
            INFO(arch << " -ot " << c.overrides << " offload " << (c.offload ? c.offload : "(default)") << " copy "
                      << c.copy << " dup " << c.dup << " slots " << c.slots << " split " << c.split);
            moe_sched_policy pol;
            moe_sched_policy_init(&pol);
            if (c.offload) REQUIRE(moe_sched_policy_parse_offload(&pol, c.offload) == MOE_STATUS_OK);
            pol.expert_copy = c.copy;
            pol.bias_dup = c.dup;
            pol.expert_split = c.split;
            pol.offload_vram_budget = static_cast<uint64_t>(c.slots) * down.n_bytes;  // all expert tensors are this size
            p.device = MOE_DEVICE_CUDA;
            p.tensor_overrides = c.overrides;
            p.policy = &pol;
            Ctx gpu;
            const moe_status s = moe_context_create(model, &p, &gpu.ctx);
            INFO(moe_last_error());
            REQUIRE(s == MOE_STATUS_OK);
            // Over the whole stream (64 tokens): a near-tied router choice that flips under BF16 rounding
            // (more likely with 6 layers) may take one row of a 5-token batch out of the bound.
            size_t off = 0, rows = 0;
            for (size_t i = 0; i < batches.size(); ++i) {
                off += rows_off(decode(gpu.ctx, batches[i], info.n_vocab), want[i], info.n_vocab);
                rows += batches[i].size();
            }
            INFO(off << " of " << rows << " rows outside the bound");
            CHECK(off * 10 <= rows);
            if (c.split > 0) {
                moe_sched_stats st;
                st.struct_size = sizeof st;
                REQUIRE(moe_context_get_stats(gpu.ctx, &st) == MOE_STATUS_OK);
                CHECK(st.n_split_layers > 0);
                CHECK(st.n_split_host_experts == st.n_split_layers * static_cast<uint64_t>(c.split));
            }
        }
        moe_context_free(cpu.ctx);
        cpu.ctx = nullptr;
        moe_model_free(model);
        std::filesystem::remove(path);
    }
#endif
}

// CUDA graphs change how kernels are queued, never what they compute: a context with graphs and one
// without (MOEINFER_CUDA_GRAPHS=0 when its backend is created) give bitwise the same logits through
// prefill ubatches and decode steps (where n_kv, the cache row and the attention split change every
// token, and stable chunks are replayed without capture).
TEST_CASE("cuda contexts give the same logits with and without CUDA graphs", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
    return;
#else
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch);
        const moe::test::TinyModel model(
            arch, "moe_cuda_graphs", rng(),
            moe::test::pair_model_options(std::strcmp(arch, "gpt-oss") == 0 ? MOE_TYPE_MXFP4 : MOE_TYPE_Q4_0));
        const moe::test::CudaContextPair pair(model, "MOEINFER_CUDA_GRAPHS");
        REQUIRE(pair.on_backend().graphs_enabled());
        REQUIRE_FALSE(pair.off_backend().graphs_enabled());
        pair.expect_same_logits(model.info().n_vocab, rng, moe::test::kPairSteps);
        const moe::cuda::GraphStats& s = pair.on_backend().graph_stats();
        INFO("replays " << s.replays << ", updates " << s.updates << ", instantiations " << s.instantiations
                        << ", failures " << s.failures << ", eager nodes " << s.eager_nodes);
        CHECK(s.replays > 0);
        CHECK(s.instantiations > 0);
        CHECK(s.failures == 0);
        const moe::cuda::GraphStats& e = pair.off_backend().graph_stats();
        CHECK(e.replays + e.instantiations == 0);
    }
#endif
}
