// deepseek2's ops on the CPU: CONCAT, MUL_MAT_HEADS, GROUP_MASK and interleaved ROPE, against references
// written here (float64 loops, or an already-tested op on permuted data), on seeded random data (replay
// with --rng-seed), with strided inputs as the graph builds them.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/types.h"
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

constexpr double kU = 1.0 / (1 << 24);  // float's unit roundoff

// A weight of `type` [k, n, h] holding `src` (F32, same shape) converted; returns its values back in
// float (what the kernel multiplies by).
Tensor* make_weight(TensorPool& pool, Type type, const Tensor& src, std::vector<float>& values) {
    Tensor* w = pool.make(type, {src.ne[0], src.ne[1], src.ne[2]});
    const int64_t rows = src.ne[1] * src.ne[2];
    values.assign(static_cast<size_t>(src.ne[0] * rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const auto* x = reinterpret_cast<const float*>(src.row(r % src.ne[1], r / src.ne[1]));
        void* dst = w->row(r % src.ne[1], r / src.ne[1]);
        moe::traits(type).from_float(x, dst, src.ne[0]);
        moe::traits(type).to_float(dst, values.data() + r * src.ne[0], src.ne[0]);
    }
    return w;
}

}  // namespace

TEST_CASE("CONCAT joins rows of strided views, src1 repeated over the heads when it has one", "[ops][mla]") {
    auto rng = make_rng(41);
    for (const bool shared : {false, true}) {
        TensorPool pool;
        const int64_t A = 40, B = 8, H = 5, T = 3;
        Tensor* qa = pool.make(Type::F32, {A + 7, H, T});  // a's rows inside wider rows
        fill_uniform(*qa, rng, -1.0f, 1.0f);
        Tensor* a = pool.view(qa, {A, H, T}, {qa->nb[1], qa->nb[2]}, 0);
        const int64_t bh = shared ? 1 : H;
        Tensor* qb = pool.make(Type::F32, {B + 3, bh, T});
        fill_uniform(*qb, rng, -1.0f, 1.0f);
        Tensor* b = pool.view(qb, {B, bh, T}, {qb->nb[1], qb->nb[2]}, 3 * sizeof(float));
        Tensor* d = pool.node(Op::CONCAT, Type::F32, {A + B, H, T}, {a, b});
        REQUIRE(moe::cpu::concat(*d).is_ok());
        int bad = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < A + B; ++i) {
                    const double want = i < A ? value(*a, i, h, t) : value(*b, i - A, shared ? 0 : h, t);
                    if (value(*d, i, h, t) != want) ++bad;
                }
        INFO("shared " << shared);
        CHECK(bad == 0);
    }
}

TEST_CASE("CONCAT converts between F32 and F16, and copies src0 alone when src1 is absent", "[ops][mla]") {
    auto rng = make_rng(43);
    const int64_t A = 24, B = 8, H = 3, T = 4;
    for (const Type ta : {Type::F32, Type::F16}) {
        for (const int tb : {-1, 0, 1}) {  // none, F32, F16
            for (const Type td : {Type::F32, Type::F16}) {
                TensorPool pool;
                Tensor* qa = pool.make(ta, {A + 5, H, T});
                fill_uniform(*qa, rng, -70000.0f, 70000.0f);  // past F16's largest: those round to inf
                moe::test::set_float_edge_values(*qa);
                Tensor* a = pool.view(qa, {A, H, T}, {qa->nb[1], qa->nb[2]}, 0);
                Tensor* b = nullptr;
                if (tb >= 0) {
                    Tensor* qb = pool.make(tb == 0 ? Type::F32 : Type::F16, {B, 1, T});
                    fill_uniform(*qb, rng, -2.0f, 2.0f);
                    b = qb;
                }
                const int64_t width = A + (b != nullptr ? B : 0);
                Tensor* d = pool.node(Op::CONCAT, td, {width, H, T}, {a, b});
                REQUIRE(moe::cpu::concat(*d).is_ok());
                int bad = 0;
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t h = 0; h < H; ++h)
                        for (int64_t i = 0; i < width; ++i) {
                            const double src = i < A ? value(*a, i, h, t) : value(*b, i - A, 0, t);
                            // dst's type: F16 rounds to nearest even (the scalar converter of core/types.h)
                            const double want = td == Type::F16
                                                    ? moe::fp16_to_fp32(moe::fp32_to_fp16(static_cast<float>(src)))
                                                    : src;
                            const double got = value(*d, i, h, t);
                            if (got != want && !(std::isnan(got) && std::isnan(want))) ++bad;
                        }
                INFO("src0 " << moe::type_name(ta) << " src1 " << tb << " dst " << moe::type_name(td));
                CHECK(bad == 0);
            }
        }
    }
}

