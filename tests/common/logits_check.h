// What the tests that compare contexts through the public API share: logits against a reference
// context, bit-for-bit equality, byte counts from the tensor table, and a context that uploads its
// host-resident weights at every ubatch.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace moe::test {

// Hybrid (emulated device) against CPU-only logits: both sides compute with the CPU kernels, so rows
// differ only by float reassociation: |got - want| <= 1e-4 * max|want| per row.
inline void require_close(const std::vector<float>& got, const std::vector<float>& want, int32_t n_vocab) {
    REQUIRE(got.size() == want.size());
    for (size_t r = 0; r < want.size() / static_cast<size_t>(n_vocab); ++r) {
        double maxdiff = 0, maxw = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            const double g = got[r * n_vocab + i], w = want[r * n_vocab + i];
            REQUIRE(std::isfinite(g));
            maxdiff = std::max(maxdiff, std::fabs(g - w));
            maxw = std::max(maxw, std::fabs(w));
        }
        INFO("row " << r << ": max diff " << maxdiff << ", max |cpu| " << maxw);
        REQUIRE(maxdiff <= 1e-4 * maxw);
    }
}

// GPU (CUDA kernels) against CPU logits: rows (tokens) of a batch outside the bound cosine > 0.999 and
// max |gpu - cpu| <= 3e-2 * max|cpu|. Callers allow a few such rows (10%): a near-tie in the router
// can flip one expert choice and take a row out of the bound.
inline size_t rows_off(const std::vector<float>& gpu, const std::vector<float>& cpu, int32_t n_vocab) {
    REQUIRE(gpu.size() == cpu.size());
    const size_t rows = cpu.size() / static_cast<size_t>(n_vocab);
    size_t off = 0;
    for (size_t r = 0; r < rows; ++r) {
        double dot = 0, ng = 0, nc = 0, maxdiff = 0, maxc = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            const double g = gpu[r * n_vocab + i], c = cpu[r * n_vocab + i];
            REQUIRE(std::isfinite(g));
            dot += g * c;
            ng += g * g;
            nc += c * c;
            maxdiff = std::max(maxdiff, std::fabs(g - c));
            maxc = std::max(maxc, std::fabs(c));
        }
        if (!(dot / std::sqrt(ng * nc) > 0.999 && maxdiff <= 3e-2 * maxc)) ++off;
    }
    return off;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Decodes `tokens` with every row's logits kept (at positions first, first + 1, ... where first >= 0,
// else after the cached ones); returns them.
inline std::vector<float> decode_all(moe_context* ctx, const std::vector<int32_t>& tokens, int32_t first = -1) {
    std::vector<int32_t> pos;
    for (size_t i = 0; first >= 0 && i < tokens.size(); ++i) pos.push_back(first + static_cast<int32_t>(i));
    const moe_status s =
        moe_decode(ctx, tokens.data(), first >= 0 ? pos.data() : nullptr, static_cast<int32_t>(tokens.size()), 1);
    INFO(moe_last_error());
    REQUIRE(s == MOE_STATUS_OK);
    const float* logits = nullptr;
    int32_t rows = 0, nv = 0;
    REQUIRE(moe_get_logits(ctx, &logits, &rows, &nv) == MOE_STATUS_OK);
    return std::vector<float>(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
}

// Bytes of the tensors whose name contains `part`, from the public tensor table.
inline uint64_t tensor_bytes_containing(const moe_model* m, const char* part) {
    moe_model_info info;
    moe_model_info_init(&info);
    REQUIRE(moe_model_get_info(m, &info) == MOE_STATUS_OK);
    uint64_t total = 0;
    for (int32_t i = 0; i < info.n_tensors; ++i) {
        moe_tensor_info t;
        moe_tensor_info_init(&t);
        REQUIRE(moe_model_get_tensor(m, i, &t) == MOE_STATUS_OK);
        if (std::strstr(t.name, part) != nullptr) total += t.n_bytes;
    }
    return total;
}

// A context whose policy offloads every weight op at every ubatch size (each ubatch uploads the
// host-resident weights it uses) and never splits expert blocks (nothing depends on timing): for
// bit-for-bit comparisons of how weights reach the device.
class UploadingContext {
public:
    UploadingContext(moe_model* m, int32_t device, const char* overrides, int32_t n_ctx, int32_t n_ubatch,
                     int32_t expert_copy = MOE_EXPERT_COPY_FULL) {
        moe_sched_policy pol;
        moe_sched_policy_init(&pol);
        REQUIRE(moe_sched_policy_parse_offload(&pol, "all=1") == MOE_STATUS_OK);
        pol.expert_split = 0;
        pol.expert_copy = expert_copy;
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = n_ctx;
        p.n_ubatch = n_ubatch;
        p.device = device;
        p.tensor_overrides = overrides;
        p.policy = &pol;
        const moe_status s = moe_context_create(m, &p, &ctx_);
        INFO(moe_last_error());
        REQUIRE(s == MOE_STATUS_OK);
    }
    ~UploadingContext() { moe_context_free(ctx_); }
    UploadingContext(const UploadingContext&) = delete;
    UploadingContext& operator=(const UploadingContext&) = delete;

    moe_context* get() const { return ctx_; }
    moe_sched_stats stats() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx_, &st) == MOE_STATUS_OK);
        return st;
    }
    // The logits of each batch in turn (every row kept).
    std::vector<std::vector<float>> run(const std::vector<std::vector<int32_t>>& batches) {
        std::vector<std::vector<float>> out;
        for (const auto& b : batches) out.push_back(decode_all(ctx_, b));
        return out;
    }

private:
    moe_context* ctx_ = nullptr;
};

}  // namespace moe::test
