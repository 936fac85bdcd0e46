// Helpers shared by the non-matmul CUDA kernels (cuda/ops_*.cu): operand checks that name the
// offending operand (the same rules as the CPU kernels, so both backends reject the same nodes),
// a by-value tensor description for kernel arguments, launch checks and small device math.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.cuh"

namespace moe::cuda::ops {

// ---- host-side checks ----

inline std::string type_str(Type t) {
    if (t == Type::I32) return "i32";
    const TypeTraits* tt = type_traits(static_cast<int32_t>(t));
    return tt != nullptr ? tt->name : "type " + std::to_string(static_cast<int32_t>(t));
}

// Bytes per element of the types kernels read element by element; 0 for block-quantised types.
inline size_t elem_size(Type t) {
    switch (t) {
        case Type::F32:
        case Type::I32: return 4;
        case Type::F16:
        case Type::BF16: return 2;
        default: return 0;
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

// `t` exists, has type `type`, has data and contiguous rows (nb[0] = element size); higher
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

// The error of the last launch on this thread, as a Status naming the kernel.
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

// ---- kernel arguments ----

// A tensor as a kernel argument: base pointer, shape and byte strides.
struct View {
    char* data;
    int64_t ne[4];
    int64_t nb[4];
};

inline View view_of(const Tensor& t) {
    View v{};
    v.data = static_cast<char*>(t.data);
    for (int d = 0; d < 4; ++d) {
        v.ne[d] = t.ne[d];
        v.nb[d] = static_cast<int64_t>(t.nb[d]);
    }
    return v;
}

// Grid dimension y / z is limited to 65535: kernels that index rows by blockIdx.y loop over the rest.
constexpr unsigned int kMaxGridYZ = 65535;

inline unsigned int grid_y(int64_t n) { return static_cast<unsigned int>(n < kMaxGridYZ ? (n > 0 ? n : 1) : kMaxGridYZ); }

inline unsigned int ceil_div(int64_t a, int64_t b) { return static_cast<unsigned int>((a + b - 1) / b); }

// ---- device helpers ----

__device__ __forceinline__ char* row_at(const View& t, int64_t i1, int64_t i2, int64_t i3) {
    return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

// Row r of a tensor with ne[1..3] = (n1, n2, *) as (i1, i2, i3).
__device__ __forceinline__ void split_row(int64_t r, int64_t n1, int64_t n2, int64_t& i1, int64_t& i2, int64_t& i3) {
    i1 = r % n1;
    r /= n1;
    i2 = r % n2;
    i3 = r / n2;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// 1 / (1 + e^-x) without overflow: through e^-|x|.
__device__ __forceinline__ float sigmoid(float x) {
    const float e = expf(-fabsf(x));
    const float inv = 1.0f / (1.0f + e);
    return x >= 0.0f ? inv : e * inv;
}

// A plain store, not an atomic: the word lives in mapped host memory, where device atomics are not
// guaranteed over PCIe; any nonzero value means "failed", so concurrent writers may overwrite each other.
__device__ __forceinline__ void flag_error(unsigned int* flags, unsigned int bit) {
    if (flags != nullptr) *reinterpret_cast<volatile unsigned int*>(flags) = bit;
}

}  // namespace moe::cuda::ops
