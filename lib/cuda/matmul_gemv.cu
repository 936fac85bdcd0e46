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
//   (byte-wise subtract / table permute); the decoded types (Q4_1 .. IQ4_XS) take the same Q8 rows as
//   integer groups of 32 (core/quant_decode_dot.h): in gemv_decode_v2_kernel, staged as above (chunks of
//   32 groups, a group per lane), or in the first gemv_decode_kernel, which reads each lane's group
//   straight from global memory (backend option kquant_gemv=v1; the same bits). Float weights multiply
//   the F32 activations.
// - Several weights that multiply the same activation (q, k, v) run as segments of one launch: grid x
//   walks the row blocks of each weight in turn; each segment has its own output and optionally a
//   bias row added in the epilogue (written to a second output, as MUL_MAT + ADD would).
// - Expert ops run one job per (token, slot) pair (grid.y): the job reads its expert id on the device;
//   an id outside [0, E) raises kErrorBadIndex and makes that pair's outputs NaN, without reading;
//   kNoExpert (-1) leaves them unwritten.
//   MOE_UP_GATE reads the up and gate rows in the same warp and applies bias and activation at the end
//   (with quantised weights, two rows per warp where that brings a grid of more than a wave into one);
//   MUL_MAT_ID may add its expert's bias row at the end (MUL_MAT_ID + GET_ROWS + ADD in one launch).
//   Routed 4-bit rows of at most 32 blocks take gemv_short_kernel: 4 rows per warp, 8 lanes per row;
//   with kquant_gemv=v3 (the default), routed rows of the decoded types of at most 32 groups take its
//   counterpart, gemv_decode_short_kernel (the same bits as v2).
// - Dense products of model weights with grids of at most kEarlyMaxBlocks blocks load their first chunk
//   of weights before the PDL wait (EARLY), so those loads overlap the small kernel before them (launch.cuh).
// - Dense products of float weights (F16, BF16, F32) take gemv_float_kernel (backend option float_gemv=v2):
//   float rows need no staging, so each lane reads 4 consecutive weights of each of the block's 4 rows and
//   the matching float4 of activations, all coalesced; gemv_kernel above remains their v1, and the kernel
//   of routed float products. Float weights of at most kRowKernelMaxRows rows per segment take
//   gemv_rows_kernel (a block per row) either way.
#include <cmath>
#include <string>
#include <type_traits>

#include "cuda/cuda_common.cuh"
#include "cuda/fusion_plan.h"
#include "cuda/launch.cuh"
#include "cuda/matmul.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/router_select.cuh"

