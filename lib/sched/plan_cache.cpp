#include "sched/plan_cache.h"

namespace moe::sched {

uint64_t PlanCache::signature(const Graph& graph, size_t n_inputs) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    mix(graph.nodes().size());
    mix(n_inputs);
    for (const Tensor* n : graph.nodes()) {
        mix(static_cast<uint64_t>(n->op));
        mix(static_cast<uint64_t>(n->layer + 1));
        if (n->view_src == nullptr) {
            for (int64_t d : n->ne) mix(static_cast<uint64_t>(d));
            mix(static_cast<uint64_t>(n->type));
        }
        for (const Tensor* s : n->src) {
            if (s != nullptr && s->op == Op::NONE) {
                for (int64_t d : s->ne) mix(static_cast<uint64_t>(d));
            }
        }
    }
    return h;
}

const CachedPlan* PlanCache::find(uint64_t key, size_t n_nodes) const {
    const auto it = plans_.find(key);
    if (it == plans_.end() || it->second.sides.size() != n_nodes) return nullptr;
    return &it->second;
}

}  // namespace moe::sched
