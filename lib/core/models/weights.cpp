// Weight binding: which tensors each architecture needs, with their expected shapes and types.
#include <string>

#include "core/models/model_graph.h"

namespace moe {
namespace {

std::string shape_str(const int64_t* ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

enum class Kind { MATRIX, FLOAT_VECTOR };

class Binder {
public:
    Binder(const WeightLookup& lookup) : lookup_(lookup) {}

    // A weight with exactly `shape`; MATRIX weights may have any supported matmul type, vectors must be F32.
    Status get(const std::string& name, std::initializer_list<int64_t> shape, Kind kind, Tensor** out,
               bool optional = false) {
        Tensor* t = lookup_(name);
        if (t == nullptr) {
            if (optional) return Status::ok();
            return not_found("model is missing tensor '" + name + "'");
        }
        const std::vector<int64_t> want(shape);
        bool ok = true;
        for (size_t d = 0; d < 4; ++d) {
            const int64_t w = d < want.size() ? want[d] : 1;
            if (t->ne[d] != w) ok = false;
        }
        if (!ok) {
            int got_dims = 4;  // print as many dims as expected, more only where they are not 1
            while (got_dims > static_cast<int>(want.size()) && t->ne[got_dims - 1] == 1) --got_dims;
            return data_corrupt("tensor '" + name + "': expected shape " + shape_str(want.data(), (int)want.size()) +
                                ", got " + shape_str(t->ne, got_dims));
        }
        if (kind == Kind::FLOAT_VECTOR && t->type != Type::F32) {
            return data_corrupt("tensor '" + name + "': expected type f32, got " + type_name(t->type));
        }
        t->is_weight = true;
        *out = t;
        return Status::ok();
    }

private:
    const WeightLookup& lookup_;
};

// The FFN half of a layer of the architectures with leading dense layers (deepseek2, glm4moe): a dense
// SwiGLU FFN in the first n_layer_dense_lead layers; in the others the router, its selection bias
// exp_probs_b, the routed experts, and the shared experts when n_expert_shared > 0.
enum class SelectionBias { REQUIRED, OPTIONAL };
Status bind_dense_or_moe_ffn(const HParams& hp, Binder& b, int il, SelectionBias bias, LayerWeights& l) {
    const int64_t E = hp.n_embd, X = hp.n_expert, F = hp.n_ff_expert;
    const std::string p = "blk." + std::to_string(il) + ".";
    if (il < hp.n_layer_dense_lead) {
        const int64_t FF = hp.n_ff;
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate.weight", {E, FF}, Kind::MATRIX, &l.ffn_gate));
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_up.weight", {E, FF}, Kind::MATRIX, &l.ffn_up));
        return b.get(p + "ffn_down.weight", {FF, E}, Kind::MATRIX, &l.ffn_down);
    }
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_inp.weight", {E, X}, Kind::MATRIX, &l.router));
    MOE_RETURN_IF_ERROR(b.get(p + "exp_probs_b.bias", {X}, Kind::FLOAT_VECTOR, &l.exp_probs_b,
                              bias == SelectionBias::OPTIONAL));
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_up_exps.weight", {E, F, X}, Kind::MATRIX, &l.up_exps));
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_exps.weight", {E, F, X}, Kind::MATRIX, &l.gate_exps));
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_down_exps.weight", {F, E, X}, Kind::MATRIX, &l.down_exps));
    if (hp.n_expert_shared == 0) return Status::ok();
    const int64_t S = F * hp.n_expert_shared;
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_shexp.weight", {E, S}, Kind::MATRIX, &l.gate_shexp));
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_up_shexp.weight", {E, S}, Kind::MATRIX, &l.up_shexp));
    return b.get(p + "ffn_down_shexp.weight", {S, E}, Kind::MATRIX, &l.down_shexp);
}

// deepseek2 (llama.cpp's llama_model_deepseek2::load_arch_tensors): MLA attention, then a dense FFN in
// the leading layers, routed plus shared experts in the others.
Status bind_deepseek2_layer(const HParams& hp, Binder& b, int il, LayerWeights& l) {
    const int64_t E = hp.n_embd, H = hp.n_head, Dk = hp.head_dim, Dv = hp.head_dim_v, R = hp.rope_dims;
    const int64_t C = hp.kv_lora_rank, Q = hp.q_lora_rank;
    const std::string p = "blk." + std::to_string(il) + ".";
    MOE_RETURN_IF_ERROR(b.get(p + "attn_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.attn_norm));
    if (Q > 0) {
        MOE_RETURN_IF_ERROR(b.get(p + "attn_q_a.weight", {E, Q}, Kind::MATRIX, &l.wq_a));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_q_a_norm.weight", {Q}, Kind::FLOAT_VECTOR, &l.q_a_norm));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_q_b.weight", {Q, H * Dk}, Kind::MATRIX, &l.wq_b));
    } else {
        MOE_RETURN_IF_ERROR(b.get(p + "attn_q.weight", {E, H * Dk}, Kind::MATRIX, &l.wq));
    }
    MOE_RETURN_IF_ERROR(b.get(p + "attn_kv_a_mqa.weight", {E, C + R}, Kind::MATRIX, &l.wkv_a));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_kv_a_norm.weight", {C}, Kind::FLOAT_VECTOR, &l.kv_a_norm));
    // Files converted before llama.cpp split attn_kv_b hold the joint up-projection only, newer ones the
    // split ones only; the runtime makes the missing form at load (mla_split.h), so here both are bound.
    MOE_RETURN_IF_ERROR(b.get(p + "attn_k_b.weight", {Dk - R, C, H}, Kind::MATRIX, &l.wk_b, true));
    if (l.wk_b == nullptr) {
        return not_found("model is missing tensor '" + p + "attn_k_b.weight' (and the older joint '" + p +
                         "attn_kv_b.weight' it can be made from)");
    }
    MOE_RETURN_IF_ERROR(b.get(p + "attn_v_b.weight", {C, Dv, H}, Kind::MATRIX, &l.wv_b));
    // The joint one is read by the prefill form only, which needs head_dim_v = nope (mla_decompressed).
    const bool joint_read = Dv == Dk - R;
    MOE_RETURN_IF_ERROR(b.get(p + "attn_kv_b.weight", {C, H * (Dk - R + Dv)}, Kind::MATRIX, &l.wkv_b, !joint_read));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_output.weight", {H * Dv, E}, Kind::MATRIX, &l.wo));
    MOE_RETURN_IF_ERROR(b.get(p + "ffn_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.ffn_norm));
    return bind_dense_or_moe_ffn(hp, b, il, SelectionBias::OPTIONAL, l);
}

// glm4moe (llama.cpp's llama_model_glm4_moe::load_arch_tensors): attention with q/k/v biases and, in
// GLM-4.5 (not Air), per-head q/k norms; then a dense FFN in the leading layers, routed experts with the
// selection bias plus the shared experts in the others. The trailing NextN layers are not bound.
Status bind_glm4moe_layer(const HParams& hp, Binder& b, int il, LayerWeights& l) {
    const int64_t E = hp.n_embd, H = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim;
    const std::string p = "blk." + std::to_string(il) + ".";
    MOE_RETURN_IF_ERROR(b.get(p + "attn_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.attn_norm));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_q.weight", {E, H * D}, Kind::MATRIX, &l.wq));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_k.weight", {E, Hkv * D}, Kind::MATRIX, &l.wk));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_v.weight", {E, Hkv * D}, Kind::MATRIX, &l.wv));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_output.weight", {H * D, E}, Kind::MATRIX, &l.wo));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_q.bias", {H * D}, Kind::FLOAT_VECTOR, &l.bq));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_k.bias", {Hkv * D}, Kind::FLOAT_VECTOR, &l.bk));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_v.bias", {Hkv * D}, Kind::FLOAT_VECTOR, &l.bv));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_q_norm.weight", {D}, Kind::FLOAT_VECTOR, &l.q_norm, true));
    MOE_RETURN_IF_ERROR(b.get(p + "attn_k_norm.weight", {D}, Kind::FLOAT_VECTOR, &l.k_norm, true));
    if ((l.q_norm == nullptr) != (l.k_norm == nullptr)) {
        return not_found("model is missing tensor '" + p + (l.q_norm ? "attn_k_norm" : "attn_q_norm") +
                         ".weight' (the q and k norms come together)");
    }
    MOE_RETURN_IF_ERROR(b.get(p + "post_attention_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.ffn_norm));
    return bind_dense_or_moe_ffn(hp, b, il, SelectionBias::REQUIRED, l);
}

}  // namespace

