// Large-batch matrix products on the tensor cores (BF16 inputs, F32 accumulation and output).
//
// mma_gemm: our own kernel (matmul_mma.cuh), used for every expert product and for dense products of
// quantised / F16 weights at moderate batch sizes; the decoded types' instances are in
// matmul_gemm_decoded.cu. Their expert products may instead dequantise the routed experts to BF16 rows in
// scratch first (OpContext::expert_decode, matmul_moe.cu), with dequant_experts_bf16 below.
//
// gemm_dense: cuBLAS for F32 weights (FP32 GEMM: routers and other small F32 matrices keep full
// precision), BF16 weights (read in place), and other weights at large batches (dequantised to BF16
// in tiles of <= 64 MiB of scratch, where cuBLAS's Hopper kernels outrun the mma.sync kernel).
#include <algorithm>
#include <span>
#include <string>
#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/matmul.cuh"
#include "cuda/matmul_mma.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {
namespace {

// F32 rows -> packed BF16 rows: a thread converts kPer values of a row in each of its rows (blockIdx.y,
// then gridDim.y apart). VEC4: rows and K 16-byte aligned, one float4 load per thread and row. (The
// kernel of one value pair per thread with 64-bit index divisions took 7 us per 512 x 2048 rows on the
// H100: PERF.md, 2026-11-25.)
template <bool VEC4>
__global__ void to_bf16_kernel(const RowsF32 x, int64_t rows, int64_t k, uint32_t* dst) {
    pdl_grid_sync();
    constexpr int kPer = VEC4 ? 4 : 2;
    const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPer;
    if (j >= k) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float* s = row_f32(x, r) + j;
        uint32_t* d = dst + (r * k + j) / 2;
        if constexpr (VEC4) {
            const float4 v = *reinterpret_cast<const float4*>(s);
            *reinterpret_cast<uint2*>(d) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
        } else {
            d[0] = pack_bf16x2(s[0], s[1]);
        }
    }
}

// One warp per (weight row, chunk of 32 blocks): weight rows -> contiguous BF16 rows of K.
template <Type W>
__global__ void __launch_bounds__(128) dequant_bf16_kernel(const uint8_t* w, const uint8_t* lo, const uint8_t* hi,
                                                           int64_t nb1, int64_t n_rows, int nblk, __nv_bfloat16* dst) {
    pdl_grid_sync();
    constexpr int kBB = block_bytes(W);
    constexpr int kChunk = 32 * kBB;
    constexpr int kVecs = (kChunk + 30) / 16;
    constexpr int kVpl = (kVecs + 31) / 32;
    __shared__ uint4 stage[4][kVpl * 32 + 1];
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + warp;
    if (row >= n_rows) return;
    const int c = static_cast<int>(blockIdx.y);
    const int nb_c = min(32, nblk - 32 * c);
    const uint8_t* base = w + row * nb1 + static_cast<int64_t>(c) * kChunk;
    const uint8_t* end = base + nb_c * kBB;
    const uint8_t* a0 = align_down<16>(base);
#pragma unroll
    for (int v = 0; v < kVpl; ++v) {
        const uint8_t* q = a0 + 16 * (lane + 32 * v);
        stage[warp][lane + 32 * v] = q < end ? load16_guarded(q, lo, hi) : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
    // A lane per quarter block (8 values, 16 bytes) and 8 blocks per pass, so each store instruction
    // of the warp writes 512 contiguous bytes (a lane per block wrote 16 of every 64: partial sectors).
    // Both lanes of a half decode it and keep their quarter: the decode is cheap next to the stores.
    const int off0 = static_cast<int>(reinterpret_cast<uintptr_t>(base) & 15);
    const auto* s = reinterpret_cast<const uint32_t*>(stage[warp]);
    __nv_bfloat16* out = dst + row * (static_cast<int64_t>(nblk) * 32) + 32 * static_cast<int64_t>(c) * 32;
    const int quarter = lane % 4;
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
        const int b = 8 * pass + lane / 4;
        if (b < nb_c) {
            uint32_t v[8];
            decode_half_bf16<W>(s, off0 + b * kBB, quarter / 2, v);
            const uint4 q = quarter % 2 == 0 ? make_uint4(v[0], v[1], v[2], v[3]) : make_uint4(v[4], v[5], v[6], v[7]);
            *reinterpret_cast<uint4*>(out + b * 32 + quarter * 8) = q;
        }
    }
}