namespace moe::cuda::mm {
namespace {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
// Dense launches of at most this many blocks load their first weight bytes before the PDL wait: most of
// such a grid is resident from its start (an H100's 132 multiprocessors hold 10 to 12 blocks of the early
// GEMVs each: q/k/v's 1,280 blocks, o's 512), while the output product's 38k blocks are not.
constexpr int64_t kEarlyMaxBlocks = 2048;

// One weight of a launch and where its products go (dense: up to kMaxGemvSegs of them).
struct GemvSeg {
    const uint8_t* w;
    const uint8_t* lo;
    const uint8_t* hi;
    int64_t nb1;
    int64_t n_rows;
    int64_t blk0;        // first grid.x block of this segment
    float* dst;          // [n_rows, n_cols] (or per routed pair)
    const float* bias;   // nullptr, or [n_rows]: dst2 = dst + bias
    float* dst2;
};

struct GemvParams {
    GemvSeg seg[kMaxGemvSegs];
    int n_seg;
    const uint8_t* gate;  // MOE_UP_GATE: the gate weight (same strides as seg[0].w)
    const uint8_t* gate_lo;
    const uint8_t* gate_hi;
    int64_t nb2;
    int64_t k;
    int nblk;
    int64_t n_expert;
    const uint8_t* acts;
    int64_t act_stride;  // bytes between prepared rows
    int n_cols;
    const int32_t* ids;  // nullptr: dense
    int64_t ids_stride;
    int n_used;
    int b_rows;
    unsigned int* error_flags;
    GluParams glu;
    ExpertBias ebias;    // routed, no gate: per-expert bias rows (GemvRoute::bias)
    RouterTail rt;       // gemv_rows_kernel with RK >= 0: the router's selection in the last block
    // Dense products of model weights only (WeightArg::constant): the first weight bytes are loaded
    // before the PDL wait, overlapping the kernel before (launch.cuh). Routed products read their
    // expert id, which an earlier kernel wrote, before any weight byte, so they wait first.
    bool early_weights;
};

// What a routed job (pair = j + n_used * t, expert ids[t, j]) whose id e is kNoExpert or outside [0, E)
// leaves in output o (one thread per output row): nothing (kNoExpert; with expert bias rows, the zeros
// GET_ROWS picks and the ADD of them), or NaN and the error flag. Not inlined: a cold path, which would
// cost the GEMVs' hot loops registers.
__device__ __noinline__ void write_missing_expert(int32_t e, float* dst, const ExpertBias eb, unsigned int* error_flags,
                                                  int64_t o) {
    if (e == kNoExpert) {  // a pair of another part of a split expert block: not written
        if (eb.rows != nullptr) {
            eb.picked[o] = 0.0f;        // GET_ROWS writes zeros there,
            eb.sum[o] = dst[o] + 0.0f;  // and the ADD adds them to the unwritten product
        }
        return;
    }
    ops::flag_error(error_flags, kErrorBadIndex);
    const float nan = __int_as_float(0x7FC00000);
    dst[o] = nan;
    if (eb.rows != nullptr) {
        eb.picked[o] = nan;
        eb.sum[o] = __int_as_float(0x7FFFFFFF);  // the canonical NaN the GPU's NaN + NaN gives
    }
}

// A routed job's single-column result acc for row `row` of pair `pair`: the product and, with expert
// bias rows, the picked row and the sum (MUL_MAT_ID, GET_ROWS and ADD results).
__device__ __forceinline__ void store_routed(const GemvParams& p, const GemvSeg& seg, int64_t expert, int64_t pair,
                                             int64_t row, float acc) {
    const int64_t o = pair * seg.n_rows + row;
    seg.dst[o] = acc;
    if (p.ebias.rows != nullptr) {
        const float b = p.ebias.rows[expert * p.ebias.stride + row];
        p.ebias.picked[o] = b;
        p.ebias.sum[o] = acc + b;  // the ADD node's one rounding
    }
}

// The outputs of row `row` of a warp from its warp-summed products acc (called by lane 0): the expert
// product(s) with bias and activation (FUSED: acc[0] up, acc[1] gate), a routed product with its expert's
// bias row, or the dense products (n_cols columns from out_col) and their bias adds.
template <bool FUSED, int MC>
__device__ __forceinline__ void write_row(const GemvParams& p, const GemvSeg& seg, int64_t expert, int64_t out_col,
                                          int n_cols, int64_t row, const float (&acc)[FUSED ? 2 : 1][MC]) {
    const int64_t dst_stride = seg.n_rows;  // floats between output columns
    if constexpr (FUSED) {
        float u = acc[0][0];
        float g = acc[1][0];
        if (p.glu.bias_up != nullptr) u += p.glu.bias_up[expert * p.glu.bias_stride + row];
        if (p.glu.bias_gate != nullptr) g += p.glu.bias_gate[expert * p.glu.bias_stride + row];
        seg.dst[out_col * dst_stride + row] = glu_apply(p.glu, g, u);
    } else if (p.ebias.rows != nullptr) {  // routed (one column)
        store_routed(p, seg, expert, out_col, row, acc[0][0]);
    } else {
        const float b = seg.bias != nullptr ? seg.bias[row] : 0.0f;
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            if (mc < n_cols) {
                const int64_t o = (out_col + mc) * dst_stride + row;
                if (seg.dst != nullptr) seg.dst[o] = acc[0][mc];  // nullptr: a product only its bias add reads
                if (seg.bias != nullptr) seg.dst2[o] = acc[0][mc] + b;  // the ADD node's one rounding
            }
        }
    }
}

// An activation load. After an early start (EARLY: weight loads before the PDL wait) it is a coherent
// load (ld.global.ca): ptxas treats ld.global.nc data as fixed for the kernel's lifetime and moved such
// loads above the wait (SASS of the router's row kernel), where they read the rows the previous kernel
// was still writing (the PDL on / off logits differed). Kernels that wait first keep the read-only path.
template <bool EARLY, typename T>
__device__ __forceinline__ T load_act(const T* p) {
    if constexpr (EARLY) {
        return __ldca(p);
    } else {
        return __ldg(p);
    }
}

// This block's segment of a launch, selected with constant indices (no dynamically indexed parameters).
__device__ __forceinline__ GemvSeg block_segment(const GemvParams& p) {
    GemvSeg seg = p.seg[0];
#pragma unroll
    for (int i = 1; i < kMaxGemvSegs; ++i) {
        if (i < p.n_seg && static_cast<int64_t>(blockIdx.x) >= p.seg[i].blk0) seg = p.seg[i];
    }
    return seg;
}

// EARLY (dense products of model weights, GemvParams::early_weights): the first chunk's weight loads are
// issued before the PDL wait. A template parameter: a run-time choice of where to wait costs the
// kernel 8-10 registers.
// RPW = 2 (MOE_UP_GATE with quantised weights): a warp computes 2 consecutive rows of its pair, one
// after the other, the second row's first chunk in flight while the last chunk of the first is computed:
// the 1,536 blocks of a Qwen3 decode layer's up/gate product took 1.45 waves at 8 blocks per SM; two rows
// per warp run one wave of longer-lived warps (H100 ncu: 16.0 -> 15.2 us per Q8_0 layer, 11.8 -> 11.3
// Q4_0). Each row's sum is computed as with one row per warp: the same bits.
template <Type W, int MC, bool FUSED, bool EARLY, int RPW>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvParams p) {
    if constexpr (!EARLY) pdl_grid_sync();
    static_assert(!(EARLY && FUSED), "routed products read their expert id first");
    static_assert(RPW == 1 || (FUSED && MC == 1 && is_quant(W)), "several rows per warp: quantised MOE_UP_GATE");
    static_assert(RPW == 1 || RPW == 2, "rows per warp: 1 or 2");
    constexpr int kBB = block_bytes(W);
    constexpr int kChunk = 32 * kBB;               // one block per lane
    constexpr int kVecs = (kChunk + 30) / 16;      // 16-byte vectors covering a chunk at any alignment
    constexpr int kVpl = (kVecs + 31) / 32;        // per lane
    constexpr int kNM = FUSED ? 2 : 1;
    constexpr bool kActFirst = FUSED && is_quant(W);  // MOE_UP_GATE: activations requested before weights
    constexpr int kSlots = kVpl * 32 + 1;          // + a spare for qd::words_at
    __shared__ uint4 stage[kGemvWarps][kNM][kSlots];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const GemvSeg seg = block_segment(p);
    const int64_t row0 = ((static_cast<int64_t>(blockIdx.x) - seg.blk0) * kGemvWarps + warp) * RPW;
    if (row0 >= seg.n_rows) {  // no block-wide barrier below
        if constexpr (EARLY) pdl_grid_sync();
        return;
    }
    const int warp_rows = RPW == 1 ? 1 : static_cast<int>(min(static_cast<int64_t>(RPW), seg.n_rows - row0));
    const int64_t dst_stride = seg.n_rows;  // floats between output columns

    int64_t expert = 0, act_row = 0, out_col = 0;
    int n_cols = p.n_cols;
    if (!EARLY && p.ids != nullptr) {  // EARLY launches are dense
        const int64_t pair = blockIdx.y;
        const int64_t t = pair / p.n_used;
        const int64_t j = pair - t * p.n_used;
        const int32_t e = p.ids[t * p.ids_stride + j];
        if (e < 0 || e >= p.n_expert) {
            const int64_t o = pair * dst_stride + row0 + lane;  // lane r writes the warp's row r
            if (lane < warp_rows) write_missing_expert(e, seg.dst, p.ebias, p.error_flags, o);
            return;
        }
        expert = e;
        act_row = p.b_rows == 1 ? t : pair;
        out_col = pair;
        n_cols = 1;
    }

    const uint8_t* wbase[2] = {seg.w, p.gate};
    const uint8_t* wlo[2] = {seg.lo, p.gate_lo};
    const uint8_t* whi[2] = {seg.hi, p.gate_hi};
    const uint8_t* wrow0[kNM];  // the warp's first row
#pragma unroll
    for (int m = 0; m < kNM; ++m) wrow0[m] = wbase[m] + expert * p.nb2 + row0 * seg.nb1;

    float acc[kNM][MC];
#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int c = 0; c < MC; ++c) acc[m][c] = 0.0f;
    }

    const int nchunks = (p.nblk + 31) / 32;
    uint4 buf[kNM][kVpl];
    // Chunk c of the warp's row r (r = 0 with RPW = 1).
    auto chunk_at = [&](int m, int r, int c) {
        return wrow0[m] + (RPW == 1 ? 0 : r * seg.nb1) + static_cast<int64_t>(c) * kChunk;
    };
    auto load_chunk = [&](int r, int c) {
        const int nb_c = min(32, p.nblk - 32 * c);
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
            const uint8_t* base = chunk_at(m, r, c);
            const uint8_t* end = base + nb_c * kBB;
            const uint8_t* a0 = align_down<16>(base);
#pragma unroll
            for (int v = 0; v < kVpl; ++v) {
                const uint8_t* q = a0 + 16 * (lane + 32 * v);
                buf[m][v] = q < end ? load16_guarded(q, wlo[m], whi[m]) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };

    // Chunk c of row r into acc: staged from buf, the next chunk requested into buf, then computed.
    auto chunk_step = [&](int r, int c) {
        // kActFirst (one activation row per pair): this lane's activation block of the chunk is requested
        // before the chunk's weights are waited for, so its L2 round trip overlaps theirs (MOE_UP_GATE on an
        // H100: 18.1 -> 15.9 us per Q30 decode layer; the one-weight GEMVs gained nothing and lost an
        // occupancy step).
        int4 ex0 = make_int4(0, 0, 0, 0), ex1 = ex0;
        float exd = 0.0f;
        if constexpr (kActFirst) {
            const int be = 32 * c + lane;
            if (be < p.nblk) {
                const uint8_t* xr = p.acts + act_row * p.act_stride;
                const int4* xq = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(be));
                ex0 = __ldg(xq);
                ex1 = __ldg(xq + 1);
                exd = __ldg(reinterpret_cast<const float*>(xr + p.k) + be);
            }
        }
        __syncwarp();  // every lane is done with the previous chunk
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int v = 0; v < kVpl; ++v) stage[warp][m][lane + 32 * v] = buf[m][v];
        }
        __syncwarp();
        // The next chunk (of this row, or the next row's first) is in flight while this one is computed.
        if (c + 1 < nchunks) {
            load_chunk(r, c + 1);
        } else if (RPW > 1 && r + 1 < warp_rows) {
            load_chunk(r + 1, 0);
        }

        const int b = 32 * c + lane;
        if (b < p.nblk) {
#pragma unroll
            for (int m = 0; m < kNM; ++m) {
                const auto* s = reinterpret_cast<const uint32_t*>(stage[warp][m]);
                const int off = static_cast<int>(reinterpret_cast<uintptr_t>(chunk_at(m, r, c)) & 15) + lane * kBB;
                if constexpr (is_quant(W)) {
                    const QBlock qb = load_qblock<W>(s, off);
                    if constexpr (kActFirst) {
                        acc[m][0] += qb.scale * exd * static_cast<float>(qblock_dot(qb, ex0, ex1));
                    } else {
#pragma unroll
                        for (int mc = 0; mc < MC; ++mc) {
                            if (mc < n_cols) {
                                const uint8_t* xr = p.acts + (act_row + mc) * p.act_stride;
                                const int4* xq = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(b));
                                const int4 x0 = load_act<EARLY>(xq);
                                const int4 x1 = load_act<EARLY>(xq + 1);
                                const float xd = load_act<EARLY>(reinterpret_cast<const float*>(xr + p.k) + b);
                                acc[m][mc] += qb.scale * xd * static_cast<float>(qblock_dot(qb, x0, x1));
                            }
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
                                const float4 x = load_act<EARLY>(xr + i);
                                sum = fmaf(v0[4 * i], x.x, sum);
                                sum = fmaf(v0[4 * i + 1], x.y, sum);
                                sum = fmaf(v0[4 * i + 2], x.z, sum);
                                sum = fmaf(v0[4 * i + 3], x.w, sum);
                            }
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float4 x = load_act<EARLY>(xr + 4 + i);
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
    };
    // The warp sums of row `row` (every lane), then its outputs (lane 0): the expert product(s) with bias
    // and activation, or the dense products and bias adds.
    auto finish_row = [&](int64_t row) {
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int mc = 0; mc < MC; ++mc) acc[m][mc] = ops::warp_sum(acc[m][mc]);
        }
        if (lane == 0) write_row<FUSED, MC>(p, seg, expert, out_col, n_cols, row, acc);
    };

    load_chunk(0, 0);
    if constexpr (EARLY) pdl_grid_sync();  // activations and outputs only after it
    if constexpr (RPW == 1) {
        for (int c = 0; c < nchunks; ++c) chunk_step(0, c);
        finish_row(row0);
    } else {
        for (int r = 0; r < warp_rows; ++r) {
            for (int c = 0; c < nchunks; ++c) chunk_step(r, c);
            finish_row(row0 + r);
#pragma unroll
            for (int m = 0; m < kNM; ++m) acc[m][0] = 0.0f;
        }
    }
}

