// Several devices in one host, llama.cpp's layer split (-sm layer): every model layer (its attention,
// dense and expert weights and its KV cache) belongs to one device, and its ops run there. This file
// decides which: from split proportions (-ts), tensor overrides that name a device (-ot regex=CUDAn,
// whose layer then goes with the tensor), and for the ops outside the layers (embeddings, output
// head) the device of the layer next to them in the graph. Nothing here copies or allocates.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/status.h"
#include "sched/placement.h"

namespace moe::sched {

// Per layer, the device an override pins it to, or -1: a layered tensor matched first by a rule that
// names device n (CUDAn) pins its layer to n. INVALID_ARGUMENT names the rule of a device index not
// below n_devices, and the two tensors of a layer pinned to two devices.
StatusOr<std::vector<int>> pinned_layers(std::span<const std::string> weight_names,
                                         const std::vector<OverrideRule>& overrides, int n_layer, int n_devices);

// Per layer, its device. The layers not pinned (pinned[il] < 0; pinned may be empty), in order, are
// dealt out in runs proportional to `proportions` (one entry per device, >= 0, not all 0): the j-th of
// m unpinned layers goes to the first device d with j / m < (p_0 + ... + p_d) / (p_0 + ... + p_last),
// llama.cpp's rule. INVALID_ARGUMENT names a negative, non-finite or all-zero proportion.
StatusOr<std::vector<int>> split_layers(int n_layer, std::span<const double> proportions, std::span<const int> pinned);

// Per layer, its device when the devices are filled one after the other (the several-device default,
// docs/MULTI_GPU.md): the layers, in order, go to device 0 while fits(0, 0, n) holds for its first n
// layers, then to device 1 from the first layer device 0 could not take while fits(1, first, n) holds,
// and so on; a device that cannot take the next layer keeps those it has (none: it holds nothing).
// nullopt when layers are left after the last device.
std::optional<std::vector<int>> fill_layers(int n_layer, int n_devices,
                                            const std::function<bool(int device, int first, int count)>& fits);

// Per node of `graph`, the device its ops run on: a node of layer il on layer_device[il]; a node of
// no layer on the device of the last layered node before it (the first layered node's for those
// before any: the embeddings).
std::vector<int> node_devices(const Graph& graph, std::span<const int> layer_device);

}  // namespace moe::sched
