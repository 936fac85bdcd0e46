// The per-ISA matrix-product kernels behind cpu/matmul.cpp: one table of function pointers per
// instruction set (scalar, AVX2, AVX-512 VNNI), chosen at run time. matmul.cpp prepares the
// activations once per op, plans tiles and runs them in parallel; a kernel computes one tile.
//
// This header is included by files compiled with AVX2 / AVX-512 flags. Everything defined here has
// internal linkage (static) or is a plain declaration, so no out-of-line copy compiled for a wide ISA
// can be picked by the linker for code that runs on a narrower CPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::cpu::mm {

// The weight types the kernels handle, as a dense table index: float kinds, then the 32-element
// block kinds (Q8A activations), then the 256-element super-block kinds (Q8K activations).
enum WeightKind : int {
    kF32 = 0, kF16, kBF16,
    kQ8_0, kQ4_0, kMXFP4, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL,
    kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS,
    kNumWeightKinds
};

static constexpr bool is_quantized_kind(WeightKind k) { return k >= kQ8_0; }
static constexpr bool is_superblock_kind(WeightKind k) { return k >= kQ2_K; }

// ---- prepared activations of the 32-element block kinds ----
//
// Quantised weights multiply "Q8A" activation rows: the F32 row is quantised in blocks of 32 to int8
// with a float scale (q = nearest-even(x * 127 / amax), d = amax / 127; identical on every ISA). A row
// of k elements (k % 32 == 0) holds nbp = k/32 rounded up to a multiple of 4 blocks (the AVX-512
// kernels take blocks in quads; padding blocks are all zero):
//   int8  qs[nbp * 32]    at offset 0 (64-byte aligned)
//   float d[nbp]          at offset nbp * 32
//   int32 corr[nbp]       at offset nbp * 36: q8a_corr_factor(kind) * sum(qs of the block)
// For most kinds the factor is -offset, where `offset` is the bias that makes the weight kind's
// integer values unsigned for u8 x s8 products (vpdpbusd, pmaddubsw): dot(w + offset, x) + corr =
// dot(w, x); kernels that multiply signed values directly ignore corr. Q4_1 and Q5_1 (x = q d + m,
// q unsigned already) take the plain block sum instead: their min contributes m * d_x * sum(qs), as
// ggml's Q8_1 blocks carry it.
//
// The order of qs follows the weights: Q4_0 and MXFP4 store elements 0-15 of a block in the low
// nibbles of its 16 bytes and 16-31 in the high ones, so rows are interleaved in quads of blocks: quad
// g holds the first halves of blocks 4g..4g+3 (16 bytes each) in bytes [128 g, 128 g + 64) and the
// second halves in [128 g + 64, 128 g + 128). Then one zmm of low nibbles (or high nibbles) of four
// weight blocks lines up with one aligned zmm of activations, each 128-bit lane holding one block.
// Q8_0 uses the same order (its first and second 16 bytes play the low and high nibbles' part), and so
// do Q4_1, Q5_0, Q5_1 and IQ4_NL (nibbles as Q4_0; the fifth bits of Q5_x by element).
static constexpr int64_t q8a_blocks(int64_t k) { return ((k / 32) + 3) & ~int64_t{3}; }
static constexpr size_t q8a_row_bytes(int64_t k) {
    return (static_cast<size_t>(q8a_blocks(k)) * 40 + 63) & ~size_t{63};
}
static constexpr int32_t q8a_offset(WeightKind k) {
    switch (k) {
        case kQ8_0: return 128;
        case kQ4_0: return 8;
        case kMXFP4: return 12;
        case kQ5_0: return 16;
        case kIQ4_NL: return 128;
        default: return 0;
    }
}
static constexpr int32_t q8a_corr_factor(WeightKind k) { return k == kQ4_1 || k == kQ5_1 ? 1 : -q8a_offset(k); }
// Byte offset in qs of half h (0: elements 0-15, 1: elements 16-31) of block b.
static constexpr int64_t q8a_half(int64_t b, int h) { return (b / 4) * 128 + h * 64 + (b % 4) * 16; }

// ---- prepared activations of the super-block kinds (Q2_K .. Q6_K, IQ4_XS) ----
//
// "Q8K" rows, as the activations of ggml's K-quant dot products (Q8_K): the F32 row (k % 256 == 0) is
// quantised per super-block of 256 to int8 with one float scale (q = nearest-even(x * 127 / amax),
// d = amax / 127, the Q8A formula over 256 values; identical on every ISA), in element order, with
// the sums of each 16 values (what the K-quants' mins and offsets multiply):
//   int8  qs[nb * 256]    at offset 0 (64-byte aligned)
//   float d[nb]           at offset nb * 256
//   int16 bsums[nb * 16]  at offset nb * 260
// A super-block holding inf or NaN gets q = 0, bsums = 0 and d = NaN.
static constexpr size_t q8k_row_bytes(int64_t k) {
    return (static_cast<size_t>(k / 256) * 292 + 63) & ~size_t{63};
}

// Float weights (F32, F16, BF16) multiply F32 activation rows padded with zeros to a multiple of 16
// elements (so vector loads of the activations never need a mask).
static constexpr size_t f32a_row_bytes(int64_t k) { return (static_cast<size_t>(k) * 4 + 63) & ~size_t{63}; }

// Quantises one F32 row of k elements (k % 32 == 0) into a Q8A row for weights of `kind` at dst
// (q8a_row_bytes(k) bytes).
using QuantizeQ8aFn = void (*)(const float* x, int64_t k, WeightKind kind, uint8_t* dst);
// Quantises one F32 row of k elements (k % 256 == 0) into a Q8K row at dst (q8k_row_bytes(k) bytes).
using QuantizeQ8kFn = void (*)(const float* x, int64_t k, uint8_t* dst);

