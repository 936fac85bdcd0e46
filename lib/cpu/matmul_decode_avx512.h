// AVX-512 helpers shared by the BF16 path's kernels (matmul_bf16_avx512.cpp) and the int8 tiles'
// (matmul_i8_avx512.cpp): a 16 x 16 transpose of 32-bit words (activation packing), and the decoders of
// the super-block kinds (Q2_K .. Q6_K, IQ4_XS) to F32, 32 values at a time,
// so that both start from the same values: each equals the type table's to_float bit for bit.
//
// A kind K has `using Block`, and `static void group(const Block& b, int g, __m512& lo, __m512& hi)`
// setting elements 32 g .. 32 g + 15 (lo) and 32 g + 16 .. 32 g + 31 (hi) of the super-block, g < 8.
//
// Included by files compiled with AVX-512 flags: everything here has internal linkage.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/types.h"

namespace moe::cpu::mm::dec {
namespace {

// In place: r[c] becomes column c of the 16 x 16 matrix of 32-bit words whose row i was r[i].
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // s[4 i + j], lane L: column 4 L + j of rows 4 i .. 4 i + 3
    __m512i s[16];
    for (int i = 0; i < 4; ++i) {
        s[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
        const __m512i u0 = _mm512_shuffle_i32x4(s[j], s[4 + j], 0x88);  // lanes 0, 2 of both
        const __m512i u1 = _mm512_shuffle_i32x4(s[j], s[4 + j], 0xDD);  // lanes 1, 3
        const __m512i v0 = _mm512_shuffle_i32x4(s[8 + j], s[12 + j], 0x88);
        const __m512i v1 = _mm512_shuffle_i32x4(s[8 + j], s[12 + j], 0xDD);
        r[j] = _mm512_shuffle_i32x4(u0, v0, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(u1, v1, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(u0, v0, 0xDD);
        r[12 + j] = _mm512_shuffle_i32x4(u1, v1, 0xDD);
    }
}

inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// 16 unsigned bytes minus `offset`, as floats.
inline __m512 u8_to_ps(__m128i v, int offset) {
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(v), _mm512_set1_epi32(offset)));
}

// Low and high nibbles of 16 bytes.
inline __m128i low_nibbles(__m128i q) { return _mm_and_si128(q, _mm_set1_epi8(0x0F)); }
inline __m128i high_nibbles(__m128i q) { return _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F)); }

// Bits [shift, shift + width) of each of 16 bytes (width 1, 2 or 4).
inline __m128i byte_bits(__m128i q, int shift, int width) {
    return _mm_and_si128(_mm_srli_epi16(q, shift), _mm_set1_epi8(static_cast<char>((1 << width) - 1)));
}

// Every product below is exact in F32 (a scale of at most 11 + 6 significant bits times a value of at
// most 7 bits), so whether the compiler fuses it with the following sum changes nothing, and each value
// equals to_float's (core/quant_decode.h's decode32 spells out the same operations per type).

// Q2_K: groups of 16 with 4-bit scale and min; x = (d sc) q - dmin m, q two bits of qs (kq::two_bits).
struct Q2K {
    using Block = BlockQ2_K;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        const float d = _cvtsh_ss(b.d), dmin = _cvtsh_ss(b.dmin);
        const uint8_t* qs = b.qs + 32 * (g / 4);
        __m512* out[2] = {&lo, &hi};
        for (int h = 0; h < 2; ++h) {
            const int sc = b.scales[2 * g + h];
            const __m512 dl = _mm512_set1_ps(d * static_cast<float>(sc & 0x0F));
            const __m512 ml = _mm512_set1_ps(dmin * static_cast<float>(sc >> 4));
            const __m128i q = byte_bits(loadu128(qs + 16 * h), 2 * (g % 4), 2);
            *out[h] = _mm512_sub_ps(_mm512_mul_ps(dl, u8_to_ps(q, 0)), ml);
        }
    }
};

// Q3_K: groups of 16 with 6-bit scales; x = (d sc) q, q two bits of qs less 4 where the hmask bit is
// clear (kq::q3_k_value).
struct Q3K {
    using Block = BlockQ3_K;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        const float d = _cvtsh_ss(b.d);
        const uint8_t* qs = b.qs + 32 * (g / 4);
        __m512* out[2] = {&lo, &hi};
        for (int h = 0; h < 2; ++h) {
            const __m128i q2 = byte_bits(loadu128(qs + 16 * h), 2 * (g % 4), 2);
            const __m128i hb = byte_bits(loadu128(b.hmask + 16 * h), g, 1);
            const __m512 dl = _mm512_set1_ps(d * static_cast<float>(kq::q3_k_scale(b.scales, 2 * g + h)));
            *out[h] = _mm512_mul_ps(dl, u8_to_ps(_mm_or_si128(q2, _mm_slli_epi16(hb, 2)), 4));
        }
    }
};

