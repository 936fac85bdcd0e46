#include <algorithm>
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/mapped_copy.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread: PCIe reads have microseconds of latency

// 16-byte words, kUnroll loads issued before the stores; the head and tail (unaligned or short) bytes
// one by one. n_words words start at byte offset head of both pointers (same alignment modulo 16).
__global__ void pull_kernel(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, size_t n, size_t head,
                            size_t n_words) {
    pdl_grid_sync();
    const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    const auto* s = reinterpret_cast<const uint4*>(src + head);
    auto* d = reinterpret_cast<uint4*>(dst + head);
    for (size_t base = tid; base < n_words; base += stride * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const size_t i = base + static_cast<size_t>(u) * stride;
            if (i < n_words) v[u] = s[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const size_t i = base + static_cast<size_t>(u) * stride;
            if (i < n_words) d[i] = v[u];
        }
    }
    const size_t tail = head + n_words * 16;
    for (size_t i = tid; i < head; i += stride) dst[i] = src[i];
    for (size_t i = tail + tid; i < n; i += stride) dst[i] = src[i];
}

}  // namespace

const void* mapped_device_pointer(const void* host) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    return a.type == cudaMemoryTypeHost ? a.devicePointer : nullptr;
}

Status pull_from_host(void* dst, const void* src, size_t n, cudaStream_t stream) {
    if (n == 0) return Status::ok();
    const auto d = reinterpret_cast<uintptr_t>(dst);
    if (d % 16 != reinterpret_cast<uintptr_t>(src) % 16) {
        return invalid_argument("pull_from_host: dst and src must have the same alignment modulo 16");
    }
    const size_t head = std::min(n, static_cast<size_t>((16 - d % 16) % 16));
    const size_t n_words = (n - head) / 16;
    const size_t threads_wanted = std::max<size_t>((n_words + kUnroll - 1) / kUnroll, 1);
    const int blocks = static_cast<int>(std::clamp<size_t>((threads_wanted + kThreads - 1) / kThreads, 1, 1024));
    return launch_kernel("pull_kernel", pull_kernel, blocks, kThreads, 0, stream, static_cast<uint8_t*>(dst),
                         static_cast<const uint8_t*>(src), n, head, n_words);
}

}  // namespace moe::cuda
