// Element types and quantisation formats: the type-traits table, fp16/bf16/e8m0 conversions and the
// scalar reference converters of F16, BF16, Q8_0, Q4_0 and MXFP4. The other formats' converters live in
// one file per family (quant_legacy.cpp, quant_k.cpp, quant_iq4.cpp); the table here points at them.
//
// The quantisers here are bit-exact with ggml's reference C code (quantize_row_*_ref in ggml-quants.c) and
// with the numpy quantisers of the `gguf` Python package: same float operations in the same order, the
// same tie-breaking, the same treatment of zero blocks. One known divergence, where we follow ggml: a
// Q4_0 block of zeros whose first element is -0.0 gets d = -0 (fp16 0x8000) from ggml, +0 from numpy.
// This file is the portable reference; SIMD kernels in lib/cpu are tested against it.
#include "core/types.h"

#include "core/quant_blocks.h"
#include "core/quant_rows.h"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>
#include <string>

namespace moe {
namespace {

// The C conversion `(int8_t)f` / `(uint8_t)f` as compiled for x86: truncate to int32 (trunc_to_i32 in
// quant_rows.h), keep the low byte.
int8_t trunc_to_i8(float x) { return static_cast<int8_t>(trunc_to_i32(x)); }
uint8_t trunc_to_u8(float x) { return static_cast<uint8_t>(trunc_to_i32(x)); }

// ---- plain float types ----

void f32_to_float(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void f32_from_float(const float* src, void* dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void f16_to_float(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
}
void f16_from_float(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
    const auto* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
}
void bf16_from_float(const float* src, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
}

// ---- Q8_0: d = amax / 127, q = roundf(x / d) ----

void q8_0_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float* x = src + b * kQK;
        // `amax > v ? amax : v` (ggml's MAX) lets a NaN in the block propagate into amax, as in ggml.
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) {
            const float v = std::fabs(x[j]);
            amax = amax > v ? amax : v;
        }
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        // std::round on float is roundf: halves go away from zero. The unrounded d (not its fp16 value)
        // scales the values, exactly as the reference does.
        for (int j = 0; j < kQK; ++j) y[b].qs[j] = static_cast<int8_t>(trunc_to_i32(std::round(x[j] * id)));
    }
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = static_cast<float>(x[b].qs[j]) * d;
    }
}

// ---- Q4_0: d = max / -8 (max = the value of largest magnitude, sign kept), q = min(15, trunc(x/d + 8.5)) ----
// The sign of d makes the extreme value land exactly on q = 0 (-8 * d = max); the other side can only
// reach +7 * d, so values of the opposite sign near -max are clamped to 15.

