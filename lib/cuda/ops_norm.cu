// Row-wise normalisations: RMS_NORM (optionally times a weight row), SOFTMAX (max-subtracted; a
// row of -inf becomes zeros, as on the CPU) and NORM_SCALE (rows over their sum, times a scale).
//
// Rows up to kWarpRowMax elements (per-head q/k norms of 64-256, router logits over 32-128 experts)
// get one warp each, 8 rows to a block, so no shared memory or block barrier is involved; longer rows
// (the hidden state, 2048-2880) get a block of 256 threads each. Both read the row twice (reduce, then
// write); the second read comes from L1/L2.
#include <cmath>
#include <string>

#include "cuda/fusion_plan.h"
#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

constexpr int64_t kWarpRowMax = 1024;
constexpr int kWarpRowsPerBlock = 8;
constexpr int kBlockRowThreads = 256;

// Sum (or max) over the threads that share a row: the warp in warp-per-row mode, else the block.
template <bool kWarpRow, bool kMax>
__device__ float row_reduce(float v) {
    v = kMax ? ops::warp_max(v) : ops::warp_sum(v);
    if constexpr (kWarpRow) {
        return v;
    } else {
        __shared__ float part[32];
        __shared__ float total;
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
        __syncthreads();  // `part` / `total` may still be read from a previous call
        if (lane == 0) part[warp] = v;
        __syncthreads();
        if (warp == 0) {
            float w = lane < n_warps ? part[lane] : (kMax ? -INFINITY : 0.0f);
            w = kMax ? ops::warp_max(w) : ops::warp_sum(w);
            if (lane == 0) total = w;
        }
        __syncthreads();
        return total;
    }
}

// The row this thread group works on (or -1), and its first element index / stride.
template <bool kWarpRow>
__device__ __forceinline__ int64_t my_row() {
    return kWarpRow ? static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y : static_cast<int64_t>(blockIdx.x);
}

template <bool kWarpRow>
__global__ void rms_norm_kernel(View d, View x, const float* w, float eps) {
    pdl_grid_sync();
    const int64_t r = my_row<kWarpRow>();
    const int64_t n_rows = d.ne[1] * d.ne[2] * d.ne[3];
    if (r >= n_rows) return;  // whole warps (kWarpRow) or whole blocks leave together
    int64_t i1, i2, i3;
    ops::split_row(r, d.ne[1], d.ne[2], i1, i2, i3);
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(x, i1, i2, i3));
    auto* dr = reinterpret_cast<float*>(ops::row_at(d, i1, i2, i3));
    const int64_t n = d.ne[0];
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = row_reduce<kWarpRow, false>(ss);
    // The mean and the root in double, as the CPU kernel does: one per row, and eps may be 1e-6.
    const auto scale = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(n) + eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        dr[i] = w != nullptr ? xr[i] * scale * w[i] : xr[i] * scale;
    }
}

template <bool kWarpRow>
__global__ void softmax_kernel(View d, View x) {
    pdl_grid_sync();
    const int64_t r = my_row<kWarpRow>();
    const int64_t n_rows = d.ne[1] * d.ne[2] * d.ne[3];
    if (r >= n_rows) return;
    int64_t i1, i2, i3;
    ops::split_row(r, d.ne[1], d.ne[2], i1, i2, i3);
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(x, i1, i2, i3));
    auto* dr = reinterpret_cast<float*>(ops::row_at(d, i1, i2, i3));
    const int64_t n = d.ne[0];
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
    mx = row_reduce<kWarpRow, true>(mx);
    if (mx == -INFINITY) {  // fully masked: zeros, not NaN
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(xr[i] - mx);
    sum = row_reduce<kWarpRow, false>(sum);
    const float inv = 1.0f / sum;
    // In place (dst == src0) is safe: each element is read and then written by the same thread.
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = expf(xr[i] - mx) * inv;
}