// Decoded types (qd::decodes): a thread per group of 32 of rows [0, rows) of one or more experts of n_rows
// rows each, decoded by qd::decode32 and stored as 32 BF16 values (64 contiguous bytes; a warp's stores
// cover 2 KiB). Rows of experts whose counts entry is 0 are skipped (counts == nullptr: none are). The form
// is the tensor-core kernel's (qd::decode_fma), so that its fused decode and this path agree bit for bit.
template <Type W>
__global__ void dequant_decode_bf16_kernel(const uint8_t* w, int64_t nb1, int64_t nb2, int64_t n_rows, int64_t rows,
                                           int nblk, const int32_t* counts, __nv_bfloat16* dst) {
    pdl_grid_sync();
    constexpr int kGroups = qd::block_elems(W) / 32;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * nblk) return;
    const int64_t r = i / nblk;
    const int g = static_cast<int>(i - r * nblk);
    const int64_t e = r / n_rows;
    if (counts != nullptr && counts[e] == 0) return;
    float v[32];
    const uint8_t* blk = w + e * nb2 + (r - e * n_rows) * nb1 + static_cast<int64_t>(g / kGroups) * qd::block_bytes(W);
    qd::decode32<W, qd::decode_fma(W)>(blk, g % kGroups, v);
    uint32_t packed[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) packed[j] = pack_bf16x2(v[2 * j], v[2 * j + 1]);
    auto* out = reinterpret_cast<uint4*>(dst + r * (static_cast<int64_t>(nblk) * 32) + 32 * static_cast<int64_t>(g));
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = make_uint4(packed[4 * j], packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
}

// dequant_decode_bf16_kernel over `rows` rows from w (n_rows rows per expert).
Status launch_dequant_decode(const WeightArg& w, const uint8_t* src, int64_t n_rows, int64_t rows, const int32_t* counts,
                             void* dst, cudaStream_t stream) {
    constexpr int kThreads = 256;
    const int nblk = static_cast<int>(w.k / 32);
    const int64_t n = rows * nblk;
    if (n == 0) return Status::ok();
    if ((n + kThreads - 1) / kThreads > int64_t{0x7FFFFFFF}) return unimplemented("cuda dequant_bf16: too many rows");
    return with_decoded_type(w.type, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        return launch_kernel("dequant_decode_bf16_kernel", dequant_decode_bf16_kernel<W>,
                             static_cast<unsigned int>((n + kThreads - 1) / kThreads), kThreads, 0, stream, src, w.nb1,
                             w.nb2, n_rows, rows, nblk, counts, static_cast<__nv_bfloat16*>(dst));
    });
}

constexpr size_t kDequantTileBytes = size_t{64} << 20;

// x as a column-major K x M F32 matrix without a copy: fully contiguous.
bool rows_contiguous(const Tensor& x) {
    size_t expect = static_cast<size_t>(x.ne[0]) * 4;
    for (int d = 1; d < 4; ++d) {
        if (x.ne[d] > 1 && x.nb[d] != expect) return false;
        expect *= static_cast<size_t>(x.ne[d]);
    }
    return true;
}

struct DenseLayout {
    void* xb = nullptr;      // BF16 activations [M][K]
    float* xf = nullptr;     // compacted F32 activations (F32 weights with non-uniform rows)
    void* wtile = nullptr;   // BF16 weight tile [tile_rows][K], for one product at a time
    int64_t tile_rows = 0;
};

