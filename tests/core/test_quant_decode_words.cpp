// core/quant_decode_words.h, the word-reading decoders of the tensor-core GEMM, on the host: every half group
// of random units (a super-block, or 8 blocks of the 32-element types) (fp16 scales drawn from the extremes too: zero, subnormal, the largest, inf, NaN),
// staged from every even byte offset 0 .. 14 of a word buffer as the GEMM stages its rows, gives decode16's
// floats bit for bit (decode_unit_half; decode16 is checked against gguf-py and float64 in test_quant_decode.cpp),
// NaN payloads aside: a NaN scale or minimum gives a NaN either way, and which operand's payload a sum of
// two NaNs carries is the compiler's choice (it may swap a commutative sum).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/quant_decode.h"
#include "core/quant_decode_words.h"
#include "core/types.h"
#include "common/decoded_types.h"

namespace {

using moe::Type;

using moe::test::fp16_fields;
constexpr auto& kDecoded = moe::test::kDecodedTypes;

template <Type W>
void decode_both(const uint32_t* staged, int off, const uint8_t* unit, int g, int h, float (&got)[16], float (&want)[16]) {
    moe::qd::decode16_words<W>(staged, off, g, h, got);
    moe::qd::decode_unit_half<W>(unit, g, h, want);
}

void decode_both(Type t, const uint32_t* staged, int off, const uint8_t* unit, int g, int h, float (&got)[16],
                 float (&want)[16]) {
    switch (t) {
        case Type::Q4_1: return decode_both<Type::Q4_1>(staged, off, unit, g, h, got, want);
        case Type::Q5_0: return decode_both<Type::Q5_0>(staged, off, unit, g, h, got, want);
        case Type::Q5_1: return decode_both<Type::Q5_1>(staged, off, unit, g, h, got, want);
        case Type::IQ4_NL: return decode_both<Type::IQ4_NL>(staged, off, unit, g, h, got, want);
        case Type::Q2_K: return decode_both<Type::Q2_K>(staged, off, unit, g, h, got, want);
        case Type::Q3_K: return decode_both<Type::Q3_K>(staged, off, unit, g, h, got, want);
        case Type::Q4_K: return decode_both<Type::Q4_K>(staged, off, unit, g, h, got, want);
        case Type::Q5_K: return decode_both<Type::Q5_K>(staged, off, unit, g, h, got, want);
        case Type::Q6_K: return decode_both<Type::Q6_K>(staged, off, unit, g, h, got, want);
        default: return decode_both<Type::IQ4_XS>(staged, off, unit, g, h, got, want);
    }
}

}  // namespace

TEST_CASE("quant_decode_words gives decode_unit_half's floats bit for bit at every staging offset", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> pct(0, 99);
    const uint16_t extremes[] = {0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00};
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        const int bb = moe::qd::block_bytes(t);
        const int ub = moe::qd::unit_bytes(t);  // one super-block, or 8 blocks of 32
        int bad = 0, checked = 0;
        for (int blk_i = 0; blk_i < 200; ++blk_i) {
            std::vector<uint8_t> blk(static_cast<size_t>(ub));
            for (uint8_t& b : blk) b = static_cast<uint8_t>(byte(rng));
            for (int b0 = 0; b0 < ub; b0 += bb) {
                for (int off : fp16_fields(t)) {
                    if (pct(rng) >= 30) continue;
                    const uint16_t v = extremes[static_cast<size_t>(byte(rng)) % std::size(extremes)];
                    std::memcpy(blk.data() + b0 + off, &v, 2);
                }
            }
            for (int off = 0; off < 16; off += 2) {
                // The staged words: the block from byte off, random bytes around it, and the spare word the
                // decoders may read past the last byte.
                std::vector<uint32_t> staged(static_cast<size_t>((off + ub) / 4 + 2));
                for (uint32_t& w : staged) w = static_cast<uint32_t>(byte(rng)) * 0x01010101u ^ static_cast<uint32_t>(rng());
                std::memcpy(reinterpret_cast<uint8_t*>(staged.data()) + off, blk.data(), static_cast<size_t>(ub));
                for (int g = 0; g < 8; ++g) {
                    for (int h = 0; h < 2; ++h) {
                        float got[16], want[16];
                        decode_both(t, staged.data(), off, blk.data(), g, h, got, want);
                        ++checked;
                        int j = 0;  // the first element that differs (two NaNs count as equal: see the top)
                        while (j < 16 && (std::memcmp(&got[j], &want[j], 4) == 0 ||
                                          (std::isnan(got[j]) && std::isnan(want[j])))) {
                            ++j;
                        }
                        if (j < 16 && bad++ < 4) {
                            UNSCOPED_INFO("block " << blk_i << " offset " << off << " group " << g << " half " << h
                                                   << ": element " << j << " " << got[j] << " vs " << want[j]);
                        }
                    }
                }
            }
        }
        CHECK(bad == 0);  // first: the messages above attach to the next assertion
        CHECK(checked == 200 * 8 * 16);
    }
}
