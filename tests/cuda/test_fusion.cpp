// Fused launches of the CUDA backend (lib/cuda/fusion_plan.h).
//
// Without a device ("[cuda]"): the planner on the real decode and prefill graphs of both
// architectures (real layer shapes, the allocator's real memory reuse, fake addresses) fuses what it
// should (q/k/v, residual add + norm, the router, Q8 activations handed from norms to products), and
// on hand-made spans refuses what would change results (a node that overwrites the norm's result
// before its reader, outputs that overlap).
//
// On a device ("[gpu]"): spans and whole contexts computed with fusion give bitwise the results of
// the same backend without fusion (each fused kernel uses the unfused kernels' arithmetic; the unfused
// kernels are compared with the CPU in test_backend_ops.cpp / test_matmul_cuda.cpp), on fresh random
// inputs per run, odd sizes included; the fusion counters prove the fused paths ran.
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/graph.h"
#include "core/models/model_graph.h"
#include "context_pair.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "cuda/fusion_plan.h"
#include "cuda/graph_signature.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using moe::Op;
using moe::Status;
using moe::Tensor;
using moe::Type;
using moe::test::CudaContextPair;
using moe::test::Device;
using moe::test::kPairSteps;
using moe::test::random_f32;
using moe::test::require_ok;
using moe::test::run_seed;
using moe::test::pair_model_options;
using moe::test::TinyModel;
using moe::cuda::FusedKind;

// ---- the planner on model graphs (no device) ----

// Weights and caches with fake addresses (the planner never dereferences data).
class FakeLeaves {
public:
    Tensor* make(Type type, std::initializer_list<int64_t> ne) {
        Tensor& t = leaves_.emplace_back();
        const std::vector<int64_t> v(ne);
        moe::set_shape(t, type, static_cast<int>(v.size()), v.data());
        t.data = reinterpret_cast<void*>(next_);
        next_ += (t.n_bytes() + 4095) & ~uintptr_t{4095};
        t.is_weight = true;
        return &t;
    }

private:
    std::deque<Tensor> leaves_;
    uintptr_t next_ = uintptr_t{1} << 40;
};

moe::HParams q30_hparams(int layers) {
    moe::HParams hp;
    hp.arch = moe::Arch::QWEN3MOE;
    hp.n_layer = layers;
    hp.n_embd = 2048;
    hp.n_vocab = 1000;
    hp.n_head = 32;
    hp.n_head_kv = 4;
    hp.head_dim = 128;
    hp.n_expert = 128;
    hp.n_expert_used = 8;
    hp.n_ff_expert = 768;
    hp.rope_freq_base = 1e6f;
    return hp;
}

moe::HParams g20_hparams(int layers) {
    moe::HParams hp;
    hp.arch = moe::Arch::GPT_OSS;
    hp.n_layer = layers;
    hp.n_embd = 2880;
    hp.n_vocab = 1000;
    hp.n_head = 64;
    hp.n_head_kv = 8;
    hp.head_dim = 64;
    hp.n_expert = 32;
    hp.n_expert_used = 4;
    hp.n_ff_expert = 2880;
    hp.sliding_window = 128;
    hp.rope_freq_base = 150000.0f;
    hp.rope_yarn_factor = 32.0f;
    hp.rope_yarn_orig_ctx = 4096;
    return hp;
}

moe::ModelWeights fake_weights(const moe::HParams& hp, Type dense, Type experts, FakeLeaves& f) {
    const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;
    const int64_t X = hp.n_expert, F = hp.n_ff_expert;
    const bool oss = hp.arch == moe::Arch::GPT_OSS;
    moe::ModelWeights w;
    w.tok_embd = f.make(dense, {E, V});
    w.output_norm = f.make(Type::F32, {E});
    w.output = f.make(dense, {E, V});
    w.layers.resize(static_cast<size_t>(hp.n_layer));
    for (moe::LayerWeights& l : w.layers) {
        l.attn_norm = f.make(Type::F32, {E});
        l.wq = f.make(dense, {E, H * D});
        l.wk = f.make(dense, {E, Hkv * D});
        l.wv = f.make(dense, {E, Hkv * D});
        l.wo = f.make(dense, {H * D, E});
        l.router = f.make(Type::F32, {E, X});
        l.up_exps = f.make(experts, {E, F, X});
        l.gate_exps = f.make(experts, {E, F, X});
        l.down_exps = f.make(experts, {F, E, X});
        l.ffn_norm = f.make(Type::F32, {E});
        if (oss) {
            l.bq = f.make(Type::F32, {H * D});
            l.bk = f.make(Type::F32, {Hkv * D});
            l.bv = f.make(Type::F32, {Hkv * D});
            l.bo = f.make(Type::F32, {E});
            l.sinks = f.make(Type::F32, {H});
            l.router_bias = f.make(Type::F32, {X});
            l.up_exps_bias = f.make(Type::F32, {F, X});
            l.gate_exps_bias = f.make(Type::F32, {F, X});
            l.down_exps_bias = f.make(Type::F32, {E, X});
        } else {
            l.q_norm = f.make(Type::F32, {D});
            l.k_norm = f.make(Type::F32, {D});
        }
    }
    return w;
}

struct PlanCounts {
    int items = 0, nodes = 0;
    std::map<FusedKind, int> kinds;
    int q8_in = 0, q8_out = 0;
    int route_reuse = 0;  // down products that take their up/gate product's expert route
    int cuts = 0;
    int step_cuts = 0;  // where the backend cuts a step (step_cut_after)
    std::string layer0;  // the item sequence of the first layer, for the failure message
};

PlanCounts plan_model(const moe::HParams& hp, Type dense, Type experts, int n_tokens, int n_past) {
    FakeLeaves f;
    const moe::ModelWeights w = fake_weights(hp, dense, experts, f);
    moe::KvCache kv;
    kv.n_ctx = 512;
    for (int il = 0; il < hp.n_layer; ++il) {
        kv.k.push_back(f.make(Type::F16, {hp.head_dim, hp.n_head_kv, kv.n_ctx}));
        kv.v.push_back(f.make(Type::F16, {hp.head_dim, hp.n_head_kv, kv.n_ctx}));
    }
    moe::Graph g;
    moe::build_model_graph(g, hp, w, kv, n_tokens, n_past, moe::LogitsMode::LAST);
    const moe::AllocPlan alloc = moe::plan_allocation(g);
    moe::bind_allocation(g, alloc, reinterpret_cast<void*>(uintptr_t{1} << 44));
    std::vector<Tensor*> nodes;
    for (Tensor* n : g.nodes()) {
        if (n->op != Op::NONE && n->op != Op::VIEW) nodes.push_back(n);
    }
    moe::cuda::FusionPlan plan;
    moe::cuda::plan_fusions(nodes, true, plan);
    PlanCounts c;
    c.nodes = static_cast<int>(nodes.size());
    c.items = static_cast<int>(plan.items.size());
    static const char* const kind_names[moe::cuda::kFusedKinds] = {
        "", "group", "chain", "router", "prep", "moe_bias", "router_gemv", "dense_group", "sigmoid_router"};
    for (const moe::cuda::LaunchItem& it : plan.items) {
        ++c.kinds[it.kind];
        c.q8_in += it.q8_in >= 0;
        c.q8_out += it.q8_out >= 0;
        if (it.node->layer == 0) {
            c.layer0 += std::string(" ") + (it.kind == FusedKind::kNone ? moe::op_name(it.node->op)
                                                                         : kind_names[static_cast<int>(it.kind)]);
            if (it.q8_in >= 0) c.layer0 += "<q8";
            if (it.q8_out >= 0) c.layer0 += ">q8";
        }
    }
    // CudaBackend::cut_after holds: a node where spans are cut (span_cut_after) ends its launch, no Q8
    // hand-off crosses it and no down product takes a route across it (a span cut there plans the same).
    int last_cut = -1;
    std::map<int, int> slot_producer;  // slot -> item index of its latest producer
    for (size_t k = 0; k < plan.items.size(); ++k) {
        const moe::cuda::LaunchItem& it = plan.items[k];
        for (int p = 0; p + 1 < it.n_part; ++p) CHECK_FALSE(moe::cuda::span_cut_after(*it.part[static_cast<size_t>(p)]));
        if (it.q8_in >= 0) CHECK(slot_producer.at(it.q8_in) > last_cut);
        if (it.q8_out >= 0) slot_producer[it.q8_out] = static_cast<int>(k);
        if (it.route_from_prev) {
            ++c.route_reuse;
            CHECK(it.node->op == Op::MUL_MAT_ID);
            CHECK(last_cut < static_cast<int>(k) - 1);
        }
        if (moe::cuda::span_cut_after(*it.part[static_cast<size_t>(it.n_part - 1)])) {
            last_cut = static_cast<int>(k);
            ++c.cuts;
        }
        for (int p = 0; p < it.n_part; ++p) c.step_cuts += moe::cuda::step_cut_after(*it.part[static_cast<size_t>(p)]);
    }
    // Decode cuts after each up/gate GEMV, prefills after each down product: one cut per layer.
    CHECK(c.cuts == hp.n_layer);
    // The backend cuts at those of layers 0, 1, 3, 7, ...: floor(log2(layers)) + 1 of them.
    int doublings = 0;
    for (int l = 1; l <= hp.n_layer; l *= 2) ++doublings;
    CHECK(c.step_cuts == doublings);
    // Every node is launched exactly once.
    int parts = 0;
    for (const moe::cuda::LaunchItem& it : plan.items) parts += it.n_part;
    CHECK(parts == c.nodes);
    // Disabled: one launch per node.
    moe::cuda::FusionPlan off;
    moe::cuda::plan_fusions(nodes, false, off);
    CHECK(off.items.size() == nodes.size());
    CHECK(off.n_slots == 0);
    return c;
}

}  // namespace

