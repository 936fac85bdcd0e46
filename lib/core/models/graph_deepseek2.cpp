// The deepseek2 graph (DeepSeek-V2/V3/R1, Kimi-K2): multi-head latent attention, leading dense layers,
// routed plus shared experts. The spec is Hugging Face's modeling_deepseek (V2 and V3); tensor names
// and the absorbed attention follow llama.cpp's deepseek2 builder.
//
// Attention (per token; Dn = head_dim - R nope dims, R rope dims, C = kv_lora_rank):
//   q = W_qb RMSNorm(W_qa x) (or W_q x) -> per head [q_nope (Dn), q_rope (R)], q_rope rotated
//   [c (C), k_rope (R)] = W_kva x;  c = RMSNorm(c);  k_rope rotated (one rope key shared by every head)
//   HF: k_h = [W_UK_h c, k_rope], v_h = W_UV_h c, out_h = softmax(q_h . k_h * scale) v_h.
// The cache keeps [c, k_rope] per token (C + R values, not 2 * H * head sizes), and attention runs in
// latent space (the absorbed form): q_h . k_h = (W_UK_h^T q_nope_h) . c + q_rope_h . k_rope, so the
// query [W_UK_h^T q_nope_h, q_rope_h] attends over the cached rows as keys, and the same rows serve as
// values: their first C entries give sum_j p_j c_j, which W_UV_h maps to out_h. The rope entries of the
// values ride along (R / C = 1/8 more work in the value sum) so that one attention op with one head
// size serves keys and values; the output keeps only the first C entries.
// That form costs (C + R) + C = 1088 multiply-adds per (query, key, head) against HF's (Dn + R) + Dv = 320,
// and its head size of 576 has no tensor-core kernel, so prompts decompress instead (mla_decompressed):
// the cached latents go through the joint W_UK / W_UV once per ubatch, and attention runs at head size
// Dn + R = 192. Decode (a few tokens) keeps the absorbed form, which reads only the latent cache.
#include <cmath>

#include "core/models/graph_blocks.h"
#include "core/models/model_graph.h"

namespace moe {
namespace {

using blocks::BuildState;

// DeepSeek's YaRN: cos and sin unscaled (HF multiplies them by mscale / mscale_all_dim, equal in every
// released config; llama.cpp's attn_factor cancels ggml's own factor), and the softmax scale times
// (1 + yarn_log_multiplier * ln(factor))^2.
RopeParams deepseek2_rope(const HParams& hp) {
    RopeParams p;
    p.n_dims = hp.rope_dims;
    p.freq_base = hp.rope_freq_base;
    p.interleaved = true;
    if (hp.rope_yarn_factor > 1.0f) {
        p.freq_scale = 1.0f / hp.rope_yarn_factor;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = hp.rope_yarn_orig_ctx;
        p.attn_factor = 1.0f / (1.0f + 0.1f * std::log(hp.rope_yarn_factor));
        p.beta_fast = hp.rope_yarn_beta_fast;
        p.beta_slow = hp.rope_yarn_beta_slow;
        p.yarn_truncate = true;  // DeepSeek's yarn_find_correction_range floors and ceils
    }
    return p;
}

float deepseek2_kq_scale(const HParams& hp) {
    float m = 1.0f;
    if (hp.rope_yarn_factor > 1.0f) m = 1.0f + hp.rope_yarn_log_mul * std::log(hp.rope_yarn_factor);
    return m * m / std::sqrt(static_cast<float>(hp.head_dim));
}

Tensor* mla_attention(BuildState& s, const LayerWeights& l, int il, Tensor* x) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    const int64_t T = s.n_tokens, H = hp.n_head, R = hp.rope_dims, C = hp.kv_lora_rank;
    const int64_t Dn = hp.head_dim - R;
    const RopeParams rp = deepseek2_rope(hp);

    Tensor* q = l.wq_a != nullptr ? g.mul_mat(l.wq_b, g.rms_norm(g.mul_mat(l.wq_a, x), l.q_a_norm, hp.rms_eps))
                                  : g.mul_mat(l.wq, x);
    q = g.reshape(q, {hp.head_dim, H, T});
    Tensor* q_nope = g.view(q, {Dn, H, T}, {q->nb[1], q->nb[2]}, 0);
    Tensor* q_rope = g.rope(g.view(q, {R, H, T}, {q->nb[1], q->nb[2]}, static_cast<size_t>(Dn) * sizeof(float)),
                            s.positions, rp);

    Tensor* kv = g.mul_mat(l.wkv_a, x);  // [C + R, T]
    Tensor* latent = g.rms_norm(g.view(kv, {C, T}, {kv->nb[1]}, 0), l.kv_a_norm, hp.rms_eps);
    Tensor* k_rope = g.rope(g.view(kv, {R, 1, T}, {kv->nb[1], kv->nb[1]}, static_cast<size_t>(C) * sizeof(float)),
                            s.positions, rp);

    Tensor* cache = s.kv.k[static_cast<size_t>(il)];  // [C + R, 1, n_ctx]
    blocks::write_cache(s, latent, cache);
    blocks::write_cache(s, k_rope, cache, static_cast<size_t>(C) * cache->nb[0]);
    const int n_written = s.n_past + s.n_tokens;

