// CPU kernels other than matmul and attention, each against a float64 reference written here with
// plain loops, on seeded random data (replay with --rng-seed). Tolerances: element-wise F32 ops 1e-5
// relative (plus a tiny absolute floor near zero); integer results (TOPK, GATHER, GET_ROWS) exact.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"
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

bool close(double got, double want, double rel, double abs_floor) {
    return std::fabs(got - want) <= rel * std::fabs(want) + abs_floor;
}

// Compares every element of F32 `got` with want(i0, i1, i2, i3).
template <typename Ref>
void check_all(const Tensor& got, Ref&& want, double rel, double abs_floor) {
    int64_t bad = 0;
    for (int64_t i3 = 0; i3 < got.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < got.ne[2]; ++i2)
            for (int64_t i1 = 0; i1 < got.ne[1]; ++i1)
                for (int64_t i0 = 0; i0 < got.ne[0]; ++i0) {
                    const double g = *elem<float>(got, i0, i1, i2, i3);
                    const double w = want(i0, i1, i2, i3);
                    if (!close(g, w, rel, abs_floor) && bad++ < 5) {
                        INFO("at [" << i0 << ", " << i1 << ", " << i2 << ", " << i3 << "]: got " << g << ", want "
                                    << w);
                        CHECK(false);
                    }
                }
    CHECK(bad == 0);
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("half_to_float matches fp16_to_fp32 on every half", "[ops]") {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float a = moe::cpu::ops::half_to_float(static_cast<uint16_t>(h));
        const float b = moe::fp16_to_fp32(static_cast<uint16_t>(h));
        uint32_t ba, bb;
        std::memcpy(&ba, &a, 4);
        std::memcpy(&bb, &b, 4);
        if (ba != bb) {
            INFO("half 0x" << std::hex << h << ": 0x" << ba << " vs 0x" << bb);
            REQUIRE(ba == bb);
        }
    }
}

TEST_CASE("exp_approx and sigmoid are within a few ulp", "[ops]") {
    // 2 ulp of e^x relative, over the whole finite range, on a dense sweep.
    double worst = 0.0;
    for (double x = -87.3; x <= 88.3; x += 0.000731) {
        const auto xf = static_cast<float>(x);
        const double want = std::exp(static_cast<double>(xf));
        worst = std::max(worst, std::fabs(moe::cpu::ops::exp_approx(xf) - want) / want);
    }
    CHECK(worst < 2.5e-7);
    CHECK(moe::cpu::ops::exp_approx(0.0f) == 1.0f);
    CHECK(moe::cpu::ops::exp_approx(-100.0f) == 0.0f);
    CHECK(moe::cpu::ops::exp_approx(-std::numeric_limits<float>::infinity()) == 0.0f);
    CHECK(std::isinf(moe::cpu::ops::exp_approx(100.0f)));
    CHECK(std::isnan(moe::cpu::ops::exp_approx(std::numeric_limits<float>::quiet_NaN())));
    for (double x = -120.0; x <= 120.0; x += 0.0137) {
        const auto xf = static_cast<float>(x);
        const double want = sigmoid_ref(xf);
        REQUIRE(close(moe::cpu::ops::sigmoid(xf), want, 5e-7, 1e-37));
    }
}