// What KvAddressing::STABLE is for: the words of every launch of a decode step (graph_signature.h: what
// a CUDA graph replays without capturing) are the same from one token to the next, until the attended
// length crosses a multiple of kKvPad; with EXACT the cache writes and the attention change every token.
// The fused attention prologue still takes the cache writes with rows.
TEST_CASE("CUDA decode steps with the stable KV addressing launch the same words for 256 tokens", "[cuda]") {
    for (const moe::HParams& hp : {q30_hparams(2), g20_hparams(2)}) {
        INFO("arch " << static_cast<int>(hp.arch));
        FakeLeaves f;
        const moe::ModelWeights w = fake_weights(hp, Type::Q8_0, Type::Q8_0, f);
        moe::KvCache kv;
        kv.n_ctx = 1024;
        for (int il = 0; il < hp.n_layer; ++il) {
            kv.k.push_back(f.make(Type::F16, {hp.head_dim, hp.n_head_kv, kv.n_ctx}));
            kv.v.push_back(f.make(Type::F16, {hp.head_dim, hp.n_head_kv, kv.n_ctx}));
        }
        struct Step {
            std::vector<uint64_t> hashes;
            std::vector<Op> ops;
            int prologues = 0;  // kAttnPrep launches
        };
        const auto step_at = [&](int n_past, moe::KvAddressing addressing) {
            moe::Graph g;
            moe::build_model_graph(g, hp, w, kv, 1, n_past, moe::LogitsMode::LAST, addressing);
            moe::bind_allocation(g, moe::plan_allocation(g), reinterpret_cast<void*>(uintptr_t{1} << 44));
            std::vector<Tensor*> nodes;
            for (Tensor* n : g.nodes()) {
                if (n->op != Op::NONE && n->op != Op::VIEW) nodes.push_back(n);
            }
            moe::cuda::SpanSignature sig;
            sig.build(nodes);
            moe::cuda::FusionPlan plan;
            moe::cuda::plan_fusions(nodes, true, plan);
            Step s;
            for (size_t i = 0; i < nodes.size(); ++i) {
                s.hashes.push_back(sig.node_hash(i));
                s.ops.push_back(nodes[i]->op);
            }
            for (const moe::cuda::LaunchItem& it : plan.items) s.prologues += it.kind == FusedKind::kAttnPrep;
            return s;
        };
        // The nodes whose words differ between two steps, by op.
        const auto changed = [](const Step& a, const Step& b) {
            REQUIRE(a.ops == b.ops);
            std::map<Op, int> ops;
            for (size_t i = 0; i < a.ops.size(); ++i) ops[a.ops[i]] += a.hashes[i] != b.hashes[i];
            std::erase_if(ops, [](const auto& kv_) { return kv_.second == 0; });
            return ops;
        };
        using Exact = std::map<Op, int>;
        const int L = hp.n_layer;
        const Step e37 = step_at(37, moe::KvAddressing::EXACT), e38 = step_at(38, moe::KvAddressing::EXACT);
        CHECK(changed(e37, e38) == Exact{{Op::CPY, 2 * L}, {Op::ATTENTION, L}});
        const Step s37 = step_at(37, moe::KvAddressing::STABLE);
        CHECK(changed(s37, step_at(38, moe::KvAddressing::STABLE)).empty());
        CHECK(changed(s37, step_at(255, moe::KvAddressing::STABLE)).empty());  // 256 rows: still 256
        CHECK(changed(s37, step_at(256, moe::KvAddressing::STABLE)) == Exact{{Op::ATTENTION, L}});  // 257: 512
        // The same launches either way: the prologue fuses the cache writes with rows too.
        CHECK(s37.ops == e37.ops);
        CHECK(s37.prologues == L);
        CHECK(e37.prologues == L);
    }
}

TEST_CASE("CUDA fusion plans of real decode graphs fuse q/k/v, norms, routers and Q8 hand-offs", "[cuda]") {
    constexpr int kLayers = 3;
    {
        const PlanCounts c = plan_model(q30_hparams(kLayers), Type::Q8_0, Type::Q8_0, 1, 37);
        INFO("qwen3moe decode, layer 0:" << c.layer0);
        // Per layer: q/k/v as one group, the output projection with the residual add in its epilogue
        // (a one-row add is a bias row), the router, the norms with their residual adds (the first
        // attention norm alone; the last layer's chain ends in the output norm), and Q8 activations for
        // q/k/v, the output projection (from the attention) and the experts' up/gate in every layer,
        // and for the output product.
        CHECK(c.kinds.at(FusedKind::kGemvGroup) == 2 * kLayers);
        CHECK(c.kinds.at(FusedKind::kRouterGemv) == kLayers);  // the router's product selects in its last block
        CHECK(c.kinds.count(FusedKind::kRouter) == 0);
        CHECK(c.kinds.at(FusedKind::kRowChain) == 2 * kLayers + 1);
        CHECK(c.kinds.at(FusedKind::kAttnPrep) == kLayers);  // q/k norms, ropes, cache writes
        // Q8 rows: the two norms and the attention per layer, and the output norm.
        CHECK(c.q8_out == 3 * kLayers + 1);
        CHECK(c.q8_in == 3 * kLayers + 1);
        // 22 nodes per layer, 9 launches: chain, group, prep, attention, group, chain, router product
        // with the selection, up/gate, down; plus the embedding, the first norm and the output product.
        CHECK(c.nodes == 22 * kLayers + 3);
        CHECK(c.items == 9 * kLayers + 3);
        CHECK(c.kinds.count(FusedKind::kMoeBias) == 0);  // no expert biases
        CHECK(c.route_reuse == 0);                         // GEMVs: no routes
    }
    {
        const PlanCounts c = plan_model(g20_hparams(kLayers), Type::Q8_0, Type::MXFP4, 1, 300);
        INFO("gpt-oss decode, layer 0:" << c.layer0);
        CHECK(c.kinds.at(FusedKind::kRouterGemv) == kLayers);  // with the router's bias add
        CHECK(c.kinds.count(FusedKind::kRouter) == 0);
        CHECK(c.kinds.at(FusedKind::kRowChain) == 2 * kLayers + 1);
        CHECK(c.q8_in >= 3 * kLayers + 1);
        // The bias adds of q, k, v and the output projection ride in GEMV epilogues; q, k and v are one
        // launch although the memory plan gives k's product q's dead bytes (q's product is not written).
        CHECK(c.kinds.at(FusedKind::kGemvGroup) == 2 * kLayers);
        CHECK(c.kinds.at(FusedKind::kAttnPrep) == kLayers);  // ropes, cache writes
        // The down projection picks and adds its experts' bias rows in the GEMV epilogue.
        CHECK(c.kinds.at(FusedKind::kMoeBias) == kLayers);
        CHECK(c.items <= c.nodes - 14 * kLayers);
    }
    {
        // Prefill: GEMM-sized batches get no GEMV groups, and the long-row chains still run (several
        // blocks: only where outputs and inputs are disjoint or the same rows). The last token's
        // output norm hands its Q8 row to the output product.
        const PlanCounts c = plan_model(q30_hparams(kLayers), Type::Q8_0, Type::Q8_0, 40, 0);
        INFO("qwen3moe prefill, layer 0:" << c.layer0);
        CHECK(c.kinds.count(FusedKind::kGemvGroup) == 0);
        CHECK(c.q8_in == 1);
        CHECK(c.q8_out == 1);
        CHECK(c.kinds.count(FusedKind::kRouter) == 0);  // 40 tokens: more than one block of warps
        CHECK(c.kinds.count(FusedKind::kMoeBias) == 0);
        CHECK(c.kinds.at(FusedKind::kAttnPrep) == kLayers);  // a warp per (head, token) row: outputs apart
        CHECK(c.kinds.at(FusedKind::kRowChain) == 2 * kLayers + 1);
        CHECK(c.kinds.count(FusedKind::kDenseGroup) == 0);  // 40 tokens: the tensor-core kernel, no cuBLAS
        CHECK(c.route_reuse == kLayers);  // each down product takes its up/gate's expert route
    }
    {
        // A prefill ubatch on the dequantise + cuBLAS path: q, k and v as one group per layer.
        const PlanCounts c = plan_model(q30_hparams(kLayers), Type::Q8_0, Type::Q8_0, 300, 0);
        INFO("qwen3moe prefill of 300 tokens, layer 0:" << c.layer0);
        CHECK(c.kinds.at(FusedKind::kDenseGroup) == kLayers);
        CHECK(c.route_reuse == kLayers);
    }
    {
        const PlanCounts c = plan_model(g20_hparams(kLayers), Type::Q8_0, Type::MXFP4, 300, 0);
        INFO("gpt-oss prefill of 300 tokens, layer 0:" << c.layer0);
        CHECK(c.route_reuse == kLayers);
    }
}

