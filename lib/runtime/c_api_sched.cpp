// C API: scheduling policy, weight locations and scheduler statistics.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/context.h"
#include "runtime/multi_device.h"
#include "runtime/policy_convert.h"

namespace {

// Placement figures of moe_sched_stats: weights_host_bytes, weights_device_bytes, weights_host_pinned_bytes.
struct Placement {
    uint64_t host = 0, device = 0, host_pinned = 0;
};

// moe_sched_stats from a scheduler's counters (or their sum), placement figures, and the scheduler whose
// offload thresholds are reported.
moe_sched_stats to_c_stats(const moe_context& ctx, const moe::sched::Stats& s, const Placement& placement,
                           const moe::sched::Scheduler& thresholds) {
    moe_sched_stats c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    // sched::Stats declares the counters from the same list (sched/stats.h).
#define MOE_COPY_COUNTER(type, name, dims)                                 \
    static_assert(std::is_same_v<decltype(c.name), decltype(s.name)>); \
    std::memcpy(&c.name, &s.name, sizeof c.name);
    MOE_SCHED_STATS_COUNTERS(MOE_COPY_COUNTER)
#undef MOE_COPY_COUNTER
    c.weights_host_bytes = placement.host;
    c.weights_device_bytes = placement.device;
    c.weights_host_pinned_bytes = placement.host_pinned;
    c.n_layer = ctx.model->hparams.n_layer;
    c.n_expert = ctx.model->hparams.n_expert;
    const moe::sched::OffloadCalibration& cal = thresholds.offload_calibration();
    c.offload_link_gbps = cal.link_gbps;
    c.offload_host_prefill_gbps = cal.host_prefill_gbps;
    for (int i = 0; i < moe::sched::kOffloadOps; ++i) {
        const moe::sched::OffloadThreshold t = thresholds.offload_threshold(static_cast<moe::sched::OffloadOp>(i));
        c.offload_min_batch[i] = t.min_batch;
        c.offload_min_batch_source[i] = static_cast<int32_t>(t.source);
        c.offload_host_gbps[i] = cal.host_gbps[i];
        c.offload_device_gbps[i] = cal.device_gbps[i];
    }
    return c;
}

moe::Status check_stats_args(const moe_context* ctx, const moe_sched_stats* out_stats) {
    if (ctx == nullptr) return moe::invalid_argument("ctx is NULL");
    if (out_stats == nullptr) return moe::invalid_argument("out_stats is NULL");
    if (out_stats->struct_size < offsetof(moe_sched_stats, n_ubatches) + sizeof(uint64_t)) {
        return moe::invalid_argument("out_stats->struct_size is too small (set it to sizeof(moe_sched_stats))");
    }
    return moe::Status::ok();
}

moe::Status check_device_index(const moe_context& ctx, int32_t device_index) {
    const size_t n = moe::n_devices(ctx);
    if (device_index < 0 || static_cast<size_t>(device_index) >= n) {
        return moe::invalid_argument("device_index " + std::to_string(device_index) + " is out of range: the context has " +
                                     std::to_string(n) + " device(s)");
    }
    return moe::Status::ok();
}

}  // namespace

