// Operand checks shared by every backend's kernels: both backends reject the same nodes with the
// same messages, naming the offending operand ("ATTENTION: src3 (positions) must be i32, got f32").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace moe::op_checks {

// Type name that also covers I32 (internal; not in the traits table).
inline std::string type_str(Type t) {
    if (t == Type::I32) return "i32";
    const TypeTraits* tt = type_traits(static_cast<int32_t>(t));
    return tt != nullptr ? tt->name : "type " + std::to_string(static_cast<int32_t>(t));
}

// Bytes per element of the types kernels read element by element; 0 for block-quantised types.
inline size_t elem_size(Type t) {
    switch (t) {
        case Type::F32:
        case Type::I32:
            return 4;
        case Type::F16:
        case Type::BF16:
            return 2;
        default:
            return 0;
    }
}

inline std::string shape_str(const Tensor& t) {
    std::string s = "[";
    for (int d = 0; d < 4; ++d) {
        s += std::to_string(t.ne[d]);
        s += d < 3 ? ", " : "]";
    }
    return s;
}

// `t` exists, has type `type`, and its rows are contiguous (nb[0] is the element size); higher
// dimensions may be strided (views).
inline Status check_operand(const char* op, const char* role, const Tensor* t, Type type) {
    if (t == nullptr) return invalid_argument(std::string(op) + ": " + role + " is missing");
    if (t->type != type) {
        return invalid_argument(std::string(op) + ": " + role + " must be " + type_str(type) + ", got " +
                                type_str(t->type));
    }
    if (t->data == nullptr) return invalid_argument(std::string(op) + ": " + role + " has no data");
    if (t->nb[0] != elem_size(type)) {
        return unimplemented(std::string(op) + ": " + role + " has element stride nb[0] = " + std::to_string(t->nb[0]) +
                             "; rows must be contiguous");
    }
    return Status::ok();
}

inline bool same_shape(const Tensor& a, const Tensor& b) {
    return a.ne[0] == b.ne[0] && a.ne[1] == b.ne[1] && a.ne[2] == b.ne[2] && a.ne[3] == b.ne[3];
}

inline Status check_same_shape(const char* op, const char* role, const Tensor& t, const Tensor& want) {
    if (same_shape(t, want)) return Status::ok();
    return invalid_argument(std::string(op) + ": " + role + " has shape " + shape_str(t) + ", expected " +
                            shape_str(want));
}

inline Status check_2d(const char* op, const char* role, const Tensor& t) {
    if (t.ne[2] != 1 || t.ne[3] != 1) {
        return invalid_argument(std::string(op) + ": " + role + " must be 2-D, got shape " + shape_str(t));
    }
    return Status::ok();
}


// CPY's operands (see core/tensor.h); both backends accept exactly these nodes. src0 and dst either
// have the same shape (src0 may then be strided too), or src0 is contiguous and its elements are taken
// in order (a reshape on the fly); with rows (src2), src0 [A, B, T] and dst [A, B, N] (src0 may be
// strided). The row values are checked where they are read.
inline Status check_cpy(const Tensor& dst) {
    MOE_RETURN_IF_ERROR(check_operand("CPY", "src0", dst.src[0], Type::F32));
    const Tensor& s = *dst.src[0];
    if (dst.type != Type::F32 && dst.type != Type::F16) {
        return unimplemented("CPY: dst type " + type_str(dst.type) + " is not supported (F32 or F16)");
    }
    if (dst.data == nullptr) return invalid_argument("CPY: dst has no data");
    if (const Tensor* rows = dst.src[2]; rows != nullptr) {
        MOE_RETURN_IF_ERROR(check_operand("CPY", "src2 (rows)", rows, Type::I32));
        if (rows->ne[0] != s.ne[2] || rows->n_elements() != s.ne[2] || s.ne[0] != dst.ne[0] || s.ne[1] != dst.ne[1] ||
            s.ne[3] != 1 || dst.ne[3] != 1) {
            return invalid_argument("CPY: src0 " + shape_str(s) + " with rows " + shape_str(*rows) +
                                    " does not fit dst " + shape_str(dst) + " (expected [A, B, T], [T], [A, B, N])");
        }
        return Status::ok();
    }
    if (s.n_elements() != dst.n_elements()) {
        return invalid_argument("CPY: src0 has " + std::to_string(s.n_elements()) + " elements, dst " +
                                std::to_string(dst.n_elements()));
    }
    if (!same_shape(s, dst) && !s.is_contiguous()) {
        return unimplemented("CPY: src0 " + shape_str(s) + " must be contiguous when its shape differs from dst " +
                             shape_str(dst));
    }
    return Status::ok();
}