TEST_CASE("MUL and ADD broadcast src1 over src0", "[ops]") {
    auto rng = make_rng(1);
    struct Case {
        int64_t a[4], b[4];
    };
    const Case cases[] = {
        {{7, 6, 4, 2}, {7, 6, 4, 2}},       {{7, 6, 4, 2}, {7, 1, 1, 1}}, {{7, 6, 4, 2}, {1, 6, 1, 1}},
        {{7, 6, 4, 2}, {7, 3, 2, 1}},       {{7, 6, 4, 2}, {1, 1, 1, 1}}, {{12, 5, 1, 1}, {4, 5, 1, 1}},
        {{2880, 3, 1, 1}, {2880, 1, 1, 1}},
    };
    for (const Op op : {Op::MUL, Op::ADD}) {
        for (const Case& c : cases) {
            for (const bool strided : {false, true}) {
                TensorPool pool;
                Tensor* a;
                if (strided) {  // src0 rows padded by 5 floats: a view, as a slice of a wider tensor
                    Tensor* big = pool.make(Type::F32, {c.a[0] + 5, c.a[1], c.a[2], c.a[3]});
                    fill_uniform(*big, rng, -3.0f, 3.0f);
                    a = pool.view(big, {c.a[0], c.a[1], c.a[2], c.a[3]}, {big->nb[1], big->nb[2], big->nb[3]}, 8);
                } else {
                    a = pool.make(Type::F32, {c.a[0], c.a[1], c.a[2], c.a[3]});
                    fill_uniform(*a, rng, -3.0f, 3.0f);
                }
                Tensor* b = pool.make(Type::F32, {c.b[0], c.b[1], c.b[2], c.b[3]});
                fill_uniform(*b, rng, -3.0f, 3.0f);
                Tensor* d = pool.node(op, Type::F32, {c.a[0], c.a[1], c.a[2], c.a[3]}, {a, b});
                REQUIRE(moe::cpu::binary(*d).is_ok());
                check_all(
                    *d,
                    [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
                        const double x = value(*a, i0, i1, i2, i3);
                        const double y = value(*b, i0 % c.b[0], i1 % c.b[1], i2 % c.b[2], i3 % c.b[3]);
                        return op == Op::MUL ? x * y : x + y;
                    },
                    1e-6, 1e-6);
            }
        }
    }
}

