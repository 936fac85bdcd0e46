#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

namespace moe {

const char* op_name(Op op) {
    switch (op) {
        case Op::NONE: return "NONE";
        case Op::VIEW: return "VIEW";
        case Op::GET_ROWS: return "GET_ROWS";
        case Op::RMS_NORM: return "RMS_NORM";
        case Op::MUL: return "MUL";
        case Op::ADD: return "ADD";
        case Op::MUL_MAT: return "MUL_MAT";
        case Op::MUL_MAT_ID: return "MUL_MAT_ID";
        case Op::MOE_UP_GATE: return "MOE_UP_GATE";
        case Op::ROPE: return "ROPE";
        case Op::ATTENTION: return "ATTENTION";
        case Op::SOFTMAX: return "SOFTMAX";
        case Op::TOPK: return "TOPK";
        case Op::GATHER: return "GATHER";
        case Op::WEIGHTED_SUM: return "WEIGHTED_SUM";
        case Op::MASK_IDS: return "MASK_IDS";
        case Op::SILU: return "SILU";
        case Op::SWIGLU: return "SWIGLU";
        case Op::SWIGLU_OAI: return "SWIGLU_OAI";
        case Op::CPY: return "CPY";
        case Op::SIGMOID: return "SIGMOID";
        case Op::NORM_SCALE: return "NORM_SCALE";
        case Op::CONCAT: return "CONCAT";
        case Op::MUL_MAT_HEADS: return "MUL_MAT_HEADS";
        case Op::GROUP_MASK: return "GROUP_MASK";
        case Op::COUNT: break;
    }
    return "?";
}

size_t Tensor::n_bytes() const {
    return static_cast<size_t>(row_bytes(type, ne[0])) * static_cast<size_t>(n_rows());
}

bool Tensor::is_contiguous() const {
    const TypeTraits& tt = traits(type);
    if (nb[0] != static_cast<size_t>(tt.block_bytes)) return false;
    size_t expect = row_bytes(type, ne[0]);
    for (int d = 1; d < 4; ++d) {
        if (ne[d] > 1 && nb[d] != expect) return false;
        expect *= static_cast<size_t>(ne[d]);
    }
    return true;
}

RopeParams Tensor::rope_params() const {
    RopeParams p;
    p.n_dims = params.i[0];
    p.n_ctx_orig = params.i[1];
    p.freq_base = params.f[0];
    p.freq_scale = params.f[1];
    p.ext_factor = params.f[2];
    p.attn_factor = params.f[3];
    p.beta_fast = params.f[4];
    p.beta_slow = params.f[5];
    p.yarn_truncate = params.i[2] != 0;
    p.interleaved = params.i[3] != 0;
    return p;
}

void Tensor::set_rope_params(const RopeParams& p) {
    params.i[0] = p.n_dims;
    params.i[1] = p.n_ctx_orig;
    params.f[0] = p.freq_base;
    params.f[1] = p.freq_scale;
    params.f[2] = p.ext_factor;
    params.f[3] = p.attn_factor;
    params.f[4] = p.beta_fast;
    params.f[5] = p.beta_slow;
    params.i[2] = p.yarn_truncate ? 1 : 0;
    params.i[3] = p.interleaved ? 1 : 0;
}

YarnRamp yarn_ramp(const RopeParams& p) {
    double lo = 0.0, hi = 0.0;
    if (p.yarn_truncate) {
        // ggml_rope_yarn_corr_dims: float arithmetic, then floor / ceil.
        auto corr = [&](float n_rot) {
            return static_cast<float>(p.n_dims) *
                   std::log(static_cast<float>(p.n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
                   (2.0f * std::log(p.freq_base));
        };
        lo = std::floor(corr(p.beta_fast));
        hi = std::ceil(corr(p.beta_slow));
    } else {
        auto corr = [&](double n_rot) {
            return p.n_dims * std::log(p.n_ctx_orig / (n_rot * 2.0 * std::numbers::pi)) /
                   (2.0 * std::log(static_cast<double>(p.freq_base)));
        };
        lo = corr(p.beta_fast);
        hi = corr(p.beta_slow);
    }
    lo = std::max(0.0, lo);
    hi = std::min(static_cast<double>(p.n_dims - 1), hi);
    return YarnRamp{lo, std::max(0.001, hi - lo)};
}

void set_shape(Tensor& t, Type type, int n_dims, const int64_t* ne) {
    MOE_ASSERT(n_dims >= 1 && n_dims <= 4);
    t.type = type;
    for (int d = 0; d < 4; ++d) t.ne[d] = d < n_dims ? ne[d] : 1;
    const TypeTraits& tt = traits(type);
    MOE_ASSERT(t.ne[0] % tt.block_size == 0);
    t.nb[0] = static_cast<size_t>(tt.block_bytes);
    t.nb[1] = row_bytes(type, t.ne[0]);
    for (int d = 2; d < 4; ++d) t.nb[d] = t.nb[d - 1] * static_cast<size_t>(t.ne[d - 1]);
}

}  // namespace moe
