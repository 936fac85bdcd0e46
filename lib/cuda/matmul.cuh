// Internal interface between the CUDA matrix-product files:
//   matmul.cu       argument checks and dispatch of MUL_MAT / MUL_MAT_ID / MOE_UP_GATE by batch size
//   matmul_gemv.cu  small batches: warp-per-row GEMV that reads the weights directly (Q types with
//                   activations quantised to Q8 and dp4a, float types with F32 activations)
//   matmul_gemm.cu  large batches: BF16 tensor-core kernel that dequantises weight tiles on the way
//                   into shared memory (dense or grouped by expert), and the cuBLAS paths
//   matmul_moe.cu   MUL_MAT_ID / MOE_UP_GATE: routing on the device (count, scan, permutation) and
//                   the per-expert products
// The weight types of core/quant_decode.h (Q4_1, Q5_0, Q5_1, IQ4_NL, the K-quants, IQ4_XS: "decoded
// types") take their own paths: a GEMV that dots whole groups of 32 as integers against Q8 activations
// (core/quant_decode_dot.h, host-tested); for larger batches, expert products run the tensor-core kernel
// decoding their weight tiles with core/quant_decode.h (ExpertGemmDecode::FUSED) or a dequantisation of
// the routed experts to BF16 rows followed by the kernel on those (SCRATCH), and dense products a
// dequantisation to BF16 rows and cuBLAS.
// Everything here is asynchronous on the given stream; nothing synchronises with the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "core/quant_decode.h"
#include "core/quant_decode_dot.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda_ops.cuh"
#include "cuda/matmul_device.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {

// Batches of at most this many activation rows (MUL_MAT) or tokens (MoE ops) take the GEMV path.
constexpr int64_t kGemvMaxCols = 8;

// Hands out 256-byte aligned pieces of one scratch allocation. With base == nullptr it only counts,
// so the same code computes matmul_scratch_bytes() and carves the real scratch.
class Carver {
public:
    explicit Carver(void* base) : base_(static_cast<uint8_t*>(base)) {}
    template <typename T>
    T* take(size_t count) {
        off_ = (off_ + 255) & ~size_t{255};
        T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + off_) : nullptr;
        off_ += count * sizeof(T);
        return p;
    }
    size_t used() const { return off_; }

private:
    uint8_t* base_;
    size_t off_ = 0;
};

// A weight tensor [K, N, E] as kernels read it: rows of K / 32 blocks (K / 256 super-blocks for the
// K-quants and IQ4_XS), nb1 bytes apart, experts nb2 bytes apart; [data, end) are the tensor's bytes, which no load leaves.
struct WeightArg {
    const uint8_t* data = nullptr;
    const uint8_t* end = nullptr;
    Type type = Type::F32;
    int64_t k = 0, n = 0, n_expert = 1;
    int64_t nb1 = 0, nb2 = 0;
    // A model weight (Tensor::is_weight): no kernel writes its bytes (uploads are copies, which end
    // before any kernel after them starts), so a kernel may read them before its PDL wait (launch.cuh).
    bool constant = false;
    // The GEMV kernel for a decoded type (OpContext::kquant_gemv, set by matmul.cu where it hands w to one).
    KquantGemv kquant_gemv = KquantGemv::V3;
    // The dense GEMV kernel for a float type (OpContext::float_gemv, set by matmul.cu for dense products).
    FloatGemv float_gemv = FloatGemv::V2;
};

WeightArg weight_arg(const Tensor& w);

// Calls f(std::integral_constant<Type, W>{}) for the weight type t: kernels are templates on the type.
template <typename F>
Status with_weight_type(Type t, F&& f) {
    switch (t) {
        case Type::F32: return f(std::integral_constant<Type, Type::F32>{});
        case Type::F16: return f(std::integral_constant<Type, Type::F16>{});
        case Type::BF16: return f(std::integral_constant<Type, Type::BF16>{});
        case Type::Q8_0: return f(std::integral_constant<Type, Type::Q8_0>{});
        case Type::Q4_0: return f(std::integral_constant<Type, Type::Q4_0>{});
        case Type::MXFP4: return f(std::integral_constant<Type, Type::MXFP4>{});
        default: break;
    }
    return unimplemented("cuda matmul: weight type id " + std::to_string(static_cast<int>(t)) + " has no kernel");
}
// with_weight_type for the decoded types (qd::decodes).
template <typename F>
Status with_decoded_type(Type t, F&& f) {
    switch (t) {
        case Type::Q4_1: return f(std::integral_constant<Type, Type::Q4_1>{});
        case Type::Q5_0: return f(std::integral_constant<Type, Type::Q5_0>{});
        case Type::Q5_1: return f(std::integral_constant<Type, Type::Q5_1>{});
        case Type::IQ4_NL: return f(std::integral_constant<Type, Type::IQ4_NL>{});
        case Type::Q2_K: return f(std::integral_constant<Type, Type::Q2_K>{});
        case Type::Q3_K: return f(std::integral_constant<Type, Type::Q3_K>{});
        case Type::Q4_K: return f(std::integral_constant<Type, Type::Q4_K>{});
        case Type::Q5_K: return f(std::integral_constant<Type, Type::Q5_K>{});
        case Type::Q6_K: return f(std::integral_constant<Type, Type::Q6_K>{});
        case Type::IQ4_XS: return f(std::integral_constant<Type, Type::IQ4_XS>{});
        default: break;
    }
    return internal_error("cuda matmul: weight type id " + std::to_string(static_cast<int>(t)) + " is not a decoded type");
}
RowsF32 rows_f32(const Tensor& x);

