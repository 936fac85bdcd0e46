// The router's selection of one token (TOPK, GATHER of the chosen logits, SOFTMAX of them) by one warp,
// shared by the fused router kernel (ops_fused.cu) and the router GEMV's last block (matmul_gemv.cu),
// so that both give bitwise the results of the unfused TOPK, GATHER and SOFTMAX kernels.
#pragma once

#include <cstdint>

#include "cuda/ops_common.cuh"
#include "cuda/topk_key.cuh"

namespace moe::cuda {

constexpr int kRouterKeys = 8;  // experts up to 256: the keys stay in registers

// Warp `lane`s pick token t's k largest logits of x (row t). Every thread of the block calls it (it
// has block barriers); `active` false for warps with no token. The logits are read with ld.global.cg,
// so a block may read rows that other blocks of its grid wrote (after their fences).
// kKeys: keys per lane held in registers, read once (n <= 32 * kKeys); 0: read again each round.
template <int kKeys>
__device__ __forceinline__ void router_select_token(const ops::View& x, const ops::View& ids, const ops::View& vals,
                                                    const ops::View& probs, int k, int lane, int64_t t, bool active) {
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(x, active ? t : 0, 0, 0));
    const int64_t n = active ? x.ne[0] : 0;
    unsigned long long keys[kKeys > 0 ? kKeys : 1];
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        const int e = lane + 32 * i;
        keys[i] = e < n ? topk_key(__ldcg(xr + e), e) : 0ull;  // 0 is below every key: never chosen
    }
    unsigned long long prev = ~0ull;
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
        unsigned long long best = 0;
        if constexpr (kKeys > 0) {
#pragma unroll
            for (int i = 0; i < kKeys; ++i) {
                if (keys[i] < prev && keys[i] > best) best = keys[i];
            }
        } else {
            for (int64_t e = lane; e < n; e += 32) {
                const unsigned long long key = topk_key(__ldcg(xr + e), e);
                if (key < prev && key > best) best = key;
            }
        }
        best = warp_max_u64(best);
        if (lane == j) my_id = static_cast<int>(0xffffffffu - static_cast<unsigned int>(best));
        prev = best;
    }
    const float g = active && lane < k ? __ldcg(xr + my_id) : -INFINITY;
    // As softmax_kernel's warp rows: one value per lane, so the same reductions in the same order.
    const float mx = ops::warp_max(g);
    float p = 0.0f;
    if (mx != -INFINITY) {
        const float e = lane < k ? expf(g - mx) : 0.0f;
        const float inv = 1.0f / ops::warp_sum(e);
        p = e * inv;
    }
    const bool write = active && lane < k;
    __syncthreads();  // every read is done: outputs may reuse the logits' bytes
    if (write) reinterpret_cast<int32_t*>(ops::row_at(ids, t, 0, 0))[lane] = my_id;
    __syncthreads();
    if (write) reinterpret_cast<float*>(ops::row_at(vals, t, 0, 0))[lane] = g;
    __syncthreads();
    if (write) reinterpret_cast<float*>(ops::row_at(probs, t, 0, 0))[lane] = p;
}

}  // namespace moe::cuda
