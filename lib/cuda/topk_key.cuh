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

// The largest v of the warp (all 32 lanes call it): the largest high half, then the largest low half
// among the lanes that hold it. Two redux.sync reductions (sm_80+) instead of five rounds of two
// shuffles; the same value.
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto hi = static_cast<unsigned int>(v >> 32);
    const unsigned int hi_max = __reduce_max_sync(0xffffffffu, hi);
    const unsigned int lo_max = __reduce_max_sync(0xffffffffu, hi == hi_max ? static_cast<unsigned int>(v) : 0u);
    return static_cast<unsigned long long>(hi_max) << 32 | lo_max;
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    return v;
#endif
}

}  // namespace moe::cuda
