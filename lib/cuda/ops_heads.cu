// Multi-head latent attention's per-head ops and group-limited routing (deepseek2): CONCAT, MUL_MAT_HEADS,
// GROUP_MASK; the same semantics as cpu/ops_heads.cpp and cpu/ops_group_mask.cpp.
//
// MUL_MAT_HEADS is the expert product with the head as the expert (ids[h, t] = h, written into the
// front of the node's scratch), so it runs on the expert kernels of every weight type.
#include <cuda_fp16.h>

#include <string>

#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

__device__ __forceinline__ float load_float(const char* row, int64_t i, bool f16) {
    return f16 ? ops::from_half_bits(reinterpret_cast<const unsigned short*>(row)[i])
               : reinterpret_cast<const float*>(row)[i];
}

// a16, b16, d16: whether a, b and dst hold F16 (else F32). b.ne[0] = 0 when there is no b.
__global__ void concat_kernel(View d, View a, View b, bool a16, bool b16, bool d16) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.ne[0]) return;
    for (int64_t r = blockIdx.y; r < d.ne[1] * d.ne[2]; r += gridDim.y) {
        const int64_t h = r % d.ne[1], t = r / d.ne[1];
        const float v = i < a.ne[0] ? load_float(ops::row_at(a, h, t, 0), i, a16)
                                    : load_float(ops::row_at(b, b.ne[1] == 1 ? 0 : h, t, 0), i - a.ne[0], b16);
        char* out = ops::row_at(d, h, t, 0);
        if (d16) {
            reinterpret_cast<unsigned short*>(out)[i] = ops::to_half_bits(v);
        } else {
            reinterpret_cast<float*>(out)[i] = v;
        }
    }
}

constexpr int kMaxGroups = 64;  // groups of one token held by one thread

// One thread per token: group scores (sum of each group's top_n), the n_used best groups kept (ties to
// the lower group), the rest -inf.
__global__ void group_mask_kernel(View d, View x, int n_group, int n_used, int top_n) {
    pdl_grid_sync();
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= x.ne[1]) return;
    const auto* xs = reinterpret_cast<const float*>(ops::row_at(x, t, 0, 0));
    auto* dr = reinterpret_cast<float*>(ops::row_at(d, t, 0, 0));
    const int64_t per = x.ne[0] / n_group;
    float score[kMaxGroups];
    for (int gi = 0; gi < n_group; ++gi) {
        const float* v = xs + gi * per;
        float sum = 0.0f;
        int64_t last = -1;
        float last_v = __int_as_float(0x7f800000);  // +inf: the previous pick, ordered by (value desc, index asc)
        for (int j = 0; j < top_n; ++j) {
            int64_t best = -1;
            float bv = 0.0f;
            for (int64_t e = 0; e < per; ++e) {
                const bool after_last = v[e] < last_v || (v[e] == last_v && e > last);
                if (after_last && (best < 0 || v[e] > bv)) {
                    best = e;
                    bv = v[e];
                }
            }
            sum += bv;
            last = best;
            last_v = bv;
        }
        score[gi] = sum;
    }
    unsigned long long kept = 0;
    for (int j = 0; j < n_used; ++j) {
        int best = -1;
        for (int gi = 0; gi < n_group; ++gi) {
            if (!((kept >> gi) & 1ull) && (best < 0 || score[gi] > score[best])) best = gi;
        }
        kept |= 1ull << best;
    }
    const float neg_inf = __int_as_float(0xff800000);
    for (int64_t e = 0; e < x.ne[0]; ++e) dr[e] = ((kept >> (e / per)) & 1ull) ? xs[e] : neg_inf;
}

__global__ void head_ids_kernel(int32_t* ids, int64_t n_head, int64_t n) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) ids[i] = static_cast<int32_t>(i % n_head);
}

constexpr size_t kScratchAlign = 256;

