// AVX-512 BF16 kernels of the BF16 path (see matmul_bf16.h): activation packing, weight decoding to
// BF16 and the vdpbf16ps tile kernel. Compiled with AVX-512 F/BW/VL/DQ + BF16, chosen at run time.
//
// The tile kernel keeps up to 8 weight rows x 2 blocks of 16 tokens of F32 accumulators in registers
// (16 zmm): per pair of elements it loads the pair of 16 tokens from each block and broadcasts the
// pair of each row from the decoded chunk (an embedded broadcast), so each activation load serves 8
// rows and each broadcast 32 tokens. Tokens are the vector lanes, so no horizontal sums are needed.
//
// Decoded values equal the type table's to_float bit for bit before BF16 rounding: every quantised
// kind is decoded here with the same F32 operations in the same order, so the path's only roundings
// are the BF16 conversions and the F32 sums.

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (GCC bug
// 105593, fixed in 13); the warning points into the header, so it is silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/types.h"
#include "cpu/matmul_bf16.h"
#include "cpu/matmul_decode_avx512.h"

namespace moe::cpu::mm::bf16 {
namespace {

inline float fp16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

using dec::high_nibbles;
using dec::loadu128;
using dec::transpose16;
using dec::low_nibbles;
using dec::u8_to_ps;

// The same row's next chunk (a row is decoded chunk after chunk): prefetched while this one is decoded.
inline void prefetch_next_chunk(const uint8_t* p, size_t chunk_bytes) {
    _mm_prefetch(reinterpret_cast<const char*>(p + chunk_bytes), _MM_HINT_T0);
}

// 32 floats (lo: elements 0-15, hi: 16-31) to 32 BF16 at dst.
inline void store_bf16(uint16_t* dst, __m512 lo, __m512 hi) {
    _mm512_storeu_si512(dst, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// ---- activation packing ----

void pack(const float* const* rows, int n, int64_t k, uint8_t* dst) {
    for (int64_t e0 = 0; e0 < k; e0 += 32) {
        __m512i r[16];
        for (int t = 0; t < 16; ++t) {
            if (t < n) {
                const __m512 lo = _mm512_loadu_ps(rows[t] + e0);
                const __m512 hi = _mm512_loadu_ps(rows[t] + e0 + 16);
                r[t] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            } else {
                r[t] = _mm512_setzero_si512();
            }
        }
        transpose16(r);
        uint8_t* d = dst + e0 / 2 * 64;  // pair e0 / 2 of every token
        for (int j = 0; j < 16; ++j) _mm512_store_si512(d + 64 * j, r[j]);
    }
}

// ---- weight decoding ----

void decode_q8_0(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    for (int r = 0; r < n_rows; ++r) {
        const uint8_t* p = w + r * ws + (k0 / 32) * sizeof(BlockQ8_0);
        uint16_t* d = dst + r * kChunk;
        for (int64_t b = 0; b < kc / 32; ++b, p += sizeof(BlockQ8_0)) {
            prefetch_next_chunk(p, kChunk / 32 * sizeof(BlockQ8_0));
            const __m512 s = _mm512_set1_ps(fp16_at(p));
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(loadu128(p + 2)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(loadu128(p + 18)));
            store_bf16(d + 32 * b, _mm512_mul_ps(lo, s), _mm512_mul_ps(hi, s));
        }
    }
}

void decode_q4_0(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    const __m512i eight = _mm512_set1_epi32(8);
    const __m128i nib = _mm_set1_epi8(0x0F);
    for (int r = 0; r < n_rows; ++r) {
        const uint8_t* p = w + r * ws + (k0 / 32) * sizeof(BlockQ4_0);
        uint16_t* d = dst + r * kChunk;
        for (int64_t b = 0; b < kc / 32; ++b, p += sizeof(BlockQ4_0)) {
            if (b % 2 == 0) prefetch_next_chunk(p, kChunk / 32 * sizeof(BlockQ4_0));
            const __m512 s = _mm512_set1_ps(fp16_at(p));
            const __m128i q = loadu128(p + 2);
            const __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(q, nib)), eight);
            const __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), nib)), eight);
            store_bf16(d + 32 * b, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), s), _mm512_mul_ps(_mm512_cvtepi32_ps(hi), s));
        }
    }
}