TEST_CASE("MUL rejects shapes that do not broadcast", "[ops]") {
    TensorPool pool;
    Tensor* a = pool.make(Type::F32, {8, 6});
    Tensor* b = pool.make(Type::F32, {8, 4});
    Tensor* d = pool.node(Op::MUL, Type::F32, {8, 6}, {a, b});
    const moe::Status s = moe::cpu::binary(*d);
    CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(s.message().find("src1") != std::string::npos);
    Tensor* c = pool.make(Type::F16, {8, 6});
    Tensor* d2 = pool.node(Op::ADD, Type::F32, {8, 6}, {a, c});
    CHECK(moe::cpu::binary(*d2).code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("SILU, SWIGLU and SWIGLU_OAI match float64", "[ops]") {
    auto rng = make_rng(2);
    for (const int64_t n : {1, 17, 768, 2880}) {
        TensorPool pool;
        Tensor* g = pool.make(Type::F32, {n, 3, 2});
        Tensor* u = pool.make(Type::F32, {n, 3, 2});
        fill_uniform(*g, rng, -12.0f, 12.0f);  // beyond the OAI limit of 7 on both sides
        fill_uniform(*u, rng, -12.0f, 12.0f);

        Tensor* s = pool.node(Op::SILU, Type::F32, {n, 3, 2}, {g});
        REQUIRE(moe::cpu::unary(*s).is_ok());
        check_all(
            *s,
            [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
                const double x = value(*g, i0, i1, i2);
                return x * sigmoid_ref(x);
            },
            1e-5, 1e-9);

        Tensor* sw = pool.node(Op::SWIGLU, Type::F32, {n, 3, 2}, {g, u});
        REQUIRE(moe::cpu::glu(*sw).is_ok());
        check_all(
            *sw,
            [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
                const double x = value(*g, i0, i1, i2);
                return x * sigmoid_ref(x) * value(*u, i0, i1, i2);
            },
            1e-5, 1e-8);

        Tensor* oai = pool.node(Op::SWIGLU_OAI, Type::F32, {n, 3, 2}, {g, u});
        oai->params.f[0] = 1.702f;
        oai->params.f[1] = 7.0f;
        REQUIRE(moe::cpu::glu(*oai).is_ok());
        check_all(
            *oai,
            [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
                const double x = std::min(value(*g, i0, i1, i2), 7.0);
                const double y = std::clamp(value(*u, i0, i1, i2), -7.0, 7.0);
                return x * sigmoid_ref(1.702f * x) * (y + 1.0);
            },
            1e-5, 1e-8);
    }
}

namespace {

// A cache element CPY wrote: x as F16 (rounded by the library's converter) or as the same F32 bits.
void require_cache_element(const uint8_t* at, Type kv_type, float x) {
    if (kv_type == Type::F16) {
        uint16_t got;
        std::memcpy(&got, at, 2);
        REQUIRE(got == moe::fp32_to_fp16(x));
    } else {
        float got;
        std::memcpy(&got, at, 4);
        REQUIRE(got == x);
    }
}

}  // namespace

TEST_CASE("CPY writes F32 into a strided F16/F32 KV-cache view", "[ops]") {
    auto rng = make_rng(3);
    const int64_t D = 64, Hkv = 2, n_ctx = 40, T = 5, p0 = 11;
    for (const Type kv_type : {Type::F16, Type::F32}) {
        for (const bool reshape : {false, true}) {
            TensorPool pool;
            Tensor* cache = pool.make(kv_type, {D, Hkv, n_ctx});
            std::vector<uint8_t> before(static_cast<const uint8_t*>(cache->data),
                                        static_cast<const uint8_t*>(cache->data) + cache->nb[2] * n_ctx);
            Tensor* slots =
                pool.view(cache, {D, Hkv, T}, {cache->nb[1], cache->nb[2], cache->nb[2] * T}, cache->nb[2] * p0);
            Tensor* src = reshape ? pool.make(Type::F32, {D * Hkv, T}) : pool.make(Type::F32, {D, Hkv, T});
            fill_uniform(*src, rng, -70000.0f, 70000.0f);  // includes values that overflow to inf in F16
            Tensor* d = pool.node(Op::CPY, kv_type, {D, Hkv, T}, {src, slots});
            for (int i = 0; i < 4; ++i) d->nb[i] = slots->nb[i];
            d->data = slots->data;
            REQUIRE(moe::cpu::cpy(*d).is_ok());
            const auto* src_f = src->as<float>();
            for (int64_t j = 0; j < n_ctx; ++j) {
                for (int64_t h = 0; h < Hkv; ++h) {
                    for (int64_t i = 0; i < D; ++i) {
                        const size_t off = static_cast<size_t>(j) * cache->nb[2] +
                                           static_cast<size_t>(h) * cache->nb[1] +
                                           static_cast<size_t>(i) * cache->nb[0];
                        const uint8_t* at = static_cast<const uint8_t*>(cache->data) + off;
                        if (j < p0 || j >= p0 + T) {
                            REQUIRE(std::memcmp(at, before.data() + off, cache->nb[0]) == 0);
                            continue;
                        }
                        require_cache_element(at, kv_type, src_f[((j - p0) * Hkv + h) * D + i]);
                    }
                }
            }
        }
    }
}

// CPY with rows (the stable KV addressing's cache write): token t of a strided src lands in row rows[t]
// of the whole cache, every other byte stays; a row outside the cache is refused before any write.
TEST_CASE("CPY with rows writes each token into the cache row its index names", "[ops]") {
    auto rng = make_rng(41);
    const int64_t D = 64, Hkv = 2, n_ctx = 40, T = 6;
    for (const Type kv_type : {Type::F16, Type::F32}) {
        TensorPool pool;
        Tensor* cache = pool.make(kv_type, {D, Hkv, n_ctx});
        fill_uniform(*cache, rng, -1.0f, 1.0f);
        std::vector<uint8_t> before(static_cast<const uint8_t*>(cache->data),
                                    static_cast<const uint8_t*>(cache->data) + cache->nb[2] * n_ctx);
        // src: the first Hkv heads of a [D, Hkv + 1, T] tensor (strided rows, as a view of a q/k/v product)
        Tensor* wide = pool.make(Type::F32, {D, Hkv + 1, T});
        fill_uniform(*wide, rng, -70000.0f, 70000.0f);  // includes values that overflow to inf in F16
        Tensor* src = pool.view(wide, {D, Hkv, T}, {wide->nb[1], wide->nb[2], wide->nb[3]}, 0);
        std::vector<int32_t> order(n_ctx);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        Tensor* rows = pool.make(Type::I32, {T});
        std::copy_n(order.begin(), T, rows->as<int32_t>());
        Tensor* d = pool.node(Op::CPY, kv_type, {D, Hkv, n_ctx}, {src, cache, rows});
        for (int i = 0; i < 4; ++i) d->nb[i] = cache->nb[i];
        d->data = cache->data;
        REQUIRE(moe::cpu::cpy(*d).is_ok());
        for (int64_t j = 0; j < n_ctx; ++j) {
            const auto t = std::find(order.begin(), order.begin() + T, static_cast<int32_t>(j)) - order.begin();
            for (int64_t h = 0; h < Hkv; ++h) {
                for (int64_t i = 0; i < D; ++i) {
                    const size_t off = static_cast<size_t>(j) * cache->nb[2] + static_cast<size_t>(h) * cache->nb[1] +
                                       static_cast<size_t>(i) * cache->nb[0];
                    const uint8_t* at = static_cast<const uint8_t*>(cache->data) + off;
                    if (t == T) {
                        REQUIRE(std::memcmp(at, before.data() + off, cache->nb[0]) == 0);
                        continue;
                    }
                    require_cache_element(at, kv_type, static_cast<float>(value(*src, i, h, t)));
                }
            }
        }
        // A row past the cache (or negative): OUT_OF_RANGE (as GET_ROWS' ids), and not one byte written.
        for (const int32_t bad : {static_cast<int32_t>(n_ctx), -1}) {
            std::vector<uint8_t> now(static_cast<const uint8_t*>(cache->data),
                                     static_cast<const uint8_t*>(cache->data) + cache->nb[2] * n_ctx);
            rows->as<int32_t>()[T - 1] = bad;
            const moe::Status st = moe::cpu::cpy(*d);
            REQUIRE(st.code() == MOE_STATUS_OUT_OF_RANGE);
            CHECK(st.message().find("rows[5]") != std::string::npos);
            REQUIRE(std::memcmp(cache->data, now.data(), now.size()) == 0);
        }
    }
}

TEST_CASE("CPY into a transposed view (element stride != element size)", "[ops]") {
    auto rng = make_rng(4);
    TensorPool pool;
    const int64_t n_ctx = 9, D = 6, T = 3, p0 = 4;
    Tensor* vt = pool.make(Type::F16, {n_ctx, D});  // V^T: the token index is the fastest
    Tensor* view = pool.view(vt, {T, D}, {vt->nb[1], vt->nb[1] * D, vt->nb[1] * D}, static_cast<size_t>(p0) * 2);
    // The same slots seen as [D, T]: stepping i0 (a feature) jumps a whole V^T row.
    Tensor* dview = pool.view(vt, {D, T}, {2, vt->nb[1] * D, vt->nb[1] * D}, static_cast<size_t>(p0) * 2);
    dview->nb[0] = vt->nb[1];
    Tensor* src = pool.make(Type::F32, {D, T});
    fill_uniform(*src, rng, -2.0f, 2.0f);
    Tensor* d = pool.node(Op::CPY, Type::F16, {D, T}, {src, dview});
    for (int i = 0; i < 4; ++i) d->nb[i] = dview->nb[i];
    d->data = dview->data;
    REQUIRE(moe::cpu::cpy(*d).is_ok());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i) REQUIRE(*elem<uint16_t>(*view, t, i) == moe::fp32_to_fp16(value(*src, i, t)));
}

TEST_CASE("RMS_NORM with and without weight", "[ops]") {
    auto rng = make_rng(5);
    for (const int64_t k : {1, 33, 128, 2880}) {
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {k, 5, 3});
        fill_uniform(*x, rng, -4.0f, 4.0f);
        Tensor* w = pool.make(Type::F32, {k});
        fill_uniform(*w, rng, 0.5f, 1.5f);
        for (Tensor* weight : {static_cast<Tensor*>(nullptr), w}) {
            Tensor* d = pool.node(Op::RMS_NORM, Type::F32, {k, 5, 3}, {x, weight});
            d->params.f[0] = 1e-6f;
            REQUIRE(moe::cpu::rms_norm(*d).is_ok());
            check_all(
                *d,
                [&](int64_t i0, int64_t i1, int64_t i2, int64_t) {
                    double ss = 0.0;
                    for (int64_t i = 0; i < k; ++i) ss += value(*x, i, i1, i2) * value(*x, i, i1, i2);
                    const double r = value(*x, i0, i1, i2) / std::sqrt(ss / static_cast<double>(k) + 1e-6f);
                    return weight != nullptr ? r * value(*weight, i0) : r;
                },
                1e-5, 1e-7);
        }
    }
}

