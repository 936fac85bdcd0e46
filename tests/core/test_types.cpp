// Tests of core/types: the traits table, fp16/bf16/e8m0 conversions, the reference quantisers (golden
// blocks computed by hand, error bounds on fresh random data) and the C API over them.
//
// Bit-exactness with ggml / the gguf Python package is checked by the Python tests; here every expected
// value comes from the format definitions, not from running the code under test.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/types.h"
#include "moeinfer/moeinfer.h"

namespace {

using moe::Type;

uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

uint32_t fresh_seed() {
    std::random_device rd;
    return rd();
}

// Random values in blocks of 32, each block with its own scale 2^[lo, hi), so blocks exercise many binades.
std::vector<float> random_blocks(std::mt19937& rng, int64_t n_blocks, float log2_lo, float log2_hi) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> log_scale(log2_lo, log2_hi);
    std::vector<float> x(static_cast<size_t>(n_blocks) * moe::kQK);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float scale = std::exp2(log_scale(rng));
        for (int j = 0; j < moe::kQK; ++j) x[static_cast<size_t>(b * moe::kQK + j)] = normal(rng) * scale;
    }
    return x;
}

// Quantises then dequantises through the traits table.
std::vector<float> round_trip(Type t, const std::vector<float>& x, std::vector<uint8_t>* bytes_out = nullptr) {
    const moe::TypeTraits& tt = moe::traits(t);
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> bytes(moe::row_bytes(t, n));
    tt.from_float(x.data(), bytes.data(), n);
    std::vector<float> y(x.size());
    tt.to_float(bytes.data(), y.data(), n);
    if (bytes_out != nullptr) *bytes_out = std::move(bytes);
    return y;
}

// Checks that `h` is a correctly rounded (nearest, ties to even) 16-bit encoding of x by comparing it
// with its neighbours in double precision: an independent check of the rounding, whatever the algorithm.
// `decode` maps a 16-bit pattern to float; `max_finite` is the largest finite magnitude and `overflow_at`
// the magnitude from which the format rounds to infinity.
template <typename Decode>
void check_nearest_even(float x, uint16_t h, Decode decode, double overflow_at) {
    const double ax = std::fabs(static_cast<double>(x));
    const double v = std::fabs(static_cast<double>(decode(h)));
    INFO("x = " << x << " (bits 0x" << std::hex << f32_bits(x) << "), got 0x" << h << std::dec);
    REQUIRE(std::signbit(decode(h)) == std::signbit(x));
    if (std::isinf(v)) {
        REQUIRE(ax >= overflow_at);
        return;
    }
    REQUIRE(ax < overflow_at);
    const uint16_t mag = h & 0x7FFF;
    const double err = std::fabs(ax - v);
    const double up = std::fabs(static_cast<double>(decode(static_cast<uint16_t>(mag + 1))));
    const double up_err = std::isinf(up) ? std::numeric_limits<double>::infinity() : std::fabs(up - ax);
    REQUIRE(err <= up_err);
    if (err == up_err) REQUIRE((mag & 1) == 0);
    if (mag > 0) {
        const double down_err = std::fabs(ax - std::fabs(static_cast<double>(decode(static_cast<uint16_t>(mag - 1)))));
        REQUIRE(err <= down_err);
        if (err == down_err) REQUIRE((mag & 1) == 0);
    }
}

}  // namespace

