// Synthetic qwen3moe (Qwen3-30B-A3B / 235B-A22B shape): tensors and metadata as llama.cpp's
// qwen3moe loader expects them (src/llama-arch.cpp names, src/models/qwen3moe.cpp shapes).
#include <cmath>
#include <string>

#include "core/models/synth_model.h"

namespace moe::synth {

std::vector<TensorSpec> qwen3moe_tensors(const Config& c) {
    const int64_t d = c.n_embd, q = int64_t{c.n_head} * c.head_dim, kv = int64_t{c.n_head_kv} * c.head_dim;
    const int64_t ff = c.n_ff_expert, ne = c.n_expert;
    std::vector<TensorSpec> t;
    t.push_back({"token_embd.weight", c.dense_type, {d, c.n_vocab}, Init::EMBEDDING, 0.0f, 1.0f});
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        t.push_back(norm_weight(b + "attn_norm.weight", d));
        t.push_back(dense_weight(b + "attn_q.weight", c, d, q));
        t.push_back(dense_weight(b + "attn_k.weight", c, d, kv));
        t.push_back(dense_weight(b + "attn_v.weight", c, d, kv));
        t.push_back(dense_weight(b + "attn_output.weight", c, q, d, kOutputProjScale));
        t.push_back(norm_weight(b + "attn_q_norm.weight", c.head_dim));
        t.push_back(norm_weight(b + "attn_k_norm.weight", c.head_dim));
        t.push_back(norm_weight(b + "ffn_norm.weight", d));
        t.push_back({b + "ffn_gate_inp.weight", Type::F32, {d, ne}, Init::ROUTER, 0.0f, 0.0f, l});
        const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
        const float down_std = kOutputProjScale / std::sqrt(static_cast<float>(ff));
        t.push_back({b + "ffn_gate_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back({b + "ffn_up_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back({b + "ffn_down_exps.weight", c.expert_type, {ff, d, ne}, Init::UNIFORM, 0.0f, down_std});
    }
    t.push_back(norm_weight("output_norm.weight", d));
    t.push_back(dense_weight("output.weight", c, d, c.n_vocab));
    return t;
}

void qwen3moe_metadata(GgufWriter& w, const Config& c) {
    const std::string a = "qwen3moe.";
    w.add_uint32(a + "block_count", static_cast<uint32_t>(c.n_layer));
    w.add_uint32(a + "context_length", static_cast<uint32_t>(c.n_ctx_train));
    w.add_uint32(a + "embedding_length", static_cast<uint32_t>(c.n_embd));
    // The dense FFN size of the HF config (intermediate_size): 6144 = 8 x 768 for Qwen3-30B-A3B.
    w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(c.n_ff_expert * c.n_expert_used));
    w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(c.n_head));
    w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    // head_dim != n_embd / n_head (128 vs 64), so the key/value lengths must be explicit.
    w.add_uint32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_uint32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
    w.add_uint32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
    w.add_float32(a + "rope.freq_base", c.rope_theta);
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    w.add_uint32(a + "expert_count", static_cast<uint32_t>(c.n_expert));
    w.add_uint32(a + "expert_used_count", static_cast<uint32_t>(c.n_expert_used));
    w.add_uint32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_expert));
}

}  // namespace moe::synth
