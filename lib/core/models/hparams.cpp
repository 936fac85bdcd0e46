#include "core/models/hparams.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <regex>
#include <string_view>
#include <vector>

namespace moe {
namespace {

// Largest value of any count: every count fits in an int and a product of two in an int64.
constexpr int64_t kMaxCount = int64_t{1} << 30;

std::string show(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// DATA_CORRUPT naming the key and its value, e.g. "metadata 'qwen3moe.rope.freq_base' = -1: must be > 0".
Status bad_value(const std::string& key, const std::string& value, const std::string& why) {
    return data_corrupt("metadata '" + key + "' = " + value + ": " + why);
}

Status missing(const std::string& key) { return data_corrupt("missing metadata key '" + key + "'"); }

// Reads `key` as a count in [1, kMaxCount]. An absent key is DATA_CORRUPT when required; otherwise
// *out keeps its value.
Status read_count(const GgufFile& f, const std::string& key, bool required, int* out) {
    if (f.find(key) == nullptr) return required ? missing(key) : Status::ok();
    MOE_ASSIGN_OR_RETURN(const int64_t v, f.get_int(key));
    if (v <= 0 || v > kMaxCount) return bad_value(key, std::to_string(v), "must be in [1, 2^30]");
    *out = static_cast<int>(v);
    return Status::ok();
}

// Reads `key` as a finite float (after narrowing to float) no less than `min` (greater than `min`
// when `min_exclusive`). An absent key keeps *out: these keys have llama.cpp's defaults.
Status read_real(const GgufFile& f, const std::string& key, double min, bool min_exclusive, float* out) {
    if (f.find(key) == nullptr) return Status::ok();
    MOE_ASSIGN_OR_RETURN(const double v, f.get_float(key));
    const float narrowed = static_cast<float>(v);
    const std::string range = (min_exclusive ? "must be finite and > " : "must be finite and >= ") + show(min);
    if (!std::isfinite(narrowed)) return bad_value(key, show(v), range + (std::isfinite(v) ? " (as a float32)" : ""));
    if (min_exclusive ? !(narrowed > min) : !(narrowed >= min)) return bad_value(key, show(v), range);
    *out = narrowed;
    return Status::ok();
}

// The layer of a "blk.<N>.<name>" tensor, -1 for a tensor outside the layers, INT64_MAX for a number
// that does not fit.
int64_t layer_of(const std::string& tensor) {
    static constexpr std::string_view kPrefix = "blk.";
    if (tensor.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
    const char* first = tensor.data() + kPrefix.size();
    const char* last = tensor.data() + tensor.size();
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(first, last, n);
    if (end == first || end == last || *end != '.') return -1;
    return ec == std::errc() ? n : INT64_MAX;
}

// block_count must say exactly which layers the file holds: a layer beyond it would be ignored
// silently, a layer missing would fail only when a context binds the weights.
Status check_layers(const GgufFile& f, const std::string& key, int n_layer) {
    // n_tensors tensors cannot cover n_tensors + 1 layers: a block_count near 2^30 needs no 2^30 flags.
    std::vector<bool> seen(std::min(static_cast<size_t>(n_layer), f.tensors().size() + 1), false);
    for (const GgufTensorInfo& t : f.tensors()) {
        const int64_t il = layer_of(t.name);
        if (il < 0) continue;
        if (il >= n_layer) {
            return bad_value(key, std::to_string(n_layer), "the file has tensor '" + t.name + "' of a layer beyond it");
        }
        if (static_cast<size_t>(il) < seen.size()) seen[static_cast<size_t>(il)] = true;
    }
    for (size_t il = 0; il < seen.size(); ++il) {
        if (!seen[il]) {
            return bad_value(key, std::to_string(n_layer),
                             "the file has no tensors of layer " + std::to_string(il) + " ('blk." + std::to_string(il) +
                                 ".*')");
        }
    }
    return Status::ok();
}

// RoPE scaling: YaRN for gpt-oss, which is trained with it (its files may leave the type out);
// nothing else is implemented, so a file asking for other scaling is refused rather than run unscaled
// (qwen3moe's YaRN variant, with HF's truncated correction dims, included).
Status read_rope_scaling(const GgufFile& f, const std::string& a, HParams& hp) {
    const std::string type_key = a + "rope.scaling.type";
    const std::string factor_key = a + "rope.scaling.factor";
    // llama.cpp reads a missing type as linear scaling.
    std::string type = hp.arch == Arch::GPT_OSS ? "yarn" : "linear";
    if (f.find(type_key) != nullptr) {
        MOE_ASSIGN_OR_RETURN(type, f.get_string(type_key));
    }
    const bool yarn = type == "yarn" && (hp.arch == Arch::GPT_OSS || hp.arch == Arch::DEEPSEEK2);
    auto refuse = [&](const std::string& key, const std::string& value) {
        return unimplemented("metadata '" + key + "' = " + value + ": RoPE scaling '" + type +
                             "' is not implemented for " + hp.arch_name + " (only YaRN, for gpt-oss and deepseek2)");
    };
    if (!yarn && type != "none" && type != "linear") return refuse(type_key, "'" + type + "'");
    MOE_RETURN_IF_ERROR(read_real(f, factor_key, 1.0, false, &hp.rope_yarn_factor));
    if (!yarn && hp.rope_yarn_factor != 1.0f) return refuse(factor_key, show(hp.rope_yarn_factor));
    return read_count(f, a + "rope.scaling.original_context_length", hp.rope_yarn_factor > 1.0f,
                      &hp.rope_yarn_orig_ctx);
}

// The head sizes: key_length (n_embd / n_head when absent), value_length and rope.dimension_count,
// which both architectures keep equal to it.
Status read_head_dim(const GgufFile& f, const std::string& a, HParams& hp) {
    const std::string key_length = a + "attention.key_length";
    if (f.find(key_length) == nullptr) {
        if (hp.n_embd % hp.n_head != 0) {
            return data_corrupt("missing metadata key '" + key_length + "', and " + a + "embedding_length (" +
                                std::to_string(hp.n_embd) + ") is not a multiple of " + a +
                                "attention.head_count (" + std::to_string(hp.n_head) + ")");
        }
        hp.head_dim = hp.n_embd / hp.n_head;
    }
    MOE_RETURN_IF_ERROR(read_count(f, key_length, false, &hp.head_dim));
    if (hp.head_dim % 2 != 0) {
        return bad_value(key_length, std::to_string(hp.head_dim), "must be even (RoPE rotates pairs)");
    }
    for (const char* suffix : {"attention.value_length", "rope.dimension_count"}) {
        int v = hp.head_dim;
        MOE_RETURN_IF_ERROR(read_count(f, a + suffix, false, &v));
        if (v != hp.head_dim) {
            return bad_value(a + suffix, std::to_string(v),
                             "differs from the head size " + std::to_string(hp.head_dim) + " (" + key_length +
                                 "); " + hp.arch_name + " uses one size for keys, values and RoPE");
        }
    }
    return Status::ok();
}

// The routed experts' weighting (deepseek2, glm4moe): expert_weights_norm divides the top-k weights by
// their sum, expert_weights_scale then multiplies them; absent, llama.cpp's defaults (no norm, scale 1).
Status read_expert_weighting(const GgufFile& f, const std::string& a, HParams& hp) {
    if (f.find(a + "expert_weights_norm") != nullptr) {
        MOE_ASSIGN_OR_RETURN(const int64_t norm, f.get_int(a + "expert_weights_norm"));
        hp.expert_weights_norm = norm != 0;
    }
    return read_real(f, a + "expert_weights_scale", 0.0, true, &hp.expert_weights_scale);
}

// deepseek2: MLA head sizes, leading dense layers, shared experts, routing, YaRN's attention scale.
// Files converted since llama.cpp split attn_kv_b into attn_k_b / attn_v_b give key_length =
// kv_lora_rank + rope dims and value_length = kv_lora_rank (the latent attention's sizes) and the
// per-head sizes in key_length_mla / value_length_mla; older files give the per-head sizes in
// key_length / value_length. Either way head_dim / head_dim_v here are the per-head sizes.
Status read_deepseek2(const GgufFile& f, const std::string& a, HParams& hp) {
    MOE_RETURN_IF_ERROR(read_count(f, a + "attention.kv_lora_rank", true, &hp.kv_lora_rank));
    MOE_RETURN_IF_ERROR(read_count(f, a + "attention.q_lora_rank", false, &hp.q_lora_rank));
    MOE_RETURN_IF_ERROR(read_count(f, a + "rope.dimension_count", true, &hp.rope_dims));
    const std::string key_length = a + "attention.key_length", value_length = a + "attention.value_length";
    int k_len = 0, v_len = 0;
    MOE_RETURN_IF_ERROR(read_count(f, key_length, true, &k_len));
    MOE_RETURN_IF_ERROR(read_count(f, value_length, true, &v_len));
    const std::string k_mla = a + "attention.key_length_mla", v_mla = a + "attention.value_length_mla";
    const bool mla_keys = f.find(k_mla) != nullptr || f.find(v_mla) != nullptr;
    std::string head_key = key_length;
    hp.head_dim = k_len;
    hp.head_dim_v = v_len;
    if (mla_keys) {
        MOE_RETURN_IF_ERROR(read_count(f, k_mla, true, &hp.head_dim));
        MOE_RETURN_IF_ERROR(read_count(f, v_mla, true, &hp.head_dim_v));
        head_key = k_mla;
    }
    if (hp.rope_dims % 2 != 0 || hp.rope_dims >= hp.head_dim) {
        return bad_value(a + "rope.dimension_count", std::to_string(hp.rope_dims),
                         "must be even and less than " + head_key + " (" + std::to_string(hp.head_dim) + ")");
    }
    if (mla_keys && k_len != hp.kv_lora_rank + hp.rope_dims) {
        return bad_value(key_length, std::to_string(k_len),
                         "must be " + a + "attention.kv_lora_rank + " + a + "rope.dimension_count (" +
                             std::to_string(hp.kv_lora_rank + hp.rope_dims) + ") in a file with " + k_mla);
    }
    if (mla_keys && v_len != hp.kv_lora_rank) {
        return bad_value(value_length, std::to_string(v_len),
                         "must be " + a + "attention.kv_lora_rank (" + std::to_string(hp.kv_lora_rank) +
                             ") in a file with " + v_mla);
    }
    if (hp.n_head_kv != 1 && hp.n_head_kv != hp.n_head) {
        return bad_value(a + "attention.head_count_kv", std::to_string(hp.n_head_kv),
                         "must be 1 or " + a + "attention.head_count (" + std::to_string(hp.n_head) + ")");
    }

    MOE_RETURN_IF_ERROR(read_count(f, a + "feed_forward_length", false, &hp.n_ff));
    if (f.find(a + "leading_dense_block_count") != nullptr) {
        MOE_ASSIGN_OR_RETURN(const int64_t lead, f.get_int(a + "leading_dense_block_count"));
        if (lead < 0 || lead > hp.n_layer) {
            return bad_value(a + "leading_dense_block_count", std::to_string(lead),
                             "must be in [0, " + a + "block_count (" + std::to_string(hp.n_layer) + ")]");
        }
        hp.n_layer_dense_lead = static_cast<int>(lead);
    }
    if (hp.n_layer_dense_lead > 0 && hp.n_ff == 0) return missing(a + "feed_forward_length");
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_shared_count", true, &hp.n_expert_shared));
    MOE_RETURN_IF_ERROR(read_expert_weighting(f, a, hp));
    if (f.find(a + "expert_gating_func") != nullptr) {
        // llama.cpp's llama_expert_gating_func_type; files from before the key are softmax (V2).
        MOE_ASSIGN_OR_RETURN(const int64_t func, f.get_int(a + "expert_gating_func"));
        if (func != 1 && func != 2) {
            return bad_value(a + "expert_gating_func", std::to_string(func), "must be 1 (softmax) or 2 (sigmoid)");
        }
        hp.expert_gating_sigmoid = func == 2;
    }
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_group_count", false, &hp.n_expert_group));
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_group_used_count", false, &hp.n_expert_group_used));
    if (hp.n_expert % hp.n_expert_group != 0) {
        return bad_value(a + "expert_group_count", std::to_string(hp.n_expert_group),
                         "does not divide " + a + "expert_count (" + std::to_string(hp.n_expert) + ")");
    }
    if (hp.n_expert_group_used > hp.n_expert_group) {
        return bad_value(a + "expert_group_used_count", std::to_string(hp.n_expert_group_used),
                         "exceeds " + a + "expert_group_count (" + std::to_string(hp.n_expert_group) + ")");
    }
    const int64_t selectable = int64_t{hp.n_expert_group_used} * (hp.n_expert / hp.n_expert_group);
    if (hp.n_expert_used > selectable) {
        return bad_value(a + "expert_used_count", std::to_string(hp.n_expert_used),
                         "exceeds the " + std::to_string(selectable) + " experts of the " +
                             std::to_string(hp.n_expert_group_used) + " groups a token may use");
    }
    MOE_RETURN_IF_ERROR(read_real(f, a + "rope.scaling.yarn_log_multiplier", 0.0, false, &hp.rope_yarn_log_mul));
    MOE_RETURN_IF_ERROR(read_real(f, a + "rope.scaling.yarn_beta_fast", 0.0, true, &hp.rope_yarn_beta_fast));
    return read_real(f, a + "rope.scaling.yarn_beta_slow", 0.0, true, &hp.rope_yarn_beta_slow);
}

// glm4moe (GLM-4.5 / 4.6 / 4.5-Air; llama.cpp's llama_model_glm4_moe): one head size for keys and values,
// partial NeoX rotary over rope.dimension_count of it, leading dense layers, a shared expert and sigmoid
// routing with a selection bias (the only gating glm4moe has: a file saying otherwise is refused).
Status read_glm4moe(const GgufFile& f, const std::string& a, HParams& hp) {
    const std::string key_length = a + "attention.key_length";
    hp.head_dim = hp.n_embd / hp.n_head;  // HF's default head_dim; GLM files give key_length
    if (f.find(key_length) == nullptr && hp.n_embd % hp.n_head != 0) {
        return data_corrupt("missing metadata key '" + key_length + "', and " + a + "embedding_length (" +
                            std::to_string(hp.n_embd) + ") is not a multiple of " + a + "attention.head_count (" +
                            std::to_string(hp.n_head) + ")");
    }
    MOE_RETURN_IF_ERROR(read_count(f, key_length, false, &hp.head_dim));
    int v_len = hp.head_dim;
    MOE_RETURN_IF_ERROR(read_count(f, a + "attention.value_length", false, &v_len));
    if (v_len != hp.head_dim) {
        return bad_value(a + "attention.value_length", std::to_string(v_len),
                         "differs from " + key_length + " (" + std::to_string(hp.head_dim) +
                             "); glm4moe uses one head size for keys and values");
    }
    hp.rope_dims = hp.head_dim;
    MOE_RETURN_IF_ERROR(read_count(f, a + "rope.dimension_count", false, &hp.rope_dims));
    if (hp.rope_dims % 2 != 0 || hp.rope_dims > hp.head_dim) {
        return bad_value(a + "rope.dimension_count", std::to_string(hp.rope_dims),
                         "must be even and at most " + key_length + " (" + std::to_string(hp.head_dim) + ")");
    }
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_shared_count", false, &hp.n_expert_shared));
    MOE_RETURN_IF_ERROR(read_count(f, a + "feed_forward_length", false, &hp.n_ff));
    MOE_RETURN_IF_ERROR(read_expert_weighting(f, a, hp));
    if (f.find(a + "expert_gating_func") != nullptr) {
        // llama.cpp's llama_expert_gating_func_type: 0 (none) reads as sigmoid there too.
        MOE_ASSIGN_OR_RETURN(const int64_t func, f.get_int(a + "expert_gating_func"));
        if (func != 0 && func != 2) {
            return unimplemented("metadata '" + a + "expert_gating_func' = " + std::to_string(func) +
                                 ": glm4moe routes with a sigmoid (2) only");
        }
    }
    return Status::ok();
}

// glm4moe's layer counts, once block_count is known to match the file: files append
// nextn_predict_layers multi-token-prediction layers after the transformer layers (llama.cpp loads and
// skips them); they are not run, so n_layer counts only the others. The leading dense layers must
// leave at least one MoE layer.
Status read_glm4moe_layers(const GgufFile& f, const std::string& a, HParams& hp) {
    const std::string nextn_key = a + "nextn_predict_layers";
    if (f.find(nextn_key) != nullptr) {
        MOE_ASSIGN_OR_RETURN(const int64_t nextn, f.get_int(nextn_key));
        if (nextn < 0 || nextn >= hp.n_layer) {
            return bad_value(nextn_key, std::to_string(nextn),
                             "must be in [0, " + a + "block_count (" + std::to_string(hp.n_layer) + "))");
        }
        hp.n_nextn_layer = static_cast<int>(nextn);
        hp.n_layer -= hp.n_nextn_layer;
    }
    const std::string lead_key = a + "leading_dense_block_count";
    if (f.find(lead_key) != nullptr) {
        MOE_ASSIGN_OR_RETURN(const int64_t lead, f.get_int(lead_key));
        if (lead < 0 || lead >= hp.n_layer) {
            return bad_value(lead_key, std::to_string(lead),
                             "must be in [0, " + std::to_string(hp.n_layer) +
                                 ") (the layers run, which must include a MoE layer)");
        }
        hp.n_layer_dense_lead = static_cast<int>(lead);
    }
    if (hp.n_layer_dense_lead > 0 && hp.n_ff == 0) {
        return data_corrupt("missing metadata key '" + a + "feed_forward_length' (the FFN size of the " +
                            std::to_string(hp.n_layer_dense_lead) + " leading dense layers)");
    }
    return Status::ok();
}

}  // namespace

bool is_expert_tensor_name(const std::string& name) {
    static const std::regex re(R"(^blk\.\d+\.ffn_(gate|up|down)_exps\.(weight|bias)$)");
    return std::regex_match(name, re);
}

int64_t tensor_layer(const std::string& name) { return layer_of(name); }

StatusOr<HParams> read_hparams(const GgufFile& f) {
    HParams hp;
    MOE_ASSIGN_OR_RETURN(hp.arch_name, f.get_string("general.architecture"));
    if (hp.arch_name == "qwen3moe") {
        hp.arch = Arch::QWEN3MOE;
    } else if (hp.arch_name == "gpt-oss") {
        hp.arch = Arch::GPT_OSS;
    } else if (hp.arch_name == "deepseek2") {
        hp.arch = Arch::DEEPSEEK2;
    } else if (hp.arch_name == "glm4moe") {
        hp.arch = Arch::GLM4MOE;
    } else {
        return unimplemented("general.architecture: '" + hp.arch_name +
                             "' is not supported (supported: qwen3moe, gpt-oss, deepseek2, glm4moe)");
    }
    if (const GgufValue* v = f.find("general.name"); v && v->type == GgufValueType::STRING) hp.name = v->s;

    const std::string a = hp.arch_name + ".";
    MOE_RETURN_IF_ERROR(read_count(f, a + "block_count", true, &hp.n_layer));
    MOE_RETURN_IF_ERROR(read_count(f, a + "embedding_length", true, &hp.n_embd));
    MOE_RETURN_IF_ERROR(read_count(f, a + "attention.head_count", true, &hp.n_head));
    MOE_RETURN_IF_ERROR(read_count(f, a + "attention.head_count_kv", true, &hp.n_head_kv));
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_count", true, &hp.n_expert));
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_used_count", true, &hp.n_expert_used));
    MOE_RETURN_IF_ERROR(read_count(f, a + "expert_feed_forward_length", true, &hp.n_ff_expert));
    MOE_RETURN_IF_ERROR(read_count(f, a + "context_length", true, &hp.n_ctx_train));
    if (hp.n_head % hp.n_head_kv != 0) {
        return bad_value(a + "attention.head_count_kv", std::to_string(hp.n_head_kv),
                         "does not divide " + a + "attention.head_count (" + std::to_string(hp.n_head) + ")");
    }
    if (hp.n_expert_used > hp.n_expert) {
        return bad_value(a + "expert_used_count", std::to_string(hp.n_expert_used),
                         "exceeds " + a + "expert_count (" + std::to_string(hp.n_expert) + ")");
    }
    if (hp.arch == Arch::DEEPSEEK2) {
        MOE_RETURN_IF_ERROR(read_deepseek2(f, a, hp));
    } else if (hp.arch == Arch::GLM4MOE) {
        MOE_RETURN_IF_ERROR(read_glm4moe(f, a, hp));
    } else {
        MOE_RETURN_IF_ERROR(read_head_dim(f, a, hp));
    }
    MOE_RETURN_IF_ERROR(read_real(f, a + "attention.layer_norm_rms_epsilon", 0.0, false, &hp.rms_eps));
    MOE_RETURN_IF_ERROR(read_real(f, a + "rope.freq_base", 0.0, true, &hp.rope_freq_base));
    if (hp.arch == Arch::GPT_OSS) {
        MOE_RETURN_IF_ERROR(read_count(f, a + "attention.sliding_window", true, &hp.sliding_window));
    }
    MOE_RETURN_IF_ERROR(read_rope_scaling(f, a, hp));
    MOE_RETURN_IF_ERROR(check_layers(f, a + "block_count", hp.n_layer));
    // deepseek2 files converted with the MTP layers carry them the same way.
    if (hp.arch == Arch::GLM4MOE || hp.arch == Arch::DEEPSEEK2) MOE_RETURN_IF_ERROR(read_glm4moe_layers(f, a, hp));

    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (embd == nullptr) return data_corrupt("missing tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[0] != hp.n_embd || embd->ne[1] > kMaxCount) {
        return data_corrupt("tensor 'token_embd.weight': expected shape [" + std::to_string(hp.n_embd) +
                            ", n_vocab <= 2^30], got [" + std::to_string(embd->ne[0]) + ", " +
                            std::to_string(embd->ne[1]) + "]");
    }
    hp.n_vocab = static_cast<int>(embd->ne[1]);
    return hp;
}

}  // namespace moe