TEST_CASE("type traits table is consistent", "[types]") {
    struct Expect {
        Type type;
        int32_t id;
        const char* name;
        int64_t block_size, block_bytes;
        bool quantized;
    };
    // Ids are ggml's (ggml.h enum ggml_type); sizes from the block layouts in types.h.
    // The formats with converters in types.cpp; every other GGUF type is checked in test_quant_formats.cpp.
    const Expect expected[] = {
        {Type::F32, 0, "f32", 1, 4, false},     {Type::F16, 1, "f16", 1, 2, false},
        {Type::Q4_0, 2, "q4_0", 32, 18, true},  {Type::Q8_0, 8, "q8_0", 32, 34, true},
        {Type::I32, 26, "i32", 1, 4, false},    {Type::BF16, 30, "bf16", 1, 2, false},
        {Type::MXFP4, 39, "mxfp4", 32, 17, true},
    };
    for (const Expect& e : expected) {
        INFO(e.name);
        const moe::TypeTraits* t = moe::type_traits(e.id);
        REQUIRE(t != nullptr);
        CHECK(t == &moe::traits(e.type));
        CHECK(t->type == e.type);
        CHECK(std::string(t->name) == e.name);
        CHECK(std::string(moe::type_name(e.type)) == e.name);
        CHECK(t->block_size == e.block_size);
        CHECK(t->block_bytes == e.block_bytes);
        // I32 holds integers (ids, positions): sizes only, no float conversion
        CHECK((t->to_float != nullptr) == (e.type != Type::I32));
        CHECK((t->from_float != nullptr) == (e.type != Type::I32));
        CHECK(moe::is_quantized(e.type) == e.quantized);
        CHECK(moe::row_bytes(e.type, 64) == static_cast<uint64_t>(64 / e.block_size * e.block_bytes));
        CHECK(moe::type_traits_by_name(e.name) == t);
        std::string upper = e.name;
        for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        CHECK(moe::type_traits_by_name(upper) == t);
    }
    // ids ggml removed (4, 5, 31-33, 36-38) and ids past the last GGUF type
    for (int32_t unknown : {-1, 4, 5, 31, 32, 33, 36, 37, 38, 42, 1000}) CHECK(moe::type_traits(unknown) == nullptr);
    CHECK(moe::type_traits_by_name("q4_2") == nullptr);
    CHECK(moe::type_traits_by_name("") == nullptr);
    CHECK(moe::type_traits_by_name("q8_0 ") == nullptr);
}

TEST_CASE("checked_row_bytes validates type and element count", "[types]") {
    auto r = moe::checked_row_bytes(MOE_TYPE_Q8_0, 64);
    REQUIRE(r.is_ok());
    CHECK(*r == 68);
    r = moe::checked_row_bytes(MOE_TYPE_MXFP4, 0);
    REQUIRE(r.is_ok());
    CHECK(*r == 0);
    r = moe::checked_row_bytes(MOE_TYPE_F16, 3);
    REQUIRE(r.is_ok());
    CHECK(*r == 6);

    r = moe::checked_row_bytes(37, 32);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == MOE_STATUS_UNIMPLEMENTED);
    CHECK(r.status().message() == "unknown tensor type id 37");

    r = moe::checked_row_bytes(MOE_TYPE_F32, -1);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(r.status().message(), Catch::Contains("n: -1"));

    r = moe::checked_row_bytes(MOE_TYPE_Q4_0, 33);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(r.status().message(), Catch::Contains("33") && Catch::Contains("q4_0") && Catch::Contains("32"));

    // (2^63 - 1) f32 values need more than 2^64 bytes
    r = moe::checked_row_bytes(MOE_TYPE_F32, std::numeric_limits<int64_t>::max());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("fp16 conversion: special values and ties", "[types]") {
    const float inf = std::numeric_limits<float>::infinity();
    struct Case {
        float f;
        uint16_t h;
    };
    // Expected encodings from the binary16 definition: sign | 5-bit exponent (bias 15) | 10-bit mantissa.
    const Case cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0.5f, 0x3800},
        {65504.0f, 0x7BFF},                      // largest finite
        {65519.0f, 0x7BFF},                      // below the halfway point to 2^16
        {65520.0f, 0x7C00},                      // halfway: ties to even (0x7C00) = inf
        {1e6f, 0x7C00},
        {-1e6f, 0xFC00},
        {inf, 0x7C00},
        {-inf, 0xFC00},
        {std::ldexp(1.0f, -14), 0x0400},         // smallest normal
        {std::ldexp(1023.0f, -24), 0x03FF},      // largest subnormal
        {std::ldexp(1.0f, -24), 0x0001},         // smallest subnormal
        {std::ldexp(1.0f, -25), 0x0000},         // halfway between 0 and 2^-24: to even 0
        {std::ldexp(1.0f + std::ldexp(1.0f, -23), -25), 0x0001},  // just above halfway
        {std::ldexp(3.0f, -25), 0x0002},         // 1.5 * 2^-24: tie between 1 and 2 -> 2
        {std::ldexp(5.0f, -25), 0x0002},         // 2.5 * 2^-24: tie between 2 and 3 -> 2
        {-std::ldexp(1.0f, -26), 0x8000},
        {1.0f + std::ldexp(1.0f, -11), 0x3C00},  // tie between 1 and 1 + 2^-10 -> even 0x3C00
        {1.0f + std::ldexp(3.0f, -11), 0x3C02},  // tie between 0x3C01 and 0x3C02 -> 0x3C02
        {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23), 0x3C01},
        {2047.5f, 0x6800},                       // tie between 2047 (0x67FF, odd) and 2048 (0x6800)
    };
    for (const Case& c : cases) {
        INFO("f = " << c.f);
        CHECK(moe::fp32_to_fp16(c.f) == c.h);
    }
    // NaN stays NaN and is quiet (ggml: sign | 0x7E00)
    CHECK(moe::fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
    CHECK(moe::fp32_to_fp16(f32_from_bits(0x7F800001u)) == 0x7E00);
    CHECK(moe::fp32_to_fp16(f32_from_bits(0xFFC00000u)) == 0xFE00);

    // decoding, from the definition
    CHECK(moe::fp16_to_fp32(0x3C00) == 1.0f);
    CHECK(moe::fp16_to_fp32(0xC000) == -2.0f);
    CHECK(moe::fp16_to_fp32(0x3555) == 0.333251953125f);  // (1 + 341/1024) / 4
    CHECK(moe::fp16_to_fp32(0x7BFF) == 65504.0f);
    CHECK(moe::fp16_to_fp32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(moe::fp16_to_fp32(0x83FF) == -std::ldexp(1023.0f, -24));
    CHECK(moe::fp16_to_fp32(0x7C00) == inf);
    CHECK(moe::fp16_to_fp32(0xFC00) == -inf);
    CHECK(std::isnan(moe::fp16_to_fp32(0x7E00)));
    CHECK(std::isnan(moe::fp16_to_fp32(0x7C01)));
    CHECK(std::signbit(moe::fp16_to_fp32(0x8000)));

    // every non-NaN half survives a round trip through float
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) continue;  // NaN
        const auto hh = static_cast<uint16_t>(h);
        REQUIRE(moe::fp32_to_fp16(moe::fp16_to_fp32(hh)) == hh);
    }
}

