// Presets and parameter validation of synthetic models.
//
// Real shapes are from the Hugging Face configs (Qwen/Qwen3-30B-A3B, openai/gpt-oss-20b and -120b).
// The "tiny" presets keep each architecture's features (head_dim != n_embd / n_head, GQA, YaRN,
// sliding window) at a size small enough for numpy reference tests (a few hundred KB).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "core/models/synth.h"
#include "core/models/synth_model.h"

namespace moe {
namespace {

struct Preset {
    const char* arch;
    const char* name;
    int n_layer, n_embd, n_vocab, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff_expert;
    int n_ctx_train, sliding_window;
    float rope_theta, rms_eps, yarn_factor;
    int yarn_orig_ctx;
};

constexpr Preset kPresets[] = {
    // arch       name             layers embd  vocab   head kv hd  exp top ff    ctx     swa  theta    eps   yarn  orig
    {"qwen3moe", "qwen3-30b-a3b",  48, 2048, 151936, 32, 4, 128, 128, 8,  768, 40960,  0,   1.0e6f,  1e-6f, 0.0f,  0},
    {"qwen3moe", "qwen3-235b-a22b", 94, 4096, 151936, 64, 4, 128, 128, 8, 1536, 40960, 0,   1.0e6f,  1e-6f, 0.0f,  0},
    {"qwen3moe", "tiny",           2,  64,   512,    4,  2, 16,  8,   2,  64,  40960,  0,   1.0e6f,  1e-6f, 0.0f,  0},
    {"gpt-oss",  "gpt-oss-20b",    24, 2880, 201088, 64, 8, 64,  32,  4,  2880, 131072, 128, 150000.f, 1e-5f, 32.0f, 4096},
    {"gpt-oss",  "gpt-oss-120b",   36, 2880, 201088, 64, 8, 64,  128, 4,  2880, 131072, 128, 150000.f, 1e-5f, 32.0f, 4096},
    {"gpt-oss",  "tiny",           2,  64,   512,    4,  2, 16,  8,   2,  64,  131072, 8,   150000.f, 1e-5f, 32.0f, 4096},
    // deepseek2: head_dim is qk_nope + qk_rope (192); the MLA shape is in synth_deepseek2.cpp.
    {"deepseek2", "deepseek-v3",      61, 7168, 129280, 128, 1, 192, 256, 8, 2048, 163840, 0, 10000.f, 1e-6f, 40.0f, 4096},
    {"deepseek2", "kimi-k2",          61, 7168, 163840, 64,  1, 192, 384, 8, 2048, 131072, 0, 50000.f, 1e-6f, 32.0f, 4096},
    {"deepseek2", "deepseek-v2-lite", 27, 2048, 102400, 16,  1, 192, 64,  6, 1408, 163840, 0, 10000.f, 1e-6f, 40.0f, 4096},
    {"deepseek2", "tiny",             3,  64,   512,    4,   1, 64,  16,  4, 32,   163840, 0, 10000.f, 1e-6f, 40.0f, 4096},
    {"deepseek2", "tiny-lite",        3,  64,   512,    4,   1, 64,  16,  4, 32,   163840, 0, 10000.f, 1e-6f, 40.0f, 4096},
    // glm4moe: partial rotary, dense and shared-expert shapes in synth_glm4moe.cpp.
    {"glm4moe",  "glm-4.5-air",    46, 4096, 151552, 96, 8, 128, 128, 8, 1408, 131072, 0,   1.0e6f,  1e-5f, 0.0f,  0},
    {"glm4moe",  "glm-4.5",        92, 5120, 151552, 96, 8, 128, 160, 8, 1536, 131072, 0,   1.0e6f,  1e-5f, 0.0f,  0},
    {"glm4moe",  "tiny",           3,  64,   512,    4,  2, 32,  16,  4, 32,   131072, 0,   1.0e6f,  1e-5f, 0.0f,  0},
    {"glm4moe",  "tiny-air",       3,  64,   512,    4,  2, 32,  16,  4, 32,   131072, 0,   1.0e6f,  1e-5f, 0.0f,  0},
};

constexpr const char* kDefaultPreset[][2] = {
    {"qwen3moe", "qwen3-30b-a3b"}, {"gpt-oss", "gpt-oss-20b"}, {"deepseek2", "deepseek-v3"}, {"glm4moe", "glm-4.5-air"}};

// "qwen3moe, gpt-oss or ...": the architectures, for error messages.
std::string arch_names() {
    std::string s;
    const size_t n = std::size(kDefaultPreset);
    for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kDefaultPreset[i][0];
    return s;
}

// The smallest vocabulary of the synthetic tokenizer: <unk>, <s>, </s> and the 256 byte tokens.
constexpr int kMinVocab = 3 + 256;
constexpr int kMaxDim = 1 << 20;

const char* canonical_arch(std::string_view a) {
    for (const auto& d : kDefaultPreset) {
        if (a == d[0]) return d[0];
    }
    return nullptr;
}

const Preset* find_preset(std::string_view arch, std::string_view name) {
    for (const Preset& p : kPresets) {
        if (arch == p.arch && name == p.name) return &p;
    }
    return nullptr;
}

std::string preset_names(std::string_view arch) {
    std::string s;
    for (const Preset& p : kPresets) {
        if (arch != p.arch) continue;
        if (!s.empty()) s += ", ";
        s += p.name;
    }
    return s;
}

// A shape field: 0 keeps the preset's value, > 0 overrides it, < 0 is an error.
Status merge_dim(const char* field, int32_t given, int preset_value, int* out) {
    if (given < 0) {
        return invalid_argument(std::string(field) + ": " + std::to_string(given) +
                                " is negative (0 uses the preset's value)");
    }
    if (given > kMaxDim) {
        return invalid_argument(std::string(field) + ": " + std::to_string(given) + " is larger than " +
                                std::to_string(kMaxDim));
    }
    *out = given > 0 ? given : preset_value;
    return Status::ok();
}

Status resolve_type(const char* field, int32_t given, Type fallback, Type* out) {
    if (given == -1) {
        *out = fallback;
        return Status::ok();
    }
    // Weight types the CPU backend computes (the traits table also holds types it only describes, and
    // internal ones such as I32).
    constexpr int32_t kWeightTypes[] = {MOE_TYPE_F32,  MOE_TYPE_F16,  MOE_TYPE_BF16, MOE_TYPE_Q8_0,   MOE_TYPE_Q4_0,
                                        MOE_TYPE_Q4_1, MOE_TYPE_Q5_0, MOE_TYPE_Q5_1, MOE_TYPE_IQ4_NL, MOE_TYPE_MXFP4,
                                        MOE_TYPE_Q2_K, MOE_TYPE_Q3_K, MOE_TYPE_Q4_K, MOE_TYPE_Q5_K,   MOE_TYPE_Q6_K,
                                        MOE_TYPE_IQ4_XS};
    if (std::find(std::begin(kWeightTypes), std::end(kWeightTypes), given) == std::end(kWeightTypes) ||
        type_traits(given) == nullptr) {
        return invalid_argument(std::string(field) + ": " + std::to_string(given) +
                                " is not a weight type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, "
                                "mxfp4, q2_K, q3_K, q4_K, q5_K, q6_K or iq4_xs; -1 for the default)");
    }
    *out = static_cast<Type>(given);
    return Status::ok();
}

// Rows of `type` need lengths that are whole blocks.
Status check_block(const char* type_field, Type type, const char* dim_field, int64_t dim) {
    const int64_t bs = traits(type).block_size;
    if (dim % bs != 0) {
        return invalid_argument(std::string(dim_field) + ": " + std::to_string(dim) + " is not a multiple of " +
                                std::to_string(bs) + ", which " + type_field + " " + type_name(type) + " needs");
    }
    return Status::ok();
}

// deepseek2: the preset's MLA and routing shape, its dense layers scaled to n_layer, and the checks
// its extra dimensions need.
Status resolve_deepseek2(const Preset& pr, synth::Config& c) {
    const bool found = synth::deepseek2_shape(pr.name, &c.ds);
    MOE_ASSERT(found);
    c.ds.n_layer_dense_lead = synth::scaled_dense_layers(c.ds.n_layer_dense_lead, pr.n_layer, c.n_layer);
    if (c.head_dim <= c.ds.rope_dims) {
        return invalid_argument("head_dim: " + std::to_string(c.head_dim) + " must exceed the preset's " +
                                std::to_string(c.ds.rope_dims) + " rope dims (deepseek2: qk_nope + qk_rope)");
    }
    if (c.n_head_kv != 1) {
        return invalid_argument("n_head_kv: " + std::to_string(c.n_head_kv) +
                                " must be 1 for deepseek2 (its latent attention has one KV head)");
    }
    const int64_t group_size = c.n_expert / c.ds.n_expert_group;
    if (c.n_expert % c.ds.n_expert_group != 0 || c.n_expert_used > group_size * c.ds.n_expert_group_used) {
        return invalid_argument("n_expert: " + std::to_string(c.n_expert) + " with n_expert_used " +
                                std::to_string(c.n_expert_used) + " does not fit the preset's " +
                                std::to_string(c.ds.n_expert_group) + " expert groups (" +
                                std::to_string(c.ds.n_expert_group_used) + " used per token)");
    }
    if (c.recipe == synth::Recipe::NONE) {
        // The row lengths of the dense weights deepseek2 adds (attn_q_b, attn_v_b, attn_k_b, attn_output,
        // ffn_down, ffn_down_shexp).
        const struct {
            const char* what;
            int64_t len;
        } rows[] = {{"q_lora_rank (preset)", c.ds.q_lora_rank},
                    {"kv_lora_rank (preset)", c.ds.kv_lora_rank},
                    {"head_dim - rope dims", c.head_dim - c.ds.rope_dims},
                    {"n_head * value head size", int64_t{c.n_head} * c.ds.head_dim_v},
                    {"n_ff (preset)", c.ds.n_ff},
                    {"n_ff_expert * shared experts", int64_t{c.n_ff_expert} * c.ds.n_expert_shared}};
        for (const auto& r : rows) {
            if (r.len > 0) MOE_RETURN_IF_ERROR(check_block("dense_type", c.dense_type, r.what, r.len));
        }
    }
    return Status::ok();
}

// glm4moe: the preset's dense, shared-expert and rotary shape, its dense layers scaled to n_layer.
Status resolve_glm4moe(const Preset& pr, synth::Config& c) {
    const bool found = synth::glm4moe_shape(pr.name, &c.glm);
    MOE_ASSERT(found);
    c.glm.n_layer_dense_lead = synth::scaled_dense_layers(c.glm.n_layer_dense_lead, pr.n_layer, c.n_layer);
    if (c.head_dim < c.glm.rope_dims) {
        return invalid_argument("head_dim: " + std::to_string(c.head_dim) + " is less than the preset's " +
                                std::to_string(c.glm.rope_dims) + " rotary dims (glm4moe: partial rotary)");
    }
    if (c.recipe == synth::Recipe::NONE) {
        MOE_RETURN_IF_ERROR(check_block("dense_type", c.dense_type, "n_ff (preset)", c.glm.n_ff));
        MOE_RETURN_IF_ERROR(check_block("dense_type", c.dense_type, "n_ff_expert * shared experts",
                                        int64_t{c.n_ff_expert} * c.glm.n_expert_shared));
    }
    return Status::ok();
}

}  // namespace

Status synth_params_init(moe_synth_params* p, const char* arch) {
    if (p == nullptr) return invalid_argument("params: must not be NULL");
    const char* a = canonical_arch(arch != nullptr ? arch : "qwen3moe");
    if (a == nullptr) {
        return invalid_argument(std::string("architecture: unknown '") + arch + "' (expected " + arch_names() + ")");
    }
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->architecture = a;
    p->preset = nullptr;
    for (const auto& d : kDefaultPreset) {
        if (std::strcmp(d[0], a) == 0) p->preset = d[1];
    }
    p->expert_type = -1;
    p->dense_type = -1;
    p->recipe = nullptr;
    p->seed = 42;
    p->routing_skew = 0.0f;
    return Status::ok();
}

namespace synth {

StatusOr<Config> resolve_config(const moe_synth_params& given) {
    // Read only the caller's fields: start from the defaults and copy what the caller's struct has.
    constexpr size_t kMinSize = offsetof(moe_synth_params, architecture) + sizeof(const char*);
    if (given.struct_size < kMinSize) {
        return invalid_argument("struct_size: " + std::to_string(given.struct_size) + " is too small (at least " +
                                std::to_string(kMinSize) + "; call moe_synth_params_init first)");
    }
    moe_synth_params p;
    const char* arch_in = given.architecture != nullptr ? given.architecture : "qwen3moe";
    if (canonical_arch(arch_in) == nullptr) {
        return invalid_argument(std::string("architecture: unknown '") + arch_in + "' (expected " + arch_names() + ")");
    }
    MOE_RETURN_IF_ERROR(synth_params_init(&p, arch_in));
    std::memcpy(&p, &given, std::min<size_t>(given.struct_size, sizeof p));
    p.architecture = canonical_arch(arch_in);
    if (p.preset == nullptr) {  // NULL selects the architecture's default preset, as after _init
        moe_synth_params d;
        MOE_RETURN_IF_ERROR(synth_params_init(&d, p.architecture));
        p.preset = d.preset;
    }

    Config c;
    c.arch_name = p.architecture;
    c.arch = c.arch_name == "gpt-oss"     ? Arch::GPT_OSS
             : c.arch_name == "deepseek2" ? Arch::DEEPSEEK2
             : c.arch_name == "glm4moe"   ? Arch::GLM4MOE
                                          : Arch::QWEN3MOE;
    const Preset* pr = find_preset(c.arch_name, p.preset);
    if (pr == nullptr) {
        return invalid_argument(std::string("preset: unknown '") + p.preset + "' for architecture '" + c.arch_name +
                                "' (expected " + preset_names(c.arch_name) + ")");
    }
    c.preset = pr->name;
    MOE_RETURN_IF_ERROR(merge_dim("n_layer", p.n_layer, pr->n_layer, &c.n_layer));
    MOE_RETURN_IF_ERROR(merge_dim("n_embd", p.n_embd, pr->n_embd, &c.n_embd));
    MOE_RETURN_IF_ERROR(merge_dim("n_vocab", p.n_vocab, pr->n_vocab, &c.n_vocab));
    MOE_RETURN_IF_ERROR(merge_dim("n_head", p.n_head, pr->n_head, &c.n_head));
    MOE_RETURN_IF_ERROR(merge_dim("n_head_kv", p.n_head_kv, pr->n_head_kv, &c.n_head_kv));
    MOE_RETURN_IF_ERROR(merge_dim("head_dim", p.head_dim, pr->head_dim, &c.head_dim));
    MOE_RETURN_IF_ERROR(merge_dim("n_expert", p.n_expert, pr->n_expert, &c.n_expert));
    MOE_RETURN_IF_ERROR(merge_dim("n_expert_used", p.n_expert_used, pr->n_expert_used, &c.n_expert_used));
    MOE_RETURN_IF_ERROR(merge_dim("n_ff_expert", p.n_ff_expert, pr->n_ff_expert, &c.n_ff_expert));
    c.n_ctx_train = pr->n_ctx_train;
    c.sliding_window = pr->sliding_window;
    c.rope_theta = pr->rope_theta;
    c.rms_eps = pr->rms_eps;
    c.yarn_factor = pr->yarn_factor;
    c.yarn_orig_ctx = pr->yarn_orig_ctx;
    const Type default_expert = c.arch == Arch::GPT_OSS ? Type::MXFP4 : Type::Q8_0;
    MOE_RETURN_IF_ERROR(resolve_type("expert_type", p.expert_type, default_expert, &c.expert_type));
    MOE_RETURN_IF_ERROR(resolve_type("dense_type", p.dense_type, Type::F16, &c.dense_type));
    if (p.recipe != nullptr) {
        if (!synth::find_recipe(p.recipe, &c.recipe)) {
            return invalid_argument(std::string("recipe: unknown '") + p.recipe + "' (expected " +
                                    synth::recipe_names() + ")");
        }
        if (p.expert_type != -1 || p.dense_type != -1) {
            return invalid_argument(std::string("recipe: '") + p.recipe +
                                    "' sets the type of every weight; expert_type and dense_type must be -1");
        }
    }
    c.seed = p.seed;
    c.routing_skew = p.routing_skew;

    if (c.n_layer > 9999) return invalid_argument("n_layer: " + std::to_string(c.n_layer) + " is more than 9999");
    if (c.n_vocab < kMinVocab) {
        return invalid_argument("n_vocab: " + std::to_string(c.n_vocab) + " is too small (at least " +
                                std::to_string(kMinVocab) + ": <unk>, <s>, </s> and the 256 byte tokens)");
    }
    if (c.n_head % c.n_head_kv != 0) {
        return invalid_argument("n_head: " + std::to_string(c.n_head) + " is not a multiple of n_head_kv " +
                                std::to_string(c.n_head_kv));
    }
    if (c.head_dim % 2 != 0) {
        return invalid_argument("head_dim: " + std::to_string(c.head_dim) + " is odd (RoPE rotates pairs)");
    }
    if (c.n_expert_used > c.n_expert) {
        return invalid_argument("n_expert_used: " + std::to_string(c.n_expert_used) + " exceeds n_expert " +
                                std::to_string(c.n_expert));
    }
    if (c.recipe == synth::Recipe::NONE) {  // a recipe falls back to other types, as llama.cpp does
        MOE_RETURN_IF_ERROR(check_block("expert_type", c.expert_type, "n_embd", c.n_embd));
        MOE_RETURN_IF_ERROR(check_block("expert_type", c.expert_type, "n_ff_expert", c.n_ff_expert));
        MOE_RETURN_IF_ERROR(check_block("dense_type", c.dense_type, "n_embd", c.n_embd));
        MOE_RETURN_IF_ERROR(
            check_block("dense_type", c.dense_type, "n_head * head_dim", int64_t{c.n_head} * c.head_dim));
    }
    if (!std::isfinite(c.routing_skew) || c.routing_skew < 0.0f || c.routing_skew >= 1.0f) {
        return invalid_argument("routing_skew: " + std::to_string(c.routing_skew) + " is outside [0, 1)");
    }
    if (c.arch == Arch::DEEPSEEK2) MOE_RETURN_IF_ERROR(resolve_deepseek2(*pr, c));
    if (c.arch == Arch::GLM4MOE) MOE_RETURN_IF_ERROR(resolve_glm4moe(*pr, c));
    return c;
}

}  // namespace synth
}  // namespace moe