// Dense float weights (F16, BF16, F32; FloatGemv::V2): gemv_kernel decodes each lane's 32-element block
// from its per-warp shared buffer and reads that block's 128 activation bytes per column, lanes 64 (F16)
// or 128 (F32) bytes apart: 16- and 32-way shared bank conflicts on the decode and an LDG.128 touching 32
// lines per activation load, about 560 load/store-unit cycles per 2 KB chunk of F16 weights, so ~3.6
// weight bytes per cycle and multiprocessor where HBM needs ~15 (H100: 900 GB/s on the output head).
// Float rows need no staging: any 4 consecutive elements are one aligned 8- or 16-byte load. So here,
// the grid of gemv_kernel (kGemvWarps rows per block, segments and bias rows alike), but:
// - a step is 128 consecutive elements of a row, lane l taking elements 4 l .. 4 l + 3: one coalesced
//   weight load per row (256 or 512 bytes per warp) and one coalesced float4 activation load per column
//   (512 bytes), shared by the block's kGemvWarps rows: ~12 load cycles per KB of F16 weights at one
//   column, ~40 at eight;
// - the block's warps split K (warp w takes steps w, w + kGemvWarps, ...), each warp holding kU steps of
//   all the block's rows in flight (4 KB of weights at one or two columns, 2 KB at more), so that short
//   products keep enough bytes in flight: q/k/v's 1,280 blocks and o's 512 fill the SMs for ~one wave;
// - weights bypass L1 (no_allocate), which keeps the activation rows, read by every block, there;
// - each row's sum: per lane over its steps in order, the warp's lanes (xor 16 .. 1), then the warps in
//   order 0 .. 3 (a different order of the same products than gemv_kernel's, so other last bits).
// EARLY: the first kU steps' weights are requested before the PDL wait (non-coherent loads of model
// weights, as in gemv_kernel); without it the wait comes first and weights take coherent loads.
// REQUIRES: dense (no ids, no gate); weight rows 4-element aligned (8 bytes, F32: 16); activation rows
// 16-byte aligned (launch_gemv_float checks both).
template <Type W>
struct FloatVec4 {
    static constexpr int kWords = W == Type::F32 ? 4 : 2;  // 32-bit words of 4 weights
    uint32_t u[kWords];
};

// 4 weights at p (aligned to their size), past L1; non-coherent only where NC (model weights, EARLY).
template <Type W, bool NC>
__device__ __forceinline__ FloatVec4<W> load_float4_weights(const uint8_t* p) {
    FloatVec4<W> v;
    if constexpr (W == Type::F32) {
        if constexpr (NC) {
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.u[0]), "=r"(v.u[1]), "=r"(v.u[2]), "=r"(v.u[3])
                         : "l"(p));
        } else {
            asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.u[0]), "=r"(v.u[1]), "=r"(v.u[2]), "=r"(v.u[3])
                         : "l"(p));
        }
    } else if constexpr (NC) {
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.u[0]), "=r"(v.u[1]) : "l"(p));
    } else {
        asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.u[0]), "=r"(v.u[1]) : "l"(p));
    }
    return v;
}

template <Type W>
__device__ __forceinline__ void float4_weights(const FloatVec4<W>& v, float (&w)[4]) {
    if constexpr (W == Type::F32) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(v.u[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            w[2 * i] = W == Type::F16 ? fp16_bits_to_float(v.u[i]) : bf16_bits_to_float(v.u[i]);
            w[2 * i + 1] = W == Type::F16 ? fp16_bits_to_float(v.u[i] >> 16) : bf16_bits_to_float(v.u[i] >> 16);
        }
    }
}

constexpr int kFloatStep = 128;  // elements of a row per warp step: 4 per lane

template <Type W, int MC, bool EARLY>
__global__ void __launch_bounds__(kGemvThreads) gemv_float_kernel(const GemvParams p) {
    if constexpr (!EARLY) pdl_grid_sync();
    static_assert(W == Type::F32 || W == Type::F16 || W == Type::BF16, "float weights");
    constexpr int kRows = kGemvWarps;                       // rows per block
    constexpr int kEB = W == Type::F32 ? 4 : 2;             // bytes per weight
    constexpr int kU = (MC <= 2 ? 4 : 2) / (kEB / 2);       // steps in flight per warp
    __shared__ float part[kGemvWarps][kRows][MC];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const GemvSeg seg = block_segment(p);
    const int64_t row0 = (static_cast<int64_t>(blockIdx.x) - seg.blk0) * kRows;
    // Rows past the segment's end read its last row again (no branches around the loads) and are not written.
    const uint8_t* wrow[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wrow[r] = seg.w + min(row0 + r, seg.n_rows - 1) * seg.nb1;

    const int64_t n_steps = (p.k + kFloatStep - 1) / kFloatStep;
    FloatVec4<W> wv[kU][kRows];
    // The steps s0, s0 + kGemvWarps, ... (kU of them) of this warp. Elements past k (a partial last step)
    // are not read: their weights and activations are zeros, which add nothing (k is a multiple of 32, so a
    // lane's 4 are all inside or all outside), and the compute below has no branch that would keep ptxas
    // from issuing a batch's activation loads together.
    auto load_steps = [&](int64_t s0) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t e = (s0 + kGemvWarps * u) * kFloatStep + 4 * lane;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                wv[u][r] = e < p.k ? load_float4_weights<W, EARLY>(wrow[r] + e * kEB) : FloatVec4<W>{};
            }
        }
    };
    float acc[kRows][MC];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) acc[r][mc] = 0.0f;
    }

    load_steps(warp);
    if constexpr (EARLY) pdl_grid_sync();  // activations and outputs only after it
    for (int64_t s0 = warp; s0 < n_steps; s0 += kGemvWarps * kU) {
        if (s0 != warp) load_steps(s0);  // the first steps are in flight already
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t e = (s0 + kGemvWarps * u) * kFloatStep + 4 * lane;
            float w[kRows][4];
#pragma unroll
            for (int r = 0; r < kRows; ++r) float4_weights<W>(wv[u][r], w[r]);
#pragma unroll
            for (int mc = 0; mc < MC; ++mc) {
                if (MC == 1 || mc < p.n_cols) {  // MC = 1: n_cols is 1
                    const auto* xp = reinterpret_cast<const float4*>(p.acts + mc * p.act_stride + 4 * e);
                    const float4 x = e < p.k ? load_act<EARLY>(xp) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                    for (int r = 0; r < kRows; ++r) {
                        float a = acc[r][mc];
                        a = fmaf(w[r][0], x.x, a);
                        a = fmaf(w[r][1], x.y, a);
                        a = fmaf(w[r][2], x.z, a);
                        a = fmaf(w[r][3], x.w, a);
                        acc[r][mc] = a;
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            const float v = ops::warp_sum(acc[r][mc]);
            if (lane == 0) part[warp][r][mc] = v;
        }
    }
    __syncthreads();
    const int t = static_cast<int>(threadIdx.x);
    if (t < kRows * MC) {
        const int r = t / MC;
        const int mc = t - r * MC;
        const int64_t row = row0 + r;
        if (row < seg.n_rows && mc < p.n_cols) {
            float v = part[0][r][mc];
#pragma unroll
            for (int w = 1; w < kGemvWarps; ++w) v += part[w][r][mc];
            const int64_t o = mc * seg.n_rows + row;
            if (seg.dst != nullptr) seg.dst[o] = v;  // nullptr: a product only its bias add reads
            if (seg.bias != nullptr) seg.dst2[o] = v + seg.bias[row];  // the ADD node's one rounding
        }
    }
}

// Routed products of short 4-bit rows (at most kShortMaxBlocks blocks: the expert down product of
// K = 768): a warp computes kShortRows rows, kShortLanes lanes per row, each lane kBpl consecutive blocks.
// A warp's path is three dependent memory round trips (its expert id, its weights, its activations);
// with a warp per row it moves one short row (and 8 of 32 lanes idle at 24 blocks), here four.
// Sums per lane in block order, then over the row's lanes (xor 4, 2, 1).
// REQUIRES: a routed launch (p.ids), one 4-bit weight (Q4_0 or MXFP4), p.nblk <= kShortMaxBlocks, kBpl =
// ceil(p.nblk / kShortLanes).
constexpr int kShortLanes = 8;
constexpr int kShortRows = 32 / kShortLanes;
constexpr int kShortMaxBlocks = 4 * kShortLanes;
// Weight types of the short-row kernel. Not Q8_0: with its 34-byte blocks the kernel stages 7 vectors per
// lane (50 registers) and its down product of K = 768 ran slower than the warp-per-row kernel (11.1 vs
// 10.2 us per Qwen3 layer; Q4_0: 8.4 vs 9.3, H100 ncu).
constexpr bool short_row_type(Type t) { return t == Type::Q4_0 || t == Type::MXFP4; }

template <Type W, int kBpl>
__global__ void __launch_bounds__(kGemvThreads) gemv_short_kernel(const GemvParams p) {
    pdl_grid_sync();
    static_assert(is_quant(W), "quantised weights times Q8 activations");
    constexpr int kBB = block_bytes(W);
    constexpr int kVecs = (kShortLanes * kBpl * kBB + 30) / 16;    // 16-byte vectors covering a row at any alignment
    constexpr int kVpl = (kVecs + kShortLanes - 1) / kShortLanes;  // per lane
    constexpr int kSlots = kVpl * kShortLanes + 1;                 // + a spare for qd::words_at
    __shared__ uint4 stage[kGemvWarps][kShortRows][kSlots];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int g = lane / kShortLanes;  // this lane's row of the warp
    const int l = lane % kShortLanes;  // and its place in the row
    const GemvSeg& seg = p.seg[0];
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kShortRows + g;
    const bool has_row = row < seg.n_rows;  // lanes without one still take part in the shuffles
    const int64_t pair = blockIdx.y;
    const int64_t t = pair / p.n_used;
    const int32_t e = p.ids[t * p.ids_stride + (pair - t * p.n_used)];
    if (e < 0 || e >= p.n_expert) {  // the same for every thread of the block
        if (has_row && l == 0) write_missing_expert(e, seg.dst, p.ebias, p.error_flags, pair * seg.n_rows + row);
        return;
    }
    const int64_t expert = e;
    const int64_t act_row = p.b_rows == 1 ? t : pair;

    const uint8_t* wrow = seg.w + expert * p.nb2 + (has_row ? row : 0) * seg.nb1;
    const uint8_t* end = wrow + static_cast<int64_t>(p.nblk) * kBB;
    const uint8_t* a0 = align_down<16>(wrow);
    uint4 buf[kVpl];
#pragma unroll
    for (int v = 0; v < kVpl; ++v) {
        const uint8_t* q = a0 + 16 * (l + kShortLanes * v);
        buf[v] = has_row && q < end ? load16_guarded(q, seg.lo, seg.hi) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int v = 0; v < kVpl; ++v) stage[warp][g][l + kShortLanes * v] = buf[v];
    __syncwarp();

    const uint8_t* xr = p.acts + act_row * p.act_stride;
    const auto* sw = reinterpret_cast<const uint32_t*>(stage[warp][g]);
    const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(wrow) & 15);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kBpl; ++i) {
        const int b = l * kBpl + i;
        if (b < p.nblk) {
            const QBlock qb = load_qblock<W>(sw, mis + b * kBB);
            const int4* xq = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(b));
            const int4 x0 = __ldg(xq);
            const int4 x1 = __ldg(xq + 1);
            const float xd = __ldg(reinterpret_cast<const float*>(xr + p.k) + b);
            acc += qb.scale * xd * static_cast<float>(qblock_dot(qb, x0, x1));
        }
    }
