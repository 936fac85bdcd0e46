// Does this op run on the GPU? The side of every node of a ubatch graph, in node order:
// - the parts of a split expert block run where their group's experts are computed;
// - an offloadable op (MUL_MAT, MUL_MAT_ID, MOE_UP_GATE) whose weights are only in host RAM runs on
//   the device when the policy offloads it at this many tokens (its weights are uploaded then), or at
//   any number of tokens when the expert cache holds every expert of its expert matrices (nothing to
//   upload: decode then reads the cached experts on the device instead of host RAM);
// - weights available on one side only pin the op there; views, KV-cache writes and attention follow
//   their storage;
// - the rest follow their operands, preferring the device.
// Nothing here copies anything (sched/transfers.h does) or knows an architecture.
#pragma once

#include <functional>

#include "core/backend.h"
#include "sched/offload_thresholds.h"
#include "sched/policy.h"
#include "sched/run_state.h"
#include "sched/stats.h"
#include "sched/weight_table.h"

namespace moe::sched {

class Assignment {
public:
    // policy is the scheduler's, read at each call; device may be nullptr (everything on the host).
    Assignment(Backend& host, Backend* device, const WeightTable& weights, const Policy& policy, int n_expert,
               int n_expert_used)
        : host_(host), device_(device), weights_(weights), policy_(policy), n_expert_(n_expert),
          n_expert_used_(n_expert_used) {}

    // The side of `node`, its operands placed already (rs.produced). Counts offload decisions in stats.
    Side side_of(const Tensor& node, const RunState& rs, Stats& stats) const;
    // The batch size from which an op with host-resident weights is offloaded, and where it came from
    // (sched/offload_thresholds.h: the policy's, the measured one, or the default for this model's
    // expert counts).
    int32_t min_batch(OffloadOp op) const { return threshold(op).min_batch; }
    OffloadThreshold threshold(OffloadOp op) const;
    // The figures measured at context creation; the measured thresholds follow from them.
    void set_calibration(const OffloadCalibration& c);
    const OffloadCalibration& calibration() const { return calibration_; }
    // Whether the expert cache holds every expert of a host-resident expert matrix (Transfers::cached_whole).
    void set_cached_whole(std::function<bool(const Tensor*)> f) { cached_whole_ = std::move(f); }

private:
    Backend& host_;
    Backend* device_;
    const WeightTable& weights_;
    const Policy& policy_;
    int n_expert_;
    int n_expert_used_;
    OffloadCalibration calibration_;
    std::optional<int32_t> measured_[kOffloadOps];  // calibrated_min_batch of calibration_
    std::function<bool(const Tensor*)> cached_whole_;

    bool experts_cached(const Tensor& node) const;
};

}  // namespace moe::sched
