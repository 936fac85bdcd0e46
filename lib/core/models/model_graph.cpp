// Graph builders for qwen3moe and gpt-oss. The two share the block structure (pre-norm attention,
// pre-norm MoE, residuals); they differ in q/k norms vs biases, RoPE scaling, sinks, sliding
// window, router weighting and the expert activation.
#include "core/models/model_graph.h"

#include "core/models/graph_blocks.h"

namespace moe {
namespace {

using blocks::BuildState;

// qwen3moe and gpt-oss route alike: top-k of the router's logits, each selected expert weighted by a
// softmax over the selected logits (gpt-oss by definition; qwen3moe because a softmax over all experts
// renormalised over the top-k is the same).
Tensor* build_moe(BuildState& s, const LayerWeights& l, Tensor* x) {
    Graph& g = s.g;
    Tensor* logits = blocks::add_opt(g, g.mul_mat(l.router, x), l.router_bias);  // [n_expert, T]
    Tensor* ids = g.topk(logits, s.hp.n_expert_used);                            // [k, T]
    Tensor* weights = g.softmax(g.gather(logits, ids));                          // [k, T]
    return blocks::routed_experts(s, l, x, ids, weights);
}

// qwen3moe and gpt-oss: pre-norm attention and pre-norm MoE in every layer.
Tensor* moe_layers(BuildState& s, const ModelWeights& w, Tensor* cur) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    for (int il = 0; il < hp.n_layer; ++il) {
        g.set_layer(il);
        const LayerWeights& l = w.layers[static_cast<size_t>(il)];
        cur = g.add(cur, blocks::attention(s, l, il, g.rms_norm(cur, l.attn_norm, hp.rms_eps)));
        cur = g.add(cur, build_moe(s, l, g.rms_norm(cur, l.ffn_norm, hp.rms_eps)));
    }
    g.set_layer(-1);
    return cur;
}

}  // namespace

KvLayout kv_layout(const HParams& hp) {
    if (hp.arch == Arch::DEEPSEEK2) return {hp.kv_lora_rank + hp.rope_dims, 1, 0, 0};
    return {hp.head_dim, hp.n_head_kv, hp.head_dim, hp.n_head_kv};
}

RopeParams rope_params_for(const HParams& hp) {
    RopeParams p;
    p.n_dims = hp.arch == Arch::GLM4MOE ? hp.rope_dims : hp.head_dim;  // glm4moe: partial rotary
    p.freq_base = hp.rope_freq_base;
    if (hp.rope_yarn_factor > 1.0f) {
        p.freq_scale = 1.0f / hp.rope_yarn_factor;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = hp.rope_yarn_orig_ctx;
    }
    return p;
}

UbatchGraph build_model_graph(Graph& g, const HParams& hp, const ModelWeights& w, const KvCache& kv, int n_tokens,
                              int n_past, LogitsMode logits, KvAddressing kv_addressing) {
    MOE_ASSERT(n_tokens > 0 && n_past >= 0 && n_past + n_tokens <= kv.n_ctx);
    UbatchGraph out;
    out.tokens = g.input(Type::I32, {n_tokens}, "tokens");
    out.positions = g.input(Type::I32, {n_tokens}, "positions");
    BuildState s{g, hp, kv, out.positions, n_tokens, n_past, kv_addressing};

    Tensor* cur = g.get_rows(w.tok_embd, out.tokens);  // [E, T]
    if (hp.arch == Arch::DEEPSEEK2) {
        cur = blocks::deepseek2_layers(s, w, cur);
    } else if (hp.arch == Arch::GLM4MOE) {
        cur = blocks::glm4moe_layers(s, w, cur);
    } else {
        cur = moe_layers(s, w, cur);
    }
    blocks::output_logits(g, hp, w, cur, n_tokens, logits, out);
    return out;
}

}  // namespace moe
