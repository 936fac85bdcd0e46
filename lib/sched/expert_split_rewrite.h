// The expert split as a rewrite of a built ubatch graph. Model builders emit one expert block per MoE
// layer (core/models/graph_blocks.h: routed_experts) and know nothing of where it runs; when the
// scheduler computes a layer's block in two parts (the expert splitter's plan, or a partly resident
// layer: Scheduler::plan_expert_split), this replaces the block by a part per expert group and their
// sum. Each part masks the router's ids to its group's experts (MASK_IDS over the layer's row of the
// groups input), so the two parts compute disjoint sets of experts and add up to the whole block.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

#include "core/graph.h"

namespace moe::sched {

struct ExpertParts {
    // Input I32 [n_expert, n_layer] the rewrite added: in each split layer's row the group of each
    // expert (kHostExpertGroup or kDeviceExpertGroup, as ExpertSplitPlan::groups); nullptr when no
    // layer was split.
    Tensor* groups = nullptr;
    // The nodes of each part (its MASK_IDS, the products, the down biases, the weighted sum) and the
    // group whose experts they compute: the scheduler runs a part whole where that group's experts are.
    std::unordered_map<const Tensor*, int32_t> node_group;

    // The group of a part's node; -1 for any other node (the sum of the parts included).
    int32_t group_of(const Tensor& node) const {
        if (node_group.empty()) return -1;
        const auto it = node_group.find(&node);
        return it != node_group.end() ? it->second : -1;
    }
};

// Splits the expert block of every layer flagged in `layers` (empty, or one flag per layer; a flagged
// layer without an expert block, such as a leading dense layer, is left as is). n_expert: experts per
// layer. In node order the device's part comes first, then the host's, then their sum where the block's
// result was: the device's uploads and products are queued before the host starts on its own part.
ExpertParts split_expert_blocks(Graph& graph, std::span<const uint8_t> layers, int n_expert);

}  // namespace moe::sched
