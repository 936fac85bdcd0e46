// Element-wise kernels: MUL / ADD with broadcasting, SILU, SIGMOID, SWIGLU / SWIGLU_OAI and CPY (F32 -> F32/F16
// into a strided view such as a KV-cache slot). Parallel over rows; the inner loops are plain so the
// compiler vectorises them.
#include <algorithm>
#include <cstring>
#include <string>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {
namespace {

using ops::check_operand;
using ops::check_same_shape;
using ops::split_row;

template <bool kMul>
void binary_row(float* d, const float* a, const float* b, int64_t n, int64_t nb0) {
    if (nb0 == n) {
        for (int64_t i = 0; i < n; ++i) d[i] = kMul ? a[i] * b[i] : a[i] + b[i];
    } else if (nb0 == 1) {
        const float s = b[0];
        for (int64_t i = 0; i < n; ++i) d[i] = kMul ? a[i] * s : a[i] + s;
    } else {
        // src1's row repeats n / nb0 times along the row.
        for (int64_t o = 0; o < n; o += nb0) {
            for (int64_t i = 0; i < nb0; ++i) d[o + i] = kMul ? a[o + i] * b[i] : a[o + i] + b[i];
        }
    }
}

template <bool kMul>
void binary_impl(Tensor& dst, const Tensor& a, const Tensor& b) {
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = split_row(dst, r);
        const auto* ar = reinterpret_cast<const float*>(a.row(ri.i1, ri.i2, ri.i3));
        const auto* br = reinterpret_cast<const float*>(b.row(ri.i1 % b.ne[1], ri.i2 % b.ne[2], ri.i3 % b.ne[3]));
        binary_row<kMul>(reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3)), ar, br, dst.ne[0], b.ne[0]);
    });
}

void silu_row(float* d, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) d[i] = x[i] * ops::sigmoid(x[i]);
}

void swiglu_row(float* d, const float* g, const float* u, int64_t n) {
    for (int64_t i = 0; i < n; ++i) d[i] = g[i] * ops::sigmoid(g[i]) * u[i];
}

// GPT-OSS: the gate is clamped from above only, the up projection on both sides, and up gets +1.
void swiglu_oai_row(float* d, const float* g, const float* u, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(g[i], limit);
        const float y = std::clamp(u[i], -limit, limit);
        d[i] = x * ops::sigmoid(alpha * x) * (y + 1.0f);
    }
}

}  // namespace

Status binary(Tensor& dst) {
    if (dst.op != Op::MUL && dst.op != Op::ADD) {
        return invalid_argument(std::string("binary: dst.op is ") + op_name(dst.op) + ", expected MUL or ADD");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand(name, "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(check_operand(name, "src1", dst.src[1], Type::F32));
    const Tensor& a = *dst.src[0];
    const Tensor& b = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_same_shape(name, "src0", a, dst));
    for (int d = 0; d < 4; ++d) {
        if (b.ne[d] <= 0 || a.ne[d] % b.ne[d] != 0) {
            return invalid_argument(std::string(name) + ": src1 shape " + ops::shape_str(b) +
                                    " does not broadcast to src0 shape " + ops::shape_str(a) + " (dim " +
                                    std::to_string(d) + ")");
        }
    }
    if (dst.op == Op::MUL) {
        binary_impl<true>(dst, a, b);
    } else {
        binary_impl<false>(dst, a, b);
    }
    return Status::ok();
}

Status unary(Tensor& dst) {
    if (dst.op != Op::SILU && dst.op != Op::SIGMOID) {
        return invalid_argument(std::string("unary: dst.op is ") + op_name(dst.op) + ", expected SILU or SIGMOID");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand(name, "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(check_same_shape(name, "src0", x, dst));
    const bool silu = dst.op == Op::SILU;
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = split_row(dst, r);
        auto* d = reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3));
        const auto* xr = reinterpret_cast<const float*>(x.row(ri.i1, ri.i2, ri.i3));
        if (silu) {
            silu_row(d, xr, dst.ne[0]);
        } else {
            for (int64_t i = 0; i < dst.ne[0]; ++i) d[i] = ops::sigmoid(xr[i]);
        }
    });
    return Status::ok();
}

