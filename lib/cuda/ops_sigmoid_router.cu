// The sigmoid router of glm4moe and deepseek2 V3 / Kimi-K2 in one launch (fusion_plan.h
// kSigmoidRouter): SIGMOID of the router logits, [ADD of the selection bias], [GROUP_MASK], TOPK,
// GATHER of the unbiased scores, NORM_SCALE; five or six small kernels per MoE layer otherwise.
//
// One warp per token, one block: lane l holds experts l, l + 32, ... in registers. Every value is
// computed with the separate kernels' arithmetic, so the results are bitwise theirs:
//   - ops::sigmoid, then a + b (SigmoidFn, AddFn of ops_elementwise.cu);
//   - group scores: the sum, from 0, of each group's top_n values picked in (value desc, index asc)
//     order with NaN never picked and a missing pick adding 0 (group_mask_kernel's scan), here as
//     warp maxima of keys; groups kept by group_mask_kernel's own loop;
//   - the top k by topk_key (the TOPK kernel's order: NaN as -inf, ties to the lower index);
//   - norm_scale_kernel's warp row: one value per lane, one warp sum, scale / (sum + 1e-20).
// Every input of the block is read before any output is written, and the outputs (every part's, as
// later nodes may read any of them) are written in node order with a block barrier between nodes, so
// an output may reuse an input's or an earlier output's bytes as the allocator allows.
#include <cstdint>

#include "cuda/fusion_plan.h"
#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/topk_key.cuh"

namespace moe::cuda {
namespace {

using ops::View;

struct SigmoidRouterArgs {
    View x;                // logits [E, T]
    const float* bias;     // [E], or nullptr (no ADD)
    View scores, choice;   // SIGMOID, ADD (choice.data nullptr: no ADD)
    View masked;           // GROUP_MASK (masked.data nullptr: none)
    View ids, picked, weights;  // TOPK, GATHER, NORM_SCALE
    int k;
    int n_group, n_used, top_n;  // GROUP_MASK's params
    bool normalize;
    float scale;
};

constexpr int kMaxGroups = kMaxSigmoidRouterGroups;

// The group-score order: topk_key's, except that NaN is never picked (0 is below every other key).
__device__ __forceinline__ unsigned long long group_key(float v, int e) { return isnan(v) ? 0ull : topk_key(v, e); }

// The value lane (e % 32) holds in slot e / 32, to every lane (e uniform across the warp).
template <int kKeys>
__device__ __forceinline__ float warp_value(const float (&v)[kKeys], int e) {
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        if (i == e / 32) mine = v[i];
    }
    return __shfl_sync(0xffffffffu, mine, e % 32);
}

template <int kKeys>
__device__ __forceinline__ void write_row(const View& d, int64_t t, const float (&v)[kKeys], int lane, int64_t n) {
    auto* row = reinterpret_cast<float*>(ops::row_at(d, t, 0, 0));
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        if (lane + 32 * i < n) row[lane + 32 * i] = v[i];
    }
}

