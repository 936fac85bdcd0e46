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

enum class ExpertCopy : int32_t { FULL = 0, ACTIVE_ONLY = 1, ACTIVE_PREFETCH = 2 };

constexpr int32_t kExpertSplitAuto = -1;

struct Policy {
    OffloadRule offload[kOffloadOps];
    ExpertCopy expert_copy = ExpertCopy::FULL;
    bool bias_dup = true;
    uint64_t offload_vram_budget = 0;  // 0: automatic
    // Expert split: while a layer's expert ops are offloaded, the host computes this many of its
    // experts (those expected to see the fewest tokens) at the same time as the device computes the
    // rest, whose weights alone are uploaded. kExpertSplitAuto (the default) balances the host's
    // measured expert throughput against the upload time, and timed ubatches with and without the
    // split confirm it (SplitTrials); 0 turns it off.
    int32_t expert_split = kExpertSplitAuto;

    const OffloadRule& rule(OffloadOp op) const { return offload[static_cast<int>(op)]; }
};

// 32 tokens for dense products; 32 * n_expert / n_expert_used for expert ops, so that each expert
// sees about 32 tokens when its weights cross PCIe (seed PR 405 and ik_llama.cpp's MoE threshold).
int32_t default_min_batch(OffloadOp op, int n_expert, int n_expert_used);

// The threshold in use for `op` (min_batch, or the default when it is -1).
int32_t resolved_min_batch(const Policy& p, OffloadOp op, int n_expert, int n_expert_used);

// INVALID_ARGUMENT naming the field for a negative min_batch other than -1, an unknown expert copy or
// an expert_split below -1.
Status validate_policy(const Policy& p);

// Applies "op=N|on|off[,...]" ("all" names every op) to *p; on error *p is unchanged.
Status parse_offload_spec(const std::string& spec, Policy* p);

}  // namespace moe::sched
