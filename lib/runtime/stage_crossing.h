// How what one stage of a ubatch hands to another (the residual stream, sched/graph_cut.h) crosses
// between the devices of a context (docs/MULTI_GPU.md): by a peer copy from device to device where the
// reading device has peer access to the producer's memory, else through page-locked host memory (the
// producer's stage downloads it, the reader's uploads it).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "sched/graph_cut.h"

namespace moe {

// The (from, to) device pairs whose stages follow each other, for `layer_device` (per layer, the index
// of its device in the context's list), in order of first appearance: the ops outside the layers run
// with the layer next to them (sched/device_split.h), so these are the crossings of every ubatch, and
// the pairs whose peer access context creation enables.
std::vector<std::pair<int, int>> adjacent_devices(std::span<const int> layer_device);

// Per stage, per export (in the order of Stage::exports): whether it crosses by peer copy. peer(to,
// from): whether device `to` copies from device `from`'s memory directly. An export crosses by peer copy
// where every stage that reads it is on another device that copies from its producer's directly, and
// the producer's device runs no stage from producing it to its last reader (that run would reuse the
// memory holding it); else through host memory.
std::vector<std::vector<uint8_t>> peer_crossings(std::span<const sched::Stage> stages,
                                                 const std::function<bool(int to, int from)>& peer);

}  // namespace moe
