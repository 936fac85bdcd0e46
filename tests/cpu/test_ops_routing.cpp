// The sigmoid routers' ops on the CPU (SIGMOID, NORM_SCALE) against float64 references written here,
// on seeded random data (replay with --rng-seed), contiguous and strided inputs; and the whole router
// block against the float64 router of common/sigmoid_router_ref.h.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/sigmoid_router_ref.h"
#include "core/allocator.h"
#include "core/graph.h"
#include "core/models/graph_blocks.h"
#include "cpu/cpu_backend.h"
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

}  // namespace

TEST_CASE("SIGMOID matches float64 (contiguous and strided)", "[ops][routing]") {
    auto rng = make_rng(31);
    for (const int64_t n : {1, 7, 128, 160, 1000}) {
        TensorPool pool;
        Tensor* base = pool.make(Type::F32, {n + 3, 5, 2});
        fill_uniform(*base, rng, -40.0f, 40.0f);  // far into both tails, where 1 - s and s lose accuracy
        Tensor* x = pool.view(base, {n, 5, 2}, {base->nb[1], base->nb[2]}, 3 * sizeof(float));
        Tensor* s = pool.node(Op::SIGMOID, Type::F32, {n, 5, 2}, {x});
        REQUIRE(moe::cpu::unary(*s).is_ok());
        int bad = 0;
        for (int64_t i2 = 0; i2 < 2; ++i2)
            for (int64_t i1 = 0; i1 < 5; ++i1)
                for (int64_t i0 = 0; i0 < n; ++i0) {
                    const double want = 1.0 / (1.0 + std::exp(-value(*x, i0, i1, i2)));
                    const double got = *elem<float>(*s, i0, i1, i2);
                    // exp to 2 ulp, one division and one product: 8 u relative, also in the far tail.
                    if (std::fabs(got - want) > 8 * kU * want) ++bad;
                }
        INFO("n = " << n);
        CHECK(bad == 0);
    }
}

TEST_CASE("NORM_SCALE matches float64: rows over their sum, times the scale", "[ops][routing]") {
    auto rng = make_rng(32);
    for (const int64_t k : {1, 4, 8, 33, 256}) {
        for (const bool normalize : {true, false}) {
            for (const float scale : {1.0f, 2.5f, 0.125f}) {
                TensorPool pool;
                Tensor* base = pool.make(Type::F32, {k, 9, 2});
                fill_uniform(*base, rng, 1e-4f, 1.0f);  // sigmoid scores: positive
                Tensor* x = pool.view(base, {k, 9}, {2 * base->nb[1]}, base->nb[1]);  // every other row
                Tensor* d = pool.node(Op::NORM_SCALE, Type::F32, {k, 9}, {x});
                d->params.i[0] = normalize ? 1 : 0;
                d->params.f[0] = scale;
                REQUIRE(moe::cpu::norm_scale(*d).is_ok());
                // The float sum of k positive terms is within (k - 1) u of the exact one; the division
                // and the product add 2 u.
                const double rel = (static_cast<double>(k) + 2) * kU;
                int bad = 0;
                for (int64_t t = 0; t < 9; ++t) {
                    double sum = 0.0;
                    for (int64_t j = 0; j < k; ++j) sum += value(*x, j, t);
                    for (int64_t j = 0; j < k; ++j) {
                        const double want = value(*x, j, t) * scale / (normalize ? sum : 1.0);
                        if (std::fabs(*elem<float>(*d, j, t) - want) > rel * want) ++bad;
                    }
                }
                INFO("k = " << k << ", normalize = " << normalize << ", scale = " << scale);
                CHECK(bad == 0);
            }
        }
    }
}