#pragma unroll
    for (int o = kShortLanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (has_row && l == 0) store_routed(p, seg, expert, pair, row, acc);
}

// Float weights with few rows (the router: 128 x 2048 F32): one block per row, each thread a slice
// of 4 consecutive values per step, so that the row's bytes are all in flight at once (a warp per row
// would leave most SMs idle), then a block sum. Segments as in gemv_kernel, blk0 counting rows.
constexpr int kRowThreads = 256;
constexpr int kRowSteps = 4;

template <Type W>
__device__ __forceinline__ void load_w4(const uint8_t* row, int64_t e, float (&w)[4]) {
    if constexpr (W == Type::F32) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(row) + e / 4);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(row) + e / 4);
        if constexpr (W == Type::F16) {
            w[0] = fp16_bits_to_float(v.x);
            w[1] = fp16_bits_to_float(v.x >> 16);
            w[2] = fp16_bits_to_float(v.y);
            w[3] = fp16_bits_to_float(v.y >> 16);
        } else {
            w[0] = bf16_bits_to_float(v.x);
            w[1] = bf16_bits_to_float(v.x >> 16);
            w[2] = bf16_bits_to_float(v.y);
            w[3] = bf16_bits_to_float(v.y >> 16);
        }
    }
}

// RK >= 0 (one activation row): the block that finishes last (a fence and a counter) also runs the
// router's selection on the logits the grid wrote (router_select.cuh, kKeys = RK), one launch instead of
// two per MoE layer.
template <Type W, int MC, int RK, bool EARLY>
__global__ void __launch_bounds__(kRowThreads) gemv_rows_kernel(const GemvParams p) {
    if constexpr (!EARLY) pdl_grid_sync();
    __shared__ float part[kRowThreads / 32][MC];
    const GemvSeg seg = block_segment(p);
    const int64_t row = static_cast<int64_t>(blockIdx.x) - seg.blk0;
    const uint8_t* wr = seg.w + row * seg.nb1;
    float acc[MC];
#pragma unroll
    for (int mc = 0; mc < MC; ++mc) acc[mc] = 0.0f;
    const auto step = [&](int64_t e, const float (&w)[4]) {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            if (mc < p.n_cols) {
                const float4 x = load_act<EARLY>(reinterpret_cast<const float4*>(p.acts + mc * p.act_stride) + e / 4);
                acc[mc] += w[0] * x.x + w[1] * x.y + w[2] * x.z + w[3] * x.w;
            }
        }
    };
    // The first kRowSteps steps' weights (a whole row of up to 4 * kRowThreads * kRowSteps values) are
    // all requested at once, before the PDL wait with EARLY.
    const int64_t e0 = 4 * static_cast<int64_t>(threadIdx.x);
    float wp[kRowSteps][4];
#pragma unroll
    for (int i = 0; i < kRowSteps; ++i) {
        const int64_t e = e0 + i * 4 * kRowThreads;
        if (e < p.k) load_w4<W>(wr, e, wp[i]);
    }
    if constexpr (EARLY) pdl_grid_sync();
#pragma unroll
    for (int i = 0; i < kRowSteps; ++i) {
        const int64_t e = e0 + i * 4 * kRowThreads;
        if (e < p.k) step(e, wp[i]);
    }
#pragma unroll 4
    for (int64_t e = e0 + kRowSteps * 4 * kRowThreads; e < p.k; e += 4 * kRowThreads) {
        float w[4];
        load_w4<W>(wr, e, w);
        step(e, w);
    }
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
    for (int mc = 0; mc < MC; ++mc) {
        const float v = ops::warp_sum(acc[mc]);
        if (lane == 0) part[warp][mc] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float b = seg.bias != nullptr ? seg.bias[row] : 0.0f;
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            if (mc >= p.n_cols) continue;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kRowThreads / 32; ++w) v += part[w][mc];
            const int64_t o = mc * seg.n_rows + row;
            if (seg.dst != nullptr) seg.dst[o] = v;
            if (seg.bias != nullptr) seg.dst2[o] = v + b;
        }
    }
    if constexpr (RK >= 0) {
        __shared__ bool last;
        if (threadIdx.x == 0) {
            __threadfence();  // this block's logits are visible before it counts itself done
            last = atomicAdd(p.rt.counter, 1u) == gridDim.x - 1;
            if (last) __threadfence();  // acquire: the other blocks' logits, before this block reads them
        }
        __syncthreads();
        if (!last) return;
        router_select_token<RK>(p.rt.x, p.rt.ids, p.rt.vals, p.rt.probs, p.rt.k, lane, warp, warp < p.n_cols);
        if (threadIdx.x == 0) *p.rt.counter = 0;  // zero for the next launch
    }
}

// Weights of the decoded types (qd::decodes: Q4_1 .. IQ4_XS) against Q8 activations: a warp per row (of
// each segment, or of each routed pair's expert), lane l taking the row's groups of 32 l, l + 32, ...,
// each read straight from global memory as int8 words and integer scales (qd::load_group, 16-bit loads:
// blocks of 22, 110 or 210 bytes are only 2-byte aligned) and dotted with dp4a against the activation
// block (qd::group_sums / group_value, tested on the host against a scalar integer reference and float64).
// Against the F32 activations of the first version this reads a quarter of the activation bytes and
// replaces 32 FMAs and 32 element decodes per group by 8 to 16 dp4a. No staging in shared memory yet.
// Outputs as gemv_kernel's (segments with bias adds, routed pairs, MUL_MAT_ID bias rows, MOE_UP_GATE).
template <Type W, int MC, bool FUSED>
__global__ void __launch_bounds__(kGemvThreads) gemv_decode_kernel(const GemvParams p) {
    pdl_grid_sync();
    static_assert(qd::decodes(W), "decoded types only");
    static_assert(!FUSED || MC == 1, "MOE_UP_GATE reads one activation row per routed pair");
    constexpr int kGroups = qd::block_elems(W) / 32;  // groups of 32 per block
    constexpr int kBB = qd::block_bytes(W);
    constexpr int kNM = FUSED ? 2 : 1;
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const GemvSeg seg = block_segment(p);
    const int64_t row = (static_cast<int64_t>(blockIdx.x) - seg.blk0) * kGemvWarps + warp;
    if (row >= seg.n_rows) return;
    const int64_t dst_stride = seg.n_rows;

    int64_t expert = 0, act_row = 0, out_col = 0;
    int n_cols = p.n_cols;
    if (p.ids != nullptr) {
        const int64_t pair = blockIdx.y;
        const int64_t t = pair / p.n_used;
        const int32_t e = p.ids[t * p.ids_stride + (pair - t * p.n_used)];
        if (e < 0 || e >= p.n_expert) {
            if (lane == 0) write_missing_expert(e, seg.dst, p.ebias, p.error_flags, pair * dst_stride + row);
            return;
        }
        expert = e;
        act_row = p.b_rows == 1 ? t : pair;
        out_col = pair;
        n_cols = 1;
    }
    const uint8_t* wrow[kNM];
    wrow[0] = seg.w + expert * p.nb2 + row * seg.nb1;
    if constexpr (FUSED) wrow[1] = p.gate + expert * p.nb2 + row * seg.nb1;

    float acc[kNM][MC];
#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int c = 0; c < MC; ++c) acc[m][c] = 0.0f;
    }
    for (int g = lane; g < p.nblk; g += 32) {
        const int64_t boff = static_cast<int64_t>(g / kGroups) * kBB;
        qd::GroupQ wq[kNM];
#pragma unroll
        for (int m = 0; m < kNM; ++m) wq[m] = qd::load_group<W>(wrow[m] + boff, g % kGroups);
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) {
            if (mc < n_cols) {
                const uint8_t* xr = p.acts + (act_row + mc) * p.act_stride;
                const int4* xv = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(g));
                const int4 x0 = __ldg(xv);
                const int4 x1 = __ldg(xv + 1);
                const float dx = __ldg(reinterpret_cast<const float*>(xr + p.k) + g);
                const int xq[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int m = 0; m < kNM; ++m) acc[m][mc] += qd::group_value<W>(wq[m], qd::group_sums<W>(wq[m], xq), dx);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int mc = 0; mc < MC; ++mc) acc[m][mc] = ops::warp_sum(acc[m][mc]);
    }
    if (lane == 0) write_row<FUSED, MC>(p, seg, expert, out_col, n_cols, row, acc);
}

