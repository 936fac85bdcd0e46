// moe_sched_policy <-> sched::Policy (struct_size-aware: older callers' shorter structs keep defaults).
#pragma once

#include "moeinfer/moeinfer.h"
#include "sched/policy.h"

namespace moe {

// Reads the fields inside policy.struct_size over the defaults and validates them.
StatusOr<sched::Policy> policy_from_c(const moe_sched_policy& policy);

// Writes `p` into the fields inside out->struct_size; resolved thresholds replace -1 when given.
void policy_to_c(const sched::Policy& p, const int32_t* resolved_min_batch, moe_sched_policy* out);

}  // namespace moe