TEST_CASE("fp16 conversion rounds to nearest even on random floats", "[types]") {
    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> bits;
    // Half the samples from all bit patterns, half concentrated in the half-precision range (|x| < 2^17),
    // where the mantissa rounding actually happens.
    std::uniform_int_distribution<uint32_t> in_range(0x30000000u, 0x48000000u);
    for (int i = 0; i < 400000; ++i) {
        uint32_t u = (i % 2 == 0) ? bits(rng) : (in_range(rng) | (bits(rng) & 0x80000000u));
        const float x = f32_from_bits(u);
        if (std::isnan(x)) continue;
        check_nearest_even(x, moe::fp32_to_fp16(x), moe::fp16_to_fp32, 65520.0);
    }
}

TEST_CASE("bf16 conversion: special values, ties and NaN", "[types]") {
    struct Case {
        uint32_t f;
        uint16_t h;
    };
    // bf16 is the top half of a float: the low 16 bits are rounded away, to nearest, ties to even.
    const Case cases[] = {
        {0x3F800000u, 0x3F80},  // 1.0
        {0x3F808000u, 0x3F80},  // tie, 0x3F80 even
        {0x3F818000u, 0x3F82},  // tie, 0x3F81 odd -> up
        {0x3F808001u, 0x3F81},  // above the tie
        {0x3F807FFFu, 0x3F80},  // below the tie
        {0xBF808001u, 0xBF81},
        {0x7F800000u, 0x7F80},  // inf
        {0xFF800000u, 0xFF80},  // -inf
        {0x7F7FFFFFu, 0x7F80},  // FLT_MAX rounds up to inf
        {0x7F7F7FFFu, 0x7F7F},  // largest float that stays finite
        {0x00018000u, 0x0002},  // subnormal tie, 0x0001 odd -> up (subnormals are not flushed)
        {0x00008000u, 0x0000},  // subnormal tie to even 0
        {0x00000001u, 0x0000},
        {0x80000000u, 0x8000},  // -0
        {0x7F800001u, 0x7FC0},  // signalling NaN: payload's top bits kept, quiet bit set
        {0xFF800001u, 0xFFC0},
        {0x7FC00000u, 0x7FC0},
        {0x7FFFFFFFu, 0x7FFF},  // NaN payload not rounded (rounding would overflow into the sign)
    };
    for (const Case& c : cases) {
        INFO("bits 0x" << std::hex << c.f);
        CHECK(moe::fp32_to_bf16(f32_from_bits(c.f)) == c.h);
    }
    CHECK(moe::bf16_to_fp32(0x3F80) == 1.0f);
    CHECK(moe::bf16_to_fp32(0xC040) == -3.0f);
    CHECK(moe::bf16_to_fp32(0x4049) == 3.140625f);  // 1.5703125 * 2

    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0) continue;  // NaN
        const auto hh = static_cast<uint16_t>(h);
        REQUIRE(moe::fp32_to_bf16(moe::bf16_to_fp32(hh)) == hh);
    }

    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> bits;
    // bf16 overflows to inf from the midpoint between its largest finite value (0x7F7F) and 2^128.
    const double overflow_at = (static_cast<double>(moe::bf16_to_fp32(0x7F7F)) + std::ldexp(1.0, 128)) / 2;
    for (int i = 0; i < 200000; ++i) {
        const float x = f32_from_bits(bits(rng));
        if (std::isnan(x)) continue;
        check_nearest_even(x, moe::fp32_to_bf16(x), moe::bf16_to_fp32, overflow_at);
    }
}

