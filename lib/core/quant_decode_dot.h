// The dot product of one group of 32 weights of a decoded type (core/quant_decode.h) with 32 activations
// quantised to int8 (Q8 of 32: a float scale dx and values xq, x ~ dx * xq, as the CUDA GEMV's activation
// rows hold them), in integers: the weights' values and their per-16 or per-32 scales and mins are small
// integers (quants of 2 to 6 bits, the IQ4 grid of int8 values, 4- to 8-bit sub-block scales), so
//   dot = dx * (dw * isum + mw * msum),  isum = sum_h sc_h * sum_{j in h} q_j xq_j,  msum = sum_h mn_h * sum_{j in h} xq_j
// with h the two halves of 16 (one scale for both where the format has one per 32) and dw, mw the
// block's float scale and minimum factor. The integer sums are exact (|isum| <= 2 * 128 * 16 * 32 * 128 =
// 2^24 for Q6_K, the widest) and run on the GPU as dp4a over words of four int8 values, as llama.cpp's
// MMVQ kernels do; the float part is three roundings.
//
// Shared by host and device code (MOE_HD): the device primitives (dp4a, byte_perm) have host versions
// with the same results, so tests/core/test_quant_decode_dot.cpp checks on the host, bit for bit, the
// integer sums against a scalar reference written from the block layouts, and the float value against
// float64 sums of lib/core's dequantised weights.
//
// REQUIRES of every loader: blk is 2-byte aligned (as quant_decode.h's decoders).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/quant_decode.h"

namespace moe::qd {

// ---- device primitives and their host versions ----

// c + the sum of the four products of the int8 bytes of a and b.
MOE_HD inline int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
    return c;
#endif
}

// Byte i of the result: byte ((s >> 4 i) & 7) of the 8 bytes {hi, lo} (lo: bytes 0-3). Selector values
// 0 .. 7 only (no sign replication), as every caller here uses.
MOE_HD inline uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t s) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(lo, hi, s);
#else
    const uint64_t v = static_cast<uint64_t>(hi) << 32 | lo;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
    return r;
#endif
}

// The 4 bytes at p (2-byte aligned), little-endian: two 16-bit loads on the device.
MOE_HD inline uint32_t load_u32_a2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
#else
    return load_u16(p) | load_u16(p + 2) << 16;
#endif
}

// The 4 bytes at p, little-endian: one 32-bit load where A4 says p is 4-byte aligned (the device's
// shared-memory stage of a GEMV whose blocks start at such addresses), else load_u32_a2's two.
template <bool A4>
MOE_HD inline uint32_t load_u32(const uint8_t* p) {
    if constexpr (A4) {
#if defined(__CUDA_ARCH__)
        return *reinterpret_cast<const uint32_t*>(p);
#else
        uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
#endif
    } else {
        return load_u32_a2(p);
    }
}