TEST_CASE("SOFTMAX over rows, max-subtracted", "[ops]") {
    auto rng = make_rng(6);
    for (const int64_t n : {1, 7, 32, 128}) {
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {n, 9});
        fill_uniform(*x, rng, -30.0f, 30.0f);
        *elem<float>(*x, 0, 0) = 500.0f;  // would overflow without the max subtraction
        Tensor* d = pool.node(Op::SOFTMAX, Type::F32, {n, 9}, {x});
        REQUIRE(moe::cpu::softmax(*d).is_ok());
        check_all(
            *d,
            [&](int64_t i0, int64_t i1, int64_t, int64_t) {
                double mx = -1e300, sum = 0.0;
                for (int64_t i = 0; i < n; ++i) mx = std::max(mx, value(*x, i, i1));
                for (int64_t i = 0; i < n; ++i) sum += std::exp(value(*x, i, i1) - mx);
                return std::exp(value(*x, i0, i1) - mx) / sum;
            },
            1e-5, 1e-12);
        // A fully masked row (all -inf) gives zeros, not NaN.
        for (int64_t i = 0; i < n; ++i) *elem<float>(*x, i, 8) = -std::numeric_limits<float>::infinity();
        REQUIRE(moe::cpu::softmax(*d).is_ok());
        for (int64_t i = 0; i < n; ++i) REQUIRE(value(*d, i, 8) == 0.0);
    }
}

