// The router's top-k ordering on the GPU, shared by the TOPK kernel and the fused router kernel so
// that both select exactly the same experts as the CPU.
#pragma once

#include <cstdint>

namespace moe::cuda {

// Each value becomes a 64-bit key that orders like the CPU's comparison: the float (NaN ranked as
// -inf, -0 as +0) mapped to an order-preserving uint32 in the high half, and ~index in the low half,
// so equal values rank the lower index first. All keys of a column are distinct and nonzero, which
// lets pass j select "the largest key below the one pass j-1 selected" with no marking of taken ones.
__device__ __forceinline__ unsigned long long topk_key(float v, int64_t e) {
    if (isnan(v)) v = -INFINITY;
    if (v == 0.0f) v = 0.0f;
    const unsigned int b = __float_as_uint(v);
    const unsigned int u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - static_cast<unsigned int>(e));
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    return v;
}

}  // namespace moe::cuda