TEST_CASE("CUDA fusion plans refuse what would change results", "[cuda]") {
    FakeLeaves f;
    Tensor* wn = f.make(Type::F32, {2048});
    Tensor* wq = f.make(Type::Q8_0, {2048, 512});
    Tensor* wk = f.make(Type::Q8_0, {2048, 128});
    const auto arena = [](moe::Graph& g) {
        const moe::AllocPlan a = moe::plan_allocation(g);
        moe::bind_allocation(g, a, reinterpret_cast<void*>(uintptr_t{1} << 44));
    };
    SECTION("a node between a norm and its reader overwrites the norm's result") {
        moe::Graph g;
        Tensor* x = g.input(Type::F32, {2048, 1}, "x");
        Tensor* n = g.rms_norm(x, wn, 1e-6f);
        Tensor* q = g.mul_mat(wq, n);
        Tensor* s = g.silu(x);  // writes n's bytes below
        Tensor* k = g.mul_mat(wk, n);
        g.set_output(q);
        g.set_output(k);
        g.set_output(s);
        arena(g);
        s->data = n->data;
        std::vector<Tensor*> nodes = {n, q, s, k};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 4);
        CHECK(plan.items[0].q8_out >= 0);
        CHECK(plan.items[1].q8_in == plan.items[0].q8_out);  // before the overwrite: reused
        CHECK(plan.items[3].q8_in < 0);                       // after it: quantised anew
    }
    SECTION("products whose outputs overlap are not grouped") {
        moe::Graph g;
        Tensor* x = g.input(Type::F32, {2048, 2}, "x");
        Tensor* q = g.mul_mat(wq, x);
        Tensor* k = g.mul_mat(wk, x);
        g.set_output(q);
        g.set_output(k);
        arena(g);
        std::vector<Tensor*> nodes = {q, k};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 1);
        CHECK(plan.items[0].kind == FusedKind::kGemvGroup);
        k->data = static_cast<uint8_t*>(q->data) + 64;  // now k's rows overlap q's
        moe::cuda::plan_fusions(nodes, true, plan);
        CHECK(plan.items.size() == 2);
    }
    SECTION("a multi-row chain whose output overlaps an input with other rows is not fused") {
        moe::Graph g;
        Tensor* a = g.input(Type::F32, {2048, 3}, "a");
        Tensor* b = g.input(Type::F32, {2048, 3}, "b");
        Tensor* s = g.add(a, b);
        Tensor* n = g.rms_norm(s, wn, 1e-6f);
        g.set_output(s);
        g.set_output(n);
        arena(g);
        std::vector<Tensor*> nodes = {s, n};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 1);
        CHECK(plan.items[0].kind == FusedKind::kRowChain);
        n->data = static_cast<uint8_t*>(a->data) + 4 * 2048;  // n's row 0 is a's row 1
        moe::cuda::plan_fusions(nodes, true, plan);
        CHECK(plan.items.size() == 2);
        n->data = a->data;  // the very same rows: fine
        moe::cuda::plan_fusions(nodes, true, plan);
        CHECK(plan.items.size() == 1);
    }
    SECTION("attention prologues run a warp per row only where no output meets another stream's rows") {
        // As many query heads as KV heads, so that any output could sit exactly on another stream's rows.
        constexpr int64_t kD = 128, kH = 4;
        Tensor* qn = f.make(Type::F32, {kD});
        Tensor* kn = f.make(Type::F32, {kD});
        Tensor* kc = f.make(Type::F16, {kD, kH, 64});
        Tensor* vc = f.make(Type::F16, {kD, kH, 64});
        moe::Graph g;
        Tensor* q = g.input(Type::F32, {kD, kH, 1}, "q");
        Tensor* k = g.input(Type::F32, {kD, kH, 1}, "k");
        Tensor* v = g.input(Type::F32, {kD, kH, 1}, "v");
        Tensor* pos = g.input(Type::I32, {1}, "pos");
        moe::RopeParams rp;
        rp.n_dims = kD;
        Tensor* nq = g.rms_norm(q, qn, 1e-6f);
        Tensor* nk = g.rms_norm(k, kn, 1e-6f);
        Tensor* rq = g.rope(nq, pos, rp);
        Tensor* rk = g.rope(nk, pos, rp);
        const auto rows = [&](Tensor* cache) { return g.view(cache, {kD, kH, 1}, {cache->nb[1], cache->nb[2]}, 0); };
        Tensor* ck = g.cpy(rk, rows(kc));
        Tensor* cv = g.cpy(v, rows(vc));
        for (Tensor* o : {q, k, v, nq, nk, rq, rk}) g.set_output(o);  // nothing reuses another's bytes
        arena(g);
        std::vector<Tensor*> nodes = {nq, nk, rq, rk, ck, cv};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 1);
        REQUIRE(plan.items[0].kind == FusedKind::kAttnPrep);
        const std::span<Tensor* const> parts(plan.items[0].part.data(), static_cast<size_t>(plan.items[0].n_part));
        CHECK(moe::cuda::attn_prep_rows_apart(parts));  // every output apart
        void* const saved_rq = rq->data;
        rq->data = nq->data;  // q's rope in place on q's norm: its own stream's rows
        CHECK(moe::cuda::attn_prep_rows_apart(parts));
        rq->data = saved_rq;
        void* const saved_nk = nk->data;
        nk->data = q->data;  // k's norm on q's input rows, which q's warps may not have read yet
        CHECK_FALSE(moe::cuda::attn_prep_rows_apart(parts));
        nk->data = saved_nk;
        void* const saved_ck = ck->data;
        ck->data = rq->data;  // the cache rows over q's rope result (F16 rows inside it)
        CHECK_FALSE(moe::cuda::attn_prep_rows_apart(parts));
        ck->data = saved_ck;
        cv->data = k->data;  // v's copy over k's input rows
        CHECK_FALSE(moe::cuda::attn_prep_rows_apart(parts));
    }
    SECTION("prefill prologues (more than one block's tokens) are fused only where the outputs lie apart") {
        constexpr int64_t kD = 64, kH = 2, kT = 8;
        Tensor* kc = f.make(Type::F16, {kD, kH, 64});
        moe::Graph g;
        Tensor* q = g.input(Type::F32, {kD, kH, kT}, "q");
        Tensor* k = g.input(Type::F32, {kD, kH, kT}, "k");
        Tensor* pos = g.input(Type::I32, {kT}, "pos");
        moe::RopeParams rp;
        rp.n_dims = kD;
        Tensor* rq = g.rope(q, pos, rp);
        Tensor* rk = g.rope(k, pos, rp);
        Tensor* ck = g.cpy(rk, g.view(kc, {kD, kH, kT}, {kc->nb[1], kc->nb[2]}, 0));
        for (Tensor* o : {q, k, rq, rk}) g.set_output(o);
        arena(g);
        std::vector<Tensor*> nodes = {rq, rk, ck};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 1);
        CHECK(plan.items[0].kind == FusedKind::kAttnPrep);
        rk->data = q->data;  // k's rope over q's input rows: only one block could order that, and 8 tokens need more
        moe::cuda::plan_fusions(nodes, true, plan);
        REQUIRE(plan.items.size() == 2);  // q's rope alone; k's rope and its copy apart from everything else
        CHECK(plan.items[0].kind == FusedKind::kNone);
        CHECK(plan.items[1].kind == FusedKind::kAttnPrep);
        CHECK(plan.items[1].n_part == 2);
    }
    SECTION("an attention prologue does not take a copy of another part's result that is not a rope") {
        constexpr int64_t kD = 64, kH = 2;
        Tensor* vc = f.make(Type::F32, {kD, kH, 8});
        moe::Graph g;
        Tensor* q = g.input(Type::F32, {kD, kH, 1}, "q");
        Tensor* pos = g.input(Type::I32, {1}, "pos");
        moe::RopeParams rp;
        rp.n_dims = kD;
        Tensor* nq = g.rms_norm(q, nullptr, 1e-6f);
        Tensor* rq = g.rope(nq, pos, rp);
        Tensor* cn = g.cpy(nq, g.view(vc, {kD, kH, 1}, {vc->nb[1], vc->nb[2]}, 0));  // copies the norm's result
        g.set_output(rq);
        arena(g);
        std::vector<Tensor*> nodes = {nq, rq, cn};
        moe::cuda::FusionPlan plan;
        moe::cuda::plan_fusions(nodes, true, plan);
        // The norm runs first on its own; the rope and the copy (of a finished result) may go together.
        REQUIRE(plan.items.size() == 2);
        CHECK(plan.items[0].node == nq);
        CHECK(plan.items[0].n_part == 1);
    }
}

