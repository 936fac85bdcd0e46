// The stable KV addressing (backend option stable_kv, core/models/model_graph.h KvAddressing): cache writes
// at the rows the positions name and attention over a length padded to 256 give the exact addressing's
// logits bit for bit on the CPU kernels (their attention splits the keys the positions make visible, not
// the padded length): CPU contexts and the emulated device, all on it or with the experts in host RAM, on
// every architecture, through prompts, decode steps that cross a multiple of 256, a cache shorter than the
// padding, and a rewind that rewrites rows with stale ones after them. With a GPU ([gpu]): CUDA contexts
// with and without it agree within the GPU tests' bound (the CUDA attention splits the padded length,
// so sums regroup), and decode steps of one 256-row window replay their CUDA graphs without capturing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/api_context.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "cuda/cuda_backend.h"
#include "runtime/context.h"
#endif

namespace {

struct Setup {
    const char* name;
    int32_t device;
    const char* overrides;
    const char* options;  // backend options besides stable_kv
};

}  // namespace

TEST_CASE("the stable KV addressing gives the exact addressing's logits bit for bit on the CPU kernels", "[runtime]") {
    std::mt19937 rng(std::random_device{}());
    const Setup setups[] = {{"cpu", MOE_DEVICE_CPU, nullptr, ""},
                            {"emulated", MOE_DEVICE_EMULATED, nullptr, ""},
                            {"emulated, experts in host RAM", MOE_DEVICE_EMULATED, "exps=CPU", ""},
                            {"two emulated devices, experts in host RAM", MOE_DEVICE_EMULATED, "exps=CPU",
                             "emulated_devices=2,"}};
    for (const char* arch : {"qwen3moe", "gpt-oss", "glm4moe", "deepseek2"}) {
        const uint64_t seed = rng();
        INFO(arch << " seed " << seed);
        moe::test::TinyModel m(arch, "moe_stable_kv", seed);
        const int32_t n_vocab = m.info().n_vocab;
        std::mt19937 tok_rng(static_cast<uint32_t>(seed));
        const std::vector<int32_t> prompt = moe::test::random_tokens(tok_rng, 250, n_vocab);
        const std::vector<int32_t> steps = moe::test::random_tokens(tok_rng, 40, n_vocab);
        for (const Setup& su : setups) {
            INFO(su.name);
            // n_ctx 300: the padded length is capped at the cache (300, not 512) once past 256 rows.
            const std::string with[2] = {std::string(su.options) + "stable_kv=off",
                                         std::string(su.options) + "stable_kv=on"};
            // Thresholds fixed and no expert split: nothing that depends on timing (the emulated device
            // keeps the fixed thresholds; the split's learning measures).
            moe_sched_policy pol;
            moe_sched_policy_init(&pol);
            pol.expert_split = 0;
            const auto params = [&](const std::string& options) {
                moe_context_params p;
                moe_context_params_init(&p);
                p.n_ctx = 300;
                p.n_ubatch = 64;
                p.n_threads = 2;
                p.device = su.device;
                p.tensor_overrides = su.overrides;
                p.backend_options = options.c_str();
                p.policy = &pol;
                return p;
            };
            moe::test::ApiContext exact(m.get(), params(with[0])), stable(m.get(), params(with[1]));
            const auto same = [&](const std::vector<int32_t>& tokens, int32_t first, const char* what) {
                INFO(what << " at " << first);
                const std::vector<float> e = moe::test::decode_all(exact.ctx, tokens, first);
                const std::vector<float> s = moe::test::decode_all(stable.ctx, tokens, first);
                REQUIRE(moe::test::bitwise_equal(s, e));
            };
            same(prompt, 0, "the prompt (64-token ubatches)");
            for (int32_t i = 0; i < 10; ++i) {  // 251 .. 260 rows: across 256
                same({steps[static_cast<size_t>(i)]}, 250 + i, "a decode step");
            }
            // Back to position 100: rows 100 .. 102 rewritten, the stale rows after them never read.
            same({steps.begin() + 10, steps.begin() + 13}, 100, "a rewind");
            for (int32_t i = 0; i < 5; ++i) same({steps[static_cast<size_t>(13 + i)]}, 103 + i, "a step after it");
        }
    }
}

