// What the measured offload thresholds are computed from (sched/offload_thresholds.h), measured once at
// context creation: the host-to-device bandwidth of the context's host-resident weights (the device
// backend's link probe, as moe_measure_bandwidth runs it, cached per process and device; a backend
// without a probe has a slice of weights uploaded and timed), and per op kind the host's and the
// device's time to multiply a slice of one of that kind's host-resident weights (up to kProbeBytes
// of its first matrix) by kProbeTokens tokens.
#pragma once

#include "core/status.h"
#include "runtime/context.h"
#include "sched/offload_thresholds.h"

namespace moe {

// The tokens a probe multiplies: what a weight sees at the fixed thresholds (each expert's share of a
// ubatch at 32 * E / k tokens), where the measured threshold is expected to land.
constexpr int kProbeTokens = 32;
constexpr size_t kProbeBytes = size_t{4} << 20;
// The tokens of the prefill probe: what each expert sees in a 4096-token ubatch of 8 experts out of 128.
constexpr int kPrefillProbeTokens = 256;

// Whether ctx's creation measures: offload_calibration=on for any device context, auto (the default)
// for CUDA contexts only, so that the emulated device keeps the fixed thresholds and tests stay
// deterministic.
bool wants_offload_calibration(const moe_context& ctx);

// The figures, for the op kinds that have a weight in host RAM only (others stay 0: the default
// threshold, which then decides nothing). RESOURCE_EXHAUSTED when the device cannot hold a probe.
// REQUIRES: the weights are registered with ctx.sched and the KV cache is bound.
StatusOr<sched::OffloadCalibration> measure_offload_calibration(moe_context& ctx);

}  // namespace moe
