// The BF16 path's tile product on AMX (see matmul_bf16.h): one TDPBF16PS multiplies n_rows (<= kRows = 8
// here; the tiles take 16) weight rows by 32 elements by 16 tokens, where the AVX-512 kernel's vdpbf16ps
// does 16 tokens by 2 elements.
//
// The path's layouts are already the tiles' (no repacking):
// - A (weights): the decoded chunk, row-major BF16, kChunk elements per row: a tile of n_rows rows of 32
//   elements (64 bytes) loads with a row stride of kChunk * 2 bytes.
// - B (activations): the packed block holds pair p of token t in word p * 16 + t, which is the pair-
//   interleaved ("VNNI") layout TDPBF16PS wants for its second source: 16 pairs of 16 tokens are 16 rows
//   of 64 bytes, 64 bytes apart.
// - C (accumulators): tile[r * kTileCols + 16 b + t], so block b's F32 tile of n_rows x 16 loads and
//   stores in place with a row stride of kTileCols * 4 bytes.
// Tiles: C of blocks 0-3 in tmm0-3, A in tmm4, B alternately in tmm5 and tmm6 (so the load of the next
// block's activations does not wait for the product that reads the previous one).
//
// Rounding: the products of BF16 values are exact in F32; TDPBF16PS sums them in F32 with round to
// nearest even (denormal inputs and outputs flushed, as vdpbf16ps does), in its own order: the
// path's tolerance (F32 sums of BF16 products) covers it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "cpu/matmul_bf16.h"

namespace moe::cpu::mm::bf16 {
namespace {

// The 64-byte configuration LDTILECFG reads (palette 1).
struct alignas(64) TileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

constexpr int kK = 32;                        // elements per tile product
constexpr size_t kRowBytes = 64;              // every tile's row: 16 F32, 32 BF16 or 16 BF16 pairs
constexpr size_t kWeightStride = kChunk * 2;  // bytes between decoded rows
constexpr size_t kTileStride = kTileCols * 4;  // bytes between accumulator rows

// Configures this thread's tiles for n_rows weight rows, unless they already are.
void configure(int n_rows) {
    thread_local int configured_rows = 0;
    if (configured_rows == n_rows) return;
    TileConfig c;
    std::memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 7; ++t) {
        c.colsb[t] = kRowBytes;
        c.rows[t] = static_cast<uint8_t>(t < 5 ? n_rows : 16);  // C0-3 and A: n_rows; B: 16 pairs
    }
    _tile_loadconfig(&c);
    configured_rows = n_rows;
}

// GCC's tile intrinsics are macros that paste their tile numbers into the instruction as written, so
// the numbers are literals below, not constants.
template <int kBlocks>
void run_blocks(const uint16_t* w, int64_t kc, const uint8_t* acts, size_t block_bytes, float* tile, bool first) {
    auto* c = reinterpret_cast<uint8_t*>(tile);
    if (first) {
        _tile_zero(0);
        if constexpr (kBlocks > 1) _tile_zero(1);
        if constexpr (kBlocks > 2) _tile_zero(2);
        if constexpr (kBlocks > 3) _tile_zero(3);
    } else {
        _tile_loadd(0, c, kTileStride);
        if constexpr (kBlocks > 1) _tile_loadd(1, c + 64, kTileStride);
        if constexpr (kBlocks > 2) _tile_loadd(2, c + 128, kTileStride);
        if constexpr (kBlocks > 3) _tile_loadd(3, c + 192, kTileStride);
    }
    const auto* a = reinterpret_cast<const uint8_t*>(w);
    for (int64_t s = 0; s < kc / kK; ++s) {
        _tile_loadd(4, a + s * kK * 2, kWeightStride);
        const uint8_t* b = acts + s * (kK / 2) * kRowBytes;  // pairs 16 s .. 16 s + 15 of block 0
        // Block b's C tile += A x B_b; B alternates between tmm5 and tmm6.
        _tile_loadd(5, b, kRowBytes);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (kBlocks > 1) {
            _tile_loadd(6, b + block_bytes, kRowBytes);
            _tile_dpbf16ps(1, 4, 6);
        }
        if constexpr (kBlocks > 2) {
            _tile_loadd(5, b + 2 * block_bytes, kRowBytes);
            _tile_dpbf16ps(2, 4, 5);
        }
        if constexpr (kBlocks > 3) {
            _tile_loadd(6, b + 3 * block_bytes, kRowBytes);
            _tile_dpbf16ps(3, 4, 6);
        }
    }
    _tile_stored(0, c, kTileStride);
    if constexpr (kBlocks > 1) _tile_stored(1, c + 64, kTileStride);
    if constexpr (kBlocks > 2) _tile_stored(2, c + 128, kTileStride);
    if constexpr (kBlocks > 3) _tile_stored(3, c + 192, kTileStride);
}

static_assert(kTileCols == 4 * 16, "four C tiles of 16 tokens per job");

}  // namespace

void amx_tile(const uint16_t* w, int n_rows, int64_t kc, const uint8_t* acts, size_t block_bytes, int n_blocks,
              float* tile, bool first) {
    configure(n_rows);
    switch (n_blocks) {
        case 1: run_blocks<1>(w, kc, acts, block_bytes, tile, first); break;
        case 2: run_blocks<2>(w, kc, acts, block_bytes, tile, first); break;
        case 3: run_blocks<3>(w, kc, acts, block_bytes, tile, first); break;
        default: run_blocks<4>(w, kc, acts, block_bytes, tile, first); break;
    }
}

}  // namespace moe::cpu::mm::bf16
