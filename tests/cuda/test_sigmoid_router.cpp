// The fused sigmoid router of the CUDA backend (fusion_plan.h kSigmoidRouter, ops_sigmoid_router.cu):
// SIGMOID [ADD bias] [GROUP_MASK] TOPK GATHER NORM_SCALE in one launch, as glm4moe and deepseek2 V3 /
// Kimi-K2 route (blocks::route_biased_sigmoid).
//
// Without a device ("[cuda]"): the planner fuses the router of every MoE layer of both architectures'
// real graphs (decode and a short prefill), and refuses spans the kernel does not cover.
// On a device ("[gpu]"): on fresh random logits with exact ties (duplicated experts and duplicated
// groups) the fused launch gives bitwise the unfused launches' outputs (every part's), with its
// outputs reusing inputs' bytes or not; and the same choice as the CPU backend, weights within 1e-5
// relative (the CPU's exp is within 2 ulp of expf; a sum of k <= 32 positive terms in another order).
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/sigmoid_router_ref.h"
#include "context_pair.h"
#include "core/allocator.h"
#include "core/graph.h"
#include "core/models/graph_blocks.h"
#include "core/models/model_graph.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/fusion_plan.h"
#include "cuda_test_util.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using moe::Op;
using moe::Tensor;
using moe::Type;
using moe::cuda::FusedKind;
using moe::test::Device;
using moe::test::require_ok;
using moe::test::RouterCase;
using moe::test::run_seed;

// The router block as the models build it, on `logits` [E, T].
moe::blocks::Routing build_router(moe::Graph& g, Tensor* logits, Tensor* bias, const RouterCase& c) {
    return moe::blocks::route_biased_sigmoid(g, logits, bias, c.k, c.normalize, c.scale, {c.n_group, c.n_used});
}

// The kinds and part counts a fusion plan of `nodes` launches.
std::map<FusedKind, std::vector<int>> plan_kinds(const std::vector<Tensor*>& nodes) {
    moe::cuda::FusionPlan plan;
    moe::cuda::plan_fusions(nodes, true, plan);
    std::map<FusedKind, std::vector<int>> kinds;
    for (const moe::cuda::LaunchItem& it : plan.items) kinds[it.kind].push_back(it.n_part);
    return kinds;
}

std::vector<Tensor*> kernel_nodes(moe::Graph& g) {
    std::vector<Tensor*> nodes;
    for (Tensor* n : g.nodes()) {
        if (n->op != Op::NONE && n->op != Op::VIEW) nodes.push_back(n);
    }
    return nodes;
}

}  // namespace

TEST_CASE("CUDA fusion plans fuse the sigmoid router of every MoE layer of glm4moe and deepseek2", "[cuda][routing]") {
    // Real graphs of the tiny presets (a leading dense layer, then MoE layers): decode and a 5-token
    // prefill fuse each MoE layer's router (5 parts; 6 with deepseek2's group limit); V2's softmax
    // router and a 40-token ubatch (more than one block of warps) keep their own launches.
    struct Arch {
        const char* arch;
        const char* preset;
        int parts;  // 0: not a sigmoid router
    };
    for (const Arch a : {Arch{"glm4moe", "tiny", 5}, Arch{"deepseek2", "tiny", 6}, Arch{"deepseek2", "tiny-lite", 0}}) {
        moe_synth_params sp;
        REQUIRE(moe_synth_params_init(&sp, a.arch) == MOE_STATUS_OK);
        sp.preset = a.preset;
        sp.seed = 5;
        const std::string path = (std::filesystem::temp_directory_path() /
                                  (std::string("sigmoid_router_plan_") + a.arch + a.preset + "_" + std::to_string(getpid()) + ".gguf"))
                                     .string();
        REQUIRE(moe_synth_write(path.c_str(), &sp) == MOE_STATUS_OK);
        moe_model* model = nullptr;
        REQUIRE(moe_model_load(path.c_str(), nullptr, &model) == MOE_STATUS_OK);
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 64;
        p.device = MOE_DEVICE_CPU;
        moe_context* ctx = nullptr;
        REQUIRE(moe_context_create(model, &p, &ctx) == MOE_STATUS_OK);
        const moe::HParams& hp = model->hparams;
        const int moe_layers = hp.n_layer - hp.n_layer_dense_lead;
        REQUIRE(moe_layers > 0);
        for (const int n_tokens : {1, 5, 40}) {
            INFO(a.arch << " " << a.preset << ", " << n_tokens << " tokens");
            moe::Graph g;
            moe::build_model_graph(g, hp, ctx->weights, ctx->kv, n_tokens, 3, moe::LogitsMode::LAST);
            moe::bind_allocation(g, moe::plan_allocation(g), reinterpret_cast<void*>(uintptr_t{1} << 44));
            auto kinds = plan_kinds(kernel_nodes(g));
            if (a.parts == 0 || n_tokens > moe::cuda::kMaxSigmoidRouterTokens) {
                CHECK(kinds.count(FusedKind::kSigmoidRouter) == 0);
                continue;
            }
            REQUIRE(kinds[FusedKind::kSigmoidRouter].size() == static_cast<size_t>(moe_layers));
            for (const int n : kinds[FusedKind::kSigmoidRouter]) CHECK(n == a.parts);
        }
        moe_context_free(ctx);
        moe_model_free(model);
        std::filesystem::remove(path);
    }
}

