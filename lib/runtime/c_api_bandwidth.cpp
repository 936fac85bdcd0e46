// C API: moe_measure_bandwidth, through the backend registry's optional probes ("cpu" reads host
// memory, a device backend times its host link), so the runtime depends on neither lib/cpu nor lib/cuda.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "core/backend_registry.h"
#include "moeinfer/moeinfer.h"
#include "runtime/c_api_guard.h"
#include "runtime/c_api_structs.h"
#include "runtime/device.h"

namespace {

constexpr uint64_t kMinBytes = 4096;
constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
constexpr uint64_t kDefaultHostReadBytes = uint64_t{2} << 30;

moe::Status check_params(const moe_bandwidth_params& p) {
    using moe::invalid_argument;
    if (p.device != MOE_DEVICE_CPU && p.device != MOE_DEVICE_CUDA && p.device != MOE_DEVICE_AUTO) {
        return invalid_argument("params->device must be MOE_DEVICE_CPU, MOE_DEVICE_CUDA or MOE_DEVICE_AUTO (got " +
                                std::to_string(p.device) + ")");
    }
    if (p.bytes < kMinBytes || p.bytes > kMaxBytes) {
        return invalid_argument("params->bytes must be in [4096, 2^40] (got " + std::to_string(p.bytes) + ")");
    }
    if (p.host_bytes != 0 && (p.host_bytes < kMinBytes || p.host_bytes > kMaxBytes)) {
        return invalid_argument("params->host_bytes must be 0 (automatic) or in [4096, 2^40] (got " +
                                std::to_string(p.host_bytes) + ")");
    }
    if (p.n_threads < 0 || p.n_threads > MOE_MAX_THREADS) {
        return invalid_argument("params->n_threads must be in [0, " + std::to_string(MOE_MAX_THREADS) +
                                "] (0 = all cores; got " + std::to_string(p.n_threads) + ")");
    }
    if (p.repetitions < 1 || p.repetitions > 1000) {
        return invalid_argument("params->repetitions must be in [1, 1000] (got " + std::to_string(p.repetitions) + ")");
    }
    return moe::Status::ok();
}

// The factory for `name` with the probe `probe`, or why it cannot be used.
moe::StatusOr<const moe::BackendFactory*> probe_factory(const char* name, bool device_probe) {
    const moe::BackendFactory* f = moe::find_backend_factory(name);
    if (f == nullptr) return moe::unimplemented(std::string("this build of moeinfer has no ") + name + " backend");
    if (device_probe ? !f->measure_link : !f->measure_host_read) {
        return moe::unimplemented(std::string("the ") + name + " backend has no bandwidth probe");
    }
    if (f->device_count() == 0) return moe::failed_precondition(std::string("no ") + name + " device found");
    return f;
}

moe::Status measure(const moe_bandwidth_params& p, moe_bandwidth_result& r) {
    MOE_RETURN_IF_ERROR(check_params(p));
    // Availability first, so that a missing GPU fails before seconds of host reads.
    const moe::BackendFactory* device = nullptr;
    if (moe::resolve_device(p.device) == MOE_DEVICE_CUDA) {
        MOE_ASSIGN_OR_RETURN(device, probe_factory("cuda", true));
    }
    MOE_ASSIGN_OR_RETURN(const moe::BackendFactory* cpu, probe_factory("cpu", false));

    moe::BandwidthOptions o;
    o.repetitions = p.repetitions;
    o.n_threads = p.n_threads;
    o.bytes = static_cast<size_t>(p.host_bytes != 0 ? p.host_bytes : std::max(p.bytes, kDefaultHostReadBytes));
    MOE_ASSIGN_OR_RETURN(const moe::HostReadBandwidth host, cpu->measure_host_read(o));
    r.host_read = host.gbps;
    r.host_bytes = o.bytes / 8 * 8;  // whole 64-bit words are read
    r.n_threads = host.n_threads;
    r.repetitions = p.repetitions;
    if (device == nullptr) return moe::Status::ok();

    o.bytes = static_cast<size_t>(p.bytes);
    o.device = 0;
    MOE_ASSIGN_OR_RETURN(const moe::LinkBandwidth link, device->measure_link(o));
    r.h2d_pinned = link.h2d_pinned;
    r.h2d_pageable = link.h2d_pageable;
    r.d2h_pinned = link.d2h_pinned;
    r.d2h_pageable = link.d2h_pageable;
    r.bytes = p.bytes;
    return moe::Status::ok();
}

}  // namespace

extern "C" {

MOE_API void moe_bandwidth_params_init(moe_bandwidth_params* params) {
    if (params == nullptr) return;
    std::memset(params, 0, sizeof *params);
    params->struct_size = sizeof *params;
    params->device = MOE_DEVICE_CPU;
    params->bytes = uint64_t{1} << 30;
    params->host_bytes = 0;
    params->n_threads = 0;
    params->repetitions = 5;
}

MOE_API void moe_bandwidth_result_init(moe_bandwidth_result* result) {
    if (result == nullptr) return;
    std::memset(result, 0, sizeof *result);
    result->struct_size = sizeof *result;
}

MOE_API moe_status moe_measure_bandwidth(const moe_bandwidth_params* params, moe_bandwidth_result* out_result) {
    MOE_API_BEGIN
    MOE_CHECK_ARG(out_result != nullptr, "out_result is NULL");
    MOE_CHECK_ARG(out_result->struct_size >= sizeof(uint32_t),
                  "out_result->struct_size is too small (call moe_bandwidth_result_init first)");
    moe_bandwidth_params p;
    moe_bandwidth_params_init(&p);
    if (params != nullptr) {
        MOE_CHECK_ARG(params->struct_size >= offsetof(moe_bandwidth_params, device) + sizeof(int32_t),
                      "params->struct_size is too small (call moe_bandwidth_params_init first)");
        p = moe::read_sized(*params, p);
    }
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    MOE_RETURN_API(measure(p, r));
    moe::write_sized(r, out_result);
    return MOE_STATUS_OK;
    MOE_API_END
}

}  // extern "C"
