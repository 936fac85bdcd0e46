// Graph building and activation memory planning: a planned tensor's memory must never be shared
// with another tensor that is alive at the same time.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "core/allocator.h"
#include "core/graph.h"

using namespace moe;

namespace {

// Index range [first write, last read] of each tensor that owns planned memory.
struct Interval {
    size_t begin, end;
};

void check_no_overlap(const Graph& g, const AllocPlan& plan) {
    const auto& nodes = g.nodes();
    std::unordered_map<const Tensor*, Interval> live;
    for (const auto& [t, off] : plan.offsets) live[t] = {t->op == Op::NONE ? 0 : SIZE_MAX, 0};
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Tensor* s = storage_of(nodes[i]);
        if (auto it = live.find(s); it != live.end()) {
            it->second.begin = std::min(it->second.begin, i);
            it->second.end = std::max(it->second.end, i);
        }
        for (const Tensor* src : nodes[i]->src) {
            if (src == nullptr) continue;
            if (auto it = live.find(storage_of(src)); it != live.end()) it->second.end = std::max(it->second.end, i);
        }
    }
    for (const auto& [t, iv] : live) {
        if (t->is_output) live[t].end = nodes.size();
    }
    for (const auto& [a, ia] : live) {
        for (const auto& [b, ib] : live) {
            if (a >= b) continue;
            const bool time_overlap = ia.begin <= ib.end && ib.begin <= ia.end;
            const size_t a0 = plan.offsets.at(a), a1 = a0 + a->n_bytes();
            const size_t b0 = plan.offsets.at(b), b1 = b0 + b->n_bytes();
            const bool mem_overlap = a0 < b1 && b0 < a1;
            INFO(a->name << " [" << a0 << "," << a1 << ") live " << ia.begin << ".." << ia.end << " vs " << b->name
                         << " [" << b0 << "," << b1 << ") live " << ib.begin << ".." << ib.end);
            CHECK_FALSE((time_overlap && mem_overlap));
        }
    }
    for (const auto& [t, off] : plan.offsets) {
        CHECK(off % kTensorAlignment == 0);
        CHECK(off + t->n_bytes() <= plan.arena_size);
    }
}

}  // namespace

TEST_CASE("allocator reuses memory without overlapping live tensors", "[graph]") {
    std::mt19937 rng(std::random_device{}());
    for (int trial = 0; trial < 20; ++trial) {
        Graph g;
        std::uniform_int_distribution<int> dim(1, 40);
        const int64_t k = 32 * dim(rng);
        const int64_t t = dim(rng);
        Tensor* x = g.input(Type::F32, {k, t}, "x");
        std::vector<Tensor*> pool{x};
        const int n_ops = 5 + dim(rng);
        for (int i = 0; i < n_ops; ++i) {
            std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
            Tensor* a = pool[pick(rng)];
            Tensor* b = pool[pick(rng)];
            Tensor* r = nullptr;
            switch (rng() % 4) {
                case 0: r = g.add(a, b); break;
                case 1: r = g.mul(a, b); break;
                case 2: r = g.silu(a); break;
                default: r = g.rms_norm(a, nullptr, 1e-6f); break;
            }
            r->name = std::string("n").append(std::to_string(i));  // (not "n" + ...: GCC 12 false -Wrestrict)
            pool.push_back(r);
        }
        g.set_output(pool.back());
        const AllocPlan plan = plan_allocation(g);
        check_no_overlap(g, plan);
        // Reuse must actually happen in long chains: the arena is smaller than the sum of all tensors.
        size_t total = 0;
        for (const auto& [tt, off] : plan.offsets) total += tt->n_bytes();
        CHECK(plan.arena_size <= total + kTensorAlignment * plan.offsets.size());
    }
}

TEST_CASE("a chain of elementwise ops needs only two live buffers", "[graph]") {
    Graph g;
    Tensor* cur = g.input(Type::F32, {64, 8}, "x");
    for (int i = 0; i < 10; ++i) cur = g.silu(cur);
    g.set_output(cur);
    const AllocPlan plan = plan_allocation(g);
    check_no_overlap(g, plan);
    CHECK(plan.arena_size == 2 * 64 * 8 * sizeof(float));
}

TEST_CASE("views share their source's memory and extend its lifetime", "[graph]") {
    Graph g;
    Tensor* x = g.input(Type::F32, {32, 4}, "x");
    Tensor* a = g.silu(x);
    Tensor* v = g.reshape(a, {128});
    Tensor* b = g.silu(g.silu(x));  // must not reuse a's memory: v reads it later
    Tensor* c = g.add(g.reshape(b, {128}), v);
    g.set_output(c);
    const AllocPlan plan = plan_allocation(g);
    CHECK(plan.offsets.count(v) == 0);
    check_no_overlap(g, plan);
    std::vector<float> arena(plan.arena_size / sizeof(float) + 16);
    bind_allocation(g, plan, arena.data());
    CHECK(v->data == a->data);
}
