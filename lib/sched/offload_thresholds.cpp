#include "sched/offload_thresholds.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moe::sched {

const char* threshold_source_name(int32_t source) {
    switch (source) {
        case static_cast<int32_t>(ThresholdSource::DEFAULT): return "default";
        case static_cast<int32_t>(ThresholdSource::MEASURED): return "measured";
        case static_cast<int32_t>(ThresholdSource::OVERRIDE): return "override";
        default: return nullptr;
    }
}

std::optional<double> offload_break_even(double link_gbps, double host_gbps, double device_gbps) {
    const auto rate = [](double r) { return std::isfinite(r) && r > 0.0; };
    if (!rate(link_gbps) || !rate(host_gbps)) return std::nullopt;
    // Per token, what the device saves over the host (seconds per GB of weights); the upload is paid once.
    const double saved = 1.0 / host_gbps - (rate(device_gbps) ? 1.0 / device_gbps : 0.0);
    if (saved <= 0.0) return std::numeric_limits<double>::infinity();
    return (1.0 / link_gbps) / saved;
}

std::optional<int32_t> calibrated_min_batch(const OffloadCalibration& c, OffloadOp op, int n_expert, int n_expert_used) {
    const auto i = static_cast<size_t>(op);
    const std::optional<double> m = offload_break_even(c.link_gbps, c.host_gbps[i], c.device_gbps[i]);
    if (!m) return std::nullopt;
    double tokens = *m;
    if (op != OffloadOp::MUL_MAT && n_expert > 0 && n_expert_used > 0) {
        tokens *= static_cast<double>(n_expert) / static_cast<double>(n_expert_used);
    }
    if (!(tokens < kMaxCalibratedMinBatch)) return kMaxCalibratedMinBatch;
    return std::max<int32_t>(1, static_cast<int32_t>(std::ceil(tokens)));
}

OffloadThreshold offload_threshold(const Policy& p, std::optional<int32_t> measured, OffloadOp op, int n_expert,
                                   int n_expert_used) {
    const int32_t m = p.rule(op).min_batch;
    if (m >= 0) return {m, ThresholdSource::OVERRIDE};
    if (measured) return {*measured, ThresholdSource::MEASURED};
    return {default_min_batch(op, n_expert, n_expert_used), ThresholdSource::DEFAULT};
}

}  // namespace moe::sched
