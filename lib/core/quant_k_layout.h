// Where the bits of a value and of a group scale sit in the super-block formats (Q2_K .. Q6_K, IQ4_XS):
// one accessor per field, shared by the converters (quant_k.cpp, quant_iq4.cpp) and the CPU's
// portable dot products (cpu/matmul_q8k_scalar.cpp), so the layout is written down once.
//
// Everything here is static inline: a file compiled for a wide ISA may include this header, and an
// out-of-line copy with external linkage could then be picked by the linker for baseline code. MOE_HD:
// the CUDA kernels decode with the same accessors (core/quant_decode.h).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/quant_blocks.h"

namespace moe::kq {

// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Bytes 0-3 hold sc[0..3] and bytes 4-7
// m[0..3] in their low 6 bits; the top 2 bits of those bytes are the top bits of sc[4..7] / m[4..7],
// whose low nibbles are bytes 8-11 (sc low, m high).
MOE_HD static inline void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
        m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// scale_min_k4 on the 12 scale bytes given as three little-endian words s0, s1, s2 (bytes 0-3, 4-7, 8-11).
MOE_HD static inline void scale_min_k4_words(uint32_t s0, uint32_t s1, uint32_t s2, int j, int& sc, int& m) {
    const int sh = 8 * (j & 3);
    const int b0 = static_cast<int>((s0 >> sh) & 0xFFu), b1 = static_cast<int>((s1 >> sh) & 0xFFu);
    if (j < 4) {
        sc = b0 & 63;
        m = b1 & 63;
    } else {
        const int b2 = static_cast<int>((s2 >> sh) & 0xFFu);
        sc = (b2 & 0x0F) | (b0 >> 6) << 4;
        m = (b2 >> 4) | (b1 >> 6) << 4;
    }
}

// Q3_K: 16 six-bit scales (stored as l + 32) in 12 bytes. Scale i: low nibble from byte i % 8 (the low
// half for i < 8, the high half after), top 2 bits from byte 8 + i % 4 at bit 2 * (i / 4).
MOE_HD static inline int q3_k_scale(const uint8_t* s, int i) {
    const int lo = (s[i % 8] >> (4 * (i / 8))) & 0x0F;
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

// Q2_K and Q3_K keep 2 bits of element e = 128 * h + 32 * s + l (h < 2, s < 4, l < 32) in byte
// 32 * h + l of qs, at bit 2 * s.
MOE_HD static inline int two_bits(const uint8_t* qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
}

// Q4_K and Q5_K keep the low nibble of element e = 64 * c + 32 * a + l in byte 32 * c + l of qs (a = 0:
// low half, a = 1: high half); Q3_K's and Q5_K's extra bit of element e = 32 * k + l is bit k of byte l.
MOE_HD static inline int nibble_k(const uint8_t* qs, int e) {
    return (qs[32 * (e / 64) + e % 32] >> (4 * (e % 64 / 32))) & 0x0F;
}
MOE_HD static inline int high_bit(const uint8_t* bits, int e) { return (bits[e % 32] >> (e / 32)) & 1; }

// Q3_K's value of element e, in [-4, 3]: a clear hmask bit means the value is 4 lower.
MOE_HD static inline int q3_k_value(const BlockQ3_K& b, int e) { return two_bits(b.qs, e) - (high_bit(b.hmask, e) ? 0 : 4); }

// Q6_K keeps element e = 128 * h + 64 * a + m (m < 64) as: low nibble in byte 64 * h + m of ql (a = 0:
// low half, a = 1: high half); top 2 bits in byte 32 * h + m % 32 of qh, at bit 2 * (e % 128 / 32).
// The value is that 6-bit number - 32.
MOE_HD static inline int q6_k_value(const BlockQ6_K& b, int e) {
    const int h = e / 128, a = e % 128 / 64, m = e % 64;
    const int lo = (b.ql[64 * h + m] >> (4 * a)) & 0x0F;
    const int hi = (b.qh[32 * h + e % 32] >> (2 * (e % 128 / 32))) & 3;
    return (lo | hi << 4) - 32;
}

// Runs of 16 elements e0 .. e0 + 15 (e0 a multiple of 16), as a decoder of half groups reads them: each
// run's elements share e0's byte rows and bit positions in the accessors above (e % 32, e % 64 only add
// j), so the index arithmetic is done once per run. q[j] is the accessor's value of element e0 + j.
MOE_HD static inline void two_bits16(const uint8_t* qs, int e0, int (&q)[16]) {
    const uint8_t* p = qs + 32 * (e0 / 128) + e0 % 32;
    const int shift = 2 * (e0 % 128 / 32);
    for (int j = 0; j < 16; ++j) q[j] = (p[j] >> shift) & 3;
}
MOE_HD static inline void q3_k_values16(const BlockQ3_K& b, int e0, int (&q)[16]) {
    two_bits16(b.qs, e0, q);
    const uint8_t* hm = b.hmask + e0 % 32;
    const int bit = e0 / 32;
    for (int j = 0; j < 16; ++j) q[j] -= (hm[j] >> bit) & 1 ? 0 : 4;
}
MOE_HD static inline void q6_k_values16(const BlockQ6_K& b, int e0, int (&q)[16]) {
    const uint8_t* ql = b.ql + 64 * (e0 / 128) + e0 % 64;
    const uint8_t* qh = b.qh + 32 * (e0 / 128) + e0 % 32;
    const int sl = 4 * (e0 % 128 / 64);
    const int sh = 2 * (e0 % 128 / 32);
    for (int j = 0; j < 16; ++j) q[j] = (((ql[j] >> sl) & 0x0F) | ((qh[j] >> sh) & 3) << 4) - 32;
}

// IQ4_XS: the 6-bit scale ls of group g (the group scale is d * (ls - 32)): low nibble in
// scales_l[g / 2] (the low half for even g), top 2 bits at bit 2 * g of scales_h.
MOE_HD static inline int iq4_xs_scale(const BlockIQ4_XS& b, int g) {
    return ((b.scales_l[g / 2] >> (4 * (g % 2))) & 0x0F) | ((b.scales_h >> (2 * g)) & 3) << 4;
}

}  // namespace moe::kq
