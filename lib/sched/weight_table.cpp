#include "sched/weight_table.h"

#include <algorithm>

namespace moe::sched {

void WeightTable::add(Tensor* weight, const WeightCopies& copies) {
    copies_[weight] = copies;
    // Expert matrices [K, N, n_expert] by layer (of the name: weights carry no layer tag), for the split.
    const int layer = layer_of(weight->name);
    if (weight->ne[2] == n_expert_ && weight->ne[3] == 1 && layer >= 0 && layer < n_layer_) {
        if (expert_matrices_.empty()) expert_matrices_.resize(static_cast<size_t>(n_layer_));
        expert_matrices_[static_cast<size_t>(layer)].push_back(weight);
    }
}

std::optional<WeightCopies> WeightTable::usable(const Tensor* weight, bool bias_dup) const {
    auto it = copies_.find(weight);
    if (it == copies_.end()) return std::nullopt;
    WeightCopies c = it->second;
    if (c.duplicate && !bias_dup) {
        if (c.home == Side::HOST) {
            c.device = nullptr;
            c.device_buffer = nullptr;
        } else {
            c.host = nullptr;
            c.host_buffer = nullptr;
        }
    }
    return c;
}

std::optional<Side> WeightTable::home(const Tensor* weight) const {
    auto it = copies_.find(weight);
    if (it == copies_.end()) return std::nullopt;
    return it->second.home;
}

const Tensor* WeightTable::largest_host_weight() const {
    const Tensor* largest = nullptr;
    for (const auto& [w, c] : copies_) {
        if (c.home == Side::HOST && c.host != nullptr && (largest == nullptr || w->n_bytes() > largest->n_bytes())) {
            largest = w;
        }
    }
    return largest;
}

size_t WeightTable::largest_host_bytes() const {
    size_t largest = 0;
    for (const auto& [w, c] : copies_) {
        if (c.home == Side::HOST) largest = std::max(largest, w->n_bytes());
    }
    return largest;
}

bool WeightTable::experts_host_only(int layer) const {
    const std::vector<const Tensor*>& ms = expert_matrices(layer);
    if (ms.empty()) return false;
    for (const Tensor* w : ms) {
        const WeightCopies& c = copies_.at(w);
        if (c.home != Side::HOST || c.device != nullptr || c.resident.n_experts > 0) return false;
    }
    return true;
}

bool WeightTable::partly_resident(int layer) const {
    const std::vector<const Tensor*>& ms = expert_matrices(layer);
    return !ms.empty() && copies_.at(ms.front()).resident.n_experts > 0;
}

const std::vector<const Tensor*>& WeightTable::expert_matrices(int layer) const {
    static const std::vector<const Tensor*> kNone;
    if (expert_matrices_.empty() || layer < 0 || layer >= n_layer_) return kNone;
    return expert_matrices_[static_cast<size_t>(layer)];
}

}  // namespace moe::sched
