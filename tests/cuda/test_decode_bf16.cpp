// The tensor-core paths' weight decode (decode_half_bf16, through dequant_rows_bf16) against the CPU's
// dequantisation (traits(type).to_float) rounded to BF16 (RN-even), bit for bit: every scale of every
// quantised type (all 65,536 FP16 scales for Q8_0 / Q4_0, subnormals, infinities and NaNs included;
// all 256 E8M0 scales for MXFP4) with every quantised value, in blocks shuffled by a fresh seed, and
// random F16 / BF16 rows. NaN results must be NaN on both sides (payloads may differ); Q8_0's and Q4_0's
// zeros may differ in sign (the GPU's byte-permute + FMA decode gives +0 where a negative scale gives the
// CPU -0: the same in every sum of products).
#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "core/types.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.cuh"
#include "cuda_test_util.h"

namespace {

using moe::Type;

uint16_t bf16_rn(float f) {
    if (std::isnan(f)) return 0x7FC0u;  // rounding a NaN's bits could carry into the sign or give inf
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

bool bf16_is_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; }

// Blocks of `type`, one row of `blocks_per_row` blocks each, decoded on the GPU and compared with the
// CPU; returns the number of mismatching values (and reports the first few).
size_t mismatches(moe::test::Device& dev, Type type, const std::vector<uint8_t>& blocks, int64_t blocks_per_row) {
    const auto& tr = moe::traits(type);
    const int64_t k = blocks_per_row * tr.block_size;
    const int64_t rows = static_cast<int64_t>(blocks.size()) / (blocks_per_row * tr.block_bytes);
    REQUIRE(rows * blocks_per_row * tr.block_bytes == static_cast<int64_t>(blocks.size()));
    moe::Tensor* w = dev.leaf(type, {k, rows}, blocks.data());
    void* out = dev.alloc(static_cast<size_t>(rows * k) * 2);
    moe::test::require_ok(dev.be().synchronize());
    moe::test::require_ok(moe::cuda::dequant_rows_bf16(*w, out, nullptr));
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    std::vector<uint16_t> gpu(static_cast<size_t>(rows * k));
    REQUIRE(cudaMemcpy(gpu.data(), out, gpu.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);

    std::vector<float> ref(static_cast<size_t>(k));
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
        tr.to_float(blocks.data() + r * blocks_per_row * tr.block_bytes, ref.data(), k);
        for (int64_t i = 0; i < k; ++i) {
            const uint16_t want = bf16_rn(ref[static_cast<size_t>(i)]);
            const uint16_t got = gpu[static_cast<size_t>(r * k + i)];
            const bool zero_sign_free = type == Type::Q8_0 || type == Type::Q4_0;
            const bool zeros = zero_sign_free && (want & 0x7FFFu) == 0 && (got & 0x7FFFu) == 0;
            const bool same = bf16_is_nan(want) ? bf16_is_nan(got) : got == want || zeros;
            if (!same && ++bad <= 5) {
                UNSCOPED_INFO(moe::type_name(type) << " row " << r << " element " << i << ": cpu " << ref[static_cast<size_t>(i)]
                                                   << " -> bf16 0x" << std::hex << want << ", gpu 0x" << got
                                                   << std::dec);
            }
        }
    }
    return bad;
}

// For each of n_scales scales (written by put_scale), enough blocks to hold every quantised value
// 0 .. n_values-1 at least once (put_value), shuffled over those blocks.
template <typename PutScale, typename PutValue>
std::vector<uint8_t> all_scales_blocks(Type type, int n_scales, int n_values, std::mt19937_64& rng, PutScale put_scale,
                                       PutValue put_value) {
    const size_t bb = static_cast<size_t>(moe::traits(type).block_bytes);
    const int per_block = 32;
    const int groups = (n_values + per_block - 1) / per_block;  // blocks per scale to hold every value
    std::vector<uint8_t> out(static_cast<size_t>(n_scales) * groups * bb);
    std::vector<int> vals(static_cast<size_t>(groups * per_block));
    for (int s = 0; s < n_scales; ++s) {
        for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<int>(i % static_cast<size_t>(n_values));
        std::shuffle(vals.begin(), vals.end(), rng);
        for (int g = 0; g < groups; ++g) {
            uint8_t* blk = out.data() + (static_cast<size_t>(s) * groups + g) * bb;
            put_scale(blk, s);
            for (int j = 0; j < per_block; ++j) put_value(blk, j, vals[static_cast<size_t>(g * per_block + j)]);
        }
    }
    return out;
}

}  // namespace