// The decoded types organised as gemv_kernel (KquantGemv::V2; gemv_decode_kernel above is V1): a warp per
// row, walking it in chunks of 32 groups of 32 values, one group per lane (32 blocks of the 32-element
// types, 4 super-blocks of the K-quants and IQ4_XS: 336 .. 840 bytes). A chunk's bytes are fetched with
// aligned 16-byte loads (load16_guarded, coalesced, one or two per lane) into a per-warp shared buffer that
// keeps the source misalignment: rows of blocks of 18 .. 210 bytes start at any even address (a row of 2048
// Q4_K values is 1,152 bytes and stays 16-byte aligned, one of 768 Q6_K values is 630 bytes and does not),
// so no alignment is asked of the tensor beyond qd::load_group's 2 bytes (matmul.cu checks it). The next
// chunk's loads are issued before the current one is computed; each lane then unpacks its group's quants
// and scales once (qd::load_group, from shared memory) and dots them with every column's activation block.
// Lane l takes groups l, l + 32, ... in that order and the warp sums as in gemv_decode_kernel: the same
// bits as V1. EARLY (dense products of model weights: the first chunk loaded before the PDL wait), RPW
// (MOE_UP_GATE: 2 rows per warp where that fits the grid into one wave) and MOE_UP_GATE's activations
// requested before the chunk's weights are waited for, as in gemv_kernel.
template <Type W, int MC, bool FUSED, bool EARLY, int RPW>
__global__ void __launch_bounds__(kGemvThreads) gemv_decode_v2_kernel(const GemvParams p) {
    if constexpr (!EARLY) pdl_grid_sync();
    static_assert(qd::decodes(W), "decoded types only");
    static_assert(!(EARLY && FUSED), "routed products read their expert id first");
    static_assert(!FUSED || MC == 1, "MOE_UP_GATE reads one activation row per routed pair");
    static_assert(RPW == 1 || (RPW == 2 && FUSED), "several rows per warp: MOE_UP_GATE, 2");
    constexpr int kGroups = qd::block_elems(W) / 32;  // groups of 32 per block: 1 or 8, a divisor of 32
    constexpr int kBB = qd::block_bytes(W);
    constexpr int kChunk = 32 / kGroups * kBB;        // the bytes of 32 groups
    constexpr int kVecs = (kChunk + 30) / 16;         // 16-byte vectors covering a chunk at any alignment
    constexpr int kVpl = (kVecs + 31) / 32;           // per lane
    constexpr int kNM = FUSED ? 2 : 1;
    __shared__ uint4 stage[kGemvWarps][kNM][kVpl * 32];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const GemvSeg seg = block_segment(p);
    const int64_t row0 = ((static_cast<int64_t>(blockIdx.x) - seg.blk0) * kGemvWarps + warp) * RPW;
    if (row0 >= seg.n_rows) {  // no block-wide barrier below
        if constexpr (EARLY) pdl_grid_sync();
        return;
    }
    const int warp_rows = RPW == 1 ? 1 : static_cast<int>(min(static_cast<int64_t>(RPW), seg.n_rows - row0));

    int64_t expert = 0, act_row = 0, out_col = 0;
    int n_cols = p.n_cols;
    if (!EARLY && p.ids != nullptr) {  // EARLY launches are dense
        const int64_t pair = blockIdx.y;
        const int64_t t = pair / p.n_used;
        const int32_t e = p.ids[t * p.ids_stride + (pair - t * p.n_used)];
        if (e < 0 || e >= p.n_expert) {
            const int64_t o = pair * seg.n_rows + row0 + lane;  // lane r writes the warp's row r
            if (lane < warp_rows) write_missing_expert(e, seg.dst, p.ebias, p.error_flags, o);
            return;
        }
        expert = e;
        act_row = p.b_rows == 1 ? t : pair;
        out_col = pair;
        n_cols = 1;
    }

    const uint8_t* wbase[2] = {seg.w, p.gate};
    const uint8_t* wlo[2] = {seg.lo, p.gate_lo};
    const uint8_t* whi[2] = {seg.hi, p.gate_hi};
    const uint8_t* wrow0[kNM];  // the warp's first row
#pragma unroll
    for (int m = 0; m < kNM; ++m) wrow0[m] = wbase[m] + expert * p.nb2 + row0 * seg.nb1;

    float acc[kNM][MC];
#pragma unroll
    for (int m = 0; m < kNM; ++m) {
#pragma unroll
        for (int c = 0; c < MC; ++c) acc[m][c] = 0.0f;
    }

    const int nchunks = (p.nblk + 31) / 32;
    uint4 buf[kNM][kVpl];
    // Chunk c of the warp's row r (r = 0 with RPW = 1).
    auto chunk_at = [&](int m, int r, int c) {
        return wrow0[m] + (RPW == 1 ? 0 : r * seg.nb1) + static_cast<int64_t>(c) * kChunk;
    };
    auto load_chunk = [&](int r, int c) {
        const int groups = min(32, p.nblk - 32 * c);  // a multiple of kGroups (K is whole blocks)
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
            const uint8_t* base = chunk_at(m, r, c);
            const uint8_t* end = base + groups / kGroups * kBB;
            const uint8_t* a0 = align_down<16>(base);
#pragma unroll
            for (int v = 0; v < kVpl; ++v) {
                const uint8_t* q = a0 + 16 * (lane + 32 * v);
                buf[m][v] = q < end ? load16_guarded(q, wlo[m], whi[m]) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };
    // This lane's activation block of group g, column mc.
    auto load_x = [&](int mc, int g, int (&xq)[8], float& dx) {
        const uint8_t* xr = p.acts + (act_row + mc) * p.act_stride;
        const int4* xv = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(g));
        const int4 x0 = load_act<EARLY>(xv);
        const int4 x1 = load_act<EARLY>(xv + 1);
        dx = load_act<EARLY>(reinterpret_cast<const float*>(xr + p.k) + g);
        xq[0] = x0.x;
        xq[1] = x0.y;
        xq[2] = x0.z;
        xq[3] = x0.w;
        xq[4] = x1.x;
        xq[5] = x1.y;
        xq[6] = x1.z;
        xq[7] = x1.w;
    };
    // Chunk c of row r into acc: staged from buf, the next chunk requested into buf, then computed.
    auto chunk_step = [&](int r, int c) {
        const int g = 32 * c + lane;
        // MOE_UP_GATE (one activation row): the lane's activation block is requested before the chunk's
        // weights are waited for, so that its L2 round trip overlaps theirs, as gemv_kernel's kActFirst.
        [[maybe_unused]] int xf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        [[maybe_unused]] float dxf = 0.0f;
        if constexpr (FUSED) {
            if (g < p.nblk) load_x(0, g, xf, dxf);
        }
        __syncwarp();  // every lane is done with the previous chunk
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int v = 0; v < kVpl; ++v) stage[warp][m][lane + 32 * v] = buf[m][v];
        }
        __syncwarp();
        // The next chunk (of this row, or the next row's first) is in flight while this one is computed.
        if (c + 1 < nchunks) {
            load_chunk(r, c + 1);
        } else if (RPW > 1 && r + 1 < warp_rows) {
            load_chunk(r + 1, 0);
        }
        if (g >= p.nblk) return;
        qd::GroupQ wq[kNM];
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
            const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(chunk_at(m, r, c)) & 15);  // warp-uniform
            const uint8_t* blk = reinterpret_cast<const uint8_t*>(stage[warp][m]) + mis + lane / kGroups * kBB;
            // g % kGroups: chunks start at a block. Blocks of whole words in a 4-byte aligned row (Q4_K rows
            // of 2048 or 768 values, at any tensor offset a multiple of 4) load words, not 16-bit halves.
            if constexpr (qd::word_blocks(W)) {
                wq[m] = (mis & 3) == 0 ? qd::load_group<W, true>(blk, lane % kGroups)
                                       : qd::load_group<W, false>(blk, lane % kGroups);
            } else {
                wq[m] = qd::load_group<W>(blk, lane % kGroups);
            }
        }
        if constexpr (FUSED) {
#pragma unroll
            for (int m = 0; m < kNM; ++m) acc[m][0] += qd::group_value<W>(wq[m], qd::group_sums<W>(wq[m], xf), dxf);
        } else {
#pragma unroll
            for (int mc = 0; mc < MC; ++mc) {
                if (mc < n_cols) {
                    int xq[8];
                    float dx;
                    load_x(mc, g, xq, dx);
                    acc[0][mc] += qd::group_value<W>(wq[0], qd::group_sums<W>(wq[0], xq), dx);
                }
            }
        }
    };

    load_chunk(0, 0);
    if constexpr (EARLY) pdl_grid_sync();  // activations and outputs only after it
    for (int r = 0; r < warp_rows; ++r) {
        for (int c = 0; c < nchunks; ++c) chunk_step(r, c);
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int mc = 0; mc < MC; ++mc) acc[m][mc] = ops::warp_sum(acc[m][mc]);
        }
        if (lane == 0) write_row<FUSED, MC>(p, seg, expert, out_col, n_cols, row0 + r, acc);
