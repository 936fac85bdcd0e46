// The expert split as a rewrite of the built graph (sched/expert_split_rewrite.h). Model builders emit
// one expert block per MoE layer; the rewrite replaces each flagged layer's block by the device's part,
// the host's part and their sum, in that order, and tags the parts' nodes with their groups.
//
// - The structure, on the real graphs of every architecture: the node list is the built one with each
//   flagged block replaced (the expected list is derived from the built graph by the block's ops in
//   order), operands wired to their part's masked ids, every node after its operands, nothing reading
//   the replaced block, layers without an expert block (glm4moe's and deepseek2's leading dense ones)
//   and unflagged layers as built.
// - The values, through the public API on the emulated device: with the split on, the logits equal the
//   CPU path's within the hybrid tests' bound (|got - cpu| <= 1e-4 * max|cpu| per row: both sides
//   compute with the CPU kernels, the parts' sums add in another order) at several ubatch sizes, with
//   every expert in host RAM (the splitter's split) and with partly resident layers (split on every
//   ubatch), on the softmax routers (qwen3moe, gpt-oss). Not the sigmoid routers: on the tiny glm4moe
//   and deepseek2 models the parts' other order of addition moves a row out of the bound now and then
//   (2026-11-27: deepseek2 in 1-3 models of 150 at splits 1 and n_expert / 2, in RAM or partly
//   resident; glm4moe in about 1 run of this test in 100; the same rows on the build before the
//   rewrite, whose logits are bitwise these), most likely the router near-ties the GPU comparisons of
//   deepseek2 met (17f5247). The structure test above covers them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/api_context.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "sched/expert_plan.h"
#include "sched/expert_split_rewrite.h"

namespace {

using moe::Op;
using moe::test::ApiContext;
using moe::test::random_tokens;
using moe::Tensor;
using moe::sched::kDeviceExpertGroup;
using moe::sched::kHostExpertGroup;

constexpr const char* kArchs[] = {"qwen3moe", "gpt-oss", "glm4moe", "deepseek2"};

// What the rewrite's output is compared with, node by node.
struct Expected {
    Op op;
    int32_t layer;
    int32_t group;
};

// The built node list with each flagged layer's block (its MOE_UP_GATE through its WEIGHTED_SUM, built
// contiguously by graph_blocks.cpp) replaced by: the view of the layer's groups row, then per group
// (device, host) its MASK_IDS and the block's ops, then the ADD of the two parts.
std::vector<Expected> expected_nodes(const std::vector<Tensor*>& built, const std::vector<uint8_t>& layers) {
    std::vector<Expected> want;
    for (size_t i = 0; i < built.size(); ++i) {
        const Tensor& n = *built[i];
        if (n.op != Op::MOE_UP_GATE || !layers[static_cast<size_t>(n.layer)]) {
            want.push_back({n.op, n.layer, -1});
            continue;
        }
        size_t end = i;
        while (built[end]->op != Op::WEIGHTED_SUM) ++end;
        want.push_back({Op::VIEW, n.layer, -1});
        for (const int32_t group : {kDeviceExpertGroup, kHostExpertGroup}) {
            want.push_back({Op::MASK_IDS, n.layer, group});
            for (size_t j = i; j <= end; ++j) want.push_back({built[j]->op, n.layer, group});
        }
        want.push_back({Op::ADD, n.layer, -1});
        i = end;
    }
    return want;
}

// The params of the contexts below: n_ctx 96, 2 threads, the rest as each test asks.
moe_context_params context_params(int32_t device, const char* overrides, uint64_t vram_budget,
                                  const moe_sched_policy* policy, int32_t n_ubatch) {
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 96;
    p.n_ubatch = n_ubatch;
    p.n_threads = 2;
    p.device = device;
    p.tensor_overrides = overrides;
    p.vram_budget = vram_budget;
    p.policy = policy;
    return p;
}

}  // namespace

