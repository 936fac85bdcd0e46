// Placement rules, offload policy parsing and expert-run coalescing, against direct references.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "sched/expert_runs.h"
#include "sched/placement.h"
#include "sched/policy.h"

using namespace moe;
using namespace moe::sched;

namespace {

std::vector<WeightDesc> qwen_like_weights(int n_layer) {
    std::vector<WeightDesc> w = {{"token_embd.weight", 1000}, {"output_norm.weight", 10}, {"output.weight", 1000}};
    for (int il = 0; il < n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"}) w.push_back({b + n, 100});
        w.push_back({b + "attn_norm.weight", 1});
        w.push_back({b + "ffn_gate_inp.weight", 20});
        w.push_back({b + "ffn_up_exps.weight", 5000});
        w.push_back({b + "ffn_gate_exps.weight", 5000});
        w.push_back({b + "ffn_down_exps.weight", 6000});
        w.push_back({b + "ffn_down_exps.bias", 50});
    }
    return w;
}

Side side_of(const std::vector<WeightDesc>& w, const std::vector<Side>& s, const std::string& name) {
    for (size_t i = 0; i < w.size(); ++i) {
        if (w[i].name == name) return s[i];
    }
    FAIL("no tensor " << name);
    return Side::HOST;
}

}  // namespace

