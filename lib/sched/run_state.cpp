#include "sched/run_state.h"

#include <algorithm>

namespace moe::sched {

void RunState::clear() {
    produced.clear();
    plan.arena_size = 0;
    plan.offsets.clear();
    std::fill(std::begin(base), std::end(base), nullptr);
    std::fill(std::begin(arena), std::end(arena), nullptr);
    eager.clear();
    cached = nullptr;
    moe_ids.clear();
    parts = nullptr;
    pending.clear();
    pending_side = Side::HOST;
    pending_slots.clear();
    node_slots.clear();
    subs.clear();
    shadows.clear();
    ids_on_host.clear();
    host_waits = false;
    host_fence = 0;
    copies_unmarked = false;
    prefetched.clear();
    reserved_slots.clear();
    split_timing = SplitTiming{};
}

Tensor* RunState::substitute(const Tensor& like, void* data, Buffer* buffer) {
    Tensor& t = subs.emplace_back();
    t.type = like.type;
    std::copy(std::begin(like.ne), std::end(like.ne), t.ne);
    std::copy(std::begin(like.nb), std::end(like.nb), t.nb);
    t.data = data;
    t.buffer = buffer;
    t.is_weight = like.is_weight;
    t.layer = like.layer;
    t.name = like.name;
    return &t;
}

Side RunState::side_of_storage(const Tensor* storage, const WeightTable& weights) const {
    auto it = produced.find(storage);
    if (it != produced.end()) return it->second;
    if (storage->is_weight) {
        if (const std::optional<Side> home = weights.home(storage)) return *home;
    }
    if (storage->buffer != nullptr && !storage->buffer->is_host()) return Side::DEVICE;
    return Side::HOST;
}

}  // namespace moe::sched
