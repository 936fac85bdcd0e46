// The host-read bandwidth kernel (moe::cpu::host_read_sum) against a serial sum written here, on
// random words of odd and aligned lengths and several thread counts: exact (wrapping uint64 sums).
// A changed byte anywhere must change the sum by exactly its weight, so the kernel reads every byte.
#include <catch2/catch.hpp>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/host_read.h"
#include "op_test_util.h"

namespace {

uint64_t serial_sum(const std::vector<uint64_t>& v) {
    uint64_t s = 0;
    for (uint64_t x : v) s += x;
    return s;
}

}  // namespace

TEST_CASE("host_read_sum equals a serial sum of every word", "[cpu][bandwidth]") {
    auto rng = moe::test::make_rng(11);
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4096}, size_t{4096 * 7 + 5}, size_t{(1u << 20) + 13}}) {
        std::vector<uint64_t> words(n);
        for (uint64_t& w : words) w = rng();
        for (int threads : {1, 2}) {
            INFO("n = " << n << ", threads = " << threads);
            tbb::task_arena arena(threads);
            REQUIRE(moe::cpu::host_read_sum(words.data(), n, arena) == serial_sum(words));
        }
    }
}

TEST_CASE("host_read_sum sees a change of any byte", "[cpu][bandwidth]") {
    auto rng = moe::test::make_rng(12);
    const size_t n = 4096 * 5 + 3;
    std::vector<uint64_t> words(n);
    for (uint64_t& w : words) w = rng();
    tbb::task_arena arena(2);
    const uint64_t base = moe::cpu::host_read_sum(words.data(), n, arena);
    for (int trial = 0; trial < 64; ++trial) {
        const size_t byte = rng() % (n * sizeof(uint64_t));
        const size_t word = byte / sizeof(uint64_t);
        const uint64_t before = words[word];
        unsigned char* p = reinterpret_cast<unsigned char*>(words.data()) + byte;
        *p = static_cast<unsigned char>(*p + 1 + rng() % 255);  // any other value
        INFO("byte " << byte);
        CHECK(moe::cpu::host_read_sum(words.data(), n, arena) == base - before + words[word]);
        words[word] = before;
    }
}

TEST_CASE("measure_host_read gives a finite positive bandwidth", "[cpu][bandwidth]") {
    moe::BandwidthOptions o;
    o.bytes = size_t{16} << 20;
    o.n_threads = 2;
    o.repetitions = 3;
    const auto r = moe::cpu::measure_host_read(o);
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    CHECK(std::isfinite(r->gbps));
    CHECK(r->gbps > 0.0);
    CHECK(r->gbps < 1e5);  // 100 TB/s: no host reads this fast; a larger figure is a timing bug
    const int cores = static_cast<int>(
        tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    CHECK(r->n_threads == std::min(2, cores));

    o.n_threads = cores + 5;  // more than oneTBB will run: reported as the threads that did read
    const auto capped = moe::cpu::measure_host_read(o);
    REQUIRE(capped.is_ok());
    CHECK(capped->n_threads == cores);
}
