// The backend registry: backends register a factory; the runtime creates backends by name without
// depending on lib/cpu or lib/cuda. Built-in backends are registered by a function CMake generates
// (register_builtin_backends), so static linking cannot drop them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/backend_config.h"
#include "core/bandwidth.h"

namespace moe {

struct BackendOptions {
    int n_threads = 0;  // CPU threads; 0 = all cores
    int device = 0;     // device ordinal for device backends
    BackendConfig config;  // the context's backend_options (env fallback applied)
};

struct BackendFactory {
    std::string name;  // "cpu", "cuda"
    // Number of devices this backend can drive here (0: unavailable, e.g. no GPU).
    std::function<int()> device_count;
    std::function<StatusOr<std::unique_ptr<Backend>>(const BackendOptions&)> create;
    // Optional (empty when the backend has none): bandwidth probes for moe_measure_bandwidth and the
    // scheduler's calibration. A device backend measures its host link; "cpu" measures host reads.
    // Allocation failures return RESOURCE_EXHAUSTED.
    std::function<StatusOr<LinkBandwidth>(const BandwidthOptions&)> measure_link = {};
    std::function<StatusOr<HostReadBandwidth>(const BandwidthOptions&)> measure_host_read = {};
    // Optional: the free memory of device o.device, in bytes, without creating a backend on it (the
    // several-device default orders the devices by it before creating any); empty: the runtime creates
    // a backend to ask.
    std::function<StatusOr<uint64_t>(const BackendOptions&)> free_memory = {};
};

void register_backend_factory(BackendFactory factory);

// All registered factories (built-in ones registered on first call).
const std::vector<BackendFactory>& backend_factories();
const BackendFactory* find_backend_factory(const std::string& name);

// Defined in the CMake-generated backends_init.cpp.
void register_builtin_backends();

}  // namespace moe
