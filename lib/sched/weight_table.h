// The weights the scheduler knows: for each weight leaf, its copies in host RAM and device memory and
// its home side. Assignment asks it where a weight can be read, transfers where to copy it from, the
// expert split which layers' experts live only in host RAM.
#pragma once

#include <optional>
#include <vector>

#include "core/backend.h"
#include "core/pointer_map.h"
#include "core/tensor.h"
#include "sched/placement.h"

namespace moe::sched {

// An expert tensor of a partly resident layer: the slice of it in device memory that holds the layer's
// resident experts, in ascending expert order (sched/resident_experts.h).
struct ResidentSlice {
    void* device = nullptr;
    Buffer* buffer = nullptr;
    int32_t n_experts = 0;  // 0: no slice
};

// The copies of one weight. The weight tensor's own data/buffer are the copy on its home side.
struct WeightCopies {
    void* host = nullptr;  // host RAM: the model's bytes in place (the file mapping, or the file read in)
    // The page-locked registration holding `host` (Backend::register_host), or nullptr where it is
    // pageable: uploads from pageable memory are staged by the device backend (slower, same bytes).
    Buffer* host_buffer = nullptr;
    void* device = nullptr;  // device memory
    Buffer* device_buffer = nullptr;
    Side home = Side::HOST;
    // The copy on the side other than home exists for bias duplication: used only while the policy's
    // bias_dup is on.
    bool duplicate = false;
    ResidentSlice resident;  // a partly resident layer's expert tensor: the resident experts' slice
};

class WeightTable {
public:
    // n_layer / n_expert: what makes a weight an expert matrix [K, N, n_expert] of a layer.
    WeightTable(int n_layer, int n_expert) : n_layer_(n_layer), n_expert_(n_expert) {}

    void add(Tensor* weight, const WeightCopies& copies);
    // The copies ops may use (a duplicate only with bias_dup on); nullopt for an unregistered tensor.
    std::optional<WeightCopies> usable(const Tensor* weight, bool bias_dup) const;
    // The home side of a registered weight; nullopt for an unregistered tensor.
    std::optional<Side> home(const Tensor* weight) const;
    // The largest host-resident weight (nullptr if none) and the bytes of the largest one: what an
    // upload slot must hold (biases too, without duplication).
    const Tensor* largest_host_weight() const;
    size_t largest_host_bytes() const;
    // Whether every expert matrix of `layer` lives in host RAM only (false for a layer without any, and
    // for a partly resident layer).
    bool experts_host_only(int layer) const;
    // Whether `layer`'s expert matrices have resident slices (sched/resident_experts.h).
    bool partly_resident(int layer) const;
    // The expert matrices of `layer` (empty if none registered).
    const std::vector<const Tensor*>& expert_matrices(int layer) const;

private:
    int n_layer_;
    int n_expert_;
    // Looked up for every weight operand of every node (flat: one or two cache lines a lookup, where a
    // node-based map chased pointers that the host's expert products had evicted; pointer_map.h).
    PointerMap<const Tensor*, WeightCopies> copies_;
    std::vector<std::vector<const Tensor*>> expert_matrices_;  // per layer (empty: none registered)
};

}  // namespace moe::sched
