// core/quant_decode.h, the group decoders the CUDA kernels run, on the host: bit for bit the values of
// lib/core's dequantisation (traits().to_float, itself checked against gguf-py) on random block bytes,
// with scales at the extremes of fp16 (zero, subnormal, largest finite, infinite, NaN) on a share of
// the blocks; every fp16 bit pattern through the decoders' fp16 conversion. A NaN from a sum of two NaNs
// (Q4_1 / Q5_1 with NaN d and m) may carry either's payload: IEEE 754 leaves that to the implementation,
// and compilers commute the add, so there both sides need only be NaN.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/quant_decode.h"
#include "core/types.h"
#include "common/decoded_types.h"

namespace {

using moe::Type;

using moe::test::fp16_fields;
using moe::test::same_value;
constexpr auto& kDecoded = moe::test::kDecodedTypes;

void decode32(Type t, const uint8_t* blk, int g, float (&v)[32]) {
    switch (t) {
        case Type::Q4_1: return moe::qd::decode32<Type::Q4_1>(blk, g, v);
        case Type::Q5_0: return moe::qd::decode32<Type::Q5_0>(blk, g, v);
        case Type::Q5_1: return moe::qd::decode32<Type::Q5_1>(blk, g, v);
        case Type::IQ4_NL: return moe::qd::decode32<Type::IQ4_NL>(blk, g, v);
        case Type::Q2_K: return moe::qd::decode32<Type::Q2_K>(blk, g, v);
        case Type::Q3_K: return moe::qd::decode32<Type::Q3_K>(blk, g, v);
        case Type::Q4_K: return moe::qd::decode32<Type::Q4_K>(blk, g, v);
        case Type::Q5_K: return moe::qd::decode32<Type::Q5_K>(blk, g, v);
        case Type::Q6_K: return moe::qd::decode32<Type::Q6_K>(blk, g, v);
        default: return moe::qd::decode32<Type::IQ4_XS>(blk, g, v);
    }
}

void decode_unit_half(Type t, const uint8_t* unit, int q, int h, float (&v)[16]) {
    switch (t) {
        case Type::Q4_1: return moe::qd::decode_unit_half<Type::Q4_1>(unit, q, h, v);
        case Type::Q5_0: return moe::qd::decode_unit_half<Type::Q5_0>(unit, q, h, v);
        case Type::Q5_1: return moe::qd::decode_unit_half<Type::Q5_1>(unit, q, h, v);
        case Type::IQ4_NL: return moe::qd::decode_unit_half<Type::IQ4_NL>(unit, q, h, v);
        case Type::Q2_K: return moe::qd::decode_unit_half<Type::Q2_K>(unit, q, h, v);
        case Type::Q3_K: return moe::qd::decode_unit_half<Type::Q3_K>(unit, q, h, v);
        case Type::Q4_K: return moe::qd::decode_unit_half<Type::Q4_K>(unit, q, h, v);
        case Type::Q5_K: return moe::qd::decode_unit_half<Type::Q5_K>(unit, q, h, v);
        case Type::Q6_K: return moe::qd::decode_unit_half<Type::Q6_K>(unit, q, h, v);
        default: return moe::qd::decode_unit_half<Type::IQ4_XS>(unit, q, h, v);
    }
}

}  // namespace

TEST_CASE("quant_decode's block sizes are the traits table's", "[types][quant_decode]") {
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        CHECK(moe::qd::decodes(t));
        CHECK(moe::qd::block_elems(t) == moe::traits(t).block_size);
        CHECK(moe::qd::block_bytes(t) == moe::traits(t).block_bytes);
    }
    for (Type t : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::Q8_K}) {
        CHECK_FALSE(moe::qd::decodes(t));
    }
}

TEST_CASE("quant_decode's fp16 conversion is core's on every bit pattern", "[types][quant_decode]") {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        const uint32_t got = std::bit_cast<uint32_t>(moe::qd::fp16_to_float(h));
        const uint32_t want = std::bit_cast<uint32_t>(moe::fp16_to_fp32(static_cast<uint16_t>(h)));
        if (got != want && bad++ < 4) UNSCOPED_INFO("fp16 " << h << ": " << got << " != " << want);
    }
    CHECK(bad == 0);
}

