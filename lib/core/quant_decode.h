// One group of 32 elements of the formats the CUDA kernels read through a decoder instead of a fused
// integer path: Q4_1, Q5_0, Q5_1, IQ4_NL (32-element blocks: group 0) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS (256-element super-blocks: groups 0..7), decoded to floats on the host and in device code
// alike (MOE_HD), so that the CUDA kernels only add indexing around code the host tests prove.
//
// The values are bit for bit those of lib/core's to_float (tests/core/test_quant_decode.cpp checks every
// type on random bytes, extreme and non-finite scales included): the same float operations in the same
// order, and every product that a sum follows rounded on its own (mul_rn), so that no FMA contraction
// (nvcc contracts by default) changes a value.
//
// REQUIRES of every decoder: blk is 2-byte aligned (the fp16 fields are read as such; every block size
// here is even).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/types.h"

namespace moe::qd {

// The weight types decoded here.
MOE_HD constexpr bool decodes(Type t) {
    return t == Type::Q4_1 || t == Type::Q5_0 || t == Type::Q5_1 || t == Type::IQ4_NL || t == Type::Q2_K ||
           t == Type::Q3_K || t == Type::Q4_K || t == Type::Q5_K || t == Type::Q6_K || t == Type::IQ4_XS;
}
// Elements of one block (32) or super-block (256) of a decoded type.
MOE_HD constexpr int block_elems(Type t) {
    return t == Type::Q4_1 || t == Type::Q5_0 || t == Type::Q5_1 || t == Type::IQ4_NL ? 32 : 256;
}
// Its bytes (as types.cpp's traits table and quant_blocks.h's structs).
MOE_HD constexpr int block_bytes(Type t) {
    switch (t) {
        case Type::Q4_1: return 20;
        case Type::Q5_0: return 22;
        case Type::Q5_1: return 24;
        case Type::IQ4_NL: return 18;
        case Type::Q2_K: return 84;
        case Type::Q3_K: return 110;
        case Type::Q4_K: return 144;
        case Type::Q5_K: return 176;
        case Type::Q6_K: return 210;
        case Type::IQ4_XS: return 136;
        default: return 0;
    }
}

MOE_HD inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

// fp16 bits -> float as core/types.cpp's fp16_to_fp32: exact, NaN payloads kept and made quiet.
MOE_HD inline float fp16_to_float(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | mant << 13 | (mant != 0 ? 0x00400000u : 0u));
    if (exp != 0) return bits_to_float(sign | (exp + (127 - 15)) << 23 | mant << 13);
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign != 0 ? -v : v;
}

// a * b rounded to float, never fused with a following sum (quant_rows.h's mul_rounded on the host).
MOE_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    volatile float p = a * b;
    return p;
#endif
}

// The IQ4_NL / IQ4_XS grid (quant_blocks.h's kIq4nlValues) as two words of int8 bytes: device code
// cannot index a host array.
MOE_HD inline int iq4nl_value(int i) {
    constexpr uint64_t kLo = 0xF6EADDCFBFAD9881ull;  // -127 -104 -83 -65 -49 -35 -22 -10
    constexpr uint64_t kHi = 0x7159453526190D01ull;  //    1   13  25  38  53  69  89 113
    return static_cast<int8_t>(((i < 8 ? kLo : kHi) >> (8 * (i & 7))) & 0xFFu);
}

MOE_HD inline uint32_t load_u16(const uint8_t* p) { return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8; }

