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
// The FMA form (decode16<W, true>, decode_fma(W)) is for the tensor-core GEMM's BF16 tiles: one FMA per element
// (OneFma below), within about an ulp of each element of the exact form, and the same bits in every decoder of
// this folder that takes it (decode16_words<W, true>), so that the GEMM's fused decode and its dequantise-first
// path agree bit for bit.
//
// REQUIRES of every decoder: blk is 2-byte aligned (the fp16 fields are read as such; every block size
// here is even).
#pragma once

#include <cmath>
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

// An integer |q| < 2^22 as a float, exactly (static_cast<float>(q) on the host). Device code adds q to the
// bits of 1.5 * 2^23 (whose ulp is 1) and subtracts 1.5 * 2^23: an integer add and a float add at full
// rate, where the conversion instruction runs at a quarter of it. The same value either way.
MOE_HD inline float small_to_float(int q) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(0x4B400000 + q) - 12582912.0f;
#else
    return static_cast<float>(q);
#endif
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

// ---- the FMA form ----
// (u - bias) * scale + offset for a byte u as x * mul + add: u goes into bits 8-15 of 256.0f (x = 256 + u / 128,
// exactly), mul = 128 scale (exact) and add = offset - (2^15 + bias) scale, rounded once. The product inside the
// FMA is exact, so an element is its exact value rounded once, plus add's rounding, the same on every element of
// the group: half an ulp of add, about 2^-9 (1 + bias / 2^15) of the scale where the offset is small, or 2^-24 of
// the offset where it dominates (then the elements are about the offset: an ulp of theirs). Where add is exact
// (no offset, and bias * scale short: Q5_0, IQ4_NL, IQ4_XS with their FP16 scales) the form is exact up to the
// sign of a zero. A non-finite add (inf or NaN scale or offset) takes the exact form instead (finite_form), per
// half group.
struct OneFma {
    float mul, add;
};
MOE_HD inline OneFma one_fma(float scale, float bias, float offset) {
    return {128.0f * scale, fmaf(-(32768.0f + bias), scale, offset)};
}
// Scales and offsets come from FP16 fields times small integers (|scale| < 2^23): add overflows only where they
// are not finite, and inf - inf and NaN - NaN are NaN, not 0.
MOE_HD inline bool finite_form(OneFma f) { return f.add - f.add == 0.0f; }
// The element of byte value u (0 .. 255, the bias not yet taken off).
MOE_HD inline float fma_value(uint32_t u, OneFma f) { return fmaf(bits_to_float(0x43800000u | u << 8), f.mul, f.add); }

// Whether the tensor-core GEMM decodes W in the FMA form: every decoded type but Q2_K and Q3_K, whose fused
// 128-column GEMM kernels spill registers with it. Its dequantise-first path follows the same choice.
MOE_HD constexpr bool decode_fma(Type t) { return t != Type::Q2_K && t != Type::Q3_K; }

// The IQ4_NL / IQ4_XS grid (quant_blocks.h's kIq4nlValues) as two words of int8 bytes: device code
// cannot index a host array.
MOE_HD inline int iq4nl_value(int i) {
    constexpr uint64_t kLo = 0xF6EADDCFBFAD9881ull;  // -127 -104 -83 -65 -49 -35 -22 -10
    constexpr uint64_t kHi = 0x7159453526190D01ull;  //    1   13  25  38  53  69  89 113
    return static_cast<int8_t>(((i < 8 ? kLo : kHi) >> (8 * (i & 7))) & 0xFFu);
}

MOE_HD inline uint32_t load_u16(const uint8_t* p) { return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8; }

