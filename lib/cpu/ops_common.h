// Helpers shared by the non-matmul CPU kernels (cpu/ops_*.cpp): argument checks that name the
// offending operand, row indexing, task grains, and scalar math written so that GCC auto-vectorises
// the loops that call it on baseline x86-64 (no branches, no libm calls, no cross-lane reductions).
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/op_checks.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/types.h"

namespace moe::cpu::ops {

// Operand checks (type_str, shape_str, check_operand, check_same_shape, ...) come from core.
using namespace moe::op_checks;

// Row r (0 <= r < t.n_rows()) of t as (i1, i2, i3).
struct RowIndex {
    int64_t i1, i2, i3;
};
inline RowIndex split_row(const Tensor& t, int64_t r) {
    const int64_t i1 = r % t.ne[1];
    r /= t.ne[1];
    return {i1, r % t.ne[2], r / t.ne[2]};
}
inline uint8_t* row_ptr(const Tensor& t, int64_t r) {
    const RowIndex ri = split_row(t, r);
    return t.row(ri.i1, ri.i2, ri.i3);
}

// Rows per task so that each task touches at least ~`elems` elements: smaller tasks cost more in
// scheduling than they save in balance.
inline size_t row_grain(int64_t row_len, int64_t elems = 16384) {
    const int64_t g = row_len > 0 ? elems / row_len : 1;
    return static_cast<size_t>(g > 1 ? g : 1);
}

// fn(r) for every row r of dst, oneTBB-parallel with row_grain.
template <typename Fn>
void for_each_row(const Tensor& dst, Fn&& fn) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, dst.n_rows(), row_grain(dst.ne[0])),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          for (int64_t i = r.begin(); i < r.end(); ++i) fn(i);
                      });
}

// Ordering key of a router score (TOPK, GROUP_MASK): NaN ranks above every number and ties with +inf,
// so the order stays a strict weak ordering and a NaN score is picked: its NaN weight then reaches
// the output, where ranking it last would skip the expert and hide a corrupt weight.
inline float rank_key(float v) { return std::isnan(v) ? std::numeric_limits<float>::infinity() : v; }

// ---- scalar math for vectorisable loops ----

// c ? a : b through bit masks. A plain `?:` on floats is not if-converted under GCC's default
// -ftrapping-math, which keeps the loops that use it scalar.
inline float select(bool c, float a, float b) {
    const uint32_t m = 0u - static_cast<uint32_t>(c);
    return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// fp16 bits -> float, exact for every input (NaNs come back quiet with their payload, as F16C does),
// branch-free so that a loop of it vectorises. Normal, inf and NaN halves: move exponent and mantissa
// into float position, add 224 to the exponent (inf/NaN land on 255) and multiply by 2^-112 to undo
// the excess bias (exact). Subnormal halves m * 2^-24: put m in the mantissa of 0.5 and subtract 0.5.
inline float half_to_float(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
    const float normal = std::bit_cast<float>((two_w >> 4) + (224u << 23)) * 0x1.0p-112f;
    const float subnormal = std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(select(two_w < (1u << 27), subnormal, normal)));
}

// e^x in float, within 2 ulp of expf for x in [-87.33, 88.37]; 0 below, inf above, NaN for NaN.
// Cephes' range reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in two so n * hi is exact) and its
// degree-6 minimax polynomial for e^r; 2^n is built in the exponent bits. n is rounded with the
// 1.5 * 2^23 trick instead of floor/nearbyint, which baseline SSE2 cannot vectorise.
inline float exp_approx(float x) {
    constexpr float kLo = -87.33f, kHi = 88.37f;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t = y + kRound holds round(y) in its low bits
    float xc = select(x < kLo, kLo, x);
    xc = select(xc > kHi, kHi, xc);
    const float t = xc * 1.44269504088896341f + kRound;
    const float n = t - kRound;
    const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * (r * r) + r + 1.0f;
    const float scale = std::bit_cast<float>(static_cast<uint32_t>(ni + 127) << 23);
    const float y = er * scale;
    return select(x < kLo, 0.0f, select(x > kHi, std::bit_cast<float>(0x7F800000u), y));
}

// 1 / (1 + e^-x), evaluated through e^-|x| so that it neither overflows nor loses relative accuracy.
inline float sigmoid(float x) {
    const float e = exp_approx(select(x < 0.0f, x, -x));
    const float inv = 1.0f / (1.0f + e);
    return select(x >= 0.0f, inv, e * inv);
}

// Dot product of two float rows with 16 independent partial sums: a reduction the compiler may
// vectorise without reassociating floating-point math.
inline float dot_f32(const float* a, const float* b, int64_t n) {
    constexpr int kLanes = 16;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
    }
    for (; i < n; ++i) acc[i % kLanes] += a[i] * b[i];
    float s = 0.0f;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

// Sum of squares in the same lane-parallel form, finished in double.
inline double sum_sq_f32(const float* a, int64_t n) {
    constexpr int kLanes = 16;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * a[i + l];
    }
    for (; i < n; ++i) acc[i % kLanes] += a[i] * a[i];
    double s = 0.0;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

// n values of a contiguous F32 or F16 row into a contiguous F32 or F16 row: copied, widened exactly, or
// rounded to nearest even as fp32_to_fp16 (core/types.h) does.
inline void convert_row(const uint8_t* src, Type from, uint8_t* dst, Type to, int64_t n) {
    if (from == to) {
        std::memcpy(dst, src, static_cast<size_t>(n) * elem_size(to));
    } else if (from == Type::F16) {  // -> F32
        const auto* h = reinterpret_cast<const uint16_t*>(src);
        auto* f = reinterpret_cast<float*>(dst);
        for (int64_t i = 0; i < n; ++i) f[i] = half_to_float(h[i]);
    } else {  // F32 -> F16
        const auto* f = reinterpret_cast<const float*>(src);
        auto* h = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(f[i]);
    }
}

}  // namespace moe::cpu::ops
