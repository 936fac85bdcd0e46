// One device's share of a context over several devices (layer split; runtime/multi_device.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "runtime/host_weights.h"
#include "sched/scheduler.h"

namespace moe {

struct DevicePart {
    int ordinal = 0;  // the backend's device ordinal
    // Members in this order so that the scheduler goes first and the backend last.
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Buffer> weights;  // its layers' weights placed on (or duplicated to) it
    HostWeights host_weights;         // its layers' host-resident weights, page-locked with it
    std::unique_ptr<Buffer> kv;       // its layers' KV cache
    std::unique_ptr<sched::Scheduler> sched;
    uint64_t weights_device_bytes = 0;
    uint64_t weights_host_bytes = 0;
    uint64_t weights_host_locked_bytes = 0;
    int n_layers = 0;  // layers it holds
    // Per device of the list: whether this one copies from that one's memory directly (peer access,
    // enabled at creation for the devices of consecutive stages unless peer_copies=staged).
    std::vector<uint8_t> peer;
    // Per device of the list: whether this one uploads part of its host-resident weights through that
    // one's host link (Backend::add_upload_relay; backend option upload_relay).
    std::vector<uint8_t> relay;
    // Page-locked host memory (its backend's) where its stages' results cross to other devices through
    // the host; grow-only.
    std::unique_ptr<Buffer> staging;
};

}  // namespace moe