TEST_CASE("CUDA contexts with the stable KV addressing replay decode steps without capturing", "[gpu]") {
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
        for (const char* overrides : {static_cast<const char*>(nullptr), "exps=CPU"}) {
            const uint64_t seed = rng();
            INFO(arch << (overrides ? " hybrid" : " all on the GPU") << " seed " << seed);
            moe::test::TinyModelOptions o;
            o.expert_type = std::string(arch) == "gpt-oss" ? MOE_TYPE_MXFP4 : MOE_TYPE_Q4_0;
            o.head_dim = 64;  // the CUDA attention kernels' sizes
            moe::test::TinyModel m(arch, "moe_stable_kv_cuda", seed, o);
            const int32_t n_vocab = m.info().n_vocab;
            std::mt19937 tok_rng(static_cast<uint32_t>(seed));
            moe_sched_policy pol;  // fixed thresholds: both contexts place every op alike
            moe_sched_policy_init(&pol);
            REQUIRE(moe_sched_policy_parse_offload(&pol, "all=64") == MOE_STATUS_OK);
            const auto params = [&](const char* options) {
                moe_context_params p;
                moe_context_params_init(&p);
                p.n_ctx = 300;
                p.n_ubatch = 64;
                p.device = MOE_DEVICE_CUDA;
                p.tensor_overrides = overrides;
                p.policy = &pol;
                p.backend_options = options;
                return p;
            };
            moe::test::ApiContext exact(m.get(), params("stable_kv=off")), stable(m.get(), params("stable_kv=on"));
            auto& graphs = static_cast<moe::cuda::CudaBackend&>(*stable.ctx->device);
            size_t off = 0, rows = 0;
            const auto both = [&](const std::vector<int32_t>& tokens) {
                const std::vector<float> e = exact.decode(tokens, n_vocab), s = stable.decode(tokens, n_vocab);
                off += moe::test::rows_off(s, e, n_vocab);
                rows += tokens.size();
            };
            both(moe::test::random_tokens(tok_rng, 200, n_vocab));
            // Decode steps of one 256-row window replay every chunk: no capture, no update. After the
            // attended length crosses 256 (257 rows: 512, capped at n_ctx = 300) the attention changed
            // once: the graph runner treats it as volatile for kQuietRuns steps, then replays again.
            const auto steps_replayed = [&](int n_warm, int n_checked) {
                for (int i = 0; i < n_warm; ++i) both(moe::test::random_tokens(tok_rng, 1, n_vocab));
                const moe::cuda::GraphStats before = graphs.graph_stats();
                for (int i = 0; i < n_checked; ++i) both(moe::test::random_tokens(tok_rng, 1, n_vocab));
                const moe::cuda::GraphStats& after = graphs.graph_stats();
                INFO("replays " << after.replays - before.replays << ", updates " << after.updates - before.updates
                                << ", instantiations " << after.instantiations - before.instantiations
                                << ", eager nodes " << after.eager_nodes - before.eager_nodes);
                CHECK(after.replays > before.replays);
                CHECK(after.updates == before.updates);
                CHECK(after.instantiations == before.instantiations);
                CHECK(after.failures == before.failures);
            };
            steps_replayed(4, 20);  // rows 205 .. 224
            steps_replayed(32 + moe::cuda::GraphRunner::kQuietRuns + 4, 10);  // across 256, then 277 .. 286
            // A rewind to position 100: rows rewritten, the stale rows after them (finite here) never read.
            const std::vector<int32_t> again = moe::test::random_tokens(tok_rng, 3, n_vocab);
            off += moe::test::rows_off(moe::test::decode_all(stable.ctx, again, 100),
                                       moe::test::decode_all(exact.ctx, again, 100), n_vocab);
            rows += again.size();
            for (int i = 0; i < 5; ++i) both(moe::test::random_tokens(tok_rng, 1, n_vocab));
            INFO(off << " of " << rows << " rows outside the bound");
            CHECK(off * 10 <= rows);
        }
    }
#endif
}
