// The blocks every architecture's graph is made of: attention with a KV cache, the routed-expert
// block, and the helpers they share. Internal to lib/core/models: each
// architecture's builder (model_graph.cpp and the graph_<arch>.cpp files) composes these.
#pragma once

#include "core/graph.h"
#include "core/models/model_graph.h"

namespace moe::blocks {

// What every block of one ubatch's graph needs to know.
struct BuildState {
    Graph& g;
    const HParams& hp;
    const KvCache& kv;
    Tensor* positions;
    int n_tokens;
    int n_past;
    KvAddressing kv_addressing;
};

// x + b when b exists.
Tensor* add_opt(Graph& g, Tensor* x, Tensor* b);

// View of a [D, Hkv, n_ctx] cache's rows [first, first + count) as [D, Hkv, count].
Tensor* cache_rows(Graph& g, Tensor* cache, int first, int count);

// Writes src [A, B, T] (or [A, T]: B = 1; the ubatch's tokens) into the cache's rows of its positions, at
// byte `column` of each cache row (A * B elements from there, in the cache's strides), as
// s.kv_addressing says.
void write_cache(BuildState& s, Tensor* src, Tensor* cache, size_t column = 0);

// The cache rows attention reads after this ubatch's writes (KvAddressing).
int attended_rows(const BuildState& s);

// Self-attention of layer il on normalised input x: projections (+ biases), per-head q/k norms, RoPE
// (rope_params_for), cache write, attention over the cache, output projection. Returns [n_embd, T].
Tensor* attention(BuildState& s, const LayerWeights& l, int il, Tensor* x);

// A sigmoid router's choice (glm4moe; deepseek2 V3 / Kimi-K2): scores = sigmoid(logits) [n_expert, T];
// the k experts of largest scores + bias (bias [n_expert] may be nullptr) are chosen, each weighted by
// its unbiased score; the k weights are divided by their sum when `normalize`, then times `scale`.
struct Routing {
    Tensor* ids;      // I32 [k, T]
    Tensor* weights;  // F32 [k, T]
};
// Group-limited routing (deepseek2): the experts form n_group groups of consecutive experts, and only
// those of the n_used best groups may be chosen. {1, 1}: no limit.
struct GroupLimit {
    int n_group = 1;
    int n_used = 1;
};
// x [n_expert, T] with the entries outside each token's best groups set to -inf (a group scores the sum
// of its top_n entries); x itself when `groups` sets no limit.
Tensor* limit_groups(Graph& g, Tensor* x, GroupLimit groups, int top_n);

// With a group limit, the biased scores choose the groups too, each scored by its two best (DeepSeek-V3).
Routing route_biased_sigmoid(Graph& g, Tensor* logits, Tensor* bias, int k, bool normalize, float scale,
                             GroupLimit groups = {});

// A SwiGLU feed-forward block: down (silu(gate x) * up x). The leading dense layers and the shared
// experts are this block.
Tensor* swiglu_ffn(Graph& g, Tensor* up, Tensor* gate, Tensor* down, Tensor* x);

// The routed-expert block on normalised input x, given the router's choice: ids I32 [k, T] and
// weights F32 [k, T]: MOE_UP_GATE, MUL_MAT_ID, the down biases where the layer has them, and the
// WEIGHTED_SUM (the shape the expert split's rewrite, sched/expert_split_rewrite.h, looks for).
// Returns [n_embd, T].
Tensor* routed_experts(BuildState& s, const LayerWeights& l, Tensor* x, Tensor* ids, Tensor* weights);

// The routed experts chosen by r (as routed_experts) plus the shared experts where the layer has them
// (deepseek2, glm4moe: one SwiGLU FFN on the same input h). Returns [n_embd, T].
Tensor* routed_and_shared_experts(BuildState& s, const LayerWeights& l, Tensor* h, const Routing& r);

// The final norm and output projection of the last hidden state (or all of them); sets out.logits.
void output_logits(Graph& g, const HParams& hp, const ModelWeights& w, Tensor* cur, int n_tokens,
                   LogitsMode logits, UbatchGraph& out);

// The layers of a glm4moe model (graph_glm4moe.cpp) on the embeddings cur; returns the last hidden
// state.
Tensor* glm4moe_layers(BuildState& s, const ModelWeights& w, Tensor* cur);

// The layers of a deepseek2 model (graph_deepseek2.cpp) on the embeddings cur; returns the last
// hidden state.
Tensor* deepseek2_layers(BuildState& s, const ModelWeights& w, Tensor* cur);

}  // namespace moe::blocks
