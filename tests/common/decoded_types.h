// The decoded weight types (core/quant_decode.h: Q4_1 .. IQ4_XS) and where their blocks keep fp16 factors,
// for the host tests of the decoders that plant extreme scales (zero, subnormal, inf, NaN) in random blocks.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace moe::test {

inline constexpr Type kDecodedTypes[] = {Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::Q2_K,
                                         Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K,   Type::IQ4_XS};

// Byte offsets of the fp16 scales in a block (quant_blocks.h).
inline std::vector<int> fp16_fields(Type t) {
    switch (t) {
        case Type::Q4_1:
        case Type::Q5_1:
        case Type::Q4_K:
        case Type::Q5_K: return {0, 2};
        case Type::Q2_K: return {80, 82};
        case Type::Q3_K: return {108};
        case Type::Q6_K: return {208};
        default: return {0};  // Q5_0, IQ4_NL, IQ4_XS
    }
}

// Bit for bit, or both NaN: a NaN scale gives a NaN either way, and which operand's payload a sum of two NaNs
// carries is the compiler's choice (it may swap a commutative sum).
inline bool same_value(float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

}  // namespace moe::test
