// Bitwise A/B of an all-GPU switch read from the environment when a CUDA backend is created
// (MOEINFER_CUDA_GRAPHS, MOEINFER_CUDA_FUSION, MOEINFER_CUDA_PDL): two CUDA contexts of one tiny
// synthetic model, made with the variable at "1" and at "0", decode the same token stream and must give
// the same logits bit for bit (the switches change how kernels are queued, never what they compute).
// Include only in CUDA builds.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "common/tiny_model.h"
#include "cuda/cuda_backend.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace moe::test {

// Sets `name` to `value` while in scope; restores what was there (or its absence).
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        const char* prev = std::getenv(name);
        had_ = prev != nullptr;
        if (had_) saved_ = prev;
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (had_) {
            setenv(name_, saved_.c_str(), 1);
        } else {
            unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    bool had_ = false;
    std::string saved_;
};

// The pair tests' models: 64-wide heads (the CUDA attention kernels cover 32..256), `expert_type` experts, n_embd 0 for the preset's.
inline TinyModelOptions pair_model_options(int32_t expert_type, int32_t n_embd = 0) {
    TinyModelOptions o;
    o.expert_type = expert_type;
    o.n_embd = n_embd;
    o.head_dim = 64;
    return o;
}

// Two CUDA contexts (n_ctx 256, n_ubatch 32) of one model, `on` made with `var`=1, `off` with `var`=0:
// all on the GPU, or hybrid with `tensor_overrides` (e.g. "exps=CPU") and a scheduling policy.
class CudaContextPair {
public:
    CudaContextPair(const TinyModel& model, const char* var, const char* tensor_overrides = nullptr,
                    const moe_sched_policy* policy = nullptr) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 256;
        p.n_ubatch = 32;
        p.device = MOE_DEVICE_CUDA;
        p.tensor_overrides = tensor_overrides;
        p.policy = policy;
        {
            const ScopedEnv env(var, "1");
            REQUIRE(moe_context_create(model.get(), &p, &on_) == MOE_STATUS_OK);
        }
        const ScopedEnv env(var, "0");
        REQUIRE(moe_context_create(model.get(), &p, &off_) == MOE_STATUS_OK);
    }
    ~CudaContextPair() {
        moe_context_free(on_);
        moe_context_free(off_);
    }
    CudaContextPair(const CudaContextPair&) = delete;
    CudaContextPair& operator=(const CudaContextPair&) = delete;

    moe::cuda::CudaBackend& on_backend() const { return static_cast<moe::cuda::CudaBackend&>(*on_->device); }
    moe::cuda::CudaBackend& off_backend() const { return static_cast<moe::cuda::CudaBackend&>(*off_->device); }

    // Decodes batches of `steps` tokens (random ids) in both contexts; after each, the logits must be
    // bitwise equal.
    void expect_same_logits(int32_t n_vocab, std::mt19937& rng, std::initializer_list<int> steps) const {
        std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
        for (const int n : steps) {
            std::vector<int32_t> tokens(static_cast<size_t>(n));
            for (auto& t : tokens) t = tok(rng);
            INFO("n_tokens " << n);
            std::vector<float> out[2];
            moe_context* ctxs[2] = {on_, off_};
            for (int i = 0; i < 2; ++i) {
                REQUIRE(moe_decode(ctxs[i], tokens.data(), nullptr, n, 1) == MOE_STATUS_OK);
                const float* logits = nullptr;
                int32_t rows = 0, nv = 0;
                REQUIRE(moe_get_logits(ctxs[i], &logits, &rows, &nv) == MOE_STATUS_OK);
                REQUIRE(nv == n_vocab);
                out[i].assign(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
            }
            REQUIRE(out[0].size() == out[1].size());
            CHECK(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0);
        }
    }

private:
    moe_context* on_ = nullptr;
    moe_context* off_ = nullptr;
};

// A prompt of two ubatches, decode steps (n_kv and the cache row move each token, stable chunks
// replay), a batch on the tensor cores (17), a short one on the GEMVs (5), more decode steps.
inline constexpr std::initializer_list<int> kPairSteps = {40, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 17, 1, 5, 1, 1, 1};

}  // namespace moe::test
