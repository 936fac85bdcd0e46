// The expert split's plan for one ubatch: which expert blocks compute in two parts (the host's group
// of experts and the device's, at the same time), and the group of every expert of those layers.
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace moe::sched
