// CPY: writes F32 src0 into dst's bytes through dst's own strides (dst is a view of src1, typically a
// KV-cache slot), converting to F16 or keeping F32. As on the CPU, src0 and dst either have the same
// shape (src0 may then be strided too), or src0 is contiguous and its elements are taken in order; or
// with rows (src2), src0's token t goes to dst's row rows[t] (a row outside dst raises kErrorBadIndex
// and is not written). dst's element stride nb[0] may differ from the element size (a transposed cache view).
#include <string>

#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

template <bool kToF16, bool kSameShape>
__global__ void cpy_kernel(View d, View s) {
    pdl_grid_sync();
    const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t n0 = d.ne[0];
    if (i0 >= n0) return;
    const int64_t n23 = d.ne[2] * d.ne[3];
    for (int64_t z = blockIdx.z; z < n23; z += gridDim.z) {
        const int64_t i2 = z % d.ne[2], i3 = z / d.ne[2];
        for (int64_t i1 = blockIdx.y; i1 < d.ne[1]; i1 += gridDim.y) {
            float v;
            if constexpr (kSameShape) {
                v = reinterpret_cast<const float*>(ops::row_at(s, i1, i2, i3))[i0];
            } else {
                const int64_t r = i1 + d.ne[1] * z;  // z = i2 + ne2 * i3
                v = reinterpret_cast<const float*>(s.data)[r * n0 + i0];
            }
            char* out = ops::row_at(d, i1, i2, i3) + i0 * d.nb[0];
            if constexpr (kToF16) {
                *reinterpret_cast<unsigned short*>(out) = ops::to_half_bits(v);
            } else {
                *reinterpret_cast<float*>(out) = v;
            }
        }
    }
}

// With rows: the loops go over src0's [A, B, T]; token t lands in dst's row rows[t].
template <bool kToF16>
__global__ void cpy_rows_kernel(View d, View s, const int32_t* rows, unsigned int* err) {
    pdl_grid_sync();
    const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i0 >= s.ne[0]) return;
    for (int64_t t = blockIdx.z; t < s.ne[2]; t += gridDim.z) {
        const int32_t row = rows[t];
        if (row < 0 || row >= d.ne[2]) {
            ops::flag_error(err, kErrorBadIndex);
            continue;
        }
        for (int64_t i1 = blockIdx.y; i1 < s.ne[1]; i1 += gridDim.y) {
            const float v = reinterpret_cast<const float*>(ops::row_at(s, i1, t, 0))[i0];
            char* out = ops::row_at(d, i1, row, 0) + i0 * d.nb[0];
            if constexpr (kToF16) {
                *reinterpret_cast<unsigned short*>(out) = ops::to_half_bits(v);
            } else {
                *reinterpret_cast<float*>(out) = v;
            }
        }
    }
}

template <bool kToF16>
Status launch_cpy_rows(const Tensor& dst, const Tensor& src, const OpContext& ctx) {
    const int64_t n0 = src.ne[0];
    const int threads = n0 >= 256 ? 256 : static_cast<int>((n0 + 31) / 32 * 32);
    const dim3 grid(ops::ceil_div(n0, threads), ops::grid_y(src.ne[1]), ops::grid_y(src.ne[2]));
    return launch_kernel("cpy_rows_kernel", cpy_rows_kernel<kToF16>, grid, threads, 0, ctx.stream, ops::view_of(dst),
                         ops::view_of(src), dst.src[2]->as<int32_t>(), ctx.error_flags);
}

template <bool kToF16, bool kSameShape>
Status launch_cpy(const Tensor& dst, const Tensor& src, const OpContext& ctx) {
    const int64_t n0 = dst.ne[0];
    const int threads = n0 >= 256 ? 256 : static_cast<int>((n0 + 31) / 32 * 32);
    const dim3 grid(ops::ceil_div(n0, threads), ops::grid_y(dst.ne[1]), ops::grid_y(dst.ne[2] * dst.ne[3]));
    return launch_kernel("cpy_kernel", cpy_kernel<kToF16, kSameShape>, grid, threads, 0, ctx.stream, ops::view_of(dst),
                         ops::view_of(src));
}

}  // namespace

Status cpy(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::CPY) return invalid_argument(std::string("cpy: dst.op is ") + op_name(dst.op) + ", expected CPY");
    MOE_RETURN_IF_ERROR(ops::check_cpy(dst));
    const Tensor& s = *dst.src[0];
    const bool to_f16 = dst.type == Type::F16;
    if (dst.src[2] != nullptr) {
        if (s.n_elements() == 0) return Status::ok();
        return to_f16 ? launch_cpy_rows<true>(dst, s, ctx) : launch_cpy_rows<false>(dst, s, ctx);
    }
    if (dst.n_elements() == 0) return Status::ok();
    const bool same = ops::same_shape(s, dst);
    if (to_f16) return same ? launch_cpy<true, true>(dst, s, ctx) : launch_cpy<true, false>(dst, s, ctx);
    return same ? launch_cpy<false, true>(dst, s, ctx) : launch_cpy<false, false>(dst, s, ctx);
}

namespace {

constexpr int kMaxGatherRegions = 64;

struct GatherRegions {
    const uint8_t* src[kMaxGatherRegions];
    uint64_t n[kMaxGatherRegions];
    uint64_t offset[kMaxGatherRegions];
};

__global__ void gather_kernel(const GatherRegions r, uint8_t* dst) {
    pdl_grid_sync();
    const int i = static_cast<int>(blockIdx.x);
    const uint8_t* src = r.src[i];
    uint8_t* out = dst + r.offset[i];
    for (uint64_t b = threadIdx.x; b < r.n[i]; b += blockDim.x) out[b] = src[b];
}

}  // namespace

Status gather_regions(std::span<const DeviceRegion> regions, uint8_t* dst_dev, cudaStream_t stream) {
    uint64_t offset = 0;
    size_t i = 0;
    while (i < regions.size()) {
        GatherRegions r{};
        int count = 0;
        for (; i < regions.size() && count < kMaxGatherRegions; ++i) {
            if (regions[i].n == 0) continue;
            r.src[count] = static_cast<const uint8_t*>(regions[i].src);
            r.n[count] = regions[i].n;
            r.offset[count] = offset;
            offset += regions[i].n;
            ++count;
        }
        if (count == 0) break;
        MOE_RETURN_IF_ERROR(launch_kernel("gather_kernel", gather_kernel, static_cast<unsigned int>(count), 128, 0,
                                          stream, r, dst_dev));
    }
    return Status::ok();
}

}  // namespace moe::cuda
