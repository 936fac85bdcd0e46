// Hyper-parameters of the supported architectures, read from GGUF metadata and tensor shapes.
#pragma once

#include <cstdint>
#include <string>

#include "core/gguf.h"
#include "core/status.h"

namespace moe {

enum class Arch { QWEN3MOE, GPT_OSS, DEEPSEEK2, GLM4MOE };

struct HParams {
    Arch arch = Arch::QWEN3MOE;
    std::string arch_name;  // as in general.architecture
    std::string name;       // general.name ("" when absent)
    int n_layer = 0;
    int n_embd = 0;
    int n_vocab = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int n_expert = 0;
    int n_expert_used = 0;
    int n_ff_expert = 0;
    int n_ctx_train = 0;
    int sliding_window = 0;       // gpt-oss: window of the sliding layers (even layers); 0 = none
    float rms_eps = 1e-6f;
    float rope_freq_base = 10000.0f;
    float rope_yarn_factor = 1.0f;  // gpt-oss YaRN scaling factor (1 = no scaling)
    int rope_yarn_orig_ctx = 0;     // YaRN original context length
    int rope_dims = 0;              // rope.dimension_count: dims rotated per head (glm4moe: < head_dim)
    // Leading dense layers, shared experts and sigmoid routing (glm4moe, deepseek2).
    int n_layer_dense_lead = 0;        // leading_dense_block_count: the first layers have a dense FFN
    int n_ff = 0;                      // feed_forward_length: the dense FFN's size
    int n_expert_shared = 0;           // expert_shared_count: shared experts' FFN = n_ff_expert * this
    bool expert_weights_norm = false;  // the top-k weights divided by their sum
    float expert_weights_scale = 1.0f; // then times this
    int n_nextn_layer = 0;             // nextn_predict_layers: trailing MTP layers of the file, not run
    // deepseek2: routing and multi-head latent attention (MLA). head_dim is the query/key head size
    // (qk_nope + qk_rope, key_length_mla), rope_dims the rope part of it (qk_rope).
    bool expert_gating_sigmoid = false;  // expert_gating_func 2 (V3, Kimi-K2); else softmax (V2)
    int n_expert_group = 1;              // expert_group_count: top-k only within the best groups
    int n_expert_group_used = 1;         // expert_group_used_count
    int q_lora_rank = 0;                 // attention.q_lora_rank; 0 = a plain attn_q (V2-Lite)
    int kv_lora_rank = 0;                // attention.kv_lora_rank: the cached latent's size
    int head_dim_v = 0;                  // value head size (value_length_mla)
    float rope_yarn_log_mul = 0.0f;      // rope.scaling.yarn_log_multiplier (0.1 * HF mscale_all_dim)
    float rope_yarn_beta_fast = 32.0f;   // rope.scaling.yarn_beta_fast
    float rope_yarn_beta_slow = 1.0f;    // rope.scaling.yarn_beta_slow
};

// Reads and validates every hyper-parameter, so that a bad file fails at load rather than at the
// first decode (or never). n_layer is the layers a forward pass runs: block_count less glm4moe's
// nextn_predict_layers (multi-token-prediction layers the file holds after them, never run).
// Unknown architecture, or RoPE scaling other than gpt-oss's YaRN -> UNIMPLEMENTED; a key missing,
// of the wrong type, out of range (counts in [1, 2^30], floats finite: freq_base > 0, rms epsilon
// >= 0, YaRN factor >= 1) or inconsistent with another (head counts, expert counts, head sizes,
// block_count against the file's blk.N tensors) -> DATA_CORRUPT naming the full key and the value.
StatusOr<HParams> read_hparams(const GgufFile& file);

// True for expert tensors (blk.N.ffn_{gate,up,down}_exps.{weight,bias}).
bool is_expert_tensor_name(const std::string& name);

// The layer N of a "blk.N.*" tensor; -1 for a tensor outside the layers.
int64_t tensor_layer(const std::string& name);

}  // namespace moe
