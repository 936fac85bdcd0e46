// The tensor-core GEMM behind mma_gemm (matmul_gemm.cu), instantiated by matmul_gemm.cu for float,
// Q8_0, Q4_0 and MXFP4 weights and by matmul_gemm_decoded.cu for the decoded types of core/quant_decode.h
// (Q4_1 .. IQ4_XS), so that the two sets compile in parallel.
//
// mma_kernel, used for every expert product (grouped by expert, see matmul_moe.cu) and for dense
// products of quantised / F16 weights at moderate batch sizes: a CTA of 8 warps computes a 128-row x
// BN-column tile with mma.sync m16n8k16; per k-step of KB blocks of 32 per row (MmaCfg: quantised and
// decoded weights take steps of 2 blocks with 2 stages, float weights steps of 1 with 4 stages):
//   - the weight tile's raw bytes (128 rows x KB blocks, any alignment: the aligned 16-byte chunks that
//     cover them) and the activation tile (BF16 rows, gathered through the column -> row table for
//     routed pairs) arrive with cp.async, STAGES steps ahead, so that enough bytes are in flight to
//     hide the memory latency. Quantised weights (LEAN): CTAs whose rows all lie inside their tensors
//     copy raw words without guards; elsewhere words at the tensor's edges take a guarded load;
//   - step kb decodes step kb + 1 to BF16 in shared memory (each thread half a block per block of the
//     step, decode_half_bf16: byte permutes and BF16 / float arithmetic, no integer conversions) while
//     its MMAs use step kb, decoded in the step before: one barrier per step, and no dequantised copy
//     of the weights is ever written;
//   - ldmatrix feeds the MMAs; rows padded by 8 BF16 so the ldmatrix reads are free of bank conflicts;
//     warps whose columns all lie past the tile's last column skip their MMAs (warp-uniform); the
//     others run every fragment's MMAs (per-fragment branches cost more issue slots,
//     with their warp syncs, than the tensor-core work they saved).
// Chosen by a same-call A/B of compiled variants (PERF.md, 2026-11-23): 2-block steps, unguarded
// copies and the BF16 decode of MXFP4 together gave all-GPU pp512 ~+10% (Q30 Q8_0) and ~+20% (G20
// MXFP4) over the one-block, 4-stage kernel before them; 256-row tiles were slower.
// Routed mode: a CTA's blockIdx.x is a column tile of one expert, found by binary search in the
// per-expert tile prefix (built on the device); CTAs past the last tile exit at once, so the grid can
// be sized on the host from an upper bound without reading the routing back. Tiles are wider than the
// mean group (mma_route_tile_cols), so that most experts decode their weights once.
// Fused MOE_UP_GATE: rows 0-63 of the A tile are up rows, 64-127 the same gate rows; each warp's
// m-fragments pair an up block with its gate block, so one thread holds u and g of the same output
// and applies bias + activation in registers.
//
// Decoded types (qd::decodes). A K-quant / IQ4_XS group of 32 needs bytes spread over its whole
// super-block (scales in front, bits interleaved), so the raw copy goes a unit of 256 elements at a time
// (quant_decode.h: one super-block, or 8 blocks of the 32-element types; K need not be a multiple of 256
// for those, and a row's last unit may be partial): kPeriod = 4 k-steps of 2 groups decode from one raw
// unit. Each unit is copied as the aligned 16-byte chunks that cover it (rows are only 2-byte aligned:
// Q6_K's 210-byte blocks, Q3_K's 110, K = 768 rows of 630 bytes...), two units in flight, and each
// thread decodes one group of one row per step, half a group at a time, with qd::decode16_words
// (host-tested against the decoders of quant_decode.h: it reads the staged row as words and builds each
// float with a byte permute and, for the types of qd::decode_fma, one FMA: quant_decode.h's FMA form, which
// the dequantise-first path takes too) straight from the staged bytes into the A tile. Pipeline: each step
// commits its activation tile and then (every kPeriod steps) the next raw unit as two cp.async groups;
// waiting for all but the newest group completes the step's activations and every unit issued two or more
// steps before; a unit is issued kPeriod steps before the step that decodes its first group, into the slot
// whose unit the step before finished.
// Shared memory per CTA, bytes: A 2 x 128 x 72 x 2 = 36,864; B 2 x BN x 72 x 2 (BN 32 / 64 / 128: 9,216 /
// 18,432 / 36,864); column tables 8 BN; raw 2 x 128 x 16 kCR, kCR = unit_chunks16 (Q2_K 7, Q3_K 8,
// IQ4_NL / Q4_K / IQ4_XS 10, Q4_1 11, Q5_0 / Q5_K 12, Q5_1 13, Q6_K 14), made odd where that costs no
// CTA per SM (233,472 bytes per SM, 1,024 reserved per CTA). Q4_K at BN 64: 36,864 + 18,432 + 512 +
// 45,056 (kCR 11) = 100,864, 2 CTAs per SM; at BN 128 kCR stays 10: 36,864 + 36,864 + 1,024 + 40,960 =
// 115,712, and 2 x (115,712 + 1,024) = 233,472 exactly, 2 CTAs. Q6_K at BN 64: kCR 14, 113,152, 2 CTAs.
// Every type has 2 CTAs per SM (16 warps) at BN 32 and 64 (Q2_K 3 at 32) and at BN 128 Q2_K, Q3_K,
// IQ4_NL, Q4_K and IQ4_XS; Q4_1, Q5_*, Q6_K 1 there (128,000 for Q5_K). Registers: 128 per thread
// (__launch_bounds__ of 2 CTAs) wherever shared memory allows 2.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/quant_decode.h"
#include "core/quant_decode_words.h"
#include "cuda/cuda_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/matmul.cuh"
#include "cuda/mma_units.h"
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {

constexpr int kMmaThreads = 256;
constexpr int kBM = 128;  // A-tile rows
constexpr size_t kSmemPerSm = 233472;  // H100: 228 KiB of shared memory per SM, 1 KiB of it reserved per CTA

struct MmaParams {
    const uint8_t* w0;
    const uint8_t* w1;  // gate (fused) or w0
    const uint8_t* lo0;
    const uint8_t* hi0;
    const uint8_t* lo1;
    const uint8_t* hi1;
    int64_t nb1, nb2;
    int64_t n_rows;
    int nblk;
    const __nv_bfloat16* x;
    int64_t x_stride;  // elements between activation rows
    int64_t n_cols;    // dense mode
    const int32_t* tile_off;
    const int32_t* seg_off;
    const int32_t* perm;  // nullptr: dense mode
    int n_expert;
    // Routed mode: the tiles of experts [e_lo, e_hi) only (one chunk of dequantised experts), whose
    // weights start at w0 / w1 with expert e_lo (0 and n_expert: every expert).
    int e_lo, e_hi;
    int n_used;
    int b_rows;
    float* dst;
    int64_t dst_stride;
    GluParams glu;
};

// A kernel's geometry: 128 weight rows x BN columns per CTA, KB blocks of 32 elements per k-step,
// STAGES raw weight and activation stages in flight; LEAN: in CTAs whose rows all lie inside their
// tensors, raw chunks are copied without per-chunk guards; A16: every row starts 16-byte aligned, and
// so every step's first byte 4-byte aligned (steps of whole words): fewer raw chunks per row (see
// MmaShape), and no per-row alignment for the decode to track.
template <int BN_, int KB_, int STAGES_, bool LEAN_, bool A16_ = false>
struct MmaCfg {
    static constexpr int BN = BN_;
    static constexpr int KB = KB_;
    static constexpr int STAGES = STAGES_;
    static constexpr bool LEAN = LEAN_;
    static constexpr bool A16 = A16_;
    static constexpr int WARPS_M = BN == 128 ? 2 : 4;
    static constexpr int WARPS_N = 8 / WARPS_M;
};
// Quantised and decoded weights: 2 blocks per step (half the barriers and per-step overhead) in 2 stages,
// lean copies. Float weights (F16 / BF16 / F32 experts; 2-4x the bytes per block) keep 1 block in 4
// stages. A16 instances exist for Q8_0 and Q4_0, whose 2-block steps are whole words (68 and 36 bytes);
// their rows are 16-byte aligned where K is a multiple of 256 (Qwen3's 2048 and 768).
template <Type W>
constexpr bool has_a16() { return W == Type::Q8_0 || W == Type::Q4_0; }
template <Type W>
constexpr bool mma_two_block_steps() { return is_quant(W) || qd::decodes(W); }
template <Type W, int BN, bool A16>
using MmaCfgFor = std::conditional_t<mma_two_block_steps<W>(), MmaCfg<BN, 2, 2, true, A16>, MmaCfg<BN, 1, 4, false>>;

// CTAs per SM that shared memory allows with `bytes` per CTA (1 KiB of each SM's reserved per CTA).
constexpr int ctas_by_smem(size_t bytes) { return static_cast<int>(kSmemPerSm / (bytes + 1024)); }

// Shared memory per CTA: up to 127 KiB (F32 experts, BN 128), within sm_80 / sm_90's opt-in limit but
// not sm_86 / sm_89's 99 KiB (there the launch fails with cudaFuncSetAttribute's error).
template <Type W, typename C>
struct MmaShape {
    // Decoded types: raw copies of a unit of 256 elements (qd::unit_bytes) every kPeriod steps (see the
    // top of this file). Others: a raw copy per step.
    static constexpr bool kDec = qd::decodes(W);
    static constexpr int kBB = kDec ? qd::block_bytes(W) : block_bytes(W);
    static constexpr int kKS = 32 * C::KB;  // k per step
    static constexpr int kLds = kKS + 8;    // BF16 per shared-memory tile row: 8 of padding
    static constexpr int kPeriod = kDec ? qd::kUnitGroups / C::KB : 1;  // k-steps per raw copy
    static constexpr int kUnitBytes = kDec ? qd::unit_bytes(W) : C::KB * kBB;  // bytes per row and raw copy
    static_assert(!kDec || (C::KB == 2 && !C::A16 && kPeriod * C::KB == qd::kUnitGroups), "decoded: 2-group steps");
    static constexpr size_t kSmemA = size_t{2} * kBM * kLds * 2;
    static constexpr size_t kSmemB = size_t{C::STAGES} * C::BN * kLds * 2;
    static constexpr size_t kSmemCols = size_t{2} * C::BN * 4;
    // Raw 16-byte chunks per row and step: those that cover KB blocks at any alignment (A16: at a
    // 4-byte aligned start, at most 12 bytes past a chunk's), and one more where rows of 4 kCR words
    // would put the decode's reads of 8 rows on 4 banks (strides 0 or 16 mod 32 words). 16-byte copies:
    // a third of the copy instructions of 4-byte words (PERF.md, 2026-11-25). A16 saves Q8_0 a chunk (5, not 6),
    // which lets 3 CTAs of 64 columns share an SM, and Q4_0 two (3, not 5). Decoded types: the chunks of
    // a unit at an even address, one more where that makes their count odd (a warp's 8 rows then start on
    // 8 different bank quads, for the decoders' byte reads) unless it costs a CTA per SM.
    static_assert(!C::A16 || (C::KB * kBB) % 4 == 0, "A16: steps of whole words");
    static constexpr int kCRmin = kDec     ? qd::unit_chunks16(W)
                                  : C::A16 ? (C::KB * kBB + 12 + 15) / 16
                                           : (C::KB * kBB + 30) / 16;
    static constexpr size_t kRawChunkBytes = size_t{C::STAGES} * kBM * 16;  // one chunk of every row and stage
    static constexpr bool kOddFits = ctas_by_smem(kSmemA + kSmemB + kSmemCols + (kCRmin | 1) * kRawChunkBytes) >=
                                     ctas_by_smem(kSmemA + kSmemB + kSmemCols + kCRmin * kRawChunkBytes);
    static constexpr int kCR = kDec ? (kOddFits ? kCRmin | 1 : kCRmin) : kCRmin % 4 == 0 ? kCRmin + 1 : kCRmin;
    static constexpr int kWR = 4 * kCR;  // raw words per row
    static constexpr int kRawChunks = kBM * kCR;
    static constexpr int kRawWords = kBM * kWR;
    static constexpr int kRpt = (kRawChunks + kMmaThreads - 1) / kMmaThreads;  // chunks per thread
    static constexpr int kDq = kBM * C::KB * 2 / kMmaThreads;  // half blocks (groups) each thread decodes per step
    // A spare word after the raw stages for qd::words_at; the decoded types' decoders read a word past
    // their unit too, where the column tables follow.
    static constexpr size_t kSmemRaw = (size_t{C::STAGES} * kRawWords + (kDec ? 0 : 4)) * 4;
    static constexpr size_t kSmem = kSmemA + kSmemB + kSmemRaw + kSmemCols;
    static_assert(kDq * kMmaThreads == kBM * C::KB * 2, "whole half blocks per thread");
};

// CTAs per SM the register budget is set for (the accumulators grow with BN), at most what fits in
// shared memory. Float weights decode from more words per row and would spill under these budgets:
// no minimum for them. Threads that decode two half blocks per step (2-block steps): 3 CTAs (80
// registers) up to 64 columns (the kernel stalls on short dependency chains, and more warps hide them;
// the fused kernels fit 80 registers since their MMA loop has no per-fragment branches), 2 CTAs (128
// registers) at 128 columns. Decoded types: 2 CTAs (their decoders' byte reads and index arithmetic
// take more registers than the byte permutes; shared memory allows no more for most of them).
template <Type W, typename C, bool FUSED>
constexpr int mma_min_ctas() {
    const bool two_halves = MmaShape<W, C>::kDq > 1;
    const int by_regs = qd::decodes(W) ? 2
                        : !is_quant(W) ? 1
                        : two_halves   ? (C::BN <= 64 ? 3 : 2)
                        : C::BN <= 32 ? 4
                        : C::BN <= 64 ? 3
                                      : 2;
    const int by_smem = ctas_by_smem(MmaShape<W, C>::kSmem);
    return std::max(1, std::min(by_regs, by_smem));
}

template <Type W, typename C, bool FUSED>
__global__ void __launch_bounds__(kMmaThreads, mma_min_ctas<W, C, FUSED>()) mma_kernel(const MmaParams p) {
    pdl_grid_sync();
    using S = MmaShape<W, C>;
    constexpr int BN = C::BN;
    constexpr int KB = C::KB;
    constexpr int kStages = C::STAGES;
    constexpr int WARPS_M = C::WARPS_M;
    constexpr int WARPS_N = C::WARPS_N;
    constexpr int kLds = S::kLds;
    constexpr int WM = kBM / WARPS_M;
    constexpr int WN = BN / WARPS_N;
    constexpr int MI = WM / 16;
    constexpr int NI = WN / 8;
    static_assert(WARPS_M * WARPS_N * 32 == kMmaThreads, "8 warps");
    static_assert(MI * 16 == WM && NI * 8 == WN && NI % 2 == 0, "warp tile");
    static_assert(!FUSED || MI % 2 == 0, "fused tiles pair up and gate fragments");
    static_assert(kStages >= 2, "the pipeline refills a stage one step after it was read");
    constexpr int kOutRows = FUSED ? kBM / 2 : kBM;
    constexpr int kHalf = kBM / 2;

    extern __shared__ __align__(16) uint8_t smem[];
    auto* a_s = reinterpret_cast<__nv_bfloat16*>(smem);
    auto* b_s = reinterpret_cast<__nv_bfloat16*>(smem + S::kSmemA);
    auto* raw_s = reinterpret_cast<uint32_t*>(smem + S::kSmemA + S::kSmemB);
    auto* col_act = reinterpret_cast<int32_t*>(smem + S::kSmemA + S::kSmemB + S::kSmemRaw);
    int32_t* col_out = col_act + BN;

    const int tid = static_cast<int>(threadIdx.x);

    // ---- which expert and which columns ----
    int expert = 0;
    int64_t col0, col_end;
    if (p.perm != nullptr) {
        const int tile = static_cast<int>(blockIdx.x) + p.tile_off[p.e_lo];
        if (tile >= p.tile_off[p.e_hi]) return;  // the whole CTA: the grid is an upper bound
        int lo = p.e_lo, hi = p.e_hi;             // tile_off[lo] <= tile < tile_off[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (p.tile_off[mid] <= tile) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        expert = lo;
        col0 = p.seg_off[lo] + static_cast<int64_t>(tile - p.tile_off[lo]) * BN;
        col_end = p.seg_off[lo + 1];
    } else {
        col0 = static_cast<int64_t>(blockIdx.x) * BN;
        col_end = p.n_cols;
    }
    const int ncols = static_cast<int>(min(static_cast<int64_t>(BN), col_end - col0));
    for (int c = tid; c < BN; c += kMmaThreads) {
        int32_t a = -1, o = -1;
        if (c < ncols) {
            const int64_t pair = p.perm != nullptr ? p.perm[col0 + c] : col0 + c;
            a = static_cast<int32_t>(p.perm != nullptr && p.b_rows == 1 ? pair / p.n_used : pair);
            o = static_cast<int32_t>(pair);
        }
        col_act[c] = a;
        col_out[c] = o;
    }
    const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kOutRows;
    const int64_t expert_off = static_cast<int64_t>(expert - p.e_lo) * p.nb2;
    // k-steps of KB blocks; with KB = 2 and an odd block count the last step has one. A raw copy holds
    // kPeriod steps (decoded types; else one).
    const int nsteps = (p.nblk + KB - 1) / KB;
    const int ncopies = (nsteps + S::kPeriod - 1) / S::kPeriod;
    auto blocks_in = [&](int step) -> int { return KB == 1 ? 1 : min(KB, p.nblk - step * KB); };

    // ---- A: raw weight chunks -> shared (cp.async, kStages deep) -> BF16 tile ----
    // This thread's 16-byte chunks, fixed per CTA: raw_off[i], the byte offset of chunk i's row (LEAN:
    // + 16 ci, its place in the row) from the CTA's first row in its tensor (rows of the tile's second
    // half are gate rows in FUSED mode: chunk indices from kGateChunk on), or -1 past the last row. A
    // row's chunks start at its copy's first byte rounded down to 16 bytes. 32-bit
    // offsets (launch_mma checks that they fit) leave the registers to the accumulators: 64-bit row
    // pointers made the Q8_0 fused kernel of 128 columns spill.
    const uint8_t* const row0_w0 = p.w0 + expert_off + n0 * p.nb1;
    const uint8_t* const row0_w1 = FUSED ? p.w1 + expert_off + n0 * p.nb1 : row0_w0;
    constexpr int kGateChunk = FUSED ? kHalf * S::kCR : S::kRawChunks;
    int32_t raw_off[S::kRpt];
#pragma unroll
    for (int i = 0; i < S::kRpt; ++i) {
        const int idx = tid + i * kMmaThreads;
        const int r = idx / S::kCR;
        const int lr = FUSED ? (r & (kHalf - 1)) : r;
        const int ci = idx - r * S::kCR;
        raw_off[i] = idx < S::kRawChunks && n0 + lr < p.n_rows
                         ? static_cast<int32_t>(lr * p.nb1) + (C::LEAN ? 16 * ci : 0)
                         : -1;
    }
    // LEAN: whether every chunk this CTA loads, in every copy, lies inside its tensor (all rows exist;
    // the lowest chunk is the first row's first, the highest the last row's last in the last copy).
    bool interior = false;
    if constexpr (C::LEAN) {
        const int64_t last_copy_bytes = static_cast<int64_t>(ncopies - 1) * S::kUnitBytes;
        auto inside = [&](const uint8_t* w, const uint8_t* lo, const uint8_t* hi) {
            const uint8_t* first = w + expert_off + n0 * p.nb1;
            const uint8_t* last = w + expert_off + (n0 + kOutRows - 1) * p.nb1 + last_copy_bytes;
            return align_down<16>(first) >= lo && align_down<16>(last) + 16 * S::kCR <= hi;
        };
        interior = n0 + kOutRows <= p.n_rows && inside(p.w0, p.lo0, p.hi0) && (!FUSED || inside(p.w1, p.lo1, p.hi1));
    }
    // Raw copy `copy` into `slot`: step `copy`'s blocks, or for the decoded types unit `copy` (the groups of
    // steps kPeriod copy .. kPeriod (copy + 1) - 1).
    auto load_raw = [&](int copy, int slot) {
        uint32_t* dst = raw_s + slot * S::kRawWords;
        const int64_t copy_bytes = static_cast<int64_t>(copy) * S::kUnitBytes;
        const uint8_t* const base0 = row0_w0 + copy_bytes;
        const uint8_t* const base1 = row0_w1 + copy_bytes;
        if constexpr (C::LEAN) {
            if (interior) {
#pragma unroll
                for (int i = 0; i < S::kRpt; ++i) {
                    const int idx = tid + i * kMmaThreads;
                    if (S::kRawChunks % kMmaThreads != 0 && idx >= S::kRawChunks) continue;
                    cp_async16(dst + 4 * idx, align_down<16>((idx >= kGateChunk ? base1 : base0) + raw_off[i]), 16);
                }
                return;
            }
        }
#pragma unroll
        for (int i = 0; i < S::kRpt; ++i) {
            const int idx = tid + i * kMmaThreads;
            if (idx >= S::kRawChunks) continue;
            auto* chunk = reinterpret_cast<uint4*>(dst + 4 * idx);
            if (raw_off[i] < 0) {
                *chunk = make_uint4(0u, 0u, 0u, 0u);
                continue;
            }
            const int ci = idx - (idx / S::kCR) * S::kCR;
            const bool g1 = idx >= kGateChunk;
            // LEAN's offsets already hold + 16 ci; align_down(x + 16 ci) = align_down(x) + 16 ci.
            const uint8_t* src = align_down<16>((g1 ? base1 : base0) + raw_off[i]) + (C::LEAN ? 0 : 16 * ci);
            const uint8_t* lo = g1 ? p.lo1 : p.lo0;
            const uint8_t* hi = g1 ? p.hi1 : p.hi0;
            if (src >= lo && src + 16 <= hi) {
                cp_async16(chunk, src, 16);
            } else {
                *chunk = load16_guarded(src, lo, hi);  // a chunk at the tensor's edge: only its own bytes
            }
        }
    };
    // Thread -> (tile rows, block of the step, half block): 2 KB half blocks per row; a thread's kDq
    // rows are kDqStride apart. Decoded types: (row tid / KB, group tid % KB of the step), both halves of
    // the group (a warp's 16 rows, 2-way bank conflicts where kCR is odd; this map kept the decoders within
    // the register budget, where a half group of each of two rows spilled up to 700 bytes). dq_lo: the
    // low bits of each row's address (its alignment is all that matters; rows past the last decode zero
    // words).
    constexpr int kUpr = S::kDec ? KB : 2 * KB;
    constexpr int kDqStride = kMmaThreads / kUpr;
    constexpr int kDqRows = S::kDec ? 1 : S::kDq;
    const int dq_row0 = tid / kUpr;
    const int dq_blk = S::kDec ? tid % KB : (tid % kUpr) >> 1;
    const int dq_half = tid & 1;
    uint32_t dq_lo[kDqRows];
#pragma unroll
    for (int j = 0; j < kDqRows; ++j) {
        const int r = dq_row0 + j * kDqStride;
        const bool g1 = FUSED && r >= kHalf;
        const int64_t gr = n0 + (FUSED ? (r & (kHalf - 1)) : r);
        dq_lo[j] = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(g1 ? p.w1 : p.w0) +
                                         static_cast<uint64_t>(expert_off + gr * p.nb1));
    }
    // Q8_0's fused kernel of 128 columns sits at the 128-register cap (2 CTAs per SM) and spills when
    // its two half-block decodes are interleaved: one after the other there.
    constexpr int kDqUnroll = W == Type::Q8_0 && BN == 128 && FUSED ? 1 : S::kDq;
    // Decoded types at 32 columns: both halves of a group decode together (registers allow it there: 96-120 of
    // 128), so that their shared head and scale reads are one: DeepSeek-V3's routed expert GEMMs (~16 tokens an
    // expert) take 32-column tiles, and ncu shows them issue-bound (PERF.md).
    constexpr int kDecHalvesUnroll = BN <= 32 ? 2 : 1;
    auto dequant = [&](int step, int slot, int st) {
        if (KB > 1 && dq_blk >= blocks_in(step)) return;  // the missing block of an odd last step
        if constexpr (S::kDec) {
            // Group q of unit `copy`, staged from byte (its address & 15) of the row's raw words, a half
            // at a time (unrolled at 32 columns only: the decoders' index arithmetic and byte reads of both
            // halves at once would not fit the register budget at 128).
            const int copy = step / S::kPeriod;
            const int q = (step - copy * S::kPeriod) * KB + dq_blk;
            const uint32_t off = (dq_lo[0] + static_cast<uint32_t>(copy) * static_cast<uint32_t>(S::kUnitBytes)) & 15u;
            const uint32_t* unit_words = raw_s + slot * S::kRawWords + dq_row0 * S::kWR;  // the unit from byte off
#pragma unroll(kDecHalvesUnroll)
            for (int h = 0; h < 2; ++h) {
                float v[16];
                qd::decode16_words<W, qd::decode_fma(W)>(unit_words, static_cast<int>(off), q, h, v);
                uint32_t packed[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) packed[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
                store_u32x8(a_s + (st * kBM + dq_row0) * kLds + 32 * dq_blk + 16 * h, packed);
            }
        } else {
            const uint32_t step_bytes = static_cast<uint32_t>(step) * static_cast<uint32_t>(KB * S::kBB);
#pragma unroll kDqUnroll
            for (int j = 0; j < S::kDq; ++j) {
                const int r = dq_row0 + j * kDqStride;
                // A16: rows start 16-byte aligned, so only the step's own offset sets the phase.
                const uint32_t row_lo = C::A16 ? 0u : dq_lo[j];
                const int off = static_cast<int>((row_lo + step_bytes) & 15u) + dq_blk * S::kBB;
                uint32_t v[8];
                decode_half_bf16<W>(raw_s + slot * S::kRawWords + r * S::kWR, off, dq_half, v);
                store_u32x8(a_s + (st * kBM + r) * kLds + 32 * dq_blk + 16 * dq_half, v);
            }
        }
    };

    // ---- B: activation rows -> BF16 tile. Columns past ncols are not loaded: MMAs of those columns read
    // stale shared memory, which only reaches accumulator columns the epilogue drops (col < ncols); the
    // missing block of an odd last step is never read by an MMA. A thread's chunks sit at fixed places
    // of every step's tile (256 threads, kCpc | 256): their element offsets in x are set once, after the
    // column table (launch_mma checks that x's elements fit 32 bits). ----
    constexpr int kCpc = S::kKS / 8;  // 16-byte chunks per column and step
    constexpr int kBpt = (BN * kCpc + kMmaThreads - 1) / kMmaThreads;
    static_assert(kMmaThreads % kCpc == 0, "a thread's chunks share their place in the column");
    const int b_q = tid % kCpc;
    int32_t b_off[kBpt];  // this thread's chunk i: x offset of its first element in step 0, or -1
    auto load_b = [&](int step, int slot) {
        if (KB > 1 && b_q >= 4 * blocks_in(step)) return;
#pragma unroll
        for (int i = 0; i < kBpt; ++i) {
            if (b_off[i] < 0) continue;
            const int idx = tid + i * kMmaThreads;
            cp_async16(b_s + slot * BN * kLds + (idx / kCpc) * kLds + b_q * 8, p.x + b_off[i] + step * S::kKS, 16);
        }
    };

    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int wm = warp % WARPS_M;
    const int wn = warp / WARPS_M;
    auto frag_row = [&](int i) -> int {
        if constexpr (FUSED) {
            return i < MI / 2 ? wm * (WM / 2) + i * 16 : kHalf + wm * (WM / 2) + (i - MI / 2) * 16;
        } else {
            return wm * WM + i * 16;
        }
    };
    // Columns of this warp's slice that exist (warp-uniform): warps with none skip their MMAs.
    const int warp_cols = ncols - wn * WN;

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
        }
    }

    // Pipeline: group g (issued in step g - kStages, or before step 0 for g < kStages) holds raw step
    // g and activation step g - 1 (group 0: raw step 0 only); step kb decodes step kb + 1 while its
    // MMAs use step kb, decoded in the step before. One barrier per step: waiting for all but the
    // newest kStages - 2 groups completes group kb + 1; the slots refilled in step kb (raw kb % kStages,
    // activations (kb - 1) % kStages) and the A buffer decoded into ((kb + 1) & 1) were last read in
    // step kb - 1, before the barrier.
    // Decoded types (kStages = 2, a raw unit per kPeriod steps in two slots, cuda/mma_units.h): before
    // step 0, group {unit 0, activations 0}, then group {unit 1}; step kb commits {activations kb + 1},
    // then {unit_copied_in_step(kb): unit (kb + 1) / kPeriod + 1 where kb + 1 is a multiple of kPeriod,
    // else nothing}. Waiting for all but the newest group at step kb completes activations kb and every
    // unit copied before step kb - 1. The unit that step kb decodes from (that of step kb + 1) was copied
    // in step kb - kPeriod or before step 0, so it is complete (kPeriod >= 2); the unit copied in step kb
    // goes into the slot of the unit two before it, whose last step (kb) was decoded in step kb - 1, before
    // the barrier. tests/cuda/test_mma_units.cpp replays this schedule on the host.
    __syncthreads();  // col_act / col_out