void q4_0_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockQ4_0*>(dst);
    constexpr int kHalf = kQK / 2;
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float* x = src + b * kQK;
        float amax = 0.0f;
        float max = 0.0f;
        for (int j = 0; j < kQK; ++j) {  // strict `<`: the first element of largest magnitude wins
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kHalf; ++j) {
            const float x0 = mul_rounded(x[j], id);
            const float x1 = mul_rounded(x[kHalf + j], id);
            const auto q0 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x0 + 8.5f)));
            const auto q1 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x1 + 8.5f)));
            y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockQ4_0*>(src);
    constexpr int kHalf = kQK / 2;
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float* y = dst + b * kQK;
        for (int j = 0; j < kHalf; ++j) {
            y[j] = static_cast<float>((x[b].qs[j] & 0x0F) - 8) * d;
            y[kHalf + j] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

// ---- MXFP4: shared power-of-two scale (e8m0), elements rounded to the nearest e2m1 value ----

// Index of the doubled e2m1 value nearest to x / scale; ties keep the lower index (strict `<`), which
// also sends 0 and -0 to index 0. Errors are measured as |k * scale - x| in float, as in ggml.
uint8_t nearest_mxfp4_index(float x, float scale) {
    uint8_t best = 0;
    float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * scale - x);
    for (uint8_t i = 1; i < 16; ++i) {
        const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * scale - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void mxfp4_from_float(const float* src, void* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    auto* y = static_cast<BlockMXFP4*>(dst);
    constexpr int kHalf = kQK / 2;
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float* x = src + b * kQK;
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) {
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
        }
        // Scale 2^(floor(log2 amax) - 2): the largest e2m1 magnitude is 6 = 1.5 * 2^2, so amax maps into
        // [4, 8) and rounds to 4 or 6 (or saturates at 6). log2f, not an exact exponent extraction: just
        // below a power of two log2f may round up to the integer, and ggml's choice of e follows it.
        // Blocks with amax < 2^-125 give a negative e, whose uint8 conversion wraps (see trunc_to_u8).
        const uint8_t e = amax > 0.0f ? trunc_to_u8(std::floor(std::log2(amax)) - 2 + 127) : 0;
        const float scale = e8m0_to_fp32_half(e);
        y[b].e = e;
        for (int j = 0; j < kHalf; ++j) {
            const uint8_t q0 = nearest_mxfp4_index(x[j], scale);
            const uint8_t q1 = nearest_mxfp4_index(x[kHalf + j], scale);
            y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

void mxfp4_to_float(const void* src, float* dst, int64_t n) {
    MOE_ASSERT(n % kQK == 0);
    const auto* x = static_cast<const BlockMXFP4*>(src);
    constexpr int kHalf = kQK / 2;
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float scale = e8m0_to_fp32_half(x[b].e);
        float* y = dst + b * kQK;
        for (int j = 0; j < kHalf; ++j) {
            y[j] = static_cast<float>(kMxfp4Values[x[b].qs[j] & 0x0F]) * scale;
            y[kHalf + j] = static_cast<float>(kMxfp4Values[x[b].qs[j] >> 4]) * scale;
        }
    }
}

// ---- the table ----

// Every GGUF type, in type-id order. Names are ggml's (ggml_type_name), so GGUF tools and users see the
// same words; sizes are ggml's (and gguf-py's GGML_QUANT_SIZES, but for Q8_1: ggml's block_q8_1 holds two
// fp16, 36 bytes, where gguf-py still has the 40 of its old float fields). Types without converters are described only:
// their files load and are listed, and contexts refuse them (no backend supports them).
constexpr TypeTraits kTraits[] = {
    {Type::F32, "f32", 1, 4, f32_to_float, f32_from_float},
    {Type::F16, "f16", 1, 2, f16_to_float, f16_from_float},
    {Type::Q4_0, "q4_0", kQK, sizeof(BlockQ4_0), q4_0_to_float, q4_0_from_float},
    {Type::Q4_1, "q4_1", kQK, sizeof(BlockQ4_1), q4_1_to_float, q4_1_from_float},
    {Type::Q5_0, "q5_0", kQK, sizeof(BlockQ5_0), q5_0_to_float, q5_0_from_float},
    {Type::Q5_1, "q5_1", kQK, sizeof(BlockQ5_1), q5_1_to_float, q5_1_from_float},
    {Type::Q8_0, "q8_0", kQK, sizeof(BlockQ8_0), q8_0_to_float, q8_0_from_float},
    {Type::Q8_1, "q8_1", 32, 36, nullptr, nullptr},
    {Type::Q2_K, "q2_K", kQK_K, sizeof(BlockQ2_K), q2_k_to_float, q2_k_from_float},
    {Type::Q3_K, "q3_K", kQK_K, sizeof(BlockQ3_K), q3_k_to_float, q3_k_from_float},
    {Type::Q4_K, "q4_K", kQK_K, sizeof(BlockQ4_K), q4_k_to_float, q4_k_from_float},
    {Type::Q5_K, "q5_K", kQK_K, sizeof(BlockQ5_K), q5_k_to_float, q5_k_from_float},
    {Type::Q6_K, "q6_K", kQK_K, sizeof(BlockQ6_K), q6_k_to_float, q6_k_from_float},
    {Type::Q8_K, "q8_K", kQK_K, sizeof(BlockQ8_K), q8_k_to_float, q8_k_from_float},
    {Type::IQ2_XXS, "iq2_xxs", 256, 66, nullptr, nullptr},
    {Type::IQ2_XS, "iq2_xs", 256, 74, nullptr, nullptr},
    {Type::IQ3_XXS, "iq3_xxs", 256, 98, nullptr, nullptr},
    {Type::IQ1_S, "iq1_s", 256, 50, nullptr, nullptr},
    {Type::IQ4_NL, "iq4_nl", kQK, sizeof(BlockIQ4_NL), iq4_nl_to_float, iq4_nl_from_float},
    {Type::IQ3_S, "iq3_s", 256, 110, nullptr, nullptr},
    {Type::IQ2_S, "iq2_s", 256, 82, nullptr, nullptr},
    {Type::IQ4_XS, "iq4_xs", kQK_K, sizeof(BlockIQ4_XS), iq4_xs_to_float, iq4_xs_from_float},
    {Type::I8, "i8", 1, 1, nullptr, nullptr},
    {Type::I16, "i16", 1, 2, nullptr, nullptr},
    {Type::I32, "i32", 1, 4, nullptr, nullptr},  // token ids, positions, expert ids: integers, no float conversion
    {Type::I64, "i64", 1, 8, nullptr, nullptr},
    {Type::F64, "f64", 1, 8, nullptr, nullptr},
    {Type::IQ1_M, "iq1_m", 256, 56, nullptr, nullptr},
    {Type::BF16, "bf16", 1, 2, bf16_to_float, bf16_from_float},
    {Type::TQ1_0, "tq1_0", 256, 54, nullptr, nullptr},
    {Type::TQ2_0, "tq2_0", 256, 66, nullptr, nullptr},
    {Type::MXFP4, "mxfp4", kQK, sizeof(BlockMXFP4), mxfp4_to_float, mxfp4_from_float},
    {Type::NVFP4, "nvfp4", 64, 36, nullptr, nullptr},
    {Type::Q1_0, "q1_0", 128, 18, nullptr, nullptr},
};

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

std::span<const TypeTraits> all_type_traits() { return kTraits; }

const TypeTraits* type_traits_by_name(std::string_view name) {
    for (const TypeTraits& t : kTraits) {
        const std::string_view tn = t.name;
        if (tn.size() == name.size() &&
            std::equal(tn.begin(), tn.end(), name.begin(),
                       [](char a, char b) { return ascii_lower(a) == ascii_lower(b); })) {
            return &t;
        }
    }
    return nullptr;
}

const TypeTraits* type_traits(int32_t type_id) {
    // Ids run from 0 to the last entry's with a few gaps: a direct index, built once.
    constexpr int32_t kIds = static_cast<int32_t>(kTraits[std::size(kTraits) - 1].type) + 1;
    static const auto index = [] {
        std::array<const TypeTraits*, kIds> a{};
        for (const TypeTraits& t : kTraits) a[static_cast<size_t>(t.type)] = &t;
        return a;
    }();
    return type_id >= 0 && type_id < kIds ? index[static_cast<size_t>(type_id)] : nullptr;
}

const TypeTraits& traits(Type type) {
    const TypeTraits* t = type_traits(static_cast<int32_t>(type));
    MOE_ASSERT(t != nullptr);
    return *t;
}

bool is_quantized(Type t) { return traits(t).block_size > 1; }

StatusOr<uint64_t> checked_row_bytes(int32_t type_id, int64_t n) {
    const TypeTraits* t = type_traits(type_id);
    if (t == nullptr) return unimplemented("unknown tensor type id " + std::to_string(type_id));
    if (n < 0) return invalid_argument("n: " + std::to_string(n) + " elements; must not be negative");
    if (n % t->block_size != 0) {
        return invalid_argument("n: " + std::to_string(n) + " elements of " + t->name +
                                " is not a multiple of the block size " + std::to_string(t->block_size));
    }
    const auto blocks = static_cast<uint64_t>(n / t->block_size);
    const auto block_bytes = static_cast<uint64_t>(t->block_bytes);
    if (blocks > std::numeric_limits<uint64_t>::max() / block_bytes) {
        return invalid_argument("n: " + std::to_string(n) + " elements of " + t->name + " take more than 2^64 bytes");
    }
    return blocks * block_bytes;
}

// ---- scalar conversions ----

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        // inf, or NaN with its payload kept and made quiet (what F16C's vcvtph2ps and ggml on x86 give)
        bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
    } else if (exp != 0) {
        bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
    } else {
        // zero or subnormal: mant * 2^-24, exact in float
        const float v = std::ldexp(static_cast<float>(mant), -24);
        return sign != 0 ? -v : v;
    }
    return std::bit_cast<float>(bits);
}