// ---- on the device ----

namespace {

// A weight of `type` from random floats through the reference quantiser.
// Random weights [k, n] quantised to `type`; with n_expert > 1, experts [k, n, n_expert].
Tensor* random_weight(Device& dev, Type type, int64_t k, int64_t n, std::mt19937_64& rng, int64_t n_expert = 1) {
    const int64_t rows = n * n_expert;
    const std::vector<float> f = random_f32(rng, static_cast<size_t>(k * rows), -1.0f, 1.0f);
    std::vector<uint8_t> bytes(static_cast<size_t>(moe::row_bytes(type, k) * rows));
    moe::traits(type).from_float(f.data(), bytes.data(), k * rows);
    return n_expert == 1 ? dev.leaf(type, {k, n}, bytes.data()) : dev.leaf(type, {k, n, n_expert}, bytes.data());
}

// Runs g with fusion off, then on (outputs poisoned in between), graphs on; every output must be
// bitwise equal. Returns the fused run's launches as (kind, parts).
std::vector<std::pair<FusedKind, int>> check_fused_matches_unfused(Device& dev, moe::Graph& g,
                                                                   const std::function<void()>& upload) {
    dev.be().set_fusion_enabled(false);
    upload();
    require_ok(dev.be().compute(g.nodes()));
    std::vector<std::vector<uint8_t>> want;
    for (const Tensor* o : g.outputs()) want.push_back(dev.download(*o));
    for (const Tensor* o : g.outputs()) {
        const std::vector<uint8_t> nan(o->n_bytes(), 0xFF);
        dev.upload(o->data, nan.data(), nan.size());
    }
    dev.be().set_fusion_enabled(true);
    upload();
    require_ok(dev.be().compute(g.nodes()));
    require_ok(dev.be().synchronize());
    for (size_t i = 0; i < g.outputs().size(); ++i) {
        INFO("output " << i << " (" << moe::op_name(g.outputs()[i]->op) << "), seed " << run_seed());
        CHECK(dev.download(*g.outputs()[i]) == want[i]);
    }
    std::vector<std::pair<FusedKind, int>> items;
    for (const moe::cuda::LaunchItem& it : dev.be().last_plan().items) items.emplace_back(it.kind, it.n_part);
    return items;
}

}  // namespace

TEST_CASE("CUDA fused q/k/v products, norms and Q8 hand-offs match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 201);
    struct Case {
        int64_t k, nq, nk, rows;
        Type type;
        bool bias;
        bool keep = true;  // the products are outputs; false: only their bias adds read them, so the memory
                           // plan reuses their bytes within the group and the launch skips writing them
    };
    // Odd output counts (not multiples of the 4 rows of a GEMV block), K of 33 to 256 blocks, 1 to 8
    // activation rows, every weight type, with and without bias rows.
    const Case cases[] = {
        {2048, 4096, 512, 1, Type::Q8_0, false}, {2880, 4096, 514, 1, Type::MXFP4, true},
        {1056, 1030, 130, 3, Type::Q4_0, true},  {8192, 256, 36, 8, Type::Q8_0, false},
        {2048, 520, 260, 5, Type::F16, true},    {1088, 96, 64, 2, Type::F32, false},
        {2880, 4096, 512, 1, Type::Q8_0, true, false}, {2048, 520, 260, 3, Type::BF16, true, false},
    };
    for (const Case& c : cases) {
        INFO("k " << c.k << " nq " << c.nq << " nk " << c.nk << " rows " << c.rows << " " << moe::type_name(c.type)
                  << " bias " << c.bias);
        const std::vector<float> wn = random_f32(rng, static_cast<size_t>(c.k), 0.5f, 1.5f);
        Tensor* norm_w = dev.leaf(Type::F32, {c.k}, wn.data());
        Tensor* wq = random_weight(dev, c.type, c.k, c.nq, rng);
        Tensor* wk = random_weight(dev, c.type, c.k, c.nk, rng);
        Tensor* wv = random_weight(dev, c.type, c.k, c.nk, rng);
        Tensor* w2 = random_weight(dev, c.type, c.k, 96, rng);  // a second reader of the norm, two nodes later
        std::vector<Tensor*> biases;
        for (int64_t n : {c.nq, c.nk, c.nk}) {
            const std::vector<float> b = random_f32(rng, static_cast<size_t>(n), -1.0f, 1.0f);
            biases.push_back(dev.leaf(Type::F32, {n}, b.data()));
        }
        moe::Graph g;
        Tensor* a = g.input(Type::F32, {c.k, c.rows}, "a");
        Tensor* b = g.input(Type::F32, {c.k, c.rows}, "b");
        Tensor* s = g.add(a, b);
        Tensor* n = g.rms_norm(s, norm_w, 1e-6f);
        Tensor* wts[] = {wq, wk, wv};
        for (int i = 0; i < 3; ++i) {
            Tensor* y = g.mul_mat(wts[i], n);
            if (c.keep) g.set_output(y);
            if (c.bias) g.set_output(g.add(y, biases[static_cast<size_t>(i)]));
        }
        g.set_output(g.silu(s));
        g.set_output(g.mul_mat(w2, n));
        g.set_output(n);
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> av = random_f32(rng, static_cast<size_t>(c.k * c.rows), -3.0f, 3.0f);
        const std::vector<float> bv = random_f32(rng, static_cast<size_t>(c.k * c.rows), -3.0f, 3.0f);
        const auto items = check_fused_matches_unfused(dev, g, [&] {
            dev.upload(a->data, av.data(), a->n_bytes());
            dev.upload(b->data, bv.data(), b->n_bytes());
        });
        // add + norm; the three products (with their bias adds); silu; the second reader.
        REQUIRE(items.size() == 4);
        CHECK(items[0] == std::make_pair(FusedKind::kRowChain, 2));
        CHECK(items[1] == std::make_pair(FusedKind::kGemvGroup, c.bias ? 6 : 3));
        if (!c.keep) {  // the case is what it claims: a product's bytes reused inside the group, not written
            const moe::cuda::LaunchItem& it = dev.be().last_plan().items[1];
            std::array<bool, moe::cuda::kMaxParts> dead{};
            moe::cuda::group_dead_products(std::span<Tensor* const>(it.part.data(), static_cast<size_t>(it.n_part)),
                                           dead);
            CHECK(std::count(dead.begin(), dead.end(), true) >= 1);
        }
    }
    CHECK(dev.be().fusion_stats().q8_reused > 0);
}

TEST_CASE("CUDA prefill q/k/v products grouped on the dequantise + cuBLAS path match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 208);
    struct Case {
        int64_t k, nq, nk, rows;
        Type type;
    };
    // 256 to 300 activation rows (cuBLAS from 256 on), odd output counts, every dequantised weight type;
    // the last case fills the 64 MiB dequantisation tile with q alone.
    const Case cases[] = {{2048, 520, 130, 300, Type::Q8_0}, {1056, 1030, 66, 256, Type::Q4_0},
                          {2880, 512, 64, 257, Type::MXFP4}, {512, 96, 32, 300, Type::F16},
                          {4096, 8192, 520, 256, Type::Q8_0}};
    for (const Case& c : cases) {
        INFO("k " << c.k << " nq " << c.nq << " nk " << c.nk << " rows " << c.rows << " " << moe::type_name(c.type));
        Tensor* wts[] = {random_weight(dev, c.type, c.k, c.nq, rng), random_weight(dev, c.type, c.k, c.nk, rng),
                         random_weight(dev, c.type, c.k, c.nk, rng)};
        moe::Graph g;
        Tensor* a = g.input(Type::F32, {c.k, c.rows}, "a");
        Tensor* x = g.silu(a);
        for (Tensor* w : wts) g.set_output(g.mul_mat(w, x));
        g.set_output(x);
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> av = random_f32(rng, static_cast<size_t>(c.k * c.rows), -3.0f, 3.0f);
        const auto items = check_fused_matches_unfused(dev, g, [&] { dev.upload(a->data, av.data(), a->n_bytes()); });
        REQUIRE(items.size() == 2);  // silu; the three products
        CHECK(items[1] == std::make_pair(FusedKind::kDenseGroup, 3));
    }
}

