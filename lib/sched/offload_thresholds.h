// The offload thresholds: from what batch size an op whose weights are in host RAM runs on the device
// (its weights uploaded) rather than on the host. Three sources, first that applies wins:
// - override: the policy's explicit min_batch;
// - measured: computed at context creation (runtime/offload_calibration.h) from the link bandwidth and
//   the host's and device's throughput on the op's weights, by offload_break_even() below;
// - default: the fixed 32 / 32 * E / k of default_min_batch() (policy.h) when nothing was measured.
//
// The model (docs/POLICY.md). Rates are in bytes of weights times tokens per second: a weight of W bytes
// applied to n tokens takes W * n / R. On the host, n tokens cost n * W / H; on the device, the upload
// W / L plus n * W / D (D = 0: not measured, the device's compute left out, as it is against PCIe:
// the device reads the W bytes from its own memory two orders of magnitude faster than they cross).
// The device is no slower once
//     n * W / H >= W / L + n * W / D   <=>   n >= m = (1 / L) / (1 / H - 1 / D),
// W cancels: m, the tokens a weight must see, depends only on the rates. A dense product's weight sees
// every token of the ubatch: threshold ceil(m). An expert op's n tokens pick k of E experts each, so
// each expert's weights see n * k / E tokens: threshold ceil(m * E / k). (The whole expert tensor
// crosses: at such batch sizes every expert is picked, 1 - (1 - k/E)^n ~ 1, so ACTIVE copies save
// nothing there.) D <= H: the device never catches up, kMaxCalibratedMinBatch.
#pragma once

#include <cstdint>
#include <optional>

#include "sched/policy.h"

namespace moe::sched {

enum class ThresholdSource : int32_t { DEFAULT = 0, MEASURED = 1, OVERRIDE = 2 };

// "default", "measured", "override"; nullptr for anything else.
const char* threshold_source_name(int32_t source);

// The figures the measured thresholds come from, in GB/s (1e9 bytes per second); 0: not measured.
struct OffloadCalibration {
    double link_gbps = 0.0;                // host-to-device copies of the host-resident weights
    double host_gbps[kOffloadOps] = {};    // per op kind, weight bytes x tokens per second on the host
    double device_gbps[kOffloadOps] = {};  // the same on the device; 0: its compute left out
    // The host's rate on an expert weight at prompt sizes (kPrefillProbeTokens tokens, where the products
    // take the host's batched kernels, AMX included): the expert split's first guess of its host cost.
    double host_prefill_gbps = 0.0;
};

struct OffloadThreshold {
    int32_t min_batch = 0;
    ThresholdSource source = ThresholdSource::DEFAULT;
};

// The largest measured threshold: offloading an op kind whose device is no faster than the host.
constexpr int32_t kMaxCalibratedMinBatch = 1 << 24;

// m above: the tokens a weight must see for the device to be no slower; nullopt when link or host is
// not a positive finite rate; infinity when the device (measured) is no faster than the host.
std::optional<double> offload_break_even(double link_gbps, double host_gbps, double device_gbps);

// The measured threshold of `op` (ceil(m), or ceil(m * E / k) for the expert ops when E, k > 0),
// in [1, kMaxCalibratedMinBatch]; nullopt when `c` lacks the figures for it.
std::optional<int32_t> calibrated_min_batch(const OffloadCalibration& c, OffloadOp op, int n_expert, int n_expert_used);

// The threshold in effect: the policy's min_batch when set (>= 0), else `measured` when given, else the default.
OffloadThreshold offload_threshold(const Policy& p, std::optional<int32_t> measured, OffloadOp op, int n_expert,
                                   int n_expert_used);

}  // namespace moe::sched