TEST_CASE("TOPK: k largest per column, descending, ties to the lower index", "[ops]") {
    auto rng = make_rng(7);
    for (const int64_t n : {7, 32, 128}) {
        for (const int32_t k : {1, 4, 7}) {
            if (k > n) continue;
            TensorPool pool;
            const int64_t T = 19;
            Tensor* x = pool.make(Type::F32, {n, T});
            std::uniform_int_distribution<int> small(-6, 6);  // many ties
            for (int64_t t = 0; t < T; ++t)
                for (int64_t e = 0; e < n; ++e) *elem<float>(*x, e, t) = 0.25f * static_cast<float>(small(rng));
            Tensor* d = pool.node(Op::TOPK, Type::I32, {k, T}, {x});
            d->params.i[0] = k;
            REQUIRE(moe::cpu::topk(*d).is_ok());
            for (int64_t t = 0; t < T; ++t) {
                std::vector<int32_t> idx(static_cast<size_t>(n));
                std::iota(idx.begin(), idx.end(), 0);
                std::stable_sort(idx.begin(), idx.end(),
                                 [&](int32_t a, int32_t b) { return value(*x, a, t) > value(*x, b, t); });
                for (int32_t j = 0; j < k; ++j) REQUIRE(*elem<int32_t>(*d, j, t) == idx[static_cast<size_t>(j)]);
            }
        }
    }
}

TEST_CASE("GATHER and WEIGHTED_SUM", "[ops]") {
    auto rng = make_rng(8);
    TensorPool pool;
    const int64_t E = 32, k = 4, T = 11, N = 70;
    Tensor* probs = pool.make(Type::F32, {E, T});
    fill_uniform(*probs, rng, 0.0f, 1.0f);
    Tensor* ids = pool.make(Type::I32, {k, T});
    std::uniform_int_distribution<int32_t> pick(0, E - 1);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) *elem<int32_t>(*ids, j, t) = pick(rng);
    Tensor* g = pool.node(Op::GATHER, Type::F32, {k, T}, {probs, ids});
    REQUIRE(moe::cpu::gather(*g).is_ok());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) REQUIRE(value(*g, j, t) == value(*probs, *elem<int32_t>(*ids, j, t), t));

    Tensor* y = pool.make(Type::F32, {N, k, T});
    fill_uniform(*y, rng, -2.0f, 2.0f);
    Tensor* ws = pool.node(Op::WEIGHTED_SUM, Type::F32, {N, T}, {y, g});
    REQUIRE(moe::cpu::weighted_sum(*ws).is_ok());
    check_all(
        *ws,
        [&](int64_t i0, int64_t i1, int64_t, int64_t) {
            double s = 0.0;
            for (int64_t j = 0; j < k; ++j) s += value(*g, j, i1) * value(*y, i0, j, i1);
            return s;
        },
        1e-5, 1e-6);

    // With ids (a part of a split expert block): kNoExpert slots are skipped, their NaN rows unread.
    Tensor* part_ids = pool.make(Type::I32, {k, T});
    std::bernoulli_distribution drop(0.5);
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < k; ++j) {
            const bool none = drop(rng);
            *elem<int32_t>(*part_ids, j, t) = none ? moe::kNoExpert : *elem<int32_t>(*ids, j, t);
            if (none) {
                for (int64_t i = 0; i < N; ++i) *elem<float>(*y, i, j, t) = std::numeric_limits<float>::quiet_NaN();
            }
        }
    }
    Tensor* part = pool.node(Op::WEIGHTED_SUM, Type::F32, {N, T}, {y, g, part_ids});
    REQUIRE(moe::cpu::weighted_sum(*part).is_ok());
    check_all(
        *part,
        [&](int64_t i0, int64_t i1, int64_t, int64_t) {
            double s = 0.0;
            for (int64_t j = 0; j < k; ++j) {
                if (*elem<int32_t>(*part_ids, j, i1) != moe::kNoExpert) s += value(*g, j, i1) * value(*y, i0, j, i1);
            }
            return s;
        },
        1e-5, 1e-6);

    *elem<int32_t>(*ids, 2, 5) = static_cast<int32_t>(E);
    const moe::Status s = moe::cpu::gather(*g);
    CHECK(s.code() == MOE_STATUS_OUT_OF_RANGE);
    CHECK(s.message().find("src1[2, 5]") != std::string::npos);
}