// ATTENTION's operands and parameters (see core/tensor.h); both backends accept exactly these nodes.
inline Status check_attention(const Tensor& dst) {
    MOE_RETURN_IF_ERROR(check_operand("ATTENTION", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("ATTENTION", "src0 (q)", dst.src[0], Type::F32));
    const Tensor* kv[2] = {dst.src[1], dst.src[2]};
    const char* kv_name[2] = {"src1 (k)", "src2 (v)"};
    for (int i = 0; i < 2; ++i) {
        const Type t = kv[i] != nullptr && kv[i]->type == Type::F16 ? Type::F16 : Type::F32;
        MOE_RETURN_IF_ERROR(check_operand("ATTENTION", kv_name[i], kv[i], t));
    }
    MOE_RETURN_IF_ERROR(check_operand("ATTENTION", "src3 (positions)", dst.src[3], Type::I32));
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    const Tensor& v = *dst.src[2];
    const Tensor& pos = *dst.src[3];
    MOE_RETURN_IF_ERROR(check_same_shape("ATTENTION", "src0 (q)", q, dst));
    if (q.ne[3] != 1 || k.ne[3] != 1 || v.ne[3] != 1) {
        return invalid_argument("ATTENTION: q, k and v must be 3-D ([D, H, T], [D, Hkv, n_kv])");
    }
    if (k.ne[0] != q.ne[0] || v.ne[0] != q.ne[0] || k.ne[1] != v.ne[1] || k.ne[1] <= 0 || q.ne[1] % k.ne[1] != 0) {
        return invalid_argument("ATTENTION: q " + shape_str(q) + ", k " + shape_str(k) + " and v " +
                                shape_str(v) + " do not match (same D; H a multiple of Hkv)");
    }
    if (pos.ne[0] != q.ne[2] || pos.n_rows() != 1) {
        return invalid_argument("ATTENTION: src3 (positions) has shape " + shape_str(pos) + ", expected [" +
                                std::to_string(q.ne[2]) + "]");
    }
    const int32_t n_kv = dst.params.i[1];
    if (n_kv <= 0 || n_kv > k.ne[2] || n_kv > v.ne[2]) {
        return invalid_argument("ATTENTION: params.i[1] (n_kv) = " + std::to_string(n_kv) + " must be in [1, " +
                                std::to_string(std::min(k.ne[2], v.ne[2])) + "]");
    }
    if (dst.params.i[0] < 0) {
        return invalid_argument("ATTENTION: params.i[0] (window) = " + std::to_string(dst.params.i[0]) +
                                " is negative");
    }
    if (!std::isfinite(dst.params.f[0])) return invalid_argument("ATTENTION: params.f[0] (scale) is not finite");
    const Tensor* sinks = dst.src[4];
    if (sinks != nullptr) {
        MOE_RETURN_IF_ERROR(check_operand("ATTENTION", "src4 (sinks)", sinks, Type::F32));
        if (sinks->ne[0] != q.ne[1] || sinks->n_rows() != 1) {
            return invalid_argument("ATTENTION: src4 (sinks) has shape " + shape_str(*sinks) + ", expected [" +
                                    std::to_string(q.ne[1]) + "]");
        }
    }
    return Status::ok();
}


// ROPE's operands and parameters (see core/tensor.h and RopeParams).
inline Status check_rope(const Tensor& dst) {
    if (dst.op != Op::ROPE) return invalid_argument(std::string("rope: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_operand("ROPE", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("ROPE", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("ROPE", "src1 (positions)", dst.src[1], Type::I32));
    const Tensor& x = *dst.src[0];
    const Tensor& pos = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_same_shape("ROPE", "src0", x, dst));
    if (x.ne[3] != 1) return invalid_argument("ROPE: src0 must be [D, H, T], got " + shape_str(x));
    if (pos.ne[0] != x.ne[2] || pos.n_rows() != 1) {
        return invalid_argument("ROPE: src1 (positions) has shape " + shape_str(pos) + ", expected [" +
                                std::to_string(x.ne[2]) + "]");
    }
    const RopeParams p = dst.rope_params();
    if (p.n_dims <= 0 || p.n_dims % 2 != 0 || p.n_dims > x.ne[0]) {
        return invalid_argument("ROPE: n_dims (params.i[0]) = " + std::to_string(p.n_dims) +
                                " must be even and in [2, " + std::to_string(x.ne[0]) + "]");
    }
    if (!(p.freq_base > 0.0f) || !(p.freq_scale > 0.0f)) {
        return invalid_argument("ROPE: freq_base (params.f[0]) and freq_scale (params.f[1]) must be > 0");
    }
    if (p.ext_factor != 0.0f && p.n_ctx_orig <= 0) {
        return invalid_argument("ROPE: YaRN (ext_factor != 0) needs n_ctx_orig (params.i[1]) > 0, got " +
                                std::to_string(p.n_ctx_orig));
    }
    return Status::ok();
}


// RMS_NORM's operands and eps.
inline Status check_rms_norm(const Tensor& dst) {
    if (dst.op != Op::RMS_NORM) return invalid_argument(std::string("rms_norm: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_operand("RMS_NORM", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("RMS_NORM", "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(check_same_shape("RMS_NORM", "src0", x, dst));
    const Tensor* w = dst.src[1];
    if (w != nullptr) {
        MOE_RETURN_IF_ERROR(check_operand("RMS_NORM", "src1 (weight)", w, Type::F32));
        if (w->ne[0] != x.ne[0] || w->n_rows() != 1) {
            return invalid_argument("RMS_NORM: src1 (weight) has shape " + shape_str(*w) + ", expected [" +
                                    std::to_string(x.ne[0]) + "]");
        }
    }
    const float eps = dst.params.f[0];
    if (!(eps >= 0.0f)) return invalid_argument("RMS_NORM: params.f[0] (eps) must be >= 0, got " + std::to_string(eps));
    return Status::ok();
}

// NORM_SCALE's operands and scale.
inline Status check_norm_scale(const Tensor& dst) {
    if (dst.op != Op::NORM_SCALE) return invalid_argument(std::string("norm_scale: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_operand("NORM_SCALE", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("NORM_SCALE", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(check_same_shape("NORM_SCALE", "src0", *dst.src[0], dst));
    const float scale = dst.params.f[0];
    if (!std::isfinite(scale)) {
        return invalid_argument("NORM_SCALE: params.f[0] (scale) must be finite, got " + std::to_string(scale));
    }
    return Status::ok();
}

// MASK_IDS: src0 ids I32 [k, T], src1 groups contiguous I32 [E], dst I32 [k, T] (the ids' values are
// checked by the kernels).
inline Status check_mask_ids(const Tensor& dst) {
    if (dst.op != Op::MASK_IDS) return invalid_argument(std::string("mask_ids: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_operand("MASK_IDS", "src0 (ids)", dst.src[0], Type::I32));
    MOE_RETURN_IF_ERROR(check_operand("MASK_IDS", "src1 (groups)", dst.src[1], Type::I32));
    MOE_RETURN_IF_ERROR(check_operand("MASK_IDS", "dst", &dst, Type::I32));
    const Tensor& ids = *dst.src[0];
    const Tensor& groups = *dst.src[1];
    MOE_RETURN_IF_ERROR(check_2d("MASK_IDS", "src0 (ids)", ids));
    if (!same_shape(dst, ids) || groups.n_rows() != 1) {
        return invalid_argument("MASK_IDS: src0 " + shape_str(ids) + ", src1 " + shape_str(groups) + " and dst " +
                                shape_str(dst) + " do not match ([k, T], [E] -> [k, T])");
    }
    return Status::ok();
}

// WEIGHTED_SUM's optional src2 ids I32 [k, T] (a part of a split expert block), against its weights.
inline Status check_weighted_sum_ids(const Tensor& dst) {
    const Tensor* ids = dst.src[2];
    if (ids == nullptr) return Status::ok();
    MOE_RETURN_IF_ERROR(check_operand("WEIGHTED_SUM", "src2 (ids)", ids, Type::I32));
    const Tensor& w = *dst.src[1];
    if (ids->ne[0] != w.ne[0] || ids->ne[1] != w.ne[1] || ids->ne[2] != 1 || ids->ne[3] != 1) {
        return invalid_argument("WEIGHTED_SUM: src2 (ids) " + shape_str(*ids) + " does not match src1 " + shape_str(w));
    }
    return Status::ok();
}

// CONCAT: src0 [A, H, T], optional src1 [B, H or 1, T], dst contiguous [A + B, H, T]; each F32 or F16.
inline Status check_concat(const Tensor& dst) {
    if (dst.op != Op::CONCAT) return invalid_argument(std::string("concat: dst.op is ") + op_name(dst.op));
    const auto float_type = [](const Tensor* t) {
        return t != nullptr && t->type == Type::F16 ? Type::F16 : Type::F32;
    };
    MOE_RETURN_IF_ERROR(check_operand("CONCAT", "src0", dst.src[0], float_type(dst.src[0])));
    if (dst.src[1] != nullptr) MOE_RETURN_IF_ERROR(check_operand("CONCAT", "src1", dst.src[1], float_type(dst.src[1])));
    MOE_RETURN_IF_ERROR(check_operand("CONCAT", "dst", &dst, float_type(&dst)));
    const Tensor& a = *dst.src[0];
    const Tensor* b = dst.src[1];
    const int64_t nb0 = b != nullptr ? b->ne[0] : 0;
    const bool b_ok = b == nullptr || (b->ne[3] == 1 && b->ne[2] == a.ne[2] && (b->ne[1] == a.ne[1] || b->ne[1] == 1));
    if (a.ne[3] != 1 || !b_ok || dst.ne[0] != a.ne[0] + nb0 || dst.ne[1] != a.ne[1] || dst.ne[2] != a.ne[2] ||
        dst.ne[3] != 1) {
        return invalid_argument("CONCAT: src0 " + shape_str(a) + ", src1 " + (b != nullptr ? shape_str(*b) : "(none)") +
                                " and dst " + shape_str(dst) +
                                " do not match ([A, H, T], [B, H or 1, T] or none -> [A + B, H, T])");
    }
    if (!dst.is_contiguous()) return unimplemented("CONCAT: dst must be contiguous");
    return Status::ok();
}

// GROUP_MASK: src0 F32 [E, T], dst contiguous F32 [E, T]; i[0] groups dividing E, i[1] in [1, i[0]],
// i[2] in [1, E / i[0]].
inline Status check_group_mask(const Tensor& dst) {
    if (dst.op != Op::GROUP_MASK) return invalid_argument(std::string("group_mask: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_operand("GROUP_MASK", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(check_operand("GROUP_MASK", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(check_same_shape("GROUP_MASK", "src0", *dst.src[0], dst));
    if (dst.ne[2] != 1 || dst.ne[3] != 1) return invalid_argument("GROUP_MASK: dst must be [E, T], got " + shape_str(dst));
    const int32_t n_group = dst.params.i[0], n_used = dst.params.i[1], top_n = dst.params.i[2];
    if (n_group <= 0 || dst.ne[0] % n_group != 0 || n_used <= 0 || n_used > n_group || top_n <= 0 ||
        top_n > dst.ne[0] / n_group) {
        return invalid_argument("GROUP_MASK: " + std::to_string(n_group) + " groups (params.i[0]), " +
                                std::to_string(n_used) + " used (i[1]) and top " + std::to_string(top_n) +
                                " (i[2]) do not fit " + std::to_string(dst.ne[0]) + " experts");
    }
    return Status::ok();
}

}  // namespace moe::op_checks