    Tensor* out = nullptr;  // [Dv, H, T]
    if (mla_decompressed(hp, s.n_tokens, n_written)) {
        // Up-projects every row it reads: the exact rows, whatever the addressing.
        const int n_kv = n_written;
        Tensor* rows = blocks::cache_rows(g, cache, 0, n_kv);
        // HF's own form: every cached latent row up-projected into per-head keys [W_UK_h c, k_rope] and
        // values W_UV_h c, then attention with head size Dn + R. The values are padded to that size with
        // the rope key (any values would do: their outputs are dropped), so that K and V share one head
        // size; this needs Dv = Dn, which mla_decompressed checks.
        Tensor* latent_rows = g.concat(g.view(rows, {C, n_kv}, {rows->nb[2]}, 0), nullptr);  // F32 [C, n_kv]
        Tensor* kv_heads = g.mul_mat(l.wkv_b, latent_rows);  // [H * (Dn + Dv), n_kv]
        const size_t head_bytes = static_cast<size_t>(Dn + hp.head_dim_v) * sizeof(float);
        Tensor* k_nope = g.view(kv_heads, {Dn, H, n_kv}, {head_bytes, kv_heads->nb[1]}, 0);
        Tensor* v = g.view(kv_heads, {hp.head_dim_v, H, n_kv}, {head_bytes, kv_heads->nb[1]},
                           static_cast<size_t>(Dn) * sizeof(float));
        Tensor* rope_rows =
            g.view(rows, {R, 1, n_kv}, {rows->nb[1], rows->nb[2]}, static_cast<size_t>(C) * rows->nb[0]);
        Tensor* k = g.concat(k_nope, rope_rows, Type::F16);  // [Dn + R, H, n_kv]
        Tensor* v_padded = g.concat(v, rope_rows, Type::F16);  // [Dv + R, H, n_kv]
        Tensor* att = g.attention(g.concat(q_nope, q_rope), k, v_padded, s.positions, nullptr, deepseek2_kq_scale(hp),
                                  0, n_kv);
        out = g.concat(g.view(att, {hp.head_dim_v, H, T}, {att->nb[1], att->nb[2]}, 0), nullptr);
    } else {
        const int n_kv = blocks::attended_rows(s);
        Tensor* rows = blocks::cache_rows(g, cache, 0, n_kv);
        Tensor* q_latent = g.concat(g.mul_mat_heads(l.wk_b, q_nope), q_rope);  // [C + R, H, T]
        Tensor* att = g.attention(q_latent, rows, rows, s.positions, nullptr, deepseek2_kq_scale(hp), 0, n_kv);
        Tensor* att_latent = g.view(att, {C, H, T}, {att->nb[1], att->nb[2]}, 0);
        out = g.mul_mat_heads(l.wv_b, att_latent);
    }
    return g.mul_mat(l.wo, g.reshape(out, {hp.head_dim_v * H, T}));
}

// V2: softmax over all experts; V3 / Kimi-K2: sigmoid, the selection steered by exp_probs_b. Both may
// limit the choice to the best expert groups; the weights are normalised and scaled as the file says.
blocks::Routing route(BuildState& s, const LayerWeights& l, Tensor* x) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    Tensor* logits = g.mul_mat(l.router, x);  // [n_expert, T]
    const blocks::GroupLimit groups{hp.n_expert_group, hp.n_expert_group_used};
    if (hp.expert_gating_sigmoid) {
        return blocks::route_biased_sigmoid(g, logits, l.exp_probs_b, hp.n_expert_used, hp.expert_weights_norm,
                                            hp.expert_weights_scale, groups);
    }
    Tensor* probs = g.softmax(logits);
    Tensor* ids = g.topk(blocks::limit_groups(g, probs, groups, 1), hp.n_expert_used);
    return {ids, g.norm_scale(g.gather(probs, ids), hp.expert_weights_norm, hp.expert_weights_scale)};
}

}  // namespace

bool mla_decompressed(const HParams& hp, int n_tokens, int n_kv) {
    return hp.arch == Arch::DEEPSEEK2 && n_tokens >= kMlaDecompressMinTokens && n_kv <= kMlaDecompressMaxKv &&
           hp.head_dim_v == hp.head_dim - hp.rope_dims;
}

namespace blocks {

Tensor* deepseek2_layers(BuildState& s, const ModelWeights& w, Tensor* cur) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    for (int il = 0; il < hp.n_layer; ++il) {
        g.set_layer(il);
        const LayerWeights& l = w.layers[static_cast<size_t>(il)];
        cur = g.add(cur, mla_attention(s, l, il, g.rms_norm(cur, l.attn_norm, hp.rms_eps)));
        Tensor* h = g.rms_norm(cur, l.ffn_norm, hp.rms_eps);
        if (il < hp.n_layer_dense_lead) {
            cur = g.add(cur, blocks::swiglu_ffn(g, l.ffn_up, l.ffn_gate, l.ffn_down, h));
            continue;
        }
        const blocks::Routing r = route(s, l, h);
        cur = g.add(cur, blocks::routed_and_shared_experts(s, l, h, r));
    }
    g.set_layer(-1);
    return cur;
}

}  // namespace blocks
}  // namespace moe