#pragma unroll
    for (int i = 0; i < kBpt; ++i) {
        const int c = (tid + i * kMmaThreads) / kCpc;
        b_off[i] = c < ncols ? col_act[c] * static_cast<int32_t>(p.x_stride) + b_q * 8 : -1;
    }
    if constexpr (S::kDec) {
        static_assert(kStages == 2 && S::kPeriod >= 2, "decoded: two raw units and two activation stages");
        load_raw(0, unit_slot(0));
        load_b(0, 0);
        cp_async_commit();
        if (ncopies > 1) load_raw(1, unit_slot(1));
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        load_raw(0, 0);
        cp_async_commit();
        for (int g = 0; g < kStages - 1; ++g) {
            if (g + 1 < nsteps) load_raw(g + 1, (g + 1) % kStages);
            if (g < nsteps) load_b(g, g % kStages);
            cp_async_commit();
        }
        cp_async_wait<kStages - 1>();
    }
    __syncthreads();
    dequant(0, 0, 0);

    for (int kb = 0; kb < nsteps; ++kb) {
        if constexpr (S::kDec) {
            cp_async_wait<1>();
            __syncthreads();
            if (kb + 1 < nsteps) load_b(kb + 1, (kb + 1) & 1);
            cp_async_commit();
            const int unit = unit_copied_in_step(kb, S::kPeriod, ncopies);
            if (unit >= 0) load_raw(unit, unit_slot(unit));
            cp_async_commit();
            if (kb + 1 < nsteps) dequant(kb + 1, unit_slot(unit_of_step(kb + 1, S::kPeriod)), (kb + 1) & 1);
        } else {
            cp_async_wait<kStages - 2>();
            __syncthreads();
            if (kb + kStages < nsteps) load_raw(kb + kStages, kb % kStages);
            if (kb + kStages - 1 < nsteps) load_b(kb + kStages - 1, (kb + kStages - 1) % kStages);
            cp_async_commit();
            if (kb + 1 < nsteps) dequant(kb + 1, (kb + 1) % kStages, (kb + 1) & 1);
        }
        if (warp_cols <= 0) continue;

        const __nv_bfloat16* as = a_s + (kb & 1) * kBM * kLds;
        const __nv_bfloat16* bs = b_s + (kb % kStages) * BN * kLds;
        const int n_ks = 2 * blocks_in(kb);
#pragma unroll
        for (int ks = 0; ks < 2 * KB; ++ks) {
            if (KB > 1 && ks >= n_ks) break;  // warp-uniform
            uint32_t af[MI][4];
            uint32_t bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                ldmatrix_x4(af[i], as + (frag_row(i) + (lane & 15)) * kLds + ks * 16 + (lane >> 4) * 8);
            }
#pragma unroll
            for (int jj = 0; jj < NI / 2; ++jj) {
                uint32_t r[4];
                ldmatrix_x4(r, bs + (wn * WN + jj * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * kLds + ks * 16 +
                                   ((lane >> 3) & 1) * 8);
                bf[2 * jj][0] = r[0];
                bf[2 * jj][1] = r[1];
                bf[2 * jj + 1][0] = r[2];
                bf[2 * jj + 1][1] = r[3];
            }
#pragma unroll
            for (int j = 0; j < NI; ++j) {
#pragma unroll
                for (int i = 0; i < MI; ++i) mma_bf16_16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
            }
        }
    }

    // ---- epilogue ----
    const int g = lane >> 2;
    const int c4 = lane & 3;
    constexpr int kIM = FUSED ? MI / 2 : MI;