TEST_CASE("e8m0_to_fp32_half is 2^(e - 128)", "[types]") {
    CHECK(moe::e8m0_to_fp32_half(0) == std::ldexp(1.0f, -128));  // subnormal float
    CHECK(moe::e8m0_to_fp32_half(1) == std::ldexp(1.0f, -127));  // subnormal float
    CHECK(moe::e8m0_to_fp32_half(2) == std::ldexp(1.0f, -126));
    CHECK(moe::e8m0_to_fp32_half(127) == 0.5f);
    CHECK(moe::e8m0_to_fp32_half(128) == 1.0f);
    CHECK(moe::e8m0_to_fp32_half(254) == std::ldexp(1.0f, 126));
    CHECK(moe::e8m0_to_fp32_half(255) == std::ldexp(1.0f, 127));
    for (int e = 0; e < 256; ++e) CHECK(moe::e8m0_to_fp32_half(static_cast<uint8_t>(e)) == std::ldexp(1.0f, e - 128));
}

TEST_CASE("Q8_0 golden blocks", "[types]") {
    // amax = 254 -> d = 2 (fp16 0x4000), 1/d = 0.5 exactly; q = roundf(x / 2), halves away from zero.
    std::vector<float> x(32, 0.0f);
    const float head[] = {-254, 1, 3, -3, 5, 2.9f, -1, 0.99f, 253, -253, 0.5f};
    std::copy(std::begin(head), std::end(head), x.begin());
    std::vector<uint8_t> bytes;
    const std::vector<float> y = round_trip(Type::Q8_0, x, &bytes);
    REQUIRE(bytes.size() == 34);
    CHECK(bytes[0] == 0x00);
    CHECK(bytes[1] == 0x40);
    const int8_t expect_q[] = {-127, 1, 2, -2, 3, 1, -1, 0, 127, -127, 0};
    for (size_t j = 0; j < 32; ++j) {
        const int8_t q = j < std::size(expect_q) ? expect_q[j] : 0;
        INFO("j = " << j);
        CHECK(static_cast<int8_t>(bytes[2 + j]) == q);
        CHECK(y[j] == 2.0f * q);
    }

    // amax = 1 -> d = 1/127 = 2^-7 * 1.0079..., fp16 mantissa round(0.0079 * 1024) = 8 -> 0x2008
    std::vector<float> ones(32, 0.0f);
    ones[3] = 1.0f;
    ones[4] = -1.0f;
    round_trip(Type::Q8_0, ones, &bytes);
    CHECK(bytes[0] == 0x08);
    CHECK(bytes[1] == 0x20);
    CHECK(static_cast<int8_t>(bytes[2 + 3]) == 127);
    CHECK(static_cast<int8_t>(bytes[2 + 4]) == -127);
    CHECK(bytes[2] == 0);

    // an all-zero block: d = 0 and every q = 0
    std::vector<float> zeros(64, 0.0f);
    const std::vector<float> yz = round_trip(Type::Q8_0, zeros, &bytes);
    for (uint8_t b : bytes) CHECK(b == 0);
    for (float v : yz) CHECK(v == 0.0f);
}