TEST_CASE("CONCAT names mismatched shapes", "[ops][mla]") {
    TensorPool pool;
    Tensor* a = pool.make(Type::F32, {4, 3, 2});
    Tensor* b = pool.make(Type::F32, {2, 2, 2});  // 2 heads against 3
    Tensor* d = pool.node(Op::CONCAT, Type::F32, {6, 3, 2}, {a, b});
    const moe::Status s = moe::cpu::concat(*d);
    REQUIRE_FALSE(s.is_ok());
    CHECK_THAT(s.message(), Catch::Contains("CONCAT") && Catch::Contains("[2, 2, 2, 1]"));
}

TEST_CASE("MUL_MAT_HEADS matches float64 per head (F32 / F16 / BF16 / Q8_0 weights, strided x)", "[ops][mla]") {
    auto rng = make_rng(42);
    struct Case {
        Type type;
        int64_t k, n, h, t;
    };
    for (const Case c : {Case{Type::F32, 32, 64, 4, 5}, Case{Type::F16, 128, 64, 3, 1}, Case{Type::BF16, 64, 96, 2, 9},
                         Case{Type::Q8_0, 64, 32, 4, 7}}) {
        INFO("type " << moe::type_name(c.type) << " k " << c.k << " n " << c.n << " heads " << c.h << " tokens " << c.t);
        TensorPool pool;
        Tensor* wf = pool.make(Type::F32, {c.k, c.n, c.h});
        fill_uniform(*wf, rng, -1.0f, 1.0f);
        std::vector<float> wv;
        Tensor* w = make_weight(pool, c.type, *wf, wv);
        // x: the first k of rows of k + 16 (q_nope inside q).
        Tensor* xb = pool.make(Type::F32, {c.k + 16, c.h, c.t});
        fill_uniform(*xb, rng, -1.0f, 1.0f);
        Tensor* x = pool.view(xb, {c.k, c.h, c.t}, {xb->nb[1], xb->nb[2]}, 0);
        Tensor* d = pool.node(Op::MUL_MAT_HEADS, Type::F32, {c.n, c.h, c.t}, {w, x});
        moe::cpu::Scratch scratch;
        REQUIRE(moe::cpu::mul_mat_heads(*d, scratch).is_ok());
        // Float weights: F32 products and sums (k u of the absolute sum). Q8_0: the activations are
        // quantised to 8 bits per 32 (half a step of max|x| / 127 per element) as in every Q8 product.
        const bool q8 = c.type == Type::Q8_0;
        int bad = 0;
        for (int64_t t = 0; t < c.t; ++t)
            for (int64_t h = 0; h < c.h; ++h)
                for (int64_t n = 0; n < c.n; ++n) {
                    double want = 0.0, abs_sum = 0.0, abs_w = 0.0;
                    for (int64_t i = 0; i < c.k; ++i) {
                        const double wi = wv[static_cast<size_t>((h * c.n + n) * c.k + i)];
                        want += wi * value(*x, i, h, t);
                        abs_sum += std::fabs(wi * value(*x, i, h, t));
                        abs_w += std::fabs(wi);
                    }
                    const double tol = q8 ? abs_w * 0.5 / 127.0 + 2 * c.k * kU * abs_sum : 2 * c.k * kU * abs_sum + 1e-30;
                    if (std::fabs(*elem<float>(*d, n, h, t) - want) > tol && bad++ < 3) {
                        INFO("n " << n << " h " << h << " t " << t << ": got " << *elem<float>(*d, n, h, t) << " want "
                                  << want);
                        CHECK(false);
                    }
                }
        CHECK(bad == 0);
    }
}

namespace {

// GROUP_MASK's reference: per column, group scores as the sum of the top_n of each group (float64), the
// n_used best groups (ties to the lower group) kept.
std::vector<float> group_mask_ref(const Tensor& x, int n_group, int n_used, int top_n) {
    const int64_t e = x.ne[0], per = e / n_group;
    std::vector<float> out(static_cast<size_t>(e * x.ne[1]));
    for (int64_t t = 0; t < x.ne[1]; ++t) {
        std::vector<double> score(static_cast<size_t>(n_group));
        for (int g = 0; g < n_group; ++g) {
            std::vector<double> v;
            for (int64_t i = 0; i < per; ++i) v.push_back(value(x, g * per + i, t));
            std::sort(v.begin(), v.end(), std::greater<double>());
            score[static_cast<size_t>(g)] = std::accumulate(v.begin(), v.begin() + top_n, 0.0);
        }
        std::vector<int> order(static_cast<size_t>(n_group));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
        std::vector<bool> kept(static_cast<size_t>(n_group), false);
        for (int j = 0; j < n_used; ++j) kept[static_cast<size_t>(order[static_cast<size_t>(j)])] = true;
        for (int64_t i = 0; i < e; ++i) {
            out[static_cast<size_t>(t * e + i)] = kept[static_cast<size_t>(i / per)]
                                                      ? static_cast<float>(value(x, i, t))
                                                      : -std::numeric_limits<float>::infinity();
        }
    }
    return out;
}

}  // namespace

