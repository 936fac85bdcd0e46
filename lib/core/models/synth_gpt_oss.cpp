// Synthetic gpt-oss (GPT-OSS-20B / 120B shape): tensors and metadata as llama.cpp's gpt-oss
// (LLM_ARCH_OPENAI_MOE) loader expects them: q/k/v/o biases, attention sinks, a post-attention
// norm, a router with bias and expert biases.
#include <cmath>
#include <string>

#include "core/models/synth_model.h"

namespace moe::synth {

std::vector<TensorSpec> gpt_oss_tensors(const Config& c) {
    const int64_t d = c.n_embd, q = int64_t{c.n_head} * c.head_dim, kv = int64_t{c.n_head_kv} * c.head_dim;
    const int64_t ff = c.n_ff_expert, ne = c.n_expert;
    std::vector<TensorSpec> t;
    t.push_back({"token_embd.weight", c.dense_type, {d, c.n_vocab}, Init::EMBEDDING, 0.0f, 1.0f});
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        t.push_back(norm_weight(b + "attn_norm.weight", d));
        t.push_back(dense_weight(b + "attn_q.weight", c, d, q));
        t.push_back(bias(b + "attn_q.bias", {q}));
        t.push_back(dense_weight(b + "attn_k.weight", c, d, kv));
        t.push_back(bias(b + "attn_k.bias", {kv}));
        t.push_back(dense_weight(b + "attn_v.weight", c, d, kv));
        t.push_back(bias(b + "attn_v.bias", {kv}));
        t.push_back(dense_weight(b + "attn_output.weight", c, q, d, kOutputProjScale));
        t.push_back(bias(b + "attn_output.bias", {d}));
        // One learned logit per head in the softmax denominator; trained values are O(1).
        t.push_back({b + "attn_sinks.weight", Type::F32, {c.n_head}, Init::UNIFORM, 0.0f, 0.5f});
        t.push_back(norm_weight(b + "post_attention_norm.weight", d));
        t.push_back({b + "ffn_gate_inp.weight", Type::F32, {d, ne}, Init::ROUTER, 0.0f, 0.0f, l});
        t.push_back({b + "ffn_gate_inp.bias", Type::F32, {ne}, Init::ROUTER_BIAS, 0.0f, 0.0f, l});
        const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
        const float down_std = kOutputProjScale / std::sqrt(static_cast<float>(ff));
        t.push_back({b + "ffn_gate_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back(bias(b + "ffn_gate_exps.bias", {ff, ne}));
        t.push_back({b + "ffn_up_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back(bias(b + "ffn_up_exps.bias", {ff, ne}));
        t.push_back({b + "ffn_down_exps.weight", c.expert_type, {ff, d, ne}, Init::UNIFORM, 0.0f, down_std});
        t.push_back(bias(b + "ffn_down_exps.bias", {d, ne}));
    }
    t.push_back(norm_weight("output_norm.weight", d));
    t.push_back(dense_weight("output.weight", c, d, c.n_vocab));
    return t;
}

void gpt_oss_metadata(GgufWriter& w, const Config& c) {
    const std::string a = "gpt-oss.";
    w.add_uint32(a + "block_count", static_cast<uint32_t>(c.n_layer));
    w.add_uint32(a + "context_length", static_cast<uint32_t>(c.n_ctx_train));
    w.add_uint32(a + "embedding_length", static_cast<uint32_t>(c.n_embd));
    w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(c.n_ff_expert));
    w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(c.n_head));
    w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    // head_dim (64) != n_embd / n_head (45), so the key/value lengths must be explicit.
    w.add_uint32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_uint32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    w.add_uint32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
    w.add_float32(a + "rope.freq_base", c.rope_theta);
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    w.add_uint32(a + "expert_count", static_cast<uint32_t>(c.n_expert));
    w.add_uint32(a + "expert_used_count", static_cast<uint32_t>(c.n_expert_used));
    w.add_uint32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_expert));
    // Sliding-window attention on every other layer (llama.cpp's default pattern for gpt-oss).
    w.add_uint32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    w.add_string(a + "rope.scaling.type", "yarn");
    w.add_float32(a + "rope.scaling.factor", c.yarn_factor);
    w.add_uint32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(c.yarn_orig_ctx));
}

}  // namespace moe::synth
