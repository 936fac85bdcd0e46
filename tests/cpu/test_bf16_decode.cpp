// The BF16 path's weight decoders (cpu/matmul_bf16_avx512.cpp) against the type table's to_float, bit
// for bit after the BF16 rounding (nearest even, subnormals flushed to zero as the AVX-512 BF16
// conversions do): every quantised kind, random blocks with ordinary, zero, subnormal, extreme and
// non-finite fp16 scales, several rows and a chunk that starts past the first. A NaN value must stay
// NaN (a corrupt scale must not come out as a number). The int8 tiles' decoders (matmul_i8_avx512.cpp)
// likewise against to_float requantised per super-block by the Q8K formula, their scale NaN where a
// super-block holds inf or NaN.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "core/types.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul_bf16.h"
#include "cpu/matmul_i8.h"
#include "op_test_util.h"

namespace {

using moe::Type;
namespace mm = moe::cpu::mm;

struct KindCase {
    Type type;
    mm::WeightKind kind;
    std::vector<size_t> fp16_fields;  // byte offsets of the block's fp16 scales
};

// One fp16 scale: mostly ordinary values, sometimes the edge cases.
uint16_t random_scale(std::mt19937_64& rng) {
    static constexpr uint16_t kEdges[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF,
                                          0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7D01};
    std::uniform_int_distribution<int> pick(0, 31);
    const int i = pick(rng);
    if (i < static_cast<int>(std::size(kEdges))) return kEdges[i];
    std::uniform_real_distribution<float> mag(-0.05f, 0.05f);
    return moe::fp32_to_fp16(mag(rng));
}

// Random bytes for `bytes` of rows of c's blocks (and 64 more), each block's fp16 scales from
// random_scale.
std::vector<uint8_t> random_rows(const KindCase& c, size_t bytes, std::mt19937_64& rng) {
    const auto block = static_cast<size_t>(moe::traits(c.type).block_bytes);
    std::vector<uint8_t> w(bytes + 64);
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
    for (size_t blk = 0; blk + block <= bytes; blk += block) {
        for (const size_t off : c.fp16_fields) {
            const uint16_t h = random_scale(rng);
            std::memcpy(w.data() + blk + off, &h, 2);
        }
    }
    return w;
}

}  // namespace

TEST_CASE("BF16 path decoders equal to_float rounded to BF16, bit for bit", "[matmul][bf16]") {
    if (!moe::cpu::cpu_features().avx512_bf16) {
        WARN("skipped: the BF16 path (this CPU has no AVX-512 BF16)");
        return;
    }
    const KindCase cases[] = {
        {Type::Q8_0, mm::kQ8_0, {0}},      {Type::Q4_0, mm::kQ4_0, {0}},         {Type::MXFP4, mm::kMXFP4, {}},
        {Type::Q4_1, mm::kQ4_1, {0, 2}},   {Type::Q5_0, mm::kQ5_0, {0}},         {Type::Q5_1, mm::kQ5_1, {0, 2}},
        {Type::IQ4_NL, mm::kIQ4_NL, {0}},  {Type::Q2_K, mm::kQ2_K, {80, 82}},    {Type::Q3_K, mm::kQ3_K, {108}},
        {Type::Q4_K, mm::kQ4_K, {0, 2}},   {Type::Q5_K, mm::kQ5_K, {0, 2}},      {Type::Q6_K, mm::kQ6_K, {208}},
        {Type::IQ4_XS, mm::kIQ4_XS, {0}},
    };
    auto rng = moe::test::make_rng(71);
    const int64_t k = 2 * mm::bf16::kChunk;  // two chunks per row; the second decoded from k0 = kChunk
    const int n_rows = mm::bf16::kRows;
    for (const KindCase& c : cases) {
        const moe::TypeTraits& tt = moe::traits(c.type);
        const mm::bf16::DecodeFn decode = mm::bf16::kAvx512Bf16Kernels.decode[c.kind];
        INFO(moe::type_name(c.type));
        REQUIRE(decode != nullptr);
        const auto row_bytes = static_cast<size_t>(k / tt.block_size * tt.block_bytes);
        for (int rep = 0; rep < 4; ++rep) {
            const std::vector<uint8_t> w = random_rows(c, row_bytes * n_rows, rng);
            for (const int64_t k0 : {int64_t{0}, mm::bf16::kChunk}) {
                std::vector<uint16_t> got(static_cast<size_t>(n_rows * mm::bf16::kChunk), 0x5555);
                decode(w.data(), row_bytes, n_rows, k0, mm::bf16::kChunk, got.data());
                std::vector<float> want(static_cast<size_t>(k));
                int bad = 0;
                for (int r = 0; r < n_rows; ++r) {
                    tt.to_float(w.data() + r * row_bytes, want.data(), k);
                    for (int64_t i = 0; i < mm::bf16::kChunk; ++i) {
                        const float v = want[static_cast<size_t>(k0 + i)];
                        const uint16_t g = got[static_cast<size_t>(r * mm::bf16::kChunk + i)];
                        bool ok;
                        if (std::isnan(v)) {
                            ok = (g & 0x7F80) == 0x7F80 && (g & 0x007F) != 0;
                        } else if (std::fabs(v) < std::numeric_limits<float>::min()) {
                            ok = (g & 0x7FFF) == 0;  // flushed (either sign)
                        } else {
                            ok = g == moe::fp32_to_bf16(v);
                        }
                        if (!ok && bad++ < 3) {
                            INFO("rep " << rep << " k0 " << k0 << " row " << r << " element " << i << ": to_float "
                                        << v << ", decoded bf16 0x" << std::hex << g << ", want 0x"
                                        << moe::fp32_to_bf16(v));
                            CHECK(false);
                        }
                    }
                }
                CHECK(bad == 0);
            }
        }
    }
}

