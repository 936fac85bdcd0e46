// The int8 tiles of the decoding path (driver: cpu/matmul_bf16.cpp, see matmul_bf16_path.h) for the
// super-block kinds (Q2_K .. Q6_K, IQ4_XS): a job's weights are decoded to F32 and requantised to int8
// with one F32 scale per row and super-block of 256, the activations are quantised to int8 per token
// and super-block (Q8K, as the integer path's), and the products run as VNNI vpdpbusd, 64 products per
// instruction where the BF16 tiles' vdpbf16ps make 32 at the same rate. This is the approach of
// ik_llama.cpp's prefill kernels (weights repacked to 8 bits per job, many tokens per weight load).
//
// Layouts:
// - Packed activations: blocks of 16 tokens (pairs of an expert group, in group order; missing tokens
//   zero). A block holds the k int8 values (k % 256 == 0) of its 16 rows in quads, quad p (elements
//   4 p .. 4 p + 3) of token t in bytes [64 p + 4 t, 64 p + 4 t + 4), so one aligned zmm load gives
//   quad p of all 16 tokens; then float d[k / 256][16] (the tokens' Q8K scales: NaN for a super-block
//   holding inf or NaN, whose values are then 0); then int32 corr[k / 256][16] = -128 * the sum of the
//   token's values in the super-block (the weights are stored + 128, as vpdpbusd wants them unsigned).
// - Decoded weights: row r's elements of the chunk as bytes q + 128 at dst + r * kChunk, where
//   q = nearest-even(v * (127 / amax)) for the super-block's values v (the type table's to_float) and
//   their largest magnitude amax; the scale amax / 127 of super-block s of the chunk at
//   scales[r * kChunkBlocks + s] (0 where amax = 0, NaN where a value is inf or NaN).
// - Accumulators: an F32 tile [row][token] with kTileCols tokens per row, as the BF16 tiles'.
//
// Rounding: per row, token and super-block the integer dot product is exact; it is converted to F32,
// multiplied by the token's scale, then multiplied by the weight's scale and added to the tile (one
// fused rounding).
//
// Included by files compiled with AVX-512 flags: declarations and internal-linkage constants only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/matmul_bf16.h"
#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm::i8 {

// The job shape is the BF16 tiles' (the driver cuts jobs the same way for both).
using bf16::kBlockTokens;
using bf16::kChunk;
using bf16::kRows;
using bf16::kTileCols;
constexpr int64_t kChunkBlocks = kChunk / 256;  // super-blocks per chunk

static constexpr size_t act_block_bytes(int64_t k) {
    return static_cast<size_t>(k) * kBlockTokens + static_cast<size_t>(k / 256) * kBlockTokens * 8;
}

// Packs n <= 16 F32 rows of k elements (k % 256 == 0) into one activation block at dst (64-byte
// aligned, act_block_bytes(k)); rows n..15 are zero.
using PackFn = void (*)(const float* const* rows, int n, int64_t k, uint8_t* dst);

// Decodes elements [k0, k0 + kc) of n_rows <= kRows weight rows (ws bytes apart, row 0 at w) to int8
// at dst (row r at dst + r * kChunk) and scales (row r's at scales + r * kChunkBlocks). k0 and kc are
// multiples of 256; kc <= kChunk.
using DecodeFn = void (*)(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint8_t* dst,
                          float* scales);

// tile[r * kTileCols + 16 b + t] (+)= dot(decoded row r, token t of block b) over elements
// [k0, k0 + kc) of rows of k elements, for r < n_rows <= kRows and b < n_blocks <= kTileCols / 16. acts
// points at block 0; blocks are act_block_bytes(k) apart. first: start from zero.
using TileFn = void (*)(const uint8_t* w, const float* scales, int n_rows, int64_t k, int64_t k0, int64_t kc,
                        const uint8_t* acts, int n_blocks, float* tile, bool first);

struct I8Kernels {
    PackFn pack;
    DecodeFn decode[kNumWeightKinds];  // nullptr: the kind takes the BF16 tiles
    TileFn tile;
};

// Defined in matmul_i8_avx512.cpp (needs AVX-512 F/BW/VL/DQ + VNNI). Constant-initialised.
extern const I8Kernels kAvx512I8Kernels;

}  // namespace moe::cpu::mm::i8
