// The scheduling policy: which ops with host-resident weights may be offloaded to the device and from
// what batch size, how expert weights are uploaded, and whether expert biases are duplicated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace moe::sched {

enum class OffloadOp : int32_t { MUL_MAT = 0, MUL_MAT_ID = 1, MOE_UP_GATE = 2 };
constexpr int kOffloadOps = 3;

// "mul_mat", "mul_mat_id", "moe_up_gate"; nullptr for an out-of-range index.
const char* offload_op_name(int op);
// The offload kind of a graph op, if it is one.
std::optional<OffloadOp> offload_op_of(Op op);

struct OffloadRule {
    bool enabled = true;
    int32_t min_batch = -1;  // -1: default_min_batch()
};

enum class ExpertCopy : int32_t { FULL = 0, ACTIVE_ONLY = 1, ACTIVE_PREFETCH = 2, AUTO = 3 };

constexpr int32_t kExpertSplitAuto = -1;
constexpr int64_t kExpertCacheAuto = -1;

// AUTO's rule: ACTIVE_ONLY for an expert op whose ids hold fewer than kActiveAutoRatio * n_expert
// (token, expert) pairs, FULL from there on. Under uniform routing, p pairs leave a fraction
// (1 - 1/E)^p ~ exp(-p/E) of the E experts unselected: below 2 * E pairs that is more than 13.5% of the
// layer's expert bytes that need not cross PCIe, well above what the id readback costs (the device's
// latency, ~10-50 us, against milliseconds of upload per layer); above it, the saving shrinks fast
// (5% at 3 * E, 0.03% at 8 * E) while the readback still stalls the upload stream, which FULL keeps
// running ahead of compute. Skewed routing only saves more. With the default offload thresholds
// (32 * E / k tokens: 32 * E pairs) offloaded prompt ubatches stay FULL, while smaller ubatches
// offloaded by lower thresholds, the expert split's device part and cached experts go ACTIVE.
constexpr int64_t kActiveAutoRatio = 2;

struct Policy {
    OffloadRule offload[kOffloadOps];
    ExpertCopy expert_copy = ExpertCopy::AUTO;
    bool bias_dup = true;
    uint64_t offload_vram_budget = 0;  // 0: automatic
    // Expert split: while a layer's expert ops are offloaded, the host computes this many of its
    // experts (those expected to see the fewest tokens) at the same time as the device computes the
    // rest, whose weights alone are uploaded. kExpertSplitAuto (the default) balances the host's
    // measured expert throughput against the upload time, and timed ubatches with and without the
    // split confirm it (SplitTrials); 0 turns it off.
    int32_t expert_split = kExpertSplitAuto;
    // Device memory that keeps uploaded experts for the next ubatches (sched/expert_cache.h), in bytes:
    // kExpertCacheAuto (the default) takes half of what the device has free beyond a 1 GiB reserve
    // when the first expert is uploaded; 0 turns the cache off.
    int64_t expert_cache = kExpertCacheAuto;

    const OffloadRule& rule(OffloadOp op) const { return offload[static_cast<int>(op)]; }
};

// 32 tokens for dense products; 32 * n_expert / n_expert_used for expert ops, so that each expert
// sees about 32 tokens when its weights cross PCIe (seed PR 405 and ik_llama.cpp's MoE threshold).
int32_t default_min_batch(OffloadOp op, int n_expert, int n_expert_used);

// The threshold in use for `op` (min_batch, or the default when it is -1).
int32_t resolved_min_batch(const Policy& p, OffloadOp op, int n_expert, int n_expert_used);

// Whether an expert op whose ids are [n_used, n_tokens] uploads only the selected experts (after reading
// the ids back) under policy p: ACTIVE_ONLY and ACTIVE_PREFETCH always, AUTO by kActiveAutoRatio.
bool copies_active_experts(const Policy& p, int64_t n_used, int64_t n_tokens, int n_expert);

// INVALID_ARGUMENT naming the field for a negative min_batch other than -1, an unknown expert copy,
// an expert_split below -1 or an expert_cache below -1.
Status validate_policy(const Policy& p);

// Applies "op=N|on|off[,...]" ("all" names every op) to *p; on error *p is unchanged.
Status parse_offload_spec(const std::string& spec, Policy* p);

}  // namespace moe::sched
