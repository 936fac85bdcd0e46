// Synthetic glm4moe (GLM-4.5 / GLM-4.5-Air shapes): tensors and metadata as llama.cpp's glm4moe loader
// expects them, the trailing NextN (multi-token prediction) layer included, as real files have it.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/models/synth_model.h"

namespace moe::synth {

bool glm4moe_shape(std::string_view preset, Glm4moeShape* out) {
    // From the Hugging Face configs (zai-org/GLM-4.5, zai-org/GLM-4.5-Air): partial_rotary_factor 0.5 of
    // head_dim 128, first_k_dense_replace, intermediate_size, n_shared_experts, routed_scaling_factor,
    // use_qk_norm, num_nextn_predict_layers. The tiny presets keep every feature at numpy-test size.
    struct Row {
        const char* name;
        Glm4moeShape s;
    };
    static const Row kRows[] = {
        {"glm-4.5-air", {64, 1, 10944, 1, 1.0f, false, 1}},
        {"glm-4.5", {64, 3, 12288, 1, 2.5f, true, 1}},
        {"tiny", {16, 1, 96, 1, 2.5f, true, 1}},
        {"tiny-air", {16, 1, 96, 1, 1.0f, false, 1}},
    };
    for (const Row& r : kRows) {
        if (preset == r.name) {
            *out = r.s;
            return true;
        }
    }
    return false;
}

int scaled_dense_layers(int lead, int preset_layers, int n_layer) {
    if (n_layer >= preset_layers) return lead;
    // A truncated model keeps the preset's share of dense layers, and at least one layer of each kind.
    const int share = static_cast<int>(std::lround(double{1.0} * lead * n_layer / preset_layers));
    return std::clamp(share, std::min(1, lead), std::max(0, n_layer - 1));
}

namespace {

// One transformer layer's tensors; `moe` unless it is a leading dense layer.
void layer_tensors(const Config& c, int l, bool moe, std::vector<TensorSpec>& t) {
    const Glm4moeShape& s = c.glm;
    const int64_t d = c.n_embd, q = int64_t{c.n_head} * c.head_dim, kv = int64_t{c.n_head_kv} * c.head_dim;
    const int64_t ff = c.n_ff_expert, ne = c.n_expert, shared = ff * s.n_expert_shared;
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back(norm_weight(b + "attn_norm.weight", d));
    t.push_back(dense_weight(b + "attn_q.weight", c, d, q));
    t.push_back(bias(b + "attn_q.bias", {q}));
    t.push_back(dense_weight(b + "attn_k.weight", c, d, kv));
    t.push_back(bias(b + "attn_k.bias", {kv}));
    t.push_back(dense_weight(b + "attn_v.weight", c, d, kv));
    t.push_back(bias(b + "attn_v.bias", {kv}));
    t.push_back(dense_weight(b + "attn_output.weight", c, q, d, kOutputProjScale));
    if (s.qk_norm) {
        t.push_back(norm_weight(b + "attn_q_norm.weight", c.head_dim));
        t.push_back(norm_weight(b + "attn_k_norm.weight", c.head_dim));
    }
    t.push_back(norm_weight(b + "post_attention_norm.weight", d));
    if (!moe) {
        t.push_back(dense_weight(b + "ffn_gate.weight", c, d, s.n_ff));
        t.push_back(dense_weight(b + "ffn_up.weight", c, d, s.n_ff));
        t.push_back(dense_weight(b + "ffn_down.weight", c, s.n_ff, d, kOutputProjScale));
        return;
    }
    const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
    const float down_std = kOutputProjScale / std::sqrt(static_cast<float>(ff));
    t.push_back({b + "ffn_gate_inp.weight", Type::F32, {d, ne}, Init::ROUTER, 0.0f, 0.0f, l});
    t.push_back({b + "exp_probs_b.bias", Type::F32, {ne}, Init::SELECTION_BIAS, 0.0f, 0.0f, l});
    t.push_back({b + "ffn_gate_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
    t.push_back({b + "ffn_up_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
    t.push_back({b + "ffn_down_exps.weight", c.expert_type, {ff, d, ne}, Init::UNIFORM, 0.0f, down_std});
    if (shared > 0) {
        t.push_back(dense_weight(b + "ffn_gate_shexp.weight", c, d, shared));
        t.push_back(dense_weight(b + "ffn_up_shexp.weight", c, d, shared));
        t.push_back(dense_weight(b + "ffn_down_shexp.weight", c, shared, d, kOutputProjScale));
    }
}

}  // namespace

std::vector<TensorSpec> glm4moe_tensors(const Config& c) {
    const int64_t d = c.n_embd;
    std::vector<TensorSpec> t;
    t.push_back({"token_embd.weight", c.dense_type, {d, c.n_vocab}, Init::EMBEDDING, 0.0f, 1.0f});
    for (int l = 0; l < c.n_layer; ++l) layer_tensors(c, l, l >= c.glm.n_layer_dense_lead, t);
    // The NextN layers (llama.cpp's LLM_TENSOR_NEXTN_*): a MoE layer plus the projection of the
    // concatenated [embedding, hidden state] and its norms; loaders skip them.
    for (int l = c.n_layer; l < c.n_layer + c.glm.n_nextn; ++l) {
        layer_tensors(c, l, true, t);
        const std::string b = "blk." + std::to_string(l) + ".";
        t.push_back(dense_weight(b + "nextn.eh_proj.weight", c, 2 * d, d));
        t.push_back(norm_weight(b + "nextn.enorm.weight", d));
        t.push_back(norm_weight(b + "nextn.hnorm.weight", d));
        t.push_back(norm_weight(b + "nextn.shared_head_norm.weight", d));
    }
    t.push_back(norm_weight("output_norm.weight", d));
    t.push_back(dense_weight("output.weight", c, d, c.n_vocab));
    return t;
}

void glm4moe_metadata(GgufWriter& w, const Config& c) {
    const Glm4moeShape& s = c.glm;
    const std::string a = "glm4moe.";
    auto u32 = [&](const char* key, int64_t v) { w.add_uint32(a + key, static_cast<uint32_t>(v)); };
    u32("block_count", c.n_layer + s.n_nextn);  // as converted files: the NextN layers counted
    u32("context_length", c.n_ctx_train);
    u32("embedding_length", c.n_embd);
    u32("feed_forward_length", s.n_ff);
    u32("attention.head_count", c.n_head);
    u32("attention.head_count_kv", c.n_head_kv);
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
    u32("rope.dimension_count", s.rope_dims);
    w.add_float32(a + "rope.freq_base", c.rope_theta);
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    u32("leading_dense_block_count", s.n_layer_dense_lead);
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
    u32("expert_feed_forward_length", c.n_ff_expert);
    u32("expert_shared_count", s.n_expert_shared);
    w.add_float32(a + "expert_weights_scale", s.weights_scale);
    w.add_bool(a + "expert_weights_norm", true);
    u32("expert_gating_func", 2);  // sigmoid
    u32("nextn_predict_layers", s.n_nextn);
}

}  // namespace moe::synth
