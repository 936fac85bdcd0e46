// The several-device default (docs/MULTI_GPU.md): a context given no device list, tensor split or
// override naming a device, on a backend that shows several devices (CUDA: the machine's GPUs; the
// emulated backend: its emulated_devices option), fills the devices one after the other in order of
// the memory they offer, so that a model that fits one device stays on it (no crossing between devices)
// and experts spill to host RAM only when every device is full.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend_registry.h"
#include "runtime/multi_device.h"
#include "sched/policy.h"

namespace moe {

// `list`'s devices in the order the default fills them: the memory each offers for weights (its budget
// where one is given, else its free memory, asked of the factory) the most first, the lower ordinal
// first among equals; their budgets reordered alike. *free receives each one's free memory, in that
// order. A device the factory cannot ask (busy, failed) is left out; none answering is the first one's
// error; one left clears fill (a one-device context). REQUIRES: list.fill.
StatusOr<DeviceList> fill_order(const DeviceList& list, const BackendFactory& factory, const BackendOptions& options,
                                std::vector<uint64_t>* free);

// The devices and their layers, from `ordered` (fill_order's) and each one's free memory: the layers, in
// order, go to the first device while the weights the placement rules leave to the device (the tensor
// overrides, n_cpu_moe, n_gpu_layers; budget aside) fit its budget (the given one, else the default
// budget of a device holding those layers), then to the next. Where they all fit: the devices that got
// layers, each with its run of layers as its proportion (one: a one-device context on it). Where they do
// not (or the first device can take no layer): every device, the layers split by their budgets or free
// memory as without the default, each device spilling experts to host RAM under its own budget (where
// that split gives a device more of the weights no budget moves than its budget holds, as the rule of
// proportions can give a full device one layer too many, the layers as those weights fill the devices
// in order, the devices that got none left out); but where even the weights no budget moves to host RAM
// (all but the expert tensors no override pins) do not fit the devices in order, the first device alone
// (no split could place them; its refusal names its budget, as a one-GPU machine's).
// REQUIRES: ctx has its weights bound and ctx.device is the backend of ordered.ordinals[0]; ctx.params
// holds the borrowed fields (tensor_overrides).
StatusOr<DeviceList> fill_devices(const moe_context& ctx, const DeviceList& ordered, const std::vector<uint64_t>& free,
                                  const sched::Policy& policy);

}  // namespace moe