#pragma unroll
        for (int m = 0; m < kNM; ++m) {
#pragma unroll
            for (int mc = 0; mc < MC; ++mc) acc[m][mc] = 0.0f;
        }
    }
}

// Routed single products of the decoded types with short rows (KquantGemv::V3; at most kDecShortMaxGroups
// groups of 32: the expert down product of K = 768 is 24 groups, 3 K-quant super-blocks), organised as
// gemv_short_kernel: a warp computes kShortRows rows, kShortLanes lanes per row, where gemv_decode_v2_kernel
// leaves a quarter of its lanes idle at 24 groups and fetches one short row per warp round trip. Each row's
// bytes are staged as there (aligned 16-byte loads into shared memory keeping the row's misalignment: rows
// of 210-byte Q6_K blocks are only 2-byte aligned). Lane l of a row takes groups l, l + 8, l + 16, l + 24
// (those below p.nblk) and adds them as gemv_decode_v2_kernel's warp sum adds a row of at most 32 groups
// (there lane l holds group l, summed xor 16, 8, 4, 2, 1): (v0 + v2) + (v1 + v3) in the lane, missing
// groups as 0, then xor 4, 2, 1 over the row's lanes. So the outputs have V2's (and V1's) bits.
// REQUIRES: a routed launch (p.ids) of one weight without gate, p.nblk <= kDecShortMaxGroups, kGpl =
// ceil(p.nblk / kShortLanes).
constexpr int kDecShortMaxGroups = 4 * kShortLanes;

template <Type W, int kGpl>
__global__ void __launch_bounds__(kGemvThreads) gemv_decode_short_kernel(const GemvParams p) {
    pdl_grid_sync();
    static_assert(qd::decodes(W), "decoded types only");
    static_assert(kGpl >= 1 && kGpl <= kDecShortMaxGroups / kShortLanes, "at most 4 groups per lane");
    constexpr int kGroups = qd::block_elems(W) / 32;  // groups of 32 per block: 1 or 8
    constexpr int kBB = qd::block_bytes(W);
    constexpr int kRowBytes = (kShortLanes * kGpl + kGroups - 1) / kGroups * kBB;  // the longest row of kGpl
    constexpr int kVecs = (kRowBytes + 30) / 16;  // 16-byte vectors covering such a row at any alignment
    constexpr int kVpl = (kVecs + kShortLanes - 1) / kShortLanes;  // per lane
    __shared__ uint4 stage[kGemvWarps][kShortRows][kVpl * kShortLanes];

    const int warp = static_cast<int>(threadIdx.x) >> 5;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int r = lane / kShortLanes;  // this lane's row of the warp
    const int l = lane % kShortLanes;  // and its place in the row
    const GemvSeg& seg = p.seg[0];
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kShortRows + r;
    const bool has_row = row < seg.n_rows;  // lanes without one still take part in the shuffles
    const int64_t pair = blockIdx.y;
    const int64_t t = pair / p.n_used;
    const int32_t e = p.ids[t * p.ids_stride + (pair - t * p.n_used)];
    if (e < 0 || e >= p.n_expert) {  // the same for every thread of the block
        if (has_row && l == 0) write_missing_expert(e, seg.dst, p.ebias, p.error_flags, pair * seg.n_rows + row);
        return;
    }
    const int64_t expert = e;
    const int64_t act_row = p.b_rows == 1 ? t : pair;

    const uint8_t* wrow = seg.w + expert * p.nb2 + (has_row ? row : 0) * seg.nb1;
    const uint8_t* end = wrow + static_cast<int64_t>(p.nblk / kGroups) * kBB;  // K is whole blocks
    const uint8_t* a0 = align_down<16>(wrow);
    uint4 buf[kVpl];
#pragma unroll
    for (int v = 0; v < kVpl; ++v) {
        const uint8_t* q = a0 + 16 * (l + kShortLanes * v);
        buf[v] = has_row && q < end ? load16_guarded(q, seg.lo, seg.hi) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int v = 0; v < kVpl; ++v) stage[warp][r][l + kShortLanes * v] = buf[v];
    __syncwarp();

    const uint8_t* xr = p.acts + act_row * p.act_stride;
    const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(wrow) & 15);
    const uint8_t* srow = reinterpret_cast<const uint8_t*>(stage[warp][r]) + mis;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kGpl; ++i) {
        const int g = l + kShortLanes * i;
        if (g < p.nblk) {
            const uint8_t* blk = srow + g / kGroups * kBB;
            qd::GroupQ wq;
            // Blocks of whole words in a 4-byte aligned row load words, as in gemv_decode_v2_kernel.
            if constexpr (qd::word_blocks(W)) {
                wq = (mis & 3) == 0 ? qd::load_group<W, true>(blk, g % kGroups)
                                    : qd::load_group<W, false>(blk, g % kGroups);
            } else {
                wq = qd::load_group<W>(blk, g % kGroups);
            }
            const int4* xv = reinterpret_cast<const int4*>(xr + 32 * static_cast<int64_t>(g));
            const int4 x0 = __ldg(xv);
            const int4 x1 = __ldg(xv + 1);
            const float dx = __ldg(reinterpret_cast<const float*>(xr + p.k) + g);
            const int xq[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            v[i] += qd::group_value<W>(wq, qd::group_sums<W>(wq, xq), dx);  // 0 + value, as V2's first group
        }
    }
    float acc = (v[0] + v[2]) + (v[1] + v[3]);  // V2's xor 16, then xor 8
#pragma unroll
    for (int o = kShortLanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (has_row && l == 0) store_routed(p, seg, expert, pair, row, acc);
}

// One warp per (row, block of 32): lane j takes element j (one coalesced 128-byte load per warp), the
// block's amax is a warp max, and lanes 0, 4, ... store the packed words. Q8 quantisation exactly as
// the CPU's quantize_q8a.
constexpr int kQuantWarps = 8;

__global__ void __launch_bounds__(kQuantWarps * 32) quantize_q8_kernel(const RowsF32 x, int64_t rows, int nblk,
                                                                         int64_t k, uint8_t* dst, int64_t stride) {
    pdl_grid_sync_small();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
    if (i >= rows * nblk) return;  // whole warps leave together
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int64_t r = i / nblk;
    const int b = static_cast<int>(i - r * nblk);
    uint8_t* row = dst + r * stride;
    ops::warp_quantize_q8_block(row_f32(x, r)[32 * b + lane], lane,
                                reinterpret_cast<uint32_t*>(row + 32 * static_cast<int64_t>(b)),
                                reinterpret_cast<float*>(row + k) + b);
}

// One thread per element: F32 rows copied into contiguous prepared rows.
__global__ void copy_f32_kernel(const RowsF32 x, int64_t rows, int64_t k, float* dst) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * k) return;
    const int64_t r = i / k;
    dst[i] = row_f32(x, r)[i - r * k];
}

// Blocks of `kernel` (kGemvThreads threads) one multiprocessor holds at once; 0 if unknown.
template <typename Kernel>
int gemv_blocks_per_sm(Kernel kernel) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kGemvThreads, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

template <Type W, int MC, bool FUSED>
Status launch_gemv(const GemvParams& p, int64_t blocks, int64_t n_jobs, int n_sm, cudaStream_t stream) {
    static_assert(!FUSED || MC == 1, "MOE_UP_GATE reads one activation row per routed pair");
    const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(n_jobs));
    if constexpr (FUSED && is_quant(W)) {
        // Two rows per warp where that brings a grid of more than one wave into one (the Qwen3 up/gate
        // products: 1,536 blocks in 1.45 waves -> 768 in one); with more blocks (GPT-OSS-20B: 2,880 -> 1,440
        // in 1.36 waves) the longer warps lost (tg128 -2%). Occupancies are per kernel, queried once per
        // process on the device it first runs on (a process mixing GPU kinds would size by the first).
        static const int per_sm_1 = gemv_blocks_per_sm(gemv_kernel<W, 1, true, false, 1>);
        static const int per_sm_2 = gemv_blocks_per_sm(gemv_kernel<W, 1, true, false, 2>);
        const int64_t resident_1 = static_cast<int64_t>(per_sm_1) * n_sm;
        const int64_t resident_2 = static_cast<int64_t>(per_sm_2) * n_sm;
        const int64_t blocks_2 = (p.seg[0].n_rows + 2 * kGemvWarps - 1) / (2 * kGemvWarps);
        if (blocks * n_jobs > resident_1 && blocks_2 * n_jobs <= resident_2) {
            const dim3 grid_2(static_cast<unsigned int>(blocks_2), static_cast<unsigned int>(n_jobs));
            return launch_kernel("gemv_kernel", gemv_kernel<W, 1, true, false, 2>, grid_2, kGemvThreads, 0, stream, p);
        }
    }
    if constexpr (!FUSED) {
        if (p.early_weights) {
            return launch_kernel("gemv_kernel", gemv_kernel<W, MC, false, true, 1>, grid, kGemvThreads, 0, stream, p);
        }
    }
    return launch_kernel("gemv_kernel", gemv_kernel<W, MC, FUSED, false, 1>, grid, kGemvThreads, 0, stream, p);
}

