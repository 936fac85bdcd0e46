// The automatic expert split's timed trials (SplitTrials) against the rule they document: per size class
// (tokens rounded down to a power of two), split, unsplit, split, then the faster per token by its best
// sample; random timings, the expected choice computed directly from them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "sched/split_trial.h"

using moe::sched::SplitTrials;

TEST_CASE("split trials time split, unsplit, split, then keep the faster per token", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<double> seconds(0.05, 0.5);
    for (int round = 0; round < 200; ++round) {
        SplitTrials t;
        const int n = 512 + static_cast<int>(rng() % 512);  // one size class: [512, 1024)
        REQUIRE(t.want_split(n));
        const double on1 = seconds(rng);
        t.record(n, true, on1);
        REQUIRE_FALSE(t.want_split(n));
        const double off1 = seconds(rng);
        t.record(n, false, off1);
        REQUIRE(t.want_split(n));
        const double on2 = seconds(rng);
        t.record(n, true, on2);
        const bool want = std::min(on1, on2) < off1;
        CHECK(t.want_split(n) == want);
        // The same class at another size compares per token; another class starts over.
        CHECK(t.want_split(n == 512 ? 1023 : 512) == want);
        CHECK(t.want_split(256));
        CHECK(t.want_split(1024));
        // More samples of the choice in force only lower its best: the decision stands.
        for (int k = 0; k < 3; ++k) {
            t.record(n, want, seconds(rng));
            CHECK(t.want_split(n) == want);
        }
        t.clear();
        CHECK(t.want_split(n));
    }
}

TEST_CASE("split trials compare seconds per token across sizes of a class", "[sched]") {
    SplitTrials t;
    t.record(1000, true, 1.0);   // 1.0 ms per token
    t.record(600, false, 0.5);   // 0.83 ms per token
    t.record(900, true, 0.85);   // 0.94 ms per token: still slower
    CHECK_FALSE(t.want_split(700));
    t.record(1000, false, -1.0);  // not a time: ignored
    t.record(0, false, 0.1);      // no tokens: ignored
    CHECK_FALSE(t.want_split(700));
    SplitTrials u;
    u.record(1000, true, 1.0);
    u.record(600, false, 0.7);   // 1.17 ms per token
    u.record(800, true, 0.9);    // best split: 1.0 ms per token
    CHECK(u.want_split(513));
}