TEST_CASE("Q4_0 golden block", "[types]") {
    // max = 16 (the first of the two values of magnitude 16) -> d = 16 / -8 = -2 (fp16 0xC000), 1/d = -0.5;
    // q = min(15, trunc(x * -0.5 + 8.5)). Low nibbles hold x[0..15], high nibbles x[16..31].
    const float lo_x[16] = {16, -16, 0, 1, -1, 3, 2.9f, -3, 5, -5, 1.1f, -0.9f, 14, -14, 0.5f, -0.5f};
    const int lo_q[16] = {0, 15, 8, 8, 9, 7, 7, 10, 6, 11, 7, 8, 1, 15, 8, 8};  // -16 -> 16.5 -> clamped 15
    const float hi_x[16] = {2, -2, 4, -4, 6, -6, 8, -8, 10, -10, 12, -12, 7, -7, 0.25f, 15};
    const int hi_q[16] = {7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 5, 12, 8, 1};
    const uint8_t expect_qs[16] = {0x70, 0x9F, 0x68, 0xA8, 0x59, 0xB7, 0x47, 0xCA,
                                   0x36, 0xDB, 0x27, 0xE8, 0x51, 0xCF, 0x88, 0x18};
    std::vector<float> x(32);
    for (int j = 0; j < 16; ++j) {
        x[j] = lo_x[j];
        x[16 + j] = hi_x[j];
    }
    std::vector<uint8_t> bytes;
    const std::vector<float> y = round_trip(Type::Q4_0, x, &bytes);
    REQUIRE(bytes.size() == 18);
    CHECK(bytes[0] == 0x00);
    CHECK(bytes[1] == 0xC0);
    for (int j = 0; j < 16; ++j) {
        INFO("j = " << j);
        CHECK(bytes[2 + j] == expect_qs[j]);
        CHECK(y[j] == -2.0f * static_cast<float>(lo_q[j] - 8));
        CHECK(y[16 + j] == -2.0f * static_cast<float>(hi_q[j] - 8));
    }
    CHECK(y[0] == 16.0f);   // the extreme value is exact (q = 0)
    CHECK(y[1] == -14.0f);  // its mirror is clamped to q = 15

    // an all-zero block: d = 0/-8 = -0 (fp16 0x8000), every q = trunc(0 + 8.5) = 8
    std::vector<float> zeros(32, 0.0f);
    round_trip(Type::Q4_0, zeros, &bytes);
    CHECK(bytes[0] == 0x00);
    CHECK(bytes[1] == 0x80);
    for (int j = 0; j < 16; ++j) CHECK(bytes[2 + j] == 0x88);
}

