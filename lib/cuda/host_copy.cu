#include "cuda/host_copy.h"

#include <cstdint>
#include <vector>

#include "cuda/cuda_common.cuh"
#include "cuda/device_scope.h"

namespace moe::cuda {

Status copy_host_range(int device, void* dst_dev, const void* src_host, size_t n, cudaStream_t stream) {
    MOE_CUDA_DEVICE_SCOPE(device);
    const cudaError_t err = cudaMemcpyAsync(dst_dev, src_host, n, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) return Status::ok();
    (void)cudaGetLastError();
    constexpr uintptr_t kPage = 4096;
    const auto src = reinterpret_cast<uintptr_t>(src_host);
    const uintptr_t mid = (src + n / 2) & ~(kPage - 1);
    if (err != cudaErrorInvalidValue) return cuda_status(err, "cudaMemcpyAsync(host to device)");
    if (mid <= src || mid >= src + n) {
        // Refused within one page (e.g. two registrations that meet there): through ordinary memory, which
        // the driver stages before the call returns, so the bounce buffer may go at once.
        const std::vector<uint8_t> bounce(static_cast<const uint8_t*>(src_host), static_cast<const uint8_t*>(src_host) + n);
        MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_dev, bounce.data(), n, cudaMemcpyHostToDevice, stream));
        return Status::ok();
    }
    const size_t head = static_cast<size_t>(mid - src);
    MOE_RETURN_IF_ERROR(copy_host_range(device, dst_dev, src_host, head, stream));
    return copy_host_range(device, static_cast<uint8_t*>(dst_dev) + head, static_cast<const uint8_t*>(src_host) + head,
                           n - head, stream);
}

}  // namespace moe::cuda