// Whether gemv_float_kernel can read p: weight rows that start at 4-element boundaries (8 bytes, F32:
// 16) and 16-byte aligned activation rows (gemv_prepare's, or F32 rows read in place).
bool float_gemv_fits(Type w, const GemvParams& p) {
    const int64_t a = w == Type::F32 ? 16 : 8;
    bool ok = reinterpret_cast<uintptr_t>(p.acts) % 16 == 0 && p.act_stride % 16 == 0;
    for (int i = 0; i < p.n_seg; ++i) {
        ok = ok && reinterpret_cast<uintptr_t>(p.seg[i].w) % static_cast<uintptr_t>(a) == 0 && p.seg[i].nb1 % a == 0;
    }
    return ok;
}

// gemv_float_kernel over p (dense, float weights) with 1, 2, 4 or 8 columns, its first steps before the
// PDL wait where p.early_weights says.
template <Type W>
Status launch_gemv_float(const GemvParams& p, int64_t blocks, cudaStream_t stream) {
    const auto pick = [&](auto early) {
        constexpr bool E = decltype(early)::value;
        auto kernel = gemv_float_kernel<W, 8, E>;  // 5 .. 8 columns: the column loop is guarded
        if (p.n_cols == 1) {
            kernel = gemv_float_kernel<W, 1, E>;
        } else if (p.n_cols == 2) {
            kernel = gemv_float_kernel<W, 2, E>;
        } else if (p.n_cols <= 4) {
            kernel = gemv_float_kernel<W, 4, E>;
        }
        return kernel;
    };
    const auto kernel = p.early_weights ? pick(std::true_type{}) : pick(std::false_type{});
    return launch_kernel("gemv_float_kernel", kernel, static_cast<unsigned int>(blocks), kGemvThreads, 0, stream, p);
}

// gemv_rows_kernel over `grid` rows of p, with the router's selection where p.rt.counter is set.
template <Type W, bool EARLY>
Status launch_rows(const GemvParams& p, unsigned int grid, cudaStream_t stream) {
    auto kernel = gemv_rows_kernel<W, 8, -1, EARLY>;
    if (p.rt.counter != nullptr) {
        kernel = p.rt.x.ne[0] <= 32 * kRouterKeys ? gemv_rows_kernel<W, 1, kRouterKeys, EARLY>
                                                  : gemv_rows_kernel<W, 1, 0, EARLY>;
    } else if (p.n_cols == 1) {
        kernel = gemv_rows_kernel<W, 1, -1, EARLY>;
    } else if (p.n_cols == 2) {
        kernel = gemv_rows_kernel<W, 2, -1, EARLY>;
    } else if (p.n_cols <= 4) {
        kernel = gemv_rows_kernel<W, 4, -1, EARLY>;
    }
    return launch_kernel("gemv_rows_kernel", kernel, grid, kRowThreads, 0, stream, p);
}

// gemv_decode_kernel over p (a decoded weight type).
Status launch_gemv_decode(Type w, const GemvParams& p, int64_t blocks, int64_t n_jobs, bool fused, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(n_jobs));
    return with_decoded_type(w, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        auto kernel = gemv_decode_kernel<W, 8, false>;  // 2 .. 8 columns: the column loop is guarded
        if (fused) {
            kernel = gemv_decode_kernel<W, 1, true>;
        } else if (p.n_cols == 1) {
            kernel = gemv_decode_kernel<W, 1, false>;
        }
        return launch_kernel("gemv_decode_kernel", kernel, grid, kGemvThreads, 0, stream, p);
    });
}

// gemv_decode_v2_kernel over p (a decoded weight type): dense products with 1, 2, 4 or 8 columns, their
// first chunk before the PDL wait where p.early_weights says; routed ones with one column, MOE_UP_GATE at
// two rows per warp under gemv_kernel's rule (launch_gemv).
template <Type W>
Status launch_gemv_decode_v2(const GemvParams& p, int64_t blocks, int64_t n_jobs, bool fused, int n_sm,
                             cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned int>(blocks), static_cast<unsigned int>(n_jobs));
    if (fused) {
        static const int per_sm_1 = gemv_blocks_per_sm(gemv_decode_v2_kernel<W, 1, true, false, 1>);
        static const int per_sm_2 = gemv_blocks_per_sm(gemv_decode_v2_kernel<W, 1, true, false, 2>);
        const int64_t blocks_2 = (p.seg[0].n_rows + 2 * kGemvWarps - 1) / (2 * kGemvWarps);
        if (blocks * n_jobs > static_cast<int64_t>(per_sm_1) * n_sm &&
            blocks_2 * n_jobs <= static_cast<int64_t>(per_sm_2) * n_sm) {
            const dim3 grid_2(static_cast<unsigned int>(blocks_2), static_cast<unsigned int>(n_jobs));
            return launch_kernel("gemv_decode_v2_kernel", gemv_decode_v2_kernel<W, 1, true, false, 2>, grid_2,
                                 kGemvThreads, 0, stream, p);
        }
        return launch_kernel("gemv_decode_v2_kernel", gemv_decode_v2_kernel<W, 1, true, false, 1>, grid, kGemvThreads,
                             0, stream, p);
    }
    const auto pick = [&](auto early) {
        constexpr bool E = decltype(early)::value;
        auto kernel = gemv_decode_v2_kernel<W, 8, false, E, 1>;
        if (p.n_cols == 1) {
            kernel = gemv_decode_v2_kernel<W, 1, false, E, 1>;
        } else if (p.n_cols == 2) {
            kernel = gemv_decode_v2_kernel<W, 2, false, E, 1>;
        } else if (p.n_cols <= 4) {
            kernel = gemv_decode_v2_kernel<W, 4, false, E, 1>;
        }
        return kernel;
    };
    // Routed launches have one column and never start early (p.early_weights is for dense ones only).
    const auto kernel = p.early_weights ? pick(std::true_type{}) : pick(std::false_type{});
    return launch_kernel("gemv_decode_v2_kernel", kernel, grid, kGemvThreads, 0, stream, p);
}

// gemv_short_kernel over the routed pairs of p.
// REQUIRES: p routed (p.ids), one weight of type w (Q4_0 or MXFP4) with p.nblk <= kShortMaxBlocks.
Status launch_gemv_short(Type w, const GemvParams& p, int64_t n_jobs, cudaStream_t stream) {
    const int64_t rows_per_block = kGemvWarps * kShortRows;
    const dim3 grid(static_cast<unsigned int>((p.seg[0].n_rows + rows_per_block - 1) / rows_per_block),
                    static_cast<unsigned int>(n_jobs));
    const int bpl = (p.nblk + kShortLanes - 1) / kShortLanes;
    return with_weight_type(w, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        if constexpr (!short_row_type(W)) {
            return internal_error("cuda gemv: short rows take 4-bit weights");
        } else {
            auto kernel = gemv_short_kernel<W, 4>;
            if (bpl == 1) {
                kernel = gemv_short_kernel<W, 1>;
            } else if (bpl == 2) {
                kernel = gemv_short_kernel<W, 2>;
            } else if (bpl == 3) {
                kernel = gemv_short_kernel<W, 3>;
            }
            return launch_kernel("gemv_short_kernel", kernel, grid, kGemvThreads, 0, stream, p);
        }
    });
}

// gemv_decode_short_kernel over the routed pairs of p.
// REQUIRES: p routed (p.ids), one weight of type w (a decoded type) with p.nblk <= kDecShortMaxGroups.
Status launch_gemv_decode_short(Type w, const GemvParams& p, int64_t n_jobs, cudaStream_t stream) {
    const int64_t rows_per_block = kGemvWarps * kShortRows;
    const dim3 grid(static_cast<unsigned int>((p.seg[0].n_rows + rows_per_block - 1) / rows_per_block),
                    static_cast<unsigned int>(n_jobs));
    const int gpl = (p.nblk + kShortLanes - 1) / kShortLanes;
    return with_decoded_type(w, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        auto kernel = gemv_decode_short_kernel<W, 4>;
        if (gpl == 1) {
            kernel = gemv_decode_short_kernel<W, 1>;
        } else if (gpl == 2) {
            kernel = gemv_decode_short_kernel<W, 2>;
        } else if (gpl == 3) {
            kernel = gemv_decode_short_kernel<W, 3>;
        }
        return launch_kernel("gemv_decode_short_kernel", kernel, grid, kGemvThreads, 0, stream, p);
    });
}

}  // namespace