TEST_CASE("MXFP4 golden blocks", "[types]") {
    // amax = 7 -> floor(log2 7) = 2 -> e = 2 - 2 + 127 = 127 -> scale 2^-1, so the grid is the e2m1 values
    // {0, .5, 1, 1.5, 2, 3, 4, 6} and their negatives (index 8 + i). Ties go to the lower index.
    const float lo_x[16] = {6, -6, 0, -0.0f, 0.25f, -0.25f, 0.3f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 5.1f, -5, -1.25f};
    const int lo_q[16] = {7, 15, 0, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 14, 10};
    const float hi_x[16] = {7,     -7, 0.1f, -0.1f, -0.3f, -0.75f, 2.2f, -2.9f,
                            3.9f, -4.5f, 1,  -1.5f, 4.9f, 5.5f,  -2,   0.5f};
    const int hi_q[16] = {7, 15, 0, 0, 9, 9, 4, 13, 6, 14, 2, 11, 6, 7, 12, 1};
    const uint8_t expect_qs[16] = {0x77, 0xFF, 0x00, 0x00, 0x90, 0x90, 0x41, 0xD1,
                                   0x62, 0xE3, 0x24, 0xB5, 0x66, 0x77, 0xCE, 0x1A};
    const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, 0, -.5f, -1, -1.5f, -2, -3, -4, -6};
    std::vector<float> x(32);
    for (int j = 0; j < 16; ++j) {
        x[j] = lo_x[j];
        x[16 + j] = hi_x[j];
    }
    std::vector<uint8_t> bytes;
    const std::vector<float> y = round_trip(Type::MXFP4, x, &bytes);
    REQUIRE(bytes.size() == 17);
    CHECK(bytes[0] == 127);
    for (int j = 0; j < 16; ++j) {
        INFO("j = " << j);
        CHECK(bytes[1 + j] == expect_qs[j]);
        CHECK(y[j] == e2m1[lo_q[j]]);
        CHECK(y[16 + j] == e2m1[hi_q[j]]);
    }

    // all 0.1: floor(log2 0.1) = -4 -> e = 121, scale 2^-7; 0.1 / 2^-7 = 12.8 -> nearest doubled value 12
    // (index 7), decoded 12 * 2^-7 = 0.09375
    std::vector<float> tenths(32, 0.1f);
    const std::vector<float> yt = round_trip(Type::MXFP4, tenths, &bytes);
    CHECK(bytes[0] == 121);
    for (int j = 0; j < 16; ++j) CHECK(bytes[1 + j] == 0x77);
    for (float v : yt) CHECK(v == 0.09375f);

    // amax exactly a power of two: 1.0 -> e = 0 - 2 + 127 = 125, scale 2^-3, 1.0 = 8 * 2^-3 (index 6)
    std::vector<float> one(32, 0.0f);
    one[0] = 1.0f;
    round_trip(Type::MXFP4, one, &bytes);
    CHECK(bytes[0] == 125);
    CHECK(bytes[1] == 0x06);

    // an all-zero block: e = 0, all indices 0
    std::vector<float> zeros(32, 0.0f);
    round_trip(Type::MXFP4, zeros, &bytes);
    for (uint8_t b : bytes) CHECK(b == 0);
}