Status glu(Tensor& dst) {
    if (dst.op != Op::SWIGLU && dst.op != Op::SWIGLU_OAI) {
        return invalid_argument(std::string("glu: dst.op is ") + op_name(dst.op) + ", expected SWIGLU or SWIGLU_OAI");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand(name, "src0 (gate)", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(check_operand(name, "src1 (up)", dst.src[1], Type::F32));
    const Tensor& g = *dst.src[0];
    const Tensor& u = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_same_shape(name, "src0 (gate)", g, dst));
    MOE_RETURN_IF_ERROR(check_same_shape(name, "src1 (up)", u, dst));
    const bool oai = dst.op == Op::SWIGLU_OAI;
    const float alpha = dst.params.f[0];
    const float limit = dst.params.f[1];
    if (oai && !(limit > 0.0f)) {
        return invalid_argument("SWIGLU_OAI: params.f[1] (limit) must be > 0, got " + std::to_string(limit));
    }
    ops::for_each_row(dst, [&](int64_t r) {
        const ops::RowIndex ri = split_row(dst, r);
        auto* d = reinterpret_cast<float*>(dst.row(ri.i1, ri.i2, ri.i3));
        const auto* gr = reinterpret_cast<const float*>(g.row(ri.i1, ri.i2, ri.i3));
        const auto* ur = reinterpret_cast<const float*>(u.row(ri.i1, ri.i2, ri.i3));
        if (oai) {
            swiglu_oai_row(d, gr, ur, dst.ne[0], alpha, limit);
        } else {
            swiglu_row(d, gr, ur, dst.ne[0]);
        }
    });
    return Status::ok();
}

// CPY writes src0 into dst's bytes through dst's own strides (dst is a view of src1, typically a
// KV-cache slot), or with rows (src2) src0's token t into dst's row rows[t] (op_checks::check_cpy).
Status cpy(Tensor& dst) {
    if (dst.op != Op::CPY) return invalid_argument(std::string("cpy: dst.op is ") + op_name(dst.op) + ", expected CPY");
    MOE_RETURN_IF_ERROR(ops::check_cpy(dst));
    const Tensor& s = *dst.src[0];
    const Tensor* rows = dst.src[2];
    const int32_t* row_of = rows != nullptr ? rows->as<int32_t>() : nullptr;
    if (row_of != nullptr) {
        for (int64_t t = 0; t < s.ne[2]; ++t) {
            if (row_of[t] < 0 || row_of[t] >= dst.ne[2]) {
                return out_of_range("CPY: rows[" + std::to_string(t) + "] = " + std::to_string(row_of[t]) +
                                    " is outside the destination's " + std::to_string(dst.ne[2]) + " rows");
            }
        }
    }
    const bool same = row_of != nullptr || ops::same_shape(s, dst);
    const bool to_f16 = dst.type == Type::F16;
    const size_t esz = ops::elem_size(dst.type);
    const int64_t n = dst.ne[0];
    // With rows, src0's rows are walked (T of them) and each lands in its dst row.
    const Tensor& walked = row_of != nullptr ? s : dst;
    ops::for_each_row(walked, [&](int64_t r) {
        const ops::RowIndex ri = split_row(walked, r);
        uint8_t* d = dst.row(ri.i1, row_of != nullptr ? row_of[ri.i2] : ri.i2, ri.i3);
        const float* x = same ? reinterpret_cast<const float*>(s.row(ri.i1, ri.i2, ri.i3)) : s.as<float>() + r * n;
        if (dst.nb[0] == esz) {
            ops::convert_row(reinterpret_cast<const uint8_t*>(x), Type::F32, d, dst.type, n);
        } else {
            for (int64_t i = 0; i < n; ++i) {
                uint8_t* p = d + static_cast<size_t>(i) * dst.nb[0];
                if (to_f16) {
                    const uint16_t h = fp32_to_fp16(x[i]);
                    std::memcpy(p, &h, sizeof h);
                } else {
                    std::memcpy(p, &x[i], sizeof(float));
                }
            }
        }
    });
    return Status::ok();
}

}  // namespace moe::cpu
