// ROPE, NeoX layout: the pairs are (i, i + n_dims/2) for i < n_dims/2 (interleaved: (2i, 2i + 1));
// elements from n_dims on pass through. theta_i = pos * freq_base^(-2i/n_dims), with ggml's YaRN (rope_yarn): the interpolated angle
// freq_scale * theta is blended with the extrapolated one per pair by a ramp between the correction
// dims (core's yarn_ramp(): rounded to integers only with yarn_truncate), and cos/sin are scaled by
// mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)) when YaRN is on.
//
// Angles are formed in double: at position 30k a float angle is off by ~2e-3 rad. cos/sin are
// computed once per (token, pair) and applied to every head of that token.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {
namespace {

// Per pair i: theta_i(pos) = pos * coef[i].
std::vector<double> angle_coefficients(const RopeParams& p) {
    const int half = p.n_dims / 2;
    std::vector<double> coef(static_cast<size_t>(half));
    const YarnRamp ramp = yarn_ramp(p);
    for (int i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
        double mix = static_cast<double>(p.freq_scale);  // pure interpolation without YaRN
        if (p.ext_factor != 0.0f) {
            // In double: at large positions the two angles differ by thousands of radians, so a float
            // ramp would move the blend by ~1e-4 rad.
            const double y = (i - ramp.lo) / ramp.den;
            const double ramp_mix = (1.0 - std::clamp(y, 0.0, 1.0)) * p.ext_factor;
            mix = p.freq_scale * (1.0 - ramp_mix) + ramp_mix;
        }
        coef[static_cast<size_t>(i)] = inv_freq * mix;
    }
    return coef;
}

}  // namespace

Status rope(Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_rope(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const Tensor& pos = *dst.src[1];
    const RopeParams p = dst.rope_params();
    const std::vector<double> coef = angle_coefficients(p);
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    const int64_t half = p.n_dims / 2;
    const int64_t d_all = x.ne[0];
    const int64_t n_head = x.ne[1];
    const auto* positions = pos.as<int32_t>();
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, x.ne[2], ops::row_grain(d_all * n_head, 1 << 15)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          std::vector<float> cs(static_cast<size_t>(2 * half));  // cos then sin, per pair
                          float* cosv = cs.data();
                          float* sinv = cs.data() + half;
                          for (int64_t t = r.begin(); t < r.end(); ++t) {
                              const double ps = positions[t];
                              for (int64_t i = 0; i < half; ++i) {
                                  const double th = ps * coef[static_cast<size_t>(i)];
                                  cosv[i] = static_cast<float>(std::cos(th)) * mscale;
                                  sinv[i] = static_cast<float>(std::sin(th)) * mscale;
                              }
                              for (int64_t h = 0; h < n_head; ++h) {
                                  const auto* xs = reinterpret_cast<const float*>(x.row(h, t));
                                  auto* d = reinterpret_cast<float*>(dst.row(h, t));
                                  // Pair i is (i, i + half), or (2i, 2i + 1) when interleaved.
                                  const int64_t step = p.interleaved ? 2 : 1;
                                  const int64_t other = p.interleaved ? 1 : half;
                                  for (int64_t i = 0; i < half; ++i) {
                                      const float x0 = xs[i * step];
                                      const float x1 = xs[i * step + other];
                                      d[i * step] = x0 * cosv[i] - x1 * sinv[i];
                                      d[i * step + other] = x0 * sinv[i] + x1 * cosv[i];
                                  }
                                  if (d != xs) {
                                      for (int64_t i = p.n_dims; i < d_all; ++i) d[i] = xs[i];
                                  }
                              }
                          }
                      });
    return Status::ok();
}

}  // namespace moe::cpu
