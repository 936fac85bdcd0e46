#include "sched/expert_placement.h"

#include <algorithm>
#include <limits>
#include <map>

namespace moe::sched {
namespace {

uint64_t padded(uint64_t n, uint64_t align) { return align <= 1 ? n : (n + align - 1) / align * align; }

bool pinned_by_override(const std::string& name, const PlacementParams& p) {
    for (const OverrideRule& r : p.overrides) {
        if (std::regex_search(name, r.regex)) return true;
    }
    return false;
}

// The expert tensors of one layer that may be partly resident.
struct Candidate {
    int layer;
    std::vector<size_t> tensors;  // indices into the weights
};

bool is_bias(const std::string& name) { return name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0; }

}  // namespace

bool ExpertResidency::any() const {
    return std::any_of(experts.begin(), experts.end(), [](const std::vector<int32_t>& e) { return !e.empty(); });
}

uint64_t resident_slice_bytes(uint64_t tensor_bytes, int n_expert, size_t n, uint64_t align) {
    return padded(tensor_bytes / static_cast<uint64_t>(n_expert) * n, align);
}

StatusOr<ExpertPlacement> place_experts(const std::vector<WeightDesc>& weights, const ExpertPlacementParams& params) {
    const PlacementParams& base = params.base;
    const int n_expert = params.n_expert;
    const int n_layer = base.n_layer;
    if (!params.counts.empty() &&
        params.counts.size() != static_cast<size_t>(std::max(n_layer, 0)) * static_cast<size_t>(std::max(n_expert, 0))) {
        return invalid_argument("expert placement: " + std::to_string(params.counts.size()) +
                                " activation counts for n_layer " + std::to_string(n_layer) + " x n_expert " +
                                std::to_string(n_expert));
    }
    std::vector<WeightDesc> desc = weights;
    for (WeightDesc& d : desc) d.bytes = padded(d.bytes, params.align);
    PlacementParams unbounded = base;
    unbounded.vram_budget = std::numeric_limits<uint64_t>::max();
    MOE_ASSIGN_OR_RETURN(std::vector<Side> sides, place_weights(desc, unbounded));
    uint64_t used = 0;
    for (size_t i = 0; i < desc.size(); ++i) used += sides[i] == Side::DEVICE ? desc[i].bytes : 0;
    ExpertPlacement out;
    out.resident.n_expert = n_expert;
    out.resident.experts.resize(static_cast<size_t>(std::max(n_layer, 0)));
    if (used <= base.vram_budget) {
        out.sides = std::move(sides);
        return out;
    }

    // Layers whose expert tensors are all on the device, none pinned, each with the experts outermost.
    std::map<int, Candidate> by_layer;
    std::vector<bool> blocked(static_cast<size_t>(std::max(n_layer, 0)), n_expert < 2);
    for (size_t i = 0; i < weights.size(); ++i) {
        const std::string& name = weights[i].name;
        const int layer = layer_of(name);
        if (!is_expert_tensor(name) || layer < 0 || layer >= n_layer) continue;
        by_layer.try_emplace(layer, Candidate{layer, {}}).first->second.tensors.push_back(i);
        if (sides[i] != Side::DEVICE || pinned_by_override(name, base) ||
            weights[i].bytes % static_cast<uint64_t>(std::max(n_expert, 1)) != 0) {
            blocked[static_cast<size_t>(layer)] = true;
        }
    }
    std::vector<Candidate> candidates;
    uint64_t movable = 0;
    for (auto& [layer, c] : by_layer) {
        if (blocked[static_cast<size_t>(layer)]) continue;
        // Expert biases stay counted whole on the device: a layer not wholly resident keeps them in host
        // RAM with a device duplicate (bias duplication), as large as the tensor, besides its slice.
        for (size_t i : c.tensors) movable += is_bias(weights[i].name) ? 0 : desc[i].bytes;
        candidates.push_back(std::move(c));
    }
    // Not even the other weights fit: whole tensors as before (its error, or the pinned layers' experts
    // moved whole).
    if (used - movable > base.vram_budget) {
        MOE_ASSIGN_OR_RETURN(out.sides, place_weights(desc, base));
        return out;
    }
    uint64_t left = base.vram_budget - (used - movable);

    // Every (layer, expert) of the candidates, hottest first; equal counts (no profile): later layers
    // first, then lower experts.
    struct Pick {
        size_t candidate;
        int32_t expert;
        uint64_t count;
    };
    std::vector<Pick> order;
    for (size_t c = 0; c < candidates.size(); ++c) {
        for (int32_t e = 0; e < n_expert; ++e) {
            const size_t at = static_cast<size_t>(candidates[c].layer) * static_cast<size_t>(n_expert) + static_cast<size_t>(e);
            order.push_back({c, e, params.counts.empty() ? 0 : params.counts[at]});
        }
    }
    std::stable_sort(order.begin(), order.end(), [&](const Pick& a, const Pick& b) {
        if (a.count != b.count) return a.count > b.count;
        return candidates[a.candidate].layer > candidates[b.candidate].layer;
    });
    auto cost = [&](const Candidate& c, size_t n) {
        uint64_t b = 0;
        for (size_t i : c.tensors) b += resident_slice_bytes(weights[i].bytes, n_expert, n, params.align);
        return b;
    };
    std::vector<std::vector<int32_t>> chosen(candidates.size());
    for (const Pick& p : order) {
        std::vector<int32_t>& got = chosen[p.candidate];
        const uint64_t more = cost(candidates[p.candidate], got.size() + 1) - cost(candidates[p.candidate], got.size());
        if (more > left) continue;  // a colder expert of this layer costs as much: none of them fits either
        left -= more;
        got.push_back(p.expert);
    }
    for (size_t c = 0; c < candidates.size(); ++c) {
        const bool whole = chosen[c].size() == static_cast<size_t>(n_expert);
        for (size_t i : candidates[c].tensors) sides[i] = whole ? Side::DEVICE : Side::HOST;
        if (!whole && !chosen[c].empty()) {
            std::sort(chosen[c].begin(), chosen[c].end());
            out.resident.experts[static_cast<size_t>(candidates[c].layer)] = std::move(chosen[c]);
        }
    }
    out.sides = std::move(sides);
    return out;
}

}  // namespace moe::sched