void decode_mxfp4(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    __m512 table;
    {
        alignas(64) float t[16];
        for (int i = 0; i < 16; ++i) t[i] = static_cast<float>(kMxfp4Values[i]);
        table = _mm512_load_ps(t);
    }
    const __m128i nib = _mm_set1_epi8(0x0F);
    for (int r = 0; r < n_rows; ++r) {
        const uint8_t* p = w + r * ws + (k0 / 32) * sizeof(BlockMXFP4);
        uint16_t* d = dst + r * kChunk;
        for (int64_t b = 0; b < kc / 32; ++b, p += sizeof(BlockMXFP4)) {
            if (b % 2 == 0) prefetch_next_chunk(p, kChunk / 32 * sizeof(BlockMXFP4));
            const __m512 s = _mm512_set1_ps(e8m0_to_fp32_half(p[0]));
            const __m128i q = loadu128(p + 1);
            const __m512 lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, nib)), table);
            const __m512 hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), nib)), table);
            store_bf16(d + 32 * b, _mm512_mul_ps(lo, s), _mm512_mul_ps(hi, s));
        }
    }
}

// The kinds decoded group by group: group(block, g, lo, hi) sets elements 32 g .. 32 g + 31 of a block
// of B (kGroups groups of 32). The next chunk's bytes are prefetched once per cache line.
template <class B, int kGroups, class Group>
inline void decode_groups(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst,
                          Group group) {
    constexpr int64_t kElems = 32 * kGroups;
    constexpr size_t kChunkBytes = kChunk / kElems * sizeof(B);
    for (int r = 0; r < n_rows; ++r) {
        const uint8_t* row = w + r * ws + (k0 / kElems) * sizeof(B);
        uint16_t* d = dst + r * kChunk;
        for (int64_t b = 0; b < kc / kElems; ++b, d += kElems) {
            const size_t at = static_cast<size_t>(b) * sizeof(B);
            for (size_t line = (at + 63) / 64 * 64; line < at + sizeof(B); line += 64) {
                prefetch_next_chunk(row + line, kChunkBytes);
            }
            const auto& blk = *reinterpret_cast<const B*>(row + at);
            // Unrolled, so that each group's byte offsets and shifts are constants: GCC keeps the loop
            // otherwise, and the super-block decoders (Q2_K .. Q6_K) are then markedly slower.
#pragma GCC unroll 8
            for (int g = 0; g < kGroups; ++g) {
                __m512 lo, hi;
                group(blk, g, lo, hi);
                store_bf16(d + 32 * g, lo, hi);
            }
        }
    }
}

// The 16 bits of m as 16 bytes of 0x10 (bit set) or 0: the fifth bit of Q5_0 / Q5_1 values.
inline __m128i fifth_bits(uint32_t m) {
    return _mm_and_si128(_mm_movm_epi8(static_cast<__mmask16>(m)), _mm_set1_epi8(0x10));
}

inline uint32_t u32_at(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Every product below is exact in F32 (a scale of at most 11 + 6 significant bits times a value of at
// most 7), so whether the compiler fuses it with the following sum changes nothing, and each value
// equals to_float's (core/quant_decode.h's decode32 spells out the same operations per type).

// Q4_1: x = q d + m.
void decode_q4_1(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    decode_groups<BlockQ4_1, 1>(w, ws, n_rows, k0, kc, dst, [](const BlockQ4_1& b, int, __m512& lo, __m512& hi) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d)), m = _mm512_set1_ps(_cvtsh_ss(b.m));
        const __m128i q = loadu128(b.qs);
        lo = _mm512_add_ps(_mm512_mul_ps(u8_to_ps(low_nibbles(q), 0), d), m);
        hi = _mm512_add_ps(_mm512_mul_ps(u8_to_ps(high_nibbles(q), 0), d), m);
    });
}

// Q5_0: x = (q - 16) d, bit j of qh the fifth bit of element j.
void decode_q5_0(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    decode_groups<BlockQ5_0, 1>(w, ws, n_rows, k0, kc, dst, [](const BlockQ5_0& b, int, __m512& lo, __m512& hi) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d));
        const uint32_t h = u32_at(b.qh);
        const __m128i q = loadu128(b.qs);
        lo = _mm512_mul_ps(u8_to_ps(_mm_or_si128(low_nibbles(q), fifth_bits(h)), 16), d);
        hi = _mm512_mul_ps(u8_to_ps(_mm_or_si128(high_nibbles(q), fifth_bits(h >> 16)), 16), d);
    });
}