// v[i] = element 32 g + i of the block (or super-block) at blk.
template <Type W>
MOE_HD inline void decode32(const uint8_t* blk, int g, float (&v)[32]) {
    static_assert(decodes(W), "a type of quant_decode.h");
    if constexpr (W == Type::Q4_1 || W == Type::Q5_1) {
        constexpr int kQs = W == Type::Q4_1 ? 4 : 8;  // after d, m (and qh)
        const float d = fp16_to_float(load_u16(blk));
        const float m = fp16_to_float(load_u16(blk + 2));
        const uint8_t* qs = blk + kQs;
        const uint32_t h = W == Type::Q5_1 ? load_u16(blk + 4) | load_u16(blk + 6) << 16 : 0u;
        for (int j = 0; j < 16; ++j) {
            const int lo = (qs[j] & 0x0F) | static_cast<int>((h >> j) & 1u) << 4;
            const int hi = (qs[j] >> 4) | static_cast<int>((h >> (j + 16)) & 1u) << 4;
            v[j] = mul_rn(static_cast<float>(lo), d) + m;
            v[16 + j] = mul_rn(static_cast<float>(hi), d) + m;
        }
    } else if constexpr (W == Type::Q5_0) {
        const float d = fp16_to_float(load_u16(blk));
        const uint32_t h = load_u16(blk + 2) | load_u16(blk + 4) << 16;
        const uint8_t* qs = blk + 6;
        for (int j = 0; j < 16; ++j) {
            const int lo = (qs[j] & 0x0F) | static_cast<int>((h >> j) & 1u) << 4;
            const int hi = (qs[j] >> 4) | static_cast<int>((h >> (j + 16)) & 1u) << 4;
            v[j] = static_cast<float>(lo - 16) * d;
            v[16 + j] = static_cast<float>(hi - 16) * d;
        }
    } else if constexpr (W == Type::IQ4_NL || W == Type::IQ4_XS) {
        const float d0 = fp16_to_float(load_u16(blk));
        float d = d0;
        const uint8_t* qs = blk + 2;
        if constexpr (W == Type::IQ4_XS) {
            const auto& b = *reinterpret_cast<const BlockIQ4_XS*>(blk);
            d = d0 * static_cast<float>(kq::iq4_xs_scale(b, g) - 32);
            qs = b.qs + 16 * g;
        }
        for (int j = 0; j < 16; ++j) {
            v[j] = d * static_cast<float>(iq4nl_value(qs[j] & 0x0F));
            v[16 + j] = d * static_cast<float>(iq4nl_value(qs[j] >> 4));
        }
    } else if constexpr (W == Type::Q2_K) {
        const auto& b = *reinterpret_cast<const BlockQ2_K*>(blk);
        const float d = fp16_to_float(b.d);
        const float dmin = fp16_to_float(b.dmin);
        for (int h = 0; h < 2; ++h) {  // the two groups of 16
            const int sc = b.scales[2 * g + h];
            const float dl = mul_rn(d, static_cast<float>(sc & 0x0F));
            const float ml = mul_rn(dmin, static_cast<float>(sc >> 4));
            for (int j = 0; j < 16; ++j) {
                const int e = 32 * g + 16 * h + j;
                v[16 * h + j] = mul_rn(dl, static_cast<float>(kq::two_bits(b.qs, e))) - ml;
            }
        }
    } else if constexpr (W == Type::Q3_K) {
        const auto& b = *reinterpret_cast<const BlockQ3_K*>(blk);
        const float d = fp16_to_float(b.d);
        for (int h = 0; h < 2; ++h) {
            const float dl = d * static_cast<float>(kq::q3_k_scale(b.scales, 2 * g + h));
            for (int j = 0; j < 16; ++j) v[16 * h + j] = dl * static_cast<float>(kq::q3_k_value(b, 32 * g + 16 * h + j));
        }
    } else if constexpr (W == Type::Q4_K || W == Type::Q5_K) {
        // Q4_K and Q5_K share d, dmin, scales[12] at the front; Q5_K's qh[32] comes before its qs.
        const float d = fp16_to_float(load_u16(blk));
        const float dmin = fp16_to_float(load_u16(blk + 2));
        const uint8_t* scales = blk + 4;
        const uint8_t* qh = blk + 4 + kKScaleBytes;
        const uint8_t* qs = W == Type::Q4_K ? qh : qh + kQK_K / 8;
        int sc, m;
        kq::scale_min_k4(scales, g, sc, m);
        const float dl = mul_rn(d, static_cast<float>(sc));
        const float ml = mul_rn(dmin, static_cast<float>(m));
        for (int j = 0; j < 32; ++j) {
            const int e = 32 * g + j;
            int q = kq::nibble_k(qs, e);
            if constexpr (W == Type::Q5_K) q |= kq::high_bit(qh, e) << 4;
            v[j] = mul_rn(dl, static_cast<float>(q)) - ml;
        }
    } else {  // Q6_K
        const auto& b = *reinterpret_cast<const BlockQ6_K*>(blk);
        const float d = fp16_to_float(b.d);
        for (int h = 0; h < 2; ++h) {
            const float dl = d * static_cast<float>(b.scales[2 * g + h]);
            for (int j = 0; j < 16; ++j) v[16 * h + j] = dl * static_cast<float>(kq::q6_k_value(b, 32 * g + 16 * h + j));
        }
    }
}

}  // namespace moe::qd