StatusOr<ModelWeights> bind_weights(const HParams& hp, const WeightLookup& lookup) {
    Binder b(lookup);
    ModelWeights w;
    const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;
    const int64_t X = hp.n_expert, F = hp.n_ff_expert;
    const bool oss = hp.arch == Arch::GPT_OSS;

    MOE_RETURN_IF_ERROR(b.get("token_embd.weight", {E, V}, Kind::MATRIX, &w.tok_embd));
    MOE_RETURN_IF_ERROR(b.get("output_norm.weight", {E}, Kind::FLOAT_VECTOR, &w.output_norm));
    MOE_RETURN_IF_ERROR(b.get("output.weight", {E, V}, Kind::MATRIX, &w.output));
    w.layers.resize(static_cast<size_t>(hp.n_layer));
    if (hp.arch == Arch::DEEPSEEK2) {
        for (int il = 0; il < hp.n_layer; ++il) {
            MOE_RETURN_IF_ERROR(bind_deepseek2_layer(hp, b, il, w.layers[static_cast<size_t>(il)]));
        }
        return w;
    }
    if (hp.arch == Arch::GLM4MOE) {
        for (int il = 0; il < hp.n_layer; ++il) {
            MOE_RETURN_IF_ERROR(bind_glm4moe_layer(hp, b, il, w.layers[static_cast<size_t>(il)]));
        }
        return w;
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        LayerWeights& l = w.layers[static_cast<size_t>(il)];
        const std::string p = "blk." + std::to_string(il) + ".";
        MOE_RETURN_IF_ERROR(b.get(p + "attn_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.attn_norm));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_q.weight", {E, H * D}, Kind::MATRIX, &l.wq));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_k.weight", {E, Hkv * D}, Kind::MATRIX, &l.wk));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_v.weight", {E, Hkv * D}, Kind::MATRIX, &l.wv));
        MOE_RETURN_IF_ERROR(b.get(p + "attn_output.weight", {H * D, E}, Kind::MATRIX, &l.wo));
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_inp.weight", {E, X}, Kind::MATRIX, &l.router));
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_up_exps.weight", {E, F, X}, Kind::MATRIX, &l.up_exps));
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_exps.weight", {E, F, X}, Kind::MATRIX, &l.gate_exps));
        MOE_RETURN_IF_ERROR(b.get(p + "ffn_down_exps.weight", {F, E, X}, Kind::MATRIX, &l.down_exps));
        if (oss) {
            MOE_RETURN_IF_ERROR(b.get(p + "attn_q.bias", {H * D}, Kind::FLOAT_VECTOR, &l.bq));
            MOE_RETURN_IF_ERROR(b.get(p + "attn_k.bias", {Hkv * D}, Kind::FLOAT_VECTOR, &l.bk));
            MOE_RETURN_IF_ERROR(b.get(p + "attn_v.bias", {Hkv * D}, Kind::FLOAT_VECTOR, &l.bv));
            MOE_RETURN_IF_ERROR(b.get(p + "attn_output.bias", {E}, Kind::FLOAT_VECTOR, &l.bo));
            MOE_RETURN_IF_ERROR(b.get(p + "attn_sinks.weight", {H}, Kind::FLOAT_VECTOR, &l.sinks));
            MOE_RETURN_IF_ERROR(b.get(p + "post_attention_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.ffn_norm));
            MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_inp.bias", {X}, Kind::FLOAT_VECTOR, &l.router_bias));
            MOE_RETURN_IF_ERROR(b.get(p + "ffn_up_exps.bias", {F, X}, Kind::FLOAT_VECTOR, &l.up_exps_bias));
            MOE_RETURN_IF_ERROR(b.get(p + "ffn_gate_exps.bias", {F, X}, Kind::FLOAT_VECTOR, &l.gate_exps_bias));
            MOE_RETURN_IF_ERROR(b.get(p + "ffn_down_exps.bias", {E, X}, Kind::FLOAT_VECTOR, &l.down_exps_bias));
        } else {
            MOE_RETURN_IF_ERROR(b.get(p + "attn_q_norm.weight", {D}, Kind::FLOAT_VECTOR, &l.q_norm));
            MOE_RETURN_IF_ERROR(b.get(p + "attn_k_norm.weight", {D}, Kind::FLOAT_VECTOR, &l.k_norm));
            MOE_RETURN_IF_ERROR(b.get(p + "ffn_norm.weight", {E}, Kind::FLOAT_VECTOR, &l.ffn_norm));
        }
    }
    return w;
}

}  // namespace moe