// v[j] = element 32 g + 16 h + j of the block (or super-block) at blk, h = 0 or 1: half a group, so that
// a kernel can decode a group in two passes of 16 values instead of holding 32 and their inputs at once.
// FMA: in the FMA form (above).
template <Type W, bool FMA = false>
MOE_HD inline void decode16(const uint8_t* blk, int g, int h, float (&v)[16]) {
    static_assert(decodes(W), "a type of quant_decode.h");
    // Element j from its byte value u[j] (the bias not taken off): one FMA, or exact(u[j]).
    auto finish = [&](const uint32_t (&u)[16], OneFma f, auto exact) {
        if (FMA && finite_form(f)) {
            for (int j = 0; j < 16; ++j) v[j] = fma_value(u[j], f);
        } else {
            for (int j = 0; j < 16; ++j) v[j] = exact(u[j]);
        }
    };
    uint32_t u[16];
    if constexpr (W == Type::Q4_1 || W == Type::Q5_1) {
        constexpr int kQs = W == Type::Q4_1 ? 4 : 8;  // after d, m (and qh)
        const float d = fp16_to_float(load_u16(blk));
        const float m = fp16_to_float(load_u16(blk + 2));
        const uint8_t* qs = blk + kQs;
        // Q5_1's fifth bits: element j's in bit j of qh, element 16 + j's in bit 16 + j.
        const uint32_t hb = W == Type::Q5_1 ? (load_u16(blk + 4) | load_u16(blk + 6) << 16) >> (16 * h) : 0u;
        for (int j = 0; j < 16; ++j) u[j] = ((qs[j] >> (4 * h)) & 0x0Fu) | ((hb >> j) & 1u) << 4;
        finish(u, one_fma(d, 0.0f, m), [&](uint32_t q) { return mul_rn(small_to_float(static_cast<int>(q)), d) + m; });
    } else if constexpr (W == Type::Q5_0) {
        const float d = fp16_to_float(load_u16(blk));
        const uint32_t hb = (load_u16(blk + 2) | load_u16(blk + 4) << 16) >> (16 * h);
        const uint8_t* qs = blk + 6;
        for (int j = 0; j < 16; ++j) u[j] = ((qs[j] >> (4 * h)) & 0x0Fu) | ((hb >> j) & 1u) << 4;
        finish(u, one_fma(d, 16.0f, 0.0f), [&](uint32_t q) { return small_to_float(static_cast<int>(q) - 16) * d; });
    } else if constexpr (W == Type::IQ4_NL || W == Type::IQ4_XS) {
        const float d0 = fp16_to_float(load_u16(blk));
        float d = d0;
        const uint8_t* qs = blk + 2;
        if constexpr (W == Type::IQ4_XS) {
            const auto& b = *reinterpret_cast<const BlockIQ4_XS*>(blk);
            d = d0 * small_to_float(kq::iq4_xs_scale(b, g) - 32);
            qs = b.qs + 16 * g;
        }
        // The grid's values biased by 128 (1 .. 241).
        for (int j = 0; j < 16; ++j) u[j] = static_cast<uint32_t>(iq4nl_value((qs[j] >> (4 * h)) & 0x0F) + 128);
        finish(u, one_fma(d, 128.0f, 0.0f), [&](uint32_t q) { return d * small_to_float(static_cast<int>(q) - 128); });
    } else if constexpr (W == Type::Q2_K) {
        const auto& b = *reinterpret_cast<const BlockQ2_K*>(blk);
        const float d = fp16_to_float(b.d);
        const float dmin = fp16_to_float(b.dmin);
        const int sc = b.scales[2 * g + h];  // the group's halves have a scale each
        const float dl = mul_rn(d, small_to_float(sc & 0x0F));
        const float ml = mul_rn(dmin, small_to_float(sc >> 4));
        int q[16];
        kq::two_bits16(b.qs, 32 * g + 16 * h, q);
        for (int j = 0; j < 16; ++j) u[j] = static_cast<uint32_t>(q[j]);
        finish(u, one_fma(dl, 0.0f, -ml),
               [&](uint32_t x) { return mul_rn(dl, small_to_float(static_cast<int>(x))) - ml; });
    } else if constexpr (W == Type::Q3_K) {
        const auto& b = *reinterpret_cast<const BlockQ3_K*>(blk);
        const float dl = fp16_to_float(b.d) * small_to_float(kq::q3_k_scale(b.scales, 2 * g + h));
        int q[16];
        kq::q3_k_values16(b, 32 * g + 16 * h, q);
        for (int j = 0; j < 16; ++j) u[j] = static_cast<uint32_t>(q[j] + 4);  // -4 .. 3, biased by 4
        finish(u, one_fma(dl, 4.0f, 0.0f), [&](uint32_t x) { return dl * small_to_float(static_cast<int>(x) - 4); });
    } else if constexpr (W == Type::Q4_K || W == Type::Q5_K) {
        // Q4_K and Q5_K share d, dmin, scales[12] at the front; Q5_K's qh[32] comes before its qs.
        const float d = fp16_to_float(load_u16(blk));
        const float dmin = fp16_to_float(load_u16(blk + 2));
        const uint8_t* scales = blk + 4;
        const uint8_t* qh = blk + 4 + kKScaleBytes;
        const uint8_t* qs = W == Type::Q4_K ? qh : qh + kQK_K / 8;
        int sc, m;
        kq::scale_min_k4(scales, g, sc, m);
        const float dl = mul_rn(d, small_to_float(sc));
        const float ml = mul_rn(dmin, small_to_float(m));
        for (int j = 0; j < 16; ++j) {
            const int e = 32 * g + 16 * h + j;
            int q = kq::nibble_k(qs, e);
            if constexpr (W == Type::Q5_K) q |= kq::high_bit(qh, e) << 4;
            u[j] = static_cast<uint32_t>(q);
        }
        finish(u, one_fma(dl, 0.0f, -ml),
               [&](uint32_t x) { return mul_rn(dl, small_to_float(static_cast<int>(x))) - ml; });
    } else {  // Q6_K
        const auto& b = *reinterpret_cast<const BlockQ6_K*>(blk);
        const float dl = fp16_to_float(b.d) * small_to_float(b.scales[2 * g + h]);
        int q[16];
        kq::q6_k_values16(b, 32 * g + 16 * h, q);
        for (int j = 0; j < 16; ++j) u[j] = static_cast<uint32_t>(q[j] + 32);  // -32 .. 31, biased by 32
        finish(u, one_fma(dl, 32.0f, 0.0f), [&](uint32_t x) { return dl * small_to_float(static_cast<int>(x) - 32); });
    }
}