TEST_CASE("the expert split rewrites each flagged layer's expert block into device part, host part, sum",
          "[sched][split]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    for (const char* arch : kArchs) {
        INFO(arch);
        const moe::test::TinyModel m(arch, "moe_split_rewrite", seed);
        ApiContext c(m.get(), context_params(MOE_DEVICE_CPU, nullptr, 0, nullptr, 16));
        const moe::HParams& hp = m.get()->hparams;
        REQUIRE(hp.n_layer >= 2);
        // Flagged: every layer, the even ones (dense lead layers included where there are some), none.
        std::vector<std::vector<uint8_t>> flags = {std::vector<uint8_t>(static_cast<size_t>(hp.n_layer), 1), {}, {}};
        for (int il = 0; il < hp.n_layer; ++il) flags[1].push_back(il % 2 == 0 ? 1 : 0);
        for (const int n_tokens : {1, 6}) {
            for (const std::vector<uint8_t>& layers : flags) {
                INFO(n_tokens << " tokens, " << std::count(layers.begin(), layers.end(), 1) << " layers flagged");
                moe::Graph built, g;
                moe::build_model_graph(built, hp, c.ctx->weights, c.ctx->kv, n_tokens, 2, moe::LogitsMode::ALL);
                const moe::UbatchGraph ub =
                    moe::build_model_graph(g, hp, c.ctx->weights, c.ctx->kv, n_tokens, 2, moe::LogitsMode::ALL);
                const moe::sched::ExpertParts parts = moe::sched::split_expert_blocks(g, layers, hp.n_expert);
                const std::vector<Tensor*>& nodes = g.nodes();
                if (std::count(layers.begin(), layers.end(), 1) == 0) {
                    CHECK(parts.groups == nullptr);
                    CHECK(parts.node_group.empty());
                    CHECK(nodes.size() == built.nodes().size());
                    continue;
                }
                REQUIRE(parts.groups != nullptr);
                CHECK(parts.groups->is_input);
                CHECK(parts.groups->type == moe::Type::I32);
                CHECK(parts.groups->ne[0] == hp.n_expert);
                CHECK(parts.groups->ne[1] == hp.n_layer);

                const std::vector<Expected> want = expected_nodes(built.nodes(), layers);
                REQUIRE(nodes.size() == want.size());
                size_t tagged = 0;
                for (size_t i = 0; i < nodes.size(); ++i) {
                    INFO("node " << i << " " << moe::op_name(nodes[i]->op));
                    CHECK(nodes[i]->op == want[i].op);
                    CHECK(nodes[i]->layer == want[i].layer);
                    CHECK(parts.group_of(*nodes[i]) == want[i].group);
                    tagged += want[i].group >= 0 ? 1 : 0;
                }
                CHECK(parts.node_group.size() == tagged);

                // Every node reads the inputs, the weights, the cache or a node before it: the parts'
                // sums stand for the replaced blocks.
                std::unordered_set<const Tensor*> before;
                for (const Tensor* n : nodes) {
                    for (const Tensor* s : n->src) {
                        if (s != nullptr && s->op != Op::NONE) CHECK(before.count(s) == 1);
                    }
                    before.insert(n);
                }
                CHECK(g.outputs() == std::vector<Tensor*>{ub.logits});

                // Each part reads its own masked ids, over its layer's row of the groups input; the
                // sum adds the device's part and the host's.
                const Tensor* mask = nullptr;
                const Tensor* part_sum[2] = {};
                for (const Tensor* n : nodes) {
                    const int32_t group = parts.group_of(*n);
                    if (n->op == Op::MASK_IDS) {
                        mask = n;
                        CHECK(n->params.i[0] == group);
                        CHECK(n->src[0]->op == Op::TOPK);
                        CHECK(n->src[1]->view_src == parts.groups);
                        CHECK(n->src[1]->view_offset == static_cast<size_t>(n->layer) * parts.groups->nb[1]);
                    }
                    if (group < 0) {
                        if (n->op == Op::ADD && part_sum[kHostExpertGroup] != nullptr) {
                            CHECK(n->src[0] == part_sum[kDeviceExpertGroup]);
                            CHECK(n->src[1] == part_sum[kHostExpertGroup]);
                            part_sum[0] = part_sum[1] = nullptr;
                        }
                        continue;
                    }
                    if (n->op == Op::MOE_UP_GATE) CHECK(n->src[3] == mask);
                    if (n->op == Op::MUL_MAT_ID) CHECK(n->src[2] == mask);
                    if (n->op == Op::WEIGHTED_SUM) {
                        CHECK(n->src[2] == mask);
                        part_sum[group] = n;
                    }
                }
                CHECK(part_sum[kHostExpertGroup] == nullptr);  // every pair of parts summed
            }
        }
    }
}

TEST_CASE("the expert split gives the cpu path's logits at several ubatch sizes", "[sched][split]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch);
        const moe::test::TinyModel m(arch, "moe_split_archs", rng());
        const int32_t nv = m.info().n_vocab, n_expert = m.info().n_expert, n_layer = m.info().n_layer;
        const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 21, nv), random_tokens(rng, 1, nv),
                                                            random_tokens(rng, 6, nv)};
        // About half of the experts fit beside the dense weights: partly resident layers.
        const uint64_t experts = moe::test::tensor_bytes_containing(m.get(), "_exps");
        const uint64_t budget = moe::test::tensor_bytes_containing(m.get(), "") - experts / 2;
        for (const int32_t n_ubatch : {2, 5, 16}) {
            ApiContext cpu(m.get(), context_params(MOE_DEVICE_CPU, nullptr, 0, nullptr, n_ubatch));
            std::vector<std::vector<float>> want;
            for (const auto& b : batches) want.push_back(moe::test::decode_all(cpu.ctx, b));
            for (const bool resident : {false, true}) {
                for (const int32_t split : {0, 1, n_expert / 2}) {
                    INFO("ubatch " << n_ubatch << (resident ? ", partly resident" : ", experts in RAM") << ", split "
                                   << split);
                    moe_sched_policy pol;
                    moe_sched_policy_init(&pol);
                    REQUIRE(moe_sched_policy_parse_offload(&pol, "all=2") == MOE_STATUS_OK);
                    pol.expert_split = split;
                    ApiContext hy(m.get(), context_params(MOE_DEVICE_EMULATED, resident ? nullptr : "exps=CPU",
                                                         resident ? budget : 0, &pol, n_ubatch));
                    for (size_t i = 0; i < batches.size(); ++i) {
                        moe::test::require_close(moe::test::decode_all(hy.ctx, batches[i]), want[i], nv);
                    }
                    if (resident) {
                        std::vector<int32_t> n_res(static_cast<size_t>(n_layer));
                        std::vector<uint64_t> bytes(static_cast<size_t>(n_layer));
                        int32_t n_out = 0;
                        REQUIRE(moe_context_get_resident_experts(hy.ctx, n_res.data(), bytes.data(), n_layer, &n_out) ==
                                MOE_STATUS_OK);
                        CHECK(std::any_of(n_res.begin(), n_res.end(), [&](int32_t r) { return r > 0 && r < n_expert; }));
                        continue;
                    }
                    // Every ubatch of >= 2 tokens offloads its expert ops, so its layers split.
                    const moe_sched_stats st = hy.stats();
                    if (split == 0) {
                        CHECK(st.n_split_layers == 0);
                    } else {
                        CHECK(st.n_split_layers > 0);
                        CHECK(st.n_split_host_experts == st.n_split_layers * static_cast<uint64_t>(split));
                    }
                }
            }
        }
    }
}
