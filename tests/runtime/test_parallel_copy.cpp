// ParallelCopier against std::memcpy's result on fresh random bytes: sizes around the chunk size and
// odd lengths, every thread count, one copier reused for every size (as context creation does),
// misaligned pointers; bytes around the destination stay untouched.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/parallel_copy.h"

TEST_CASE("ParallelCopier copies every byte and nothing else", "[runtime]") {
    std::mt19937_64 rng(std::random_device{}());
    constexpr size_t kChunk = size_t{8} << 20;
    for (int threads : {0, 1, 2, 3}) {
        moe::ParallelCopier copier(threads);
        for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 12345}) {
            INFO("n " << n << " threads " << threads);
            std::vector<uint8_t> src(n + 3), dst(n + 16, uint8_t{0xA5});
            for (auto& b : src) b = static_cast<uint8_t>(rng());
            copier.copy(dst.data() + 5, src.data() + 3, n);
            REQUIRE(std::equal(src.begin() + 3, src.begin() + 3 + static_cast<std::ptrdiff_t>(n), dst.begin() + 5));
            for (size_t i = 0; i < 5; ++i) REQUIRE(dst[i] == 0xA5);
            for (size_t i = n + 5; i < dst.size(); ++i) REQUIRE(dst[i] == 0xA5);
        }
    }
}
