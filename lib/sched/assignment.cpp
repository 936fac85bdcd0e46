#include "sched/assignment.h"

#include "core/allocator.h"
#include "sched/expert_plan.h"
#include "sched/graph_ops.h"

namespace moe::sched {

OffloadThreshold Assignment::threshold(OffloadOp op) const {
    return offload_threshold(policy_, measured_[static_cast<size_t>(op)], op, n_expert_, n_expert_used_);
}

void Assignment::set_calibration(const OffloadCalibration& c) {
    calibration_ = c;
    for (int i = 0; i < kOffloadOps; ++i) {
        measured_[i] = calibrated_min_batch(c, static_cast<OffloadOp>(i), n_expert_, n_expert_used_);
    }
}

// Whether every host-resident expert matrix `node` reads is whole in the expert cache (and it reads one).
bool Assignment::experts_cached(const Tensor& node) const {
    if (!cached_whole_) return false;
    bool any = false;
    for (int i = 0; i < kMaxSrc; ++i) {
        const Tensor* s = node.src[i];
        if (s == nullptr || !s->is_weight || !is_expert_matrix(node, i)) continue;
        const std::optional<WeightCopies> w = weights_.usable(s, policy_.bias_dup);
        if (w && w->device != nullptr) continue;
        if (!cached_whole_(s)) return false;
        any = true;
    }
    return any;
}

Side Assignment::side_of(const Tensor& node, const RunState& rs, Stats& stats) const {
    if (device_ == nullptr) return Side::HOST;
    switch (node.op) {
        case Op::VIEW: return rs.side_of_storage(storage_of(&node), weights_);
        case Op::CPY:  // writes the KV cache: runs where the cache is, as does attention reading it
            return rs.side_of_storage(storage_of(node.src[1]), weights_);
        case Op::ATTENTION: {
            // Keys read from the cache: where the cache is. Keys computed in the graph (deepseek2's prompts
            // up-project the cached latents) leave it to the rule of the other ops, its operands and support.
            const Tensor* keys = storage_of(node.src[1]);
            if (keys->op == Op::NONE) return rs.side_of_storage(keys, weights_);
            break;
        }
        default: break;
    }
    // A part of a split expert block runs where its group's experts are computed, whole; but the
    // non-resident experts' part of a partly resident layer is placed as any op with host weights
    // (offloaded at large batches, uploading what it reads).
    const int32_t group = rs.group_of(node);
    if (group >= 0 && !(group == kHostExpertGroup && weights_.partly_resident(node.layer))) {
        const std::optional<OffloadOp> kind = offload_op_of(node.op);
        const bool on_device = group == kDeviceExpertGroup && device_->supports_op(node);
        if (kind) ++(on_device ? stats.n_offloaded : stats.n_kept_host)[static_cast<size_t>(*kind)];
        return on_device ? Side::DEVICE : Side::HOST;
    }
    const std::optional<OffloadOp> kind = offload_op_of(node.op);
    if (kind && node.src[0] != nullptr && node.src[0]->is_weight) {
        const std::optional<WeightCopies> w = weights_.usable(node.src[0], policy_.bias_dup);
        if (w && w->device != nullptr) return Side::DEVICE;
        const OffloadRule& rule = policy_.rule(*kind);
        const auto k = static_cast<size_t>(*kind);
        if (rule.enabled && (op_tokens(node) >= min_batch(*kind) || experts_cached(node)) && device_->supports_op(node)) {
            ++stats.n_offloaded[k];
            return Side::DEVICE;
        }
        ++stats.n_kept_host[k];
        return Side::HOST;
    }
    // Weights available on one side only pin the op there.
    for (const Tensor* s : node.src) {
        if (s == nullptr || !s->is_weight) continue;
        const std::optional<WeightCopies> w = weights_.usable(s, policy_.bias_dup);
        if (!w) continue;
        if (w->host == nullptr) return Side::DEVICE;
        if (w->device == nullptr) return Side::HOST;
    }
    // The rest follow their operands, preferring the device.
    const bool host_ok = host_.supports_op(node);
    if (!device_->supports_op(node)) return Side::HOST;
    if (!host_ok) return Side::DEVICE;
    for (const Tensor* s : node.src) {
        if (s != nullptr && !s->is_weight && rs.side_of_storage(storage_of(s), weights_) == Side::DEVICE) {
            return Side::DEVICE;
        }
    }
    return Side::HOST;
}

}  // namespace moe::sched
