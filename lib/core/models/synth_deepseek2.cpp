// Synthetic deepseek2 (DeepSeek-V3/R1, Kimi-K2, DeepSeek-V2-Lite shapes): tensors and metadata as
// llama.cpp's deepseek2 loader expects them from a file converted after the attn_k_b / attn_v_b split
// (src/models/deepseek2.cpp names and shapes; MLA head sizes in key_length_mla / value_length_mla).
//
// Shapes beyond the common preset fields come from the Hugging Face configs (deepseek-ai/DeepSeek-V3,
// moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V2-Lite). The "tiny" presets keep every feature at
// test size: "tiny" is V3-like (q LoRA, sigmoid routing with a selection bias, 4 groups of which 2 are
// used, YaRN; a latent attention row of 64 + 32, a head size the CUDA kernels have), "tiny-lite" V2-like
// (plain q, softmax routing limited to the best groups by their maximum, two shared experts).
#include <cmath>
#include <string>
#include <string_view>

#include "core/models/synth_model.h"

namespace moe::synth {
namespace {

struct Deepseek2Preset {
    const char* name;
    Deepseek2Shape shape;
};

// name            q_lora kv_lora rope v_head dense n_ff   shared groups used sigmoid norm  scale  log_mul beta_f beta_s
constexpr Deepseek2Preset kDeepseek2Presets[] = {
    {"deepseek-v3",      {1536, 512, 64, 128, 3, 18432, 1, 8, 4, true,  true,  2.5f,   0.1f,   32.0f, 1.0f}},
    {"kimi-k2",          {1536, 512, 64, 128, 1, 18432, 1, 1, 1, true,  true,  2.827f, 0.1f,   1.0f,  1.0f}},
    {"deepseek-v2-lite", {0,    512, 64, 128, 1, 10944, 2, 1, 1, false, false, 1.0f,   0.0707f, 32.0f, 1.0f}},
    {"tiny",             {32,   64,  32, 32,  1, 96,    1, 4, 2, true,  true,  2.5f,   0.1f,   32.0f, 1.0f}},
    {"tiny-lite",        {0,    64,  32, 32,  1, 96,    2, 4, 2, false, false, 1.5f,   0.0707f, 32.0f, 1.0f}},
};

// Unit-rms inputs give unit-rms outputs: U with std 1/sqrt(fan_in).
TensorSpec per_head(std::string name, const Config& c, int64_t fan_in, int64_t n_out, int64_t n_head) {
    return {std::move(name), c.dense_type, {fan_in, n_out, n_head}, Init::UNIFORM, 0.0f,
            1.0f / std::sqrt(static_cast<float>(fan_in))};
}

}  // namespace

bool deepseek2_shape(std::string_view preset, Deepseek2Shape* out) {
    for (const Deepseek2Preset& p : kDeepseek2Presets) {
        if (preset == p.name) {
            *out = p.shape;
            return true;
        }
    }
    return false;
}

std::vector<TensorSpec> deepseek2_tensors(const Config& c) {
    const Deepseek2Shape& s = c.ds;
    const int64_t d = c.n_embd, H = c.n_head, Dk = c.head_dim, Dv = s.head_dim_v, R = s.rope_dims;
    const int64_t C = s.kv_lora_rank, Q = s.q_lora_rank, ff = c.n_ff_expert, ne = c.n_expert;
    const int64_t shared = ff * s.n_expert_shared;
    const float in_std = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<TensorSpec> t;
    t.push_back({"token_embd.weight", c.dense_type, {d, c.n_vocab}, Init::EMBEDDING, 0.0f, 1.0f});
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        t.push_back(norm_weight(b + "attn_norm.weight", d));
        if (Q > 0) {
            t.push_back(dense_weight(b + "attn_q_a.weight", c, d, Q));
            t.push_back(norm_weight(b + "attn_q_a_norm.weight", Q));
            t.push_back(dense_weight(b + "attn_q_b.weight", c, Q, H * Dk));
        } else {
            t.push_back(dense_weight(b + "attn_q.weight", c, d, H * Dk));
        }
        t.push_back(dense_weight(b + "attn_kv_a_mqa.weight", c, d, C + R));
        t.push_back(norm_weight(b + "attn_kv_a_norm.weight", C));
        // Per head: k_nope = W_UK c stored transposed ([Dn, C] per head), v = W_UV c ([C, Dv] per head).
        TensorSpec k_b = per_head(b + "attn_k_b.weight", c, Dk - R, C, H);
        k_b.std = 1.0f / std::sqrt(static_cast<float>(C));
        t.push_back(k_b);
        t.push_back(per_head(b + "attn_v_b.weight", c, C, Dv, H));
        t.push_back(dense_weight(b + "attn_output.weight", c, H * Dv, d, kOutputProjScale));
        t.push_back(norm_weight(b + "ffn_norm.weight", d));
        if (l < s.n_layer_dense_lead) {
            t.push_back(dense_weight(b + "ffn_gate.weight", c, d, s.n_ff));
            t.push_back(dense_weight(b + "ffn_up.weight", c, d, s.n_ff));
            t.push_back(dense_weight(b + "ffn_down.weight", c, s.n_ff, d, kOutputProjScale));
            continue;
        }
        t.push_back({b + "ffn_gate_inp.weight", Type::F32, {d, ne}, Init::ROUTER, 0.0f, 0.0f, l});
        if (s.gating_sigmoid) t.push_back({b + "exp_probs_b.bias", Type::F32, {ne}, Init::SELECTION_BIAS, 0.0f, 0.0f, l});
        const float down_std = kOutputProjScale / std::sqrt(static_cast<float>(ff));
        t.push_back({b + "ffn_gate_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back({b + "ffn_up_exps.weight", c.expert_type, {d, ff, ne}, Init::UNIFORM, 0.0f, in_std});
        t.push_back({b + "ffn_down_exps.weight", c.expert_type, {ff, d, ne}, Init::UNIFORM, 0.0f, down_std});
        t.push_back(dense_weight(b + "ffn_gate_shexp.weight", c, d, shared));
        t.push_back(dense_weight(b + "ffn_up_shexp.weight", c, d, shared));
        t.push_back(dense_weight(b + "ffn_down_shexp.weight", c, shared, d, kOutputProjScale));
    }
    t.push_back(norm_weight("output_norm.weight", d));
    t.push_back(dense_weight("output.weight", c, d, c.n_vocab));
    return t;
}

void deepseek2_metadata(GgufWriter& w, const Config& c) {
    const Deepseek2Shape& s = c.ds;
    const std::string a = "deepseek2.";
    auto u32 = [&](const char* key, int64_t v) { w.add_uint32(a + key, static_cast<uint32_t>(v)); };
    u32("block_count", c.n_layer);
    u32("context_length", c.n_ctx_train);
    u32("embedding_length", c.n_embd);
    u32("feed_forward_length", s.n_ff);
    u32("attention.head_count", c.n_head);
    u32("attention.head_count_kv", 1);  // the absorbed attention is MQA over the latent
    u32("attention.key_length", s.kv_lora_rank + s.rope_dims);
    u32("attention.value_length", s.kv_lora_rank);
    u32("attention.key_length_mla", c.head_dim);
    u32("attention.value_length_mla", s.head_dim_v);
    if (s.q_lora_rank > 0) u32("attention.q_lora_rank", s.q_lora_rank);
    u32("attention.kv_lora_rank", s.kv_lora_rank);
    u32("rope.dimension_count", s.rope_dims);
    w.add_float32(a + "rope.freq_base", c.rope_theta);
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
    u32("leading_dense_block_count", s.n_layer_dense_lead);
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
    u32("expert_feed_forward_length", c.n_ff_expert);
    u32("expert_shared_count", s.n_expert_shared);
    u32("expert_group_count", s.n_expert_group);
    u32("expert_group_used_count", s.n_expert_group_used);
    w.add_float32(a + "expert_weights_scale", s.weights_scale);
    w.add_bool(a + "expert_weights_norm", s.weights_norm);
    u32("expert_gating_func", s.gating_sigmoid ? 2 : 1);
    if (c.yarn_factor > 0.0f) {
        w.add_string(a + "rope.scaling.type", "yarn");
        w.add_float32(a + "rope.scaling.factor", c.yarn_factor);
        u32("rope.scaling.original_context_length", c.yarn_orig_ctx);
        w.add_float32(a + "rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
        w.add_float32(a + "rope.scaling.yarn_beta_fast", s.yarn_beta_fast);
        w.add_float32(a + "rope.scaling.yarn_beta_slow", s.yarn_beta_slow);
    }
}

}  // namespace moe::synth