// Q5_1: x = q d + m.
void decode_q5_1(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    decode_groups<BlockQ5_1, 1>(w, ws, n_rows, k0, kc, dst, [](const BlockQ5_1& b, int, __m512& lo, __m512& hi) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d)), m = _mm512_set1_ps(_cvtsh_ss(b.m));
        const uint32_t h = u32_at(b.qh);
        const __m128i q = loadu128(b.qs);
        lo = _mm512_add_ps(_mm512_mul_ps(u8_to_ps(_mm_or_si128(low_nibbles(q), fifth_bits(h)), 0), d), m);
        hi = _mm512_add_ps(_mm512_mul_ps(u8_to_ps(_mm_or_si128(high_nibbles(q), fifth_bits(h >> 16)), 0), d), m);
    });
}

// IQ4_NL: x = d grid[q].
void decode_iq4_nl(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    const __m512 table = _mm512_load_ps(dec::kIq4Grid.v);
    decode_groups<BlockIQ4_NL, 1>(w, ws, n_rows, k0, kc, dst, [&](const BlockIQ4_NL& b, int, __m512& lo, __m512& hi) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d));
        const __m128i q = loadu128(b.qs);
        lo = _mm512_mul_ps(d, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(low_nibbles(q)), table));
        hi = _mm512_mul_ps(d, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(high_nibbles(q)), table));
    });
}

// The super-block kinds (Q2_K .. Q6_K, IQ4_XS): matmul_decode_avx512.h's group decoders.
template <class K>
void decode_superblocks(const uint8_t* w, size_t ws, int n_rows, int64_t k0, int64_t kc, uint16_t* dst) {
    decode_groups<typename K::Block, 8>(w, ws, n_rows, k0, kc, dst,
                                        [](const typename K::Block& b, int g, __m512& lo, __m512& hi) {
                                            K::group(b, g, lo, hi);
                                        });
}

// ---- tile kernel ----

template <int R, int V>
void micro(const uint16_t* w, int64_t kc, const uint8_t* acts, size_t block_bytes, float* tile, bool first) {
    __m512 acc[R][V];
    for (int r = 0; r < R; ++r) {
        for (int v = 0; v < V; ++v) {
            acc[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(tile + r * kTileCols + 16 * v);
        }
    }
    const auto* wp = reinterpret_cast<const int32_t*>(w);  // pair p of row r: wp[r * kChunk / 2 + p]
    for (int64_t p = 0; p < kc / 2; ++p) {
        __m512bh a[V];
        for (int v = 0; v < V; ++v) {
            a[v] = reinterpret_cast<__m512bh>(_mm512_load_si512(acts + v * block_bytes + p * 64));
        }
        for (int r = 0; r < R; ++r) {
            const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(wp[r * (kChunk / 2) + p]));
            for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a[v], b);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(tile + r * kTileCols + 16 * v, acc[r][v]);
    }
}

using MicroFn = void (*)(const uint16_t*, int64_t, const uint8_t*, size_t, float*, bool);
constexpr MicroFn kMicro[kRows][2] = {
    {micro<1, 1>, micro<1, 2>}, {micro<2, 1>, micro<2, 2>}, {micro<3, 1>, micro<3, 2>},
    {micro<4, 1>, micro<4, 2>}, {micro<5, 1>, micro<5, 2>}, {micro<6, 1>, micro<6, 2>},
    {micro<7, 1>, micro<7, 2>}, {micro<8, 1>, micro<8, 2>},
};

void tile(const uint16_t* w, int n_rows, int64_t kc, const uint8_t* acts, size_t block_bytes, int n_blocks,
          float* out, bool first) {
    for (int b = 0; b < n_blocks; b += 2) {
        const int nv = n_blocks - b < 2 ? n_blocks - b : 2;
        kMicro[n_rows - 1][nv - 1](w, kc, acts + b * block_bytes, block_bytes, out + 16 * b, first);
    }
}

}  // namespace

constinit const Bf16Kernels kAvx512Bf16Kernels = {
    pack,
    {
        nullptr,  // F32
        nullptr,  // F16
        nullptr,  // BF16
        decode_q8_0,
        decode_q4_0,
        decode_mxfp4,
        decode_q4_1,
        decode_q5_0,
        decode_q5_1,
        decode_iq4_nl,
        decode_superblocks<dec::Q2K>,
        decode_superblocks<dec::Q3K>,
        decode_superblocks<dec::Q4K>,
        decode_superblocks<dec::Q5K>,
        decode_superblocks<dec::Q6K>,
        decode_superblocks<dec::IQ4XS>,
    },
    tile,
};

}  // namespace moe::cpu::mm::bf16