TEST_CASE("CUDA fusion plans refuse sigmoid routers the fused kernel does not cover", "[cuda][routing]") {
    Tensor bias;  // fake addresses: the planner never dereferences data
    const auto plan_of = [&](const RouterCase& c, bool gather_choice) {
        moe::Graph g;
        Tensor* logits = g.input(Type::F32, {c.E, c.T}, "logits");
        const int64_t ne[1] = {c.E};
        moe::set_shape(bias, Type::F32, 1, ne);
        bias.data = reinterpret_cast<void*>(uintptr_t{1} << 40);
        bias.is_weight = true;
        if (gather_choice) {  // the weights from the biased choice instead of the scores
            Tensor* choice = g.add(g.sigmoid(logits), &bias);
            Tensor* ids = g.topk(choice, c.k);
            g.set_output(ids);
            g.set_output(g.norm_scale(g.gather(choice, ids), c.normalize, c.scale));
        } else {
            const moe::blocks::Routing r = build_router(g, logits, c.bias ? &bias : nullptr, c);
            g.set_output(r.ids);
            g.set_output(r.weights);
        }
        moe::bind_allocation(g, moe::plan_allocation(g), reinterpret_cast<void*>(uintptr_t{1} << 44));
        return plan_kinds(kernel_nodes(g)).count(FusedKind::kSigmoidRouter);
    };
    CHECK(plan_of({256, 4, 8, 8, 4, true, true, 2.5f}, false) == 1);   // DeepSeek-V3
    CHECK(plan_of({384, 1, 8, 1, 1, true, true, 2.8f}, false) == 1);   // Kimi-K2
    CHECK(plan_of({128, 32, 8, 1, 1, false, false, 1.0f}, false) == 1);  // no bias, no normalisation
    CHECK(plan_of({640, 1, 8, 1, 1, true, true, 1.0f}, false) == 0);   // more experts than a warp holds
    CHECK(plan_of({128, 1, 33, 1, 1, true, true, 1.0f}, false) == 0);  // more than one choice per lane
    CHECK(plan_of({128, 33, 8, 1, 1, true, true, 1.0f}, false) == 0);  // more tokens than one block's warps
    CHECK(plan_of({128, 1, 2, 64, 2, true, true, 1.0f}, false) == 0);  // more groups than the kernel holds
    CHECK(plan_of({128, 2, 8, 1, 1, true, true, 1.0f}, true) == 0);    // weights from the biased choice
}

