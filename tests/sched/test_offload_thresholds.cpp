// The measured offload thresholds (sched/offload_thresholds.h) against the time model they come from,
// evaluated directly: for random link, host and device rates, the threshold is the smallest batch at
// which uploading a weight and computing on the device takes no longer than computing on the host,
// found by stepping through batch sizes; and the sources in order of precedence.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "sched/offload_thresholds.h"

using moe::sched::calibrated_min_batch;
using moe::sched::kMaxCalibratedMinBatch;
using moe::sched::OffloadCalibration;
using moe::sched::OffloadOp;
using moe::sched::offload_threshold;
using moe::sched::ThresholdSource;

namespace {

// Seconds for a ubatch of n tokens to apply one layer's weights of W bytes of op kind `op` on each
// side, per the documented model: an expert's weights see n * k / E tokens; the device uploads all of
// them first. D = 0: the device's compute left out.
struct Sides {
    double host, device;
};
Sides seconds(double n, double W, double L, double H, double D, bool expert, int E, int k) {
    const double tokens = expert ? n * k / E : n;  // per weight matrix (each of the E experts' when expert)
    const double matrices = expert ? E : 1;
    const double w = W / matrices;
    const double host = matrices * tokens * w / (H * 1e9);
    const double device = matrices * (w / (L * 1e9) + (D > 0 ? tokens * w / (D * 1e9) : 0.0));
    return {host, device};
}

// The smallest n >= 1 at which the device is no slower, stepping up (with doubling then bisection, so
// that large thresholds stay cheap); kMaxCalibratedMinBatch when it never is below that.
int64_t first_batch_device_wins(double L, double H, double D, bool expert, int E, int k, bool* near_tie) {
    const double W = 1e8;
    auto wins = [&](int64_t n) {
        const Sides s = seconds(static_cast<double>(n), W, L, H, D, expert, E, k);
        const double rel = std::abs(s.host - s.device) / std::max(s.host, s.device);
        if (rel < 1e-9) *near_tie = true;
        return s.host >= s.device;
    };
    if (wins(1)) return 1;
    int64_t lo = 1, hi = 2;  // wins(lo) false
    while (!wins(hi)) {
        lo = hi;
        hi *= 2;
        if (hi > kMaxCalibratedMinBatch) return kMaxCalibratedMinBatch;
    }
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (wins(mid) ? hi : lo) = mid;
    }
    return hi;
}

}  // namespace

TEST_CASE("measured offload thresholds equal the time model's break-even batch", "[sched]") {
    std::mt19937_64 rng(Catch::rngSeed() * 7919 + 3);
    std::uniform_real_distribution<double> log_link(std::log(1.0), std::log(64.0));         // GB/s
    std::uniform_real_distribution<double> log_host(std::log(10.0), std::log(20000.0));     // GB/s x tokens
    std::uniform_int_distribution<int> expert_count(2, 384);
    int compared = 0, unbounded = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        const double L = std::exp(log_link(rng)), H = std::exp(log_host(rng));
        // The device: not measured, slower than the host, or 1.01x to 1000x faster.
        std::uniform_int_distribution<int> kind(0, 3);
        const int d_kind = kind(rng);
        double D = 0.0;
        if (d_kind == 1) D = H * std::uniform_real_distribution<double>(0.1, 1.0)(rng);
        if (d_kind >= 2) D = H * std::exp(std::uniform_real_distribution<double>(std::log(1.01), std::log(1000.0))(rng));
        const int E = expert_count(rng);
        const int k = std::uniform_int_distribution<int>(1, std::min(E, 16))(rng);
        OffloadCalibration c;
        c.link_gbps = L;
        for (int op = 0; op < moe::sched::kOffloadOps; ++op) {
            c.host_gbps[op] = H;
            c.device_gbps[op] = D;
        }
        for (OffloadOp op : {OffloadOp::MUL_MAT, OffloadOp::MUL_MAT_ID, OffloadOp::MOE_UP_GATE}) {
            const bool expert = op != OffloadOp::MUL_MAT;
            bool near_tie = false;
            const int64_t want = first_batch_device_wins(L, H, D, expert, E, k, &near_tie);
            if (near_tie) continue;  // rounding decides a tie either way
            const std::optional<int32_t> got = calibrated_min_batch(c, op, E, k);
            INFO("L " << L << " H " << H << " D " << D << " E " << E << " k " << k << " op " << static_cast<int>(op));
            REQUIRE(got.has_value());
            CHECK(*got == want);
            ++compared;
            unbounded += want == kMaxCalibratedMinBatch;
        }
    }
    CHECK(compared > 5000);
    CHECK(unbounded > 0);                // the slower devices
    CHECK(unbounded < compared / 2);
}

