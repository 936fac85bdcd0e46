// NaN through the router and softmax kernels: a NaN score must reach the output (the expert's weight,
// the softmax row), never be skipped or turned into zeros, so that a corrupt weight upstream shows as
// NaN logits. Finite inputs keep the results the float64 references of test_ops.cpp check; the
// orderings here are checked against a stable sort of the same scores with NaN ranked first.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/cpu_ops.h"
#include "op_test_util.h"

namespace {

using moe::Op;
using moe::Tensor;
using moe::Type;
using moe::test::elem;
using moe::test::fill_uniform;
using moe::test::make_rng;
using moe::test::TensorPool;
using moe::test::value;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Sort key of the reference orderings: NaN above every number, tied with +inf.
double nan_first(double v) { return std::isnan(v) ? std::numeric_limits<double>::infinity() : v; }

}  // namespace

TEST_CASE("SOFTMAX: a row holding NaN is NaN, a fully masked row stays zeros", "[ops][nan]") {
    auto rng = make_rng(41);
    for (const int64_t n : {1, 7, 32, 128}) {
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {n, 5});
        fill_uniform(*x, rng, -30.0f, 30.0f);
        std::uniform_int_distribution<int64_t> at(0, n - 1);
        *elem<float>(*x, at(rng), 0) = kNaN;                                  // one NaN among numbers
        for (int64_t i = 0; i < n; ++i) *elem<float>(*x, i, 1) = kNaN;      // all NaN
        for (int64_t i = 0; i < n; ++i) *elem<float>(*x, i, 2) = -kInf;     // NaN among -inf (masked)
        *elem<float>(*x, at(rng), 2) = kNaN;
        for (int64_t i = 0; i < n; ++i) *elem<float>(*x, i, 3) = -kInf;     // fully masked
        Tensor* d = pool.node(Op::SOFTMAX, Type::F32, {n, 5}, {x});
        REQUIRE(moe::cpu::softmax(*d).is_ok());
        for (int64_t r = 0; r < 3; ++r) {
            INFO("row " << r << " n " << n);
            for (int64_t i = 0; i < n; ++i) CHECK(std::isnan(value(*d, i, r)));
        }
        for (int64_t i = 0; i < n; ++i) CHECK(value(*d, i, 3) == 0.0);
        // Row 4 is finite: the float64 softmax within 1e-5 relative.
        double mx = -1e300, sum = 0.0;
        for (int64_t i = 0; i < n; ++i) mx = std::max(mx, value(*x, i, 4));
        for (int64_t i = 0; i < n; ++i) sum += std::exp(value(*x, i, 4) - mx);
        for (int64_t i = 0; i < n; ++i) {
            const double want = std::exp(value(*x, i, 4) - mx) / sum;
            CHECK(std::fabs(value(*d, i, 4) - want) <= 1e-5 * want + 1e-12);
        }
    }
}

TEST_CASE("TOPK ranks a NaN score above every number (ties with +inf to the lower index)", "[ops][nan]") {
    auto rng = make_rng(42);
    for (const int64_t n : {8, 32, 128}) {
        for (const int32_t k : {1, 4, 8}) {
            TensorPool pool;
            const int64_t T = 23;
            Tensor* x = pool.make(Type::F32, {n, T});
            fill_uniform(*x, rng, -4.0f, 4.0f);
            std::uniform_int_distribution<int64_t> at(0, n - 1);
            for (int64_t t = 0; t < T; ++t) {
                *elem<float>(*x, at(rng), t) = kNaN;
                if (t % 3 == 1) *elem<float>(*x, at(rng), t) = kNaN;   // two NaN (or the same one twice)
                if (t % 4 == 2) *elem<float>(*x, at(rng), t) = kInf;   // a tie with +inf
                if (t % 5 == 3) *elem<float>(*x, at(rng), t) = -kInf;
            }
            Tensor* d = pool.node(Op::TOPK, Type::I32, {k, T}, {x});
            d->params.i[0] = k;
            REQUIRE(moe::cpu::topk(*d).is_ok());
            for (int64_t t = 0; t < T; ++t) {
                std::vector<int32_t> idx(static_cast<size_t>(n));
                std::iota(idx.begin(), idx.end(), 0);
                std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
                    return nan_first(value(*x, a, t)) > nan_first(value(*x, b, t));
                });
                INFO("n " << n << " k " << k << " token " << t);
                for (int32_t j = 0; j < k; ++j) CHECK(*elem<int32_t>(*d, j, t) == idx[static_cast<size_t>(j)]);
            }
        }
    }
}

TEST_CASE("GROUP_MASK keeps the group of a NaN score, so the NaN is not masked away", "[ops][nan]") {
    auto rng = make_rng(43);
    const int64_t E = 64, T = 17, n_group = 8;
    for (const int32_t top_n : {1, 2}) {
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {E, T});
        fill_uniform(*x, rng, 0.0f, 1.0f);
        std::uniform_int_distribution<int64_t> at(0, E - 1);
        std::vector<int64_t> nan_at(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
            nan_at[static_cast<size_t>(t)] = at(rng);
            *elem<float>(*x, nan_at[static_cast<size_t>(t)], t) = kNaN;
        }
        Tensor* d = pool.node(Op::GROUP_MASK, Type::F32, {E, T}, {x});
        d->params.i[0] = static_cast<int32_t>(n_group);
        d->params.i[1] = 2;
        d->params.i[2] = top_n;
        REQUIRE(moe::cpu::group_mask(*d).is_ok());
        const int64_t per = E / n_group;
        for (int64_t t = 0; t < T; ++t) {
            INFO("top_n " << top_n << " token " << t << " NaN at " << nan_at[static_cast<size_t>(t)]);
            CHECK(std::isnan(value(*d, nan_at[static_cast<size_t>(t)], t)));
            // The other kept group: the best of the rest by the sum of its top_n scores (float64).
            const int64_t g_nan = nan_at[static_cast<size_t>(t)] / per;
            std::vector<double> score(static_cast<size_t>(n_group));
            for (int64_t g = 0; g < n_group; ++g) {
                std::vector<double> v;
                for (int64_t e = g * per; e < (g + 1) * per; ++e) v.push_back(value(*x, e, t));
                std::sort(v.begin(), v.end(), std::greater<double>());
                score[static_cast<size_t>(g)] = std::accumulate(v.begin(), v.begin() + top_n, 0.0);
            }
            int64_t best = -1;
            for (int64_t g = 0; g < n_group; ++g) {
                if (g != g_nan && (best < 0 || score[static_cast<size_t>(g)] > score[static_cast<size_t>(best)])) best = g;
            }
            for (int64_t e = 0; e < E; ++e) {
                const int64_t g = e / per;
                if (g == g_nan || g == best) {
                    CHECK((e == nan_at[static_cast<size_t>(t)] || value(*d, e, t) == value(*x, e, t)));
                } else {
                    CHECK(value(*d, e, t) == -std::numeric_limits<double>::infinity());
                }
            }
        }
    }
}
