// CUDA graphs in CudaBackend::compute (lib/cuda/graph_runner.h): spans run through captured and
// replayed graphs must give bitwise the results of eager launches (the same kernels with the same
// arguments), also after their arguments change between runs (other arena, n_kv, cache row), and
// must report node errors and device-detected errors exactly as eager launches do. The reference is
// the same backend with graphs disabled, on fresh random inputs per run; outputs are poisoned (NaN)
// before the graph run, so an unwritten element fails. The graph counters (GraphStats) prove that
// the graph path was taken, so the equality checks cannot pass on eager fallbacks alone.
//
// The signature tests need no device.
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/graph.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "cuda/graph_signature.h"

namespace {

using moe::Op;
using moe::Status;
using moe::Tensor;
using moe::Type;
using moe::test::Device;
using moe::test::fresh_rng;
using moe::test::random_f32;
using moe::test::require_ok;
using moe::test::run_seed;

std::vector<uint16_t> random_f16(std::mt19937_64& rng, size_t n) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = moe::fp32_to_fp16(u(rng));
    return v;
}

// Runs `g`'s nodes eagerly and then through graphs on the same inputs (`upload` writes them before
// each run: the arena reuses input memory for later nodes); every output must match bit for bit. The
// outputs are poisoned before the graph run.
template <typename Upload>
void check_graph_matches_eager(Device& dev, const moe::Graph& g, Upload&& upload) {
    dev.be().set_graphs_enabled(false);
    upload();
    require_ok(dev.be().compute(g.nodes()));
    std::vector<std::vector<uint8_t>> want;
    for (const Tensor* o : g.outputs()) want.push_back(dev.download(*o));
    for (const Tensor* o : g.outputs()) dev.poison(*o);
    dev.be().set_graphs_enabled(true);
    upload();
    require_ok(dev.be().compute(g.nodes()));
    require_ok(dev.be().synchronize());
    for (size_t i = 0; i < g.outputs().size(); ++i) {
        INFO("output " << i << " (" << moe::op_name(g.outputs()[i]->op) << "), seed " << run_seed());
        CHECK(dev.download(*g.outputs()[i]) == want[i]);
    }
}

}  // namespace

