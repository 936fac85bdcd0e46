// AVX-512 VNNI kernels of the int8 tiles (see matmul_i8.h): activation packing, weight decoding with
// requantisation to int8, and the vpdpbusd tile kernel. Compiled with AVX-512 F/BW/VL/DQ + VNNI,
// chosen at run time.
//
// The tile kernel keeps 8 weight rows x 2 blocks of 16 tokens of int32 accumulators in registers
// (16 zmm) for one super-block: per quad of elements it loads the quad of 16 tokens from each block
// and broadcasts the row's quad from the decoded chunk, so each activation load serves 8 rows and
// each broadcast 32 tokens. At the super-block's end the sums are scaled into the F32 tile in memory.

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (GCC bug
// 105593, fixed in 13); the warning points into the header, so it is silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "cpu/matmul_decode_avx512.h"
#include "cpu/matmul_i8.h"

namespace moe::cpu::mm::i8 {
namespace {

// ---- activation packing ----

void pack(const float* const* rows, int n, int64_t k, uint8_t* dst) {
    constexpr size_t kRowBytes = q8k_row_bytes(256);  // one super-block as a Q8K row: qs, d, bsums
    alignas(64) uint8_t q8k[kBlockTokens][kRowBytes];
    const int64_t nb = k / 256;
    auto* d = reinterpret_cast<float*>(dst + k * kBlockTokens);
    auto* corr = reinterpret_cast<int32_t*>(dst + k * kBlockTokens + nb * kBlockTokens * 4);
    for (int64_t s = 0; s < nb; ++s) {
        for (int t = 0; t < kBlockTokens; ++t) {
            if (t < n) {
                // The integer path's quantiser, so both paths see the same activations.
                avx512::quantize_q8k(rows[t] + 256 * s, 256, q8k[t]);
                float dt;
                std::memcpy(&dt, q8k[t] + 256, 4);
                int16_t bsums[16];
                std::memcpy(bsums, q8k[t] + 260, sizeof(bsums));
                int32_t sum = 0;
                for (const int16_t b : bsums) sum += b;
                d[s * kBlockTokens + t] = dt;
                corr[s * kBlockTokens + t] = -128 * sum;
            } else {
                d[s * kBlockTokens + t] = 0.0f;
                corr[s * kBlockTokens + t] = 0;
            }
        }
        for (int c = 0; c < 4; ++c) {  // quads 16 c .. 16 c + 15 of the super-block
            __m512i r[16];
            for (int t = 0; t < kBlockTokens; ++t) {
                r[t] = t < n ? _mm512_load_si512(q8k[t] + 64 * c) : _mm512_setzero_si512();
            }
            dec::transpose16(r);
            uint8_t* out = dst + (s * 64 + 16 * c) * 64;
            for (int j = 0; j < 16; ++j) _mm512_store_si512(out + 64 * j, r[j]);
        }
    }
}

// ---- weight decoding ----

// The 16 zmm of F32 values of one super-block to bytes q + 128 at dst; returns the scale (see
// matmul_i8.h). Same operations as the Q8K quantiser: inv = 127 / amax, q = nearest-even(v * inv).
//
// Non-finite values come only from a non-finite fp16 scale of the block (finite scales times these
// small integers cannot overflow), and every value of the super-block uses that scale, so all of them
// are then inf or NaN (inf times a zero is NaN): the max below, which may drop a NaN operand for the
// other one, still ends inf or NaN.
inline float requantise(const __m512 (&v)[16], uint8_t* dst) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, v[i]));
    const float m = _mm512_reduce_max_ps(amax);
    const bool finite = m <= std::numeric_limits<float>::max();  // false for inf and NaN
    const __m512 inv = _mm512_set1_ps(finite && m > 0.0f ? 127.0f / m : 0.0f);
    // 64 values at a time: int32 -> int16 -> int8 with saturation (|q| <= 127 anyway); the packs work
    // within 128-bit lanes, so lane j of the result holds elements 4 j .. 4 j + 3 of each of the four
    // inputs, put back in order by one dword permutation.
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int i = 0; i < 16; i += 4) {
        __m512i q[4];
        for (int j = 0; j < 4; ++j) q[j] = _mm512_cvtps_epi32(_mm512_mul_ps(v[i + j], inv));
        const __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
        _mm512_storeu_si512(dst + 16 * i, _mm512_xor_si512(_mm512_permutexvar_epi32(order, p), bias));
    }
    return finite ? m / 127.0f : std::numeric_limits<float>::quiet_NaN();
}

template <class K>
void decode(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint8_t* dst, float* scales) {
    using B = typename K::Block;
    constexpr size_t kChunkBytes = kChunkBlocks * sizeof(B);
    for (int r = 0; r < n_rows; ++r) {
        const uint8_t* row = w + r * ws + (k0 / 256) * sizeof(B);
        for (int64_t b = 0; b < kc / 256; ++b) {
            const size_t at = static_cast<size_t>(b) * sizeof(B);
            // The same row's next chunk (a row is decoded chunk after chunk), once per cache line.
            for (size_t line = (at + 63) / 64 * 64; line < at + sizeof(B); line += 64) {
                _mm_prefetch(reinterpret_cast<const char*>(row + line + kChunkBytes), _MM_HINT_T0);
            }
            const auto& blk = *reinterpret_cast<const B*>(row + at);
            __m512 v[16];
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) K::group(blk, g, v[2 * g], v[2 * g + 1]);
            scales[r * kChunkBlocks + b] = requantise(v, dst + r * kChunk + 256 * b);
        }
    }
}