// One tile: out[oc * out_stride + r] = dot(weight row r, activation row ac) for r < n_rows and
// c < n_cols, where ac = act_idx ? act_idx[c] : c and oc = out_idx ? out_idx[c] : c. The activation
// rows are prepared for the weight kind (Q8A with its offset, Q8K, or padded F32).
struct GemmArgs {
    const uint8_t* w;         // weight row 0 of the tile
    size_t w_stride;          // bytes between weight rows
    int64_t n_rows;
    int64_t k;                // elements per row
    const uint8_t* act;       // prepared activation row 0
    size_t act_stride;        // bytes between prepared rows
    const int32_t* act_idx;   // n_cols row indices into act, or nullptr for 0..n_cols-1
    int64_t n_cols;
    float* out;
    int64_t out_stride;       // floats between output columns
    const int32_t* out_idx;   // n_cols column indices into out, or nullptr for 0..n_cols-1
    const uint8_t* next_w;    // the weight row the caller reads after this tile (prefetched), or nullptr
};
using GemmFn = void (*)(const GemmArgs& a);

struct KernelTable {
    const char* name;
    QuantizeQ8aFn quantize_q8a;
    QuantizeQ8kFn quantize_q8k;
    GemmFn gemm[kNumWeightKinds];
};

// ---- tiling of a GemmArgs call into micro-kernels (shared by the SIMD families) ----

// A micro-kernel: rows [0, R) of the weights at w (ws bytes apart) against C prepared activation rows
// x[0..C), writing out[c][r]; pf: bytes from a weight row to the row prefetched while it is read.
using MicroFn = void (*)(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out,
                        int64_t k);

// Bytes from row r0 of the tile to the row prefetched while rows r0.. are read: whole groups of
// kRows rows ahead in this thread's stream of weights (the tile's rows, then the caller's next tile),
// at least kPrefetchBytes ahead so that short rows still cover the DRAM latency. Addresses are
// computed as integers: the target may lie outside every array (prefetches never fault).
static constexpr size_t kPrefetchBytes = 4096;
template <int kRows>
static intptr_t prefetch_offset(const GemmArgs& a, int64_t r0) {
    const size_t group_bytes = kRows * a.w_stride;
    const size_t groups = group_bytes >= kPrefetchBytes ? 1 : (kPrefetchBytes + group_bytes - 1) / group_bytes;
    const int64_t target = r0 + static_cast<int64_t>(groups) * kRows;  // row index in the stream
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.w);
    const uintptr_t to =
        target < a.n_rows || a.next_w == nullptr
            ? base + static_cast<uintptr_t>(target) * a.w_stride
            : reinterpret_cast<uintptr_t>(a.next_w) + static_cast<uintptr_t>(target - a.n_rows) * a.w_stride;
    return static_cast<intptr_t>(to - (base + static_cast<uintptr_t>(r0) * a.w_stride));
}

// Rows outer, tokens inner: the kRows weight rows of one step stay in L1 while every token of the
// tile passes over them. micro[R - 1][C - 1] is the micro-kernel for an R x C corner of the tile.
template <int kRows, int kCols>
static void tile_gemm(const GemmArgs& a, const MicroFn (&micro)[kRows][kCols]) {
    for (int64_t r0 = 0; r0 < a.n_rows; r0 += kRows) {
        const int nr = static_cast<int>(a.n_rows - r0 < kRows ? a.n_rows - r0 : kRows);
        const uint8_t* w = a.w + r0 * a.w_stride;
        const intptr_t pf = prefetch_offset<kRows>(a, r0);
        for (int64_t c0 = 0; c0 < a.n_cols; c0 += kCols) {
            const int nc = static_cast<int>(a.n_cols - c0 < kCols ? a.n_cols - c0 : kCols);
            const uint8_t* x[kCols];
            float* out[kCols];
            for (int c = 0; c < nc; ++c) {
                const int64_t ac = a.act_idx ? a.act_idx[c0 + c] : c0 + c;
                const int64_t oc = a.out_idx ? a.out_idx[c0 + c] : c0 + c;
                x[c] = a.act + ac * a.act_stride;
                out[c] = a.out + oc * a.out_stride + r0;
            }
            micro[nr - 1][nc - 1](w, a.w_stride, pf, x, out, a.k);
        }
    }
}

// The super-block kinds' kernels and the Q8K quantiser of each family, in matmul_q8k_<family>.cpp;
// the family's table (below) takes their addresses.
using GemmSig = void(const GemmArgs& a);
using QuantizeQ8kSig = void(const float* x, int64_t k, uint8_t* dst);
namespace scalar {
QuantizeQ8kSig quantize_q8k;
GemmSig gemm_q2_k, gemm_q3_k, gemm_q4_k, gemm_q5_k, gemm_q6_k, gemm_iq4_xs;
}  // namespace scalar
namespace avx2 {
QuantizeQ8kSig quantize_q8k;
GemmSig gemm_q2_k, gemm_q3_k, gemm_q4_k, gemm_q5_k, gemm_q6_k, gemm_iq4_xs;
}  // namespace avx2
namespace avx512 {
QuantizeQ8kSig quantize_q8k;
GemmSig gemm_q2_k, gemm_q3_k, gemm_q4_k, gemm_q5_k, gemm_q6_k, gemm_iq4_xs;
}  // namespace avx512

// Defined in matmul_scalar.cpp, matmul_avx2.cpp (needs AVX2+FMA+F16C) and matmul_avx512.cpp (needs
// AVX-512 F/BW/VL/DQ + VNNI). Constant-initialised: no code of a wide ISA runs before it is chosen.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

}  // namespace moe::cpu::mm
