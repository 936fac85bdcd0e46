// The state of one ubatch's run, shared by the scheduler's parts: what the plan placed where, the
// nodes waiting to be handed to a backend, and the copies made so far (by sched/transfers.h).
#pragma once

#include <array>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/pointer_map.h"
#include "core/stable_arena.h"
#include "sched/expert_plan.h"
#include "sched/expert_split_rewrite.h"
#include "sched/weight_table.h"

namespace moe::sched {

struct CachedPlan;

struct RunState {
    // --- the plan (sched/plan_cache.h) ---
    PointerMap<const Tensor*, Side> produced;  // arena storage (inputs and nodes) -> side
    AllocPlan plan;
    uint8_t* base[kSides] = {};   // the activation arenas this run binds to
    Buffer* arena[kSides] = {};
    std::vector<uint8_t> eager;  // per node (see CachedPlan::eager)
    const CachedPlan* cached = nullptr;  // the plan came from the cache (its counts go to the stats at run)
    std::vector<const Tensor*> moe_ids;  // expert ids tensors, for the counts
    const ExpertParts* parts = nullptr;  // the graph's split expert blocks (borrowed for the run)

    // --- the nodes not yet handed to a backend ---
    std::vector<Tensor*> pending;
    Side pending_side = Side::HOST;
    std::vector<size_t> pending_slots;  // upload slots the pending nodes read
    std::vector<size_t> node_slots;     // ... the node being prepared reads

    // --- copies (sched/transfers.h) ---
    StableArena<Tensor> subs;                                  // operand stand-ins of this ubatch
    // tensor -> its copy on each side (nullptr: none; flat, as the other per-node tables)
    PointerMap<const Tensor*, std::array<Tensor*, kSides>> shadows;
    Tensor* shadow(const Tensor* t, Side side) const {
        const auto it = shadows.find(t);
        return it != shadows.end() ? it->second[static_cast<size_t>(side)] : nullptr;
    }
    std::unordered_map<const Tensor*, std::vector<int32_t>> ids_on_host;
    // Host compute must first wait for queued device copies: until fence host_fence (0: for the whole
    // device, where copies do not mark fences).
    bool host_waits = false;
    uint64_t host_fence = 0;
    // Copies queued since the last fence was marked (Transfers::mark_queued_copies marks one for them all).
    bool copies_unmarked = false;
    struct Prefetch {
        size_t slot;
        std::vector<uint8_t> uploaded;  // experts already on their way
    };
    std::map<std::pair<const Tensor*, int>, Prefetch> prefetched;  // (node, operand) -> its early upload
    std::set<size_t> reserved_slots;  // slots of early uploads not consumed yet: no other upload may take them

    // --- the expert split's host parts, measured (ExpertSplitter::finish) ---
    SplitTiming split_timing;

    // Back to a fresh RunState's values, keeping the memory of its tables for the next ubatch (the
    // scheduler reuses one). REQUIRES: every member is reset here; a new member must be added.
    void clear();

    // The expert group whose part of a split block `node` belongs to; -1 for a node of no part.
    int32_t group_of(const Tensor& node) const { return parts != nullptr ? parts->group_of(node) : -1; }
    // A stand-in for `like` over other memory (a weight's copy, an activation's copy on the other side).
    Tensor* substitute(const Tensor& like, void* data, Buffer* buffer);
    // The side a tensor's storage is on during this run: where the plan put it, a weight's home, or
    // its buffer's side.
    Side side_of_storage(const Tensor* storage, const WeightTable& weights) const;
};

}  // namespace moe::sched