TEST_CASE("CUDA graphs match eager launches while n_kv, the cache row and the arena change", "[gpu]") {
    MOE_GPU_OR_SKIP();
    // The changing nodes (cache writes, attention) launched eagerly between graphs of the others, and
    // merged into one graph captured and updated every run (as while the device is busy).
    using Merge = moe::cuda::GraphRunner::Merge;
    const Merge merge = GENERATE(Merge::kNever, Merge::kAlways);
    INFO((merge == Merge::kAlways ? "merged" : "split"));
    Device dev;
    dev.be().set_graph_merge(merge);
    auto rng = fresh_rng(101);
    constexpr int64_t K = 256, N = 192, D = 64, H = 4, Hkv = 2, T = 3, kCtx = 1024;
    // Weights: an RMS norm vector and a Q8_0 matrix (GEMV path at T = 3).
    const std::vector<float> wn = random_f32(rng, K, 0.5f, 1.5f);
    Tensor* wnorm = dev.leaf(Type::F32, {K}, wn.data(), true);
    std::vector<uint8_t> wq_bytes(static_cast<size_t>(moe::row_bytes(Type::Q8_0, K)) * N);
    for (int64_t r = 0; r < N; ++r) {
        const std::vector<float> row = random_f32(rng, K, -1.0f, 1.0f);
        moe::traits(Type::Q8_0).from_float(row.data(), wq_bytes.data() + r * moe::row_bytes(Type::Q8_0, K), K);
    }
    Tensor* wq = dev.leaf(Type::Q8_0, {K, N}, wq_bytes.data(), true);
    // A KV cache with random history.
    const std::vector<uint16_t> kc = random_f16(rng, static_cast<size_t>(D * Hkv * kCtx));
    const std::vector<uint16_t> vc = random_f16(rng, static_cast<size_t>(D * Hkv * kCtx));
    Tensor* kcache = dev.leaf(Type::F16, {D, Hkv, kCtx}, kc.data(), false);
    Tensor* vcache = dev.leaf(Type::F16, {D, Hkv, kCtx}, vc.data(), false);
    void* arenas[2] = {nullptr, nullptr};
    size_t arena_size = 0;

    moe::RopeParams rp;
    rp.n_dims = D;
    rp.freq_base = 10000.0f;
    // Small steps keep the attention kernel's split (the graph's shape: update in place), big jumps
    // change it (re-instantiation); arenas alternate, so every pointer moves every run.
    const int n_pasts[] = {5, 6, 7, 300, 301, 700, 701, 702};
    int run = 0;
    const moe::cuda::GraphStats before = dev.be().graph_stats();
    for (const int n_past : n_pasts) {
        const int n_kv = n_past + static_cast<int>(T);
        moe::Graph g;
        Tensor* x = g.input(Type::F32, {K, T}, "x");
        Tensor* q = g.input(Type::F32, {D, H, T}, "q");
        Tensor* k = g.input(Type::F32, {D, Hkv, T}, "k");
        Tensor* v = g.input(Type::F32, {D, Hkv, T}, "v");
        Tensor* pos = g.input(Type::I32, {T}, "pos");
        Tensor* y = g.mul_mat(wq, g.rms_norm(x, wnorm, 1e-6f));
        g.set_output(g.softmax(g.add(g.silu(y), y)));
        auto rows = [&](Tensor* cache, int first, int count) {
            return g.view(cache, {D, Hkv, count}, {cache->nb[1], cache->nb[2]},
                          static_cast<size_t>(first) * cache->nb[2]);
        };
        Tensor* qr = g.rope(q, pos, rp);
        g.cpy(g.rope(k, pos, rp), rows(kcache, n_past, static_cast<int>(T)));
        g.cpy(v, rows(vcache, n_past, static_cast<int>(T)));
        g.set_output(g.attention(qr, rows(kcache, 0, n_kv), rows(vcache, 0, n_kv), pos, nullptr, 0.125f, 0, n_kv));

        const moe::AllocPlan plan = moe::plan_allocation(g);
        if (arenas[0] == nullptr) {
            arena_size = plan.arena_size;
            arenas[0] = dev.alloc(arena_size);
            arenas[1] = dev.alloc(arena_size);
        }
        REQUIRE(plan.arena_size <= arena_size);
        moe::bind_allocation(g, plan, arenas[run % 2]);
        const std::vector<float> xs = random_f32(rng, K * T, -2.0f, 2.0f);
        const std::vector<float> qs = random_f32(rng, D * H * T, -1.0f, 1.0f);
        const std::vector<float> ks = random_f32(rng, D * Hkv * T, -1.0f, 1.0f);
        const std::vector<float> vs = random_f32(rng, D * Hkv * T, -1.0f, 1.0f);
        std::vector<int32_t> ps(T);
        for (int i = 0; i < T; ++i) ps[static_cast<size_t>(i)] = n_past + i;
        const auto upload = [&] {
            dev.upload(x->data, xs.data(), x->n_bytes());
            dev.upload(q->data, qs.data(), q->n_bytes());
            dev.upload(k->data, ks.data(), k->n_bytes());
            dev.upload(v->data, vs.data(), v->n_bytes());
            dev.upload(pos->data, ps.data(), pos->n_bytes());
        };
        INFO("run " << run << ", n_past " << n_past);
        check_graph_matches_eager(dev, g, upload);
        if (run + 1 == static_cast<int>(std::size(n_pasts))) {
            // The very same span again: replayed without a capture.
            const uint64_t replays = dev.be().graph_stats().replays;
            check_graph_matches_eager(dev, g, upload);
            CHECK(dev.be().graph_stats().replays > replays);
        }
        ++run;
    }
    const moe::cuda::GraphStats& s = dev.be().graph_stats();
    CHECK(s.instantiations > before.instantiations);
    CHECK(s.updates > before.updates);  // arguments changed in place
    CHECK(s.failures == before.failures);
    if (merge == Merge::kAlways) {
        CHECK(s.merged_spans > before.merged_spans);
        CHECK(s.eager_nodes == before.eager_nodes);  // every node in a graph
    } else {
        CHECK(s.merged_spans == before.merged_spans);
    }
}

TEST_CASE("CUDA graphs cut long spans into chunks and replay them bitwise", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    auto rng = fresh_rng(102);
    constexpr int64_t n = 3000;
    const std::vector<float> bs = random_f32(rng, n, -1.0f, 1.0f);
    Tensor* b = dev.leaf(Type::F32, {n}, bs.data(), true);
    moe::Graph g;
    Tensor* x = g.input(Type::F32, {n}, "x");
    Tensor* y = x;
    for (int i = 0; i < 300; ++i) y = (i % 3 == 2) ? g.mul(y, b) : g.add(y, b);  // > 2 chunks of 128
    g.set_output(y);
    const moe::AllocPlan plan = moe::plan_allocation(g);
    moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
    for (int rep = 0; rep < 3; ++rep) {
        const std::vector<float> xs = random_f32(rng, n, -1.0f, 1.0f);
        INFO("rep " << rep);
        check_graph_matches_eager(dev, g, [&] { dev.upload(x->data, xs.data(), x->n_bytes()); });
    }
    const moe::cuda::GraphStats& s = dev.be().graph_stats();
    CHECK(s.instantiations >= 3);
    CHECK(s.replays >= 6);  // reps 2 and 3 replay every chunk
    CHECK(s.eager_nodes == 0);
}