TEST_CASE("measured offload thresholds: the fixed ones are the model at host / link = 32", "[sched]") {
    OffloadCalibration c;
    c.link_gbps = 25.0;
    for (double& h : c.host_gbps) h = 32.0 * 25.0;
    CHECK(calibrated_min_batch(c, OffloadOp::MUL_MAT, 128, 8) == 32);
    CHECK(calibrated_min_batch(c, OffloadOp::MUL_MAT_ID, 128, 8) == 32 * 128 / 8);
    CHECK(calibrated_min_batch(c, OffloadOp::MOE_UP_GATE, 32, 4) == moe::sched::default_min_batch(OffloadOp::MOE_UP_GATE, 32, 4));
    // Without expert counts the expert ops scale as dense ones (as default_min_batch does).
    CHECK(calibrated_min_batch(c, OffloadOp::MUL_MAT_ID, 0, 0) == 32);
}

TEST_CASE("measured offload thresholds need a positive finite link and host rate", "[sched]") {
    for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        OffloadCalibration c;
        c.link_gbps = bad;
        for (double& h : c.host_gbps) h = 100.0;
        CHECK_FALSE(calibrated_min_batch(c, OffloadOp::MUL_MAT, 8, 2).has_value());
        c.link_gbps = 10.0;
        c.host_gbps[1] = bad;
        CHECK(calibrated_min_batch(c, OffloadOp::MUL_MAT, 8, 2).has_value());
        CHECK_FALSE(calibrated_min_batch(c, OffloadOp::MUL_MAT_ID, 8, 2).has_value());
    }
}

TEST_CASE("offload thresholds: an explicit min_batch wins, then the measured one, then the default", "[sched]") {
    moe::sched::Policy p;
    const int E = 64, k = 6;
    for (OffloadOp op : {OffloadOp::MUL_MAT, OffloadOp::MUL_MAT_ID, OffloadOp::MOE_UP_GATE}) {
        moe::sched::OffloadThreshold t = offload_threshold(p, std::nullopt, op, E, k);
        CHECK(t.source == ThresholdSource::DEFAULT);
        CHECK(t.min_batch == moe::sched::default_min_batch(op, E, k));
        t = offload_threshold(p, 77, op, E, k);
        CHECK(t.source == ThresholdSource::MEASURED);
        CHECK(t.min_batch == 77);
        p.offload[static_cast<int>(op)].min_batch = 5;
        t = offload_threshold(p, 77, op, E, k);
        CHECK(t.source == ThresholdSource::OVERRIDE);
        CHECK(t.min_batch == 5);
        p.offload[static_cast<int>(op)].min_batch = 0;  // 0 is a threshold too: always offload
        CHECK(offload_threshold(p, std::nullopt, op, E, k).source == ThresholdSource::OVERRIDE);
        CHECK(offload_threshold(p, std::nullopt, op, E, k).min_batch == 0);
    }
    CHECK(std::string(moe::sched::threshold_source_name(0)) == "default");
    CHECK(std::string(moe::sched::threshold_source_name(1)) == "measured");
    CHECK(std::string(moe::sched::threshold_source_name(2)) == "override");
    CHECK(moe::sched::threshold_source_name(3) == nullptr);
}
