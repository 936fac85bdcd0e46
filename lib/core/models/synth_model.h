// Internals of the synthetic model generator, shared by synth*.cpp: the resolved configuration,
// the tensor list with each tensor's initialiser, and the per-architecture parts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf_writer.h"
#include "core/models/hparams.h"
#include "core/status.h"
#include "core/types.h"
#include "moeinfer/moeinfer.h"

namespace moe::synth {

// A mix of types by tensor role (synth_recipes.cpp); NONE: experts expert_type, the rest dense_type.
enum class Recipe { NONE, Q4_K_M, Q5_K_M, Q3_K_XL, IQ4_XS };

// deepseek2's shape beyond the common fields (a preset's; synth_deepseek2.cpp).
struct Deepseek2Shape {
    int q_lora_rank = 0;  // 0: a plain attn_q
    int kv_lora_rank = 0;
    int rope_dims = 0;    // of head_dim (qk_nope + qk_rope)
    int head_dim_v = 0;
    int n_layer_dense_lead = 0;
    int n_ff = 0;         // the dense layers' FFN
    int n_expert_shared = 0;
    int n_expert_group = 1;
    int n_expert_group_used = 1;
    bool gating_sigmoid = false;
    bool weights_norm = false;
    float weights_scale = 1.0f;
    float yarn_log_mul = 0.0f;
    float yarn_beta_fast = 32.0f;
    float yarn_beta_slow = 1.0f;
};

// glm4moe's shape beyond the common fields (a preset's; synth_glm4moe.cpp).
struct Glm4moeShape {
    int rope_dims = 0;  // of head_dim (partial rotary)
    int n_layer_dense_lead = 0;
    int n_ff = 0;       // the dense layers' FFN
    int n_expert_shared = 0;
    float weights_scale = 1.0f;
    bool qk_norm = false;
    int n_nextn = 0;    // NextN layers after the n_layer transformer layers
};

// Everything that decides the file's bytes, after presets and overrides are merged and validated.
struct Config {
    Arch arch = Arch::QWEN3MOE;
    std::string arch_name;  // "qwen3moe" / "gpt-oss"
    std::string preset;     // "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b", "tiny", ...
    int n_layer = 0;
    int n_embd = 0;
    int n_vocab = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int n_expert = 0;
    int n_expert_used = 0;
    int n_ff_expert = 0;
    // From the preset only (no override fields in moe_synth_params).
    int n_ctx_train = 0;
    int sliding_window = 0;      // gpt-oss
    float rope_theta = 0.0f;
    float rms_eps = 0.0f;
    float yarn_factor = 0.0f;    // gpt-oss; 0 = no YaRN
    int yarn_orig_ctx = 0;
    Type expert_type = Type::Q8_0;
    Type dense_type = Type::F16;
    Recipe recipe = Recipe::NONE;  // overrides expert_type and dense_type by role
    uint64_t seed = 0;
    float routing_skew = 0.0f;
    Deepseek2Shape ds;  // deepseek2 only
    Glm4moeShape glm;   // glm4moe only
};

// Merges the preset with the fields of `p` inside p.struct_size and validates the result; every
// error is INVALID_ARGUMENT and names the field.
StatusOr<Config> resolve_config(const moe_synth_params& p);

// How a tensor's values are drawn (see synth_weights.cpp for the formulas).
enum class Init {
    UNIFORM,      // mean + U(-a, a) with a = std * sqrt(3)
    EMBEDDING,    // UNIFORM with std 1; qwen3moe also sets channel 0 to 1 (the router's bias channel)
    ROUTER,       // rows (one per expert) of unit L2 norm; qwen3moe: channel 0 carries the skew offset
    ROUTER_BIAS,  // gpt-oss ffn_gate_inp.bias: the skew offsets
    SELECTION_BIAS,  // deepseek2 exp_probs_b (sigmoid scores): U std 0.05 plus the skew offsets / 4 (score units)
};

struct TensorSpec {
    std::string name;
    Type type = Type::F32;
    std::vector<int64_t> ne;  // GGUF order, ne[0] fastest
    Init init = Init::UNIFORM;
    float mean = 0.0f;
    float std = 0.0f;
    int layer = -1;  // for ROUTER / ROUTER_BIAS: whose expert ranking to use