// ws: one or more products of x, of one weight type and K (gemm_dense).
DenseLayout dense_layout(std::span<const WeightArg> ws, const Tensor& x, Carver& c) {
    DenseLayout l;
    const WeightArg& w = ws[0];
    const int64_t m = x.n_rows();
    if (w.type == Type::F32) {
        if (!rows_contiguous(x)) l.xf = c.take<float>(static_cast<size_t>(m * w.k));
        return l;
    }
    l.xb = c.take<uint16_t>(static_cast<size_t>(m * w.k));
    if (gemm_dense_dequantises(w.type, m)) {
        int64_t most = 0;
        for (const WeightArg& u : ws) most = std::max(most, u.n);
        l.tile_rows = std::min<int64_t>(most, std::max<int64_t>(128, static_cast<int64_t>(kDequantTileBytes / (w.k * 2))));
        l.wtile = c.take<uint16_t>(static_cast<size_t>(l.tile_rows * w.k));
    }
    return l;
}

}  // namespace

Status dequant_bf16(const WeightArg& w, int64_t r0, int64_t rows, void* dst, cudaStream_t stream) {
    if (qd::decodes(w.type)) return launch_dequant_decode(w, w.data + r0 * w.nb1, rows, rows, nullptr, dst, stream);
    const int nblk = static_cast<int>(w.k / 32);
    return with_weight_type(w.type, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        const dim3 grid(static_cast<unsigned int>((rows + 3) / 4), static_cast<unsigned int>((nblk + 31) / 32));
        return launch_kernel("dequant_bf16_kernel", dequant_bf16_kernel<W>, grid, 128, 0, stream, w.data + r0 * w.nb1,
                             w.data, w.end, w.nb1, rows, nblk, static_cast<__nv_bfloat16*>(dst));
    });
}

Status dequant_experts_bf16(const WeightArg& w, int64_t e_lo, int64_t e_hi, const int32_t* counts, void* dst,
                            cudaStream_t stream) {
    if (!qd::decodes(w.type)) return internal_error("cuda dequant_experts_bf16: not a decoded weight type");
    if (e_lo < 0 || e_hi > w.n_expert || e_lo >= e_hi) {
        return internal_error("cuda dequant_experts_bf16: experts [" + std::to_string(e_lo) + ", " + std::to_string(e_hi) +
                              ") of " + std::to_string(w.n_expert));
    }
    return launch_dequant_decode(w, w.data + e_lo * w.nb2, w.n, w.n * (e_hi - e_lo),
                                 counts != nullptr ? counts + e_lo : nullptr, dst, stream);
}

// The decoded types have no tensor-core decode: every batch past the GEMV's dequantises.
bool gemm_dense_dequantises(Type w, int64_t m) {
    return w != Type::F32 && w != Type::BF16 && (m >= kCublasMinCols || (qd::decodes(w) && m > kGemvMaxCols));
}

int mma_tile_cols(double cols_per_group) {
    if (cols_per_group >= 96.0) return 128;
    if (cols_per_group >= 40.0) return 64;
    return 32;
}

// Group sizes spread around their mean (roughly Poisson for random routing): tiles of 1.5x the mean
// fit most groups, where tiles of the mean split about half of them into a full and a nearly empty
// tile, each decoding the expert's weights (H100, T=512: Q30 Q8_0 up+gate 41 -> 51 TFLOP/s).
int mma_route_tile_cols(double cols_per_group) { return mma_tile_cols(1.5 * cols_per_group); }

