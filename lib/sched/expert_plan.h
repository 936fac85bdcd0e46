// The expert split's plan for one ubatch: which expert blocks compute in two parts (the host's group
// of experts and the device's, at the same time), and the group of every expert of those layers; and
// what the host parts cost as they ran (sched/expert_splitter.h learns from it).
#pragma once

#include <cstdint>
#include <vector>

#include "sched/clock.h"

namespace moe::sched {

// The expert groups of a split expert block (MASK_IDS keep values): the host computes group 0, the
// device group 1.
constexpr int32_t kHostExpertGroup = 0;
constexpr int32_t kDeviceExpertGroup = 1;

struct ExpertSplitPlan {
    std::vector<uint8_t> layers;  // per layer: 1 = split; empty when no layer is
    std::vector<int32_t> groups;  // [n_layer][n_expert] kHostExpertGroup / kDeviceExpertGroup
    uint64_t n_layers = 0;        // split layers
    uint64_t n_host_experts = 0;  // experts left to the host, summed over them
};

// What one ubatch's host parts of split blocks cost, measured by the scheduler as it runs them.
struct SplitTiming {
    double host_seconds = 0.0;
    double wait_seconds = 0.0;
    double min_wait_seconds = 0.0;  // the shortest wait: the device's own latency, no upload in it
    int host_flushes = 0;
    Clock::time_point first_start, last_end;  // from the first host part's wait to the last's end
    int first_layer = 0, last_layer = 0;      // ... and their layers
    int host_layers = 0;                      // distinct layers among the host parts

    // A host part of `layer` waited from t_wait to t_start for the device, then computed for
    // host_seconds.
    void record(Clock::time_point t_wait, Clock::time_point t_start, double host_seconds, int layer);
};

}  // namespace moe::sched