namespace {

// Independent decoders of the GGUF block layouts (types.h comments), for the GET_ROWS check.
double half_bits(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

double decode(Type type, const uint8_t* row, int64_t i) {
    const int64_t b = i / 32, j = i % 32;
    switch (type) {
        case Type::F32: {
            float f;
            std::memcpy(&f, row + 4 * i, 4);
            return f;
        }
        case Type::F16:
            return half_bits(row + 2 * i);
        case Type::BF16: {
            uint16_t h;
            std::memcpy(&h, row + 2 * i, 2);
            const uint32_t bits = static_cast<uint32_t>(h) << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
        }
        case Type::Q8_0: {
            const uint8_t* blk = row + 34 * b;
            return half_bits(blk) * static_cast<int8_t>(blk[2 + j]);
        }
        case Type::Q4_0: {
            const uint8_t* blk = row + 18 * b;
            const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
            return half_bits(blk) * (q - 8);
        }
        case Type::MXFP4: {
            static const double kE2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
            const uint8_t* blk = row + 17 * b;
            const int q = j < 16 ? (blk[1 + j] & 15) : (blk[1 + j - 16] >> 4);
            return kE2m1[q] * std::ldexp(1.0, blk[0] - 127);
        }
        default:
            FAIL("unexpected type");
            return 0;
    }
}

}  // namespace

TEST_CASE("MASK_IDS keeps the ids of one expert group", "[ops]") {
    auto rng = make_rng(7);
    const int64_t k = 4, T = 29, E = 11;
    TensorPool pool;
    Tensor* ids = pool.make(Type::I32, {k, T});
    Tensor* groups = pool.make(Type::I32, {E});
    std::uniform_int_distribution<int32_t> pick(-1, E - 1), group(0, 1);
    for (int64_t i = 0; i < k * T; ++i) *elem<int32_t>(*ids, i) = pick(rng);
    for (int64_t e = 0; e < E; ++e) *elem<int32_t>(*groups, e) = group(rng);
    for (int32_t keep : {0, 1}) {
        Tensor* d = pool.node(Op::MASK_IDS, Type::I32, {k, T}, {ids, groups});
        d->params.i[0] = keep;
        REQUIRE(moe::cpu::mask_ids(*d).is_ok());
        for (int64_t i = 0; i < k * T; ++i) {
            const int32_t e = *elem<int32_t>(*ids, i);
            const int32_t want = e >= 0 && *elem<int32_t>(*groups, e) == keep ? e : moe::kNoExpert;
            REQUIRE(*elem<int32_t>(*d, i) == want);
        }
    }
    // Remap mode (i[1]): each expert's row in a slice of some experts, -1 for the others.
    Tensor* rows = pool.make(Type::I32, {E});
    int32_t next = 0;
    for (int64_t e = 0; e < E; ++e) *elem<int32_t>(*rows, e) = group(rng) ? next++ : moe::kNoExpert;
    Tensor* r = pool.node(Op::MASK_IDS, Type::I32, {k, T}, {ids, rows});
    r->params.i[1] = 1;
    REQUIRE(moe::cpu::mask_ids(*r).is_ok());
    for (int64_t i = 0; i < k * T; ++i) {
        const int32_t e = *elem<int32_t>(*ids, i);
        REQUIRE(*elem<int32_t>(*r, i) == (e >= 0 ? *elem<int32_t>(*rows, e) : moe::kNoExpert));
    }
    *elem<int32_t>(*ids, 5) = static_cast<int32_t>(E);
    Tensor* d = pool.node(Op::MASK_IDS, Type::I32, {k, T}, {ids, groups});
    CHECK(moe::cpu::mask_ids(*d).code() == MOE_STATUS_OUT_OF_RANGE);
}

TEST_CASE("GET_ROWS from every weight type", "[ops]") {
    auto rng = make_rng(9);
    const int64_t K = 96, R = 13, T = 9;
    for (const Type type : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4}) {
        INFO("type " << moe::type_name(type));
        TensorPool pool;
        Tensor* w = pool.make(type, {K, R});
        std::uniform_real_distribution<float> u(-3.0f, 3.0f);
        std::vector<float> src(static_cast<size_t>(K));
        for (int64_t r = 0; r < R; ++r) {
            for (float& v : src) v = u(rng);
            moe::traits(type).from_float(src.data(), w->row(r), K);
        }
        Tensor* ids = pool.make(Type::I32, {T});
        std::uniform_int_distribution<int32_t> pick(0, R - 1);
        for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*ids, t) = pick(rng);
        Tensor* d = pool.node(Op::GET_ROWS, Type::F32, {K, T}, {w, ids});
        REQUIRE(moe::cpu::get_rows(*d).is_ok());
        for (int64_t t = 0; t < T; ++t) {
            const uint8_t* row = w->row(*elem<int32_t>(*ids, t));
            for (int64_t i = 0; i < K; ++i) REQUIRE(value(*d, i, t) == decode(type, row, i));
        }
        // kNoExpert (-1) gives a zero row; other ids outside the rows are errors.
        *elem<int32_t>(*ids, 3) = moe::kNoExpert;
        REQUIRE(moe::cpu::get_rows(*d).is_ok());
        for (int64_t i = 0; i < K; ++i) REQUIRE(value(*d, i, 3) == 0.0f);
        *elem<int32_t>(*ids, 3) = -2;
        CHECK(moe::cpu::get_rows(*d).code() == MOE_STATUS_OUT_OF_RANGE);
    }
}