// Q4_K / Q5_K group g's scale d sc and offset dmin m, each broadcast (the two share d, dmin and scales).
template <typename Block>
inline void k4_scale_min(const Block& b, int g, __m512& dl, __m512& ml) {
    int sc, m;
    kq::scale_min_k4(b.scales, g, sc, m);
    dl = _mm512_set1_ps(_cvtsh_ss(b.d) * static_cast<float>(sc));
    ml = _mm512_set1_ps(_cvtsh_ss(b.dmin) * static_cast<float>(m));
}

// Q4_K: group g (32 values) is the low (g even) or high nibbles of qs[32 (g / 2) ..]; x = d sc q - dmin m,
// d sc q exact in F32 (17 + 4 bits), so the one rounding is the subtraction's, as in to_float.
struct Q4K {
    using Block = BlockQ4_K;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        __m512 dl, ml;
        k4_scale_min(b, g, dl, ml);
        const uint8_t* q = b.qs + 32 * (g / 2);
        lo = _mm512_sub_ps(_mm512_mul_ps(dl, u8_to_ps(byte_bits(loadu128(q), 4 * (g % 2), 4), 0)), ml);
        hi = _mm512_sub_ps(_mm512_mul_ps(dl, u8_to_ps(byte_bits(loadu128(q + 16), 4 * (g % 2), 4), 0)), ml);
    }
};

// Q5_K: Q4_K's nibbles and scales with a fifth bit, bit g of qh[j] for element 32 g + j.
struct Q5K {
    using Block = BlockQ5_K;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        __m512 dl, ml;
        k4_scale_min(b, g, dl, ml);
        const uint8_t* q = b.qs + 32 * (g / 2);
        __m512* out[2] = {&lo, &hi};
        for (int h = 0; h < 2; ++h) {
            const __m128i nib = byte_bits(loadu128(q + 16 * h), 4 * (g % 2), 4);
            const __m128i hb = byte_bits(loadu128(b.qh + 16 * h), g, 1);
            *out[h] = _mm512_sub_ps(_mm512_mul_ps(dl, u8_to_ps(_mm_or_si128(nib, _mm_slli_epi16(hb, 4)), 0)), ml);
        }
    }
};

// Q6_K: element 128 h + 64 a + m (m < 64) has its low nibble in half a of ql[64 h + m] and its top two
// bits at 2 (2 a + m / 32) of qh[32 h + m % 32] (kq::q6_k_value); group g = 4 h + 2 a + m / 32 therefore
// takes half a = g / 2 % 2 of ql[64 h + 32 (g % 2) ..] and bits 2 (g % 4) of qh[32 h ..], h = g / 4, with
// a scale per 16 values. x = (d sc) (q - 32), both products rounded as in to_float.
struct Q6K {
    using Block = BlockQ6_K;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        const float d = _cvtsh_ss(b.d);
        const uint8_t* ql = b.ql + 64 * (g / 4) + 32 * (g % 2);
        const uint8_t* qh = b.qh + 32 * (g / 4);
        __m512* out[2] = {&lo, &hi};
        for (int i = 0; i < 2; ++i) {  // values 16 i .. 16 i + 15 of the group
            const __m128i low = byte_bits(loadu128(ql + 16 * i), 4 * (g / 2 % 2), 4);
            const __m128i top = byte_bits(loadu128(qh + 16 * i), 2 * (g % 4), 2);
            const __m512 dl = _mm512_set1_ps(d * static_cast<float>(b.scales[2 * g + i]));
            *out[i] = _mm512_mul_ps(dl, u8_to_ps(_mm_or_si128(low, _mm_slli_epi16(top, 4)), 32));
        }
    }
};

// The IQ4_NL grid as floats, a constant (loaded, never built at run time).
struct Iq4Grid {
    alignas(64) float v[16];
};
constexpr Iq4Grid make_iq4_grid() {
    Iq4Grid t{};
    for (int i = 0; i < 16; ++i) t.v[i] = static_cast<float>(kIq4nlValues[i]);
    return t;
}
constexpr Iq4Grid kIq4Grid = make_iq4_grid();

// IQ4_XS: x = d (ls - 32) grid[q], group g's nibbles in qs[16 g ..].
struct IQ4XS {
    using Block = BlockIQ4_XS;
    static void group(const Block& b, int g, __m512& lo, __m512& hi) {
        const __m512 table = _mm512_load_ps(kIq4Grid.v);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b.d) * static_cast<float>(kq::iq4_xs_scale(b, g) - 32));
        const __m128i q = loadu128(b.qs + 16 * g);
        lo = _mm512_mul_ps(d, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(low_nibbles(q)), table));
        hi = _mm512_mul_ps(d, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(high_nibbles(q)), table));
    }
};

}  // namespace
}  // namespace moe::cpu::mm::dec