size_t head_ids_bytes(const Tensor& dst) {
    const size_t n = static_cast<size_t>(dst.src[1]->ne[1] * dst.src[1]->ne[2]) * sizeof(int32_t);
    return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// dst as the expert product MUL_MAT_ID(src0, src1, ids) with `ids` an I32 [H, T] tensor at ids_data.
Tensor as_expert_product(const Tensor& dst, Tensor& ids, void* ids_data) {
    const int64_t ne[2] = {dst.src[1]->ne[1], dst.src[1]->ne[2]};
    set_shape(ids, Type::I32, 2, ne);
    ids.data = ids_data;
    Tensor e = dst;
    e.op = Op::MUL_MAT_ID;
    e.src[2] = &ids;
    return e;
}

Status check_heads(const Tensor& dst) {
    if (dst.op != Op::MUL_MAT_HEADS) return invalid_argument(std::string("mul_mat_heads: dst.op is ") + op_name(dst.op));
    const Tensor* w = dst.src[0];
    const Tensor* x = dst.src[1];
    if (w == nullptr || x == nullptr) return invalid_argument("MUL_MAT_HEADS: src0 and src1 are required");
    if (w->ne[2] != x->ne[1] || x->ne[3] != 1) {
        return invalid_argument("MUL_MAT_HEADS: src0 " + ops::shape_str(*w) + " and src1 " + ops::shape_str(*x) +
                                " do not match ([K, N, H], [K, H, T])");
    }
    return Status::ok();
}

}  // namespace

Status concat(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(op_checks::check_concat(dst));  // shared with the other backend
    if (dst.n_elements() == 0) return Status::ok();
    constexpr int kThreads = 128;
    const dim3 grid(ops::ceil_div(dst.ne[0], kThreads), ops::grid_y(dst.ne[1] * dst.ne[2]));
    const Tensor* b = dst.src[1];
    const View none{};  // ne[0] = 0: every column comes from a
    return launch_kernel("concat_kernel", concat_kernel, grid, kThreads, 0, ctx.stream, ops::view_of(dst),
                         ops::view_of(*dst.src[0]), b != nullptr ? ops::view_of(*b) : none,
                         dst.src[0]->type == Type::F16, b != nullptr && b->type == Type::F16, dst.type == Type::F16);
}

Status group_mask(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(op_checks::check_group_mask(dst));  // shared with the other backend
    if (dst.params.i[0] > kMaxGroups) {
        return unimplemented("GROUP_MASK: " + std::to_string(dst.params.i[0]) + " groups (the CUDA kernel takes at most " +
                             std::to_string(kMaxGroups) + ")");
    }
    if (dst.n_elements() == 0) return Status::ok();
    constexpr int kThreads = 64;
    return launch_kernel("group_mask_kernel", group_mask_kernel, ops::ceil_div(dst.ne[1], kThreads), kThreads, 0,
                         ctx.stream, ops::view_of(dst), ops::view_of(*dst.src[0]), dst.params.i[0], dst.params.i[1],
                         dst.params.i[2]);
}

size_t mul_mat_heads_scratch_bytes(const Tensor& dst, ExpertGemmDecode decode) {
    if (!check_heads(dst).is_ok()) return 0;
    Tensor ids;
    // Sizing reads shapes only; the ids pointer just has to be set.
    int32_t placeholder = 0;
    return head_ids_bytes(dst) + matmul_scratch_bytes(as_expert_product(dst, ids, &placeholder), decode);
}

Status mul_mat_heads(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(check_heads(dst));
    const size_t ids_bytes = head_ids_bytes(dst);
    if (ctx.scratch == nullptr || ctx.scratch_size < ids_bytes) {
        return internal_error("MUL_MAT_HEADS: scratch of " + std::to_string(ctx.scratch_size) + " bytes, need at least " +
                              std::to_string(ids_bytes));
    }
    const int64_t n = dst.src[1]->ne[1] * dst.src[1]->ne[2];
    if (n == 0) return Status::ok();
    auto* ids_data = static_cast<int32_t*>(ctx.scratch);
    constexpr int kThreads = 256;
    MOE_RETURN_IF_ERROR(launch_kernel("head_ids_kernel", head_ids_kernel, ops::ceil_div(n, kThreads), kThreads, 0,
                                      ctx.stream, ids_data, dst.src[1]->ne[1], n));
    Tensor ids;
    Tensor product = as_expert_product(dst, ids, ids_data);
    OpContext rest = ctx;
    rest.scratch = static_cast<char*>(ctx.scratch) + ids_bytes;
    rest.scratch_size = ctx.scratch_size - ids_bytes;
    rest.q8_act = nullptr;
    rest.q8_out = nullptr;
    rest.moe_route_ready = false;
    const Status s = mul_mat_id(product, rest);
    return s.is_ok() ? s : s.with_context("MUL_MAT_HEADS");
}

}  // namespace moe::cuda
