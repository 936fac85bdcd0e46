#include "core/models/hparams.h"

#include <regex>

namespace moe {
namespace {

// Reads "<arch>.<suffix>" as a positive int, naming the key on failure.
Status read_positive(const GgufFile& f, const std::string& key, int* out) {
    StatusOr<int64_t> v = f.get_int(key);
    if (!v.is_ok()) {
        if (v.status().code() == MOE_STATUS_NOT_FOUND) return data_corrupt("missing metadata key '" + key + "'");
        return v.status();
    }
    if (*v <= 0 || *v > (int64_t{1} << 30)) {
        return data_corrupt("metadata '" + key + "': value " + std::to_string(*v) + " is out of range");
    }
    *out = static_cast<int>(*v);
    return Status::ok();
}

// Optional float: keeps *out when the key is absent.
Status read_optional_float(const GgufFile& f, const std::string& key, float* out) {
    StatusOr<double> v = f.get_float(key);
    if (!v.is_ok()) return v.status().code() == MOE_STATUS_NOT_FOUND ? Status::ok() : v.status();
    *out = static_cast<float>(*v);
    return Status::ok();
}

Status read_optional_int(const GgufFile& f, const std::string& key, int* out) {
    if (f.find(key) == nullptr) return Status::ok();
    return read_positive(f, key, out);
}

}  // namespace

bool is_expert_tensor_name(const std::string& name) {
    static const std::regex re(R"(^blk\.\d+\.ffn_(gate|up|down)_exps\.(weight|bias)$)");
    return std::regex_match(name, re);
}

StatusOr<HParams> read_hparams(const GgufFile& f) {
    HParams hp;
    MOE_ASSIGN_OR_RETURN(hp.arch_name, f.get_string("general.architecture"));
    if (hp.arch_name == "qwen3moe") {
        hp.arch = Arch::QWEN3MOE;
    } else if (hp.arch_name == "gpt-oss") {
        hp.arch = Arch::GPT_OSS;
    } else {
        return unimplemented("general.architecture: '" + hp.arch_name +
                             "' is not supported (supported: qwen3moe, gpt-oss)");
    }
    if (const GgufValue* v = f.find("general.name"); v && v->type == GgufValueType::STRING) hp.name = v->s;

    const std::string a = hp.arch_name + ".";
    MOE_RETURN_IF_ERROR(read_positive(f, a + "block_count", &hp.n_layer));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "embedding_length", &hp.n_embd));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "attention.head_count", &hp.n_head));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "attention.head_count_kv", &hp.n_head_kv));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "expert_count", &hp.n_expert));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "expert_used_count", &hp.n_expert_used));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "expert_feed_forward_length", &hp.n_ff_expert));
    MOE_RETURN_IF_ERROR(read_positive(f, a + "context_length", &hp.n_ctx_train));
    hp.head_dim = hp.n_embd / hp.n_head;
    MOE_RETURN_IF_ERROR(read_optional_int(f, a + "attention.key_length", &hp.head_dim));
    MOE_RETURN_IF_ERROR(read_optional_float(f, a + "attention.layer_norm_rms_epsilon", &hp.rms_eps));
    MOE_RETURN_IF_ERROR(read_optional_float(f, a + "rope.freq_base", &hp.rope_freq_base));
    if (hp.arch == Arch::GPT_OSS) {
        MOE_RETURN_IF_ERROR(read_positive(f, a + "attention.sliding_window", &hp.sliding_window));
        MOE_RETURN_IF_ERROR(read_optional_float(f, a + "rope.scaling.factor", &hp.rope_yarn_factor));
        MOE_RETURN_IF_ERROR(read_optional_int(f, a + "rope.scaling.original_context_length", &hp.rope_yarn_orig_ctx));
    }

    if (hp.n_head % hp.n_head_kv != 0) {
        return data_corrupt(a + "attention.head_count (" + std::to_string(hp.n_head) +
                            ") is not a multiple of head_count_kv (" + std::to_string(hp.n_head_kv) + ")");
    }
    if (hp.n_expert_used > hp.n_expert) {
        return data_corrupt(a + "expert_used_count (" + std::to_string(hp.n_expert_used) + ") exceeds expert_count (" +
                            std::to_string(hp.n_expert) + ")");
    }
    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (embd == nullptr) return data_corrupt("missing tensor 'token_embd.weight'");
    if (embd->n_dims != 2 || embd->ne[0] != hp.n_embd) {
        return data_corrupt("tensor 'token_embd.weight': expected shape [" + std::to_string(hp.n_embd) +
                            ", n_vocab], got ne[0]=" + std::to_string(embd->ne[0]));
    }
    hp.n_vocab = static_cast<int>(embd->ne[1]);
    return hp;
}

}  // namespace moe
