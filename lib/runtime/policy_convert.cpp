#include "runtime/policy_convert.h"

#include <cstddef>

#include "runtime/c_api_structs.h"

namespace moe {

StatusOr<sched::Policy> policy_from_c(const moe_sched_policy& policy) {
    if (policy.struct_size < offsetof(moe_sched_policy, offload)) {
        return invalid_argument("policy->struct_size is too small (call moe_sched_policy_init first)");
    }
    moe_sched_policy defaults;
    moe_sched_policy_init(&defaults);
    const moe_sched_policy c = read_sized(policy, defaults);
    sched::Policy p;
    for (int i = 0; i < sched::kOffloadOps; ++i) {
        p.offload[i].enabled = c.offload[i].enabled != 0;
        p.offload[i].min_batch = c.offload[i].min_batch;
    }
    p.expert_copy = static_cast<sched::ExpertCopy>(c.expert_copy);
    p.bias_dup = c.bias_dup != 0;
    p.offload_vram_budget = c.offload_vram_budget;
    p.expert_split = c.expert_split;
    p.expert_cache = c.expert_cache;
    MOE_RETURN_IF_ERROR(sched::validate_policy(p));
    return p;
}

void policy_to_c(const sched::Policy& p, const int32_t* resolved_min_batch, moe_sched_policy* out) {
    moe_sched_policy c;
    moe_sched_policy_init(&c);
    for (int i = 0; i < sched::kOffloadOps; ++i) {
        c.offload[i].enabled = p.offload[i].enabled ? 1 : 0;
        c.offload[i].min_batch = resolved_min_batch ? resolved_min_batch[i] : p.offload[i].min_batch;
    }
    c.expert_copy = static_cast<int32_t>(p.expert_copy);
    c.bias_dup = p.bias_dup ? 1 : 0;
    c.offload_vram_budget = p.offload_vram_budget;
    c.expert_split = p.expert_split;
    c.expert_cache = p.expert_cache;
    write_sized(c, out);
}

}  // namespace moe