// ---- GEMV (matmul_gemv.cu) ----

// Weights whose GEMV multiplies activations quantised to Q8 (int8 blocks of 32 and a float scale,
// gemv_prepare) with dp4a: Q8_0, Q4_0, MXFP4 and the decoded types.
constexpr bool q8_acts(Type t) { return is_quant(t) || qd::decodes(t); }

// Bytes of one prepared activation row for weights of type w: Q8 rows (int8 qs[K], float d[K/32])
// for quantised weights, F32 rows otherwise; a multiple of 16.
size_t gemv_act_row_bytes(Type w, int64_t k);
// Prepares `rows` rows of x (K = k) for weights of type w into dst (rows * gemv_act_row_bytes).
Status gemv_prepare(const RowsF32& x, int64_t rows, int64_t k, Type w, void* dst, cudaStream_t stream);

// A bias row per expert added in a routed product's epilogue, as MUL_MAT_ID, GET_ROWS(rows, ids) and ADD
// would do it (fusion_plan.h kMoeBias): the picked rows go to `picked` and the sums to `sum`, both laid
// out like the product's dst. rows == nullptr: none.
struct ExpertBias {
    const float* rows = nullptr;  // row e at rows + e * stride
    int64_t stride = 0;           // floats between the experts' rows
    float* picked = nullptr;
    float* sum = nullptr;
};

// Expert routing of the GEMV: one job per (token, slot) pair p = j + n_used * t; its expert is
// ids[t * ids_stride + j], its activation row t (b_rows == 1) or p, its output column p.
struct GemvRoute {
    const int32_t* ids = nullptr;
    int64_t ids_stride = 0;
    int n_used = 1;
    int b_rows = 1;
    int64_t n_pairs = 0;
    unsigned int* error_flags = nullptr;  // kErrorBadIndex for an id outside [0, E); its column is NaN
    ExpertBias bias;  // optional, one weight without gate
    int n_sm = 0;     // multiprocessors of the device (grid sizing; 0: unknown)
};

// dst[c * w.n + r] = dot(row r of w, prepared activation row c) for c < n_cols (route == nullptr,
// n_cols <= kGemvMaxCols), or per routed pair. With gate != nullptr (MOE_UP_GATE), w is `up` and the
// output is glu(gate . x + bg, up . x + bu).
Status gemv(const WeightArg& w, const WeightArg* gate, const void* acts, int64_t n_cols, const GemvRoute* route,
            const GluParams* glu, float* dst, cudaStream_t stream);

// Float weights of up to this many rows per segment take the row kernel (a block per row).
constexpr int64_t kRowKernelMaxRows = 1024;

// Weights of one launch that multiply the same prepared activation rows (same type and k): each
// writes dst[c * w.n + r] and, with a bias, dst2[c * w.n + r] = dst[...] + bias[r]; dst may be nullptr
// with a bias (dense launches: the product itself is not written).
constexpr int kMaxGemvSegs = 3;
struct GemvOut {
    const WeightArg* w;
    float* dst;
    const float* bias;
    float* dst2;
};
// The router's selection (TOPK, GATHER, SOFTMAX of the logits x, one token) run by the last block of
// the router's GEMV; counter: a device word that is zero between launches.
struct RouterTail {
    ops::View x, ids, vals, probs;
    int k = 0;
    unsigned int* counter = nullptr;
};

// gemv() over up to kMaxGemvSegs weights in one launch (routed: exactly one). act_stride: bytes
// between activation rows; 0 = gemv_act_row_bytes (rows as gemv_prepare writes them). With `router`,
// the launch also runs the router's selection where it takes the float-weight row kernel with one
// activation row; *routed says whether it did (else the caller runs the selection).
Status gemv_multi(std::span<const GemvOut> outs, const WeightArg* gate, const void* acts, int64_t act_stride,
                  int64_t n_cols, const GemvRoute* route, const GluParams* glu, cudaStream_t stream,
                  const RouterTail* router = nullptr, bool* routed = nullptr);

// ---- tensor-core GEMM (matmul_gemm.cu) ----