extern "C" {

MOE_API void moe_sched_policy_init(moe_sched_policy* policy) {
    if (policy == nullptr) return;
    std::memset(policy, 0, sizeof *policy);
    policy->struct_size = sizeof *policy;
    for (moe_offload_rule& r : policy->offload) {
        r.enabled = 1;
        r.min_batch = -1;
    }
    policy->expert_copy = MOE_EXPERT_COPY_AUTO;
    policy->bias_dup = 1;
    policy->offload_vram_budget = 0;
    policy->expert_split = MOE_EXPERT_SPLIT_AUTO;
    policy->expert_cache = MOE_EXPERT_CACHE_AUTO;
}

MOE_API const char* moe_offload_op_name(int32_t op) { return moe::sched::offload_op_name(op); }

static_assert(MOE_THRESHOLD_DEFAULT == static_cast<int32_t>(moe::sched::ThresholdSource::DEFAULT) &&
              MOE_THRESHOLD_MEASURED == static_cast<int32_t>(moe::sched::ThresholdSource::MEASURED) &&
              MOE_THRESHOLD_OVERRIDE == static_cast<int32_t>(moe::sched::ThresholdSource::OVERRIDE));

MOE_API const char* moe_threshold_source_name(int32_t source) { return moe::sched::threshold_source_name(source); }

MOE_API moe_status moe_sched_policy_parse_offload(moe_sched_policy* policy, const char* spec) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(policy != nullptr, "policy is NULL");
    MOE_CHECK_ARG(spec != nullptr, "spec is NULL");
    MOE_API_ASSIGN(moe::sched::Policy p, moe::policy_from_c(*policy));
    MOE_RETURN_API(moe::sched::parse_offload_spec(spec, &p));
    moe::policy_to_c(p, nullptr, policy);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_set_policy(moe_context* ctx, const moe_sched_policy* policy) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(policy != nullptr, "policy is NULL");
    MOE_API_ASSIGN(moe::sched::Policy p, moe::policy_from_c(*policy));
    for (moe::sched::Scheduler* s : moe::schedulers(*ctx)) MOE_RETURN_API(s->set_policy(p));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_policy(const moe_context* ctx, moe_sched_policy* out_policy) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_policy != nullptr, "out_policy is NULL");
    MOE_CHECK_ARG(out_policy->struct_size >= offsetof(moe_sched_policy, offload),
                  "out_policy->struct_size is too small (call moe_sched_policy_init first)");
    int32_t resolved[moe::sched::kOffloadOps];
    for (int i = 0; i < moe::sched::kOffloadOps; ++i) {
        resolved[i] = ctx->sched->min_batch(static_cast<moe::sched::OffloadOp>(i));
    }
    moe::policy_to_c(ctx->sched->policy(), resolved, out_policy);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_tensor_location(const moe_context* ctx, const char* name, int32_t* out_location,
                                               int32_t* out_duplicated) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(name != nullptr, "name is NULL");
    MOE_CHECK_ARG(out_location != nullptr, "out_location is NULL");
    auto it = ctx->weight_by_name.find(name);
    const std::optional<moe::sched::WeightCopies> c =
        it == ctx->weight_by_name.end() ? std::nullopt : moe::weight_copies(*ctx, it->second);
    if (!c) return moe::api_return(moe::not_found(std::string("no weight tensor named '") + name + "'"));
    *out_location = c->home == moe::sched::Side::DEVICE ? MOE_LOCATION_DEVICE : MOE_LOCATION_HOST;
    if (out_duplicated != nullptr) *out_duplicated = c->duplicate && c->host != nullptr && c->device != nullptr;
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_stats(const moe_context* ctx, moe_sched_stats* out_stats) {
    MOE_API_BEGIN
    MOE_RETURN_API(check_stats_args(ctx, out_stats));
    const Placement whole{ctx->weights_host_bytes, ctx->weights_device_bytes, ctx->weights_host_locked_bytes};
    // Summed over the devices; the thresholds are device 0's.
    moe::write_sized(to_c_stats(*ctx, moe::context_stats(*ctx), whole, *ctx->sched), out_stats);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_n_devices(const moe_context* ctx, int32_t* out_n_devices) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n_devices != nullptr, "out_n_devices is NULL");
    *out_n_devices = static_cast<int32_t>(moe::n_devices(*ctx));
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_device_info(const moe_context* ctx, int32_t device_index,
                                               moe_device_info* out_info) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_info != nullptr, "out_info is NULL");
    MOE_CHECK_ARG(out_info->struct_size >= offsetof(moe_device_info, kind) + sizeof(int32_t),
                  "out_info->struct_size is too small (set it to sizeof(moe_device_info))");
    MOE_RETURN_API(check_device_index(*ctx, device_index));
    const auto d = static_cast<size_t>(device_index);
    moe_device_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.kind = ctx->params.device;
    info.ordinal = ctx->parts.empty() ? (ctx->device ? ctx->device_ordinal : 0) : ctx->parts[d].ordinal;
    info.n_layers = ctx->parts.empty() ? ctx->model->hparams.n_layer : ctx->parts[d].n_layers;
    moe::write_sized(info, out_info);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_device_stats(const moe_context* ctx, int32_t device_index,
                                                moe_sched_stats* out_stats) {
    MOE_API_BEGIN
    MOE_RETURN_API(check_stats_args(ctx, out_stats));
    MOE_RETURN_API(check_device_index(*ctx, device_index));
    const auto d = static_cast<size_t>(device_index);
    Placement placement{ctx->weights_host_bytes, ctx->weights_device_bytes, ctx->weights_host_locked_bytes};
    if (!ctx->parts.empty()) {
        const moe::DevicePart& part = ctx->parts[d];
        placement = {part.weights_host_bytes, part.weights_device_bytes, part.weights_host_locked_bytes};
    }
    const moe::sched::Scheduler& s = moe::scheduler_of(*ctx, d);
    moe::write_sized(to_c_stats(*ctx, s.stats(), placement, s), out_stats);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_expert_counts(const moe_context* ctx, uint64_t* counts, int64_t capacity,
                                                 int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || counts != nullptr, "counts is NULL");
    const std::vector<uint64_t> v = moe::context_stats(*ctx).expert_counts;
    const size_t n = std::min(v.size(), static_cast<size_t>(capacity));
    std::copy_n(v.begin(), n, counts);
    *out_n = static_cast<int64_t>(v.size());
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_get_expert_cache_layers(const moe_context* ctx, uint64_t* hits, uint64_t* misses,
                                                       uint64_t* bytes_saved, int64_t capacity, int64_t* out_n) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    MOE_CHECK_ARG(out_n != nullptr, "out_n is NULL");
    MOE_CHECK_ARG(capacity >= 0, "capacity must be >= 0");
    MOE_CHECK_ARG(capacity == 0 || hits != nullptr, "hits is NULL");
    MOE_CHECK_ARG(capacity == 0 || misses != nullptr, "misses is NULL");
    MOE_CHECK_ARG(capacity == 0 || bytes_saved != nullptr, "bytes_saved is NULL");
    const moe::sched::Stats& s = ctx->sched->stats();
    const auto n_layer = static_cast<size_t>(ctx->model->hparams.n_layer);
    const size_t n = std::min(n_layer, static_cast<size_t>(capacity));
    // Empty vectors: nothing counted since the last reset.
    auto copy = [n](const std::vector<uint64_t>& v, uint64_t* out) {
        for (size_t l = 0; l < n; ++l) out[l] = l < v.size() ? v[l] : 0;
    };
    copy(s.cache_layer_hits, hits);
    copy(s.cache_layer_misses, misses);
    copy(s.cache_layer_bytes_saved, bytes_saved);
    *out_n = static_cast<int64_t>(n_layer);
    return MOE_STATUS_OK;
    MOE_API_END
}

MOE_API moe_status moe_context_reset_stats(moe_context* ctx) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(ctx != nullptr, "ctx is NULL");
    for (moe::sched::Scheduler* s : moe::schedulers(*ctx)) s->reset_stats();
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