TEST_CASE("quantisation round trips stay within the format's error bounds", "[types]") {
    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    constexpr int64_t kBlocks = 2048;
    constexpr int kQK = moe::kQK;

    SECTION("F32 is exact") {
        const auto x = random_blocks(rng, kBlocks, -60, 60);
        CHECK(round_trip(Type::F32, x) == x);
    }
    SECTION("F16: |err| <= 2^-11 |x| (half an ulp of an 11-bit significand), 2^-25 among subnormals") {
        const auto x = random_blocks(rng, kBlocks, -20, 12);  // below 65504, some values subnormal
        const auto y = round_trip(Type::F16, x);
        for (size_t i = 0; i < x.size(); ++i) {
            const float bound = std::max(std::ldexp(std::fabs(x[i]), -11), std::ldexp(1.0f, -25));
            REQUIRE(std::fabs(y[i] - x[i]) <= bound);
        }
    }
    SECTION("BF16: |err| <= 2^-8 |x| (half an ulp of an 8-bit significand), 2^-134 among subnormals") {
        const auto x = random_blocks(rng, kBlocks, -120, 120);
        const auto y = round_trip(Type::BF16, x);
        for (size_t i = 0; i < x.size(); ++i) {
            const double bound = std::max(std::ldexp(std::fabs(static_cast<double>(x[i])), -8), std::ldexp(1.0, -134));
            REQUIRE(std::fabs(static_cast<double>(y[i]) - x[i]) <= bound);
        }
    }
    SECTION("Q8_0: |err| <= d/2 + 127 * |d - fp16(d)| per element") {
        // q = round(x / d) is within 1/2 of x / d; decoding uses fp16(d), which is off by at most
        // 2^-11 * d relative, times |q| <= 127. Scales keep d = amax / 127 in the normal fp16 range.
        const auto x = random_blocks(rng, kBlocks, -6, 12);
        std::vector<uint8_t> bytes;
        const auto y = round_trip(Type::Q8_0, x, &bytes);
        for (int64_t b = 0; b < kBlocks; ++b) {
            float amax = 0;
            for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
            const double d = amax / 127.0;
            const double bound = d / 2 + 127 * d * std::ldexp(1.0, -11) + d * 1e-6;
            for (int j = 0; j < kQK; ++j) {
                INFO("block " << b << " element " << j);
                REQUIRE(std::fabs(static_cast<double>(y[b * kQK + j]) - x[b * kQK + j]) <= bound);
            }
        }
    }
    SECTION("Q4_0: |err| <= |d|/2, or |d| on the clamped side, + 8 * |d - fp16(d)|") {
        // d = max / -8, so x / d lies in [-8, 8] with max itself at -8; q - 8 = round-half-up(x / d)
        // except that +8 does not exist and x / d in [7.5, 8] is clamped to 7 (error up to 1 * |d|).
        const auto x = random_blocks(rng, kBlocks, -6, 12);
        const auto y = round_trip(Type::Q4_0, x);
        for (int64_t b = 0; b < kBlocks; ++b) {
            float amax = 0, max = 0;
            for (int j = 0; j < kQK; ++j) {
                if (std::fabs(x[b * kQK + j]) > amax) {
                    amax = std::fabs(x[b * kQK + j]);
                    max = x[b * kQK + j];
                }
            }
            const double d = max / -8.0;
            const double fp16_part = 8 * std::fabs(d) * std::ldexp(1.0, -11) + std::fabs(d) * 1e-6;
            for (int j = 0; j < kQK; ++j) {
                const double xd = x[b * kQK + j] / d;
                const double bound = (xd >= 7.5 ? std::fabs(d) : std::fabs(d) / 2) + fp16_part;
                INFO("block " << b << " element " << j << " x/d " << xd);
                REQUIRE(std::fabs(static_cast<double>(y[b * kQK + j]) - x[b * kQK + j]) <= bound);
            }
        }
    }
    SECTION("MXFP4: |err| <= half the e2m1 grid spacing at |x|, 4 * scale where it saturates") {
        // scale s = 2^(floor(log2 amax) - 3) puts |x| / s in [0, 16); the doubled e2m1 grid
        // {0,1,2,3,4,6,8,12} has spacing 1 up to 4, 2 up to 8, 4 up to 12; beyond 12 values saturate
        // to 12, at most 4 * s away. The scale is a power of two, so decoding adds no rounding; the
        // nearest value is chosen on float-rounded distances, hence a 1e-6 relative slack near ties.
        const auto x = random_blocks(rng, kBlocks, -60, 60);
        std::vector<uint8_t> bytes;
        const auto y = round_trip(Type::MXFP4, x, &bytes);
        for (int64_t b = 0; b < kBlocks; ++b) {
            const double s = moe::e8m0_to_fp32_half(bytes[static_cast<size_t>(b) * 17]);
            for (int j = 0; j < kQK; ++j) {
                const double ax = std::fabs(x[b * kQK + j]) / s;
                REQUIRE(ax < 16.0);
                const double bound = (ax <= 4 ? 0.5 : ax <= 8 ? 1.0 : ax <= 12 ? 2.0 : 4.0) * s * (1 + 1e-6);
                INFO("block " << b << " element " << j << " |x|/s " << ax);
                REQUIRE(std::fabs(static_cast<double>(y[b * kQK + j]) - x[b * kQK + j]) <= bound);
            }
        }
    }
}