TEST_CASE("CUDA graphs report node errors and device-detected errors as eager launches do", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    auto rng = fresh_rng(103);
    dev.be().set_graphs_enabled(true);
    constexpr int64_t K = 64, R = 10;
    const std::vector<float> ws = random_f32(rng, K * R, -1.0f, 1.0f);
    Tensor* w = dev.leaf(Type::F32, {K, R}, ws.data(), true);

    // An out-of-range id inside a captured span: OUT_OF_RANGE at synchronize, on the first run
    // (captured) and on the replay.
    {
        moe::Graph g;
        Tensor* ids = g.input(Type::I32, {3}, "ids");
        Tensor* rows = g.get_rows(w, ids);
        g.set_output(g.silu(g.add(rows, rows)));
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const int32_t bad[3] = {1, static_cast<int32_t>(R), 2};
        dev.upload(ids->data, bad, sizeof bad);
        for (int rep = 0; rep < 2; ++rep) {
            INFO("rep " << rep);
            require_ok(dev.be().compute(g.nodes()));
            CHECK(dev.be().synchronize().code() == MOE_STATUS_OUT_OF_RANGE);
            require_ok(dev.be().synchronize());  // reported once, then cleared
        }
        CHECK(dev.be().graph_stats().replays >= 1);
    }

    // A node the kernels refuse (SOFTMAX into a dst of another shape) in the middle of a span: the
    // same Status as without graphs, and the stream is usable afterwards.
    Tensor* x = dev.leaf(Type::F32, {16, 2}, ws.data(), false);
    moe::Graph bad;
    Tensor* a = bad.add(x, x);
    Tensor* sm = bad.softmax(a);
    sm->ne[1] = 3;  // shape mismatch
    bad.silu(a);
    const moe::AllocPlan plan = moe::plan_allocation(bad);
    moe::bind_allocation(bad, plan, dev.alloc(plan.arena_size * 2));
    for (const bool graphs : {false, true}) {
        dev.be().set_graphs_enabled(graphs);
        const Status s = dev.be().compute(bad.nodes());
        INFO("graphs " << graphs << ": " << s.message());
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(s.message().find("SOFTMAX") != std::string::npos);
        require_ok(dev.be().synchronize());
    }
    moe::Graph good;
    good.set_output(good.silu(good.add(x, x)));
    good.set_output(good.mul(x, x));
    const moe::AllocPlan gp = moe::plan_allocation(good);
    moe::bind_allocation(good, gp, dev.alloc(gp.arena_size));
    check_graph_matches_eager(dev, good, [] {});
}

TEST_CASE("CUDA span signatures separate what changes per step from what identifies a span", "[cuda]") {
    using moe::Tensor;
    Tensor w, x, y;
    w.is_weight = true;
    w.data = reinterpret_cast<void*>(uintptr_t{0x1000});
    x.data = reinterpret_cast<void*>(uintptr_t{0x2000});
    y.op = moe::Op::MUL_MAT;
    y.src[0] = &w;
    y.src[1] = &x;
    y.data = reinterpret_cast<void*>(uintptr_t{0x3000});
    Tensor* nodes[] = {&y};
    moe::cuda::SpanSignature a, b;
    a.build(nodes);
    b.build(nodes);
    CHECK(a.identity() == b.identity());
    CHECK(a.node_hash(0) == b.node_hash(0));
    CHECK(std::ranges::equal(a.words(0, 1), b.words(0, 1)));

    // Per-step changes: an activation pointer, a src shape, a param. Words change, identity stays.
    const auto changed = [&](auto&& mutate) {
        Tensor w2 = w, x2 = x, y2 = y;
        y2.src[0] = &w2;
        y2.src[1] = &x2;
        mutate(w2, x2, y2);
        Tensor* n2[] = {&y2};
        moe::cuda::SpanSignature c;
        c.build(n2);
        return std::make_pair(!std::ranges::equal(a.words(0, 1), c.words(0, 1)), c.identity() != a.identity());
    };
    CHECK(changed([](Tensor&, Tensor& x2, Tensor&) { x2.data = reinterpret_cast<void*>(uintptr_t{0x2100}); }) ==
          std::make_pair(true, false));
    CHECK(changed([](Tensor&, Tensor& x2, Tensor&) { x2.ne[2] = 7; }) == std::make_pair(true, false));
    CHECK(changed([](Tensor&, Tensor&, Tensor& y2) { y2.params.i[1] = 42; }) == std::make_pair(true, false));
    CHECK(changed([](Tensor&, Tensor&, Tensor& y2) { y2.data = reinterpret_cast<void*>(uintptr_t{0x3100}); }) ==
          std::make_pair(true, false));
    // Another weight, another dst shape, another op: another span.
    CHECK(changed([](Tensor& w2, Tensor&, Tensor&) { w2.data = reinterpret_cast<void*>(uintptr_t{0x1100}); }) ==
          std::make_pair(true, true));
    CHECK(changed([](Tensor&, Tensor&, Tensor& y2) { y2.ne[1] = 5; }) == std::make_pair(true, true));
    CHECK(changed([](Tensor&, Tensor&, Tensor& y2) { y2.op = moe::Op::MUL_MAT_ID; }) == std::make_pair(true, true));
    // A missing src differs from a present one with null data and default shape.
    Tensor empty;
    CHECK(changed([&](Tensor&, Tensor&, Tensor& y2) { y2.src[2] = &empty; }).first);
}
#endif
