// RoPE angle math shared by ROPE (ops_rope.cu) and the fused attention prologue (ops_fused.cu), so
// that both compute bitwise the same cos / sin: theta_i = pos * freq_base^(-2i/n_dims), blended per
// pair i by the YaRN ramp, formed in double, cos / sin rounded to float and scaled by mscale.
#pragma once

#include <cmath>

#include "core/tensor.h"

namespace moe::cuda {

struct RopeArgs {
    int n_dims;
    double freq_base;
    double freq_scale;
    double ext_factor;
    double corr_lo;   // YaRN ramp start (pair index), clamped
    double corr_den;  // max(0.001, hi - lo)
    float mscale;
};

// The kernel arguments of RopeParams p (yarn_ramp() is core's, shared with the CPU kernel).
inline RopeArgs rope_args(const RopeParams& p) {
    RopeArgs a{};
    a.n_dims = p.n_dims;
    a.freq_base = p.freq_base;
    a.freq_scale = p.freq_scale;
    a.ext_factor = p.ext_factor;
    if (p.ext_factor != 0.0f) {
        const YarnRamp ramp = yarn_ramp(p);
        a.corr_lo = ramp.lo;
        a.corr_den = ramp.den;
    }
    a.mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) a.mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    return a;
}

// Per pair i: theta_i(pos) = pos * coef(i); written as the CPU's angle_coefficients().
__device__ inline double rope_angle_coef(const RopeArgs& a, int i) {
    const double inv_freq = pow(a.freq_base, -2.0 * i / a.n_dims);
    double mix = a.freq_scale;
    if (a.ext_factor != 0.0) {
        const double y = (i - a.corr_lo) / a.corr_den;
        const double ramp_mix = (1.0 - fmin(fmax(y, 0.0), 1.0)) * a.ext_factor;
        mix = a.freq_scale * (1.0 - ramp_mix) + ramp_mix;
    }
    return inv_freq * mix;
}

// cos and sin of pair i at position p, as rope_kernel stores them.
__device__ inline void rope_cos_sin(const RopeArgs& a, int i, int p, float& c, float& s) {
    double sd, cd;
    sincos(static_cast<double>(p) * rope_angle_coef(a, i), &sd, &cd);
    c = static_cast<float>(cd) * a.mscale;
    s = static_cast<float>(sd) * a.mscale;
}

}  // namespace moe::cuda
