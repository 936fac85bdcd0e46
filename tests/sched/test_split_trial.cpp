// The automatic expert split's timed trials (SplitTrials) against the rule they document: per ubatch
// size, unsplit, split, unsplit, split, then the faster by its best sample; a size without a trial of
// its own borrows the verdict of the closest decided size of its power-of-two class. Random timings,
// the expected choice computed directly from them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "sched/split_trial.h"

using moe::sched::SplitTrials;

namespace {

// Runs a trial of n to its decision with random times; returns whether the split should win.
bool run_trial(SplitTrials& t, int n, std::mt19937& rng) {
    std::uniform_real_distribution<double> seconds(0.05, 0.5);
    double best[2] = {1e30, 1e30};
    for (bool want_split : {false, true, false, true}) {
        const SplitTrials::Choice c = t.choose(n);
        REQUIRE(c.timed);
        REQUIRE(c.split == want_split);
        CHECK_FALSE(t.settled());
        const double s = seconds(rng);
        best[c.split ? 1 : 0] = std::min(best[c.split ? 1 : 0], s);
        t.record(n, c.split, s);
    }
    return best[1] < best[0];
}

}  // namespace

TEST_CASE("split trials time unsplit, split, unsplit, split, then keep the faster", "[sched]") {
    const unsigned seed = std::random_device{}();
    CAPTURE(seed);
    std::mt19937 rng(seed);
    for (int round = 0; round < 200; ++round) {
        SplitTrials t;
        CHECK(t.settled());
        const int n = 513 + static_cast<int>(rng() % 511);  // in [513, 1023]: class [512, 1024)
        const bool want = run_trial(t, n, rng);
        CHECK(t.settled());
        SplitTrials::Choice c = t.choose(n);
        CHECK(c.split == want);
        CHECK_FALSE(c.timed);
        // Another size of the class borrows the verdict without a trial; another class starts its own.
        c = t.choose(n == 1023 ? 512 : n + 1);
        CHECK(c.split == want);
        CHECK_FALSE(c.timed);
        CHECK(t.settled());
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

TEST_CASE("split trials compare times of one size only and ignore non-times", "[sched]") {
    SplitTrials t;
    const int n = 600;
    REQUIRE_FALSE(t.choose(n).split);
    t.record(n, false, 0.30);
    REQUIRE(t.choose(n).split);
    t.record(n, true, 0.25);
    t.record(n, false, -1.0);  // not a time: ignored (still the unsplit side's turn)
    REQUIRE_FALSE(t.choose(n).split);
    t.record(n, false, 0.20);
    REQUIRE(t.choose(n).split);
    t.record(n, true, 0.22);
    CHECK_FALSE(t.choose(n).split);  // best unsplit 0.20 < best split 0.22
    // A closer decided size's verdict wins over a farther one's (both trials started before either
    // decided: once one has, a new size of the class borrows instead of starting its own).
    SplitTrials u;
    u.record(520, false, 0.1);  // no trial yet: ignored
    REQUIRE(u.choose(520).timed);
    REQUIRE(u.choose(1000).timed);
    for (int k = 0; k < 2; ++k) {
        for (auto [size, split_faster] : {std::pair{520, true}, std::pair{1000, false}}) {
            REQUIRE_FALSE(u.choose(size).split);
            u.record(size, false, split_faster ? 0.3 : 0.1);
            REQUIRE(u.choose(size).split);
            u.record(size, true, 0.2);
        }
    }
    CHECK(u.choose(600).split);
    CHECK_FALSE(u.choose(900).split);
    CHECK_FALSE(u.choose(600).timed);
    CHECK(u.settled());
}
