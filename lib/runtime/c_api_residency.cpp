// C API: expert activation profiles (sched/expert_profile.h) and the experts resident in device memory.
#include <algorithm>
#include <string>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/context.h"
#include "sched/expert_profile.h"

namespace {

// The model's shape as a profile records it.
moe::sched::ExpertProfile profile_shape(const moe::HParams& hp) {
    moe::sched::ExpertProfile p;
    p.arch = hp.arch_name;
    p.n_layer = hp.n_layer;
    p.n_expert = hp.n_expert;
    p.n_expert_used = hp.n_expert_used;
    return p;
}

}  // namespace

extern "C" {

MOE_API moe_status moe_model_set_expert_profile(moe_model* model, const char* path) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    if (path == nullptr) {
        model->expert_profile.clear();
        return MOE_STATUS_OK;
    }
    MOE_CHECK_ARG(model->hparams.n_expert > 0, "the model has no experts to profile");
    moe::StatusOr<moe::sched::ExpertProfile> p = moe::sched::read_expert_profile(path, profile_shape(model->hparams));
    MOE_RETURN_API(p.status());
    model->expert_profile = std::move(p->counts);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_model_save_expert_profile(const moe_model* model, const uint64_t* counts, int64_t n,
                                                 const char* path) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(model != nullptr, "model is NULL");
    MOE_CHECK_ARG(path != nullptr && path[0] != '\0', "path is NULL or empty");
    MOE_CHECK_ARG(model->hparams.n_expert > 0, "the model has no experts to profile");
    moe::sched::ExpertProfile p = profile_shape(model->hparams);
    const int64_t want = static_cast<int64_t>(p.n_layer) * p.n_expert;
    MOE_CHECK_ARG(n == want, "n is " + std::to_string(n) + ", not n_layer * n_expert = " + std::to_string(want));
    MOE_CHECK_ARG(counts != nullptr, "counts is NULL");
    p.counts.assign(counts, counts + n);
    MOE_RETURN_API(moe::sched::write_expert_profile(path, p));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_save_expert_profile(const moe_context* ctx, const char* path) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(path != nullptr && path[0] != '\0', "path is NULL or empty");
    MOE_CHECK_ARG(ctx->model->hparams.n_expert > 0, "the model has no experts to profile");
    moe::sched::ExpertProfile p = profile_shape(ctx->model->hparams);
    p.counts = ctx->sched->stats().expert_counts;
    MOE_RETURN_API(moe::sched::write_expert_profile(path, p));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_resident_experts(const moe_context* ctx, int32_t* n_experts, uint64_t* bytes,
                                                    int32_t capacity, int32_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || (n_experts != nullptr && bytes != nullptr), "n_experts or bytes is NULL");
    const moe::sched::LayerResidency& r = ctx->residency;
    const int32_t n_layer = ctx->model->hparams.n_layer;
    for (int32_t il = 0; il < std::min(capacity, n_layer); ++il) {
        const auto l = static_cast<size_t>(il);
        n_experts[il] = l < r.n_experts.size() ? r.n_experts[l] : 0;
        bytes[il] = l < r.bytes.size() ? r.bytes[l] : 0;
    }
    *out_n = n_layer;
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
