// Model graphs: the weights each architecture needs (validated by name, shape and type at bind time)
// and the per-ubatch graph builders. Builders never know where ops will run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/models/hparams.h"

namespace moe {

struct LayerWeights {
    Tensor* attn_norm = nullptr;
    Tensor *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    Tensor *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;  // gpt-oss
    Tensor *q_norm = nullptr, *k_norm = nullptr;                          // qwen3moe
    Tensor* sinks = nullptr;                                              // gpt-oss
    Tensor* ffn_norm = nullptr;  // qwen3moe ffn_norm, gpt-oss post_attention_norm
    Tensor *router = nullptr, *router_bias = nullptr;
    Tensor *up_exps = nullptr, *gate_exps = nullptr, *down_exps = nullptr;
    Tensor *up_exps_bias = nullptr, *gate_exps_bias = nullptr, *down_exps_bias = nullptr;  // gpt-oss
    Tensor* exp_probs_b = nullptr;  // sigmoid routers (glm4moe, deepseek2): the experts' selection bias [n_expert]
    Tensor *up_shexp = nullptr, *gate_shexp = nullptr, *down_shexp = nullptr;  // shared experts (dense)
    Tensor *ffn_up = nullptr, *ffn_gate = nullptr, *ffn_down = nullptr;        // a leading dense layer's FFN
    // deepseek2 multi-head latent attention: q through a LoRA (wq_a, q_a_norm, wq_b) or wq; the latent and
    // the rope key from wkv_a; the up-projections of the latent per head, wk_b / wv_b, and joint, wkv_b
    // (whichever form a file lacks is made at load: mla_split.h).
    Tensor *wq_a = nullptr, *q_a_norm = nullptr, *wq_b = nullptr;
    Tensor *wkv_a = nullptr, *kv_a_norm = nullptr, *wk_b = nullptr, *wv_b = nullptr;
    Tensor* wkv_b = nullptr;  // the joint up-projection [C, H * (nope + v)] that prefill decompresses with
};

struct ModelWeights {
    Tensor* tok_embd = nullptr;
    Tensor* output_norm = nullptr;
    Tensor* output = nullptr;
    std::vector<LayerWeights> layers;
};

// Returns the weight tensor called `name` (a leaf with type and shape from the file), or nullptr.
using WeightLookup = std::function<Tensor*(const std::string& name)>;

// Finds and validates every tensor the architecture needs. Missing tensor -> NOT_FOUND naming it;
// wrong shape or type -> DATA_CORRUPT naming the tensor, the expected and the actual shape.
StatusOr<ModelWeights> bind_weights(const HParams& hp, const WeightLookup& lookup);

// The KV cache the graphs read and write: per layer K and V of shape [head_dim, n_head_kv, n_ctx];
// deepseek2 keeps per layer only K = [kv_lora_rank + rope dims, 1, n_ctx] (the latent and the rope key,
// which the absorbed attention reads as both its keys and its values), and v is empty.
struct KvCache {
    std::vector<Tensor*> k;
    std::vector<Tensor*> v;
    int n_ctx = 0;
};

struct UbatchGraph {
    Tensor* tokens = nullptr;     // input I32 [n_tokens]
    Tensor* positions = nullptr;  // input I32 [n_tokens]
    Tensor* logits = nullptr;     // output F32 [n_vocab, n_tokens or 1]; nullptr for LogitsMode::NONE
};

enum class LogitsMode { NONE, LAST, ALL };

// How a ubatch's graph addresses the KV cache. EXACT: the writes are views of rows n_past .. n_past +
// n_tokens - 1, and attention reads n_past + n_tokens rows. STABLE: the writes go to the rows the
// positions input names (CPY with rows), and attention reads n_past + n_tokens rounded up to a multiple
// of kKvPad (at most n_ctx; the keys past a query's position are masked by the positions, so no
// kernel reads them): a decode step's nodes are then the same for kKvPad tokens in a row, and a CUDA
// backend replays its graphs without capturing them again. The values are the same either way, up to
// the order of the attention's split sums. (deepseek2's prompts, which up-project every cached row,
// read the exact rows.)
enum class KvAddressing { EXACT, STABLE };
constexpr int kKvPad = 256;

// Builds the graph of one ubatch of n_tokens tokens at positions n_past .. n_past + n_tokens - 1.
// REQUIRES: n_past + n_tokens <= kv.n_ctx.
// NONE still writes the KV cache (a ubatch whose logits nobody wants skips the output projection).
// Each MoE layer has one expert block (graph_blocks.h: routed_experts), whichever backends will run
// it: a scheduler that computes a block in parts rewrites the built graph (sched/expert_split_rewrite.h).
UbatchGraph build_model_graph(Graph& g, const HParams& hp, const ModelWeights& w, const KvCache& kv, int n_tokens,
                              int n_past, LogitsMode logits, KvAddressing kv_addressing = KvAddressing::EXACT);

// deepseek2: whether a ubatch of n_tokens tokens over n_kv cached rows attends with keys and values
// decompressed per head (prompts: far fewer operations, on the tensor cores) rather than in latent space
// (decode). The decompressed keys and values take (Dn + R) * 2 * 2 bytes per head and cached row, plus
// the F32 up-projection, ~224 KB a row for DeepSeek-V3: above kMlaDecompressMaxKv rows the ubatch keeps
// the latent form, so that activations stay under ~2 GB at any context length.
inline constexpr int kMlaDecompressMinTokens = 32;
inline constexpr int kMlaDecompressMaxKv = 8192;
bool mla_decompressed(const HParams& hp, int n_tokens, int n_kv);

// The RoPE parameters of an architecture.
RopeParams rope_params_for(const HParams& hp);

// The shape of one layer's K and V cache rows: [row, heads] each; a V row of 0 means no V cache.
struct KvLayout {
    int64_t k_row, k_heads, v_row, v_heads;
};
KvLayout kv_layout(const HParams& hp);

// The weight whose placement decides where layer l's attention (and its KV cache) runs.
inline Tensor* attention_anchor(const LayerWeights& l) { return l.wq != nullptr ? l.wq : l.wq_a; }

}  // namespace moe
