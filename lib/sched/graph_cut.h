// A ubatch graph cut into stages for several devices (layer split): a stage is a maximal run of
// consecutive nodes on one device, made a graph of its own that its device's scheduler runs like any
// other. What a stage reads of an earlier stage's results (the residual stream between two layers)
// becomes an input leaf of it, filled from the earlier stage's export (runtime/stage_crossing.h); the full
// graph's inputs (tokens, positions, expert groups) become inputs of every stage that reads them.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/graph.h"
#include "core/status.h"

namespace moe::sched {

struct Stage {
    int device = 0;
    std::unique_ptr<Graph> graph;  // the full graph's nodes it adopted, and its input leaves
    // (leaf of this stage, the full graph's tensor that fills it): an input of the full graph, or a
    // tensor an earlier stage exports.
    std::vector<std::pair<Tensor*, const Tensor*>> inputs;
    // Tensors computed here that later stages read (kept alive to the end of the stage).
    std::vector<Tensor*> exports;
};

// Cuts `graph` (consumed: the stages' nodes read the stages' leaves) by node_device (per node, as
// sched/device_split.h: node_devices). INVALID_ARGUMENT when a tensor crossing stages is a strided view
// (never made by the model builders: their layers hand over whole tensors).
StatusOr<std::vector<Stage>> cut_graph(Graph& graph, std::span<const int> node_device);

// Bytes a ubatch moves between devices through host memory: each export once to the host, and once
// to each stage (on a device) that reads it.
uint64_t crossing_bytes(std::span<const Stage> stages);

}  // namespace moe::sched