TEST_CASE("C API: element types", "[types]") {
    CHECK(std::string(moe_type_name(MOE_TYPE_MXFP4)) == "mxfp4");
    CHECK(std::string(moe_type_name(MOE_TYPE_Q4_0)) == "q4_0");
    CHECK(std::string(moe_type_name(MOE_TYPE_Q4_K)) == "q4_K");
    CHECK(std::string(moe_type_name(MOE_TYPE_IQ2_XS)) == "iq2_xs");  // named, though not convertible
    CHECK(std::string(moe_type_name(MOE_TYPE_I32)) == "i32");
    CHECK(moe_type_name(4) == nullptr);  // removed from ggml
    CHECK(moe_type_name(42) == nullptr);

    int32_t id = -1;
    CHECK(moe_type_from_name("Q8_0", &id) == MOE_STATUS_OK);
    CHECK(id == MOE_TYPE_Q8_0);
    CHECK(moe_type_from_name("bf16", &id) == MOE_STATUS_OK);
    CHECK(id == MOE_TYPE_BF16);
    id = -1;
    CHECK(moe_type_from_name("q4_2", &id) == MOE_STATUS_NOT_FOUND);
    CHECK(id == -1);  // outputs are written only on success
    CHECK_THAT(std::string(moe_last_error()), Catch::Contains("q4_2"));
    CHECK(moe_type_from_name("q4_k", &id) == MOE_STATUS_OK);  // ggml spells it q4_K; case is ignored
    CHECK(id == MOE_TYPE_Q4_K);
    CHECK(moe_type_from_name(nullptr, &id) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_last_error()), Catch::Contains("name"));
    CHECK(moe_type_from_name("f32", nullptr) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_last_error()), Catch::Contains("out_type"));

    int64_t bs = 0, bb = 0;
    CHECK(moe_type_block_info(MOE_TYPE_Q4_0, &bs, &bb) == MOE_STATUS_OK);
    CHECK(bs == 32);
    CHECK(bb == 18);
    CHECK(std::string(moe_last_error()).empty());
    CHECK(moe_type_block_info(37, &bs, &bb) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()) == "unknown tensor type id 37");
    CHECK(moe_type_block_info(MOE_TYPE_F32, nullptr, &bb) == MOE_STATUS_INVALID_ARGUMENT);

    uint64_t bytes = 0;
    CHECK(moe_type_row_bytes(MOE_TYPE_MXFP4, 64, &bytes) == MOE_STATUS_OK);
    CHECK(bytes == 34);
    CHECK(moe_type_row_bytes(MOE_TYPE_MXFP4, 48, &bytes) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_type_row_bytes(MOE_TYPE_F16, -2, &bytes) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_type_row_bytes(37, 32, &bytes) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(moe_type_row_bytes(MOE_TYPE_F16, 2, nullptr) == MOE_STATUS_INVALID_ARGUMENT);

    const uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto x = random_blocks(rng, 16, -2, 2);  // whole blocks of every format (256 elements: K-quants)
    for (const moe::TypeTraits& t : moe::all_type_traits()) {
        INFO(t.name);
        if (t.to_float == nullptr) continue;  // described only (test_quant_formats.cpp checks the refusal)
        const auto type = static_cast<int32_t>(t.type);
        const auto n = static_cast<int64_t>(x.size());
        std::vector<uint8_t> direct(moe::row_bytes(t.type, n));
        t.from_float(x.data(), direct.data(), n);
        std::vector<uint8_t> via_api(direct.size() + 3, 0xAB);
        REQUIRE(moe_quantize(type, x.data(), n, via_api.data(), via_api.size()) == MOE_STATUS_OK);
        CHECK(std::equal(direct.begin(), direct.end(), via_api.begin()));
        CHECK(via_api.back() == 0xAB);  // nothing written past the row

        std::vector<float> y(x.size()), y_direct(x.size());
        t.to_float(direct.data(), y_direct.data(), n);
        REQUIRE(moe_dequantize(type, direct.data(), direct.size(), n, y.data()) == MOE_STATUS_OK);
        CHECK(y == y_direct);

        CHECK(moe_quantize(type, x.data(), n, via_api.data(), direct.size() - 1) == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(std::string(moe_last_error()) == "dst_size: " + std::to_string(direct.size() - 1) + " bytes given, " +
                                                   std::to_string(direct.size()) + " needed");
        CHECK(moe_dequantize(type, direct.data(), direct.size() - 1, n, y.data()) == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(std::string(moe_last_error()), Catch::StartsWith("src_size: "));
        CHECK(moe_quantize(type, nullptr, n, via_api.data(), via_api.size()) == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(std::string(moe_last_error()), Catch::StartsWith("src"));
        CHECK(moe_quantize(type, x.data(), n, nullptr, via_api.size()) == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(std::string(moe_last_error()), Catch::StartsWith("dst"));
        CHECK(moe_dequantize(type, direct.data(), direct.size(), n, nullptr) == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(moe_quantize(type, x.data(), -32, via_api.data(), via_api.size()) == MOE_STATUS_INVALID_ARGUMENT);
    }
    std::vector<uint8_t> dst(34);
    CHECK(moe_quantize(MOE_TYPE_Q8_0, x.data(), 31, dst.data(), dst.size()) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_quantize(MOE_TYPE_Q8_0, x.data(), 32, dst.data(), 10) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()) == "dst_size: 10 bytes given, 34 needed");
    CHECK(moe_quantize(37, x.data(), 32, dst.data(), dst.size()) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(moe_dequantize(37, dst.data(), dst.size(), 32, nullptr) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(moe_quantize(MOE_TYPE_I32, x.data(), 8, dst.data(), dst.size()) == MOE_STATUS_UNIMPLEMENTED);
    CHECK(std::string(moe_last_error()) == "type i32: this build cannot quantize to it");
}
