// Activation memory planning: gives every tensor of a graph that needs memory of its own (inputs and
// non-view nodes) an offset in one arena, reusing memory of tensors whose last reader has run.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/graph.h"
#include "core/pointer_map.h"

namespace moe {

struct AllocPlan {
    size_t arena_size = 0;
    PointerMap<const Tensor*, size_t> offsets;  // tensors that own memory in the arena
};

constexpr size_t kTensorAlignment = 64;

// Plans offsets for `graph`'s inputs and nodes. Leaves that already have data (weights, the KV cache)
// are not planned. Outputs stay live until the end.
AllocPlan plan_allocation(const Graph& graph);

// Sets data pointers: planned tensors at base + offset, views at their source's data + view_offset.
// REQUIRES: every leaf that is not planned has data already.
void bind_allocation(const Graph& graph, const AllocPlan& plan, void* base);

// Points every view node (and CPY) of `graph` at its source's data + view_offset, in node order.
// REQUIRES: every view source has data.
void bind_views(const Graph& graph);

// The tensor whose memory `t` uses (follows view chains).
const Tensor* storage_of(const Tensor* t);

}  // namespace moe
