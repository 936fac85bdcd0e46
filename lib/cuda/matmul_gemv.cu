// Small-batch matrix products (at most kGemvMaxCols activation rows, or one routed pair per job):
// memory-bound, so the kernel's job is to stream each weight byte from HBM once, at full width.
//
// - One warp per weight row, 4 warps per block. The warp walks its row in chunks of 32 blocks (one
//   per lane): the chunk's bytes are fetched with aligned 16-byte loads into a per-warp shared buffer
//   (blocks of 17/18/34 bytes start at any address; the buffer keeps the source misalignment and
//   each lane decodes its block with funnel shifts). The next chunk's loads are issued before the
//   current one is computed, so every lane keeps ~3 16-byte loads in flight.
// - Quantised weights multiply activations quantised to Q8 (int8 per block of 32 with a float scale
//   amax / 127, q = nearest-even(x * 127 / amax): the CPU backend's rule, so both backends compute
//   the same integer dot products) with dp4a; Q4_0 and MXFP4 nibbles become int8 values first
//   (byte-wise subtract / table permute). Float weights multiply the F32 activations.
// - Expert ops run one job per (token, slot) pair (grid.y): the job reads its expert id on the device;
//   an id outside [0, E) raises kErrorBadIndex and makes that pair's outputs NaN, without reading.
//   MOE_UP_GATE reads the up and gate rows in the same warp and applies bias and activation at the end.
#include <cmath>
#include <string>

