// The BF16 path of the CPU matrix products: activations converted to BF16 once per op, quantised
// weights decoded to BF16 per chunk of a few weight rows, products accumulated in F32 by AVX-512 BF16
// dot products (vdpbf16ps). It trades the integer path's per-block scaling and per-token unpacking
// for one decode per weight element and job, so it pays where many tokens share each weight row
// (prefill expert products, large-batch MUL_MAT); bf16path::wanted (matmul_bf16_path.h) decides per op.
//
// Layouts:
// - Packed activations: blocks of 16 tokens (pairs of an expert group, in group order; missing tokens
//   zero). A block holds the k elements (k % 32 == 0) of its 16 rows as BF16 pairs, pair p of token
//   t in the 32-bit word p * 16 + t, so one aligned zmm load gives pair p of all 16 tokens.
// - Decoded weights: row-major BF16, kChunk elements per row; a kernel broadcasts one pair of a row.
// - Accumulators: an F32 tile [row][token] with kTileCols tokens per row.
//
// BF16 rounding: both operands are rounded to nearest even with subnormal inputs flushed (the
// instructions' fixed DAZ / FTZ behaviour); their products are exact in F32; sums are rounded in F32.
//
// Included by files compiled with AVX-512 flags: declarations and internal-linkage constants only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm::bf16 {

constexpr int64_t kBlockTokens = 16;  // tokens per packed activation block
constexpr int64_t kChunk = 512;       // weight elements decoded per row and step (a multiple of 256)
constexpr int kRows = 8;              // weight rows per decode and kernel step
constexpr int64_t kTileCols = 64;     // tokens per job (4 blocks), the accumulator tile's row length

static constexpr size_t act_block_bytes(int64_t k) { return static_cast<size_t>(k) * 2 * kBlockTokens; }

// Packs n <= 16 F32 rows of k elements (k % 32 == 0) into one activation block at dst (64-byte
// aligned, act_block_bytes(k)); rows n..15 are zero.
using PackFn = void (*)(const float* const* rows, int n, int64_t k, uint8_t* dst);

// Decodes elements [k0, k0 + kc) of n_rows <= kRows weight rows (ws bytes apart, row 0 at w) to BF16
// at dst, row r at dst + r * kChunk. k0 and kc are multiples of the kind's block size; kc <= kChunk.
using DecodeFn = void (*)(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst);

// tile[r * kTileCols + 16 b + t] (+)= dot(decoded row r, token t of block b) over the kc (even)
// elements of this chunk, for r < n_rows <= kRows and b < n_blocks <= kTileCols / 16. acts points at
// the chunk's first pair in block 0; blocks are block_bytes apart. first: start from zero.
using TileFn = void (*)(const uint16_t* w, int n_rows, int64_t kc, const uint8_t* acts, size_t block_bytes,
                        int n_blocks, float* tile, bool first);

struct Bf16Kernels {
    PackFn pack;
    DecodeFn decode[kNumWeightKinds];  // nullptr: the kind has no BF16 decoder (the float kinds)
    TileFn tile;
};

// Defined in matmul_bf16_avx512.cpp (needs AVX-512 F/BW/VL/DQ + BF16). Constant-initialised.
extern const Bf16Kernels kAvx512Bf16Kernels;

// The same tile product on AMX tiles (matmul_bf16_amx.cpp; needs AMX-TILE + AMX-BF16 and the OS's leave,
// cpu_features().amx). kc % 32 == 0. Leaves the calling thread's tiles configured (the next call on
// the thread with the same n_rows skips the configuration).
void amx_tile(const uint16_t* w, int n_rows, int64_t kc, const uint8_t* acts, size_t block_bytes, int n_blocks,
              float* tile, bool first);

}  // namespace moe::cpu::mm::bf16
