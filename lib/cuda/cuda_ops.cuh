// CUDA kernels, one function per op family; each computes `dst` (a node) from dst.src[...] on
// ctx.stream. Every data pointer (dst and srcs) is a device pointer of this backend's device.
// The list mirrors lib/cpu/cpu_ops.h so that the two backends stay op-for-op comparable.
//
// Launches are asynchronous: a function returns once its kernels are queued (launch errors are
// checked and returned as Status); results are visible after the stream is synchronised.
// Kernels never allocate: temporary device memory comes from ctx.scratch, which the backend
// grows to at least scratch_bytes(node) before calling.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "core/backend.h"
#include "core/backend_config.h"
#include "core/status.h"
#include "core/tensor.h"

namespace moe::cuda {

struct OpContext {
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;  // bound to `stream` (cublasSetStream) by the backend
    void* scratch = nullptr;          // device memory, 256-byte aligned
    size_t scratch_size = 0;
    int n_sm = 0;                     // multiprocessors of the device, for grid sizing
    bool clusters = false;            // thread block clusters may be launched (compute capability 9.0+)
    // Device-visible error word (mapped pinned host memory). A kernel that meets bad data it cannot
    // report synchronously (an out-of-range id read on the device) ORs a kError* bit here, writes NaN
    // instead of reading out of bounds, and the backend turns the word into a Status at synchronize().
    unsigned int* error_flags = nullptr;
    // GEMV nodes: the activation's Q8 rows, already written by a fused RMS_NORM (fusion_plan.h); the
    // node then skips its own quantisation. nullptr: quantise as usual.
    const void* q8_act = nullptr;
    // RMS_NORM (row chains) and ATTENTION (attention_writes_q8): also write the result as Q8 rows here.
    // nullptr: don't.
    void* q8_out = nullptr;
    // Split-K attention merges in the kernel with these counters (kAttnCounters, zero between
    // launches); nullptr: a separate merge kernel.
    unsigned int* attn_counters = nullptr;
    // A word that is zero between launches, for the router GEMV's last-block selection (kRouterGemv).
    unsigned int* router_counter = nullptr;
    // The GEMV kernel of the decoded types (Q4_1 .. IQ4_XS) at 1 .. 8 columns (backend option kquant_gemv).
    KquantGemv kquant_gemv = BackendConfig{}.kquant_gemv;
    // The GEMV kernel of dense float weights (F16, BF16, F32) at 1 .. 8 columns (backend option float_gemv).
    FloatGemv float_gemv = BackendConfig{}.float_gemv;
    // MUL_MAT_ID on the grouped path: the previous launch, an expert product of the same ids, left the
    // route (tokens grouped by expert) in the scratch block (LaunchItem::route_from_prev).
    bool moe_route_ready = false;
    // Batched expert products of the decoded types (Q4_1 .. IQ4_XS): the tensor-core GEMM decodes their
    // tiles, or reads BF16 rows dequantised into scratch first (backend option expert_gemm_decode). The
    // scratch a node needs depends on it: matmul_scratch_bytes(node, expert_decode).
    ExpertGemmDecode expert_decode = BackendConfig{}.expert_gemm_decode;
};

constexpr int kAttnCounters = 1024;

constexpr unsigned int kErrorBadIndex = 1u;  // an id / row index outside its valid range

// Matrix products (cuda/matmul*.cu; written separately).
Status mul_mat(Tensor& dst, const OpContext& ctx);
Status mul_mat_id(Tensor& dst, const OpContext& ctx);
Status moe_up_gate(Tensor& dst, const OpContext& ctx);
bool supports_matmul_type(Type weight_type);
// Device scratch a MUL_MAT / MUL_MAT_ID / MOE_UP_GATE node needs (0 if none) when run with
// OpContext::expert_decode = decode.
size_t matmul_scratch_bytes(const Tensor& node, ExpertGemmDecode decode);
// The 2-D weight w (device memory, any type but F32) as BF16 rows of w.ne[0] at dst (device memory,
// w.ne[1] rows): the decode the tensor-core kernel and the cuBLAS path's dequantisation share
// (decode_half_bf16), each value RN(to_float) of the CPU's traits, bit for bit up to NaN payloads; the
// decoded types (Q4_1 .. IQ4_XS) in the FMA form of qd::decode_fma (quant_decode.h) where it applies.
// For tests; weights are checked as for MUL_MAT.
Status dequant_rows_bf16(const Tensor& w, void* dst, cudaStream_t stream);

// Everything else (cuda/ops_*.cu).
Status get_rows(Tensor& dst, const OpContext& ctx);
Status rms_norm(Tensor& dst, const OpContext& ctx);
Status binary(Tensor& dst, const OpContext& ctx);  // MUL, ADD
Status rope(Tensor& dst, const OpContext& ctx);
Status attention(Tensor& dst, const OpContext& ctx);
Status softmax(Tensor& dst, const OpContext& ctx);
Status topk(Tensor& dst, const OpContext& ctx);
Status gather(Tensor& dst, const OpContext& ctx);
Status weighted_sum(Tensor& dst, const OpContext& ctx);
Status mask_ids(Tensor& dst, const OpContext& ctx);
Status unary(Tensor& dst, const OpContext& ctx);  // SILU, SIGMOID
Status norm_scale(Tensor& dst, const OpContext& ctx);
Status glu(Tensor& dst, const OpContext& ctx);    // SWIGLU, SWIGLU_OAI
Status cpy(Tensor& dst, const OpContext& ctx);
// deepseek2 (ops_heads.cu): CONCAT, GROUP_MASK, and MUL_MAT_HEADS with the scratch it needs (its
// head ids, then the expert product's).
Status concat(Tensor& dst, const OpContext& ctx);
Status group_mask(Tensor& dst, const OpContext& ctx);
Status mul_mat_heads(Tensor& dst, const OpContext& ctx);
size_t mul_mat_heads_scratch_bytes(const Tensor& node, ExpertGemmDecode decode);
// Copies the device regions back to back into dst_dev (ops_copy.cu): a block per region, a launch per
// kMaxGatherRegions of them.
Status gather_regions(std::span<const DeviceRegion> regions, uint8_t* dst_dev, cudaStream_t stream);

// Device scratch an ATTENTION node needs on a device with n_sm multiprocessors (split-K partials).
size_t attention_scratch_bytes(const Tensor& node, int n_sm);
// Whether attention() runs this node (device pointers) on the tensor cores, the prompt kernel with
// F16 rounding of Q and P, rather than the FP32 kernel (tests choose their tolerance by it).
bool attention_uses_tensor_cores(const Tensor& node);

// Fused launches (fusion_plan.h); each REQUIRES the parts the planner matched, in span order.
// kGemvGroup: MUL_MATs of one activation on the GEMV path, each optionally followed by an ADD of a
// bias row (matmul.cu).
Status mul_mat_group(std::span<Tensor* const> parts, const OpContext& ctx);
// kDenseGroup: MUL_MATs of one activation on the dequantise + cuBLAS path (matmul.cu), and the scratch
// the launch needs (0 where the parts do not form a group: the launch reports why).
Status mul_mat_dense_group(std::span<Tensor* const> parts, const OpContext& ctx);
size_t mul_mat_dense_group_scratch(std::span<Tensor* const> parts);
// kRouterGemv: MUL_MAT (the router, one token) [ADD bias], TOPK, GATHER, SOFTMAX: the selection runs in the
// GEMV's last block where the product takes the float-weight row kernel, else as router_select (matmul.cu).
Status mul_mat_router(std::span<Tensor* const> parts, const OpContext& ctx);
// kMoeBias: MUL_MAT_ID (GEMV path), GET_ROWS of F32 bias rows by its ids, ADD (matmul.cu).
Status mul_mat_id_bias(std::span<Tensor* const> parts, const OpContext& ctx);
// kRowChain: [WEIGHTED_SUM] [ADD] RMS_NORM, one block per row (ops_fused.cu).
Status row_chain(std::span<Tensor* const> parts, const OpContext& ctx);
// kRouter: TOPK, GATHER, SOFTMAX (ops_fused.cu).
Status router_select(std::span<Tensor* const> parts, const OpContext& ctx);
// kSigmoidRouter: SIGMOID [ADD] [GROUP_MASK] TOPK GATHER NORM_SCALE (ops_sigmoid_router.cu).
Status sigmoid_router(std::span<Tensor* const> parts, const OpContext& ctx);
// kAttnPrep: [RMS_NORM x2] ROPE x1-2 [CPY x1-2] (ops_fused.cu).
Status attn_prep(std::span<Tensor* const> parts, const OpContext& ctx);

}  // namespace moe::cuda
