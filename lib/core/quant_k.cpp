// The K-quants (Q2_K .. Q6_K: 256-element super-blocks of 16- or 32-element groups, each group with its
// own small integer scale under one fp16 super-scale) and Q8_K, the activation type their dot products take.
//
// Dequantisation is bit-exact with ggml's dequantize_row_q*_K and gguf-py: the group scale (and min) is
// the fp16 super-scale times the small integer, rounded to float, then multiplied by the value (and the
// min subtracted from the rounded product).
//
// The quantisers are our own simple rounding schemes, not ggml's (which search for the scales that
// minimise a weighted error); they exist so that synthetic files and tests can hold these types. Their
// error is bounded per element (tests/core/test_quant_formats.cpp derives the bounds): integer scales
// are rounded up, never down, so a group's extreme values are never clamped. Q8_K is ggml's
// quantize_row_q8_K_ref.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/quant_rows.h"
#include "core/types.h"

namespace moe {
namespace {

using kq::high_bit;
using kq::nibble_k;
using kq::q6_k_value;
using kq::scale_min_k4;
using kq::two_bits;

// r rounded away from zero: an integer scale at least as large as the one wanted.
int round_up_magnitude(float r) { return static_cast<int>(r >= 0 ? std::ceil(r) : std::floor(r)); }

// ---- the asymmetric scheme of Q2_K, Q4_K, Q5_K: x ~ (d * sc) * q - dmin * m, q in [0, qmax] ----
// Per group: the min is -min(0, min x) (so m >= 0), rounded up; then the scale is rounded up so that
// the group's largest value fits. Outputs the fp16 super-scales and, per group, sc, m and the values q.
struct AsymK {
    int group;  // elements per group
    int qmax;   // largest value q
    int smax;   // largest integer scale / min
};

void quantize_asym(const AsymK& k, const float* x, uint16_t& d_bits, uint16_t& dmin_bits, uint8_t* sc, uint8_t* m,
                   uint8_t* q) {
    const int n_groups = kQK_K / k.group;
    float need_min[16], hi[16];
    float max_min = 0.0f;
    for (int g = 0; g < n_groups; ++g) {
        const float* xg = x + g * k.group;
        float lo = 0.0f;
        hi[g] = 0.0f;
        for (int j = 0; j < k.group; ++j) {
            lo = std::min(lo, xg[j]);
            hi[g] = std::max(hi[g], xg[j]);
        }
        need_min[g] = -lo;
        max_min = std::max(max_min, need_min[g]);
    }
    dmin_bits = fp32_to_fp16(max_min / static_cast<float>(k.smax));
    const float dmin = fp16_to_fp32(dmin_bits);
    float offset[16], need_scale[16];
    float max_scale = 0.0f;
    for (int g = 0; g < n_groups; ++g) {
        m[g] = dmin > 0 ? static_cast<uint8_t>(std::min(k.smax, round_up_magnitude(need_min[g] / dmin))) : 0;
        offset[g] = dmin * static_cast<float>(m[g]);  // what dequantisation subtracts
        need_scale[g] = (hi[g] + offset[g]) / static_cast<float>(k.qmax);
        max_scale = std::max(max_scale, need_scale[g]);
    }
    d_bits = fp32_to_fp16(max_scale / static_cast<float>(k.smax));
    const float d = fp16_to_fp32(d_bits);
    for (int g = 0; g < n_groups; ++g) {
        sc[g] = d > 0 ? static_cast<uint8_t>(std::min(k.smax, round_up_magnitude(need_scale[g] / d))) : 0;
        const float dl = d * static_cast<float>(sc[g]);
        for (int j = 0; j < k.group; ++j) {
            const int v = dl > 0 ? nearest_int((x[g * k.group + j] + offset[g]) / dl) : 0;
            q[g * k.group + j] = static_cast<uint8_t>(std::clamp(v, 0, k.qmax));
        }
    }
}

// ---- the symmetric scheme of Q3_K and Q6_K: x ~ (d * l) * q, q in [qmin, qmax], l in [lmin, lmax] ----
// Per group the value of largest magnitude lands on qmin (as Q4_0 does); the group scale of largest
// magnitude lands on lmin, and the others are rounded away from zero. A group scale of the other sign
// and nearly the largest magnitude would round to -lmin, one past lmax: clamped to lmax, its values would
// overrun both ends of q. It takes lmin instead, the other sign, which puts its largest |x| on the short
// side qmax: a step at most (plus qmax times the rounding of the fp16 d), as for the values of the
// other sign in every group.
struct SymK {
    int group;
    int qmin, qmax;
    int lmin, lmax;
};

void quantize_sym(const SymK& k, const float* x, uint16_t& d_bits, int* l, int* q) {
    const int n_groups = kQK_K / k.group;
    float s[16];
    float big = 0.0f;
    for (int g = 0; g < n_groups; ++g) {
        s[g] = signed_absmax(x + g * k.group, k.group) / static_cast<float>(k.qmin);
        if (std::fabs(s[g]) > std::fabs(big)) big = s[g];
    }
    d_bits = fp32_to_fp16(big / static_cast<float>(k.lmin));
    const float d = fp16_to_fp32(d_bits);
    for (int g = 0; g < n_groups; ++g) {
        const int up = d != 0 ? round_up_magnitude(s[g] / d) : 0;
        l[g] = up > k.lmax ? k.lmin : std::max(up, k.lmin);
        const float dl = d * static_cast<float>(l[g]);
        for (int j = 0; j < k.group; ++j) {
            const int v = dl != 0 ? nearest_int(x[g * k.group + j] / dl) : 0;
            q[g * k.group + j] = std::clamp(v, k.qmin, k.qmax);
        }
    }
}

void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
    for (int j = 0; j < 4; ++j) {
        s[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4);
    }
}

// Dequantises one Q4_K / Q5_K block: 8 groups of 32 under d * sc and dmin * m; value(e) is element e's q.
template <typename Block, typename Value>
void k4_block_to_float(const Block& blk, float* y, Value value) {
    const float d = fp16_to_fp32(blk.d);
    const float dmin = fp16_to_fp32(blk.dmin);
    for (int g = 0; g < 8; ++g) {
        int sc, m;
        scale_min_k4(blk.scales, g, sc, m);
        const float dl = d * static_cast<float>(sc);
        const float ml = dmin * static_cast<float>(m);
        for (int e = 32 * g; e < 32 * g + 32; ++e) y[e] = mul_rounded(dl, static_cast<float>(value(e))) - ml;
    }
}

void pack_q3_k_scales(const int l[16], uint8_t* s) {
    std::memset(s, 0, kKScaleBytes);
    for (int i = 0; i < 16; ++i) {
        const int v = l[i] + 32;
        s[i % 8] = static_cast<uint8_t>(s[i % 8] | (v & 0x0F) << (4 * (i / 8)));
        s[8 + i % 4] = static_cast<uint8_t>(s[8 + i % 4] | (v >> 4) << (2 * (i / 4)));
    }
}

// The writers of the fields whose readers are in core/quant_k_layout.h (same positions).
void put_two_bits(uint8_t* qs, int e, int v) {
    uint8_t& b = qs[32 * (e / 128) + e % 32];
    b = static_cast<uint8_t>(b | (v & 3) << (2 * (e % 128 / 32)));
}

void put_nibble_k(uint8_t* qs, int e, int v) {
    uint8_t& b = qs[32 * (e / 64) + e % 32];
    b = static_cast<uint8_t>(b | (v & 0x0F) << (4 * (e % 64 / 32)));
}
void put_high_bit(uint8_t* bits, int e, int v) {
    bits[e % 32] = static_cast<uint8_t>(bits[e % 32] | (v & 1) << (e / 32));
}

void put_q6_k_value(BlockQ6_K& b, int e, int q) {
    const int v = q + 32;
    const int h = e / 128, a = e % 128 / 64, m = e % 64;
    b.ql[64 * h + m] = static_cast<uint8_t>(b.ql[64 * h + m] | (v & 0x0F) << (4 * a));
    uint8_t& hb = b.qh[32 * h + e % 32];
    hb = static_cast<uint8_t>(hb | (v >> 4) << (2 * (e % 128 / 32)));
}

}  // namespace

