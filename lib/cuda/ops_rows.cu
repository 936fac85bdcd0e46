// Row selection and routing ops: GET_ROWS (embedding look-up from any weight type), and the MoE
// router helpers TOPK, GATHER and WEIGHTED_SUM.
//
// Ids live on the device, so they cannot be checked before the launch without a host round trip.
// A kernel that meets an out-of-range id writes NaN for the affected outputs (it never reads out of
// bounds) and raises kErrorBadIndex in ctx.error_flags; the backend reports that at synchronize().
#include <cuda_bf16.h>

#include <string>

#include "core/quant_decode.h"
#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/topk_key.cuh"

namespace moe::cuda {
namespace {

using ops::View;

// ---- GET_ROWS: element i of a row of a weight of type T, as float (exactly the CPU's to_float) ----

__device__ __forceinline__ float half_bits_to_float(const unsigned char* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

// 2^(e - 128): the MXFP4 scale with the doubled e2m1 values folded in (types.cpp e8m0_to_fp32_half).
__device__ __forceinline__ float e8m0_half(unsigned int e) {
    const unsigned int bits = e < 2 ? (0x00200000u << e) : ((e - 1) << 23);
    return __uint_as_float(bits);
}

// The doubled e2m1 value of a 4-bit code: magnitudes {0, 1, 2, 3, 4, 6, 8, 12}, bit 3 the sign.
// Computed rather than looked up so that a warp with mixed codes does not serialise on a table.
__device__ __forceinline__ float e2m1_doubled(unsigned int q) {
    const unsigned int m = q & 7u;
    const unsigned int mag = m < 4 ? m : (2u + (m & 1u)) << ((m >> 1) - 1);
    return (q & 8u) ? -static_cast<float>(mag) : static_cast<float>(mag);
}

template <Type T>
__device__ __forceinline__ float load_elem(const unsigned char* row, int64_t i) {
    if constexpr (T == Type::F32) {
        return reinterpret_cast<const float*>(row)[i];
    } else if constexpr (T == Type::F16) {
        return half_bits_to_float(row + 2 * i);
    } else if constexpr (T == Type::BF16) {
        return __uint_as_float(static_cast<unsigned int>(reinterpret_cast<const unsigned short*>(row)[i]) << 16);
    } else if constexpr (T == Type::Q8_0) {
        const unsigned char* b = row + (i / kQK) * sizeof(BlockQ8_0);
        return static_cast<float>(static_cast<signed char>(b[2 + i % kQK])) * half_bits_to_float(b);
    } else if constexpr (T == Type::Q4_0) {
        const unsigned char* b = row + (i / kQK) * sizeof(BlockQ4_0);
        const int j = static_cast<int>(i % kQK);
        const unsigned int byte = b[2 + (j & 15)];
        const int q = static_cast<int>(j < 16 ? (byte & 15u) : (byte >> 4));
        return static_cast<float>(q - 8) * half_bits_to_float(b);
    } else if constexpr (qd::decodes(T)) {
        // The element's whole group of 32 decoded (core/quant_decode.h, bit for bit the CPU's): GET_ROWS
        // moves one row per token, so the 32-fold decode is cheap next to a launch.
        constexpr int kE = qd::block_elems(T);
        const int r = static_cast<int>(i % kE);
        float v[32];
        qd::decode32<T>(row + (i / kE) * qd::block_bytes(T), r / 32, v);
        return v[r % 32];
    } else {
        static_assert(T == Type::MXFP4, "unhandled GET_ROWS type");
        const unsigned char* b = row + (i / kQK) * sizeof(BlockMXFP4);
        const int j = static_cast<int>(i % kQK);
        const unsigned int byte = b[1 + (j & 15)];
        return e2m1_doubled(j < 16 ? (byte & 15u) : (byte >> 4)) * e8m0_half(b[0]);
    }
}

template <Type T>
__global__ void get_rows_kernel(View d, View w, const int32_t* ids, unsigned int* err) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.ne[0]) return;
    for (int64_t t = blockIdx.y; t < d.ne[1]; t += gridDim.y) {
        const int32_t id = ids[t];
        auto* dr = reinterpret_cast<float*>(ops::row_at(d, t, 0, 0));
        if (id == kNoExpert) {
            dr[i] = 0.0f;
            continue;
        }
        if (id < 0 || id >= w.ne[1]) {
            dr[i] = __int_as_float(0x7fc00000);
            if (i == 0) ops::flag_error(err, kErrorBadIndex);
            continue;
        }
        dr[i] = load_elem<T>(reinterpret_cast<const unsigned char*>(ops::row_at(w, id, 0, 0)), i);
    }
}

template <Type T>
Status launch_get_rows(const Tensor& dst, const Tensor& w, const Tensor& ids, const OpContext& ctx) {
    constexpr int kThreads = 256;
    const dim3 grid(ops::ceil_div(dst.ne[0], kThreads), ops::grid_y(dst.ne[1]));
    return launch_kernel("get_rows_kernel", get_rows_kernel<T>, grid, kThreads, 0, ctx.stream, ops::view_of(dst),
                         ops::view_of(w), ids.as<int32_t>(), ctx.error_flags);
}

// ---- TOPK ----


constexpr int kTopkWarps = 4;

// One warp per column t; k passes over the column (it stays in L1 after the first).
__global__ void topk_kernel(View d, View x, int k) {
    pdl_grid_sync();
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kTopkWarps + threadIdx.y;
    if (t >= x.ne[1]) return;
    const auto* xr = reinterpret_cast<const float*>(ops::row_at(x, t, 0, 0));
    auto* dr = reinterpret_cast<int32_t*>(ops::row_at(d, t, 0, 0));
    const int64_t n = x.ne[0];
    unsigned long long prev = ~0ull;
    for (int j = 0; j < k; ++j) {
        unsigned long long best = 0;
        for (int64_t e = threadIdx.x; e < n; e += 32) {
            const unsigned long long key = topk_key(xr[e], e);
            if (key < prev && key > best) best = key;
        }
        best = warp_max_u64(best);
        if (threadIdx.x == 0) dr[j] = static_cast<int32_t>(0xffffffffu - static_cast<unsigned int>(best));
        prev = best;
    }
}

// ---- GATHER ----

__global__ void gather_kernel(View d, View x, View ids, unsigned int* err) {
    pdl_grid_sync();
    const int64_t k = ids.ne[0];
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= k * ids.ne[1]) return;
    const int64_t j = i % k, t = i / k;
    const int32_t id = reinterpret_cast<const int32_t*>(ops::row_at(ids, t, 0, 0))[j];
    float* out = reinterpret_cast<float*>(ops::row_at(d, t, 0, 0)) + j;
    if (id < 0 || id >= x.ne[0]) {
        *out = __int_as_float(0x7fc00000);
        ops::flag_error(err, kErrorBadIndex);
        return;
    }
    *out = reinterpret_cast<const float*>(ops::row_at(x, t, 0, 0))[id];
}