TEST_CASE("CUDA fused sigmoid routers match unfused launches bit for bit and the CPU's choice", "[gpu][routing]") {
    MOE_GPU_OR_SKIP();
    Device dev;
    auto rng = moe::test::fresh_rng(211);
    // DeepSeek-V3 (256 experts in 8 groups, 4 used, top 8, x2.5) for 1 and 32 tokens, GLM-4.5-Air (128,
    // top 8), Kimi-K2 (384: 12 per lane), the tiny presets' 16 in 4 groups of which 2, no bias or no
    // normalisation, 32 groups of 16 with 32 choices, 1 expert.
    const RouterCase cases[] = {{256, 1, 8, 8, 4, true, true, 2.5f},    {256, 32, 8, 8, 4, true, true, 2.5f},
                                {128, 7, 8, 1, 1, true, true, 1.0f},    {384, 3, 8, 1, 1, true, true, 2.827f},
                                {16, 5, 4, 4, 2, true, true, 2.5f},     {160, 2, 8, 1, 1, false, false, 1.5f},
                                {64, 9, 6, 8, 3, true, false, 1.0f},    {512, 2, 32, 32, 2, true, true, 1.0f},
                                {1, 3, 1, 1, 1, true, true, 1.0f}};
    int checked = 0, tokens = 0;
    for (const RouterCase& c : cases) {
        std::vector<float> lv, bv;
        moe::test::random_router_inputs(rng, c, lv, bv);
        for (const bool all_outputs : {true, false}) {
            INFO("E " << c.E << " T " << c.T << " k " << c.k << " groups " << c.n_used << "/" << c.n_group << " bias "
                      << c.bias << " normalize " << c.normalize << " all outputs " << all_outputs << ", seed "
                      << run_seed());
            moe::Graph g;
            Tensor* logits = g.input(Type::F32, {c.E, c.T}, "logits");
            Tensor* bias = c.bias ? dev.leaf(Type::F32, {c.E}, bv.data()) : nullptr;
            const moe::blocks::Routing r = build_router(g, logits, bias, c);
            // Every part's output, or only the ids and weights (the memory plan then reuses the
            // logits' and the intermediates' bytes within the launch).
            if (all_outputs) {
                for (Tensor* n : kernel_nodes(g)) g.set_output(n);
            } else {
                g.set_output(r.ids);
                g.set_output(r.weights);
            }
            const moe::AllocPlan plan = moe::plan_allocation(g);
            moe::bind_allocation(g, plan, dev.alloc(plan.arena_size));
            const auto upload = [&] { dev.upload(logits->data, lv.data(), logits->n_bytes()); };

            dev.be().set_fusion_enabled(false);
            upload();
            require_ok(dev.be().compute(g.nodes()));
            std::vector<std::vector<uint8_t>> want;
            for (const Tensor* o : g.outputs()) want.push_back(dev.download(*o));
            for (const Tensor* o : g.outputs()) dev.poison(*o);
            dev.be().set_fusion_enabled(true);
            upload();
            require_ok(dev.be().compute(g.nodes()));
            require_ok(dev.be().synchronize());
            const auto& items = dev.be().last_plan().items;
            REQUIRE(items.size() == 1);
            CHECK(items[0].kind == FusedKind::kSigmoidRouter);
            for (size_t i = 0; i < g.outputs().size(); ++i) {
                INFO("output " << i << " (" << moe::op_name(g.outputs()[i]->op) << ")");
                CHECK(dev.download(*g.outputs()[i]) == want[i]);
            }
            if (!all_outputs) continue;

            // The CPU backend on the same graph in host memory.
            moe::Graph h;
            Tensor* hl = h.input(Type::F32, {c.E, c.T}, "logits");
            Tensor hb;
            const int64_t ne[1] = {c.E};
            moe::set_shape(hb, Type::F32, 1, ne);
            hb.data = bv.data();
            hb.is_weight = true;
            const moe::blocks::Routing hr = build_router(h, hl, c.bias ? &hb : nullptr, c);
            h.set_output(hr.ids);
            h.set_output(hr.weights);
            const moe::AllocPlan hplan = moe::plan_allocation(h);
            std::vector<uint8_t> arena(hplan.arena_size + 64);
            moe::bind_allocation(h, hplan, arena.data());
            std::memcpy(hl->data, lv.data(), hl->n_bytes());
            moe::cpu::CpuBackend cpu(1);
            require_ok(cpu.compute(h.nodes()));
            std::vector<int32_t> gpu_ids(static_cast<size_t>(c.k * c.T));
            std::vector<float> gpu_w(gpu_ids.size());
            std::memcpy(gpu_ids.data(), dev.download(*r.ids).data(), gpu_ids.size() * 4);
            std::memcpy(gpu_w.data(), dev.download(*r.weights).data(), gpu_w.size() * 4);
            const auto* cpu_ids = static_cast<const int32_t*>(hr.ids->data);
            const auto* cpu_w = static_cast<const float*>(hr.weights->data);
            for (int64_t t = 0; t < c.T; ++t) {
                ++tokens;
                if (!moe::test::reference_route(c, lv, bv, t).decided) continue;
                ++checked;
                for (int64_t j = 0; j < c.k; ++j) {
                    const size_t i = static_cast<size_t>(t * c.k + j);
                    INFO("token " << t << " choice " << j);
                    REQUIRE(gpu_ids[i] == cpu_ids[i]);
                    CHECK(std::abs(gpu_w[i] - cpu_w[i]) <= 1e-5f * std::abs(cpu_w[i]));
                }
            }
        }
    }
    // Near-ties (gaps under 1e-5 that are not exact ties) are rare: nearly every token is compared.
    CHECK(checked >= tokens * 9 / 10);
}

TEST_CASE("cuda contexts of glm4moe and deepseek2 give the same logits with and without the fused router", "[gpu][routing]") {
    MOE_GPU_OR_SKIP();
    std::mt19937 rng(static_cast<uint32_t>(run_seed()));
    for (const char* arch : {"glm4moe", "deepseek2"}) {
        INFO(arch);
        moe::test::TinyModelOptions o;
        o.expert_type = MOE_TYPE_Q8_0;
        if (std::strcmp(arch, "glm4moe") == 0) o.head_dim = 64;  // the CUDA attention kernels' sizes
        const moe::test::TinyModel model(arch, "sigmoid_router_pair", rng(), o);
        const moe::test::CudaContextPair pair(model, "MOEINFER_CUDA_FUSION");
        pair.expect_same_logits(model.info().n_vocab, rng, moe::test::kPairSteps);
        CHECK(pair.on_backend().fusion_stats().fused[static_cast<int>(FusedKind::kSigmoidRouter)] > 0);
        CHECK(pair.off_backend().fusion_stats().fused[static_cast<int>(FusedKind::kSigmoidRouter)] == 0);
    }
}

#endif  // MOEINFER_HAS_CUDA
