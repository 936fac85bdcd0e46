// Graph builders for qwen3moe and gpt-oss. The two share the block structure (pre-norm attention,
// pre-norm MoE, residuals); they differ in q/k norms vs biases, RoPE scaling, sinks, sliding
// window, router weighting and the expert activation.
#include "core/models/model_graph.h"

#include <algorithm>
#include <cmath>

namespace moe {
namespace {

struct BuildState {
    Graph& g;
    const HParams& hp;
    const KvCache& kv;
    Tensor* positions;
    int n_tokens;
    int n_past;
};

// x + b when b exists.
Tensor* add_opt(Graph& g, Tensor* x, Tensor* b) { return b ? g.add(x, b) : x; }

// View of layer il's cache rows [first, first + count) as [D, Hkv, count].
Tensor* cache_rows(Graph& g, Tensor* cache, int first, int count) {
    return g.view(cache, {cache->ne[0], cache->ne[1], count}, {cache->nb[1], cache->nb[2]},
                  static_cast<size_t>(first) * cache->nb[2]);
}

Tensor* build_attention(BuildState& s, const LayerWeights& l, int il, Tensor* x) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    const int64_t D = hp.head_dim, T = s.n_tokens;

    Tensor* q = g.reshape(add_opt(g, g.mul_mat(l.wq, x), l.bq), {D, hp.n_head, T});
    Tensor* k = g.reshape(add_opt(g, g.mul_mat(l.wk, x), l.bk), {D, hp.n_head_kv, T});
    Tensor* v = g.reshape(add_opt(g, g.mul_mat(l.wv, x), l.bv), {D, hp.n_head_kv, T});
    if (l.q_norm) q = g.rms_norm(q, l.q_norm, hp.rms_eps);  // per-head norm over head_dim
    if (l.k_norm) k = g.rms_norm(k, l.k_norm, hp.rms_eps);
    const RopeParams rp = rope_params_for(hp);
    q = g.rope(q, s.positions, rp);
    k = g.rope(k, s.positions, rp);

    Tensor* k_cache = s.kv.k[static_cast<size_t>(il)];
    Tensor* v_cache = s.kv.v[static_cast<size_t>(il)];
    g.cpy(k, cache_rows(g, k_cache, s.n_past, s.n_tokens));
    g.cpy(v, cache_rows(g, v_cache, s.n_past, s.n_tokens));
    const int n_kv = s.n_past + s.n_tokens;

    // gpt-oss: even layers use the sliding window, odd layers full attention.
    const int window = (hp.arch == Arch::GPT_OSS && il % 2 == 0) ? hp.sliding_window : 0;
    Tensor* att = g.attention(q, cache_rows(g, k_cache, 0, n_kv), cache_rows(g, v_cache, 0, n_kv), s.positions,
                              l.sinks, 1.0f / std::sqrt(static_cast<float>(D)), window, n_kv);
    att = g.reshape(att, {D * hp.n_head, T});
    return add_opt(g, g.mul_mat(l.wo, att), l.bo);
}

// The experts' part of an expert block: up/gate, down, their biases and the weighted sum. masked: ids
// may be kNoExpert (a part of a split block), whose rows the weighted sum must skip.
Tensor* build_experts(BuildState& s, const LayerWeights& l, Tensor* x, Tensor* ids, Tensor* weights, bool masked) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    const int64_t T = s.n_tokens, k = hp.n_expert_used;
    const Activation act = hp.arch == Arch::GPT_OSS ? Activation::SWIGLU_OAI : Activation::SILU;
    Tensor* h = g.moe_up_gate(l.up_exps, l.gate_exps, x, ids, l.up_exps_bias, l.gate_exps_bias, act);  // [F, k, T]
    Tensor* y = g.mul_mat_id(l.down_exps, h, ids);                                                      // [E, k, T]
    if (l.down_exps_bias) {
        // Each selected expert's bias: rows of the [E, n_expert] bias picked by the flattened ids.
        Tensor* b = g.get_rows(l.down_exps_bias, g.reshape(ids, {k * T}));
        y = g.add(y, g.reshape(b, {hp.n_embd, k, T}));
    }
    return g.weighted_sum(y, weights, masked ? ids : nullptr);  // [E, T]
}

