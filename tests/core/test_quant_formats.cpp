// The GGUF types beyond F32/F16/BF16/Q8_0/Q4_0/MXFP4 (tests/core/test_types.cpp covers those): every
// GGUF type is in the traits table with the specification's sizes; Q8_K against a float64 reference; our
// own quantisers of the K-quants and IQ4_NL / IQ4_XS within their stated error bounds on fresh random
// data; the C API's answers for types this build can only describe.
//
// Dequantisation is compared bit for bit with gguf-py by tests/python/test_quant.py.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/types.h"
#include "moeinfer/moeinfer.h"

namespace {

using moe::Type;

uint32_t fresh_seed() {
    std::random_device rd;
    return rd();
}

}  // namespace

TEST_CASE("every GGUF type is in the traits table with the specification's sizes", "[types]") {
    struct Expect {
        int32_t id;
        const char* name;
        int64_t block_size, block_bytes;
        bool convertible;
    };
    // gguf-py's GGMLQuantizationType and GGML_QUANT_SIZES, except Q8_1: ggml's block_q8_1 is two fp16 and
    // 32 int8 (36 bytes; gguf-py still says 40, from when d and s were floats). Names as ggml_type_name's.
    const Expect expected[] = {
        {0, "f32", 1, 4, true},          {1, "f16", 1, 2, true},          {2, "q4_0", 32, 18, true},
        {3, "q4_1", 32, 20, true},       {6, "q5_0", 32, 22, true},       {7, "q5_1", 32, 24, true},
        {8, "q8_0", 32, 34, true},       {9, "q8_1", 32, 36, false},      {10, "q2_K", 256, 84, true},
        {11, "q3_K", 256, 110, true},    {12, "q4_K", 256, 144, true},    {13, "q5_K", 256, 176, true},
        {14, "q6_K", 256, 210, true},    {15, "q8_K", 256, 292, true},    {16, "iq2_xxs", 256, 66, false},
        {17, "iq2_xs", 256, 74, false},  {18, "iq3_xxs", 256, 98, false}, {19, "iq1_s", 256, 50, false},
        {20, "iq4_nl", 32, 18, true},    {21, "iq3_s", 256, 110, false},  {22, "iq2_s", 256, 82, false},
        {23, "iq4_xs", 256, 136, true},  {24, "i8", 1, 1, false},         {25, "i16", 1, 2, false},
        {26, "i32", 1, 4, false},        {27, "i64", 1, 8, false},        {28, "f64", 1, 8, false},
        {29, "iq1_m", 256, 56, false},   {30, "bf16", 1, 2, true},        {34, "tq1_0", 256, 54, false},
        {35, "tq2_0", 256, 66, false},   {39, "mxfp4", 32, 17, true},     {40, "nvfp4", 64, 36, false},
        {41, "q1_0", 128, 18, false},
    };
    REQUIRE(moe::all_type_traits().size() == std::size(expected));
    for (size_t i = 0; i < std::size(expected); ++i) {
        const Expect& e = expected[i];
        INFO(e.name);
        const moe::TypeTraits* t = moe::type_traits(e.id);
        REQUIRE(t != nullptr);
        CHECK(&moe::all_type_traits()[i] == t);  // in id order
        CHECK(static_cast<int32_t>(t->type) == e.id);
        CHECK(std::string(t->name) == e.name);
        CHECK(t->block_size == e.block_size);
        CHECK(t->block_bytes == e.block_bytes);
        CHECK((t->to_float != nullptr) == e.convertible);
        CHECK((t->from_float != nullptr) == e.convertible);
        CHECK(moe::type_traits_by_name(e.name) == t);
        auto row = moe::checked_row_bytes(e.id, 3 * e.block_size);
        REQUIRE(row.is_ok());
        CHECK(*row == static_cast<uint64_t>(3 * e.block_bytes));
        if (e.block_size > 1) {
            row = moe::checked_row_bytes(e.id, e.block_size + 1);
            REQUIRE_FALSE(row.is_ok());
            CHECK(row.status().code() == MOE_STATUS_INVALID_ARGUMENT);
            CHECK_THAT(row.status().message(), Catch::Contains(std::string("of ") + e.name));
        }

        // the C API: named, sized, and its capabilities say what converts
        CHECK(std::string(moe_type_name(e.id)) == e.name);
        int32_t id = -1;
        CHECK(moe_type_from_name(e.name, &id) == MOE_STATUS_OK);
        CHECK(id == e.id);
        int64_t bs = 0, bb = 0;
        CHECK(moe_type_block_info(e.id, &bs, &bb) == MOE_STATUS_OK);
        CHECK(bs == e.block_size);
        CHECK(bb == e.block_bytes);
        uint32_t caps = 0xFFu;
        REQUIRE(moe_type_capabilities(e.id, &caps) == MOE_STATUS_OK);
        CHECK(caps == (e.convertible ? MOE_TYPE_CAN_QUANTIZE | MOE_TYPE_CAN_DEQUANTIZE : 0u));
    }
}