TEST_CASE("CUDA prefill down products that take their up/gate product's expert route match unfused launches", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 209);
    struct Case {
        int64_t k, f, n, n_expert, n_used, tokens;
        Type type;
        bool bias;  // GPT-OSS: up / gate biases and SWIGLU_OAI
    };
    // Tensor-core sizes (from 9 tokens on), more pairs than one scan block, Qwen3's 128 experts.
    const Case cases[] = {{256, 64, 96, 6, 3, 33, Type::Q8_0, false}, {512, 96, 130, 128, 8, 300, Type::Q4_0, false},
                          {256, 64, 66, 32, 4, 257, Type::MXFP4, true}, {256, 64, 96, 6, 2, 700, Type::F16, false}};
    for (const Case& c : cases) {
        INFO("k " << c.k << " f " << c.f << " n " << c.n << " experts " << c.n_expert << " used " << c.n_used << " tokens "
                  << c.tokens << " " << moe::type_name(c.type) << " bias " << c.bias);
        Tensor* up = random_weight(dev, c.type, c.k, c.f, rng, c.n_expert);
        Tensor* gate = random_weight(dev, c.type, c.k, c.f, rng, c.n_expert);
        Tensor* down = random_weight(dev, c.type, c.f, c.n, rng, c.n_expert);
        Tensor* bu = nullptr;
        Tensor* bg = nullptr;
        if (c.bias) {
            const std::vector<float> b0 = random_f32(rng, static_cast<size_t>(c.f * c.n_expert), -1.0f, 1.0f);
            const std::vector<float> b1 = random_f32(rng, static_cast<size_t>(c.f * c.n_expert), -1.0f, 1.0f);
            bu = dev.leaf(Type::F32, {c.f, c.n_expert}, b0.data());
            bg = dev.leaf(Type::F32, {c.f, c.n_expert}, b1.data());
        }
        moe::Graph g;
        Tensor* a = g.input(Type::F32, {c.k, c.tokens}, "a");
        Tensor* ids = g.input(Type::I32, {c.n_used, c.tokens}, "ids");
        Tensor* x = g.silu(a);
        Tensor* h = g.moe_up_gate(up, gate, x, ids, bu, bg, c.bias ? moe::Activation::SWIGLU_OAI : moe::Activation::SILU);
        Tensor* y = g.mul_mat_id(down, h, ids);
        g.set_output(h);
        g.set_output(y);
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> av = random_f32(rng, static_cast<size_t>(c.k * c.tokens), -3.0f, 3.0f);
        std::vector<int32_t> iv(static_cast<size_t>(c.n_used * c.tokens));
        for (int64_t t = 0; t < c.tokens; ++t) {  // distinct experts per token
            std::vector<int32_t> all(static_cast<size_t>(c.n_expert));
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            std::copy_n(all.begin(), c.n_used, iv.begin() + t * c.n_used);
        }
        const auto upload = [&](const std::vector<int32_t>& idv) {
            dev.upload(a->data, av.data(), a->n_bytes());
            dev.upload(ids->data, idv.data(), ids->n_bytes());
        };
        const auto items = check_fused_matches_unfused(dev, g, [&] { upload(iv); });
        REQUIRE(items.size() == 3);  // silu, up/gate, down
        REQUIRE(dev.be().last_plan().items[2].route_from_prev);
        CHECK_FALSE(dev.be().last_plan().items[1].route_from_prev);

        // kNoExpert pairs (rows left as they were: whatever tensor last had those bytes, in both runs) and
        // ids out of range (an error, NaN rows in both products).
        std::vector<int32_t> odd = iv;
        for (int64_t p = 2; p < c.n_used * c.tokens; p += 5) odd[static_cast<size_t>(p)] = moe::kNoExpert;
        const int64_t bad0 = 1, bad1 = c.n_used * c.tokens - 1;
        odd[static_cast<size_t>(bad0)] = static_cast<int32_t>(c.n_expert);
        odd[static_cast<size_t>(bad1)] = -7;
        const auto n_valid = std::count_if(odd.begin(), odd.end(), [&](int32_t e) { return e >= 0 && e < c.n_expert; });
        std::vector<std::vector<uint8_t>> want;
        for (const bool fused : {false, true}) {
            dev.be().set_fusion_enabled(fused);
            dev.poison(*h);  // before the inputs: h and y may reuse their bytes
            dev.poison(*y);
            upload(odd);
            require_ok(dev.be().compute(g.nodes()));
            CHECK(dev.be().synchronize().code() == MOE_STATUS_OUT_OF_RANGE);
            if (!fused) {
                want = {dev.download(*h), dev.download(*y)};
                continue;
            }
            REQUIRE(dev.be().last_plan().items[2].route_from_prev);
            CHECK(dev.download(*h) == want[0]);
            CHECK(dev.download(*y) == want[1]);
        }
        std::vector<float> got(static_cast<size_t>(y->n_elements()));
        std::memcpy(got.data(), want[1].data(), y->n_bytes());
        int finite_rows = 0;
        for (int64_t p = 0; p < c.n_used * c.tokens; ++p) {
            bool all_nan = true, all_finite = true;
            for (int64_t r = 0; r < c.n; ++r) {
                const float v = got[static_cast<size_t>(p * c.n + r)];
                all_nan = all_nan && std::isnan(v);
                all_finite = all_finite && std::isfinite(v);
            }
            if (p == bad0 || p == bad1) {
                CHECK(all_nan);
            } else if (odd[static_cast<size_t>(p)] != moe::kNoExpert) {
                finite_rows += all_finite;
            }
        }
        CHECK(finite_rows == n_valid);
    }
}

TEST_CASE("CUDA fused weighted sums, residual adds, norms and routers match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 202);
    struct Case {
        int64_t n, k, t, n_expert;
        int32_t top;
    };
    // Rows of 1056 to 8192 floats, 1 to 33 tokens (several blocks; past 32 tokens the router runs
    // unfused), k of 1 to 8 experts per token, top-k up to 32, up to 300 experts (past 256 the router
    // reads the logits again each pass instead of keeping them in registers).
    const Case cases[] = {{2048, 8, 1, 128, 8}, {2880, 4, 1, 32, 4}, {1056, 3, 7, 40, 32},
                          {8192, 1, 2, 16, 1},  {4000, 8, 33, 64, 8}, {2048, 2, 3, 300, 8}};
    for (const Case& c : cases) {
        INFO("n " << c.n << " k " << c.k << " tokens " << c.t << " experts " << c.n_expert << " top " << c.top);
        const std::vector<float> wn = random_f32(rng, static_cast<size_t>(c.n), 0.5f, 1.5f);
        Tensor* norm_w = dev.leaf(Type::F32, {c.n}, wn.data());
        moe::Graph g;
        Tensor* y = g.input(Type::F32, {c.n, c.k, c.t}, "y");
        Tensor* p = g.input(Type::F32, {c.k, c.t}, "p");
        Tensor* cur = g.input(Type::F32, {c.n, c.t}, "cur");
        Tensor* logits = g.input(Type::F32, {c.n_expert, c.t}, "logits");
        Tensor* ids = g.topk(logits, c.top);
        Tensor* probs = g.softmax(g.gather(logits, ids));
        Tensor* ws = g.weighted_sum(y, p);
        Tensor* sum = g.add(cur, ws);
        Tensor* n = g.rms_norm(sum, norm_w, 1e-5f);
        g.set_output(ws);
        g.set_output(ids);
        g.set_output(probs);
        g.set_output(sum);
        g.set_output(n);
        // Later readers keep the inputs alive, so that no output reuses their bytes (several rows
        // are fused only where outputs and inputs are disjoint or the same rows).
        for (Tensor* in : {y, p, cur}) g.set_output(g.silu(in));
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> yv = random_f32(rng, static_cast<size_t>(c.n * c.k * c.t), -2.0f, 2.0f);
        const std::vector<float> pv = random_f32(rng, static_cast<size_t>(c.k * c.t), 0.0f, 1.0f);
        const std::vector<float> cv = random_f32(rng, static_cast<size_t>(c.n * c.t), -4.0f, 4.0f);
        std::vector<float> lv = random_f32(rng, static_cast<size_t>(c.n_expert * c.t), -5.0f, 5.0f);
        for (size_t i = 0; i < lv.size(); i += 5) lv[i] = lv[i / 2];  // ties: the lower index wins
        const auto items = check_fused_matches_unfused(dev, g, [&] {
            dev.upload(y->data, yv.data(), y->n_bytes());
            dev.upload(p->data, pv.data(), p->n_bytes());
            dev.upload(cur->data, cv.data(), cur->n_bytes());
            dev.upload(logits->data, lv.data(), logits->n_bytes());
        });
        // The router (one launch up to 32 tokens), the chain, three silus.
        REQUIRE(items.size() == (c.t <= 32 ? 5u : 7u));
        if (c.t <= 32) CHECK(items[0] == std::make_pair(FusedKind::kRouter, 3));
        CHECK(items[c.t <= 32 ? 1 : 3] == std::make_pair(FusedKind::kRowChain, 3));
    }
}