TEST_CASE("NORM_SCALE names a bad scale or shape", "[ops][routing]") {
    TensorPool pool;
    Tensor* x = pool.make(Type::F32, {8, 3});
    Tensor* d = pool.node(Op::NORM_SCALE, Type::F32, {8, 3}, {x});
    d->params.i[0] = 1;
    d->params.f[0] = std::numeric_limits<float>::infinity();
    const moe::Status s = moe::cpu::norm_scale(*d);
    REQUIRE(!s.is_ok());
    CHECK(s.message().find("params.f[0] (scale)") != std::string::npos);

    Tensor* wrong = pool.node(Op::NORM_SCALE, Type::F32, {8, 2}, {x});
    wrong->params.f[0] = 1.0f;
    const moe::Status w = moe::cpu::norm_scale(*wrong);
    REQUIRE(!w.is_ok());
    CHECK(w.message().find("NORM_SCALE: src0") != std::string::npos);
}

TEST_CASE("the sigmoid router block matches float64: selection bias, group limits, exact ties", "[ops][routing]") {
    // blocks::route_biased_sigmoid, the graph glm4moe and deepseek2 V3 / Kimi-K2 build (SIGMOID, ADD of
    // the bias, GROUP_MASK, TOPK, GATHER, NORM_SCALE), on the CPU backend against the float64
    // reference (common/sigmoid_router_ref.h). The same cases as the fused CUDA kernel's test.
    auto rng = make_rng(33);
    const moe::test::RouterCase cases[] = {{256, 4, 8, 8, 4, true, true, 2.5f},  {128, 7, 8, 1, 1, true, true, 1.0f},
                                           {384, 3, 8, 1, 1, true, true, 2.827f}, {16, 5, 4, 4, 2, true, true, 2.5f},
                                           {160, 2, 8, 1, 1, false, false, 1.5f}, {64, 9, 6, 8, 3, true, false, 1.0f},
                                           {512, 2, 32, 32, 2, true, true, 1.0f}, {1, 3, 1, 1, 1, true, true, 1.0f}};
    int checked = 0, tokens = 0;
    for (const moe::test::RouterCase& c : cases) {
        INFO("E " << c.E << " T " << c.T << " k " << c.k << " groups " << c.n_used << "/" << c.n_group);
        std::vector<float> lv, bv;
        moe::test::random_router_inputs(rng, c, lv, bv);
        moe::Graph g;
        Tensor* logits = g.input(Type::F32, {c.E, c.T}, "logits");
        Tensor bias;
        const int64_t ne[1] = {c.E};
        moe::set_shape(bias, Type::F32, 1, ne);
        bias.data = bv.data();
        bias.is_weight = true;
        const moe::blocks::Routing r = moe::blocks::route_biased_sigmoid(g, logits, c.bias ? &bias : nullptr, c.k,
                                                                         c.normalize, c.scale, {c.n_group, c.n_used});
        g.set_output(r.ids);
        g.set_output(r.weights);
        const moe::AllocPlan plan = moe::plan_allocation(g);
        std::vector<uint8_t> arena(plan.arena_size + 64);
        moe::bind_allocation(g, plan, arena.data());
        std::memcpy(logits->data, lv.data(), logits->n_bytes());
        moe::cpu::CpuBackend cpu(1);
        REQUIRE(cpu.compute(g.nodes()).is_ok());
        // The weights: each score within 8 u (SIGMOID's bound above), their sum within 8 u plus k - 1
        // roundings, a division and a product.
        const double rel = (c.k + 17) * kU;
        for (int64_t t = 0; t < c.T; ++t) {
            ++tokens;
            const moe::test::RouterChoice want = moe::test::reference_route(c, lv, bv, t);
            if (!want.decided) continue;
            ++checked;
            for (int j = 0; j < c.k; ++j) {
                INFO("token " << t << " choice " << j);
                REQUIRE(*elem<int32_t>(*r.ids, j, t) == want.ids[static_cast<size_t>(j)]);
                const double w = want.weights[static_cast<size_t>(j)];
                CHECK(std::fabs(*elem<float>(*r.weights, j, t) - w) <= rel * w);
            }
        }
    }
    CHECK(checked >= tokens * 9 / 10);  // near-ties that are not exact ties are rare
}
