// Operand checks shared by every backend's kernels: both backends reject the same nodes with the
// same messages, naming the offending operand ("ATTENTION: src3 (positions) must be i32, got f32").
#pragma once

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

}  // namespace moe::op_checks
