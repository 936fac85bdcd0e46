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

// The weight types the kernels handle, as a dense table index.
enum WeightKind : int { kF32 = 0, kF16, kBF16, kQ8_0, kQ4_0, kMXFP4, kNumWeightKinds };

static constexpr bool is_quantized_kind(WeightKind k) { return k >= kQ8_0; }

// ---- prepared activations ----
//
// Quantised weights multiply "Q8A" activation rows: the F32 row is quantised in blocks of 32 to int8
// with a float scale (q = nearest-even(x * 127 / amax), d = amax / 127; identical on every ISA). A row
// of k elements (k % 32 == 0) holds nbp = k/32 rounded up to a multiple of 4 blocks (the AVX-512
// kernels take blocks in quads; padding blocks are all zero):
//   int8  qs[nbp * 32]    at offset 0 (64-byte aligned)
//   float d[nbp]          at offset nbp * 32
//   int32 corr[nbp]       at offset nbp * 36: -offset * sum(qs of the block)
// `offset` is the bias that makes the weight kind's integer values unsigned for u8 x s8 products
// (vpdpbusd, pmaddubsw): dot(w + offset, x) + corr = dot(w, x). Kernels that multiply signed values
// directly ignore corr.
//
// The order of qs follows the weights: Q4_0 and MXFP4 store elements 0-15 of a block in the low
// nibbles of its 16 bytes and 16-31 in the high ones, so rows are interleaved in quads of blocks: quad
// g holds the first halves of blocks 4g..4g+3 (16 bytes each) in bytes [128 g, 128 g + 64) and the
// second halves in [128 g + 64, 128 g + 128). Then one zmm of low nibbles (or high nibbles) of four
// weight blocks lines up with one aligned zmm of activations, each 128-bit lane holding one block.
// Q8_0 uses the same order (its first and second 16 bytes play the low and high nibbles' part).
static constexpr int64_t q8a_blocks(int64_t k) { return ((k / 32) + 3) & ~int64_t{3}; }
static constexpr size_t q8a_row_bytes(int64_t k) {
    return (static_cast<size_t>(q8a_blocks(k)) * 40 + 63) & ~size_t{63};
}
static constexpr int32_t q8a_offset(WeightKind k) { return k == kQ8_0 ? 128 : k == kQ4_0 ? 8 : k == kMXFP4 ? 12 : 0; }
// Byte offset in qs of half h (0: elements 0-15, 1: elements 16-31) of block b.
static constexpr int64_t q8a_half(int64_t b, int h) { return (b / 4) * 128 + h * 64 + (b % 4) * 16; }

// Float weights (F32, F16, BF16) multiply F32 activation rows padded with zeros to a multiple of 16
// elements (so vector loads of the activations never need a mask).
static constexpr size_t f32a_row_bytes(int64_t k) { return (static_cast<size_t>(k) * 4 + 63) & ~size_t{63}; }

// Quantises one F32 row of k elements (k % 32 == 0) into a Q8A row for weights of `kind` at dst
// (q8a_row_bytes(k) bytes).
using QuantizeQ8aFn = void (*)(const float* x, int64_t k, WeightKind kind, uint8_t* dst);

// One tile: out[oc * out_stride + r] = dot(weight row r, activation row ac) for r < n_rows and
// c < n_cols, where ac = act_idx ? act_idx[c] : c and oc = out_idx ? out_idx[c] : c. The activation
// rows are prepared for the weight kind (Q8A with its offset, or padded F32).
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
    GemmFn gemm[kNumWeightKinds];
};

// Defined in matmul_scalar.cpp, matmul_avx2.cpp (needs AVX2+FMA+F16C) and matmul_avx512.cpp (needs
// AVX-512 F/BW/VL/DQ + VNNI). Constant-initialised: no code of a wide ISA runs before it is chosen.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

}  // namespace moe::cpu::mm
