// Per-expert placement under a VRAM budget: where the per-tensor placement (sched/placement.h) would
// move whole expert tensors to host RAM, this keeps the hottest experts of each layer resident in
// device memory and leaves the rest in RAM.
//
// A layer whose experts are all resident keeps its expert tensors on the device, one with none keeps
// them in RAM; a partly resident layer keeps its expert tensors whole in RAM (the host computes the
// other experts from there, and prefill uploads them from there) plus, on the device, a slice of each
// holding only its resident experts, in ascending expert order (sched/resident_experts.h). A slice
// costs r/E of the tensor, where a full-size device tensor with only the resident experts filled would
// cost all of it: the ids of the device's part are remapped to slice rows instead (MASK_IDS, remap).
//
// Hotness comes from an activation profile (sched/expert_profile.h). Without one every expert is as
// hot as any other and layers fill whole in layer order, the last layers first (as the per-tensor
// placement keeps them): under uniform routing any set of resident experts saves the same expected
// bytes, and whole layers leave at most one layer split between the two sides, where an even share
// per layer would split every layer (a device part, a host part and their activation copies in each).
// -ot overrides and n_cpu_moe keep their meaning: a layer with an expert tensor that an override pins
// or that n_cpu_moe or n_gpu_layers puts in RAM is never partly resident; its tensors are placed whole.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "sched/placement.h"

namespace moe::sched {

// The resident experts of the partly resident layers.
struct ExpertResidency {
    int n_expert = 0;
    // Per layer: the resident experts, ascending, of a partly resident layer; empty for the others.
    std::vector<std::vector<int32_t>> experts;

    bool partial(int layer) const {
        return layer >= 0 && static_cast<size_t>(layer) < experts.size() && !experts[static_cast<size_t>(layer)].empty();
    }
    bool any() const;
};

struct ExpertPlacementParams {
    PlacementParams base;  // overrides, n_cpu_moe, n_gpu_layers and the VRAM budget
    int n_expert = 0;
    uint64_t align = 1;  // each device allocation (a tensor, a resident slice) is padded to a multiple
    // Activation counts [n_layer * n_expert] (counts[layer * n_expert + expert]), or empty: uniform.
    std::span<const uint64_t> counts;
};

struct ExpertPlacement {
    std::vector<Side> sides;  // per weight; a partly resident layer's expert tensors are HOST
    ExpertResidency resident;
};

// Device bytes of the slice of an expert tensor of `tensor_bytes` (experts outermost) holding `n` of its
// n_expert experts, padded to `align`.
uint64_t resident_slice_bytes(uint64_t tensor_bytes, int n_expert, size_t n, uint64_t align);

// weights[i].bytes are the tensors' own bytes (not padded). Whatever fits the budget whole is placed
// as place_weights does; else experts are placed one by one as described above. RESOURCE_EXHAUSTED as
// place_weights when the weights other than the movable experts exceed the budget.
StatusOr<ExpertPlacement> place_experts(const std::vector<WeightDesc>& weights, const ExpertPlacementParams& params);

}  // namespace moe::sched