    int64_t row_len() const { return ne[0]; }
    int64_t n_rows() const {
        int64_t r = 1;
        for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
        return r;
    }
};

// Per architecture: the tensors in file order and the architecture's metadata keys.
std::vector<TensorSpec> qwen3moe_tensors(const Config& c);
void qwen3moe_metadata(GgufWriter& w, const Config& c);
std::vector<TensorSpec> gpt_oss_tensors(const Config& c);
void gpt_oss_metadata(GgufWriter& w, const Config& c);
std::vector<TensorSpec> deepseek2_tensors(const Config& c);
void deepseek2_metadata(GgufWriter& w, const Config& c);
// The deepseek2 shape of `preset`; false for a preset that has none.
bool deepseek2_shape(std::string_view preset, Deepseek2Shape* out);

std::vector<TensorSpec> glm4moe_tensors(const Config& c);
void glm4moe_metadata(GgufWriter& w, const Config& c);
// The glm4moe shape of `preset`; false for a preset that has none.
bool glm4moe_shape(std::string_view preset, Glm4moeShape* out);
// Leading dense layers of a model of n_layer layers cut from a preset of preset_layers layers with
// `lead` of them.
int scaled_dense_layers(int lead, int preset_layers, int n_layer);

// ---- type recipes (synth_recipes.cpp) ----

// By name ("q4_k_m", "q5_k_m", "q3_k_xl", "iq4_xs", ASCII case ignored); false for other names.
bool find_recipe(std::string_view name, Recipe* out);
const char* recipe_name(Recipe r);
// llama.cpp's llama_ftype of a file of recipe r (general.file_type; informational).
uint32_t recipe_file_type(Recipe r);
// "q4_k_m, q5_k_m, ...": for error messages.
std::string recipe_names();
// Sets the type of every weight by its role and layer as c.recipe says (nothing without a recipe).
void apply_recipe(const Config& c, std::vector<TensorSpec>& tensors);

// Shared metadata: general.*, moeinfer.synthetic.*, and the minimal tokenizer.
void common_metadata(GgufWriter& w, const Config& c);

// Relative scale of the output projections (attn_output, ffn_down_exps): each layer adds a small
// fraction to the residual stream, so the token embeddings keep dominating it.
inline constexpr float kOutputProjScale = 0.2f;
// Spread of norm weights around 1, and the std of biases.
inline constexpr float kNormSpread = 0.1f;
inline constexpr float kBiasStd = 0.02f;

// Tensor specs used by both architectures.
TensorSpec dense_weight(std::string name, const Config& c, int64_t fan_in, int64_t n_out, float scale = 1.0f);
TensorSpec norm_weight(std::string name, int64_t n);
TensorSpec bias(std::string name, std::vector<int64_t> ne);

// ---- weights (synth_weights.cpp) ----

// The logit offset that routing_skew gives the expert of popularity rank r (0 = most popular) of
// n: offset = -kSkewLogitRange * skew * r / (n - 1). Router logits are ~N(0, 1) per token and
// expert, so at skew 0.9 the least popular expert sits 4.5 standard deviations below the most
// popular one and is practically never in the top-k.
inline constexpr float kSkewLogitRange = 5.0f;
float skew_offset(float skew, int rank, int n_expert);
// Popularity rank of each expert of a layer: a permutation of [0, n_expert) drawn from the seed,
// so the rarely chosen experts are scattered over the index range as in a trained model.
std::vector<int> expert_ranks(uint64_t seed, int layer, int n_expert);

// Rows per generation chunk of a tensor: a function of its shape only, so the bytes never depend
// on how chunks are spread over threads.
int64_t chunk_rows(const TensorSpec& t);

// Draws rows [row0, row0 + n_rows) of tensor t into dst (n_rows * t.row_len() floats), from the
// chunk's own counter-based random stream. `ranks` is expert_ranks() of t.layer for ROUTER /
// ROUTER_BIAS (ignored otherwise). REQUIRES: row0 is a multiple of chunk_rows(t), and n_rows is
// chunk_rows(t) or what is left of the tensor.
void fill_rows(const Config& c, const TensorSpec& t, const std::vector<int>& ranks, int64_t row0, int64_t n_rows,
               float* dst);

}  // namespace moe::synth
