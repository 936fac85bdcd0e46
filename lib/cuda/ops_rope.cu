// ROPE, NeoX layout (or interleaved pairs), with ggml's YaRN; the same math as cpu/ops_rope.cpp: pairs
// (i, i + n_dims/2) (interleaved: (2i, 2i + 1)) for i < n_dims/2, elements from n_dims on pass through,
// theta_i = pos * freq_base^(-2i/n_dims)
// blended per pair between interpolation and extrapolation by the YaRN ramp, cos/sin scaled by mscale.
//
// Angles are formed in double (at position 30k a float angle is off by ~2e-3 rad); the YaRN ramp
// comes from core's yarn_ramp(), shared with the CPU kernel. A block takes one token and up to kHeadsPerBlock heads: it computes the
// token's cos/sin once into shared memory and applies them to each of its heads. Small batches
// (decoding) take one head per block instead, so that the launch covers more SMs.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/rope_math.cuh"

namespace moe::cuda {
namespace {

using ops::View;

constexpr int kHeadsPerBlock = 8;

__global__ void rope_kernel(View d, View x, const int32_t* pos, RopeArgs a, int heads_per_block, bool interleaved) {
    pdl_grid_sync();
    extern __shared__ float cs[];  // cos[half], then sin[half]
    const int half = a.n_dims / 2;
    const int64_t t = blockIdx.x;
    const int p = pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(a, i, p, cs[i], cs[half + i]);
    __syncthreads();
    const int64_t h0 = static_cast<int64_t>(blockIdx.y) * heads_per_block;
    const int64_t h1 = min(h0 + heads_per_block, x.ne[1]);
    const int64_t n_all = x.ne[0];
    const int step = interleaved ? 2 : 1;  // pair i: (i, i + half), or (2i, 2i + 1) when interleaved
    const int other = interleaved ? 1 : half;
    for (int64_t h = h0; h < h1; ++h) {
        const auto* xs = reinterpret_cast<const float*>(ops::row_at(x, h, t, 0));
        auto* dr = reinterpret_cast<float*>(ops::row_at(d, h, t, 0));
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const float x0 = xs[i * step], x1 = xs[i * step + other];
            const float c = cs[i], s = cs[half + i];
            // __fmul_rn keeps the products unfused, as the CPU evaluates them.
            dr[i * step] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
            dr[i * step + other] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
        }
        if (dr != xs) {
            for (int64_t i = a.n_dims + threadIdx.x; i < n_all; i += blockDim.x) dr[i] = xs[i];
        }
    }
}

}  // namespace

Status rope(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_rope(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const Tensor& pos = *dst.src[1];
    const RopeParams p = dst.rope_params();
    if (x.ne[1] == 0 || x.ne[2] == 0) return Status::ok();
    if (x.ne[2] > 0x7fffffff) return invalid_argument("ROPE: too many tokens (" + std::to_string(x.ne[2]) + ")");

    const RopeArgs a = rope_args(p);

    // One head per block while that leaves fewer blocks than ~2 per SM; else kHeadsPerBlock.
    const int64_t wide = x.ne[2] * ops::ceil_div(x.ne[1], kHeadsPerBlock);
    const int hpb = wide < 2 * static_cast<int64_t>(ctx.n_sm) ? 1 : kHeadsPerBlock;
    const dim3 grid(static_cast<unsigned int>(x.ne[2]), ops::ceil_div(x.ne[1], hpb));
    if (grid.y > ops::kMaxGridYZ) return invalid_argument("ROPE: too many heads (" + std::to_string(x.ne[1]) + ")");
    const size_t shm = static_cast<size_t>(p.n_dims) * sizeof(float);
    const int half = p.n_dims / 2;
    const int threads = std::clamp((half + 31) / 32 * 32, 32, 128);
    return launch_kernel("rope_kernel", rope_kernel, grid, threads, shm, ctx.stream, ops::view_of(dst), ops::view_of(x),
                         pos.as<int32_t>(), a, hpb, p.interleaved);
}

}  // namespace moe::cuda