// ---- WEIGHTED_SUM ----

// dst[i, t] = sum_j w[j, t] * y[i, j, t]: threads along i (coalesced), grid y along tokens.
__global__ void weighted_sum_kernel(View d, View y, View w) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.ne[0]) return;
    for (int64_t t = blockIdx.y; t < d.ne[1]; t += gridDim.y) {
        reinterpret_cast<float*>(ops::row_at(d, t, 0, 0))[i] = ops::weighted_sum_at(y, w, t, i);
    }
}

// With ids (a part of a split expert block): slots of kNoExpert are not read.
__global__ void weighted_sum_ids_kernel(View d, View y, View w, View ids) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.ne[0]) return;
    for (int64_t t = blockIdx.y; t < d.ne[1]; t += gridDim.y) {
        const auto* wr = reinterpret_cast<const float*>(ops::row_at(w, t, 0, 0));
        const auto* ir = reinterpret_cast<const int32_t*>(ops::row_at(ids, t, 0, 0));
        float acc = 0.0f;
        for (int64_t j = 0; j < y.ne[1]; ++j) {
            if (ir[j] != kNoExpert) acc = fmaf(wr[j], reinterpret_cast<const float*>(ops::row_at(y, j, t, 0))[i], acc);
        }
        reinterpret_cast<float*>(ops::row_at(d, t, 0, 0))[i] = acc;
    }
}

}  // namespace

