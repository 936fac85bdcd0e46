// C API: moe_generate over moe::generate (runtime/generate.h), with its argument checks.
#include <cstddef>
#include <cstring>
#include <string>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/context.h"
#include "runtime/generate.h"

extern "C" {

MOE_API void moe_generate_params_init(moe_generate_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->max_tokens = 128;
}

MOE_API void moe_generate_result_init(moe_generate_result* result) {
    if (result == nullptr) return;
    std::memset(result, 0, sizeof *result);
    result->struct_size = sizeof *result;
}

MOE_API moe_status moe_generate(moe_context* ctx, const int32_t* prompt, int32_t n_prompt, moe_sampler* sampler,
                                const moe_generate_params* params, moe_generate_result* out_result) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(prompt != nullptr, "prompt is NULL");
    MOE_CHECK_ARG(n_prompt >= 1, "n_prompt must be >= 1 (got " + std::to_string(n_prompt) + ")");
    moe_generate_params p;
    moe_generate_params_init(&p);
    if (params != nullptr) {
        MOE_CHECK_ARG(params->struct_size >= offsetof(moe_generate_params, max_tokens) + sizeof(int32_t),
                      "params->struct_size is too small (call moe_generate_params_init first)");
        p = moe::read_sized(*params, p);
    }
    MOE_CHECK_ARG(p.max_tokens >= 0, "params->max_tokens must be >= 0 (got " + std::to_string(p.max_tokens) + ")");
    MOE_CHECK_ARG(p.n_stop >= 0, "params->n_stop must be >= 0 (got " + std::to_string(p.n_stop) + ")");
    MOE_CHECK_ARG(p.n_stop == 0 || p.stop != nullptr, "params->stop is NULL with n_stop > 0");
    for (int32_t i = 0; i < p.n_stop; ++i) {
        MOE_CHECK_ARG(p.stop[i] != nullptr && p.stop[i][0] != '\0',
                      "params->stop[" + std::to_string(i) + "] is NULL or empty");
    }
    MOE_CHECK_ARG(p.tokens_capacity >= 0,
                  "params->tokens_capacity must be >= 0 (got " + std::to_string(p.tokens_capacity) + ")");
    MOE_CHECK_ARG(p.tokens_capacity == 0 || p.tokens != nullptr, "params->tokens is NULL with tokens_capacity > 0");
    MOE_CHECK_ARG(out_result == nullptr || out_result->struct_size >= sizeof(uint32_t),
                  "out_result->struct_size is 0 (call moe_generate_result_init first)");
    if (ctx->model->vocab == nullptr) {
        return moe::api_return(moe::failed_precondition("the model has no tokenizer (tokenizer.ggml.* metadata)"));
    }
    const int32_t n_vocab = ctx->model->hparams.n_vocab;
    for (int32_t i = 0; i < n_prompt; ++i) {
        if (prompt[i] < 0 || prompt[i] >= n_vocab) {
            return moe::api_return(moe::out_of_range("prompt[" + std::to_string(i) + "] = " + std::to_string(prompt[i]) +
                                                     " is outside [0, " + std::to_string(n_vocab) + ")"));
        }
    }
    moe_generate_result r;
    moe_generate_result_init(&r);
    const moe_status s = moe::generate(*ctx, prompt, n_prompt, sampler, p, &r);
    if (out_result != nullptr) moe::write_sized(r, out_result);
    return s;
    MOE_API_END
}

}  // extern "C"