namespace {

// RoPE (NeoX pairs) with YaRN, all in double, from the formulas: theta = p * base^(-2i/n_dims);
// YaRN blends freq_scale * theta with theta by ramp(i) * ext_factor, the ramp falling from 1 to 0
// between the correction dims c(beta_fast) and c(beta_slow) (floor/ceil'd when yarn_truncate), with
// c(b) = n_dims * ln(n_ctx_orig / (2 pi b)) / (2 ln base); cos/sin scaled by
// attn_factor * (1 + 0.1 ln(1 / freq_scale)) when YaRN is on.
void rope_ref(const moe::RopeParams& p, const float* x, int64_t d, int32_t pos, double* out) {
    const int half = p.n_dims / 2;
    double lo = 0, hi = 0, mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
        const double pi = 3.14159265358979323846;
        auto corr = [&](double b) {
            return p.n_dims * std::log(p.n_ctx_orig / (2 * pi * b)) / (2 * std::log(static_cast<double>(p.freq_base)));
        };
        lo = corr(p.beta_fast);
        hi = corr(p.beta_slow);
        if (p.yarn_truncate) {
            lo = std::floor(lo);
            hi = std::ceil(hi);
        }
        lo = std::max(0.0, lo);
        hi = std::min(static_cast<double>(p.n_dims - 1), hi);
        mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
    }
    for (int i = 0; i < half; ++i) {
        const double extrap = pos * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
        double theta = p.freq_scale * extrap;
        if (p.ext_factor != 0.0f) {
            const double ramp = 1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
            const double mix = ramp * p.ext_factor;
            theta = theta * (1.0 - mix) + extrap * mix;
        }
        const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
        out[i] = x[i] * c - x[i + half] * s;
        out[i + half] = x[i] * s + x[i + half] * c;
    }
    for (int64_t i = p.n_dims; i < d; ++i) out[i] = x[i];
}

}  // namespace

