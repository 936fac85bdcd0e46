#include "sched/placement.h"

#include <algorithm>
#include <cctype>
#include <numeric>

namespace moe::sched {
namespace {

std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const size_t e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
}

// n of "<prefix>n" (n a decimal number below 1000), or -1.
int device_suffix(const std::string& s, const std::string& prefix) {
    if (s.size() <= prefix.size() || s.size() > prefix.size() + 3 || s.compare(0, prefix.size(), prefix) != 0) return -1;
    int n = 0;
    for (size_t i = prefix.size(); i < s.size(); ++i) {
        if (!std::isdigit(static_cast<unsigned char>(s[i]))) return -1;
        n = n * 10 + (s[i] - '0');
    }
    return n;
}

}  // namespace

StatusOr<std::vector<OverrideRule>> parse_overrides(const std::string& spec) {
    std::vector<OverrideRule> rules;
    size_t start = 0;
    while (start < spec.size()) {
        size_t comma = spec.find(',', start);
        if (comma == std::string::npos) comma = spec.size();
        const std::string entry = trim(spec.substr(start, comma - start));
        start = comma + 1;
        if (entry.empty()) continue;
        // The regex itself may contain '=' (rare); the backend is after the last one.
        const size_t eq = entry.rfind('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size()) {
            return invalid_argument("tensor override '" + entry + "': expected REGEX=BACKEND (e.g. exps=CPU)");
        }
        const std::string pattern = entry.substr(0, eq);
        const std::string backend = upper(entry.substr(eq + 1));
        Side side = Side::DEVICE;
        int device = -1;
        if (backend == "CPU" || backend == "HOST") {
            side = Side::HOST;
        } else if (backend == "GPU" || backend == "CUDA" || backend == "DEVICE") {
            device = -1;
        } else if (const int n = device_suffix(backend, "CUDA"); n >= 0) {
            device = n;
        } else {
            return invalid_argument("tensor override '" + entry + "': unknown backend '" + entry.substr(eq + 1) +
                                    "' (expected CPU, GPU, CUDA, CUDAn or DEVICE)");
        }
        try {
            rules.push_back(OverrideRule{pattern, std::regex(pattern, std::regex::ECMAScript), side, device});
        } catch (const std::regex_error& e) {
            return invalid_argument("tensor override '" + entry + "': invalid regex '" + pattern + "': " + e.what());
        }
    }
    return rules;
}

int layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    int layer = 0;
    size_t i = 4;
    if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
        layer = layer * 10 + (name[i] - '0');
        if (layer > 1000000) return -1;
    }
    return i < name.size() && name[i] == '.' ? layer : -1;
}

bool is_expert_tensor(const std::string& name) { return name.find("_exps.") != std::string::npos; }

StatusOr<std::vector<Side>> place_weights(const std::vector<WeightDesc>& weights, const PlacementParams& params) {
    const size_t n = weights.size();
    std::vector<Side> side(n, Side::DEVICE);
    std::vector<bool> pinned(n, false);  // decided by an override: the budget does not move it
    const int ngl = params.n_gpu_layers;
    const bool all_layers = ngl < 0 || ngl > params.n_layer;
    for (size_t i = 0; i < n; ++i) {
        const std::string& name = weights[i].name;
        bool matched = false;
        for (const OverrideRule& r : params.overrides) {
            if (std::regex_search(name, r.regex)) {
                side[i] = r.side;
                pinned[i] = matched = true;
                break;
            }
        }
        if (matched) continue;
        const int layer = layer_of(name);
        if (layer >= 0 && layer < params.n_cpu_moe && is_expert_tensor(name)) {
            side[i] = Side::HOST;
        } else if (layer >= 0) {
            side[i] = (all_layers || layer >= params.n_layer - ngl) ? Side::DEVICE : Side::HOST;
        } else {
            side[i] = all_layers ? Side::DEVICE : Side::HOST;  // embeddings, output norm and head
        }
    }

    auto device_bytes = [&] {
        uint64_t b = 0;
        for (size_t i = 0; i < n; ++i) {
            if (side[i] == Side::DEVICE) b += weights[i].bytes;
        }
        return b;
    };
    uint64_t used = device_bytes();
    if (used <= params.vram_budget) return side;

    // Spill experts: largest first, earlier layers first among equals.
    std::vector<size_t> order;
    for (size_t i = 0; i < n; ++i) {
        if (side[i] == Side::DEVICE && !pinned[i] && is_expert_tensor(weights[i].name)) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (weights[a].bytes != weights[b].bytes) return weights[a].bytes > weights[b].bytes;
        return layer_of(weights[a].name) < layer_of(weights[b].name);
    });
    for (size_t i : order) {
        if (used <= params.vram_budget) break;
        side[i] = Side::HOST;
        used -= weights[i].bytes;
    }
    if (used > params.vram_budget) {
        return resource_exhausted("the weights placed on the device need " + std::to_string(used) +
                                  " bytes with every expert tensor in host RAM, over the VRAM budget of " +
                                  std::to_string(params.vram_budget) + " bytes (lower n_gpu_layers or add overrides)");
    }
    return side;
}

}  // namespace moe::sched
