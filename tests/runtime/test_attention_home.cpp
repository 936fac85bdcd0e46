// Attention the device has no kernel for runs on the host (runtime/attention_home.h). Without a GPU:
// a device that refuses the tiny preset's head size (16, as CUDA's kernels do) gets one rule that pins
// every layer's attention anchor, and only it, to host RAM, and weight placement follows it; a device
// that computes the attention gets none. With a GPU ([gpu]): a CUDA context on the tiny preset is
// created, decodes, runs its attention on the host and gives the CPU context's logits (the bound and
// allowance of test_context_cuda.cpp, common/logits_check.h's rows_off).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/api_context.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/attention_home.h"
#include "runtime/context.h"
#include "runtime/model.h"
#include "sched/placement.h"
#if MOEINFER_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

using moe::Backend;
using moe::Status;
using moe::StatusOr;
using moe::Tensor;

// A device whose attention kernels take CUDA's head sizes; every other op is accepted. Only the
// capability query is used.
class HeadSizeLimitedDevice final : public Backend {
public:
    const char* name() const override { return "head-size-limited"; }
    bool is_host() const override { return false; }
    bool supports_op(const Tensor& node) const override {
        if (node.op != moe::Op::ATTENTION) return true;
        const int64_t d = node.src[0]->ne[0];
        return d == 32 || d == 64 || d == 96 || d == 128 || d == 256 || d == 576;
    }
    StatusOr<std::unique_ptr<moe::Buffer>> alloc_buffer(size_t) override { return moe::unimplemented("probe only"); }
    Status compute(std::span<Tensor* const>) override { return moe::unimplemented("probe only"); }
    Status copy_to_device(void*, const void*, size_t) override { return moe::unimplemented("probe only"); }
    Status copy_to_host(void*, const void*, size_t) override { return moe::unimplemented("probe only"); }
    Status synchronize() override { return Status::ok(); }
    StatusOr<std::unique_ptr<moe::Buffer>> alloc_host_buffer(size_t) override {
        return moe::unimplemented("probe only");
    }
};

struct Context : moe::test::ApiContext {
    Context(moe_model* m, int32_t device) : ApiContext(m, params(device)) {}
    static moe_context_params params(int32_t device) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 64;
        p.n_threads = 2;
        p.device = device;
        return p;
    }
};

}  // namespace

TEST_CASE("a device without attention kernels for the head size gets the attention anchors pinned to host RAM",
          "[sched]") {
    std::mt19937 rng(std::random_device{}());
    const HeadSizeLimitedDevice limited;
    for (const char* arch : {"qwen3moe", "gpt-oss", "deepseek2"}) {
        for (const int32_t head_dim : {0, 64}) {  // 0: the tiny preset's 16
            INFO(arch << " head_dim " << head_dim);
            moe::test::TinyModelOptions o;
            o.head_dim = std::string(arch) == "deepseek2" ? 0 : head_dim;
            moe::test::TinyModel m(arch, "moe_attn_home", rng(), o);
            Context c(m.get(), MOE_DEVICE_EMULATED);
            const moe::HParams& hp = m.get()->hparams;
            const moe::ModelWeights& w = c.ctx->weights;
            // The emulated device computes every attention with the CPU kernels: no rule.
            CHECK(moe::device_computes_attention(hp, *c.ctx->device));
            CHECK(moe::host_attention_overrides(hp, w, *c.ctx->device).empty());

            const moe::KvLayout kv = moe::kv_layout(hp);
            const bool computes = kv.k_row == 32 || kv.k_row == 64 || kv.k_row == 96 || kv.k_row == 128 ||
                                  kv.k_row == 256 || kv.k_row == 576;
            INFO("attention head size " << kv.k_row);
            CHECK(moe::device_computes_attention(hp, limited) == computes);
            const std::vector<moe::sched::OverrideRule> rules = moe::host_attention_overrides(hp, w, limited);
            REQUIRE(rules.size() == (computes ? 0u : 1u));
            if (computes) continue;
            // Placement with the rule ahead of a user rule that would put everything on the device:
            // exactly the anchors go to host RAM.
            moe::sched::PlacementParams pp;
            pp.overrides = rules;
            const StatusOr<std::vector<moe::sched::OverrideRule>> everything = moe::sched::parse_overrides(".*=CUDA");
            REQUIRE(everything.is_ok());
            pp.overrides.push_back(everything->front());
            pp.n_layer = hp.n_layer;
            pp.vram_budget = UINT64_MAX;
            std::vector<moe::sched::WeightDesc> desc;
            std::vector<const Tensor*> anchors;
            for (const moe::LayerWeights& l : w.layers) anchors.push_back(moe::attention_anchor(l));
            std::vector<const Tensor*> all;
            for (const auto& [name, t] : c.ctx->weight_by_name) {
                desc.push_back({name, t->n_bytes()});
                all.push_back(t);
            }
            const StatusOr<std::vector<moe::sched::Side>> sides = moe::sched::place_weights(desc, pp);
            REQUIRE(sides.is_ok());
            size_t n_host = 0;
            for (size_t i = 0; i < all.size(); ++i) {
                const bool anchor = std::find(anchors.begin(), anchors.end(), all[i]) != anchors.end();
                INFO(desc[i].name);
                CHECK(((*sides)[i] == moe::sched::Side::HOST) == anchor);
                n_host += (*sides)[i] == moe::sched::Side::HOST ? 1 : 0;
            }
            CHECK(n_host == static_cast<size_t>(hp.n_layer));
        }
    }
}

TEST_CASE("cuda contexts on a head size without cuda attention kernels run the attention on the host", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
#else
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch);
        moe::test::TinyModel m(arch, "moe_attn_home_cuda", rng());  // head_dim 16
        const int32_t nv = m.info().n_vocab;
        Context cpu(m.get(), MOE_DEVICE_CPU);
        Context gpu(m.get(), MOE_DEVICE_CUDA);
        std::uniform_int_distribution<int32_t> tok(0, nv - 1);
        // The 10% allowance of test_context_cuda.cpp, over the whole stream.
        size_t off = 0, rows = 0;
        for (const int n : {20, 1, 1, 7}) {
            std::vector<int32_t> tokens(static_cast<size_t>(n));
            for (auto& t : tokens) t = tok(rng);
            off += moe::test::rows_off(moe::test::decode_all(gpu.ctx, tokens), moe::test::decode_all(cpu.ctx, tokens), nv);
            rows += tokens.size();
        }
        INFO(off << " of " << rows << " rows outside the bound");
        CHECK(off * 10 <= rows);
        const moe_sched_stats st = gpu.stats();
        CHECK(st.n_ops_host > 0);    // the attention
        CHECK(st.n_ops_device > 0);  // everything else
    }
#endif
}