// groups: nullptr, or this layer's I32 [n_expert] expert groups (a split block).
Tensor* build_moe(BuildState& s, const LayerWeights& l, Tensor* x, Tensor* groups) {
    Graph& g = s.g;
    const HParams& hp = s.hp;

    Tensor* logits = add_opt(g, g.mul_mat(l.router, x), l.router_bias);  // [n_expert, T]
    Tensor* ids = g.topk(logits, hp.n_expert_used);                      // [k, T]
    // Both architectures weight the selected experts by a softmax over their logits: gpt-oss by
    // definition, qwen3moe because a softmax over all experts renormalised over the top-k is the same.
    Tensor* weights = g.softmax(g.gather(logits, ids));  // [k, T]
    if (groups == nullptr) return build_experts(s, l, x, ids, weights, false);

    // Each part sees only its group's experts (the others' pairs are kNoExpert: skipped), so the two
    // weighted sums add up to the whole block's.
    Tensor* part[2] = {};
    for (int32_t group : {1, 0}) {
        g.set_expert_group(group);
        part[group] = build_experts(s, l, x, g.mask_ids(ids, groups, group), weights, true);
    }
    g.set_expert_group(-1);
    return g.add(part[1], part[0]);
}

}  // namespace

RopeParams rope_params_for(const HParams& hp) {
    RopeParams p;
    p.n_dims = hp.head_dim;
    p.freq_base = hp.rope_freq_base;
    if (hp.rope_yarn_factor > 1.0f) {
        p.freq_scale = 1.0f / hp.rope_yarn_factor;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = hp.rope_yarn_orig_ctx;
    }
    return p;
}

UbatchGraph build_model_graph(Graph& g, const HParams& hp, const ModelWeights& w, const KvCache& kv, int n_tokens,
                              int n_past, LogitsMode logits, const std::vector<uint8_t>& split_layers) {
    MOE_ASSERT(n_tokens > 0 && n_past >= 0 && n_past + n_tokens <= kv.n_ctx);
    UbatchGraph out;
    out.tokens = g.input(Type::I32, {n_tokens}, "tokens");
    out.positions = g.input(Type::I32, {n_tokens}, "positions");
    BuildState s{g, hp, kv, out.positions, n_tokens, n_past};
    MOE_ASSERT(split_layers.empty() || split_layers.size() == static_cast<size_t>(hp.n_layer));
    const bool any_split = std::find(split_layers.begin(), split_layers.end(), 1) != split_layers.end();
    if (any_split) out.expert_groups = g.input(Type::I32, {hp.n_expert, hp.n_layer}, "expert_groups");

    Tensor* cur = g.get_rows(w.tok_embd, out.tokens);  // [E, T]
    for (int il = 0; il < hp.n_layer; ++il) {
        g.set_layer(il);
        const LayerWeights& l = w.layers[static_cast<size_t>(il)];
        cur = g.add(cur, build_attention(s, l, il, g.rms_norm(cur, l.attn_norm, hp.rms_eps)));
        Tensor* groups = nullptr;
        if (any_split && split_layers[static_cast<size_t>(il)]) {
            Tensor* all = out.expert_groups;
            groups = g.view(all, {hp.n_expert}, {all->nb[1]}, static_cast<size_t>(il) * all->nb[1]);
        }
        cur = g.add(cur, build_moe(s, l, g.rms_norm(cur, l.ffn_norm, hp.rms_eps), groups));
    }
    g.set_layer(-1);
    if (logits == LogitsMode::NONE) return out;
    if (logits == LogitsMode::LAST && n_tokens > 1) {
        cur = g.view(cur, {hp.n_embd, 1}, {cur->nb[1]}, static_cast<size_t>(n_tokens - 1) * cur->nb[1]);
    }
    cur = g.rms_norm(cur, w.output_norm, hp.rms_eps);
    out.logits = g.mul_mat(w.output, cur);
    g.set_output(out.logits);
    return out;
}

}  // namespace moe