TEST_CASE("cuda BF16 weight decode equals the CPU's dequantisation rounded to BF16, every scale", "[gpu][cuda][matmul]") {
    MOE_GPU_OR_SKIP();
    moe::test::Device dev;
    std::mt19937_64 rng = moe::test::fresh_rng(0xdec0de);
    INFO("seed " << moe::test::run_seed());
    auto fp16_scale = [](uint8_t* b, int s) {
        b[0] = static_cast<uint8_t>(s & 0xFF);
        b[1] = static_cast<uint8_t>(s >> 8);
    };

    SECTION("Q8_0: 65,536 scales x 256 values") {
        const auto blocks = all_scales_blocks(Type::Q8_0, 65536, 256, rng, fp16_scale,
                                              [](uint8_t* b, int j, int v) { b[2 + j] = static_cast<uint8_t>(v); });
        CHECK(mismatches(dev, Type::Q8_0, blocks, 16) == 0);
    }
    SECTION("Q4_0: 65,536 scales x 16 values") {
        const auto blocks = all_scales_blocks(Type::Q4_0, 65536, 16, rng, fp16_scale, [](uint8_t* b, int j, int v) {
            // element j < 16: low nibble of byte j; element 16 + j: its high nibble
            uint8_t& byte = b[2 + (j & 15)];
            byte = j < 16 ? static_cast<uint8_t>((byte & 0xF0) | v) : static_cast<uint8_t>((byte & 0x0F) | (v << 4));
        });
        CHECK(mismatches(dev, Type::Q4_0, blocks, 8) == 0);
    }
    SECTION("MXFP4: 256 scales x 16 values") {
        const auto blocks = all_scales_blocks(
            Type::MXFP4, 256, 16, rng, [](uint8_t* b, int s) { b[0] = static_cast<uint8_t>(s); },
            [](uint8_t* b, int j, int v) {
                uint8_t& byte = b[1 + (j & 15)];
                byte = j < 16 ? static_cast<uint8_t>((byte & 0xF0) | v) : static_cast<uint8_t>((byte & 0x0F) | (v << 4));
            });
        CHECK(mismatches(dev, Type::MXFP4, blocks, 4) == 0);  // 1 block per scale: rows of 4 scales
    }
    SECTION("rows of whole 32-block chunks and a partial one, unaligned rows, random bits") {
        for (Type type : {Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::F16}) {
            for (const int64_t per_row : {32, 64, 71}) {  // 32-value blocks
                const auto& tr = moe::traits(type);
                const int64_t blocks = per_row * 32 / tr.block_size;  // F16: one value per "block"
                std::vector<uint8_t> bytes(static_cast<size_t>(blocks * 37 * tr.block_bytes));
                for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
                INFO(moe::type_name(type) << ", " << per_row << " blocks of 32 per row");
                CHECK(mismatches(dev, type, bytes, blocks) == 0);
            }
        }
    }
    SECTION("F16 and BF16: random bits, every exponent") {
        for (Type type : {Type::F16, Type::BF16}) {
            std::vector<uint8_t> bytes(size_t{1} << 20);
            for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
            CHECK(mismatches(dev, type, bytes, 64) == 0);
        }
    }
}

#endif  // MOEINFER_HAS_CUDA
