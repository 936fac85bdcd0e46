// The automatic expert split's timed trials (SplitTrials) against the rule they document: per ubatch
// size, unsplit, split, split, unsplit, then the faster mean; a size without a decided trial of its own
// takes the verdict of the closest decided size of its power-of-two range. Random timings, the
// expected choice computed directly from them.
#include <catch2/catch.hpp>

#include <random>

#include "sched/split_trial.h"

using moe::sched::SplitTrials;

namespace {

// Runs a trial of n to its decision with random times; returns whether the split should win.
bool run_trial(SplitTrials& t, int n, std::mt19937& rng) {
    std::uniform_real_distribution<double> seconds(0.05, 0.5);
    double sum[2] = {0.0, 0.0};
    for (bool want_split : {false, true, true, false}) {
        const SplitTrials::Choice c = t.choose(n);
        REQUIRE(c.timed);
        REQUIRE(c.split == want_split);
        CHECK_FALSE(t.settled());
        CHECK_FALSE(t.verdict(n).has_value());
        const double s = seconds(rng);
        sum[c.split ? 1 : 0] += s;
        t.record(n, c.split, s);
    }
    return sum[1] < sum[0];
}

}  // namespace

TEST_CASE("split trials time unsplit, split, split, unsplit, then keep the faster mean", "[sched]") {
    const unsigned seed = std::random_device{}();
    CAPTURE(seed);
    std::mt19937 rng(seed);
    for (int round = 0; round < 200; ++round) {
        SplitTrials t;
        CHECK(t.settled());
        const int n = 513 + static_cast<int>(rng() % 511);  // in [513, 1023]: range [512, 1024)
        const bool want = run_trial(t, n, rng);
        CHECK(t.settled());
        CHECK(t.verdict(n) == want);
        SplitTrials::Choice c = t.choose(n);
        CHECK(c.split == want);
        CHECK_FALSE(c.timed);
        // Another size of the range borrows the verdict without a trial; another range starts its own.
        c = t.choose(n == 1023 ? 512 : n + 1);
        CHECK(c.split == want);
        CHECK_FALSE(c.timed);
        CHECK(t.settled());
        CHECK_FALSE(t.verdict(256).has_value());
        c = t.choose(256);
        CHECK(c.timed);
        CHECK_FALSE(c.split);
        CHECK_FALSE(t.settled());
        // Records after the decision, or for sizes without a trial, change nothing.
        t.record(n, !want, 1e-9);
        t.record(n + 1, !want, 1e-9);
        CHECK(t.choose(n).split == want);
        t.clear();
        CHECK(t.choose(n).timed);
    }
}

TEST_CASE("split trials repeat a side whose sample was not recorded and ignore non-times", "[sched]") {
    SplitTrials t;
    const int n = 600;
    REQUIRE_FALSE(t.choose(n).split);  // not recorded (a ubatch that allocated): asked again
    REQUIRE_FALSE(t.choose(n).split);
    t.record(n, false, 0.30);
    REQUIRE(t.choose(n).split);
    t.record(n, true, -1.0);  // not a time: ignored
    REQUIRE(t.choose(n).split);
    t.record(n, true, 0.20);
    REQUIRE(t.choose(n).split);
    t.record(n, true, 0.30);
    REQUIRE_FALSE(t.choose(n).split);
    t.record(n, false, 0.19);
    CHECK(t.verdict(n) == false);  // unsplit mean 0.245 < split mean 0.25
    CHECK_FALSE(t.choose(n).split);
}

TEST_CASE("split trials: the first verdict of a range serves its other sizes, dropping their trials", "[sched]") {
    SplitTrials u;
    u.record(520, false, 0.1);  // no trial yet: ignored
    REQUIRE(u.choose(520).timed);
    REQUIRE(u.choose(1000).timed);  // another size's trial, left running
    REQUIRE(u.choose(2000).timed);  // range [1024, 2048): its own
    for (int k = 0; k < 4; ++k) {
        const bool split = u.choose(520).split;
        u.record(520, split, split ? 0.1 : 0.3);  // the split wins
    }
    CHECK(u.verdict(520) == true);
    CHECK(u.verdict(1000) == true);  // borrowed
    CHECK_FALSE(u.verdict(2000).has_value());
    CHECK_FALSE(u.settled());                 // 1000's and 2000's trials are still running ...
    const SplitTrials::Choice c = u.choose(1000);  // ... until 1000 is chosen again
    CHECK(c.split);
    CHECK_FALSE(c.timed);
    CHECK_FALSE(u.settled());  // 2000's
    CHECK(u.choose(2000).timed);
}