// v[i] = element 32 g + i of the block (or super-block) at blk.
template <Type W, bool FMA = false>
MOE_HD inline void decode32(const uint8_t* blk, int g, float (&v)[32]) {
    float lo[16], hi[16];
    decode16<W, FMA>(blk, g, 0, lo);
    decode16<W, FMA>(blk, g, 1, hi);
    for (int j = 0; j < 16; ++j) {
        v[j] = lo[j];
        v[16 + j] = hi[j];
    }
}

// ---- rows staged for a tile kernel ----
// The tensor-core GEMM (cuda/matmul_mma.cuh) copies a row's bytes into shared memory 256 elements at a time
// (a unit: one super-block, or 8 blocks of 32) as the aligned 16-byte chunks that cover them, so that the
// unit starts at byte (its address & 15) of its staged copy, and decodes the unit's 8 groups from there,
// half a group at a time.
// tests/core/test_quant_decode.cpp stages rows this way on the host.
constexpr int kUnitElems = 256;
constexpr int kUnitGroups = kUnitElems / 32;

// Bytes of a unit of t.
MOE_HD constexpr int unit_bytes(Type t) { return block_bytes(t) * (kUnitElems / block_elems(t)); }
// 16-byte chunks that cover a unit at any even address (decoded rows are 2-byte aligned: the decoders'
// REQUIRES).
MOE_HD constexpr int unit_chunks16(Type t) { return (14 + unit_bytes(t) + 15) / 16; }

// v[j] = element 32 q + 16 h + j of the unit at u (q < kUnitGroups, h = 0 or 1). A row of 32-element
// blocks may end inside its last unit: only its groups are decoded.
template <Type W, bool FMA = false>
MOE_HD inline void decode_unit_half(const uint8_t* u, int q, int h, float (&v)[16]) {
    if constexpr (block_elems(W) == kUnitElems) {
        decode16<W, FMA>(u, q, h, v);
    } else {
        decode16<W, FMA>(u + q * block_bytes(W), 0, h, v);
    }
}

}  // namespace moe::qd
