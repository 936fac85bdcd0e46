// Row-wise normalisations: RMS_NORM (optionally times a weight row), SOFTMAX (max-subtracted) and
// NORM_SCALE (the routers' top-k weights over their sum, times a scale).
#include <cmath>
#include <limits>
#include <string>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {

Status rms_norm(Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_rms_norm(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const Tensor* w = dst.src[1];
    const float eps = dst.params.f[0];
    const int64_t n = dst.ne[0];
    const float* wr = w != nullptr ? w->as<float>() : nullptr;
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = ops::split_row(dst, r);
        const auto* xr = reinterpret_cast<const float*>(x.row(ri.i1, ri.i2, ri.i3));
        auto* d = reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3));
        const double mean = ops::sum_sq_f32(xr, n) / static_cast<double>(n);
        const auto scale = static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
        if (wr != nullptr) {
            for (int64_t i = 0; i < n; ++i) d[i] = xr[i] * scale * wr[i];
        } else {
            for (int64_t i = 0; i < n; ++i) d[i] = xr[i] * scale;
        }
    });
    return Status::ok();
}

Status softmax(Tensor& dst) {
    if (dst.op != Op::SOFTMAX) return invalid_argument(std::string("softmax: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("SOFTMAX", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("SOFTMAX", "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(ops::check_same_shape("SOFTMAX", "src0", x, dst));
    const int64_t n = dst.ne[0];
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = ops::split_row(dst, r);
        const auto* xr = reinterpret_cast<const float*>(x.row(ri.i1, ri.i2, ri.i3));
        auto* d = reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3));
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n; ++i) mx = xr[i] > mx ? xr[i] : mx;
        // A row of -inf (fully masked) has no maximum to subtract: it becomes all zeros, not NaN. The
        // maximum skips NaN, so a row of NaN (and -inf) lands here too: it stays NaN, as a NaN in a
        // row with a maximum makes the sum, and so the whole row, NaN.
        if (mx == -std::numeric_limits<float>::infinity()) {
            bool nan = false;
            for (int64_t i = 0; i < n; ++i) nan = nan || std::isnan(xr[i]);
            const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
            for (int64_t i = 0; i < n; ++i) d[i] = fill;
            return;
        }
        for (int64_t i = 0; i < n; ++i) d[i] = ops::exp_approx(xr[i] - mx);
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += d[i];
        const auto inv = static_cast<float>(1.0 / sum);
        for (int64_t i = 0; i < n; ++i) d[i] *= inv;
    });
    return Status::ok();
}

Status norm_scale(Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_norm_scale(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const bool normalize = dst.params.i[0] != 0;
    const float scale = dst.params.f[0];
    const int64_t n = dst.ne[0];
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = ops::split_row(dst, r);
        const auto* xr = reinterpret_cast<const float*>(x.row(ri.i1, ri.i2, ri.i3));
        auto* d = reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3));
        float f = scale;
        if (normalize) {
            float sum = 0.0f;
            for (int64_t i = 0; i < n; ++i) sum += xr[i];
            f = scale / (sum + 1e-20f);
        }
        for (int64_t i = 0; i < n; ++i) d[i] = xr[i] * f;
    });
    return Status::ok();
}

}  // namespace moe::cpu