// ---- Q2_K: 16 groups of 16, 4-bit scale and min per group (scales[g] = sc | m << 4), 2-bit values ----

void q2_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ2_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float dmin = fp16_to_fp32(x[b].dmin);
        float* y = dst + b * kQK_K;
        for (int g = 0; g < 16; ++g) {
            const float dl = d * static_cast<float>(x[b].scales[g] & 0x0F);
            const float ml = dmin * static_cast<float>(x[b].scales[g] >> 4);
            for (int e = 16 * g; e < 16 * g + 16; ++e) {
                y[e] = mul_rounded(dl, static_cast<float>(two_bits(x[b].qs, e))) - ml;
            }
        }
    }
}

void q2_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ2_K*>(dst);
    constexpr AsymK kSpec{16, 3, 15};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        uint8_t sc[16], m[16], q[kQK_K];
        quantize_asym(kSpec, src + b * kQK_K, y[b].d, y[b].dmin, sc, m, q);
        for (int g = 0; g < 16; ++g) y[b].scales[g] = static_cast<uint8_t>(sc[g] | m[g] << 4);
        std::memset(y[b].qs, 0, sizeof y[b].qs);
        for (int e = 0; e < kQK_K; ++e) put_two_bits(y[b].qs, e, q[e]);
    }
}

// ---- Q3_K: 16 groups of 16, 6-bit signed scale per group, values in [-4, 3] ----

