// C API: moe_sampler_* over moe::Sampler (runtime/sampler.h).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/sampler.h"

struct moe_sampler {
    std::unique_ptr<moe::Sampler> impl;
    std::vector<moe::SamplerCandidate> ranked;  // moe_sampler_apply's output, kept to reuse its memory
};

extern "C" {

MOE_API void moe_sampler_params_init(moe_sampler_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->temperature = 0.8f;
    params->top_k = 40;
    params->top_p = 0.95f;
    params->min_p = 0.05f;
    params->min_keep = 0;
    params->repeat_last_n = 64;
    params->repeat_penalty = 1.0f;
    params->frequency_penalty = 0.0f;
    params->presence_penalty = 0.0f;
    params->n_logit_bias = 0;
    params->logit_bias = nullptr;
    params->seed = MOE_SAMPLER_SEED_RANDOM;
}

MOE_API moe_status moe_sampler_create(const moe_sampler_params* params, int32_t n_vocab, moe_sampler** out_sampler) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(out_sampler != nullptr, "out_sampler is NULL");
    moe_sampler_params p;
    moe_sampler_params_init(&p);
    if (params != nullptr) {
        MOE_CHECK_ARG(params->struct_size >= offsetof(moe_sampler_params, temperature) + sizeof(float),
                      "params->struct_size is too small (call moe_sampler_params_init first)");
        p = moe::read_sized(*params, p);
    }
    MOE_API_ASSIGN(auto impl, moe::Sampler::create(p, n_vocab));
    *out_sampler = new moe_sampler{std::move(impl), {}};
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API void moe_sampler_free(moe_sampler* sampler) { delete sampler; }

MOE_API moe_status moe_sampler_accept(moe_sampler* sampler, const int32_t* tokens, int32_t n_tokens) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(sampler != nullptr, "sampler is NULL");
    MOE_RETURN_API(sampler->impl->accept(tokens, n_tokens));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_sampler_sample(moe_sampler* sampler, const float* logits, int32_t n_vocab, int32_t* out_token) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(sampler != nullptr, "sampler is NULL");
    MOE_CHECK_ARG(out_token != nullptr, "out_token is NULL");
    MOE_API_ASSIGN(*out_token, sampler->impl->sample(logits, n_vocab));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_sampler_apply(moe_sampler* sampler, const float* logits, int32_t n_vocab, int32_t* out_ids,
                                     float* out_probs, int32_t capacity, int32_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(sampler != nullptr, "sampler is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || (out_ids != nullptr && out_probs != nullptr),
                  "out_ids and out_probs must not be NULL when capacity > 0");
    MOE_RETURN_API(sampler->impl->apply(logits, n_vocab, &sampler->ranked));
    const size_t n = std::min(sampler->ranked.size(), static_cast<size_t>(capacity));
    for (size_t i = 0; i < n; ++i) {
        out_ids[i] = sampler->ranked[i].id;
        out_probs[i] = static_cast<float>(sampler->ranked[i].p);
    }
    *out_n = static_cast<int32_t>(sampler->ranked.size());
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_sampler_reset(moe_sampler* sampler) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(sampler != nullptr, "sampler is NULL");
    sampler->impl->reset();
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_sampler_get_seed(const moe_sampler* sampler, uint64_t* out_seed) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(sampler != nullptr, "sampler is NULL");
    MOE_CHECK_ARG(out_seed != nullptr, "out_seed is NULL");
    *out_seed = sampler->impl->seed();
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
