// Helpers shared by the non-matmul CUDA kernels (cuda/ops_*.cu): operand checks that name the
// offending operand (the same rules as the CPU kernels, so both backends reject the same nodes),
// a by-value tensor description for kernel arguments, grid sizing and small device math (launches:
// cuda/launch.cuh).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/op_checks.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.cuh"

namespace moe::cuda::ops {

// ---- host-side checks ----

// Operand checks (type_str, shape_str, check_operand, check_2d, ...) come from core, shared with the
// CPU kernels.
using namespace moe::op_checks;

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

// One Q8 activation block (32 values, lane j holds value j) quantised by a warp exactly as the CPU's
// quantize_q8a: int8 values packed into qs[0..7] by lanes 0, 4, ..., scale amax / 127 into *scale. A
// block with a non-finite value gets zero quants and a NaN scale, so every dot that uses it is NaN (as
// on the CPU). Every lane of the warp must call it.
__device__ __forceinline__ void warp_quantize_q8_block(float v, int lane, uint32_t* qs, float* scale) {
    const bool finite = __all_sync(0xffffffffu, isfinite(v));
    const float amax = warp_max(fabsf(v));
    if (!finite) {
        if ((lane & 3) == 0) qs[lane >> 2] = 0u;
        if (lane == 0) *scale = __int_as_float(0x7FC00000);
        return;
    }
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const uint32_t q = static_cast<uint32_t>(__float2int_rn(v * id)) & 0xFFu;
    const uint32_t q1 = __shfl_down_sync(0xffffffffu, q, 1);
    const uint32_t q2 = __shfl_down_sync(0xffffffffu, q, 2);
    const uint32_t q3 = __shfl_down_sync(0xffffffffu, q, 3);
    if ((lane & 3) == 0) qs[lane >> 2] = q | q1 << 8 | q2 << 16 | q3 << 24;
    if (lane == 0) *scale = amax / 127.0f;
}

// WEIGHTED_SUM's element i of token t: sum_j w[j, t] * y[i, j, t], summed in order j = 0, 1, ...
// The first kUnroll experts' values are loaded together (a loop over a runtime k would wait for
// each load in turn); shared by weighted_sum_kernel and the fused row chain, so both sum alike.
__device__ __forceinline__ float weighted_sum_at(const View& y, const View& w, int64_t t, int64_t i) {
    constexpr int kUnroll = 8;
    const int64_t k = y.ne[1];
    const auto* wr = reinterpret_cast<const float*>(row_at(w, t, 0, 0));
    float yv[kUnroll], wv[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
        if (j < k) {
            yv[j] = reinterpret_cast<const float*>(row_at(y, j, t, 0))[i];
            wv[j] = wr[j];
        }
    }
    float acc = wv[0] * yv[0];
#pragma unroll
    for (int j = 1; j < kUnroll; ++j) {
        if (j < k) acc += wv[j] * yv[j];
    }
    for (int64_t j = kUnroll; j < k; ++j) acc += wr[j] * reinterpret_cast<const float*>(row_at(y, j, t, 0))[i];
    return acc;
}

// F32 -> F16 bits as fp32_to_fp16 (core/types.h) gives them: round to nearest even; a NaN becomes the quiet
// NaN sign|0x7E00, where the hardware conversion gives 0x7FFF.
__device__ __forceinline__ unsigned short to_half_bits(float f) {
    if (isnan(f)) return static_cast<unsigned short>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
}

// F16 bits -> F32 as the CPU gives them (cpu/ops_common.h half_to_float, as F16C): exact, a NaN quieted
// with its payload kept, where the hardware conversion gives 0x7FFFFFFF.
__device__ __forceinline__ float from_half_bits(unsigned short h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
        return __uint_as_float((static_cast<unsigned int>(h & 0x8000u) << 16) | 0x7fc00000u |
                               (static_cast<unsigned int>(h & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(h));
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
