// deepseek2's prompts up-project up to kMlaDecompressMaxKv cached rows into per-head keys and values
// (model_graph.h: mla_decompressed), activations that grow with the rows; deeper ubatches attend in latent
// space and need less. The arena estimate that the default VRAM budget keeps free (context_sizes.h) must
// cover the deepest decompressing ubatch, not only the deepest ubatch.
#include <catch2/catch.hpp>

#include <deque>

#include "common/tiny_model.h"
#include "core/allocator.h"
#include "core/graph.h"
#include "core/models/model_graph.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "runtime/context_sizes.h"

TEST_CASE("a deepseek2 context's arena estimate covers its deepest decompressing ubatch", "[runtime][mla]") {
    moe::test::TinyModel m("deepseek2", "mla_arena", 23);
    constexpr int kUbatch = 64;
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = moe::kMlaDecompressMaxKv + 4 * kUbatch;
    p.n_ubatch = kUbatch;
    p.n_threads = 1;
    p.device = MOE_DEVICE_CPU;
    moe_context* ctx = nullptr;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    const moe::HParams& hp = ctx->model->hparams;

    // The arena of one ubatch of kUbatch tokens after n_past cached ones.
    const auto arena_at = [&](int n_past) {
        std::deque<moe::Tensor> storage;
        const moe::KvCache kv = moe::prototype_kv_cache(*ctx, storage);
        moe::Graph g;
        moe::build_model_graph(g, hp, ctx->weights, kv, kUbatch, n_past, moe::LogitsMode::ALL);
        return moe::plan_allocation(g).arena_size;
    };
    const size_t deepest = arena_at(p.n_ctx - kUbatch);
    const size_t decompressing = arena_at(moe::kMlaDecompressMaxKv - kUbatch);
    REQUIRE(moe::mla_decompressed(hp, kUbatch, moe::kMlaDecompressMaxKv));
    REQUIRE_FALSE(moe::mla_decompressed(hp, kUbatch, p.n_ctx));
    INFO("deepest ubatch " << deepest << " bytes, deepest decompressing one " << decompressing);
    CHECK(decompressing > deepest);  // what the estimate's second graph is for
    CHECK(moe::estimate_arena_bytes(*ctx, false) >= decompressing);
    moe_context_free(ctx);
}
