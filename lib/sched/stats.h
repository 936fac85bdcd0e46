// Scheduler statistics: the counters of moe_sched_stats, declared from the public header's field list
// (MOE_SCHED_STATS_COUNTERS), so the C API, the Python dict and the bench convert them field by field
// from that one list, and a counter added there appears everywhere. The scheduler's objects (transfers,
// assignment, the expert split) all count into the one Stats of their Scheduler.
#pragma once

#include <cstdint>
#include <vector>

#include "moeinfer/moeinfer.h"
#include "sched/policy.h"

namespace moe::sched {

static_assert(MOE_OFFLOAD_OP_COUNT == kOffloadOps);

struct Stats {
#define MOE_SCHED_STATS_DECLARE(type, name, dims) type name dims{};
    MOE_SCHED_STATS_COUNTERS(MOE_SCHED_STATS_DECLARE)
#undef MOE_SCHED_STATS_DECLARE
    // Internal, not in moe_sched_stats: ubatches that ran a plan prepare() made while the device
    // computed the one before.
    uint64_t n_planned_ahead = 0;
    // counts[layer * n_expert + expert]: tokens that selected the expert (moe_context_get_expert_counts).
    std::vector<uint64_t> expert_counts;
    // Per layer, the expert cache's n_cache_hits, n_cache_misses and bytes_cache_saved (sized at the
    // first count; empty: nothing counted since the stats were reset).
    std::vector<uint64_t> cache_layer_hits, cache_layer_misses, cache_layer_bytes_saved;
};

}  // namespace moe::sched
