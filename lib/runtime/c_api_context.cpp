// C API: contexts, decoding, logits, profiling, the ubatch timeline.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend_config.h"
#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/context.h"

namespace {
constexpr int32_t kMaxTimeline = 1 << 20;  // 64 MiB of records: more is a mistake, not a longer plot
}  // namespace

extern "C" {

MOE_API void moe_context_params_init(moe_context_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->n_ctx = 4096;
    params->n_ubatch = 512;
    params->n_threads = 0;
    params->device = MOE_DEVICE_AUTO;
    params->tensor_overrides = nullptr;
    params->n_cpu_moe = 0;
    params->n_gpu_layers = -1;
    params->vram_budget = 0;
    params->policy = nullptr;
    params->progress = nullptr;
    params->progress_user_data = nullptr;
    params->backend_options = nullptr;
    params->devices = nullptr;
    params->n_devices = 0;
    params->split_mode = MOE_SPLIT_LAYER;
    params->tensor_split = nullptr;
    params->n_tensor_split = 0;
    params->main_gpu = 0;
    params->vram_budgets = nullptr;
    params->n_vram_budgets = 0;
}

MOE_API const char* moe_backend_options_help(void) { return moe::backend_options_help().c_str(); }

MOE_API moe_status moe_context_create(moe_model* model, const moe_context_params* params, moe_context** out_ctx) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(out_ctx != nullptr, "out_ctx is NULL");
    moe_context_params p;
    moe_context_params_init(&p);
    if (params != nullptr) {
        MOE_CHECK_ARG(params->struct_size >= offsetof(moe_context_params, n_ctx) + sizeof(int32_t),
                      "params->struct_size is too small (call moe_context_params_init first)");
        p = moe::read_sized(*params, p);
    }
    MOE_API_ASSIGN(std::unique_ptr<moe_context> ctx, moe::create_context(model, p));
    *out_ctx = ctx.release();
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API void moe_context_free(moe_context* ctx) { delete ctx; }

MOE_API moe_status moe_decode(moe_context* ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens,
                              int32_t logits_all) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(tokens != nullptr, "tokens is NULL");
    MOE_CHECK_ARG(n_tokens > 0, "n_tokens must be > 0");
    return moe::api_return(moe::decode(*ctx, tokens, positions, n_tokens, logits_all != 0));
    MOE_API_END
}

MOE_API moe_status moe_get_logits(const moe_context* ctx, const float** out_logits, int32_t* out_n_rows,
                                  int32_t* out_n_vocab) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_logits != nullptr, "out_logits is NULL");
    if (ctx->logits_rows == 0) {
        return moe::api_return(moe::failed_precondition("no logits: call moe_decode first"));
    }
    *out_logits = ctx->logits_data();
    if (out_n_rows) *out_n_rows = ctx->logits_rows;
    if (out_n_vocab) *out_n_vocab = ctx->model->hparams.n_vocab;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_device(const moe_context* ctx, int32_t* out_device) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_device != nullptr, "out_device is NULL");
    *out_device = ctx->params.device;  // resolved by create_context: never MOE_DEVICE_AUTO
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_n_past(const moe_context* ctx, int32_t* out_n_past) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n_past != nullptr, "out_n_past is NULL");
    *out_n_past = ctx->n_past;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_kv_clear(moe_context* ctx) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    ctx->n_past = 0;
    ctx->logits_rows = 0;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_set_profiling(moe_context* ctx, int32_t enabled) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    ctx->sched->set_profiling(enabled != 0);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_profile(const moe_context* ctx, moe_op_profile* entries, int32_t capacity,
                                           int32_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || entries != nullptr, "entries is NULL");
    int32_t n = 0;
    const moe::sched::OpTimes& times = ctx->sched->op_times();
    for (int side = 0; side < moe::sched::kSides; ++side) {
        for (size_t op = 0; op < times[static_cast<size_t>(side)].size(); ++op) {
            const moe::sched::OpTime& t = times[static_cast<size_t>(side)][op];
            if (t.count == 0) continue;
            if (n < capacity) {
                entries[n].op = moe::op_name(static_cast<moe::Op>(op));
                entries[n].backend = side == 0 ? ctx->host->name() : ctx->device->name();
                entries[n].count = t.count;
                entries[n].seconds = t.seconds;
            }
            ++n;
        }
    }
    *out_n = n;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_set_timeline(moe_context* ctx, int32_t capacity) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(capacity >= 0 && capacity <= kMaxTimeline,
                  "timeline capacity " + std::to_string(capacity) + " is outside [0, " + std::to_string(kMaxTimeline) + "]");
    ctx->sched->timeline().enable(static_cast<size_t>(capacity));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_timeline(const moe_context* ctx, moe_ubatch_timing* entries, int32_t capacity,
                                            int32_t* out_n, uint64_t* out_dropped) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || entries != nullptr, "entries is NULL");
    const moe::sched::Timeline& timeline = ctx->sched->timeline();
    const std::vector<moe::sched::UbatchTiming> records = timeline.records();
    for (size_t i = 0; i < records.size() && i < static_cast<size_t>(capacity); ++i) {
        const moe::sched::UbatchTiming& r = records[i];
        entries[i] = moe_ubatch_timing{r.n_tokens, r.ok ? 1 : 0, r.t_start, r.t_end, r.seconds_host_compute,
                                       r.seconds_device_submit, r.seconds_wait, r.bytes_weights,
                                       r.bytes_activations};
    }
    *out_n = static_cast<int32_t>(records.size());
    if (out_dropped != nullptr) *out_dropped = timeline.dropped();
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