TEST_CASE("CUDA expert products with their bias rows in the epilogue match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 207);
    struct Case {
        int64_t k, n, n_expert, used, tokens;
        Type type;
        bool masked;  // ids of a split expert block: some are kNoExpert, skipped by the weighted sum
    };
    // GPT-OSS's down shape (E = 2880 rows), odd row counts (not multiples of a GEMV block's 4), one
    // to 8 tokens, every expert weight type.
    const Case cases[] = {{2880, 2880, 32, 4, 1, Type::MXFP4, false}, {1056, 1030, 9, 3, 5, Type::Q4_0, false},
                          {512, 66, 40, 8, 8, Type::Q8_0, true},      {256, 130, 5, 2, 3, Type::F16, false},
                          {2880, 515, 32, 4, 2, Type::MXFP4, true}};
    for (const Case& c : cases) {
        INFO("k " << c.k << " n " << c.n << " experts " << c.n_expert << " used " << c.used << " tokens " << c.tokens
                  << " " << moe::type_name(c.type) << (c.masked ? " masked" : ""));
        const std::vector<float> wf = random_f32(rng, static_cast<size_t>(c.k * c.n * c.n_expert), -1.0f, 1.0f);
        std::vector<uint8_t> wb(static_cast<size_t>(moe::row_bytes(c.type, c.k) * c.n * c.n_expert));
        moe::traits(c.type).from_float(wf.data(), wb.data(), c.k * c.n * c.n_expert);
        Tensor* w = dev.leaf(c.type, {c.k, c.n, c.n_expert}, wb.data());
        const std::vector<float> bv = random_f32(rng, static_cast<size_t>(c.n * c.n_expert), -2.0f, 2.0f);
        Tensor* bias = dev.leaf(Type::F32, {c.n, c.n_expert}, bv.data());
        moe::Graph g;
        Tensor* h = g.input(Type::F32, {c.k, c.used, c.tokens}, "h");
        Tensor* ids = g.input(Type::I32, {c.used, c.tokens}, "ids");
        Tensor* p = g.input(Type::F32, {c.used, c.tokens}, "p");
        Tensor* y = g.mul_mat_id(w, h, ids);
        Tensor* b = g.get_rows(bias, g.reshape(ids, {c.used * c.tokens}));
        Tensor* s = g.add(y, g.reshape(b, {c.n, c.used, c.tokens}));
        g.set_output(b);
        if (c.masked) {
            // The product leaves the rows of kNoExpert pairs unwritten (each run first fills its bytes with
            // the same pattern): the sum adds the zero bias rows to them, the weighted sum skips them.
            g.set_output(s);
            g.set_output(g.weighted_sum(s, p, ids));
        } else {
            g.set_output(y);
            g.set_output(s);
        }
        for (Tensor* in : {h, p}) g.set_output(g.silu(in));  // keep the inputs' bytes apart from the outputs
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> hv = random_f32(rng, static_cast<size_t>(c.k * c.used * c.tokens), -2.0f, 2.0f);
        const std::vector<float> pv = random_f32(rng, static_cast<size_t>(c.used * c.tokens), 0.0f, 1.0f);
        std::vector<int32_t> iv(static_cast<size_t>(c.used * c.tokens));
        for (size_t i = 0; i < iv.size(); ++i) {
            iv[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.n_expert));
            if (c.masked && i % 3 == 1) iv[i] = moe::kNoExpert;
        }
        const std::vector<float> stale = random_f32(rng, static_cast<size_t>(y->n_elements()), -9.0f, 9.0f);
        const auto upload = [&] {
            if (c.masked) dev.upload(y->data, stale.data(), y->n_bytes());  // before the inputs: y may reuse no input's bytes
            dev.upload(h->data, hv.data(), h->n_bytes());
            dev.upload(p->data, pv.data(), p->n_bytes());
            dev.upload(ids->data, iv.data(), ids->n_bytes());
        };
        const auto items = check_fused_matches_unfused(dev, g, upload);
        REQUIRE(!items.empty());
        CHECK(items[0] == std::make_pair(FusedKind::kMoeBias, 3));
        // The fused results against the float64 reference, so that bitwise agreement is not agreement
        // on garbage: bias rows exactly, the product within the Q8 activation's error.
        if (!c.masked) {
            std::vector<float> got_b(static_cast<size_t>(b->n_elements())), got_s(got_b.size());
            std::memcpy(got_b.data(), dev.download(*b).data(), b->n_bytes());
            std::memcpy(got_s.data(), dev.download(*s).data(), s->n_bytes());
            std::vector<float> wdq(wf.size());
            moe::traits(c.type).to_float(wb.data(), wdq.data(), c.k * c.n * c.n_expert);
            const bool q8 = c.type != Type::F16;  // quantised weights multiply Q8 activations
            int bad = 0;
            for (int64_t pr = 0; pr < c.used * c.tokens; ++pr) {
                const int64_t e = iv[static_cast<size_t>(pr)];
                const float* x = hv.data() + pr * c.k;  // one activation row per pair
                for (int64_t r = 0; r < c.n; ++r) {
                    const size_t o = static_cast<size_t>(pr * c.n + r);
                    CHECK(got_b[o] == bv[static_cast<size_t>(e * c.n + r)]);
                    const float* wr = wdq.data() + (e * c.n + r) * c.k;
                    double ref = bv[static_cast<size_t>(e * c.n + r)], mag = std::fabs(ref), q8_err = 0.0;
                    for (int64_t i0 = 0; i0 < c.k; i0 += 32) {
                        double amax = 0.0;
                        for (int64_t i = i0; i < i0 + 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
                        for (int64_t i = i0; i < i0 + 32; ++i) {
                            ref += static_cast<double>(wr[i]) * x[i];
                            mag += std::fabs(static_cast<double>(wr[i]) * x[i]);
                            q8_err += std::fabs(static_cast<double>(wr[i])) * amax / 254.0;  // half a Q8 step
                        }
                    }
                    // Q8 rounding of the activation (bounded per block), plus float sums and scales.
                    const double tol = (q8 ? 1.01 * q8_err : 0.0) + 1e-5 * mag + 1e-6;
                    if (std::fabs(got_s[o] - ref) > tol && ++bad <= 5) {
                        FAIL_CHECK("pair " << pr << " row " << r << ": got " << got_s[o] << ", float64 " << ref
                                           << ", tolerance " << tol);
                    }
                }
            }
            CHECK(bad == 0);
        }
    }
    SECTION("an expert id out of range is reported and its rows are NaN") {
        const int64_t k = 256, n = 66, X = 4;
        const std::vector<float> wf = random_f32(rng, static_cast<size_t>(k * n * X), -1.0f, 1.0f);
        std::vector<uint8_t> wb(static_cast<size_t>(moe::row_bytes(Type::Q8_0, k) * n * X));
        moe::traits(Type::Q8_0).from_float(wf.data(), wb.data(), k * n * X);
        Tensor* w = dev.leaf(Type::Q8_0, {k, n, X}, wb.data());
        const std::vector<float> bv = random_f32(rng, static_cast<size_t>(n * X), -2.0f, 2.0f);
        Tensor* bias = dev.leaf(Type::F32, {n, X}, bv.data());
        moe::Graph g;
        Tensor* h = g.input(Type::F32, {k, 2, 1}, "h");
        Tensor* ids = g.input(Type::I32, {2, 1}, "ids");
        Tensor* y = g.mul_mat_id(w, h, ids);
        Tensor* b = g.get_rows(bias, g.reshape(ids, {2}));
        Tensor* s = g.add(y, g.reshape(b, {n, 2, 1}));
        g.set_output(b);
        g.set_output(s);
        g.set_output(g.silu(h));
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> hv = random_f32(rng, static_cast<size_t>(2 * k), -2.0f, 2.0f);
        const int32_t iv[2] = {1, static_cast<int32_t>(X)};  // the second is past the last expert
        dev.upload(h->data, hv.data(), h->n_bytes());
        dev.upload(ids->data, iv, sizeof(iv));
        // Unfused first: the fused launch writes the same bits, NaN payloads included.
        dev.be().set_fusion_enabled(false);
        require_ok(dev.be().compute(g.nodes()));
        CHECK_FALSE(dev.be().synchronize().is_ok());
        const std::vector<uint8_t> want_b = dev.download(*b), want_s = dev.download(*s);
        dev.poison(*b);
        dev.poison(*s);
        dev.be().set_fusion_enabled(true);
        require_ok(dev.be().compute(g.nodes()));
        CHECK_FALSE(dev.be().synchronize().is_ok());
        REQUIRE(dev.be().last_plan().items[0].kind == FusedKind::kMoeBias);
        CHECK(dev.download(*b) == want_b);
        CHECK(dev.download(*s) == want_s);
        std::vector<float> got_b(static_cast<size_t>(2 * n)), got_s(got_b.size());
        std::memcpy(got_b.data(), dev.download(*b).data(), b->n_bytes());
        std::memcpy(got_s.data(), dev.download(*s).data(), s->n_bytes());
        for (int64_t r = 0; r < n; ++r) {
            CHECK(got_b[static_cast<size_t>(r)] == bv[static_cast<size_t>(n + r)]);
            CHECK(std::isfinite(got_s[static_cast<size_t>(r)]));
            CHECK(std::isnan(got_b[static_cast<size_t>(n + r)]));
            CHECK(std::isnan(got_s[static_cast<size_t>(n + r)]));
        }
    }
}