TEST_CASE("int8 tile decoders equal to_float requantised per super-block, bit for bit", "[matmul][bf16][i8]") {
    if (!moe::cpu::cpu_features().avx512_bf16 || !moe::cpu::cpu_features().avx512_vnni) {
        WARN("skipped: the int8 tiles (this CPU has no AVX-512 BF16 / VNNI)");
        return;
    }
    const KindCase cases[] = {
        {Type::Q2_K, mm::kQ2_K, {80, 82}}, {Type::Q3_K, mm::kQ3_K, {108}}, {Type::Q4_K, mm::kQ4_K, {0, 2}},
        {Type::Q5_K, mm::kQ5_K, {0, 2}},   {Type::Q6_K, mm::kQ6_K, {208}}, {Type::IQ4_XS, mm::kIQ4_XS, {0}},
    };
    auto rng = moe::test::make_rng(73);
    const int64_t k = 2 * mm::i8::kChunk;  // two chunks per row; the second decoded from k0 = kChunk
    const int n_rows = mm::i8::kRows;
    for (const KindCase& c : cases) {
        const moe::TypeTraits& tt = moe::traits(c.type);
        const mm::i8::DecodeFn decode = mm::i8::kAvx512I8Kernels.decode[c.kind];
        INFO(moe::type_name(c.type));
        REQUIRE(decode != nullptr);
        const auto row_bytes = static_cast<size_t>(k / tt.block_size * tt.block_bytes);
        int non_finite = 0;
        for (int rep = 0; rep < 4; ++rep) {
            const std::vector<uint8_t> w = random_rows(c, row_bytes * n_rows, rng);
            for (const int64_t k0 : {int64_t{0}, mm::i8::kChunk}) {
                std::vector<uint8_t> got(static_cast<size_t>(n_rows * mm::i8::kChunk), 0x55);
                std::vector<float> scales(static_cast<size_t>(n_rows * mm::i8::kChunkBlocks), 1234.0f);
                decode(w.data(), row_bytes, n_rows, k0, mm::i8::kChunk, got.data(), scales.data());
                std::vector<float> v(static_cast<size_t>(k));
                int bad = 0;
                for (int r = 0; r < n_rows; ++r) {
                    tt.to_float(w.data() + r * row_bytes, v.data(), k);
                    for (int64_t s = 0; s < mm::i8::kChunkBlocks; ++s) {
                        // The Q8K quantiser's formula over the super-block's to_float values.
                        const float* vb = v.data() + k0 + 256 * s;
                        float amax = 0.0f;
                        bool finite = true;
                        for (int j = 0; j < 256; ++j) {
                            finite = finite && std::isfinite(vb[j]);
                            amax = std::fmax(amax, std::fabs(vb[j]));
                        }
                        const float scale = scales[static_cast<size_t>(r * mm::i8::kChunkBlocks + s)];
                        if (!finite) {
                            ++non_finite;
                            if (!std::isnan(scale) && bad++ < 3) {
                                INFO("rep " << rep << " k0 " << k0 << " row " << r << " super-block " << s
                                            << ": non-finite values, scale " << scale << ", want NaN");
                                CHECK(false);
                            }
                            continue;
                        }
                        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
                        const float want_scale = amax / 127.0f;
                        bool ok = std::memcmp(&scale, &want_scale, 4) == 0;
                        for (int j = 0; j < 256 && ok; ++j) {
                            const int q = static_cast<int>(std::nearbyint(vb[j] * id));
                            ok = got[static_cast<size_t>(r * mm::i8::kChunk + 256 * s + j)] == static_cast<uint8_t>(q + 128);
                        }
                        if (!ok && bad++ < 3) {
                            INFO("rep " << rep << " k0 " << k0 << " row " << r << " super-block " << s << ": scale "
                                        << scale << " want " << want_scale << ", or a value differs");
                            CHECK(false);
                        }
                    }
                }
                CHECK(bad == 0);
            }
        }
        CHECK(non_finite > 0);  // the edge scales reached the NaN rule
    }
}