// Converts `rows` rows of x to BF16 rows of k elements, contiguous, into dst.
Status prepare_bf16(const RowsF32& x, int64_t rows, int64_t k, void* dst, cudaStream_t stream);
// Weight rows [r0, r0 + rows) of w (expert 0) -> BF16 rows of w.k at dst (decode_half_bf16, or
// qd::decode32 for the decoded types, in the tensor-core kernel's form: qd::decode_fma).
Status dequant_bf16(const WeightArg& w, int64_t r0, int64_t rows, void* dst, cudaStream_t stream);
// Experts e_lo <= e < e_hi of w (a decoded type) that counts[e] > 0 names -> BF16 rows [e - e_lo][N][K] at
// dst; the rows of other experts are not written. counts == nullptr: every expert of the range.
Status dequant_experts_bf16(const WeightArg& w, int64_t e_lo, int64_t e_hi, const int32_t* counts, void* dst,
                            cudaStream_t stream);

// Expert grouping for the grouped kernel: the pairs of expert e are perm[seg_off[e] .. seg_off[e+1])
// and own column tiles tile_off[e] .. tile_off[e+1] of `bn` columns.
struct MmaRoute {
    const int32_t* tile_off = nullptr;
    const int32_t* seg_off = nullptr;
    const int32_t* perm = nullptr;
    int n_expert = 1;
    // Only the columns of experts [e_lo, e_hi) (e_hi 0: n_expert), whose weights start with expert e_lo at
    // the weight's data: a chunk of experts dequantised to BF16 (matmul_moe.cu).
    int e_lo = 0;
    int e_hi = 0;
    int n_used = 1;
    int b_rows = 1;
    int64_t max_tiles = 0;  // an upper bound of tile_off[e_hi] - tile_off[e_lo], known on the host
    int64_t x_rows = 0;     // rows of the activations (tokens, or pairs where b_rows > 1)
};

// Columns per tile of the tensor-core kernel (32, 64 or 128) for ~cols_per_group columns per expert.
int mma_tile_cols(double cols_per_group);
// The same for expert groups of ~cols_per_group columns on average: wide enough that most groups fit
// one tile (warps without columns skip their MMAs, but every tile decodes its weights).
int mma_route_tile_cols(double cols_per_group);

// dst[col * w.n + r] = dot(row r of w (or of its routed expert), BF16 activation row of col).
// Dense: route == nullptr, columns 0 .. n_cols - 1 read rows 0 .. n_cols - 1 of xb. Routed: columns
// are pairs (see MmaRoute). gate != nullptr: fused up/gate with glu as in gemv().
Status mma_gemm(const WeightArg& w, const WeightArg* gate, const void* xb, int64_t n_cols, const MmaRoute* route,
                int bn, const GluParams* glu, float* dst, cudaStream_t stream);

// MUL_MAT with more than kGemvMaxCols activation rows: cuBLAS (F32 and BF16 weights, and other
// weights dequantised to BF16 tiles from kCublasMinCols rows on) or the tensor-core kernel.
// Below kCublasMinCols activation rows, quantised / F16 weights go through mma_gemm (no dequantised
// copy); from there on the dequantisation pass is small next to the product and cuBLAS's kernels are
// faster.
constexpr int64_t kCublasMinCols = 256;
// Up to kMaxDenseGroup products of one activation (prefill q, k, v) in one call: one BF16 copy of the
// activations, then each product's dequantisation and GEMM; ws share a type and K, dsts[i] is ws[i]'s
// result. (One dequantisation launch for all three weights was slower than three: PERF.md, 2026-11-25.)
constexpr int kMaxDenseGroup = 3;
bool gemm_dense_dequantises(Type w, int64_t m);
size_t gemm_dense_scratch(std::span<const WeightArg> ws, const Tensor& x);
Status gemm_dense(std::span<const WeightArg> ws, const Tensor& x, std::span<float* const> dsts, const OpContext& ctx);

// ---- expert products (matmul_moe.cu) ----

struct MoeArgs {
    WeightArg w;                 // MUL_MAT_ID: the experts; MOE_UP_GATE: up
    bool fused = false;          // MOE_UP_GATE
    WeightArg gate;              // MOE_UP_GATE only
    GluParams glu{};             // MOE_UP_GATE only
    RowsF32 x{};                 // activation rows: b_rows per token
    int64_t b_rows = 1;
    const int32_t* ids = nullptr;
    int64_t ids_stride = 0;      // ints between tokens
    int64_t n_used = 1;
    int64_t n_tokens = 0;
    float* dst = nullptr;        // [n, n_used, n_tokens], contiguous
    ExpertBias bias;             // MUL_MAT_ID on the GEMV path only (GemvRoute)
    // Decoded weight types on the tensor-core path: decode in the GEMM or dequantise to scratch first.
    ExpertGemmDecode decode = ExpertGemmDecode::SCRATCH;
};

size_t moe_scratch(const MoeArgs& a);
// Whether `next` may take the expert route `built` left in the scratch block (the two run back to back
// with nothing between): both grouped on the tensor cores, the same ids, pairs and expert count.
bool moe_routes_match(const MoeArgs& built, const MoeArgs& next);
// Whether moe_run takes the GEMV path (small batches).
bool moe_takes_gemv(const MoeArgs& a);
Status moe_run(const MoeArgs& a, const OpContext& ctx);

}  // namespace moe::cuda::mm
