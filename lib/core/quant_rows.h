// The row converters of the quantisation formats (the to_float / from_float entries of the type-traits
// table in types.cpp), and the float helpers they share. Internal to lib/core: everything else reaches
// them through type_traits().
//
// Nothing here may be built with -ffast-math: results are compared bit for bit with ggml and gguf-py.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

namespace moe {

// ---- float helpers with defined, reference-equal results ----

// float -> int32 by truncation. In range this is the C cast; NaN and out-of-range values give INT32_MIN,
// the "integer indefinite" value of x86's cvttss2si. ggml's reference quantisers convert with a plain
// C cast, which is undefined for such values; they only reach them on non-finite input, and on x86
// (where llama.cpp and numpy produce GGUF files) they get INT32_MIN.
inline int32_t trunc_to_i32(float x) {
    if (!(x >= -2147483648.0f && x < 2147483648.0f)) return INT32_MIN;
    return static_cast<int32_t>(x);
}

// x * y rounded to float before anything is added to it. With FP contraction across statements
// (-ffp-contract=fast: GCC in GNU modes, clang when asked, icx by default) and an FMA unit, the
// compiler may fuse `x * y + z` into one rounding, which changes bytes and values compared bit for bit
// with the references; the volatile store forces their two roundings.
inline float mul_rounded(float x, float y) {
    volatile float p = x * y;
    return p;
}

// Round half to even, as ggml's nearest_int (a magic-number addition) does for |x| < 2^22; outside
// that range the result is clamped by every caller anyway.
inline int nearest_int(float x) {
    if (!(x > -4194304.0f && x < 4194304.0f)) return x > 0 ? 4194304 : -4194304;  // NaN: the negative end
    return static_cast<int>(std::nearbyint(x));
}

// The value of largest magnitude among x[0..n), sign kept; the first one wins a tie (strict `<`, as
// ggml's loops); 0 for an all-zero block.
inline float signed_absmax(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

// ---- row converters: n elements, REQUIRES n % block size == 0 ----

// quant_legacy.cpp: 32-element blocks with an fp16 scale (and min)
void q4_1_to_float(const void* src, float* dst, int64_t n);
void q4_1_from_float(const float* src, void* dst, int64_t n);
void q5_0_to_float(const void* src, float* dst, int64_t n);
void q5_0_from_float(const float* src, void* dst, int64_t n);
void q5_1_to_float(const void* src, float* dst, int64_t n);
void q5_1_from_float(const float* src, void* dst, int64_t n);

// quant_k.cpp: the K-quants (256-element super-blocks) and their activation type Q8_K
void q2_k_to_float(const void* src, float* dst, int64_t n);
void q2_k_from_float(const float* src, void* dst, int64_t n);
void q3_k_to_float(const void* src, float* dst, int64_t n);
void q3_k_from_float(const float* src, void* dst, int64_t n);
void q4_k_to_float(const void* src, float* dst, int64_t n);
void q4_k_from_float(const float* src, void* dst, int64_t n);
void q5_k_to_float(const void* src, float* dst, int64_t n);
void q5_k_from_float(const float* src, void* dst, int64_t n);
void q6_k_to_float(const void* src, float* dst, int64_t n);
void q6_k_from_float(const float* src, void* dst, int64_t n);
void q8_k_to_float(const void* src, float* dst, int64_t n);
void q8_k_from_float(const float* src, void* dst, int64_t n);

// quant_iq4.cpp: the non-linear 4-bit grid
void iq4_nl_to_float(const void* src, float* dst, int64_t n);
void iq4_nl_from_float(const float* src, void* dst, int64_t n);
void iq4_xs_to_float(const void* src, float* dst, int64_t n);
void iq4_xs_from_float(const float* src, void* dst, int64_t n);

}  // namespace moe
