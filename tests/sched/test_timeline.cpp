// The per-ubatch timeline ring, against a direct reference: the last `capacity` ubatches, oldest first,
// each with the growth of the counters between its begin() and end().
#include <catch2/catch.hpp>

#include <deque>
#include <random>

#include "sched/timeline.h"

using namespace moe::sched;

TEST_CASE("timeline keeps the last ubatches with their counter deltas", "[sched][timeline]") {
    const unsigned seed = std::random_device{}();
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const size_t capacity = GENERATE(1u, 3u, 8u);
    const int n_ubatches = GENERATE(0, 2, 3, 20);
    Timeline tl;
    CHECK_FALSE(tl.on());
    tl.enable(capacity);
    REQUIRE(tl.on());
    Stats s;
    std::deque<UbatchTiming> want;
    std::uniform_int_distribution<uint64_t> bytes(0, 1 << 20);
    std::uniform_real_distribution<double> secs(0.0, 1e-3);
    for (int i = 0; i < n_ubatches; ++i) {
        const Clock::time_point t0 = Clock::now();
        tl.begin(s, t0);
        UbatchTiming w;
        w.n_tokens = i + 1;
        w.ok = i % 5 != 4;
        w.seconds_host_compute = secs(rng);
        w.seconds_device_submit = secs(rng);
        w.seconds_wait = secs(rng);
        const uint64_t full = bytes(rng), experts = bytes(rng);
        w.bytes_weights = full + experts;
        w.bytes_activations = bytes(rng);
        s.seconds_host_compute += w.seconds_host_compute;
        s.seconds_device_submit += w.seconds_device_submit;
        s.seconds_wait += w.seconds_wait;
        s.bytes_weights_full += full;
        s.bytes_weights_experts += experts;
        s.bytes_activations += w.bytes_activations;
        s.n_ops_host += 7;  // counters the timeline does not report change too
        tl.end(s, w.n_tokens, w.ok);
        want.push_back(w);
        if (want.size() > capacity) want.pop_front();
    }
    const std::vector<UbatchTiming> got = tl.records();
    REQUIRE(got.size() == want.size());
    CHECK(tl.dropped() == static_cast<uint64_t>(n_ubatches) - want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].n_tokens == want[i].n_tokens);
        CHECK(got[i].ok == want[i].ok);
        CHECK(got[i].bytes_weights == want[i].bytes_weights);
        CHECK(got[i].bytes_activations == want[i].bytes_activations);
        // Differences of running sums: exact up to the rounding of the sums (<= 1e-3 each, 20 terms).
        CHECK(got[i].seconds_host_compute == Approx(want[i].seconds_host_compute).margin(1e-15));
        CHECK(got[i].seconds_device_submit == Approx(want[i].seconds_device_submit).margin(1e-15));
        CHECK(got[i].seconds_wait == Approx(want[i].seconds_wait).margin(1e-15));
        CHECK(got[i].t_start >= 0.0);
        CHECK(got[i].t_end >= got[i].t_start);
        if (i > 0) CHECK(got[i].t_start >= got[i - 1].t_start);
    }
    tl.enable(0);
    CHECK_FALSE(tl.on());
    CHECK(tl.records().empty());
    CHECK(tl.dropped() == 0);
}