Status get_rows(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::GET_ROWS) return invalid_argument(std::string("get_rows: dst.op is ") + op_name(dst.op));
    const Tensor* w = dst.src[0];
    if (w == nullptr || w->data == nullptr) {
        return invalid_argument("GET_ROWS: src0 (weight) is missing or has no data");
    }
    const TypeTraits* tt = type_traits(static_cast<int32_t>(w->type));
    if (tt == nullptr || w->type == Type::I32) {
        return unimplemented("GET_ROWS: src0 type " + ops::type_str(w->type) + " is not supported");
    }
    if (w->nb[0] != static_cast<size_t>(tt->block_bytes)) {
        return unimplemented("GET_ROWS: src0 rows must be contiguous (nb[0] = " + std::to_string(w->nb[0]) + ")");
    }
    MOE_RETURN_IF_ERROR(ops::check_2d("GET_ROWS", "src0", *w));
    MOE_RETURN_IF_ERROR(ops::check_operand("GET_ROWS", "src1 (ids)", dst.src[1], Type::I32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GET_ROWS", "dst", &dst, Type::F32));
    const Tensor& ids = *dst.src[1];
    MOE_RETURN_IF_ERROR(ops::check_2d("GET_ROWS", "dst", dst));
    if (ids.n_rows() != 1 || dst.ne[0] != w->ne[0] || dst.ne[1] != ids.ne[0]) {
        return invalid_argument("GET_ROWS: dst " + ops::shape_str(dst) + " does not match src0 " + ops::shape_str(*w) +
                                " and src1 " + ops::shape_str(ids));
    }
    if (dst.ne[0] % tt->block_size != 0) {
        return invalid_argument("GET_ROWS: row length " + std::to_string(dst.ne[0]) + " is not a multiple of the " +
                                tt->name + " block size");
    }
    if (qd::decodes(w->type) && (reinterpret_cast<uintptr_t>(w->data) | w->nb[1]) % 2 != 0) {
        return unimplemented("GET_ROWS: src0 (" + ops::type_str(w->type) + ") data and row stride must be 2-byte aligned");
    }
    if (dst.n_elements() == 0) return Status::ok();
    switch (w->type) {
        case Type::F32: return launch_get_rows<Type::F32>(dst, *w, ids, ctx);
        case Type::F16: return launch_get_rows<Type::F16>(dst, *w, ids, ctx);
        case Type::BF16: return launch_get_rows<Type::BF16>(dst, *w, ids, ctx);
        case Type::Q8_0: return launch_get_rows<Type::Q8_0>(dst, *w, ids, ctx);
        case Type::Q4_0: return launch_get_rows<Type::Q4_0>(dst, *w, ids, ctx);
        case Type::MXFP4: return launch_get_rows<Type::MXFP4>(dst, *w, ids, ctx);
        case Type::Q4_1: return launch_get_rows<Type::Q4_1>(dst, *w, ids, ctx);
        case Type::Q5_0: return launch_get_rows<Type::Q5_0>(dst, *w, ids, ctx);
        case Type::Q5_1: return launch_get_rows<Type::Q5_1>(dst, *w, ids, ctx);
        case Type::IQ4_NL: return launch_get_rows<Type::IQ4_NL>(dst, *w, ids, ctx);
        case Type::Q2_K: return launch_get_rows<Type::Q2_K>(dst, *w, ids, ctx);
        case Type::Q3_K: return launch_get_rows<Type::Q3_K>(dst, *w, ids, ctx);
        case Type::Q4_K: return launch_get_rows<Type::Q4_K>(dst, *w, ids, ctx);
        case Type::Q5_K: return launch_get_rows<Type::Q5_K>(dst, *w, ids, ctx);
        case Type::Q6_K: return launch_get_rows<Type::Q6_K>(dst, *w, ids, ctx);
        case Type::IQ4_XS: return launch_get_rows<Type::IQ4_XS>(dst, *w, ids, ctx);
        default: break;
    }
    return unimplemented("GET_ROWS: src0 type " + ops::type_str(w->type) + " has no CUDA kernel");
}

Status topk(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::TOPK) return invalid_argument(std::string("topk: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("TOPK", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("TOPK", "dst", &dst, Type::I32));
    const Tensor& x = *dst.src[0];
    MOE_RETURN_IF_ERROR(ops::check_2d("TOPK", "src0", x));
    const int32_t k = dst.params.i[0];
    const int64_t n = x.ne[0];
    if (k <= 0 || k > n) {
        return invalid_argument("TOPK: params.i[0] (k) = " + std::to_string(k) + " must be in [1, " +
                                std::to_string(n) + "]");
    }
    if (dst.ne[0] != k || dst.ne[1] != x.ne[1] || dst.ne[2] != 1 || dst.ne[3] != 1) {
        return invalid_argument("TOPK: dst shape " + ops::shape_str(dst) + ", expected [" + std::to_string(k) + ", " +
                                std::to_string(x.ne[1]) + "]");
    }
    if (x.ne[1] == 0) return Status::ok();
    return launch_kernel("topk_kernel", topk_kernel, ops::ceil_div(x.ne[1], kTopkWarps), dim3(32, kTopkWarps), 0,
                         ctx.stream, ops::view_of(dst), ops::view_of(x), k);
}

Status gather(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::GATHER) return invalid_argument(std::string("gather: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "src1 (ids)", dst.src[1], Type::I32));
    MOE_RETURN_IF_ERROR(ops::check_operand("GATHER", "dst", &dst, Type::F32));
    const Tensor& x = *dst.src[0];
    const Tensor& ids = *dst.src[1];
    MOE_RETURN_IF_ERROR(ops::check_2d("GATHER", "src0", x));
    MOE_RETURN_IF_ERROR(ops::check_2d("GATHER", "src1 (ids)", ids));
    if (ids.ne[1] != x.ne[1] || !ops::same_shape(dst, ids)) {
        return invalid_argument("GATHER: src0 " + ops::shape_str(x) + ", src1 " + ops::shape_str(ids) + " and dst " +
                                ops::shape_str(dst) + " do not match");
    }
    const int64_t n = ids.ne[0] * ids.ne[1];
    if (n == 0) return Status::ok();
    constexpr int kThreads = 256;
    return launch_kernel("gather_kernel", gather_kernel, ops::ceil_div(n, kThreads), kThreads, 0, ctx.stream,
                         ops::view_of(dst), ops::view_of(x), ops::view_of(ids), ctx.error_flags);
}

namespace {

__global__ void mask_ids_kernel(View d, View src, const int32_t* groups, int n_expert, int32_t keep,
                                int32_t remap, unsigned int* err) {
    pdl_grid_sync();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= d.ne[0] * d.ne[1]) return;
    const int64_t t = i / d.ne[0];
    const int64_t j = i - t * d.ne[0];
    const int32_t e = reinterpret_cast<const int32_t*>(ops::row_at(src, t, 0, 0))[j];
    int32_t out = kNoExpert;
    if (e >= 0 && e < n_expert) {
        out = remap != 0 ? groups[e] : groups[e] == keep ? e : kNoExpert;
    } else if (e != kNoExpert) {
        ops::flag_error(err, kErrorBadIndex);
    }
    reinterpret_cast<int32_t*>(ops::row_at(d, t, 0, 0))[j] = out;
}

}  // namespace

Status mask_ids(Tensor& dst, const OpContext& ctx) {
    MOE_RETURN_IF_ERROR(op_checks::check_mask_ids(dst));
    const Tensor& ids = *dst.src[0];
    const Tensor& groups = *dst.src[1];
    const int64_t n = ids.ne[0] * ids.ne[1];
    if (n == 0) return Status::ok();
    constexpr int kThreads = 256;
    return launch_kernel("mask_ids_kernel", mask_ids_kernel, ops::ceil_div(n, kThreads), kThreads, 0, ctx.stream,
                         ops::view_of(dst), ops::view_of(ids), groups.as<int32_t>(), static_cast<int>(groups.ne[0]),
                         dst.params.i[0], dst.params.i[1], ctx.error_flags);
}

Status weighted_sum(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::WEIGHTED_SUM) return invalid_argument(std::string("weighted_sum: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "src0", dst.src[0], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "src1 (weights)", dst.src[1], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand("WEIGHTED_SUM", "dst", &dst, Type::F32));
    const Tensor& y = *dst.src[0];
    const Tensor& w = *dst.src[1];
    MOE_RETURN_IF_ERROR(ops::check_2d("WEIGHTED_SUM", "src1 (weights)", w));
    if (y.ne[3] != 1 || y.ne[1] != w.ne[0] || y.ne[2] != w.ne[1] || dst.ne[0] != y.ne[0] || dst.ne[1] != y.ne[2] ||
        dst.ne[2] != 1 || dst.ne[3] != 1) {
        return invalid_argument("WEIGHTED_SUM: src0 " + ops::shape_str(y) + ", src1 " + ops::shape_str(w) +
                                " and dst " + ops::shape_str(dst) + " do not match ([N, k, T], [k, T] -> [N, T])");
    }
    if (y.ne[1] <= 0) return invalid_argument("WEIGHTED_SUM: src0 has k = " + std::to_string(y.ne[1]) + " (need >= 1)");
    if (dst.n_elements() == 0) return Status::ok();
    constexpr int kThreads = 256;
    const dim3 grid(ops::ceil_div(dst.ne[0], kThreads), ops::grid_y(dst.ne[1]));
    MOE_RETURN_IF_ERROR(op_checks::check_weighted_sum_ids(dst));
    if (const Tensor* ids = dst.src[2]) {
        return launch_kernel("weighted_sum_ids_kernel", weighted_sum_ids_kernel, grid, kThreads, 0, ctx.stream,
                             ops::view_of(dst), ops::view_of(y), ops::view_of(w), ops::view_of(*ids));
    }
    return launch_kernel("weighted_sum_kernel", weighted_sum_kernel, grid, kThreads, 0, ctx.stream, ops::view_of(dst),
                         ops::view_of(y), ops::view_of(w));
}

}  // namespace moe::cuda