TEST_CASE("quant_decode's groups are core's dequantisation bit for bit on random bytes", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> pct(0, 99);
    const uint16_t extremes[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF,
                                 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE55, 0x3C00, 0xBC00};
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        constexpr int kBlocks = 400;
        const int bb = moe::qd::block_bytes(t);
        const int elems = moe::qd::block_elems(t);
        std::vector<uint8_t> bytes(static_cast<size_t>(kBlocks * bb));
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
        for (int i = 0; i < kBlocks; ++i) {  // about a quarter of the scales at an extreme
            for (int off : fp16_fields(t)) {
                if (pct(rng) >= 25) continue;
                const uint16_t h = extremes[static_cast<size_t>(byte(rng)) % std::size(extremes)];
                std::memcpy(&bytes[static_cast<size_t>(i * bb + off)], &h, 2);
            }
        }
        std::vector<float> want(static_cast<size_t>(kBlocks * elems));
        moe::traits(t).to_float(bytes.data(), want.data(), kBlocks * elems);
        int bad = 0;
        for (int i = 0; i < kBlocks; ++i) {
            for (int g = 0; g < elems / 32; ++g) {
                float v[32];
                decode32(t, bytes.data() + static_cast<size_t>(i) * bb, g, v);
                for (int j = 0; j < 32; ++j) {
                    const float w = want[static_cast<size_t>(i * elems + 32 * g + j)];
                    if (!same_value(v[j], w) && bad++ < 4) {
                        UNSCOPED_INFO("block " << i << " group " << g << " element " << j << ": " << v[j] << " != " << w);
                    }
                }
            }
        }
        CHECK(bad == 0);
    }
}

// The staging of the tensor-core GEMM (quant_decode.h's units), run on the host: rows of a tensor at every
// even alignment mod 16, back to back or with padding, each unit copied as the aligned 16-byte chunks that
// cover it (bytes outside the tensor as zeros, as the kernel's guarded loads give them) and its groups
// decoded, half a group at a time, from byte (address & 15) of the copy: bit for bit the row's dequantisation. Rows of 32-element
// blocks that end inside a unit (K = 800: 3 units and one group) decode their groups only. Random bytes, so
// a byte the chunks miss or an offset off by any amount changes values.
TEST_CASE("quant_decode's units staged in 16-byte chunks decode to core's dequantisation", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        const int ub = moe::qd::unit_bytes(t);
        const int chunks = moe::qd::unit_chunks16(t);
        CHECK(static_cast<size_t>(ub) == moe::row_bytes(t, moe::qd::kUnitElems));
        CHECK(16 * chunks >= 14 + ub);
        const std::vector<int64_t> ks = moe::qd::block_elems(t) == 256 ? std::vector<int64_t>{256, 768, 2304}
                                                                        : std::vector<int64_t>{32, 96, 256, 800};
        for (int64_t k : ks) {
            for (int start = 0; start < 16; start += 2) {
                for (int pad : {0, 2, 6}) {
                    INFO("K " << k << ", first byte at 16 n + " << start << ", rows " << pad << " bytes apart");
                    constexpr int kRows = 3;
                    const auto rb = static_cast<int64_t>(moe::row_bytes(t, k));
                    const int64_t nb1 = rb + pad;
                    const int64_t size = (kRows - 1) * nb1 + rb;
                    std::vector<uint8_t> buf(static_cast<size_t>(size + 64));
                    for (uint8_t& b : buf) b = static_cast<uint8_t>(byte(rng));
                    const auto base = reinterpret_cast<uintptr_t>(buf.data());
                    const uint8_t* lo = buf.data() + ((16 - base % 16) % 16) + start;
                    const uint8_t* hi = lo + size;
                    std::vector<float> want(static_cast<size_t>(k));
                    const int64_t nblk = k / 32;
                    int bad = 0;
                    for (int r = 0; r < kRows; ++r) {
                        moe::traits(t).to_float(lo + r * nb1, want.data(), k);
                        for (int64_t u = 0; u * moe::qd::kUnitElems < k; ++u) {
                            const uint8_t* first = lo + r * nb1 + u * ub;
                            const uint8_t* chunk0 = first - reinterpret_cast<uintptr_t>(first) % 16;
                            alignas(16) uint8_t staged[16 * 16] = {};
                            REQUIRE(chunks <= 16);
                            for (int i = 0; i < 16 * chunks; ++i) {
                                const uint8_t* p = chunk0 + i;
                                staged[i] = p >= lo && p < hi ? *p : 0;
                            }
                            const int off = static_cast<int>(reinterpret_cast<uintptr_t>(first) % 16);
                            for (int q = 0; q < moe::qd::kUnitGroups && u * moe::qd::kUnitGroups + q < nblk; ++q) {
                                for (int h = 0; h < 2; ++h) {
                                    float v[16];
                                    decode_unit_half(t, staged + off, q, h, v);
                                    for (int j = 0; j < 16; ++j) {
                                        const auto e = static_cast<size_t>(u * moe::qd::kUnitElems + 32 * q + 16 * h + j);
                                        if (!same_value(v[j], want[e]) && bad++ < 4) {
                                            UNSCOPED_INFO("row " << r << " unit " << u << " group " << q << " element "
                                                                 << 16 * h + j << ": " << v[j] << " != " << want[e]);
                                        }
                                    }
                                }
                            }
                        }
                    }
                    CHECK(bad == 0);
                }
            }
        }
    }
}