TEST_CASE("tensor overrides parse llama.cpp's -ot syntax and reject bad entries", "[sched]") {
    auto rules = parse_overrides("exps=CPU, ffn_(up|gate)_exps\\.weight=cuda0,attn=GPU");
    REQUIRE(rules.is_ok());
    REQUIRE(rules.value().size() == 3);
    CHECK(rules.value()[0].side == Side::HOST);
    CHECK(rules.value()[1].side == Side::DEVICE);
    CHECK(rules.value()[1].pattern == "ffn_(up|gate)_exps\\.weight");
    CHECK(rules.value()[2].side == Side::DEVICE);
    CHECK(parse_overrides("").value().empty());

    for (const char* bad : {"exps", "exps=", "=CPU", "exps=TPU", "ffn_(up=CPU", "[a-=CPU"}) {
        INFO(bad);
        auto r = parse_overrides(bad);
        REQUIRE_FALSE(r.is_ok());
        CHECK(r.status().code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(r.status().message().find("tensor override") != std::string::npos);
    }
    CHECK(parse_overrides("exps=TPU").status().message().find("unknown backend 'TPU'") != std::string::npos);
    CHECK(parse_overrides("ffn_(up=CPU").status().message().find("invalid regex") != std::string::npos);
}

TEST_CASE("layer numbers and expert tensors are recognised by name", "[sched]") {
    CHECK(layer_of("blk.0.attn_q.weight") == 0);
    CHECK(layer_of("blk.47.ffn_up_exps.weight") == 47);
    CHECK(layer_of("output.weight") == -1);
    CHECK(layer_of("blk.x.attn") == -1);
    CHECK(layer_of("blk.12") == -1);
    CHECK(is_expert_tensor("blk.3.ffn_down_exps.bias"));
    CHECK_FALSE(is_expert_tensor("blk.3.ffn_gate_inp.weight"));
}

TEST_CASE("placement applies overrides, n_cpu_moe, n_gpu_layers and the budget in order", "[sched]") {
    const auto w = qwen_like_weights(4);
    uint64_t total = 0;
    for (const auto& d : w) total += d.bytes;

    PlacementParams p;
    p.n_layer = 4;
    p.vram_budget = total;
    auto all = place_weights(w, p);
    REQUIRE(all.is_ok());
    for (Side s : all.value()) CHECK(s == Side::DEVICE);

    // -ot exps=CPU: every expert tensor (weights and biases) on the host, the rest on the device.
    p.overrides = parse_overrides("exps=CPU").value();
    auto ot = place_weights(w, p).value();
    for (size_t i = 0; i < w.size(); ++i) CHECK((ot[i] == Side::HOST) == is_expert_tensor(w[i].name));

    // First match wins: an earlier GPU rule keeps layer 3's experts on the device.
    p.overrides = parse_overrides("blk\\.3\\.=GPU,exps=CPU").value();
    auto first = place_weights(w, p).value();
    CHECK(side_of(w, first, "blk.3.ffn_up_exps.weight") == Side::DEVICE);
    CHECK(side_of(w, first, "blk.2.ffn_up_exps.weight") == Side::HOST);

    // n_cpu_moe = 2: experts of layers 0 and 1.
    p.overrides.clear();
    p.n_cpu_moe = 2;
    auto cm = place_weights(w, p).value();
    CHECK(side_of(w, cm, "blk.1.ffn_down_exps.bias") == Side::HOST);
    CHECK(side_of(w, cm, "blk.1.ffn_down_exps.weight") == Side::HOST);
    CHECK(side_of(w, cm, "blk.1.attn_q.weight") == Side::DEVICE);
    CHECK(side_of(w, cm, "blk.2.ffn_up_exps.weight") == Side::DEVICE);

    // n_gpu_layers = 1: only the last layer on the device; output stays on the host (ngl <= n_layer).
    p.n_cpu_moe = 0;
    p.n_gpu_layers = 1;
    auto ngl = place_weights(w, p).value();
    CHECK(side_of(w, ngl, "blk.3.attn_q.weight") == Side::DEVICE);
    CHECK(side_of(w, ngl, "blk.2.attn_q.weight") == Side::HOST);
    CHECK(side_of(w, ngl, "output.weight") == Side::HOST);
    p.n_gpu_layers = 5;
    CHECK(side_of(w, place_weights(w, p).value(), "output.weight") == Side::DEVICE);

    // Budget: experts spill, largest first (down before up/gate), earlier layers first.
    p.n_gpu_layers = -1;
    p.vram_budget = total - 6000;  // exactly one down projection must go
    auto b1 = place_weights(w, p).value();
    CHECK(side_of(w, b1, "blk.0.ffn_down_exps.weight") == Side::HOST);
    CHECK(side_of(w, b1, "blk.1.ffn_down_exps.weight") == Side::DEVICE);
    CHECK(side_of(w, b1, "blk.0.ffn_up_exps.weight") == Side::DEVICE);
    p.vram_budget = total - 4 * 16000 - 4 * 50 - 1;  // nothing but experts can move: too small
    auto b2 = place_weights(w, p);
    REQUIRE_FALSE(b2.is_ok());
    CHECK(b2.status().code() == MOE_STATUS_RESOURCE_EXHAUSTED);
}

TEST_CASE("offload specs set thresholds by op name and reject bad entries", "[sched]") {
    Policy p;
    REQUIRE(parse_offload_spec("mul_mat_id=512,moe_up_gate=off", &p).is_ok());
    CHECK(p.rule(OffloadOp::MUL_MAT_ID).min_batch == 512);
    CHECK(p.rule(OffloadOp::MUL_MAT_ID).enabled);
    CHECK_FALSE(p.rule(OffloadOp::MOE_UP_GATE).enabled);
    CHECK(p.rule(OffloadOp::MUL_MAT).min_batch == -1);
    REQUIRE(parse_offload_spec("all=7", &p).is_ok());
    for (const OffloadRule& r : p.offload) CHECK((r.enabled && r.min_batch == 7));
    REQUIRE(parse_offload_spec("mul_mat=on", &p).is_ok());
    CHECK(p.rule(OffloadOp::MUL_MAT).min_batch == -1);

    const Policy before = p;
    for (const char* bad : {"matmul=3", "mul_mat=-1", "mul_mat=x", "mul_mat", "mul_mat=3,,moe_up_gate=1", "mul_mat=99999999999"}) {
        INFO(bad);
        const Status s = parse_offload_spec(bad, &p);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(p.rule(OffloadOp::MUL_MAT).min_batch == before.rule(OffloadOp::MUL_MAT).min_batch);
    }
    CHECK(parse_offload_spec("matmul=3", &p).message().find("unknown op 'matmul'") != std::string::npos);

    CHECK(default_min_batch(OffloadOp::MUL_MAT, 128, 8) == 32);
    CHECK(default_min_batch(OffloadOp::MUL_MAT_ID, 128, 8) == 512);
    CHECK(default_min_batch(OffloadOp::MOE_UP_GATE, 32, 4) == 256);
    Policy neg;
    neg.offload[1].min_batch = -2;
    CHECK(validate_policy(neg).code() == MOE_STATUS_INVALID_ARGUMENT);
    Policy bad_copy;
    bad_copy.expert_copy = static_cast<ExpertCopy>(5);
    CHECK(validate_policy(bad_copy).code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("expert runs coalesce adjacent selected experts", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (int trial = 0; trial < 200; ++trial) {
        const int n_expert = 1 + static_cast<int>(rng() % 64);
        std::vector<int32_t> ids(rng() % 40);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<unsigned>(n_expert));
        auto sel = selected_experts(ids, n_expert);
        REQUIRE(sel.is_ok());
        const auto runs = coalesce_runs(sel.value());
        // Reference: expand the runs and compare with the set of ids; runs are maximal and ordered.
        std::vector<uint8_t> covered(static_cast<size_t>(n_expert), 0);
        int prev_end = -2;
        for (const ExpertRun& r : runs) {
            REQUIRE(r.count > 0);
            REQUIRE(r.first > prev_end);  // ordered and separated by at least one unselected expert
            for (int e = r.first; e < r.first + r.count; ++e) covered[static_cast<size_t>(e)] = 1;
            prev_end = r.first + r.count;
        }
        std::vector<uint8_t> expect(static_cast<size_t>(n_expert), 0);
        for (int32_t id : ids) expect[static_cast<size_t>(id)] = 1;
        CHECK(covered == expect);
    }
    CHECK(selected_experts(std::vector<int32_t>{0, 8}, 8).status().code() == MOE_STATUS_OUT_OF_RANGE);
    CHECK(selected_experts(std::vector<int32_t>{-2}, 8).status().code() == MOE_STATUS_OUT_OF_RANGE);
    // kNoExpert (a masked pair of a split expert block) selects nothing.
    auto masked = selected_experts(std::vector<int32_t>{kNoExpert, 3, kNoExpert}, 8);
    REQUIRE(masked.is_ok());
    CHECK(masked.value() == std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 0, 0});
}