// NORM_SCALE: each row times scale, over its sum first when `normalize` (the routers' top-k weights).
template <bool kWarpRow>
__global__ void norm_scale_kernel(View d, View x, bool normalize, float scale) {
    pdl_grid_sync();
    const int64_t r = my_row<kWarpRow>();
    const int64_t n_rows = d.ne[1] * d.ne[2] * d.ne[3];
    if (r >= n_rows) return;
    int64_t i1, i2, i3;
    ops::split_row(r, d.ne[1], d.ne[2], i1, i2, i3);
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(x, i1, i2, i3));
    auto* dr = reinterpret_cast<float*>(ops::row_at(d, i1, i2, i3));
    const int64_t n = d.ne[0];
    float f = scale;
    if (normalize) {
        float sum = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
        f = scale / (row_reduce<kWarpRow, false>(sum) + 1e-20f);
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = xr[i] * f;
}

// Launch geometry for n_rows rows of n elements.
struct RowLaunch {
    bool warp_row;
    dim3 grid, block;
};

RowLaunch row_launch(int64_t n, int64_t n_rows) {
    if (n <= kWarpRowMax) {
        return {true, dim3(ops::ceil_div(n_rows, kWarpRowsPerBlock)), dim3(32, kWarpRowsPerBlock)};
    }
    return {false, dim3(static_cast<unsigned int>(n_rows)), dim3(kBlockRowThreads)};
}

}  // namespace

Status rms_norm(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_rms_norm(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const Tensor* w = dst.src[1];
    const float eps = dst.params.f[0];
    const int64_t n_rows = dst.n_rows();
    if (dst.ne[0] == 0 || n_rows == 0) return Status::ok();
    const RowLaunch l = row_launch(dst.ne[0], n_rows);
    const float* wp = w != nullptr ? w->as<float>() : nullptr;
    // Long rows: the row-chain kernel (ops_fused.cu) holds a row in registers and keeps more threads
    // busy; with several blocks it needs dst to be disjoint from (or exactly) its inputs.
    if (!l.warp_row && dst.ne[0] <= kMaxChainRow) {
        const ByteRange d = byte_range(dst);
        const bool ok = n_rows == 1 || ((!d.overlaps(byte_range(x)) || (x.data == dst.data && ops::same_shape(x, dst) &&
                                                                          x.nb[1] == dst.nb[1] && x.nb[2] == dst.nb[2] &&
                                                                          x.nb[3] == dst.nb[3])) &&
                                        (w == nullptr || !d.overlaps(byte_range(*w))));
        if (ok) {
            Tensor* parts[] = {&dst};
            return row_chain(parts, ctx);
        }
    }
    return launch_kernel("rms_norm_kernel", l.warp_row ? rms_norm_kernel<true> : rms_norm_kernel<false>, l.grid,
                         l.block, 0, ctx.stream, ops::view_of(dst), ops::view_of(x), wp, eps);
}

Status softmax(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::SOFTMAX) return invalid_argument(std::string("softmax: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("SOFTMAX", "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("SOFTMAX", "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(ops::check_same_shape("SOFTMAX", "src0", x, dst));
    const int64_t n_rows = dst.n_rows();
    if (dst.ne[0] == 0 || n_rows == 0) return Status::ok();
    const RowLaunch l = row_launch(dst.ne[0], n_rows);
    return launch_kernel("softmax_kernel", l.warp_row ? softmax_kernel<true> : softmax_kernel<false>, l.grid, l.block,
                         0, ctx.stream, ops::view_of(dst), ops::view_of(x));
}

Status norm_scale(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_norm_scale(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const int64_t n_rows = dst.n_rows();
    if (dst.ne[0] == 0 || n_rows == 0) return Status::ok();
    const RowLaunch l = row_launch(dst.ne[0], n_rows);
    return launch_kernel("norm_scale_kernel", l.warp_row ? norm_scale_kernel<true> : norm_scale_kernel<false>, l.grid,
                         l.block, 0, ctx.stream, ops::view_of(dst), ops::view_of(x), dst.params.i[0] != 0,
                         dst.params.f[0]);
}

}  // namespace moe::cuda