void q3_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ3_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float* y = dst + b * kQK_K;
        for (int g = 0; g < 16; ++g) {
            const float dl = d * static_cast<float>(kq::q3_k_scale(x[b].scales, g));
            for (int e = 16 * g; e < 16 * g + 16; ++e) {
                y[e] = dl * static_cast<float>(kq::q3_k_value(x[b], e));
            }
        }
    }
}

void q3_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ3_K*>(dst);
    constexpr SymK kSpec{16, -4, 3, -32, 31};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        int l[16], q[kQK_K];
        quantize_sym(kSpec, src + b * kQK_K, y[b].d, l, q);
        pack_q3_k_scales(l, y[b].scales);
        std::memset(y[b].qs, 0, sizeof y[b].qs);
        std::memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int e = 0; e < kQK_K; ++e) {
            put_two_bits(y[b].qs, e, (q[e] + 4) & 3);
            put_high_bit(y[b].hmask, e, (q[e] + 4) >> 2);
        }
    }
}

// ---- Q4_K: 8 groups of 32, 6-bit scale and min per group, 4-bit values ----

void q4_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ4_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        k4_block_to_float(x[b], dst + b * kQK_K, [&](int e) { return nibble_k(x[b].qs, e); });
    }
}

void q4_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ4_K*>(dst);
    constexpr AsymK kSpec{32, 15, 63};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        uint8_t sc[8], m[8], q[kQK_K];
        quantize_asym(kSpec, src + b * kQK_K, y[b].d, y[b].dmin, sc, m, q);
        pack_scale_min_k4(sc, m, y[b].scales);
        std::memset(y[b].qs, 0, sizeof y[b].qs);
        for (int e = 0; e < kQK_K; ++e) put_nibble_k(y[b].qs, e, q[e]);
    }
}

// ---- Q5_K: Q4_K with a fifth bit per value ----

void q5_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ5_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        k4_block_to_float(x[b], dst + b * kQK_K,
                          [&](int e) { return nibble_k(x[b].qs, e) | high_bit(x[b].qh, e) << 4; });
    }
}

void q5_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ5_K*>(dst);
    constexpr AsymK kSpec{32, 31, 63};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        uint8_t sc[8], m[8], q[kQK_K];
        quantize_asym(kSpec, src + b * kQK_K, y[b].d, y[b].dmin, sc, m, q);
        pack_scale_min_k4(sc, m, y[b].scales);
        std::memset(y[b].qs, 0, sizeof y[b].qs);
        std::memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < kQK_K; ++e) {
            put_nibble_k(y[b].qs, e, q[e]);
            put_high_bit(y[b].qh, e, q[e] >> 4);
        }
    }
}

// ---- Q6_K: 16 groups of 16, int8 scale per group, values in [-32, 31] ----

void q6_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ6_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float* y = dst + b * kQK_K;
        for (int g = 0; g < 16; ++g) {
            const float dl = d * static_cast<float>(x[b].scales[g]);
            for (int e = 16 * g; e < 16 * g + 16; ++e) y[e] = dl * static_cast<float>(q6_k_value(x[b], e));
        }
    }
}

void q6_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ6_K*>(dst);
    constexpr SymK kSpec{16, -32, 31, -128, 127};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        int l[16], q[kQK_K];
        quantize_sym(kSpec, src + b * kQK_K, y[b].d, l, q);
        for (int g = 0; g < 16; ++g) y[b].scales[g] = static_cast<int8_t>(l[g]);
        std::memset(y[b].ql, 0, sizeof y[b].ql);
        std::memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < kQK_K; ++e) put_q6_k_value(y[b], e, q[e]);
    }
}

// ---- Q8_K: float scale, int8 values, sums of 16 ----

void q8_k_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockQ8_K*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        for (int j = 0; j < kQK_K; ++j) dst[b * kQK_K + j] = static_cast<float>(x[b].qs[j]) * x[b].d;
    }
}

// ggml's quantize_row_q8_K_ref: the value of largest magnitude maps to -127 exactly (iscale = -127 / max),
// the others round to nearest, even on ties; the opposite side is capped at 127.
void q8_k_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockQ8_K*>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float* x = src + b * kQK_K;
        const float max = signed_absmax(x, kQK_K);
        if (max == 0.0f) {
            std::memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < kQK_K; ++j) y[b].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
        for (int g = 0; g < kQK_K / 16; ++g) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += y[b].qs[16 * g + j];
            y[b].bsums[g] = static_cast<int16_t>(sum);
        }
        y[b].d = 1 / iscale;
    }
}

}  // namespace moe