TEST_CASE("CUDA router products that select in their last block match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 208);
    struct Case {
        int64_t k, n_expert;
        int32_t top;
        Type type;
        bool bias;
    };
    // Qwen3's router (128 x 2048 F32), GPT-OSS's (32 x 2880 with a bias), more experts than the keys kept
    // in registers (300, 1024: read again each round), half-precision weights, top-k up to 32.
    const Case cases[] = {{2048, 128, 8, Type::F32, false}, {2880, 32, 4, Type::F32, true},
                          {1056, 300, 8, Type::BF16, true}, {64, 1024, 32, Type::F16, false},
                          {2048, 128, 8, Type::F32, false}};
    for (const Case& c : cases) {
        INFO("k " << c.k << " experts " << c.n_expert << " top " << c.top << " " << moe::type_name(c.type)
                  << (c.bias ? " bias" : ""));
        Tensor* w = random_weight(dev, c.type, c.k, c.n_expert, rng);
        const std::vector<float> bv = random_f32(rng, static_cast<size_t>(c.n_expert), -0.5f, 0.5f);
        Tensor* bias = dev.leaf(Type::F32, {c.n_expert}, bv.data());
        moe::Graph g;
        Tensor* x = g.input(Type::F32, {c.k, 1}, "x");
        Tensor* m = g.mul_mat(w, x);
        g.set_output(m);
        Tensor* logits = c.bias ? g.add(m, bias) : m;
        Tensor* ids = g.topk(logits, c.top);
        Tensor* vals = g.gather(logits, ids);
        Tensor* probs = g.softmax(vals);
        for (Tensor* o : {logits, ids, vals, probs}) g.set_output(o);
        g.set_output(g.silu(x));  // keeps x's bytes apart from the outputs
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> xv = random_f32(rng, static_cast<size_t>(c.k), -2.0f, 2.0f);
        const auto items = check_fused_matches_unfused(dev, g, [&] { dev.upload(x->data, xv.data(), x->n_bytes()); });
        REQUIRE(!items.empty());
        CHECK(items[0] == std::make_pair(FusedKind::kRouterGemv, c.bias ? 5 : 4));
        // The selection is a real top-k: ids distinct, their logits descending, probabilities summing to 1.
        std::vector<int32_t> got_ids(static_cast<size_t>(c.top));
        std::vector<float> got_vals(got_ids.size()), got_probs(got_ids.size());
        std::memcpy(got_ids.data(), dev.download(*ids).data(), ids->n_bytes());
        std::memcpy(got_vals.data(), dev.download(*vals).data(), vals->n_bytes());
        std::memcpy(got_probs.data(), dev.download(*probs).data(), probs->n_bytes());
        double psum = 0.0;
        for (size_t j = 0; j < got_ids.size(); ++j) {
            CHECK(got_ids[j] >= 0);
            CHECK(got_ids[j] < c.n_expert);
            if (j > 0) CHECK(got_vals[j] <= got_vals[j - 1]);
            psum += got_probs[j];
        }
        CHECK(std::fabs(psum - 1.0) < 1e-5);
    }
}

TEST_CASE("CUDA fused chains whose outputs overlap with a shift write them in node order", "[gpu]") {
    // ws and the norm's result share bytes, the norm's shifted by 32 floats (legal for one row: ws is
    // dead once the ADD has read it). The fused chain writes ws, then the sum, then the norm, with
    // barriers (cluster-wide for a decode row) between: a norm value overwritten by a late ws write
    // would differ from the unfused launches.
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 205);
    for (const int64_t n : {int64_t{2048}, int64_t{2880}, int64_t{8192}}) {
        INFO("n " << n);
        constexpr int64_t kK = 8;
        const std::vector<float> wn = random_f32(rng, static_cast<size_t>(n), 0.5f, 1.5f);
        Tensor* norm_w = dev.leaf(Type::F32, {n}, wn.data());
        moe::Graph g;
        Tensor* y = g.input(Type::F32, {n, kK, 1}, "y");
        Tensor* p = g.input(Type::F32, {kK, 1}, "p");
        Tensor* cur = g.input(Type::F32, {n, 1}, "cur");
        Tensor* ws = g.weighted_sum(y, p);
        Tensor* sum = g.add(cur, ws);
        Tensor* nrm = g.rms_norm(sum, norm_w, 1e-5f);
        g.set_output(sum);
        g.set_output(nrm);
        for (Tensor* in : {y, p, cur}) g.set_output(g.silu(in));  // inputs stay apart from the outputs
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        auto* shared = static_cast<uint8_t*>(dev.alloc(static_cast<size_t>(n + 32) * sizeof(float)));
        ws->data = shared;
        nrm->data = shared + 32 * sizeof(float);
        const std::vector<float> yv = random_f32(rng, static_cast<size_t>(n * kK), -2.0f, 2.0f);
        const std::vector<float> pv = random_f32(rng, static_cast<size_t>(kK), 0.0f, 1.0f);
        const std::vector<float> cv = random_f32(rng, static_cast<size_t>(n), -4.0f, 4.0f);
        const auto items = check_fused_matches_unfused(dev, g, [&] {
            dev.upload(y->data, yv.data(), y->n_bytes());
            dev.upload(p->data, pv.data(), p->n_bytes());
            dev.upload(cur->data, cv.data(), cur->n_bytes());
        });
        REQUIRE(items.size() == 4);
        CHECK(items[0] == std::make_pair(FusedKind::kRowChain, 3));
    }
}

TEST_CASE("CUDA fused attention prologues (norms, ropes, cache writes) match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 203);
    moe::RopeParams qwen;
    qwen.n_dims = 128;
    qwen.freq_base = 1000000.0f;
    moe::RopeParams oss;  // YaRN as gpt-oss
    oss.n_dims = 64;
    oss.n_ctx_orig = 4096;
    oss.freq_base = 150000.0f;
    oss.freq_scale = 1.0f / 32.0f;
    oss.ext_factor = 1.0f;
    moe::RopeParams oss_trunc = oss;
    oss_trunc.yarn_truncate = true;
    moe::RopeParams small = qwen;
    small.n_dims = 64;
    struct Case {
        int64_t d, h, hkv, t;
        bool norms;
        Type cache;
        moe::RopeParams rope;
        bool v_over_k = false;  // v's rows are copied over k's input rows (not into the cache)
    };
    // Outputs apart from every input run a warp per row over several blocks; v_over_k makes an output
    // overlap an input of another stream, which only the one-block kernel (every read first) allows.
    const Case cases[] = {
        {128, 32, 4, 1, true, Type::F16, qwen},    {64, 64, 8, 1, false, Type::F16, oss},
        {128, 8, 2, 4, true, Type::F32, qwen},     {64, 12, 4, 3, false, Type::F32, oss_trunc},
        {64, 16, 16, 2, true, Type::F16, small},   {128, 8, 2, 2, true, Type::F32, qwen, true},
        // Prefills (more tokens than one block takes): a warp per row only.
        {128, 32, 4, 40, true, Type::F16, qwen},   {64, 64, 8, 33, false, Type::F16, oss},
    };
    for (const Case& c : cases) {
        INFO("D " << c.d << " H " << c.h << "/" << c.hkv << " T " << c.t << " norms " << c.norms << " cache "
                  << moe::type_name(c.cache) << " v over k " << c.v_over_k);
        constexpr int64_t kCtx = 96;
        const int n_past = 37;
        std::vector<uint8_t> cache0[2];
        Tensor* caches[2];
        for (int i = 0; i < 2; ++i) {
            const std::vector<float> f = random_f32(rng, static_cast<size_t>(c.d * c.hkv * kCtx), -1.0f, 1.0f);
            cache0[i].resize(static_cast<size_t>(c.d * c.hkv * kCtx) * (c.cache == Type::F16 ? 2 : 4));
            moe::traits(c.cache).from_float(f.data(), cache0[i].data(), c.d * c.hkv * kCtx);
            caches[i] = dev.leaf(c.cache, {c.d, c.hkv, kCtx}, cache0[i].data());
            caches[i]->is_weight = false;
        }
        const std::vector<float> wqn = random_f32(rng, static_cast<size_t>(c.d), 0.5f, 1.5f);
        const std::vector<float> wkn = random_f32(rng, static_cast<size_t>(c.d), 0.5f, 1.5f);
        Tensor* qn = dev.leaf(Type::F32, {c.d}, wqn.data());
        Tensor* kn = dev.leaf(Type::F32, {c.d}, wkn.data());
        moe::Graph g;
        Tensor* q = g.input(Type::F32, {c.d, c.h, c.t}, "q");
        Tensor* k = g.input(Type::F32, {c.d, c.hkv, c.t}, "k");
        Tensor* v = g.input(Type::F32, {c.d, c.hkv, c.t}, "v");
        Tensor* pos = g.input(Type::I32, {c.t}, "pos");
        // Prefills: inputs kept, or the memory plan could put an output on another stream's input rows,
        // which only the one-block kernel allows (the plan would not fuse them).
        if (c.t > moe::cuda::kMaxPrepTokens) {
            for (Tensor* in : {q, k, v}) g.set_output(in);
        }
        Tensor* qx = q;
        Tensor* kx = k;
        if (c.norms) {
            qx = g.rms_norm(q, qn, 1e-6f);
            kx = g.rms_norm(k, kn, 1e-6f);
            g.set_output(qx);
            g.set_output(kx);
        }
        Tensor* rq = g.rope(qx, pos, c.rope);
        Tensor* rk = g.rope(kx, pos, c.rope);
        g.set_output(rq);
        g.set_output(rk);
        const auto rows = [&](Tensor* cache) {
            return g.view(cache, {c.d, c.hkv, c.t}, {cache->nb[1], cache->nb[2]}, static_cast<size_t>(n_past) * cache->nb[2]);
        };
        g.cpy(rk, rows(caches[0]));
        g.cpy(v, c.v_over_k ? g.view(k, {c.d, c.hkv, c.t}, {k->nb[1], k->nb[2]}, 0) : rows(caches[1]));
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> qv = random_f32(rng, static_cast<size_t>(c.d * c.h * c.t), -2.0f, 2.0f);
        const std::vector<float> kv = random_f32(rng, static_cast<size_t>(c.d * c.hkv * c.t), -2.0f, 2.0f);
        std::vector<float> vv = random_f32(rng, static_cast<size_t>(c.d * c.hkv * c.t), -70000.0f, 70000.0f);
        vv[3] = std::numeric_limits<float>::quiet_NaN();  // F16: the canonical quiet NaN on both paths
        std::vector<int32_t> pv(static_cast<size_t>(c.t));
        std::uniform_int_distribution<int32_t> deep(0, 131071);
        for (auto& x : pv) x = deep(rng);
        const auto upload = [&] {
            dev.upload(q->data, qv.data(), q->n_bytes());
            dev.upload(k->data, kv.data(), k->n_bytes());
            dev.upload(v->data, vv.data(), v->n_bytes());
            dev.upload(pos->data, pv.data(), pos->n_bytes());
            for (int i = 0; i < 2; ++i) dev.upload(caches[i]->data, cache0[i].data(), cache0[i].size());
        };
        const auto items = check_fused_matches_unfused(dev, g, upload);
        REQUIRE(items.size() == 1);
        CHECK(items[0] == std::make_pair(FusedKind::kAttnPrep, c.norms ? 6 : 4));
        // The caches after the fused run against a run without fusion.
        std::vector<uint8_t> fused_cache[2] = {dev.download(*caches[0]), dev.download(*caches[1])};
        dev.be().set_fusion_enabled(false);
        upload();
        require_ok(dev.be().compute(g.nodes()));
        for (int i = 0; i < 2; ++i) {
            INFO("cache " << i << ", seed " << run_seed());
            CHECK(dev.download(*caches[i]) == fused_cache[i]);
            CHECK((fused_cache[i] != cache0[i]) == (i == 0 || !c.v_over_k));
        }
        if (c.v_over_k) {  // k's rows now hold v, on both paths
            const std::vector<uint8_t> kb = dev.download(*k);
            CHECK(std::memcmp(kb.data(), vv.data(), kb.size()) == 0);
        }
    }
}

