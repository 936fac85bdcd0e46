// The plan cache: what the scheduler decides from a graph's structure alone (each node's side, the
// arena offsets, which device results go to the host early), kept by the graph's signature and reused
// for later graphs of the same shape (decode rebuilds the same graph every token; only KV-cache view
// lengths change). A new policy clears it.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/graph.h"
#include "sched/placement.h"
#include "sched/policy.h"

namespace moe::sched {

struct CachedPlan {
    std::vector<Side> sides;            // per node
    std::vector<uint8_t> eager;         // per node: copy its output to the host as soon as it is queued
    std::vector<int64_t> node_offset;   // per node: arena offset, -1 without arena memory
    std::vector<int64_t> input_offset;  // per input
    size_t arena_size = 0;
    // The offload decisions made planning it, counted again at every run that uses it.
    std::array<uint64_t, kOffloadOps> offloaded{};
    std::array<uint64_t, kOffloadOps> kept_host{};
};

class PlanCache {
public:
    // What a plan depends on (FNV-1a over ops, layers, and the shapes of tensors that own memory).
    static uint64_t signature(const Graph& graph, size_t n_inputs);
    // The plan cached for `key` if it has n_nodes nodes, else nullptr. Valid until store() or clear().
    const CachedPlan* find(uint64_t key, size_t n_nodes) const;
    void store(uint64_t key, CachedPlan plan) { plans_[key] = std::move(plan); }
    void clear() { plans_.clear(); }

private:
    std::unordered_map<uint64_t, CachedPlan> plans_;
};

}  // namespace moe::sched
