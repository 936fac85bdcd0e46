// glm4moe synthetic presets: the real GLM-4.5-Air and GLM-4.5 shapes (from their Hugging Face configs, written
// out here independently of synth_glm4moe.cpp / synth_params.cpp), the leading dense layers kept in proportion
// when --layers truncates a preset, the tensors of a file (dense layer, MoE layers with the shared expert, the
// NextN layer) against llama.cpp's names, and named errors for shapes that cannot hold the preset.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/models/synth.h"
#include "core/models/synth_model.h"

using namespace moe;

namespace {

synth::Config resolve(const char* preset, int n_layer = 0, int head_dim = 0) {
    moe_synth_params p;
    REQUIRE(synth_params_init(&p, "glm4moe").is_ok());
    p.preset = preset;
    p.n_layer = n_layer;
    p.head_dim = head_dim;
    StatusOr<synth::Config> c = synth::resolve_config(p);
    INFO(c.status().message());
    REQUIRE(c.is_ok());
    return *c;
}

}  // namespace

TEST_CASE("glm4moe presets have the real models' shapes", "[synth][glm4moe]") {
    struct Want {
        const char* preset;
        int layers, embd, vocab, heads, kv, head_dim, experts, top, ff_exp, dense_lead, ff, shared;
        float scale;
        bool qk_norm;
    };
    // zai-org/GLM-4.5-Air and zai-org/GLM-4.5 config.json: num_hidden_layers, hidden_size, vocab_size,
    // num_attention_heads, num_key_value_heads, head_dim, n_routed_experts, num_experts_per_tok,
    // moe_intermediate_size, first_k_dense_replace, intermediate_size, n_shared_experts,
    // routed_scaling_factor, use_qk_norm; partial_rotary_factor 0.5 and one NextN layer in both.
    const Want wants[] = {
        {"glm-4.5-air", 46, 4096, 151552, 96, 8, 128, 128, 8, 1408, 1, 10944, 1, 1.0f, false},
        {"glm-4.5", 92, 5120, 151552, 96, 8, 128, 160, 8, 1536, 3, 12288, 1, 2.5f, true},
    };
    for (const Want& w : wants) {
        INFO(w.preset);
        const synth::Config c = resolve(w.preset);
        CHECK(c.arch == Arch::GLM4MOE);
        CHECK(c.n_layer == w.layers);
        CHECK(c.n_embd == w.embd);
        CHECK(c.n_vocab == w.vocab);
        CHECK(c.n_head == w.heads);
        CHECK(c.n_head_kv == w.kv);
        CHECK(c.head_dim == w.head_dim);
        CHECK(c.n_expert == w.experts);
        CHECK(c.n_expert_used == w.top);
        CHECK(c.n_ff_expert == w.ff_exp);
        CHECK(c.glm.n_layer_dense_lead == w.dense_lead);
        CHECK(c.glm.n_ff == w.ff);
        CHECK(c.glm.n_expert_shared == w.shared);
        CHECK(c.glm.weights_scale == w.scale);
        CHECK(c.glm.qk_norm == w.qk_norm);
        CHECK(c.glm.rope_dims == w.head_dim / 2);
        CHECK(c.glm.n_nextn == 1);
        CHECK(c.rope_theta == 1.0e6f);
        CHECK(c.rms_eps == 1e-5f);
    }
    // The default glm4moe preset is GLM-4.5-Air.
    moe_synth_params p;
    REQUIRE(synth_params_init(&p, "glm4moe").is_ok());
    CHECK(std::string(p.preset) == "glm-4.5-air");
}

TEST_CASE("glm4moe --layers keeps the share of dense layers, at least one of each kind", "[synth][glm4moe]") {
    // (preset, layers) -> dense layers: round(lead * layers / preset layers), clamped to [1, layers - 1].
    const std::vector<std::tuple<const char*, int, int>> cases = {
        {"glm-4.5-air", 12, 1}, {"glm-4.5-air", 2, 1}, {"glm-4.5-air", 46, 1}, {"glm-4.5", 4, 1},
        {"glm-4.5", 46, 2},     {"glm-4.5", 92, 3},    {"glm-4.5", 2, 1},      {"tiny", 1, 0},
    };
    for (const auto& [preset, layers, dense] : cases) {
        INFO(preset << " --layers " << layers);
        CHECK(resolve(preset, layers).glm.n_layer_dense_lead == dense);
    }
}

TEST_CASE("glm4moe tensors: dense, MoE with shared expert, and the NextN layer, as llama.cpp names them",
          "[synth][glm4moe]") {
    const synth::Config c = resolve("tiny");
    const int64_t E = c.n_embd, D = c.head_dim, H = c.n_head, K = c.n_head_kv, X = c.n_expert, F = c.n_ff_expert;
    std::map<std::string, std::vector<int64_t>> got;
    for (const synth::TensorSpec& t : synth::glm4moe_tensors(c)) {
        REQUIRE(got.count(t.name) == 0);
        got[t.name] = t.ne;
    }
    using V = std::vector<int64_t>;
    const std::map<std::string, V> some = {
        {"blk.0.attn_q.weight", V{E, H * D}},        {"blk.0.attn_q.bias", V{H * D}},
        {"blk.0.attn_k.bias", V{K * D}},             {"blk.0.attn_q_norm.weight", V{D}},
        {"blk.0.post_attention_norm.weight", V{E}},  {"blk.0.ffn_up.weight", V{E, 96}},
        {"blk.0.ffn_down.weight", V{96, E}},         {"blk.1.ffn_gate_inp.weight", V{E, X}},
        {"blk.1.exp_probs_b.bias", V{X}},            {"blk.1.ffn_up_exps.weight", V{E, F, X}},
        {"blk.2.ffn_down_exps.weight", V{F, E, X}},  {"blk.2.ffn_gate_shexp.weight", V{E, F}},
        {"blk.2.ffn_down_shexp.weight", V{F, E}},    {"blk.3.nextn.eh_proj.weight", V{2 * E, E}},
        {"blk.3.nextn.enorm.weight", V{E}},          {"blk.3.ffn_up_exps.weight", V{E, F, X}},
        {"output.weight", V{E, c.n_vocab}},
    };
    for (const auto& [name, ne] : some) {
        INFO(name);
        REQUIRE(got.count(name) == 1);
        CHECK(got[name] == ne);
    }
    // The dense layer has no expert block; the MoE layers no dense FFN.
    CHECK(got.count("blk.0.ffn_gate_inp.weight") == 0);
    CHECK(got.count("blk.1.ffn_up.weight") == 0);
    // tiny-air: no q/k norms.
    for (const synth::TensorSpec& t : synth::glm4moe_tensors(resolve("tiny-air"))) {
        INFO(t.name);
        CHECK(t.name.find("attn_q_norm") == std::string::npos);
        CHECK(t.name.find("attn_k_norm") == std::string::npos);
    }
}

TEST_CASE("glm4moe presets refuse a head smaller than their rotary part", "[synth][glm4moe]") {
    moe_synth_params p;
    REQUIRE(synth_params_init(&p, "glm4moe").is_ok());
    p.preset = "tiny";
    p.head_dim = 8;  // the preset rotates 16 dims of each head
    StatusOr<synth::Config> c = synth::resolve_config(p);
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(c.status().message().find("head_dim: 8") != std::string::npos);
}
