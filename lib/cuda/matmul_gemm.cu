// Large-batch matrix products on the tensor cores (BF16 inputs, F32 accumulation and output).
//
// mma_gemm: our own kernel, used for every expert product (grouped by expert, see matmul_moe.cu) and
// for dense products of quantised / F16 weights at moderate batch sizes. A CTA of 8 warps computes a
// 128-row x BN-column tile with mma.sync m16n8k16; per k-step of KB quantised blocks per row (MmaCfg:
// quantised weights take steps of 2 blocks with 2 stages, float weights steps of 1 with 4 stages):
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
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {
namespace {

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
// Quantised weights: 2 blocks per step (half the barriers and per-step overhead) in 2 stages, lean
// copies. Float weights (F16 / BF16 / F32 experts; 2-4x the bytes per block) keep 1 block in 4 stages.
// A16 instances exist for Q8_0 and Q4_0, whose 2-block steps are whole words (68 and 36 bytes); their
// rows are 16-byte aligned where K is a multiple of 256 (Qwen3's 2048 and 768).
template <Type W>
constexpr bool has_a16() { return W == Type::Q8_0 || W == Type::Q4_0; }
template <Type W, int BN, bool A16>
using MmaCfgFor = std::conditional_t<is_quant(W), MmaCfg<BN, 2, 2, true, A16>, MmaCfg<BN, 1, 4, false>>;

// Shared memory per CTA: up to 127 KiB (F32 experts, BN 128), within sm_80 / sm_90's opt-in limit but
// not sm_86 / sm_89's 99 KiB (there the launch fails with cudaFuncSetAttribute's error).
template <Type W, typename C>
struct MmaShape {
    static constexpr int kBB = block_bytes(W);
    static constexpr int kKS = 32 * C::KB;  // k per step
    static constexpr int kLds = kKS + 8;    // BF16 per shared-memory tile row: 8 of padding
    // Raw 16-byte chunks per row and step: those that cover KB blocks at any alignment (A16: at a
    // 4-byte aligned start, at most 12 bytes past a chunk's), and one more where rows of 4 kCR words
    // would put the decode's reads of 8 rows on 4 banks (strides 0 or 16 mod 32 words). 16-byte copies:
    // a third of the copy instructions of 4-byte words (PERF.md, 2026-11-25). A16 saves Q8_0 a chunk (5, not 6),
    // which lets 3 CTAs of 64 columns share an SM, and Q4_0 two (3, not 5).
    static_assert(!C::A16 || (C::KB * kBB) % 4 == 0, "A16: steps of whole words");
    static constexpr int kCRmin = C::A16 ? (C::KB * kBB + 12 + 15) / 16 : (C::KB * kBB + 30) / 16;
    static constexpr int kCR = kCRmin % 4 == 0 ? kCRmin + 1 : kCRmin;
    static constexpr int kWR = 4 * kCR;  // raw words per row
    static constexpr int kRawChunks = kBM * kCR;
    static constexpr int kRawWords = kBM * kWR;
    static constexpr int kRpt = (kRawChunks + kMmaThreads - 1) / kMmaThreads;  // chunks per thread
    static constexpr int kDq = kBM * C::KB * 2 / kMmaThreads;  // half blocks each thread decodes per step
    static constexpr size_t kSmemA = size_t{2} * kBM * kLds * 2;
    static constexpr size_t kSmemB = size_t{C::STAGES} * C::BN * kLds * 2;
    static constexpr size_t kSmemRaw = (size_t{C::STAGES} * kRawWords + 4) * 4;
    static constexpr size_t kSmem = kSmemA + kSmemB + kSmemRaw + size_t{2} * C::BN * 4;
    static_assert(kDq * kMmaThreads == kBM * C::KB * 2, "whole half blocks per thread");
};

// CTAs per SM the register budget is set for (the accumulators grow with BN), at most what fits in
// shared memory. Float weights decode from more words per row and would spill under these budgets:
// no minimum for them. Threads that decode two half blocks per step (2-block steps): 3 CTAs (80
// registers) up to 64 columns (the kernel stalls on short dependency chains, and more warps hide them;
// the fused kernels fit 80 registers since their MMA loop has no per-fragment branches), 2 CTAs (128
// registers) at 128 columns.
template <Type W, typename C, bool FUSED>
constexpr int mma_min_ctas() {
    const bool two_halves = MmaShape<W, C>::kDq > 1;
    const int by_regs = !is_quant(W)  ? 1
                        : two_halves  ? (C::BN <= 64 ? 3 : 2)
                        : C::BN <= 32 ? 4
                        : C::BN <= 64 ? 3
                                      : 2;
    const int by_smem = static_cast<int>(kSmemPerSm / (MmaShape<W, C>::kSmem + 1024));
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
    // k-steps of KB blocks; with KB = 2 and an odd block count the last step has one.
    const int nsteps = (p.nblk + KB - 1) / KB;
    auto blocks_in = [&](int step) -> int { return KB == 1 ? 1 : min(KB, p.nblk - step * KB); };

    // ---- A: raw weight chunks -> shared (cp.async, kStages deep) -> BF16 tile ----
    // This thread's 16-byte chunks, fixed per CTA: raw_off[i], the byte offset of chunk i's row (LEAN:
    // + 16 ci, its place in the row) from the CTA's first row in its tensor (rows of the tile's second
    // half are gate rows in FUSED mode: chunk indices from kGateChunk on), or -1 past the last row. A
    // row's chunks start at its step's first byte rounded down to 16 bytes. 32-bit
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
    // LEAN: whether every chunk this CTA loads, in every step, lies inside its tensor (all rows exist;
    // the lowest chunk is the first row's first, the highest the last row's last in the last step).
    bool interior = false;
    if constexpr (C::LEAN) {
        const int64_t last_step_bytes = static_cast<int64_t>(nsteps - 1) * (KB * S::kBB);
        auto inside = [&](const uint8_t* w, const uint8_t* lo, const uint8_t* hi) {
            const uint8_t* first = w + expert_off + n0 * p.nb1;
            const uint8_t* last = w + expert_off + (n0 + kOutRows - 1) * p.nb1 + last_step_bytes;
            return align_down<16>(first) >= lo && align_down<16>(last) + 16 * S::kCR <= hi;
        };
        interior = n0 + kOutRows <= p.n_rows && inside(p.w0, p.lo0, p.hi0) && (!FUSED || inside(p.w1, p.lo1, p.hi1));
    }
    auto load_raw = [&](int step, int slot) {
        uint32_t* dst = raw_s + slot * S::kRawWords;
        const int64_t step_bytes = static_cast<int64_t>(step) * (KB * S::kBB);
        const uint8_t* const base0 = row0_w0 + step_bytes;
        const uint8_t* const base1 = row0_w1 + step_bytes;
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
    // rows are kDqStride apart. dq_lo: the low bits of each row's address (its alignment is all that
    // matters; rows past the last decode zero words).
    constexpr int kUpr = 2 * KB;
    constexpr int kDqStride = kMmaThreads / kUpr;
    const int dq_row0 = tid / kUpr;
    const int dq_blk = (tid % kUpr) >> 1;
    const int dq_half = tid & 1;
    uint32_t dq_lo[S::kDq];
#pragma unroll
    for (int j = 0; j < S::kDq; ++j) {
        const int r = dq_row0 + j * kDqStride;
        const bool g1 = FUSED && r >= kHalf;
        const int64_t gr = n0 + (FUSED ? (r & (kHalf - 1)) : r);
        dq_lo[j] = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(g1 ? p.w1 : p.w0) +
                                         static_cast<uint64_t>(expert_off + gr * p.nb1));
    }
    // Q8_0's fused kernel of 128 columns sits at the 128-register cap (2 CTAs per SM) and spills when
    // its two half-block decodes are interleaved: one after the other there.
    constexpr int kDqUnroll = W == Type::Q8_0 && BN == 128 && FUSED ? 1 : S::kDq;
    auto dequant = [&](int step, int slot, int st) {
        if (KB > 1 && dq_blk >= blocks_in(step)) return;  // the missing block of an odd last step
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
    __syncthreads();  // col_act / col_out
#pragma unroll
    for (int i = 0; i < kBpt; ++i) {
        const int c = (tid + i * kMmaThreads) / kCpc;
        b_off[i] = c < ncols ? col_act[c] * static_cast<int32_t>(p.x_stride) + b_q * 8 : -1;
    }
    load_raw(0, 0);
    cp_async_commit();
    for (int g = 0; g < kStages - 1; ++g) {
        if (g + 1 < nsteps) load_raw(g + 1, (g + 1) % kStages);
        if (g < nsteps) load_b(g, g % kStages);
        cp_async_commit();
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();
    dequant(0, 0, 0);

    for (int kb = 0; kb < nsteps; ++kb) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (kb + kStages < nsteps) load_raw(kb + kStages, kb % kStages);
        if (kb + kStages - 1 < nsteps) load_b(kb + kStages - 1, (kb + kStages - 1) % kStages);
        cp_async_commit();
        if (kb + 1 < nsteps) dequant(kb + 1, (kb + 1) % kStages, (kb + 1) & 1);
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

// Whether every weight row of every expert starts 16-byte aligned.
bool rows_aligned16(const MmaParams& p) {
    const auto bits = reinterpret_cast<uintptr_t>(p.w0) | reinterpret_cast<uintptr_t>(p.w1) |
                      static_cast<uintptr_t>(p.nb1) | static_cast<uintptr_t>(p.nb2);
    return bits % 16 == 0;
}

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
// cover 2 KiB). Rows of experts whose counts entry is 0 are skipped (counts == nullptr: none are).
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
    qd::decode32<W>(w + e * nb2 + (r - e * n_rows) * nb1 + static_cast<int64_t>(g / kGroups) * qd::block_bytes(W),
                    g % kGroups, v);
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