TEST_CASE("CUDA attention results handed to the output projection as Q8 rows match unfused launches bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    std::mt19937_64 rng(run_seed() * 0x9E3779B97F4A7C15ull + 204);
    struct Case {
        int64_t d, h, hkv, t, n_kv;
        int window;
        bool sinks;
        Type cache, weight;
        bool bias;
    };
    // Short contexts (one split), long ones (split-K merged in the kernel), sinks and a window as
    // gpt-oss, an odd token count, an F32 cache, every quantised weight type, odd output counts.
    const Case cases[] = {
        {128, 32, 4, 1, 40, 0, false, Type::F16, Type::Q8_0, false},
        {128, 32, 4, 1, 3001, 0, false, Type::F16, Type::Q4_0, false},
        {64, 64, 8, 2, 700, 128, true, Type::F16, Type::MXFP4, true},
        {64, 12, 4, 3, 90, 0, true, Type::F32, Type::Q8_0, true},
        {96, 8, 8, 1, 1, 0, false, Type::F16, Type::Q8_0, false},
    };
    for (const Case& c : cases) {
        INFO("D " << c.d << " H " << c.h << "/" << c.hkv << " T " << c.t << " n_kv " << c.n_kv << " window "
                  << c.window << " sinks " << c.sinks << " cache " << moe::type_name(c.cache) << " weight "
                  << moe::type_name(c.weight));
        Tensor* caches[2];
        for (auto& cache : caches) {
            const std::vector<float> f = random_f32(rng, static_cast<size_t>(c.d * c.hkv * c.n_kv), -1.5f, 1.5f);
            std::vector<uint8_t> bytes(static_cast<size_t>(c.d * c.hkv * c.n_kv) * (c.cache == Type::F16 ? 2 : 4));
            moe::traits(c.cache).from_float(f.data(), bytes.data(), c.d * c.hkv * c.n_kv);
            cache = dev.leaf(c.cache, {c.d, c.hkv, c.n_kv}, bytes.data());
        }
        const std::vector<float> sv = random_f32(rng, static_cast<size_t>(c.h), -1.0f, 3.0f);
        Tensor* sinks = c.sinks ? dev.leaf(Type::F32, {c.h}, sv.data()) : nullptr;
        constexpr int64_t kOut = 520;
        Tensor* wo = random_weight(dev, c.weight, c.d * c.h, kOut, rng);
        const std::vector<float> bv = random_f32(rng, static_cast<size_t>(kOut), -1.0f, 1.0f);
        Tensor* bias = dev.leaf(Type::F32, {kOut}, bv.data());
        moe::Graph g;
        Tensor* q = g.input(Type::F32, {c.d, c.h, c.t}, "q");
        Tensor* pos = g.input(Type::I32, {c.t}, "pos");
        Tensor* att = g.attention(q, caches[0], caches[1], pos, sinks, 1.0f / std::sqrt(static_cast<float>(c.d)),
                                  c.window, static_cast<int32_t>(c.n_kv));
        g.set_output(att);
        Tensor* y = g.mul_mat(wo, g.reshape(att, {c.d * c.h, c.t}));
        g.set_output(y);
        if (c.bias) g.set_output(g.add(y, bias));
        const moe::AllocPlan plan = moe::plan_allocation(g);
        moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
        const std::vector<float> qv = random_f32(rng, static_cast<size_t>(c.d * c.h * c.t), -2.0f, 2.0f);
        std::vector<int32_t> pv(static_cast<size_t>(c.t));
        for (int64_t i = 0; i < c.t; ++i) pv[static_cast<size_t>(i)] = static_cast<int32_t>(c.n_kv - c.t + i);
        const auto reused = dev.be().fusion_stats().q8_reused;
        const auto items = check_fused_matches_unfused(dev, g, [&] {
            dev.upload(q->data, qv.data(), q->n_bytes());
            dev.upload(pos->data, pv.data(), pos->n_bytes());
        });
        REQUIRE(items.size() == 2);
        CHECK(items[0] == std::make_pair(FusedKind::kNone, 1));  // the attention, writing the Q8 rows
        const auto& launched = dev.be().last_plan().items;
        CHECK(launched[0].q8_out >= 0);
        CHECK(launched[1].q8_in == launched[0].q8_out);
        CHECK(dev.be().fusion_stats().q8_reused > reused);
    }
}

TEST_CASE("cuda contexts give the same logits with and without fused launches", "[gpu]") {
    MOE_GPU_OR_SKIP();
    std::mt19937 rng(static_cast<uint32_t>(run_seed()));
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch);
        const bool oss = std::strcmp(arch, "gpt-oss") == 0;
        // Rows longer than a warp's: the row chains run.
        const TinyModel model(arch, "moe_cuda_fusion", rng(),
                              pair_model_options(oss ? MOE_TYPE_MXFP4 : MOE_TYPE_Q8_0, oss ? 2880 : 1152));
        const CudaContextPair pair(model, "MOEINFER_CUDA_FUSION");
        REQUIRE(pair.on_backend().fusion_enabled());
        REQUIRE_FALSE(pair.off_backend().fusion_enabled());
        pair.expect_same_logits(model.info().n_vocab, rng, kPairSteps);
        const auto& st = pair.on_backend().fusion_stats();
        INFO("groups " << st.fused[1] << ", chains " << st.fused[2] << ", routers " << st.fused[3] << ", q8 reused "
                       << st.q8_reused);
        CHECK(st.fused[static_cast<int>(FusedKind::kGemvGroup)] > 0);
        CHECK(st.fused[static_cast<int>(FusedKind::kRowChain)] > 0);
        CHECK(st.fused[static_cast<int>(FusedKind::kRouterGemv)] > 0);  // decode steps
        CHECK(st.q8_reused > 0);
        if (oss) CHECK(st.fused[static_cast<int>(FusedKind::kMoeBias)] > 0);
        const auto& ps = pair.off_backend().fusion_stats();
        uint64_t fused_off = ps.q8_reused;
        for (int k = 1; k < moe::cuda::kFusedKinds; ++k) fused_off += ps.fused[k];
        CHECK(fused_off == 0);
    }
}

#endif  // MOEINFER_HAS_CUDA
