// Contexts over several devices in one host (llama.cpp's -sm layer): each model layer, with its
// weights and KV cache, belongs to one device (sched/device_split.h); each device has a scheduler of
// its own (with its upload ring, expert id readback, bias duplicates and stats) over the host and that
// device. A ubatch's graph is cut into stages of consecutive nodes on one device (sched/graph_cut.h),
// run in order, each by its device's scheduler; what a stage hands to the next (the residual stream)
// goes by peer copy or through host memory (runtime/stage_crossing.h). Within a device, placement is the one-device rule under its budget:
// experts spill to host RAM first, and ops whose weights are there are offloaded to the device of
// their layer.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/models/model_graph.h"
#include "runtime/context.h"
#include "sched/graph_cut.h"
#include "sched/policy.h"

namespace moe {

// The devices of a context, from its params (validated: each bad value is INVALID_ARGUMENT naming it).
struct DeviceList {
    std::vector<int> ordinals;        // one per device of the context, in the list's order
    std::vector<double> proportions;  // tensor_split, one per device; empty: by budgets or free memory
    std::vector<uint64_t> budgets;    // per device (0: from its free memory)
    // The several-device default (runtime/default_devices.h) picks the devices and their layers: no
    // device list, tensor split or override naming a device, split_mode layer, several devices visible.
    bool fill = false;
};
// The devices of `list` whose share is above 0 (shares: one per device), in order, with their budgets and
// those shares as proportions (none where one device is left), fill off.
DeviceList devices_with_shares(const DeviceList& list, const std::vector<double>& shares);
// device_kind: MOE_DEVICE_CUDA or MOE_DEVICE_EMULATED (resolved); device_count: the backend's devices;
// visible: those a context without a device list uses, ordinals 0 .. visible - 1 (-1: all; CUDA's are
// all its GPUs, the emulated backend's its emulated_devices option).
StatusOr<DeviceList> device_list(const moe_context_params& p, int32_t device_kind, int device_count,
                                 int visible = -1);

// Per weight of `ws`, the layer it belongs to: its own (blk.N); for a weight outside the layers
// (embeddings, output norm and head), the layer next to the first node that reads it in a one-token
// graph (sched/device_split.h runs such nodes with it); -1 for one that no node reads.
std::vector<int> weight_layers(const moe_context& ctx, const std::vector<Tensor*>& ws);

// Creates the devices after the first (ctx.device is device 0 of `list`), places the weights over all
// of them, uploads them, and makes a scheduler per device and the KV cache; enables peer access
// between the devices of consecutive stages (unless the backend option peer_copies=staged). REQUIRES: list has two or
// more devices; the model's weights are bound.
Status place_weights_multi(moe_context& ctx, const DeviceList& list, const sched::Policy& policy);

// The expert split of the next ubatch over all devices: each scheduler's plan for its own layers.
StatusOr<sched::ExpertSplitPlan> plan_expert_split_multi(moe_context& ctx, int n_tokens);

// A ubatch graph cut into stages for the context's devices (sched/graph_cut.h; the graph is consumed and
// must outlive the stages).
StatusOr<std::vector<sched::Stage>> cut_stages(const moe_context& ctx, Graph& graph);

// Plans the stages of a ubatch built ahead on their devices' schedulers (Scheduler::prepare; a device's
// first stage only), while the devices may still compute the current ubatch.
void prepare_stages(moe_context& ctx, std::vector<sched::Stage>& stages);

// Runs a ubatch's stages (cut_stages) in order, as Scheduler::run does on one device (parts, inputs and
// outputs those of the whole graph). Once a stage is queued, the next starts inside its run (while its
// device computes: Scheduler::run's while_waiting) where it can: its device in no run, and what it takes
// from stages still running left on their devices for a peer copy. while_waiting, when given, runs once
// the last stage is queued. Counts the bytes crossing between devices in the stats of the schedulers that
// send and receive them (a peer copy once, at the reader). REQUIRES: place_weights_multi made the context
// (its devices' peer flags).
Status run_stages(moe_context& ctx, std::vector<sched::Stage>& stages, const sched::ExpertParts& parts, int n_tokens,
                  std::span<const sched::HostInput> inputs, std::span<const sched::HostOutput> outputs,
                  const std::function<void()>& while_waiting = {});

// The statistics of the context: its devices' schedulers' summed (one device: its scheduler's).
sched::Stats context_stats(const moe_context& ctx);
// A weight's copies, from the scheduler of its device; nullopt for an unregistered tensor.
std::optional<sched::WeightCopies> weight_copies(const moe_context& ctx, const Tensor* weight);
// The context's schedulers: device 0's, then the other devices' (one for one device).
std::vector<sched::Scheduler*> schedulers(const moe_context& ctx);
// The scheduler of device `index` of the list. REQUIRES: index < n_devices(ctx).
sched::Scheduler& scheduler_of(const moe_context& ctx, size_t index);
// The devices of the context: its list's; 1 for one device and for CPU contexts.
size_t n_devices(const moe_context& ctx);

}  // namespace moe
