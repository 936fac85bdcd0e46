// What the scheduler's parts ask of a graph node, by op: its expert ids, whether an operand is an
// expert matrix, how many tokens it processes.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moe::sched {

// The ids operand of an expert op, or nullptr.
inline const Tensor* expert_ids_of(const Tensor& node) {
    if (node.op == Op::MUL_MAT_ID) return node.src[2];
    if (node.op == Op::MOE_UP_GATE) return node.src[3];
    return nullptr;
}

// Whether operand src_index of node is an expert matrix (ACTIVE_ONLY may upload it in part).
inline bool is_expert_matrix(const Tensor& node, int src_index) {
    return (node.op == Op::MUL_MAT_ID && src_index == 0) || (node.op == Op::MOE_UP_GATE && src_index <= 1);
}

// Tokens an offloadable op processes (what its min_batch compares with).
inline int64_t op_tokens(const Tensor& node) {
    switch (node.op) {
        case Op::MUL_MAT: return node.src[1]->n_rows();
        case Op::MUL_MAT_ID: return node.src[1]->ne[2];
        case Op::MOE_UP_GATE: return node.src[2]->ne[1];
        default: return 0;
    }
}

}  // namespace moe::sched
