// Row-wise normalisations: RMS_NORM (optionally times a weight row) and SOFTMAX (max-subtracted).
#include <cmath>
#include <limits>
#include <string>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {

Status rms_norm(Tensor& dst) {
    if (dst.op != Op::RMS_NORM) return invalid_argument(std::string("rms_norm: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("RMS_NORM", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("RMS_NORM", "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(ops::check_same_shape("RMS_NORM", "src0", x, dst));
    const Tensor* w = dst.src[1];
    if (w != nullptr) {
        MOE_RETURN_IF_ERROR(ops::check_operand("RMS_NORM", "src1 (weight)", w, Type::F32));
        if (w->ne[0] != x.ne[0] || w->n_rows() != 1) {
            return invalid_argument("RMS_NORM: src1 (weight) has shape " + ops::shape_str(*w) + ", expected [" +
                                    std::to_string(x.ne[0]) + "]");
        }
    }
    const float eps = dst.params.f[0];
    if (!(eps >= 0.0f)) return invalid_argument("RMS_NORM: params.f[0] (eps) must be >= 0, got " + std::to_string(eps));
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
        // A row of -inf (fully masked) has no maximum to subtract: it becomes all zeros, not NaN.
        if (mx == -std::numeric_limits<float>::infinity()) {
            for (int64_t i = 0; i < n; ++i) d[i] = 0.0f;
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

}  // namespace moe::cpu