TEST_CASE("C API: a type this build only describes is refused by quantize and dequantize", "[types]") {
    const int64_t n = 256;
    std::vector<float> x(n, 1.0f);
    std::vector<uint8_t> q(66);
    CHECK(moe_quantize(MOE_TYPE_IQ2_XXS, x.data(), n, q.data(), q.size()) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()) == "type iq2_xxs: this build cannot quantize to it");
    CHECK(moe_dequantize(MOE_TYPE_IQ2_XXS, q.data(), q.size(), n, x.data()) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()) == "type iq2_xxs: this build cannot dequantize it");
    // sizes are still checked first: the caller's mistake is named before the missing conversion
    CHECK(moe_dequantize(MOE_TYPE_IQ2_XXS, q.data(), q.size(), 255, x.data()) == MOE_STATUS_INVALID_ARGUMENT);
    uint32_t caps = 0;
    CHECK(moe_type_capabilities(4, &caps) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()) == "unknown tensor type id 4");
    CHECK(moe_type_capabilities(MOE_TYPE_Q4_K, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("Q8_K: ggml's reference quantiser against a float64 model of it", "[types]") {
    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    constexpr int kBlocks = 64;
    std::vector<float> x(kBlocks * 256);
    for (int b = 0; b < kBlocks; ++b) {
        const float scale = std::exp2(static_cast<float>(b % 40 - 20));
        for (int j = 0; j < 256; ++j) x[b * 256 + j] = b == 5 ? 0.0f : normal(rng) * scale;  // block 5: zeros
    }
    const moe::TypeTraits& t = moe::traits(Type::Q8_K);
    std::vector<uint8_t> bytes(moe::row_bytes(Type::Q8_K, static_cast<int64_t>(x.size())));
    t.from_float(x.data(), bytes.data(), static_cast<int64_t>(x.size()));
    std::vector<float> y(x.size());
    t.to_float(bytes.data(), y.data(), static_cast<int64_t>(x.size()));
    for (int b = 0; b < kBlocks; ++b) {
        INFO("block " << b);
        const uint8_t* blk = bytes.data() + b * 292;
        float d;
        std::memcpy(&d, blk, 4);
        const auto* qs = reinterpret_cast<const int8_t*>(blk + 4);
        // the value of largest magnitude (first on ties) and the scale that sends it to -127
        double max = 0;
        for (int j = 0; j < 256; ++j) {
            if (std::fabs(x[b * 256 + j]) > std::fabs(max)) max = x[b * 256 + j];
        }
        for (int g = 0; g < 16; ++g) {
            int16_t bsum;
            std::memcpy(&bsum, blk + 4 + 256 + 2 * g, 2);
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += qs[16 * g + j];
            CHECK(bsum == sum);
        }
        if (max == 0) {
            CHECK(d == 0.0f);
            for (int j = 0; j < 256; ++j) REQUIRE(y[b * 256 + j] == 0.0f);
            continue;
        }
        const float iscale = -127.0f / static_cast<float>(max);
        CHECK(d == 1.0f / iscale);
        for (int j = 0; j < 256; ++j) {
            const double v = static_cast<double>(iscale) * x[b * 256 + j];
            // the nearest integer (float vs float64 rounding of the product may move a tie), capped at 127
            REQUIRE(std::fabs(qs[j] - std::min(127.0, v)) <= 0.5 + 1e-4);
            REQUIRE(y[b * 256 + j] == static_cast<float>(static_cast<double>(qs[j]) * d));  // exact, then rounded
            REQUIRE(std::fabs(y[b * 256 + j] - x[b * 256 + j]) <= 0.5 * std::fabs(d) * (1 + 1e-5));
        }
    }
}

// Our own quantisers (no reference implements them): on fresh random data every element comes back within
// a bound derived from the format (see lib/core/quant_k.cpp, quant_iq4.cpp), relative to the largest |x|
// of its super-block (its block for IQ4_NL). Zero blocks come back as zeros.
TEST_CASE("K-quant and IQ4 quantisers stay within their error bounds", "[types]") {
    struct Bound {
        Type type;
        double rel;    // of the block's largest |x|
        double slack;  // relative: the fp16 rounding of the scales where rel leaves it out, float products
    };
    // Every fp16 scale below is normal (the data keeps them so): it is its value times (1 + e), |e| <= u =
    // 2^-11. Asymmetric (Q2_K, Q4_K, Q5_K): half a step of a range of at most 2 amax plus a rounded-up min,
    // (2 + 1/smax) amax / qmax * (1 + 1/smax) / 2, the step scaled by (1 + u) at most (slack 2e-3).
    // Symmetric (Q3_K, Q6_K), in units of S = amax / |qmin|: a group whose scale is rounded up (at least
    // its own, s_g <= S) loses at most max(s_g, step / 2) <= S, a whole step where values of the other sign
    // run into the short side qmax; the largest group (its scale S (1 + e)) and a group turned to the other
    // sign (quant_k.cpp) send a value of magnitude up to |qmin| S to qmax S (1 + e): 1 + qmax u.
    // IQ4, in units of amax / 127 (the scale that puts amax on the grid's end -127): the grid's widest
    // half-gap is 12 units, but its positive end is 113, so the values up to +127 lose 14; the stored
    // fp16 scale d' = d (1 + e) moves that end to 113 d', 113 |e| more. IQ4_XS: each group's scale
    // d' * l is within half a super-scale step d' = (amax / 127) (1 + e) / 32 of the group's own, so
    // its positive end loses at most 14 + 113 / 64 (1 + u) units (its other end 127 / 64, its gaps
    // 12 (1 + 1/64)); a group turned to the other sign (quant_iq4.cpp) loses at most 14 + 113 u.
    constexpr double u = 0x1p-11;
    const Bound bounds[] = {
        {Type::Q2_K, (2 + 1.0 / 15) / 3 * (1 + 1.0 / 15) / 2, 2e-3},
        {Type::Q3_K, 1.0 / 4 * (1 + 3 * u), 1e-5},
        {Type::Q4_K, (2 + 1.0 / 63) / 15 * (1 + 1.0 / 63) / 2, 2e-3},
        {Type::Q5_K, (2 + 1.0 / 63) / 31 * (1 + 1.0 / 63) / 2, 2e-3},
        {Type::Q6_K, 1.0 / 32 * (1 + 31 * u), 1e-5},
        {Type::IQ4_NL, (14 + 113 * u) / 127, 1e-5},
        {Type::IQ4_XS, (14 + 113.0 / 64 * (1 + u)) / 127, 1e-5},
    };
    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    constexpr int kSuper = 48;
    std::vector<float> x(kSuper * 256);
    for (int b = 0; b < kSuper; ++b) {
        // 2^-2 .. 2^13: every fp16 scale stays normal (a super-block's amax >= ~0.5 gives Q6_K's d = amax /
        // 4096 > 2^-14; a rounded subnormal scale is off by more than u) and finite (the hard case below,
        // 64 * 2^13, gives IQ4_NL's d ~ 4,100; Q2_K's ~ 7,000 at most).
        const float scale = std::exp2(static_cast<float>(b % 16 - 2));
        const bool shifted = b % 3 == 0;  // all-positive blocks: the mins do the work
        for (int j = 0; j < 256; ++j) {
            float v = normal(rng) * scale;
            if (unit(rng) < 0.02f) v *= 8;      // outliers
            if (unit(rng) < 0.1f) v = 0.0f;     // exact zeros
            if (shifted) v = std::fabs(v) + scale;
            x[b * 256 + j] = v;
        }
        if (b % 7 == 1) std::fill_n(x.begin() + b * 256 + 32 * (b % 8), 32, 0.0f);  // a zero group
        if (b == 2) std::fill_n(x.begin() + b * 256, 256, 0.0f);                    // a zero super-block
        if (b % 8 == 5) {
            // The hard case: one group's largest |x| of the other sign and almost the super-block's, with a
            // value at its other end too (its scale would round one past the integer range), and a value of
            // the other sign almost as large in the largest group. The super-block's amax, 64 scale (1 +
            // 0.49 / 1024), makes Q3_K's and Q6_K's fp16 scale round down (e ~ -u): the largest loss.
            float* g0 = &x[b * 256 + 32 * (b / 8 % 4)];
            float* g1 = g0 + 32 * 4;
            g0[3] = -64 * scale * (1 + 0.49f / 1024);  // beyond the outliers (normal * 8)
            g0[9] = -g0[3] * (1 - unit(rng) * 1e-4f);
            g1[7] = 64 * scale * (1 - unit(rng) * 1e-3f);
            g1[11] = -g1[7] * (1 - unit(rng) * 1e-3f);
        }
    }
    for (const Bound& bd : bounds) {
        const moe::TypeTraits& t = moe::traits(bd.type);
        INFO(t.name);
        const auto n = static_cast<int64_t>(x.size());
        std::vector<uint8_t> bytes(moe::row_bytes(bd.type, n));
        t.from_float(x.data(), bytes.data(), n);
        std::vector<float> y(x.size());
        t.to_float(bytes.data(), y.data(), n);
        const int64_t block = t.block_size;
        double worst = 0;
        for (int64_t b = 0; b < n / block; ++b) {
            double amax = 0;
            for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[b * block + j])));
            for (int64_t j = 0; j < block; ++j) {
                const double err = std::fabs(static_cast<double>(y[b * block + j]) - x[b * block + j]);
                INFO("block " << b << " element " << j << " x " << x[b * block + j] << " y " << y[b * block + j]);
                if (amax == 0) {
                    REQUIRE(y[b * block + j] == 0.0f);
                } else {
                    REQUIRE(err <= amax * bd.rel * (1 + bd.slack));
                    worst = std::max(worst, err / amax);
                }
            }
        }
        // the bound is not vacuous: the quantiser uses most of it on this data
        CHECK(worst > bd.rel * 0.25);
        // a quantised row is a pure function of its input: the same bytes again
        std::vector<uint8_t> again(bytes.size());
        t.from_float(x.data(), again.data(), n);
        CHECK(again == bytes);
    }
}
