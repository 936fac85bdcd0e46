// CPU kernels, one function per op family; each computes `dst` (a node) from dst.src[...].
// All run oneTBB-parallel inside the caller's task arena. Kernels that need temporary memory (e.g.
// activations quantised to Q8) take it from `Scratch`, which the backend keeps between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"

namespace moe::cpu {

// Grow-only temporary memory, 64-byte aligned. Not thread-safe: one node computes at a time, and a
// kernel splits what it got among its own tasks.
class Scratch {
public:
    void* get(size_t bytes);

private:
    struct AlignedFree {
        void operator()(void* p) const;
    };
    std::unique_ptr<void, AlignedFree> mem_;
    size_t size_ = 0;
};

// Matrix products (cpu/matmul*.cpp).
Status mul_mat(Tensor& dst, Scratch& scratch);
Status mul_mat_id(Tensor& dst, Scratch& scratch);
Status moe_up_gate(Tensor& dst, Scratch& scratch);
// An expert FFN's up/gate product and the down product that reads it (MUL_MAT_ID with src1 the
// MOE_UP_GATE node and the same ids), as in every MoE layer: where both run their integer paths (few
// tokens per expert, as in decoding), in one parallel pass, so the threads do not all wait for the
// up/gate product's last job before the down product starts; each expert's down jobs start once its
// up/gate jobs are done. Bitwise the results of moe_up_gate then mul_mat_id. down_scratch: scratch
// of its own for the down product (both are live at once).
bool moe_ffn_fusable(const Tensor& up_gate, const Tensor& down);
Status moe_ffn(Tensor& up_gate, Tensor& down, Scratch& scratch, Scratch& down_scratch);
bool supports_matmul_type(Type weight_type);

// Everything else (cpu/ops_*.cpp).
Status get_rows(Tensor& dst);
Status rms_norm(Tensor& dst);
Status binary(Tensor& dst);  // MUL, ADD
Status rope(Tensor& dst);
Status attention(Tensor& dst, Scratch& scratch);
Status softmax(Tensor& dst);
Status topk(Tensor& dst);
Status gather(Tensor& dst);
Status weighted_sum(Tensor& dst);
Status mask_ids(Tensor& dst);
Status unary(Tensor& dst);  // SILU, SIGMOID
Status norm_scale(Tensor& dst);
Status glu(Tensor& dst);    // SWIGLU, SWIGLU_OAI
Status cpy(Tensor& dst);
Status concat(Tensor& dst);                         // CONCAT (cpu/ops_heads.cpp)
Status mul_mat_heads(Tensor& dst, Scratch& scratch);  // MUL_MAT_HEADS (cpu/ops_heads.cpp)
Status group_mask(Tensor& dst);                      // GROUP_MASK (cpu/ops_group_mask.cpp)

}  // namespace moe::cpu
