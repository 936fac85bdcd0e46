// Scheduler statistics (mirrors moe_sched_stats; the C API copies field by field).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "sched/policy.h"

namespace moe::sched {

struct Stats {
    uint64_t n_ubatches = 0;
    uint64_t n_splits = 0;
    uint64_t bytes_weights_full = 0;
    uint64_t bytes_weights_experts = 0;
    uint64_t bytes_weights_skipped = 0;
    uint64_t bytes_activations = 0;
    uint64_t n_weight_copies = 0;
    uint64_t n_activation_copies = 0;
    uint64_t n_id_readbacks = 0;
    std::array<uint64_t, kOffloadOps> n_offloaded{};
    std::array<uint64_t, kOffloadOps> n_kept_host{};
    uint64_t n_split_layers = 0;     // expert blocks computed in two parts (host and device at once)
    uint64_t n_split_host_experts = 0;  // experts those blocks left to the host, summed
    uint64_t n_split_trials = 0;        // ubatches timed as samples of the automatic split's trials
    uint64_t n_planned_ahead = 0;       // ubatches that ran a plan prepare() made while the device computed
                                        // the one before (internal: not in moe_sched_stats)
    uint64_t n_ops_host = 0;
    uint64_t n_ops_device = 0;
    double seconds_total = 0.0;
    double seconds_host_compute = 0.0;
    double seconds_wait = 0.0;
    double seconds_device_submit = 0.0;
    // counts[layer * n_expert + expert]: tokens that selected the expert.
    std::vector<uint64_t> expert_counts;
};

}  // namespace moe::sched
