// Element types and quantisation formats: the single table of type traits.
//
// Block layouts are exactly ggml's (and so GGUF's):
//   Q8_0  : { fp16 d; int8 qs[32]; }                     x[i] = qs[i] * d
//   Q4_0  : { fp16 d; uint8 qs[16]; }                    x[i] = ((qs[i] & 15) - 8) * d, x[i+16] = ((qs[i] >> 4) - 8) * d
//   MXFP4 : { uint8 e; uint8 qs[16]; }                   x[i] = kvalues[qs[i] & 15] * 2^(e-128) (e8m0 scale,
//                                                        e2m1 values doubled), x[i+16] from the high nibble
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "core/status.h"
#include "moeinfer/moeinfer.h"

namespace moe {

// Every type the GGUF specification defines (ids are ggml's). The traits table knows the name and block
// size of each; only some have float conversions (TypeTraits::to_float / from_float), and only those the
// backends' supports_op accepts have kernels. I32 also serves internally (token ids, positions, expert ids).
enum class Type : int32_t {
    F32 = MOE_TYPE_F32,
    F16 = MOE_TYPE_F16,
    Q4_0 = MOE_TYPE_Q4_0,
    Q4_1 = MOE_TYPE_Q4_1,
    Q5_0 = MOE_TYPE_Q5_0,
    Q5_1 = MOE_TYPE_Q5_1,
    Q8_0 = MOE_TYPE_Q8_0,
    Q8_1 = MOE_TYPE_Q8_1,
    Q2_K = MOE_TYPE_Q2_K,
    Q3_K = MOE_TYPE_Q3_K,
    Q4_K = MOE_TYPE_Q4_K,
    Q5_K = MOE_TYPE_Q5_K,
    Q6_K = MOE_TYPE_Q6_K,
    Q8_K = MOE_TYPE_Q8_K,
    IQ2_XXS = MOE_TYPE_IQ2_XXS,
    IQ2_XS = MOE_TYPE_IQ2_XS,
    IQ3_XXS = MOE_TYPE_IQ3_XXS,
    IQ1_S = MOE_TYPE_IQ1_S,
    IQ4_NL = MOE_TYPE_IQ4_NL,
    IQ3_S = MOE_TYPE_IQ3_S,
    IQ2_S = MOE_TYPE_IQ2_S,
    IQ4_XS = MOE_TYPE_IQ4_XS,
    I8 = MOE_TYPE_I8,
    I16 = MOE_TYPE_I16,
    I32 = MOE_TYPE_I32,
    I64 = MOE_TYPE_I64,
    F64 = MOE_TYPE_F64,
    IQ1_M = MOE_TYPE_IQ1_M,
    BF16 = MOE_TYPE_BF16,
    TQ1_0 = MOE_TYPE_TQ1_0,
    TQ2_0 = MOE_TYPE_TQ2_0,
    MXFP4 = MOE_TYPE_MXFP4,
    NVFP4 = MOE_TYPE_NVFP4,
    Q1_0 = MOE_TYPE_Q1_0,
};

constexpr int kQK = 32;  // elements per block of Q4_0, Q8_0, MXFP4 and the other 32-element formats

struct BlockQ8_0 {
    uint16_t d;  // fp16 bits
    int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
    uint16_t d;  // fp16 bits
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockMXFP4 {
    uint8_t e;  // e8m0 exponent
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// e2m1 values, doubled (so they are integers); the scale halves them back.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct TypeTraits {
    Type type;
    const char* name;  // ggml's (ggml_type_name): "q8_0", "q4_K", "iq2_xxs"
    int64_t block_size;   // elements per block
    int64_t block_bytes;  // bytes per block
    // nullptr where this build has no conversion: the integer types and the formats it can only describe.
    DequantizeRowFn to_float;  // bit-exact with ggml's dequantize_row_*
    QuantizeRowFn from_float;  // bit-exact with ggml's reference quantiser where gguf-py has one (see types.cpp)
};

// nullptr for ids that are not GGUF types.
const TypeTraits* type_traits(int32_t type_id);
// By name ("q8_0", "MXFP4", "Q4_K", ...), ignoring ASCII case; nullptr for unknown names.
const TypeTraits* type_traits_by_name(std::string_view name);
// Every GGUF type, in type-id order.
std::span<const TypeTraits> all_type_traits();
// REQUIRES: `type` is a GGUF type (every enumerator is).
const TypeTraits& traits(Type type);

inline const char* type_name(Type t) { return traits(t).name; }
bool is_quantized(Type t);

// Bytes of n elements; REQUIRES n % block_size == 0.
inline uint64_t row_bytes(Type t, int64_t n) {
    const TypeTraits& tt = traits(t);
    return static_cast<uint64_t>(n / tt.block_size) * static_cast<uint64_t>(tt.block_bytes);
}

// Validates (type, n) for a row and returns its byte count, or a Status naming the problem.
StatusOr<uint64_t> checked_row_bytes(int32_t type_id, int64_t n);

// ---- scalar conversions (exact ggml semantics) ----

float fp16_to_fp32(uint16_t h);
// Round to nearest even, like the F16C instruction, subnormals included; >= 65520 gives inf; NaN gives the
// quiet NaN sign|0x7E00 (ggml_compute_fp32_to_fp16).
uint16_t fp32_to_fp16(float f);

inline float bf16_to_fp32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even, NaN kept quiet (ggml_compute_fp32_to_bf16)

// The MXFP4 scale: 2^(e - 127) / 2, i.e. the value by which the doubled e2m1 values are multiplied.
float e8m0_to_fp32_half(uint8_t e);

}  // namespace moe