uint16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u;    // NaN -> quiet NaN, as ggml_compute_fp32_to_fp16
    if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf (65504 is the largest finite)
    if (ax >= 0x38800000u) {
        // normal half (>= 2^-14): re-bias the exponent 127 -> 15 and round the mantissa from 23 to 10
        // bits to nearest even; a carry out of the mantissa correctly bumps the exponent.
        const uint32_t r = ax - ((127u - 15u) << 23);
        return static_cast<uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
    }
    if (ax <= 0x33000000u) return sign;  // <= 2^-25 rounds to zero (2^-25 itself is a tie, to even 0)
    // subnormal half: the result is round(|f| / 2^-24), an integer in [1, 1024] (1024 = the smallest normal)
    const uint32_t e = ax >> 23;                       // 102..112 here
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;  // |f| = m * 2^(e - 150)
    const uint32_t shift = 126u - e;                   // |f| / 2^-24 = m >> shift, 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
    return static_cast<uint16_t>(sign | q);
}

uint16_t fp32_to_bf16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN: keep, make quiet
    // round to nearest even on the 16 dropped bits; overflow rounds to inf, subnormals are kept
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

float e8m0_to_fp32_half(uint8_t e) {
    // 2^(e - 128): a subnormal float for e < 2, else a normal one with biased exponent e - 1
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    return std::bit_cast<float>(bits);
}

}  // namespace moe