#include "cuda/cuda_common.cuh"
#include "cuda/matmul.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {
namespace {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;

struct GemvParams {
    const uint8_t* w[2];  // up (or the only weight), gate
    const uint8_t* lo[2];
    const uint8_t* hi[2];
    int64_t nb1, nb2;
    int64_t n_rows;
    int64_t k;
    int nblk;
    int64_t n_expert;
    const uint8_t* acts;
    int64_t act_stride;  // bytes between prepared rows
    int n_cols;
    float* dst;
    int64_t dst_stride;  // floats between output columns
    const int32_t* ids;  // nullptr: dense
    int64_t ids_stride;
    int n_used;
    int b_rows;
    unsigned int* error_flags;
    GluParams glu;
};

template <Type W, int MC, bool FUSED>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvParams p) {
    constexpr int kBB = block_bytes(W);
    constexpr int kChunk = 32 * kBB;               // one block per lane
    constexpr int kVecs = (kChunk + 30) / 16;      // 16-byte vectors covering a chunk at any alignment
    constexpr int kVpl = (kVecs + 31) / 32;        // per lane
    constexpr int kNM = FUSED ? 2 : 1;
    constexpr int kSlots = kVpl * 32 + 1;          // + a spare for extract_words
    __shared__ uint4 stage[kGemvWarps][kNM][kSlots];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
    if (row >= p.n_rows) return;  // no block-wide barrier below

    int64_t expert = 0, act_row = 0, out_col = 0;
    int n_cols = p.n_cols;
    if (p.ids != nullptr) {
        const int64_t pair = blockIdx.y;
        const int64_t t = pair / p.n_used;
        const int64_t j = pair - t * p.n_used;
        const int32_t e = p.ids[t * p.ids_stride + j];
        if (e < 0 || e >= p.n_expert) {
            if (lane == 0) {
                ops::flag_error(p.error_flags, kErrorBadIndex);
                p.dst[pair * p.dst_stride + row] = __int_as_float(0x7FC00000);
            }
            return;
        }
        expert = e;
        act_row = p.b_rows == 1 ? t : pair;
        out_col = pair;
        n_cols = 1;
    }

    const uint8_t* wrow[kNM];
#pragma unroll
    for (int m = 0; m < kNM; ++m) wrow[m] = p.w[m] + expert * p.nb2 + row * p.nb1;

    float acc[kNM][MC];
#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int c = 0; c < MC; ++c) acc[m][c] = 0.0f;
    }

    const int nchunks = (p.nblk + 31) / 32;
    uint4 buf[kNM][kVpl];
    auto load_chunk = [&](int c) {
        const int nb_c = min(32, p.nblk - 32 * c);
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
            const uint8_t* base = wrow[m] + static_cast<int64_t>(c) * kChunk;
            const uint8_t* end = base + nb_c * kBB;
            const uint8_t* a0 = align_down<16>(base);
#pragma unroll
            for (int v = 0; v < kVpl; ++v) {
                const uint8_t* q = a0 + 16 * (lane + 32 * v);
                buf[m][v] = q < end ? load16_guarded(q, p.lo[m], p.hi[m]) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };

    load_chunk(0);
    for (int c = 0; c < nchunks; ++c) {
        __syncwarp();  // every lane is done with the previous chunk
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int v = 0; v < kVpl; ++v) stage[warp][m][lane + 32 * v] = buf[m][v];
        }
        __syncwarp();
        if (c + 1 < nchunks) load_chunk(c + 1);  // in flight while this chunk is computed

        const int b = 32 * c + lane;
        if (b < p.nblk) {
#pragma unroll
            for (int m = 0; m < kNM; ++m) {
                const auto* s = reinterpret_cast<const uint32_t*>(stage[warp][m]);
                const int off =
                    static_cast<int>(reinterpret_cast<uintptr_t>(wrow[m] + static_cast<int64_t>(c) * kChunk) & 15) +
                    lane * kBB;
                if constexpr (is_quant(W)) {
                    const QBlock qb = load_qblock<W>(s, off);
#pragma unroll
                    for (int mc = 0; mc < MC; ++mc) {
                        if (mc < n_cols) {
                            const uint8_t* xr = p.acts + (act_row + mc) * p.act_stride;
                            const int4* xq = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(b));
                            const int4 x0 = __ldg(xq);
                            const int4 x1 = __ldg(xq + 1);
                            const float xd = __ldg(reinterpret_cast<const float*>(xr + p.k) + b);
                            acc[m][mc] += qb.scale * xd * static_cast<float>(qblock_dot(qb, x0, x1));
                        }
                    }
                } else {
                    float v0[16], v1[16];
                    decode_half<W>(s, off, 0, v0);
                    decode_half<W>(s, off, 1, v1);
#pragma unroll
                    for (int mc = 0; mc < MC; ++mc) {
                        if (mc < n_cols) {
                            const float4* xr = reinterpret_cast<const float4*>(p.acts + (act_row + mc) * p.act_stride) +
                                               8 * static_cast<int64_t>(b);
                            float sum = 0.0f;
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float4 x = __ldg(xr + i);
                                sum = fmaf(v0[4 * i], x.x, sum);
                                sum = fmaf(v0[4 * i + 1], x.y, sum);
                                sum = fmaf(v0[4 * i + 2], x.z, sum);
                                sum = fmaf(v0[4 * i + 3], x.w, sum);
                            }
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float4 x = __ldg(xr + 4 + i);
                                sum = fmaf(v1[4 * i], x.x, sum);
                                sum = fmaf(v1[4 * i + 1], x.y, sum);
                                sum = fmaf(v1[4 * i + 2], x.z, sum);
                                sum = fmaf(v1[4 * i + 3], x.w, sum);
                            }
                            acc[m][mc] += sum;
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) acc[m][mc] = ops::warp_sum(acc[m][mc]);
    }
    if (lane != 0) return;
    if constexpr (FUSED) {
        float u = acc[0][0];
        float g = acc[1][0];
        if (p.glu.bias_up != nullptr) u += p.glu.bias_up[expert * p.glu.bias_stride + row];
        if (p.glu.bias_gate != nullptr) g += p.glu.bias_gate[expert * p.glu.bias_stride + row];
        p.dst[out_col * p.dst_stride + row] = glu_apply(p.glu, g, u);
    } else {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            if (mc < n_cols) p.dst[(out_col + mc) * p.dst_stride + row] = acc[0][mc];
        }
    }
}

// One thread per (row, block): Q8 quantisation exactly as the CPU's quantize_q8a.
__global__ void quantize_q8_kernel(const RowsF32 x, int64_t rows, int nblk, int64_t k, uint8_t* dst, int64_t stride) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * nblk) return;
    const int64_t r = i / nblk;
    const int b = static_cast<int>(i - r * nblk);
    const float* src = row_f32(x, r) + 32 * b;
    float v[32];
    float amax = 0.0f;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        v[j] = src[j];
        finite = finite && isfinite(v[j]);
        amax = fmaxf(amax, fabsf(v[j]));
    }
    uint8_t* row = dst + r * stride;
    int4* qs = reinterpret_cast<int4*>(row + 32 * static_cast<int64_t>(b));
    float* d = reinterpret_cast<float*>(row + k) + b;
    if (!finite) {  // the CPU makes the block's scale NaN, so every dot that uses it is NaN
        qs[0] = make_int4(0, 0, 0, 0);
        qs[1] = make_int4(0, 0, 0, 0);
        *d = __int_as_float(0x7FC00000);
        return;
    }
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int w[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int q = __float2int_rn(v[4 * j + e] * id);
            word |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * e);
        }
        w[j] = static_cast<int>(word);
    }
    qs[0] = make_int4(w[0], w[1], w[2], w[3]);
    qs[1] = make_int4(w[4], w[5], w[6], w[7]);
    *d = amax / 127.0f;
}

