// The glm4moe graph (GLM-4.5 / 4.6 / 4.5-Air). The spec is Hugging Face's modeling_glm4_moe; tensor names
// follow llama.cpp's glm4moe builder. Per layer (pre-norm, residuals):
//   attention: q/k/v with biases, per-head RMS norms of q and k where the file has them (GLM-4.5, not
//     Air), NeoX rotary over the first rope.dimension_count dims of each head (partial_rotary_factor);
//   FFN: a dense SwiGLU FFN in the first leading_dense_block_count layers; in the others routed experts
//     chosen by a sigmoid router with a selection bias (route_biased_sigmoid), plus the shared experts
//     (one SwiGLU FFN of n_ff_expert * expert_shared_count) on the same input.
#include "core/models/graph_blocks.h"
#include "core/models/model_graph.h"

namespace moe::blocks {

Tensor* glm4moe_layers(BuildState& s, const ModelWeights& w, Tensor* cur) {
    Graph& g = s.g;
    const HParams& hp = s.hp;
    for (int il = 0; il < hp.n_layer; ++il) {
        g.set_layer(il);
        const LayerWeights& l = w.layers[static_cast<size_t>(il)];
        cur = g.add(cur, attention(s, l, il, g.rms_norm(cur, l.attn_norm, hp.rms_eps)));
        Tensor* h = g.rms_norm(cur, l.ffn_norm, hp.rms_eps);
        Tensor* ffn = nullptr;
        if (il < hp.n_layer_dense_lead) {
            ffn = swiglu_ffn(g, l.ffn_up, l.ffn_gate, l.ffn_down, h);
        } else {
            const Routing r = route_biased_sigmoid(g, g.mul_mat(l.router, h), l.exp_probs_b, hp.n_expert_used,
                                                   hp.expert_weights_norm, hp.expert_weights_scale);
            ffn = routed_and_shared_experts(s, l, h, r);
        }
        cur = g.add(cur, ffn);
    }
    g.set_layer(-1);
    return cur;
}

}  // namespace moe::blocks