TEST_CASE("ROPE NeoX, with and without YaRN, against float64", "[ops]") {
    auto rng = make_rng(10);
    struct Case {
        int64_t d;
        int32_t n_dims;
        bool yarn;
        bool truncate;
    };
    for (const Case c : {Case{64, 64, false, false}, Case{128, 128, false, false}, Case{64, 32, false, false},
                         Case{64, 64, true, false}, Case{64, 64, true, true}, Case{128, 96, true, false},
                         Case{16, 16, true, true}}) {
        INFO("D " << c.d << " n_dims " << c.n_dims << " yarn " << c.yarn << " truncate " << c.truncate);
        TensorPool pool;
        const int64_t H = 3, T = 6;
        Tensor* x = pool.make(Type::F32, {c.d, H, T});
        fill_uniform(*x, rng, -2.0f, 2.0f);
        Tensor* pos = pool.make(Type::I32, {T});
        std::uniform_int_distribution<int32_t> pick(0, 40000);
        for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*pos, t) = t == 0 ? 0 : pick(rng);
        moe::RopeParams p;
        p.n_dims = c.n_dims;
        p.freq_base = c.yarn ? 150000.0f : 1000000.0f;
        if (c.yarn) {  // GPT-OSS-like
            p.n_ctx_orig = 4096;
            p.freq_scale = 1.0f / 32.0f;
            p.ext_factor = 1.0f;
            p.attn_factor = 1.0f;
            p.beta_fast = 32.0f;
            p.beta_slow = 1.0f;
            p.yarn_truncate = c.truncate;
        }
        Tensor* d = pool.node(Op::ROPE, Type::F32, {c.d, H, T}, {x, pos});
        d->set_rope_params(p);
        REQUIRE(moe::cpu::rope(*d).is_ok());
        std::vector<double> want(static_cast<size_t>(c.d));
        const double mscale = c.yarn ? 1.0 + 0.1 * std::log(32.0) : 1.0;
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t h = 0; h < H; ++h) {
                rope_ref(p, elem<float>(*x, 0, h, t), c.d, *elem<int32_t>(*pos, t), want.data());
                for (int64_t i = 0; i < c.d; ++i) {
                    INFO("t " << t << " h " << h << " i " << i << " got " << value(*d, i, h, t) << " want "
                                << want[static_cast<size_t>(i)]);
                    REQUIRE(close(value(*d, i, h, t), want[static_cast<size_t>(i)], 0.0, 4e-6 * mscale));
                }
            }
        }
        // In place (dst aliases src0), as an allocator may arrange.
        std::vector<float> expect(static_cast<const float*>(d->data), static_cast<const float*>(d->data) + c.d * H * T);
        d->data = x->data;
        REQUIRE(moe::cpu::rope(*d).is_ok());
        CHECK(std::memcmp(x->data, expect.data(), expect.size() * 4) == 0);
    }
}

TEST_CASE("ROPE rejects bad parameters", "[ops]") {
    TensorPool pool;
    Tensor* x = pool.make(Type::F32, {8, 2, 3});
    Tensor* pos = pool.make(Type::I32, {3});
    Tensor* d = pool.node(Op::ROPE, Type::F32, {8, 2, 3}, {x, pos});
    moe::RopeParams p;
    p.n_dims = 5;
    d->set_rope_params(p);
    moe::Status s = moe::cpu::rope(*d);
    CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(s.message().find("n_dims") != std::string::npos);
    p.n_dims = 8;
    p.ext_factor = 1.0f;
    d->set_rope_params(p);
    CHECK(moe::cpu::rope(*d).code() == MOE_STATUS_INVALID_ARGUMENT);  // YaRN without n_ctx_orig
    Tensor* pos2 = pool.make(Type::I32, {2});
    d->src[1] = pos2;
    p.ext_factor = 0.0f;
    d->set_rope_params(p);
    CHECK(moe::cpu::rope(*d).code() == MOE_STATUS_INVALID_ARGUMENT);
}