// blockDim (32, T): warp t takes token t. kKeys: experts per lane (E <= 32 * kKeys).
template <int kKeys>
__global__ void __launch_bounds__(32 * kMaxSigmoidRouterTokens) sigmoid_router_kernel(SigmoidRouterArgs a) {
    pdl_grid_sync_small();
    const int lane = static_cast<int>(threadIdx.x);
    const int64_t t = threadIdx.y;
    const int n = static_cast<int>(a.x.ne[0]);
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(a.x, t, 0, 0));
    float s[kKeys], c[kKeys];
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        const int e = lane + 32 * i;
        s[i] = e < n ? ops::sigmoid(xr[e]) : 0.0f;
        c[i] = e < n && a.bias != nullptr ? s[i] + a.bias[e] : s[i];
    }

    // The groups kept (all when there is no GROUP_MASK); expert e is in group e / per.
    unsigned long long kept = ~0ull;
    int per = n;
    if (a.masked.data != nullptr) {
        per = n / a.n_group;
        float score[kMaxGroups];
        for (int gi = 0; gi < a.n_group; ++gi) {
            const int lo = gi * per, hi = lo + per;
            float sum = 0.0f;
            unsigned long long prev = ~0ull;
            for (int j = 0; j < a.top_n; ++j) {
                unsigned long long best = 0;
#pragma unroll
                for (int i = 0; i < kKeys; ++i) {
                    const int e = lane + 32 * i;
                    if (e >= lo && e < hi) {
                        const unsigned long long key = group_key(c[i], e);
                        if (key < prev && key > best) best = key;
                    }
                }
                best = warp_max_u64(best);
                // A pick that finds nothing adds 0, and so does every later one (group_mask_kernel).
                sum += best == 0 ? 0.0f : warp_value(c, static_cast<int>(0xffffffffu - static_cast<unsigned int>(best)));
                prev = best;
            }
            score[gi] = sum;
        }
        kept = 0;
        for (int j = 0; j < a.n_used; ++j) {
            int best = -1;
            for (int gi = 0; gi < a.n_group; ++gi) {
                if (!((kept >> gi) & 1ull) && (best < 0 || score[gi] > score[best])) best = gi;
            }
            kept |= 1ull << best;
        }
    }
    const float neg_inf = __int_as_float(0xff800000);
    float m[kKeys];  // GROUP_MASK's result: the choice, -inf outside the kept groups
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        const int e = lane + 32 * i;
        m[i] = e < n && !((kept >> (e / per)) & 1ull) ? neg_inf : c[i];
    }

    // TOPK: pass j takes the largest key below pass j-1's; lane j keeps the j-th id.
    unsigned long long keys[kKeys];
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
        const int e = lane + 32 * i;
        keys[i] = e < n ? topk_key(m[i], e) : 0ull;
    }
    unsigned long long prev = ~0ull;
    int my_id = 0;
    float my_score = 0.0f;
    for (int j = 0; j < a.k; ++j) {
        unsigned long long best = 0;
#pragma unroll
        for (int i = 0; i < kKeys; ++i) {
            if (keys[i] < prev && keys[i] > best) best = keys[i];
        }
        best = warp_max_u64(best);
        const int id = static_cast<int>(0xffffffffu - static_cast<unsigned int>(best));
        const float score = warp_value(s, id);  // GATHER of the unbiased score
        if (lane == j) {
            my_id = id;
            my_score = score;
        }
        prev = best;
    }
    float f = a.scale;
    if (a.normalize) {
        const float sum = ops::warp_sum(lane < a.k ? 0.0f + my_score : 0.0f);
        f = a.scale / (sum + 1e-20f);
    }
    const float w = my_score * f;

    __syncthreads();  // every input of the block is read
    write_row(a.scores, t, s, lane, n);
    __syncthreads();
    if (a.choice.data != nullptr) write_row(a.choice, t, c, lane, n);
    __syncthreads();
    if (a.masked.data != nullptr) write_row(a.masked, t, m, lane, n);
    __syncthreads();
    if (lane < a.k) reinterpret_cast<int32_t*>(ops::row_at(a.ids, t, 0, 0))[lane] = my_id;
    __syncthreads();
    if (lane < a.k) reinterpret_cast<float*>(ops::row_at(a.picked, t, 0, 0))[lane] = my_score;
    __syncthreads();
    if (lane < a.k) reinterpret_cast<float*>(ops::row_at(a.weights, t, 0, 0))[lane] = w;
}

}  // namespace

Status sigmoid_router(std::span<Tensor* const> parts, const OpContext& ctx) {
    SigmoidRouterParts r;
    if (!sigmoid_router_parts(parts, &r)) return internal_error("sigmoid_router: the parts do not form a sigmoid router");
    SigmoidRouterArgs a{};
    a.x = ops::view_of(*r.sigmoid->src[0]);
    a.scores = ops::view_of(*r.sigmoid);
    if (r.add != nullptr) {
        a.bias = r.add->src[1]->as<float>();
        a.choice = ops::view_of(*r.add);
    }
    if (r.mask != nullptr) {
        a.masked = ops::view_of(*r.mask);
        a.n_group = r.mask->params.i[0];
        a.n_used = r.mask->params.i[1];
        a.top_n = r.mask->params.i[2];
    }
    a.ids = ops::view_of(*r.topk);
    a.picked = ops::view_of(*r.gather);
    a.weights = ops::view_of(*r.norm);
    a.k = r.topk->params.i[0];
    a.normalize = r.norm->params.i[0] != 0;
    a.scale = r.norm->params.f[0];
    const dim3 block(32, static_cast<unsigned int>(a.x.ne[1]));
    if (a.x.ne[0] <= 32 * 8) {
        return launch_kernel("sigmoid_router_kernel", sigmoid_router_kernel<8>, 1, block, 0, ctx.stream, a);
    }
    static_assert(kMaxSigmoidRouterExperts == 32 * 16, "the widest instance holds kMaxSigmoidRouterExperts");
    return launch_kernel("sigmoid_router_kernel", sigmoid_router_kernel<16>, 1, block, 0, ctx.stream, a);
}

}  // namespace moe::cuda
