// A context made through the public API for the tests that compare contexts (hybrid, partly resident,
// several devices): created (REQUIREd to succeed) from params its test fills, freed with the object,
// with its logits, statistics and expert counts read back through the API. The context itself stays
// reachable (ctx) for the tests that look inside it.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace moe::test {

class ApiContext {
public:
    // REQUIRES: what p points to (policy, devices, ...) is valid for the call.
    ApiContext(moe_model* m, const moe_context_params& p) {
        const moe_status s = moe_context_create(m, &p, &ctx);
        INFO(moe_last_error());
        REQUIRE(s == MOE_STATUS_OK);
    }
    ~ApiContext() { moe_context_free(ctx); }
    ApiContext(const ApiContext&) = delete;
    ApiContext& operator=(const ApiContext&) = delete;

    // Decodes `tokens`; returns every row's logits (all) or the last row's, n_vocab wide (checked).
    std::vector<float> decode(const std::vector<int32_t>& tokens, int32_t n_vocab, bool all = true) {
        const moe_status s = moe_decode(ctx, tokens.data(), nullptr, static_cast<int32_t>(tokens.size()), all ? 1 : 0);
        INFO(moe_last_error());
        REQUIRE(s == MOE_STATUS_OK);
        const float* logits = nullptr;
        int32_t rows = 0, nv = 0;
        REQUIRE(moe_get_logits(ctx, &logits, &rows, &nv) == MOE_STATUS_OK);
        REQUIRE(nv == n_vocab);
        return std::vector<float>(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
    }
    moe_sched_stats stats() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
        return st;
    }
    // moe_context_get_expert_counts: n_layer x n_expert activations since creation or the last reset.
    std::vector<uint64_t> counts() const {
        int64_t n = 0;
        REQUIRE(moe_context_get_expert_counts(ctx, nullptr, 0, &n) == MOE_STATUS_OK);
        std::vector<uint64_t> c(static_cast<size_t>(n));
        REQUIRE(moe_context_get_expert_counts(ctx, c.data(), n, &n) == MOE_STATUS_OK);
        return c;
    }

    moe_context* ctx = nullptr;
};

// n token ids drawn uniformly from [0, n_vocab).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int32_t n_vocab) {
    std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
}

}  // namespace moe::test
