#include "runtime/stage_crossing.h"

#include <algorithm>
#include <unordered_map>

namespace moe {

std::vector<std::pair<int, int>> adjacent_devices(std::span<const int> layer_device) {
    std::vector<std::pair<int, int>> pairs;
    for (size_t il = 1; il < layer_device.size(); ++il) {
        const std::pair<int, int> p(layer_device[il - 1], layer_device[il]);
        if (p.first != p.second && std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
    }
    return pairs;
}

std::vector<std::vector<uint8_t>> peer_crossings(std::span<const sched::Stage> stages,
                                                 const std::function<bool(int to, int from)>& peer) {
    struct Export {
        size_t stage, index;
        bool ok = true;
        size_t last_reader = 0;
    };
    std::unordered_map<const Tensor*, Export> exports;
    std::vector<std::vector<uint8_t>> out(stages.size());
    for (size_t s = 0; s < stages.size(); ++s) {
        out[s].assign(stages[s].exports.size(), 0);
        for (size_t k = 0; k < stages[s].exports.size(); ++k) exports[stages[s].exports[k]] = {s, k, true, s};
        for (const auto& [leaf, from] : stages[s].inputs) {
            const auto it = exports.find(from);
            if (it == exports.end()) continue;  // an input of the whole graph
            Export& e = it->second;
            const int producer = stages[e.stage].device;
            e.ok = e.ok && stages[s].device != producer && peer(stages[s].device, producer);
            e.last_reader = std::max(e.last_reader, s);
        }
    }
    for (const auto& [tensor, e] : exports) {
        bool ok = e.ok && e.last_reader > e.stage;  // read by no later stage: nothing crosses
        for (size_t s = e.stage + 1; ok && s < e.last_reader; ++s) ok = stages[s].device != stages[e.stage].device;
        out[e.stage][e.index] = ok ? 1 : 0;
    }
    return out;
}

}  // namespace moe
