// decode_unit_half (quant_decode.h) for every decoded type, reading the staged row as whole 32-bit words.
// The tensor-core GEMM (cuda/matmul_mma.cuh) stages a unit of 256 elements from byte `off` (its address &
// 15, even) of a row of shared-memory words, and decode16's byte loads, shifts and integer additions per
// element made its decode, not its MMAs, the bound of the expert GEMM (about 8 instructions per element).
// Here 16 bytes are 5 word loads and 4 funnel shifts (words_at, at any even offset), and each element is
// one byte permute that builds the float 2^23 + q, one exact subtraction, and decode16's own scale
// arithmetic (the same roundings, in the same order): the same floats bit for bit, NaN payloads aside. Its FMA
// form (decode16_words<W, true>: a byte permute and one FMA per element) gives decode16<W, true>'s floats bit for
// bit (tests/core/test_quant_decode_words.cpp checks both forms on every half group of random units at every
// even offset against decode_unit_half and decode16<W, true>).
//
// REQUIRES of every decoder: s holds the unit's bytes from byte off, and one readable word past the
// word of the last byte read (words_at reads one more word than it returns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/quant_decode.h"
#include "core/quant_decode_dot.h"
#include "core/quant_k_layout.h"

namespace moe::qd {

// (hi:lo) >> sh, the low word, sh in 0 .. 31 (the device's funnel shift).
MOE_HD inline uint32_t funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_r(lo, hi, sh);
#else
    return sh == 0 ? lo : (lo >> sh) | (hi << (32 - sh));
#endif
}

// The N little-endian words at byte off of s (off >= 0): words off / 4 .. off / 4 + N of s, shifted. A fold
// over the indices rather than a loop, so that w is unrolled into registers by construction in the GEMM.
template <int N, size_t... I>
MOE_HD inline void words_at_impl(const uint32_t* p, uint32_t sh, uint32_t (&w)[N], std::index_sequence<I...>) {
    ((w[I] = funnel_r(p[I], p[I + 1], sh)), ...);
}
template <int N>
MOE_HD inline void words_at(const uint32_t* s, int off, uint32_t (&w)[N]) {
    words_at_impl<N>(s + (off >> 2), static_cast<uint32_t>(off & 3) * 8u, w, std::make_index_sequence<N>{});
}

MOE_HD inline uint32_t word_at(const uint32_t* s, int off) {
    uint32_t w[1];
    words_at<1>(s, off, w);
    return w[0];
}

// Byte b of u as the float u_b - bias, exactly: the bits of 2^23 + u_b minus (2^23 + bias), where
// magic = 2^23 + bias (bias an integer in 0 .. 2^22).
MOE_HD inline float byte_minus(uint32_t u, int b, float magic) {
    return bits_to_float(byte_perm(u, 0x4B000000u, 0x7540u | static_cast<uint32_t>(b))) - magic;
}

constexpr float kMagic0 = 8388608.0f;  // 2^23

// fma_value (quant_decode.h) of byte b of u: the byte goes into bits 8-15 of 256.0f by a byte permute.
MOE_HD inline float byte_fma(uint32_t u, int b, OneFma f) {
    return fmaf(bits_to_float(byte_perm(u, 0x43800000u, 0x7604u | static_cast<uint32_t>(b) << 4)), f.mul, f.add);
}

// v[4 i + b] = byte b of u[i] decoded: by byte_fma where FMA and f is finite, else by exact(u[i], b). One branch
// for all 16, so that each form is a straight run of permutes and float operations.
template <bool FMA, class Exact>
MOE_HD inline void decode16_bytes(const uint32_t (&u)[4], OneFma f, float (&v)[16], Exact exact) {
    if (FMA && finite_form(f)) {
        for (int i = 0; i < 4; ++i) {
            for (int b = 0; b < 4; ++b) v[4 * i + b] = byte_fma(u[i], b, f);
        }
        return;
    }
    for (int i = 0; i < 4; ++i) {
        for (int b = 0; b < 4; ++b) v[4 * i + b] = exact(u[i], b);
    }
}