TEST_CASE("GROUP_MASK keeps the best groups by the sum of their top entries", "[ops][mla]") {
    auto rng = make_rng(43);
    struct Case {
        int64_t e;
        int n_group, n_used, top_n;
    };
    // DeepSeek-V3 (256 experts, 8 groups, 4 used, top 2), V2 (160 / 8 / 3 by the maximum), and small ones.
    for (const Case c : {Case{256, 8, 4, 2}, Case{160, 8, 3, 1}, Case{16, 4, 2, 2}, Case{12, 3, 1, 4}, Case{8, 8, 7, 1}}) {
        INFO("experts " << c.e << " groups " << c.n_group << " used " << c.n_used << " top " << c.top_n);
        TensorPool pool;
        const int64_t T = 23;
        Tensor* x = pool.make(Type::F32, {c.e, T});
        fill_uniform(*x, rng, -0.5f, 1.5f);
        // Whole tied groups in one column: ties go to the lower group.
        for (int64_t i = 0; i < c.e; ++i) *elem<float>(*x, i, 0) = 0.25f;
        Tensor* d = pool.node(Op::GROUP_MASK, Type::F32, {c.e, T}, {x});
        d->params.i[0] = c.n_group;
        d->params.i[1] = c.n_used;
        d->params.i[2] = c.top_n;
        REQUIRE(moe::cpu::group_mask(*d).is_ok());
        const std::vector<float> want = group_mask_ref(*x, c.n_group, c.n_used, c.top_n);
        int bad = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < c.e; ++i) bad += *elem<float>(*d, i, t) != want[static_cast<size_t>(t * c.e + i)];
        CHECK(bad == 0);
        // Every kept group is whole and exactly n_used groups are kept.
        for (int64_t t = 0; t < T; ++t) {
            int kept = 0;
            for (int g = 0; g < c.n_group; ++g) kept += std::isfinite(*elem<float>(*d, g * (c.e / c.n_group), t));
            CHECK(kept == c.n_used);
        }
    }
}

TEST_CASE("GROUP_MASK names parameters that do not fit the experts", "[ops][mla]") {
    TensorPool pool;
    Tensor* x = pool.make(Type::F32, {12, 2});
    Tensor* d = pool.node(Op::GROUP_MASK, Type::F32, {12, 2}, {x});
    d->params.i[0] = 5;  // does not divide 12
    d->params.i[1] = 1;
    d->params.i[2] = 1;
    const moe::Status s = moe::cpu::group_mask(*d);
    REQUIRE_FALSE(s.is_ok());
    CHECK_THAT(s.message(), Catch::Contains("GROUP_MASK") && Catch::Contains("5 groups"));
}

TEST_CASE("ROPE interleaved equals NeoX on the de-interleaved pairs (DeepSeek's YaRN included)", "[ops][mla]") {
    auto rng = make_rng(44);
    for (const bool yarn : {false, true}) {
        TensorPool pool;
        const int64_t R = 64, D = 80, H = 3, T = 5;  // rope dims at the front of wider rows
        Tensor* x = pool.make(Type::F32, {D, H, T});
        fill_uniform(*x, rng, -2.0f, 2.0f);
        Tensor* pos = pool.make(Type::I32, {T});
        std::uniform_int_distribution<int32_t> pick(0, 100000);
        for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*pos, t) = pick(rng);
        moe::RopeParams p;
        p.n_dims = static_cast<int32_t>(R);
        p.freq_base = 10000.0f;
        if (yarn) {  // DeepSeek-V3's
            p.freq_scale = 1.0f / 40.0f;
            p.ext_factor = 1.0f;
            p.n_ctx_orig = 4096;
            p.attn_factor = 1.0f / (1.0f + 0.1f * std::log(40.0f));
            p.yarn_truncate = true;
        }
        // x de-interleaved in its first R dims: pair i = (2i, 2i + 1) moves to (i, i + R/2).
        Tensor* xd = pool.make(Type::F32, {D, H, T});
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < D; ++i) {
                    const int64_t to = i >= R ? i : (i % 2 == 0 ? i / 2 : R / 2 + i / 2);
                    *elem<float>(*xd, to, h, t) = *elem<float>(*x, i, h, t);
                }
        Tensor* got = pool.node(Op::ROPE, Type::F32, {D, H, T}, {x, pos});
        p.interleaved = true;
        got->set_rope_params(p);
        Tensor* neox = pool.node(Op::ROPE, Type::F32, {D, H, T}, {xd, pos});
        p.interleaved = false;
        neox->set_rope_params(p);
        REQUIRE(moe::cpu::rope(*got).is_ok());
        REQUIRE(moe::cpu::rope(*neox).is_ok());
        int bad = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t i = 0; i < D; ++i) {
                    const int64_t to = i >= R ? i : (i % 2 == 0 ? i / 2 : R / 2 + i / 2);
                    bad += *elem<float>(*got, i, h, t) != *elem<float>(*neox, to, h, t);  // the same arithmetic
                }
        INFO("yarn " << yarn);
        CHECK(bad == 0);
    }
}
