// Block layouts of the ggml quantisation formats beyond Q8_0 / Q4_0 / MXFP4 (those are in types.h):
// the bytes a GGUF file stores, exactly as ggml-common.h defines them. Scales are fp16 bits unless
// said otherwise; "nibbles" put element j of a 32-group in the low half of byte j % 16 for j < 16 and
// in the high half for j >= 16.
//
//   Q4_1  (32)  { d; m; qs[16] }                   x = q * d + m,          q = 4-bit nibble
//   Q5_0  (32)  { d; qh[4]; qs[16] }               x = (q - 16) * d,       q = nibble | bit j of qh << 4
//   Q5_1  (32)  { d; m; qh[4]; qs[16] }            x = q * d + m
//   Q2_K  (256) { scales[16]; qs[64]; d; dmin }    16 groups of 16: x = d*(sc&15) * q - dmin*(sc>>4), q 2-bit
//   Q3_K  (256) { hmask[32]; qs[64]; scales[12]; d }  16 groups of 16: x = d*(sc-32) * q, q in [-4, 3]
//                                                  (2 low bits in qs, the high bit in hmask set means +4),
//                                                  sc 6-bit signed-offset
//   Q4_K  (256) { d; dmin; scales[12]; qs[128] }   8 groups of 32: x = d*sc * q - dmin*m, 6-bit sc and m
//   Q5_K  (256) { d; dmin; scales[12]; qh[32]; qs[128] }   as Q4_K with a fifth bit per value from qh
//   Q6_K  (256) { ql[128]; qh[64]; scales[16] (int8); d }  16 groups of 16: x = d*sc * (q - 32), q 6-bit
//   Q8_K  (256) { float d; qs[256] (int8); bsums[16] (int16) }   x = q * d; bsums: sums of 16 qs each
//                                                  (what K-quant dot products take as activations)
//   IQ4_NL (32) { d; qs[16] }                      x = d * kIq4nlValues[nibble]
//   IQ4_XS (256){ d; scales_h (u16); scales_l[4]; qs[128] }  8 groups of 32: x = d*(ls-32) * kIq4nlValues[nibble],
//                                                  ls 6-bit (low 4 bits in scales_l, high 2 in scales_h)
// Where the bits of the K-quant scales and values sit is spelled out next to their accessors
// (quant_k_layout.h).
#pragma once

#include <cstdint>

namespace moe {

constexpr int kQK_K = 256;  // elements per super-block of the K-quants and IQ4_XS
constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K, 6-bit scales of Q3_K

struct BlockQ4_1 {
    uint16_t d, m;
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];
    uint8_t qs[kQK_K / 4];
    uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];
    uint8_t qs[kQK_K / 4];
    uint8_t scales[kKScaleBytes];
    uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ4_K {
    uint16_t d, dmin;
    uint8_t scales[kKScaleBytes];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
    uint16_t d, dmin;
    uint8_t scales[kKScaleBytes];
    uint8_t qh[kQK_K / 8];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQK_K / 64];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace moe
