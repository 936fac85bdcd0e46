// core/quant_decode_words.h, the word-reading decoders of the tensor-core GEMM, on the host: every half group
// of random units (a super-block, or 8 blocks of the 32-element types; fp16 scales drawn from the extremes too:
// zero, subnormal, the largest, inf, NaN), staged from every even byte offset 0 .. 14 of a word buffer as the GEMM
// stages its rows, gives decode16's floats bit for bit (decode_unit_half; decode16 is checked against gguf-py and
// float64 in test_quant_decode.cpp), NaN payloads aside (same_value), in the exact form and in the FMA form; and
// the FMA form is within its bound (quant_decode.h, OneFma) of the exact form.
#include <catch2/catch.hpp>

#include <algorithm>
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
using moe::test::same_value;
constexpr auto& kDecoded = moe::test::kDecodedTypes;

// Both forms of both decoders: words (decode16_words, from the staged words) and unit (decode_unit_half, from the
// unit's bytes), exact and FMA.
struct Decoded {
    float words[16], unit[16], words_fma[16], unit_fma[16];
};

template <Type W>
void decode_all(const uint32_t* staged, int off, const uint8_t* unit, int g, int h, Decoded& d) {
    moe::qd::decode16_words<W>(staged, off, g, h, d.words);
    moe::qd::decode_unit_half<W>(unit, g, h, d.unit);
    moe::qd::decode16_words<W, true>(staged, off, g, h, d.words_fma);
    moe::qd::decode_unit_half<W, true>(unit, g, h, d.unit_fma);
}

void decode_all(Type t, const uint32_t* staged, int off, const uint8_t* unit, int g, int h, Decoded& d) {
    switch (t) {
        case Type::Q4_1: return decode_all<Type::Q4_1>(staged, off, unit, g, h, d);
        case Type::Q5_0: return decode_all<Type::Q5_0>(staged, off, unit, g, h, d);
        case Type::Q5_1: return decode_all<Type::Q5_1>(staged, off, unit, g, h, d);
        case Type::IQ4_NL: return decode_all<Type::IQ4_NL>(staged, off, unit, g, h, d);
        case Type::Q2_K: return decode_all<Type::Q2_K>(staged, off, unit, g, h, d);
        case Type::Q3_K: return decode_all<Type::Q3_K>(staged, off, unit, g, h, d);
        case Type::Q4_K: return decode_all<Type::Q4_K>(staged, off, unit, g, h, d);
        case Type::Q5_K: return decode_all<Type::Q5_K>(staged, off, unit, g, h, d);
        case Type::Q6_K: return decode_all<Type::Q6_K>(staged, off, unit, g, h, d);
        default: return decode_all<Type::IQ4_XS>(staged, off, unit, g, h, d);
    }
}

// The FMA form's error (quant_decode.h, OneFma): half an ulp of add, the same on the group's elements, plus the
// element's own rounding. Half an ulp of add is at most 2^-9 (1 + 2^-7) of the scale plus 2^-24 of the offset; the
// scale is at most the smallest gap between two distinct values of the half group (their bytes differ by 1 or
// more; Q2_K's 2-bit values are all equal with probability 4^-15, and then the largest magnitude stands in), and
// the offset is at most the largest magnitude plus 255 scales. fma_slack: that add term of a half group.
double fma_slack(const float (&exact)[16]) {
    double amax = 0.0, gap = HUGE_VAL;
    for (float a : exact) {
        if (!std::isfinite(a)) continue;
        amax = std::max(amax, std::fabs(static_cast<double>(a)));
        for (float b : exact) {
            const double d = std::fabs(static_cast<double>(a) - b);
            if (std::isfinite(b) && d > 0.0) gap = std::min(gap, d);
        }
    }
    const double scale = gap == HUGE_VAL ? amax : gap;
    return std::ldexp(scale, -9) * (1.0 + 1.0 / 128) + std::ldexp(amax + 256.0 * scale, -24);
}

// Element j of the FMA form within slack plus its own rounding of the exact one. Non-finite values take the exact
// form: the same bits.
bool fma_form_close(float got, float exact, double slack) {
    if (!std::isfinite(exact) || !std::isfinite(got)) return same_value(got, exact);
    const double own = std::ldexp(std::fabs(static_cast<double>(exact)), -24);
    return std::fabs(static_cast<double>(got) - exact) <= slack + own;
}

}  // namespace

TEST_CASE("quant_decode_words gives decode_unit_half's floats bit for bit at every staging offset, in both forms; "
          "the FMA form is within its bound of the exact", "[types][quant_decode]") {
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
                        Decoded d;
                        decode_all(t, staged.data(), off, blk.data(), g, h, d);
                        ++checked;
                        // The first element where each check fails (two NaNs count as equal: see the top).
                        auto first = [](auto ok) {
                            int j = 0;
                            while (j < 16 && ok(j)) ++j;
                            return j;
                        };
                        const int j = first([&](int i) { return same_value(d.words[i], d.unit[i]); });
                        const int jf = first([&](int i) { return same_value(d.words_fma[i], d.unit_fma[i]); });
                        const double slack = fma_slack(d.unit);
                        const int jc = first([&](int i) { return fma_form_close(d.unit_fma[i], d.unit[i], slack); });
                        if (j + jf + jc < 48 && bad++ < 4) {
                            UNSCOPED_INFO("block " << blk_i << " offset " << off << " group " << g << " half " << h
                                                   << ": exact " << j << ", FMA form " << jf << ", FMA vs exact " << jc
                                                   << " (the first element that differs; 16: none)");
                        }
                    }
                }
            }
        }
        CHECK(bad == 0);  // first: the messages above attach to the next assertion
        CHECK(checked == 200 * 8 * 16);
    }
}