// Four nibbles (one per byte, 0 .. 15) -> their IQ4 grid values (iq4nl_value) as four int8 bytes: two byte
// permutes over the table's halves, chosen per byte by the nibble's bit 3.
MOE_HD inline uint32_t iq4nl_lut4(uint32_t nib4) {
    const uint32_t lo3 = nib4 & 0x07070707u;
    const uint32_t y = lo3 | (lo3 >> 4);
    const uint32_t sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);       // the four 3-bit indices as selector nibbles
    const uint32_t lo = byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel);  // -127 -104 -83 -65 -49 -35 -22 -10
    const uint32_t hi = byte_perm(0x26190D01u, 0x71594535u, sel);  //    1   13  25  38  53  69  89 113
    const uint32_t m = ((nib4 >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

// Bits 0 .. 3 of b -> 0x01 in bytes 0 .. 3 (the bytes of the set bits).
MOE_HD inline uint32_t spread4(uint32_t b) {
    return (b & 1u) | (b & 2u) << 7 | (b & 4u) << 14 | (b & 8u) << 21;
}

// ---- one group of weights as integers ----

// Group g of a block: w[i] holds elements 4 i .. 4 i + 3 as int8 bytes; sc[h] and mn[h] the integer
// scale and minimum of elements 16 h .. 16 h + 15 (sc[0] == sc[1] where the format has one per 32; mn
// 0 without minimums); the weights are dw * sc[h] * q + mw * mn[h].
struct GroupQ {
    int w[8];
    int sc[2];
    int mn[2];
    float dw;
    float mw;
};

// Types with a minimum term (weights d * q - m or d * q + m).
MOE_HD constexpr bool has_min(Type t) {
    return t == Type::Q4_1 || t == Type::Q5_1 || t == Type::Q2_K || t == Type::Q4_K || t == Type::Q5_K;
}
// Types with a scale per 16 elements (else one per group of 32).
MOE_HD constexpr bool half_scales(Type t) { return t == Type::Q2_K || t == Type::Q3_K || t == Type::Q6_K; }

// Types whose blocks are whole 32-bit words (so that blocks of a 4-byte aligned row all are) and whose
// words all lie at multiples of 4 in the block: load_group's A4 path.
MOE_HD constexpr bool word_blocks(Type t) { return block_bytes(t) % 4 == 0; }

// A4: blk is 4-byte aligned (the block size a multiple of 4 and the row start aligned): every word comes
// from one 32-bit load (Q4_K / Q5_K take their two fp16 factors and 12 scale bytes as words too), about
// half the load instructions of the 2-byte aligned path, with the same results (the host test checks).
template <Type W, bool A4 = false>
MOE_HD inline GroupQ load_group(const uint8_t* blk, int g) {
    static_assert(decodes(W), "a type of quant_decode.h");
    static_assert(!A4 || word_blocks(W), "A4: blocks of whole words");
    GroupQ q{};
    q.sc[0] = q.sc[1] = 1;
    if constexpr (W == Type::Q4_1 || W == Type::Q5_1 || W == Type::Q5_0 || W == Type::IQ4_NL) {
        // Element j < 16: low nibble of qs[j]; 16 + j: its high nibble; Q5's bit 4 of element j is bit j of qh.
        const int qs_off = W == Type::Q4_1 ? 4 : W == Type::Q5_1 ? 8 : W == Type::Q5_0 ? 6 : 2;
        const uint32_t qh = W == Type::Q5_1 ? load_u32<A4>(blk + 4) : W == Type::Q5_0 ? load_u32<A4>(blk + 2) : 0u;
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = load_u32<A4>(blk + qs_off + 4 * i);
            uint32_t lo = b & 0x0F0F0F0Fu, hi = (b >> 4) & 0x0F0F0F0Fu;
            if constexpr (W == Type::IQ4_NL) {
                lo = iq4nl_lut4(lo);
                hi = iq4nl_lut4(hi);
            } else if constexpr (W != Type::Q4_1) {
                const uint32_t hb_lo = spread4((qh >> (4 * i)) & 0xFu);
                const uint32_t hb_hi = spread4((qh >> (16 + 4 * i)) & 0xFu);
                if constexpr (W == Type::Q5_1) {
                    lo |= hb_lo << 4;
                    hi |= hb_hi << 4;
                } else {  // q - 16 in [-16, 15]: the nibble, with 0xF0 where bit 4 is clear
                    lo |= (hb_lo ^ 0x01010101u) * 0xF0u;
                    hi |= (hb_hi ^ 0x01010101u) * 0xF0u;
                }
            }
            q.w[i] = static_cast<int>(lo);
            q.w[4 + i] = static_cast<int>(hi);
        }
        q.dw = fp16_to_float(load_u16(blk));
        if constexpr (has_min(W)) {
            q.mn[0] = q.mn[1] = 1;
            q.mw = fp16_to_float(load_u16(blk + 2));  // weights d * q + m
        }
    } else if constexpr (W == Type::IQ4_XS) {
        const auto& b = *reinterpret_cast<const BlockIQ4_XS*>(blk);
        for (int i = 0; i < 4; ++i) {
            const uint32_t v = load_u32<A4>(b.qs + 16 * g + 4 * i);
            q.w[i] = static_cast<int>(iq4nl_lut4(v & 0x0F0F0F0Fu));
            q.w[4 + i] = static_cast<int>(iq4nl_lut4((v >> 4) & 0x0F0F0F0Fu));
        }
        q.dw = fp16_to_float(b.d) * static_cast<float>(kq::iq4_xs_scale(b, g) - 32);  // quant_decode.h's group scale
    } else if constexpr (W == Type::Q2_K || W == Type::Q3_K) {
        // Element e = 32 g + l: bits 2 (g % 4) of qs[32 (g / 4) + l] (kq::two_bits); Q3_K's high bit: bit g
        // of hmask[l], clear meaning 4 lower (kq::q3_k_value).
        const uint8_t* qs = blk + (W == Type::Q2_K ? 16 : 32) + 32 * (g / 4);
        const int sh = 2 * (g % 4);
        for (int i = 0; i < 8; ++i) {
            uint32_t v = (load_u32<A4>(qs + 4 * i) >> sh) & 0x03030303u;
            if constexpr (W == Type::Q3_K) {
                const uint32_t hm = (load_u32<A4>(blk + 4 * i) >> g) & 0x01010101u;
                v |= (hm ^ 0x01010101u) * 0xFCu;  // q - 4 where the bit is clear: 0xFC | q
            }
            q.w[i] = static_cast<int>(v);
        }
        if constexpr (W == Type::Q2_K) {
            const auto& b = *reinterpret_cast<const BlockQ2_K*>(blk);
            for (int h = 0; h < 2; ++h) {
                q.sc[h] = b.scales[2 * g + h] & 0x0F;
                q.mn[h] = b.scales[2 * g + h] >> 4;
            }
            q.dw = fp16_to_float(b.d);
            q.mw = -fp16_to_float(b.dmin);
        } else {
            const auto& b = *reinterpret_cast<const BlockQ3_K*>(blk);
            for (int h = 0; h < 2; ++h) q.sc[h] = kq::q3_k_scale(b.scales, 2 * g + h);
            q.dw = fp16_to_float(b.d);
        }
    } else if constexpr (W == Type::Q4_K || W == Type::Q5_K) {
        // Element 32 g + l: nibble g % 2 of qs[32 (g / 2) + l] (kq::nibble_k); Q5_K's bit 4: bit g of qh[l].
        const uint8_t* qh = blk + 4 + kKScaleBytes;
        const uint8_t* qs = (W == Type::Q4_K ? qh : qh + kQK_K / 8) + 32 * (g / 2);
        const int sh = 4 * (g % 2);
        for (int i = 0; i < 8; ++i) {
            uint32_t v = (load_u32<A4>(qs + 4 * i) >> sh) & 0x0F0F0F0Fu;
            if constexpr (W == Type::Q5_K) v |= ((load_u32<A4>(qh + 4 * i) >> g) & 0x01010101u) << 4;
            q.w[i] = static_cast<int>(v);
        }
        int sc, m;
        if constexpr (A4) {  // the 12 scale bytes as three words
            const uint32_t dm = load_u32<true>(blk);
            kq::scale_min_k4_words(load_u32<true>(blk + 4), load_u32<true>(blk + 8), load_u32<true>(blk + 12), g,
                                   sc, m);
            q.dw = fp16_to_float(dm & 0xFFFFu);
            q.mw = -fp16_to_float(dm >> 16);
        } else {
            kq::scale_min_k4(blk + 4, g, sc, m);
            q.dw = fp16_to_float(load_u16(blk));
            q.mw = -fp16_to_float(load_u16(blk + 2));
        }
        q.sc[0] = q.sc[1] = sc;
        q.mn[0] = q.mn[1] = m;
    } else {  // Q6_K
        // Element e = 32 g + l: low nibble (g % 4) / 2 of ql[64 (g / 4) + 32 (g % 2) + l], top 2 bits
        // 2 (g % 4) of qh[32 (g / 4) + l] (kq::q6_k_value); the value is that 6-bit number - 32.
        const auto& b = *reinterpret_cast<const BlockQ6_K*>(blk);
        const uint8_t* ql = b.ql + 64 * (g / 4) + 32 * (g % 2);
        const uint8_t* qh = b.qh + 32 * (g / 4);
        const int lsh = 4 * ((g % 4) / 2);
        const int hsh = 2 * (g % 4);
        for (int i = 0; i < 8; ++i) {
            const uint32_t v = ((load_u32<A4>(ql + 4 * i) >> lsh) & 0x0F0F0F0Fu) |
                               ((load_u32<A4>(qh + 4 * i) >> hsh) & 0x03030303u) << 4;
            // v - 32 in [-32, 31]: the low 5 bits, with 0xE0 where bit 5 is clear.
            q.w[i] = static_cast<int>((v & 0x1F1F1F1Fu) | (((v >> 5) & 0x01010101u) ^ 0x01010101u) * 0xE0u);
        }
        for (int h = 0; h < 2; ++h) q.sc[h] = b.scales[2 * g + h];
        q.dw = fp16_to_float(b.d);
    }
    return q;
}

// The integer sums of a group against activation values xq (word i: elements 4 i .. 4 i + 3).
struct GroupSums {
    int isum;
    int msum;
};

template <Type W>
MOE_HD inline GroupSums group_sums(const GroupQ& q, const int (&xq)[8]) {
    int s[2] = {0, 0};
    for (int i = 0; i < 8; ++i) s[i / 4] = dp4a(q.w[i], xq[i], s[i / 4]);
    GroupSums r{0, 0};
    r.isum = half_scales(W) ? q.sc[0] * s[0] + q.sc[1] * s[1] : q.sc[0] * (s[0] + s[1]);
    if constexpr (has_min(W)) {
        int t[2] = {0, 0};
        for (int i = 0; i < 8; ++i) t[i / 4] = dp4a(0x01010101, xq[i], t[i / 4]);
        r.msum = half_scales(W) ? q.mn[0] * t[0] + q.mn[1] * t[1] : q.mn[0] * (t[0] + t[1]);
    }
    return r;
}

// dx * (dw * isum + mw * msum), each product rounded on its own (no FMA contraction), the same bits on
// host and device.
template <Type W>
MOE_HD inline float group_value(const GroupQ& q, const GroupSums& s, float dx) {
    float v = mul_rn(q.dw, static_cast<float>(s.isum));
    if constexpr (has_min(W)) v = v + mul_rn(q.mw, static_cast<float>(s.msum));
    return mul_rn(v, dx);
}

}  // namespace moe::qd
