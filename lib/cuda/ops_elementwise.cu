// Element-wise kernels: MUL / ADD with broadcasting, SILU, SIGMOID, SWIGLU and SWIGLU_OAI.
//
// One kernel shape for all of them: grid x walks a row in chunks of blockDim.x * V elements, grid y
// the rows (i1), grid z the (i2, i3) planes, so a thread does no division per element and only one
// per plane. V = 4 (16-byte loads and stores) whenever every operand's rows are 16-byte aligned;
// these ops are memory-bound, so the vector width is what sets their speed.
#include <string>

#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

// How src1 maps onto a row of src0: the same row, one value for the whole row, or a shorter row
// repeated along it (MUL / ADD broadcasting along ne[0]).
enum class Bcast { kSame, kScalar, kRepeat };

struct AddFn {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulFn {
    __device__ float operator()(float a, float b) const { return a * b; }
};
struct SiluFn {
    __device__ float operator()(float x, float) const { return x * ops::sigmoid(x); }
};
struct SigmoidFn {
    __device__ float operator()(float x, float) const { return ops::sigmoid(x); }
};
struct SwigluFn {
    __device__ float operator()(float g, float u) const { return g * ops::sigmoid(g) * u; }
};
// GPT-OSS: the gate is clamped from above only, the up projection on both sides, and up gets +1.
// Comparisons are written as std::min / std::clamp evaluate them, so NaNs propagate as on the CPU.
struct SwigluOaiFn {
    float alpha, limit;
    __device__ float operator()(float g, float u) const {
        const float x = limit < g ? limit : g;
        const float y = u < -limit ? -limit : (limit < u ? limit : u);
        return x * ops::sigmoid(alpha * x) * (y + 1.0f);
    }
};

// Index into a dimension of src1 of size nb broadcast over size n (n % nb == 0).
__device__ __forceinline__ int64_t bcast(int64_t i, int64_t nb, int64_t n) {
    return nb == n ? i : (nb == 1 ? 0 : i % nb);
}

template <int V, Bcast B, typename Fn>
__global__ void map2_kernel(View d, View a, View b, Fn fn) {
    pdl_grid_sync();
    const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
    const int64_t n0 = d.ne[0];
    if (i0 >= n0) return;
    const int64_t n23 = d.ne[2] * d.ne[3];
    for (int64_t z = blockIdx.z; z < n23; z += gridDim.z) {
        const int64_t i2 = z % d.ne[2], i3 = z / d.ne[2];
        const int64_t j2 = bcast(i2, b.ne[2], d.ne[2]), j3 = bcast(i3, b.ne[3], d.ne[3]);
        for (int64_t i1 = blockIdx.y; i1 < d.ne[1]; i1 += gridDim.y) {
            auto* dr = reinterpret_cast<float*>(ops::row_at(d, i1, i2, i3));
            const auto* ar = reinterpret_cast<const float*>(ops::row_at(a, i1, i2, i3));
            const auto* br = reinterpret_cast<const float*>(ops::row_at(b, bcast(i1, b.ne[1], d.ne[1]), j2, j3));
            if constexpr (V == 4) {
                const float4 av = *reinterpret_cast<const float4*>(ar + i0);
                float4 bv;
                if constexpr (B == Bcast::kScalar) {
                    bv = make_float4(br[0], br[0], br[0], br[0]);
                } else if constexpr (B == Bcast::kSame) {
                    bv = *reinterpret_cast<const float4*>(br + i0);
                } else {
                    bv = *reinterpret_cast<const float4*>(br + i0 % b.ne[0]);
                }
                *reinterpret_cast<float4*>(dr + i0) =
                    make_float4(fn(av.x, bv.x), fn(av.y, bv.y), fn(av.z, bv.z), fn(av.w, bv.w));
            } else {
                const float bv = B == Bcast::kScalar ? br[0] : (B == Bcast::kSame ? br[i0] : br[i0 % b.ne[0]]);
                dr[i0] = fn(ar[i0], bv);
            }
        }
    }
}

bool rows_aligned16(const View& t) {
    return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.nb[1] % 16 == 0 && t.nb[2] % 16 == 0 && t.nb[3] % 16 == 0;
}

template <Bcast B, typename Fn>
Status launch_map2(const Tensor& dst, const Tensor& a, const Tensor& b, Fn fn, const OpContext& ctx) {
    if (dst.n_elements() == 0) return Status::ok();
    const View d = ops::view_of(dst), av = ops::view_of(a), bv = ops::view_of(b);
    const bool vec = d.ne[0] % 4 == 0 && rows_aligned16(d) && rows_aligned16(av) &&
                     (B == Bcast::kScalar || (b.ne[0] % 4 == 0 && rows_aligned16(bv)));
    const int v = vec ? 4 : 1;
    const int64_t per_row = (d.ne[0] + v - 1) / v;
    const int threads = per_row >= 256 ? 256 : static_cast<int>((per_row + 31) / 32 * 32);
    const dim3 grid(ops::ceil_div(per_row, threads), ops::grid_y(d.ne[1]), ops::grid_y(d.ne[2] * d.ne[3]));
    return launch_kernel("map2_kernel", vec ? map2_kernel<4, B, Fn> : map2_kernel<1, B, Fn>, grid, threads, 0,
                         ctx.stream, d, av, bv, fn);
}

// Picks the broadcast mode of src1 along ne[0].
template <typename Fn>
Status launch_binary(const Tensor& dst, const Tensor& a, const Tensor& b, Fn fn, const OpContext& ctx) {
    if (b.ne[0] == dst.ne[0]) return launch_map2<Bcast::kSame>(dst, a, b, fn, ctx);
    if (b.ne[0] == 1) return launch_map2<Bcast::kScalar>(dst, a, b, fn, ctx);
    return launch_map2<Bcast::kRepeat>(dst, a, b, fn, ctx);
}

}  // namespace