// v[j] = element 32 g + 16 h + j of the unit at byte off of s (g < kUnitGroups: for the 32-element types,
// block g of the unit): decode_unit_half<W>'s values, bit for bit; FMA: decode16<W, true>'s.
template <Type W, bool FMA = false>
MOE_HD inline void decode16_words(const uint32_t* s, int off, int g, int h, float (&v)[16]) {
    static_assert(decodes(W), "a type of quant_decode.h");
    if constexpr (block_elems(W) == 32) {
        // d [, m] [, qh], qs[16]: element j < 16 the low nibble of qs[j], 16 + j its high nibble; Q5's fifth
        // bit of element j bit j of qh.
        const int b0 = off + g * block_bytes(W);
        constexpr int kQs = W == Type::Q4_1 ? 4 : W == Type::Q5_1 ? 8 : W == Type::Q5_0 ? 6 : 2;
        const uint32_t head = word_at(s, b0);
        const float d = fp16_to_float(head & 0xFFFFu);
        uint32_t q[4];
        words_at<4>(s, b0 + kQs, q);
        [[maybe_unused]] uint32_t hb = 0;
        if constexpr (W == Type::Q5_1 || W == Type::Q5_0) hb = word_at(s, b0 + (W == Type::Q5_1 ? 4 : 2)) >> (16 * h);
        uint32_t u[4];
        for (int i = 0; i < 4; ++i) {
            u[i] = (q[i] >> (4 * h)) & 0x0F0F0F0Fu;
            if constexpr (W == Type::Q5_1 || W == Type::Q5_0) u[i] |= spread4((hb >> (4 * i)) & 0xFu) << 4;
            if constexpr (W == Type::IQ4_NL) u[i] = iq4nl_lut4(u[i]) ^ 0x80808080u;  // the grid's int8 values + 128
        }
        const OneFma f = W == Type::Q4_1 || W == Type::Q5_1 ? one_fma(d, 0.0f, fp16_to_float(head >> 16))
                                                            : one_fma(d, W == Type::Q5_0 ? 16.0f : 128.0f, 0.0f);
        decode16_bytes<FMA>(u, f, v, [&](uint32_t n, int b) {
            if constexpr (W == Type::Q4_1 || W == Type::Q5_1) {
                return mul_rn(byte_minus(n, b, kMagic0), d) + fp16_to_float(head >> 16);
            } else if constexpr (W == Type::Q5_0) {
                return byte_minus(n, b, kMagic0 + 16.0f) * d;
            } else {
                return d * byte_minus(n, b, kMagic0 + 128.0f);
            }
        });
    } else if constexpr (W == Type::Q2_K || W == Type::Q3_K) {
        // Element e = 32 g + 16 h + j: bits 2 (g % 4) of qs[32 (g / 4) + 16 h + j]; Q3_K's bit g of hmask[16 h + j]
        // clear means 4 lower. Q2_K: scales[16], qs[64], d, dmin; Q3_K: hmask[32], qs[64], scales[12], d.
        constexpr int kQs = W == Type::Q2_K ? 16 : 32;
        uint32_t q[4];
        words_at<4>(s, off + kQs + 32 * (g / 4) + 16 * h, q);
        [[maybe_unused]] uint32_t hm[4];
        if constexpr (W == Type::Q3_K) words_at<4>(s, off + 16 * h, hm);
        if constexpr (W == Type::Q2_K) {
            const int sc = static_cast<int>(word_at(s, off + 2 * g + h) & 0xFFu);
            const uint32_t dd = word_at(s, off + 80);
            const float dl = mul_rn(fp16_to_float(dd & 0xFFFFu), small_to_float(sc & 0x0F));
            const float ml = mul_rn(fp16_to_float(dd >> 16), small_to_float(sc >> 4));
            uint32_t u[4];
            for (int i = 0; i < 4; ++i) u[i] = (q[i] >> (2 * (g % 4))) & 0x03030303u;
            decode16_bytes<FMA>(u, one_fma(dl, 0.0f, -ml), v,
                                [&](uint32_t n, int b) { return mul_rn(dl, byte_minus(n, b, kMagic0)) - ml; });
        } else {
            // kq::q3_k_scale of scale i = 2 g + h from the 12 scale bytes at 96.
            const int i_sc = 2 * g + h;
            const int lo = static_cast<int>((word_at(s, off + 96 + i_sc % 8) >> (4 * (i_sc / 8))) & 0x0Fu);
            const int hi = static_cast<int>((word_at(s, off + 104 + i_sc % 4) >> (2 * (i_sc / 4))) & 3u);
            const float dl = fp16_to_float(word_at(s, off + 108) & 0xFFFFu) * small_to_float((lo | hi << 4) - 32);
            // The 2 bits, plus 4 where the hmask bit is set: the value + 4, in 0 .. 7.
            uint32_t u[4];
            for (int i = 0; i < 4; ++i) {
                u[i] = ((q[i] >> (2 * (g % 4))) & 0x03030303u) | ((hm[i] >> g) & 0x01010101u) << 2;
            }
            decode16_bytes<FMA>(u, one_fma(dl, 4.0f, 0.0f), v,
                                [&](uint32_t n, int b) { return dl * byte_minus(n, b, kMagic0 + 4.0f); });
        }
    } else if constexpr (W == Type::Q4_K || W == Type::Q5_K) {
        // d, dmin, scales[12], then (Q5_K) qh[32], then qs: as decode16, element 32 g + 16 h + j is nibble
        // g % 2 of qs[32 (g / 2) + 16 h + j], its fifth bit (Q5_K) bit g of qh[16 h + j].
        uint32_t head[4];
        words_at<4>(s, off, head);
        int sc, m;
        kq::scale_min_k4_words(head[1], head[2], head[3], g, sc, m);
        const float dl = mul_rn(fp16_to_float(head[0] & 0xFFFFu), small_to_float(sc));
        const float ml = mul_rn(fp16_to_float(head[0] >> 16), small_to_float(m));
        constexpr int kQs = W == Type::Q4_K ? 16 : 48;
        uint32_t q[4];
        words_at<4>(s, off + kQs + 32 * (g / 2) + 16 * h, q);
        [[maybe_unused]] uint32_t qh[4];
        if constexpr (W == Type::Q5_K) words_at<4>(s, off + 16 + 16 * h, qh);
        uint32_t u[4];
        for (int i = 0; i < 4; ++i) {
            u[i] = (q[i] >> (4 * (g % 2))) & 0x0F0F0F0Fu;
            if constexpr (W == Type::Q5_K) u[i] |= ((qh[i] >> g) & 0x01010101u) << 4;
        }
        decode16_bytes<FMA>(u, one_fma(dl, 0.0f, -ml), v,
                            [&](uint32_t n, int b) { return mul_rn(dl, byte_minus(n, b, kMagic0)) - ml; });
    } else if constexpr (W == Type::Q6_K) {
        // ql[128], qh[64], scales[16] (int8), d: element e = 32 g + 16 h + j as kq::q6_k_values16.
        const int e0 = 32 * g + 16 * h;
        uint32_t ql[4], qh[4];
        words_at<4>(s, off + 64 * (e0 / 128) + e0 % 64, ql);
        words_at<4>(s, off + 128 + 32 * (e0 / 128) + e0 % 32, qh);
        const int sl = 4 * (e0 % 128 / 64);
        const int sh = 2 * (e0 % 128 / 32);
        const int scale = static_cast<int8_t>(word_at(s, off + 192 + 2 * g + h) & 0xFFu);
        const float dl = fp16_to_float(word_at(s, off + 208) & 0xFFFFu) * small_to_float(scale);
        uint32_t u[4];  // 6-bit values
        for (int i = 0; i < 4; ++i) u[i] = ((ql[i] >> sl) & 0x0F0F0F0Fu) | ((qh[i] >> sh) & 0x03030303u) << 4;
        decode16_bytes<FMA>(u, one_fma(dl, 32.0f, 0.0f), v,
                            [&](uint32_t c, int b) { return dl * byte_minus(c, b, kMagic0 + 32.0f); });
    } else {  // IQ4_XS: d, scales_h, scales_l[4], qs[128]; group g's nibbles h of qs[16 g + j]
        uint32_t head[2];
        words_at<2>(s, off, head);
        const uint32_t scales_l = head[1] >> (8 * (g / 2));
        const int ls = static_cast<int>(((scales_l >> (4 * (g % 2))) & 0x0Fu) | ((head[0] >> (16 + 2 * g)) & 3u) << 4);
        const float d = fp16_to_float(head[0] & 0xFFFFu) * small_to_float(ls - 32);
        uint32_t q[4];
        words_at<4>(s, off + 8 + 16 * g, q);
        uint32_t u[4];  // the grid's int8 values, biased by 128 to bytes 1 .. 241
        for (int i = 0; i < 4; ++i) u[i] = iq4nl_lut4((q[i] >> (4 * h)) & 0x0F0F0F0Fu) ^ 0x80808080u;
        decode16_bytes<FMA>(u, one_fma(d, 128.0f, 0.0f), v,
                            [&](uint32_t n, int b) { return d * byte_minus(n, b, kMagic0 + 128.0f); });
    }
}

}  // namespace moe::qd
