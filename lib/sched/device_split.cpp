#include "sched/device_split.h"

#include <cmath>

namespace moe::sched {

StatusOr<std::vector<int>> pinned_layers(std::span<const std::string> weight_names,
                                         const std::vector<OverrideRule>& overrides, int n_layer, int n_devices) {
    for (const OverrideRule& r : overrides) {
        if (r.side == Side::DEVICE && r.device >= n_devices) {
            return invalid_argument("tensor override '" + r.pattern + "=CUDA" + std::to_string(r.device) +
                                    "': the context has " + std::to_string(n_devices) + " device" +
                                    (n_devices == 1 ? "" : "s") + " (CUDA0 .. CUDA" + std::to_string(n_devices - 1) +
                                    ")");
        }
    }
    std::vector<int> pinned(static_cast<size_t>(std::max(n_layer, 0)), -1);
    std::vector<const std::string*> pinned_by(pinned.size(), nullptr);
    for (const std::string& name : weight_names) {
        const int layer = layer_of(name);
        if (layer < 0 || layer >= n_layer) continue;
        for (const OverrideRule& r : overrides) {
            if (!std::regex_search(name, r.regex)) continue;
            if (r.side == Side::DEVICE && r.device >= 0) {
                int& p = pinned[static_cast<size_t>(layer)];
                if (p >= 0 && p != r.device) {
                    return invalid_argument("tensor overrides pin layer " + std::to_string(layer) + " to two devices: '" +
                                            *pinned_by[static_cast<size_t>(layer)] + "' to CUDA" + std::to_string(p) +
                                            " and '" + name + "' to CUDA" + std::to_string(r.device) +
                                            " (a layer's tensors live on one device)");
                }
                p = r.device;
                pinned_by[static_cast<size_t>(layer)] = &name;
            }
            break;  // the first matching rule decides, as in placement
        }
    }
    return pinned;
}

StatusOr<std::vector<int>> split_layers(int n_layer, std::span<const double> proportions, std::span<const int> pinned) {
    if (proportions.empty()) return invalid_argument("tensor_split: no device to split the layers over");
    double total = 0.0;
    for (size_t d = 0; d < proportions.size(); ++d) {
        const double p = proportions[d];
        if (!std::isfinite(p) || p < 0.0) {
            return invalid_argument("tensor_split[" + std::to_string(d) + "] = " + std::to_string(p) +
                                    ": proportions must be finite and >= 0");
        }
        total += p;
    }
    if (total <= 0.0) return invalid_argument("tensor_split: every proportion is 0 (at least one device must get layers)");
    std::vector<double> cumulative(proportions.size());
    double sum = 0.0;
    for (size_t d = 0; d < proportions.size(); ++d) {
        sum += proportions[d];
        cumulative[d] = sum / total;
    }
    int m = 0;
    for (int il = 0; il < n_layer; ++il) m += static_cast<size_t>(il) < pinned.size() && pinned[static_cast<size_t>(il)] >= 0 ? 0 : 1;
    std::vector<int> device(static_cast<size_t>(std::max(n_layer, 0)), 0);
    int j = 0;
    for (int il = 0; il < n_layer; ++il) {
        if (static_cast<size_t>(il) < pinned.size() && pinned[static_cast<size_t>(il)] >= 0) {
            device[static_cast<size_t>(il)] = pinned[static_cast<size_t>(il)];
            continue;
        }
        const double at = static_cast<double>(j++) / static_cast<double>(m);
        size_t d = 0;
        while (d + 1 < cumulative.size() && !(at < cumulative[d])) ++d;
        device[static_cast<size_t>(il)] = static_cast<int>(d);
    }
    return device;
}

std::optional<std::vector<int>> fill_layers(int n_layer, int n_devices,
                                            const std::function<bool(int device, int first, int count)>& fits) {
    std::vector<int> out;
    int d = 0, first = 0, count = 0;
    for (int il = 0; il < n_layer; ++il) {
        while (d < n_devices && !fits(d, first, count + 1)) {
            ++d;
            first = il;
            count = 0;
        }
        if (d == n_devices) return std::nullopt;
        out.push_back(d);
        ++count;
    }
    return out;
}

std::vector<int> node_devices(const Graph& graph, std::span<const int> layer_device) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    auto device_of_layer = [&](int layer) -> int {
        return layer >= 0 && static_cast<size_t>(layer) < layer_device.size() ? layer_device[static_cast<size_t>(layer)] : -1;
    };
    int first = 0;
    for (const Tensor* n : nodes) {
        if (const int d = device_of_layer(n->layer); d >= 0) {
            first = d;
            break;
        }
    }
    std::vector<int> out(nodes.size());
    int current = first;
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (const int d = device_of_layer(nodes[i]->layer); d >= 0) current = d;
        out[i] = current;
    }
    return out;
}

}  // namespace moe::sched
