// IQ4_NL and IQ4_XS: 4-bit indices into the non-linear grid kIq4nlValues (-127 .. 113), under an fp16
// scale per 32 elements (IQ4_NL) or an fp16 super-scale times a 6-bit group scale (IQ4_XS).
//
// Dequantisation is bit-exact with ggml's dequantize_row_iq4_* and gguf-py. The quantisers are our own
// simple scheme (ggml searches scales to minimise a weighted error): the value of largest magnitude lands
// on the grid's end -127 and every value takes its nearest grid point. They exist so that synthetic files
// and tests can hold these types; tests/core/test_quant_formats.cpp derives their error bound.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/quant_rows.h"
#include "core/types.h"

namespace moe {
namespace {

constexpr int kHalf = kQK / 2;
constexpr int kZeroIndex = 8;  // the grid value 1, used where the scale is zero (any index gives 0)

// Index of the grid value nearest to v; a tie keeps the lower index.
uint8_t nearest_grid_index(float v) {
    uint8_t best = 0;
    float best_err = std::fabs(v - kIq4nlValues[0]);
    for (uint8_t i = 1; i < 16; ++i) {
        const float err = std::fabs(v - kIq4nlValues[i]);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

// The scale that puts a group's value of largest magnitude on -127 (0 for an all-zero group).
float group_scale(const float* x) { return signed_absmax(x, kQK) / static_cast<float>(kIq4nlValues[0]); }

// 32 values on the grid under scale d, packed as nibbles (element j < 16 low, j + 16 high of byte j).
void pack_group(const float* x, float d, uint8_t qs[kHalf]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kHalf; ++j) {
        const uint8_t lo = d != 0.0f ? nearest_grid_index(x[j] * id) : kZeroIndex;
        const uint8_t hi = d != 0.0f ? nearest_grid_index(x[kHalf + j] * id) : kZeroIndex;
        qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
}

void unpack_group(const uint8_t qs[kHalf], float d, float* y) {
    for (int j = 0; j < kHalf; ++j) {
        y[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0x0F]);
        y[kHalf + j] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
}

}  // namespace

// ---- IQ4_NL: 32 elements, fp16 scale ----

void iq4_nl_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) unpack_group(x[b].qs, fp16_to_fp32(x[b].d), dst + b * kQK);
}

void iq4_nl_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockIQ4_NL*>(dst);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float* x = src + b * kQK;
        y[b].d = fp32_to_fp16(group_scale(x));
        pack_group(x, fp16_to_fp32(y[b].d), y[b].qs);  // indices chosen under the scale that is stored
    }
}

// ---- IQ4_XS: 8 groups of 32, group scale d * (ls - 32) with ls 6-bit (kq::iq4_xs_scale) ----

void iq4_xs_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    const auto* x = static_cast<const BlockIQ4_XS*>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        for (int g = 0; g < kQK_K / kQK; ++g) {
            const int ls = kq::iq4_xs_scale(x[b], g);
            unpack_group(x[b].qs + kHalf * g, d * static_cast<float>(ls - 32), dst + b * kQK_K + kQK * g);
        }
    }
}

// The group scale of largest magnitude lands on -32 (d = that scale / -32); the others round to nearest.
// A group whose scale has the other sign and nearly the largest magnitude would round to +32, one past the
// 6-bit range: clamped to +31 its values would overrun the grid's ends by 32/31 (up to ~17.5 grid units of
// error). It takes -32 instead, the other sign: its largest |x| then falls on the grid's +113 side, inside
// the 14 units every group's positive end can lose (tests/core/test_quant_formats.cpp derives the bound).
void iq4_xs_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK_K == 0);
    auto* y = static_cast<BlockIQ4_XS*>(dst);
    constexpr int kGroups = kQK_K / kQK;
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float* x = src + b * kQK_K;
        float s[kGroups];
        float big = 0.0f;
        for (int g = 0; g < kGroups; ++g) {
            s[g] = group_scale(x + kQK * g);
            if (std::fabs(s[g]) > std::fabs(big)) big = s[g];
        }
        y[b].d = fp32_to_fp16(big / -32.0f);
        const float d = fp16_to_fp32(y[b].d);
        y[b].scales_h = 0;
        std::memset(y[b].scales_l, 0, sizeof y[b].scales_l);
        for (int g = 0; g < kGroups; ++g) {
            const int nearest = d != 0.0f ? nearest_int(s[g] / d) : 0;
            const int l = nearest > 31 ? -32 : std::max(-32, nearest);
            const int ls = l + 32;
            y[b].scales_l[g / 2] = static_cast<uint8_t>(y[b].scales_l[g / 2] | (ls & 0x0F) << (4 * (g % 2)));
            y[b].scales_h = static_cast<uint16_t>(y[b].scales_h | (ls >> 4) << (2 * g));
            pack_group(x + kQK * g, d * static_cast<float>(l), y[b].qs + kHalf * g);
        }
    }
}

}  // namespace moe