// ---- tile kernel ----

// acc += vpdpbusd(u, s). GCC 12 allocates the intrinsic's accumulators badly in this kernel (a register
// copy per product, and stack spills); as an instruction that updates its operand in place they stay
// in registers.
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

// Super-block sb of the activations against decoded super-block s of the chunk (w: its first byte of
// row 0, scales: row 0's scale of it), into the tile.
template <int R, int V>
void micro(const uint8_t* w, const float* scales, int64_t k, int64_t sb, const uint8_t* acts, float* tile,
           bool first) {
    const size_t block_bytes = act_block_bytes(k);
    const uint8_t* a0 = acts + sb * 256 * kBlockTokens;
    const auto* wq = reinterpret_cast<const int32_t*>(w);  // quad p of row r: wq[r * kChunk / 4 + p]
    // The first quad's products start the sums (zeroed accumulators that GCC would share a register).
    __m512i acc[R][V];
    {
        __m512i a[V];
        for (int v = 0; v < V; ++v) a[v] = _mm512_load_si512(a0 + v * block_bytes);
        for (int r = 0; r < R; ++r) {
            const __m512i b = _mm512_set1_epi32(wq[r * (kChunk / 4)]);
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b, a[v]);
        }
    }
    for (int p = 1; p < 64; ++p) {
        __m512i a[V];
        for (int v = 0; v < V; ++v) a[v] = _mm512_load_si512(a0 + v * block_bytes + 64 * p);
        for (int r = 0; r < R; ++r) {
            const __m512i b = _mm512_set1_epi32(wq[r * (kChunk / 4) + p]);
            for (int v = 0; v < V; ++v) acc[r][v] = dpbusd(acc[r][v], b, a[v]);
        }
    }
    const uint8_t* d = acts + k * kBlockTokens + sb * kBlockTokens * 4;
    const uint8_t* corr = acts + k * kBlockTokens + (k / 256) * kBlockTokens * 4 + sb * kBlockTokens * 4;
    for (int v = 0; v < V; ++v) {
        const __m512i c = _mm512_load_si512(corr + v * block_bytes);
        const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(d + v * block_bytes));
        for (int r = 0; r < R; ++r) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc[r][v], c)), dx);
            const __m512 dw = _mm512_set1_ps(scales[r * kChunkBlocks]);
            float* t = tile + r * kTileCols + 16 * v;
            _mm512_storeu_ps(t, first ? _mm512_mul_ps(f, dw) : _mm512_fmadd_ps(f, dw, _mm512_loadu_ps(t)));
        }
    }
}

using MicroFn = void (*)(const uint8_t*, const float*, int64_t, int64_t, const uint8_t*, float*, bool);
constexpr MicroFn kMicro[kRows][2] = {
    {micro<1, 1>, micro<1, 2>}, {micro<2, 1>, micro<2, 2>}, {micro<3, 1>, micro<3, 2>},
    {micro<4, 1>, micro<4, 2>}, {micro<5, 1>, micro<5, 2>}, {micro<6, 1>, micro<6, 2>},
    {micro<7, 1>, micro<7, 2>}, {micro<8, 1>, micro<8, 2>},
};

void tile(const uint8_t* w, const float* scales, int n_rows, int64_t k, int64_t k0, int64_t kc, const uint8_t* acts,
          int n_blocks, float* out, bool first) {
    const size_t block_bytes = act_block_bytes(k);
    for (int64_t s = 0; s < kc / 256; ++s) {
        for (int b = 0; b < n_blocks; b += 2) {
            const int nv = n_blocks - b < 2 ? n_blocks - b : 2;
            kMicro[n_rows - 1][nv - 1](w + 256 * s, scales + s, k, k0 / 256 + s, acts + b * block_bytes, out + 16 * b,
                                       first && s == 0);
        }
    }
}

}  // namespace

constinit const I8Kernels kAvx512I8Kernels = {
    pack,
    {
        nullptr,  // F32
        nullptr,  // F16
        nullptr,  // BF16
        nullptr,  // Q8_0
        nullptr,  // Q4_0
        nullptr,  // MXFP4
        nullptr,  // Q4_1
        nullptr,  // Q5_0
        nullptr,  // Q5_1
        nullptr,  // IQ4_NL
        decode<dec::Q2K>,
        decode<dec::Q3K>,
        decode<dec::Q4K>,
        decode<dec::Q5K>,
        decode<dec::Q6K>,
        decode<dec::IQ4XS>,
    },
    tile,
};

}  // namespace moe::cpu::mm::i8