Status prepare_bf16(const RowsF32& x, int64_t rows, int64_t k, void* dst, cudaStream_t stream) {
    if (rows == 0 || k == 0) return Status::ok();
    constexpr int kThreads = 256;
    const bool vec4 = (reinterpret_cast<uintptr_t>(x.data) | static_cast<uintptr_t>(x.nb1) |
                       static_cast<uintptr_t>(x.nb2) | static_cast<uintptr_t>(x.nb3) | static_cast<uintptr_t>(k * 4)) %
                          16 ==
                      0;
    const int64_t per_thread = vec4 ? 4 : 2;
    const dim3 grid(static_cast<unsigned int>((k / per_thread + kThreads - 1) / kThreads),
                    static_cast<unsigned int>(std::min<int64_t>(rows, ops::kMaxGridYZ)));
    return launch_kernel("to_bf16_kernel", vec4 ? to_bf16_kernel<true> : to_bf16_kernel<false>, grid, kThreads, 0,
                         stream, x, rows, k, static_cast<uint32_t*>(dst));
}

Status mma_gemm(const WeightArg& w, const WeightArg* gate, const void* xb, int64_t n_cols, const MmaRoute* route,
                int bn, const GluParams* glu, float* dst, cudaStream_t stream) {
    if (w.n == 0) return Status::ok();
    MmaParams p{};
    p.w0 = w.data;
    p.lo0 = w.data;
    p.hi0 = w.end;
    p.w1 = gate != nullptr ? gate->data : w.data;
    p.lo1 = gate != nullptr ? gate->data : w.data;
    p.hi1 = gate != nullptr ? gate->end : w.end;
    p.nb1 = w.nb1;
    p.nb2 = w.nb2;
    p.n_rows = w.n;
    p.nblk = static_cast<int>(w.k / 32);
    p.x = static_cast<const __nv_bfloat16*>(xb);
    p.x_stride = w.k;
    p.n_cols = n_cols;
    p.dst = dst;
    p.dst_stride = w.n;
    if (glu != nullptr) p.glu = *glu;
    int64_t n_col_tiles = (n_cols + bn - 1) / bn;
    if (route != nullptr) {
        p.tile_off = route->tile_off;
        p.seg_off = route->seg_off;
        p.perm = route->perm;
        p.n_expert = route->n_expert;
        p.e_lo = route->e_lo;
        p.e_hi = route->e_hi > 0 ? route->e_hi : route->n_expert;
        p.n_used = route->n_used;
        p.b_rows = route->b_rows;
        n_col_tiles = route->max_tiles;
    }
    if (n_col_tiles == 0) return Status::ok();
    // The kernel's 32-bit element offsets into the activations (b_off).
    const int64_t x_rows = route != nullptr ? route->x_rows : n_cols;
    if (x_rows * w.k > int64_t{0x7FFFFFFF}) {
        return unimplemented("cuda mma_gemm: " + std::to_string(x_rows) + " activation rows of " + std::to_string(w.k) +
                             " elements are too many for the tensor-core kernel; use smaller ubatches");
    }
    const bool fused = gate != nullptr;
    if (qd::decodes(w.type)) return launch_mma_decoded(w.type, p, fused, bn, n_col_tiles, stream);
    return with_weight_type(w.type, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        if constexpr (has_a16<W>()) {
            if (rows_aligned16(p)) {
                return fused ? launch_mma_bn<W, true, true>(p, bn, n_col_tiles, stream)
                             : launch_mma_bn<W, false, true>(p, bn, n_col_tiles, stream);
            }
        }
        return fused ? launch_mma_bn<W, true, false>(p, bn, n_col_tiles, stream)
                     : launch_mma_bn<W, false, false>(p, bn, n_col_tiles, stream);
    });
}

size_t gemm_dense_scratch(std::span<const WeightArg> ws, const Tensor& x) {
    Carver c(nullptr);
    (void)dense_layout(ws, x, c);
    return c.used();
}