size_t gemv_act_row_bytes(Type w, int64_t k) {
    if (q8_acts(w)) return q8_row_bytes(k);
    return (4 * static_cast<size_t>(k) + 15) & ~size_t{15};
}

Status gemv_prepare(const RowsF32& x, int64_t rows, int64_t k, Type w, void* dst, cudaStream_t stream) {
    if (rows == 0) return Status::ok();
    if (q8_acts(w)) {
        const int nblk = static_cast<int>(k / 32);
        const int64_t n = rows * nblk;
        return launch_kernel("quantize_q8_kernel", quantize_q8_kernel,
                             static_cast<unsigned int>((n + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, stream,
                             x, rows, nblk, k, static_cast<uint8_t*>(dst),
                             static_cast<int64_t>(gemv_act_row_bytes(w, k)));
    }
    constexpr int kThreads = 256;
    const int64_t n = rows * k;
    return launch_kernel("copy_f32_kernel", copy_f32_kernel, static_cast<unsigned int>((n + kThreads - 1) / kThreads),
                         kThreads, 0, stream, x, rows, k, static_cast<float*>(dst));
}

Status gemv(const WeightArg& w, const WeightArg* gate, const void* acts, int64_t n_cols, const GemvRoute* route,
            const GluParams* glu, float* dst, cudaStream_t stream) {
    const GemvOut out{&w, dst, nullptr, nullptr};
    return gemv_multi(std::span<const GemvOut>(&out, 1), gate, acts, 0, n_cols, route, glu, stream);
}

Status gemv_multi(std::span<const GemvOut> outs, const WeightArg* gate, const void* acts, int64_t act_stride,
                  int64_t n_cols, const GemvRoute* route, const GluParams* glu, cudaStream_t stream,
                  const RouterTail* router, bool* routed) {
    if (routed != nullptr) *routed = false;
    if (outs.empty() || outs.size() > static_cast<size_t>(kMaxGemvSegs)) {
        return internal_error("cuda gemv: " + std::to_string(outs.size()) + " weights in one launch (1 .. " +
                              std::to_string(kMaxGemvSegs) + " expected)");
    }
    const WeightArg& w = *outs[0].w;
    GemvParams p{};
    int64_t blocks = 0;
    for (const GemvOut& o : outs) {
        if (o.w->type != w.type || o.w->k != w.k) return internal_error("cuda gemv: segments of one launch differ in type or k");
        GemvSeg& sg = p.seg[p.n_seg++];
        sg.w = o.w->data;
        sg.lo = o.w->data;
        sg.hi = o.w->end;
        sg.nb1 = o.w->nb1;
        sg.n_rows = o.w->n;
        sg.blk0 = blocks;
        sg.dst = o.dst;
        sg.bias = o.bias;
        sg.dst2 = o.dst2;
        blocks += (o.w->n + kGemvWarps - 1) / kGemvWarps;
    }
    if (blocks == 0) return Status::ok();
    // Early weight loads only where most of the grid is resident from its start: later blocks start when
    // earlier ones exit, so theirs would overlap nothing (and a first early build, at 48 registers, cost
    // the output product of 38k blocks 2% in ncu on an H100).
    p.early_weights = route == nullptr && gate == nullptr && blocks <= kEarlyMaxBlocks;
    for (const GemvOut& o : outs) p.early_weights = p.early_weights && o.w->constant;
    p.gate = gate != nullptr ? gate->data : w.data;
    p.gate_lo = gate != nullptr ? gate->data : w.data;
    p.gate_hi = gate != nullptr ? gate->end : w.end;
    p.nb2 = w.nb2;
    p.k = w.k;
    p.nblk = static_cast<int>(w.k / 32);
    p.n_expert = w.n_expert;
    p.acts = static_cast<const uint8_t*>(acts);
    p.act_stride = act_stride > 0 ? act_stride : static_cast<int64_t>(gemv_act_row_bytes(w.type, w.k));
    p.n_cols = static_cast<int>(n_cols);
    int64_t n_jobs = 1;
    int n_sm = 0;
    if (route != nullptr) {
        n_sm = route->n_sm;
        if (outs.size() != 1) return internal_error("cuda gemv: routed products take one weight");
        p.ids = route->ids;
        p.ids_stride = route->ids_stride;
        p.n_used = route->n_used;
        p.b_rows = route->b_rows;
        p.error_flags = route->error_flags;
        p.ebias = route->bias;
        if (p.ebias.rows != nullptr && (gate != nullptr || p.ebias.picked == nullptr || p.ebias.sum == nullptr)) {
            return internal_error("cuda gemv: per-expert bias rows take one weight and both outputs");
        }
        p.n_cols = 1;
        n_jobs = route->n_pairs;
        if (n_jobs == 0) return Status::ok();
    } else if (n_cols < 1 || n_cols > kGemvMaxCols) {
        return internal_error("cuda gemv: " + std::to_string(n_cols) + " columns (1 .. 8 expected)");
    }
    if (n_jobs > static_cast<int64_t>(ops::kMaxGridYZ)) {
        return internal_error("cuda gemv: " + std::to_string(n_jobs) + " routed pairs exceed the grid");
    }
    if (blocks > 0x7fffffff) return internal_error("cuda gemv: too many rows");
    if (glu != nullptr) p.glu = *glu;
    const bool fused = gate != nullptr;
    if (fused && p.n_cols != 1) return internal_error("cuda gemv: up/gate pairs take one activation row each");
    if (qd::decodes(w.type)) {
        if (w.kquant_gemv == KquantGemv::V1) return launch_gemv_decode(w.type, p, blocks, n_jobs, fused, stream);
        if (w.kquant_gemv == KquantGemv::V3 && route != nullptr && !fused && p.nblk <= kDecShortMaxGroups) {
            return launch_gemv_decode_short(w.type, p, n_jobs, stream);
        }
        return with_decoded_type(w.type, [&](auto wt) -> Status {
            return launch_gemv_decode_v2<decltype(wt)::value>(p, blocks, n_jobs, fused, n_sm, stream);
        });
    }
    // Float weights with few rows: a block per row (16-byte activation rows, aligned weight rows).
    if (route == nullptr && !is_quant(w.type) && reinterpret_cast<uintptr_t>(p.acts) % 16 == 0 &&
        p.act_stride % 16 == 0) {
        const size_t wa = w.type == Type::F32 ? 16 : 8;
        bool rows_ok = true;
        int64_t rows = 0;
        for (int i = 0; i < p.n_seg; ++i) {
            GemvSeg& sg = p.seg[i];
            rows_ok = rows_ok && sg.n_rows <= kRowKernelMaxRows && reinterpret_cast<uintptr_t>(sg.w) % wa == 0 &&
                      sg.nb1 % static_cast<int64_t>(wa) == 0;
            sg.blk0 = rows;
            rows += sg.n_rows;
        }
        if (rows_ok) {
            return with_weight_type(w.type, [&](auto wt) -> Status {
                constexpr Type W = decltype(wt)::value;
                if constexpr (is_quant(W)) {
                    return internal_error("cuda gemv: the row kernel takes float weights");
                } else {
                    const auto grid = static_cast<unsigned int>(rows);
                    if (router != nullptr && p.n_cols == 1 && router->counter != nullptr) {
                        p.rt = *router;
                        if (routed != nullptr) *routed = true;
                    }
                    if (p.early_weights) return launch_rows<W, true>(p, grid, stream);
                    return launch_rows<W, false>(p, grid, stream);
                }
            });
        }
        int64_t blk = 0;
        for (int i = 0; i < p.n_seg; ++i) {  // back to warp rows: blocks of kGemvWarps rows
            p.seg[i].blk0 = blk;
            blk += (p.seg[i].n_rows + kGemvWarps - 1) / kGemvWarps;
        }
    }
    if (route == nullptr && !fused && !is_quant(w.type) && w.float_gemv == FloatGemv::V2 && float_gemv_fits(w.type, p)) {
        return with_weight_type(w.type, [&](auto wt) -> Status {
            constexpr Type W = decltype(wt)::value;
            if constexpr (is_quant(W)) {
                return internal_error("cuda gemv: the float kernel takes float weights");
            } else {
                return launch_gemv_float<W>(p, blocks, stream);
            }
        });
    }
    if (route != nullptr && !fused && short_row_type(w.type) && p.nblk <= kShortMaxBlocks) {
        return launch_gemv_short(w.type, p, n_jobs, stream);
    }
    return with_weight_type(w.type, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        if (fused) return launch_gemv<W, 1, true>(p, blocks, n_jobs, n_sm, stream);
        if (p.n_cols == 1) return launch_gemv<W, 1, false>(p, blocks, n_jobs, n_sm, stream);
        if (p.n_cols == 2) return launch_gemv<W, 2, false>(p, blocks, n_jobs, n_sm, stream);
        if (p.n_cols <= 4) return launch_gemv<W, 4, false>(p, blocks, n_jobs, n_sm, stream);
        return launch_gemv<W, 8, false>(p, blocks, n_jobs, n_sm, stream);
    });
}

}  // namespace moe::cuda::mm