Status binary(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::MUL && dst.op != Op::ADD) {
        return invalid_argument(std::string("binary: dst.op is ") + op_name(dst.op) + ", expected MUL or ADD");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "src1", dst.src[1], Type::F32));
    const Tensor& a = *dst.src[0];
    const Tensor& b = *dst.src[1];
    MOE_RETURN_IF_ERROR(ops::check_same_shape(name, "src0", a, dst));
    for (int d = 0; d < 4; ++d) {
        if (b.ne[d] <= 0 || a.ne[d] % b.ne[d] != 0) {
            return invalid_argument(std::string(name) + ": src1 shape " + ops::shape_str(b) +
                                    " does not broadcast to src0 shape " + ops::shape_str(a) + " (dim " +
                                    std::to_string(d) + ")");
        }
    }
    if (dst.op == Op::MUL) return launch_binary(dst, a, b, MulFn{}, ctx);
    return launch_binary(dst, a, b, AddFn{}, ctx);
}

Status unary(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::SILU && dst.op != Op::SIGMOID) {
        return invalid_argument(std::string("unary: dst.op is ") + op_name(dst.op) + ", expected SILU or SIGMOID");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "src0", dst.src[0], Type::F32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(ops::check_same_shape(name, "src0", x, dst));
    // src1 slot unused: x again
    if (dst.op == Op::SIGMOID) return launch_map2<Bcast::kSame>(dst, x, x, SigmoidFn{}, ctx);
    return launch_map2<Bcast::kSame>(dst, x, x, SiluFn{}, ctx);
}

Status glu(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::SWIGLU && dst.op != Op::SWIGLU_OAI) {
        return invalid_argument(std::string("glu: dst.op is ") + op_name(dst.op) + ", expected SWIGLU or SWIGLU_OAI");
    }
    const char* name = op_name(dst.op);
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "dst", &dst, Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "src0 (gate)", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(name, "src1 (up)", dst.src[1], Type::F32));
    const Tensor& g = *dst.src[0];
    const Tensor& u = *dst.src[1];
    MOE_RETURN_IF_ERROR(ops::check_same_shape(name, "src0 (gate)", g, dst));
    MOE_RETURN_IF_ERROR(ops::check_same_shape(name, "src1 (up)", u, dst));
    if (dst.op == Op::SWIGLU) return launch_map2<Bcast::kSame>(dst, g, u, SwigluFn{}, ctx);
    const float alpha = dst.params.f[0];
    const float limit = dst.params.f[1];
    if (!(limit > 0.0f)) {
        return invalid_argument("SWIGLU_OAI: params.f[1] (limit) must be > 0, got " + std::to_string(limit));
    }
    return launch_map2<Bcast::kSame>(dst, g, u, SwigluOaiFn{alpha, limit}, ctx);
}

}  // namespace moe::cuda