Status gemm_dense(std::span<const WeightArg> ws, const Tensor& x, std::span<float* const> dsts, const OpContext& ctx) {
    const int64_t m = x.n_rows();
    if (ws.empty() || ws.size() > static_cast<size_t>(kMaxDenseGroup) || dsts.size() != ws.size() ||
        (ws.size() > 1 && !gemm_dense_dequantises(ws[0].type, m))) {
        return internal_error("cuda MUL_MAT: a group of " + std::to_string(ws.size()) + " products it cannot take");
    }
    const WeightArg& w = ws[0];
    const int64_t k = w.k;
    for (const WeightArg& u : ws) {
        if (u.type != w.type || u.k != k) return internal_error("cuda MUL_MAT: grouped products differ in type or K");
    }
    Carver c(ctx.scratch);
    const DenseLayout l = dense_layout(ws, x, c);
    if (c.used() > ctx.scratch_size) {
        return internal_error("cuda MUL_MAT: scratch of " + std::to_string(ctx.scratch_size) + " bytes, " +
                              std::to_string(c.used()) + " needed");
    }
    const RowsF32 xr = rows_f32(x);
    const bool uses_cublas = w.type == Type::F32 || w.type == Type::BF16 || l.wtile != nullptr;
    if (uses_cublas) {
        if (ctx.cublas == nullptr) return invalid_argument("cuda MUL_MAT: OpContext.cublas is null");
        // cublasSetStream also drops the handle's workspace (the backend gives it a fixed one, so that
        // a captured GEMM does not allocate): rebind only a handle bound elsewhere.
        cudaStream_t bound = nullptr;
        MOE_CUBLAS_RETURN_IF_ERROR(cublasGetStream(ctx.cublas, &bound));
        if (bound != ctx.stream) MOE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(ctx.cublas, ctx.stream));
    }
    const float one = 1.0f;
    const float zero = 0.0f;
    // rows output rows (weight rows) of a product whose outputs are ldc apart per activation row.
    auto gemm = [&](const void* a, cudaDataType at, int64_t lda, const void* b, cudaDataType bt, int64_t ldb,
                    int64_t rows, float* out, int64_t ldc) -> Status {
        MOE_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                                static_cast<int>(m), static_cast<int>(k), &one, a, at,
                                                static_cast<int>(lda), b, bt, static_cast<int>(ldb), &zero, out,
                                                CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return Status::ok();
    };

    if (w.type == Type::F32) {
        const float* xf = static_cast<const float*>(x.data);
        if (l.xf != nullptr) {
            MOE_RETURN_IF_ERROR(gemv_prepare(xr, m, k, Type::F32, l.xf, ctx.stream));  // a compacting copy
            xf = l.xf;
        }
        return gemm(w.data, CUDA_R_32F, w.nb1 / 4, xf, CUDA_R_32F, k, w.n, dsts[0], w.n);
    }
    // One BF16 copy of the activations for every product of the group.
    MOE_RETURN_IF_ERROR(prepare_bf16(xr, m, k, l.xb, ctx.stream));
    if (w.type == Type::BF16) return gemm(w.data, CUDA_R_16BF, w.nb1 / 2, l.xb, CUDA_R_16BF, k, w.n, dsts[0], w.n);
    if (l.wtile == nullptr) {
        return mma_gemm(w, nullptr, l.xb, m, nullptr, mma_tile_cols(static_cast<double>(m)), nullptr, dsts[0], ctx.stream);
    }
    for (size_t u = 0; u < ws.size(); ++u) {
        for (int64_t r0 = 0; r0 < ws[u].n; r0 += l.tile_rows) {
            const int64_t rows = std::min(l.tile_rows, ws[u].n - r0);
            MOE_RETURN_IF_ERROR(dequant_bf16(ws[u], r0, rows, l.wtile, ctx.stream));
            MOE_RETURN_IF_ERROR(gemm(l.wtile, CUDA_R_16BF, k, l.xb, CUDA_R_16BF, k, rows, dsts[u] + r0, ws[u].n));
        }
    }
    return Status::ok();
}

}  // namespace moe::cuda::mm
