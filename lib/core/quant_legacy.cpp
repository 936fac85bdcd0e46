// Q4_1, Q5_0 and Q5_1: ggml's 32-element formats with an fp16 scale (and, for the _1 kinds, an fp16
// minimum). The quantisers are bit-exact with ggml's quantize_row_*_ref and gguf-py's numpy versions:
// the same float operations in the same order, each rounded on its own (mul_rounded where a product is
// followed by an addition). The dequantisers do what ggml's dequantize_row_* and gguf-py do: one
// product, and for the _1 kinds the minimum added to the rounded product.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_rows.h"
#include "core/types.h"

namespace moe {
namespace {

constexpr int kHalf = kQK / 2;

// q = min(top, trunc(v + bias)), as the references' `MIN(top, (int8_t)(v + bias))` on values that
// cannot be negative here; the truncation keeps the low byte like the C conversion on x86.
uint8_t clamp_trunc(float v, float bias, int top) {
    return static_cast<uint8_t>(std::min<int>(top, static_cast<uint8_t>(trunc_to_i32(v + bias))));
}

// The _1 kinds: d = (max - min) / top, q = min(top, trunc((x - min) / d + 0.5)); the extremes are the
// first occurrences (strict comparisons, as ggml's loops). Writes the fp16 d and m and the 32 values q.
// ggml does not clamp Q5_1's q ((x - min) / d + 0.5 stays below 32) and gguf-py clips to 31: clamping
// agrees with both and keeps a stray value from spilling into the next bit.
void quantize_min_max(const float* x, int top, uint16_t& d_bits, uint16_t& m_bits, uint8_t q[kQK]) {
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    const float d = (hi - lo) / static_cast<float>(top);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    d_bits = fp32_to_fp16(d);
    m_bits = fp32_to_fp16(lo);
    for (int j = 0; j < kQK; ++j) q[j] = clamp_trunc(mul_rounded(x[j] - lo, id), 0.5f, top);
}

// Bit j of the little-endian 32-bit word qh: the fifth bit of element j.
uint32_t load_qh(const uint8_t qh[4]) {
    return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 | static_cast<uint32_t>(qh[2]) << 16 |
           static_cast<uint32_t>(qh[3]) << 24;
}
void store_qh(uint32_t v, uint8_t qh[4]) {
    for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(v >> (8 * k));
}

// Packs 32 values of up to 5 bits: low nibbles into qs, fifth bits into qh.
void pack5(const uint8_t q[kQK], uint8_t qs[kHalf], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < kHalf; ++j) {
        qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | (q[kHalf + j] & 0x0F) << 4);
        h |= static_cast<uint32_t>(q[j] >> 4 & 1) << j;
        h |= static_cast<uint32_t>(q[kHalf + j] >> 4 & 1) << (j + kHalf);
    }
    store_qh(h, qh);
}

// Element j (0..31) of a block with nibbles qs and fifth bits h.
int unpack5(const uint8_t qs[kHalf], uint32_t h, int j) {
    const int nib = j < kHalf ? qs[j] & 0x0F : qs[j - kHalf] >> 4;
    return nib | static_cast<int>(h >> j & 1) << 4;
}

}  // namespace

// ---- Q4_1: d = (max - min) / 15, q = min(15, trunc((x - min) / d + 0.5)) ----

void q4_1_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockQ4_1*>(dst);
    for (int64_t b = 0; b < n / kQK; ++b) {
        uint8_t q[kQK];
        quantize_min_max(src + b * kQK, 15, y[b].d, y[b].m, q);
        for (int j = 0; j < kHalf; ++j) y[b].qs[j] = static_cast<uint8_t>(q[j] | q[kHalf + j] << 4);
    }
}

void q4_1_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockQ4_1*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float m = fp16_to_fp32(x[b].m);
        float* y = dst + b * kQK;
        for (int j = 0; j < kHalf; ++j) {
            y[j] = mul_rounded(static_cast<float>(x[b].qs[j] & 0x0F), d) + m;
            y[kHalf + j] = mul_rounded(static_cast<float>(x[b].qs[j] >> 4), d) + m;
        }
    }
}

// ---- Q5_0: d = max / -16 (max: the value of largest magnitude), q = min(31, trunc(x / d + 16.5)) ----

void q5_0_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockQ5_0*>(dst);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float* x = src + b * kQK;
        const float d = signed_absmax(x, kQK) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        uint8_t q[kQK];
        for (int j = 0; j < kQK; ++j) q[j] = clamp_trunc(mul_rounded(x[j], id), 16.5f, 31);
        pack5(q, y[b].qs, y[b].qh);
    }
}

void q5_0_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockQ5_0*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const uint32_t h = load_qh(x[b].qh);
        for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = static_cast<float>(unpack5(x[b].qs, h, j) - 16) * d;
    }
}

// ---- Q5_1: d = (max - min) / 31, q = trunc((x - min) / d + 0.5) ----

void q5_1_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockQ5_1*>(dst);
    for (int64_t b = 0; b < n / kQK; ++b) {
        uint8_t q[kQK];
        quantize_min_max(src + b * kQK, 31, y[b].d, y[b].m, q);
        pack5(q, y[b].qs, y[b].qh);
    }
}

void q5_1_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockQ5_1*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float m = fp16_to_fp32(x[b].m);
        const uint32_t h = load_qh(x[b].qh);
        for (int j = 0; j < kQK; ++j) {
            dst[b * kQK + j] = mul_rounded(static_cast<float>(unpack5(x[b].qs, h, j)), d) + m;
        }
    }
}

}  // namespace moe
