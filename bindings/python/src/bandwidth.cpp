// moeinfer.measure_bandwidth: host read and host<->device copy bandwidths.
#include "bindings.h"

namespace moeinfer_py {
namespace {

py::dict measure_bandwidth(const std::string& device, int64_t bytes, int64_t host_bytes, int32_t n_threads,
                           int32_t repetitions) {
    moe_bandwidth_params p = moeinfer::bandwidth_params();
    if (device == "cpu") {
        p.device = MOE_DEVICE_CPU;
    } else if (device == "cuda") {
        p.device = MOE_DEVICE_CUDA;
    } else {
        throw py::value_error("measure_bandwidth: device must be \"cpu\" or \"cuda\", got \"" + device + "\"");
    }
    if (bytes < 0) throw py::value_error("measure_bandwidth: bytes must be >= 4096, got " + std::to_string(bytes));
    if (host_bytes < 0) {
        throw py::value_error("measure_bandwidth: host_bytes must be 0 or >= 4096, got " + std::to_string(host_bytes));
    }
    p.bytes = static_cast<uint64_t>(bytes);
    p.host_bytes = static_cast<uint64_t>(host_bytes);
    p.n_threads = n_threads;
    p.repetitions = repetitions;
    moe_bandwidth_result r;
    {
        py::gil_scoped_release release;
        r = moeinfer::measure_bandwidth(p);
    }
    py::dict d;
    d["device"] = device;
    d["host_read"] = r.host_read;
    d["h2d_pinned"] = r.h2d_pinned;
    d["h2d_pageable"] = r.h2d_pageable;
    d["d2h_pinned"] = r.d2h_pinned;
    d["d2h_pageable"] = r.d2h_pageable;
    d["bytes"] = r.bytes;
    d["host_bytes"] = r.host_bytes;
    d["n_threads"] = r.n_threads;
    d["repetitions"] = r.repetitions;
    return d;
}

}  // namespace

void bind_bandwidth(py::module_& m) {
    using namespace pybind11::literals;
    m.def("measure_bandwidth", &measure_bandwidth, "device"_a = "cpu", py::kw_only(), "bytes"_a = int64_t{1} << 30,
          "host_bytes"_a = 0, "n_threads"_a = 0, "repetitions"_a = 5,
          R"(Measures memory bandwidths in GB/s (1e9 bytes/s), each the median of `repetitions` timed runs.

device: "cpu" measures host_read only (all n_threads threads reading one host buffer of host_bytes,
or max(bytes, 2 GiB) when host_bytes is 0, so that CPU caches do not matter); "cuda" also times
copies of `bytes` between GPU 0 and pinned / pageable host memory. Returns a dict with keys
device, host_read, h2d_pinned, h2d_pageable, d2h_pinned, d2h_pageable (0.0 when not measured),
bytes (per copy; 0 for "cpu"), host_bytes, n_threads (used), repetitions. Raises ValueError (bad
arguments), NotImplementedError ("cuda" in a build without CUDA), RuntimeError (no GPU),
MemoryError (a buffer could not be allocated). Takes seconds; the GIL is released meanwhile.)");
}

}  // namespace moeinfer_py
