// The shared blocks of the model graphs (see graph_blocks.h).
#include "core/models/graph_blocks.h"

#include <algorithm>
#include <cmath>

namespace moe::blocks {

Tensor* add_opt(Graph& g, Tensor* x, Tensor* b) { return b ? g.add(x, b) : x; }

Tensor* cache_rows(Graph& g, Tensor* cache, int first, int count) {
    return g.view(cache, {cache->ne[0], cache->ne[1], count}, {cache->nb[1], cache->nb[2]},
                  static_cast<size_t>(first) * cache->nb[2]);
}

void write_cache(BuildState& s, Tensor* src, Tensor* cache, size_t column) {
    Graph& g = s.g;
    const int64_t a = src->ne[0], b = src->n_elements() / (a * s.n_tokens);
    if (s.kv_addressing == KvAddressing::STABLE) {
        if (src->ne[1] != b || src->ne[2] != s.n_tokens) src = g.reshape(src, {a, b, s.n_tokens});
        g.cpy_rows(src, g.view(cache, {a, b, cache->ne[2]}, {cache->nb[1], cache->nb[2]}, column), s.positions);
    } else {
        const size_t first = column + static_cast<size_t>(s.n_past) * cache->nb[2];
        g.cpy(src, g.view(cache, {a, b, s.n_tokens}, {cache->nb[1], cache->nb[2]}, first));
    }
}

int attended_rows(const BuildState& s) {
    const int n = s.n_past + s.n_tokens;
    if (s.kv_addressing == KvAddressing::EXACT) return n;
    return std::min(s.kv.n_ctx, (n + kKvPad - 1) / kKvPad * kKvPad);
}

Tensor* attention(BuildState& s, const LayerWeights& l, int il, Tensor* x) {
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
    write_cache(s, k, k_cache);
    write_cache(s, v, v_cache);
    const int n_kv = attended_rows(s);

    // gpt-oss: even layers use the sliding window, odd layers full attention.
    const int window = (hp.arch == Arch::GPT_OSS && il % 2 == 0) ? hp.sliding_window : 0;
    Tensor* att = g.attention(q, cache_rows(g, k_cache, 0, n_kv), cache_rows(g, v_cache, 0, n_kv), s.positions,
                              l.sinks, 1.0f / std::sqrt(static_cast<float>(D)), window, n_kv);
    att = g.reshape(att, {D * hp.n_head, T});
    return add_opt(g, g.mul_mat(l.wo, att), l.bo);
}

Tensor* limit_groups(Graph& g, Tensor* x, GroupLimit groups, int top_n) {
    if (groups.n_used >= groups.n_group) return x;
    return g.group_mask(x, groups.n_group, groups.n_used, top_n);
}

Routing route_biased_sigmoid(Graph& g, Tensor* logits, Tensor* bias, int k, bool normalize, float scale,
                             GroupLimit groups) {
    Tensor* scores = g.sigmoid(logits);                        // [n_expert, T]
    Tensor* choice = limit_groups(g, add_opt(g, scores, bias), groups, 2);
    Tensor* ids = g.topk(choice, k);                           // the bias steers the choice only
    Tensor* weights = g.norm_scale(g.gather(scores, ids), normalize, scale);
    return {ids, weights};
}

Tensor* swiglu_ffn(Graph& g, Tensor* up, Tensor* gate, Tensor* down, Tensor* x) {
    return g.mul_mat(down, g.swiglu(g.mul_mat(gate, x), g.mul_mat(up, x)));
}

Tensor* routed_experts(BuildState& s, const LayerWeights& l, Tensor* x, Tensor* ids, Tensor* weights) {
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
    return g.weighted_sum(y, weights);  // [E, T]
}

Tensor* routed_and_shared_experts(BuildState& s, const LayerWeights& l, Tensor* h, const Routing& r) {
    Tensor* out = routed_experts(s, l, h, r.ids, r.weights);
    if (l.up_shexp == nullptr) return out;
    return s.g.add(out, swiglu_ffn(s.g, l.up_shexp, l.gate_shexp, l.down_shexp, h));
}

void output_logits(Graph& g, const HParams& hp, const ModelWeights& w, Tensor* cur, int n_tokens,
                   LogitsMode logits, UbatchGraph& out) {
    if (logits == LogitsMode::NONE) return;
    if (logits == LogitsMode::LAST && n_tokens > 1) {
        cur = g.view(cur, {hp.n_embd, 1}, {cur->nb[1]}, static_cast<size_t>(n_tokens - 1) * cur->nb[1]);
    }
    cur = g.rms_norm(cur, w.output_norm, hp.rms_eps);
    out.logits = g.mul_mat(w.output, cur);
    g.set_output(out.logits);
}

}  // namespace moe::blocks