#pragma unroll
    for (int i = 0; i < kIM; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int lr = frag_row(i) + g + (q >= 2 ? 8 : 0);
                const int col = wn * WN + j * 8 + 2 * c4 + (q & 1);
                const int64_t gr = n0 + lr;
                if (col < ncols && gr < p.n_rows) {
                    float v = acc[i][j][q];
                    if constexpr (FUSED) {
                        float gt = acc[i + MI / 2][j][q];
                        if (p.glu.bias_up != nullptr) v += p.glu.bias_up[expert * p.glu.bias_stride + gr];
                        if (p.glu.bias_gate != nullptr) gt += p.glu.bias_gate[expert * p.glu.bias_stride + gr];
                        v = glu_apply(p.glu, gt, v);
                    }
                    p.dst[static_cast<int64_t>(col_out[col]) * p.dst_stride + gr] = v;
                }
            }
        }
    }
}

template <Type W, typename C, bool FUSED>
Status launch_mma(const MmaParams& p, int64_t n_col_tiles, cudaStream_t stream) {
    constexpr size_t smem = MmaShape<W, C>::kSmem;
    static_assert(smem + 1024 <= kSmemPerSm, "one CTA must fit");
    auto kernel = mma_kernel<W, C, FUSED>;
    if (smem > 48 * 1024) {
        MOE_CUDA_RETURN_IF_ERROR(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    constexpr int kOutRows = FUSED ? kBM / 2 : kBM;
    // The kernel's 32-bit chunk offsets from a tile's first row (raw_off).
    if (p.nb1 * kOutRows + 16 * MmaShape<W, C>::kCR > int64_t{0x7FFFFFFF}) {
        return unimplemented("cuda mma_gemm: weight rows of " + std::to_string(p.nb1) +
                             " bytes are too long for the tensor-core kernel");
    }
    const int64_t row_tiles = (p.n_rows + kOutRows - 1) / kOutRows;
    if (row_tiles > static_cast<int64_t>(ops::kMaxGridYZ) || n_col_tiles > int64_t{0x7FFFFFFF}) {
        return internal_error("cuda mma_gemm: grid of " + std::to_string(n_col_tiles) + " x " +
                              std::to_string(row_tiles) + " tiles is too large");
    }
    const dim3 grid(static_cast<unsigned int>(n_col_tiles), static_cast<unsigned int>(row_tiles));
    return launch_kernel("mma_kernel", kernel, grid, kMmaThreads, smem, stream, p);
}

template <Type W, bool FUSED, bool A16>
Status launch_mma_bn(const MmaParams& p, int bn, int64_t n_col_tiles, cudaStream_t stream) {
    if (bn == 128) return launch_mma<W, MmaCfgFor<W, 128, A16>, FUSED>(p, n_col_tiles, stream);
    if (bn == 64) return launch_mma<W, MmaCfgFor<W, 64, A16>, FUSED>(p, n_col_tiles, stream);
    return launch_mma<W, MmaCfgFor<W, 32, A16>, FUSED>(p, n_col_tiles, stream);
}

// launch_mma_bn for the decoded types (qd::decodes: matmul_gemm_decoded.cu).
Status launch_mma_decoded(Type w, const MmaParams& p, bool fused, int bn, int64_t n_col_tiles, cudaStream_t stream);

// Whether every weight row of every expert starts 16-byte aligned.
inline bool rows_aligned16(const MmaParams& p) {
    const auto bits = reinterpret_cast<uintptr_t>(p.w0) | reinterpret_cast<uintptr_t>(p.w1) |
                      static_cast<uintptr_t>(p.nb1) | static_cast<uintptr_t>(p.nb2);
    return bits % 16 == 0;
}

}  // namespace moe::cuda::mm