// One thread per element: F32 rows copied into contiguous prepared rows.
__global__ void copy_f32_kernel(const RowsF32 x, int64_t rows, int64_t k, float* dst) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    const int64_t r = i / k;
    dst[i] = row_f32(x, r)[i - r * k];
}

template <Type W, int MC, bool FUSED>
Status launch_gemv(const GemvParams& p, int64_t n_jobs, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned int>((p.n_rows + kGemvWarps - 1) / kGemvWarps), static_cast<unsigned int>(n_jobs));
    gemv_kernel<W, MC, FUSED><<<grid, kGemvThreads, 0, stream>>>(p);
    return ops::launch_status("gemv_kernel");
}

}  // namespace

size_t gemv_act_row_bytes(Type w, int64_t k) {
    const size_t bytes = is_quant(w) ? static_cast<size_t>(k) + 4 * static_cast<size_t>(k / 32) : 4 * static_cast<size_t>(k);
    return (bytes + 15) & ~size_t{15};
}

Status gemv_prepare(const RowsF32& x, int64_t rows, int64_t k, Type w, void* dst, cudaStream_t stream) {
    if (rows == 0) return Status::ok();
    constexpr int kThreads = 256;
    if (is_quant(w)) {
        const int nblk = static_cast<int>(k / 32);
        const int64_t n = rows * nblk;
        quantize_q8_kernel<<<static_cast<unsigned int>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
            x, rows, nblk, k, static_cast<uint8_t*>(dst), static_cast<int64_t>(gemv_act_row_bytes(w, k)));
        return ops::launch_status("quantize_q8_kernel");
    }
    const int64_t n = rows * k;
    copy_f32_kernel<<<static_cast<unsigned int>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        x, rows, k, static_cast<float*>(dst));
    return ops::launch_status("copy_f32_kernel");
}

Status gemv(const WeightArg& w, const WeightArg* gate, const void* acts, int64_t n_cols, const GemvRoute* route,
            const GluParams* glu, float* dst, cudaStream_t stream) {
    if (w.n == 0) return Status::ok();
    GemvParams p{};
    p.w[0] = w.data;
    p.lo[0] = w.data;
    p.hi[0] = w.end;
    p.w[1] = gate != nullptr ? gate->data : w.data;
    p.lo[1] = gate != nullptr ? gate->data : w.data;
    p.hi[1] = gate != nullptr ? gate->end : w.end;
    p.nb1 = w.nb1;
    p.nb2 = w.nb2;
    p.n_rows = w.n;
    p.k = w.k;
    p.nblk = static_cast<int>(w.k / 32);
    p.n_expert = w.n_expert;
    p.acts = static_cast<const uint8_t*>(acts);
    p.act_stride = static_cast<int64_t>(gemv_act_row_bytes(w.type, w.k));
    p.n_cols = static_cast<int>(n_cols);
    p.dst = dst;
    p.dst_stride = w.n;
    int64_t n_jobs = 1;
    if (route != nullptr) {
        p.ids = route->ids;
        p.ids_stride = route->ids_stride;
        p.n_used = route->n_used;
        p.b_rows = route->b_rows;
        p.error_flags = route->error_flags;
        p.n_cols = 1;
        n_jobs = route->n_pairs;
        if (n_jobs == 0) return Status::ok();
    } else if (n_cols < 1 || n_cols > kGemvMaxCols) {
        return internal_error("cuda gemv: " + std::to_string(n_cols) + " columns (1 .. 8 expected)");
    }
    if (n_jobs > static_cast<int64_t>(ops::kMaxGridYZ)) {
        return internal_error("cuda gemv: " + std::to_string(n_jobs) + " routed pairs exceed the grid");
    }
    if (glu != nullptr) p.glu = *glu;
    const bool fused = gate != nullptr;
    return with_weight_type(w.type, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        if (fused) return launch_gemv<W, 1, true>(p, n_jobs, stream);
        if (p.n_cols == 1) return launch_gemv<W, 1, false>(p, n_jobs, stream);
        if (p.n_cols == 2) return launch_gemv<W, 2, false>(p, n_jobs, stream);
        if (p.n_cols <= 4) return launch_gemv<W, 4, false>(p, n_jobs, stream);
        return launch_gemv<W, 8, false>(p, n_jobs, stream);
    });
}

}  // namespace moe::cuda::mm
