#include "cuda/bandwidth.cuh"

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/device_scope.h"

namespace moe::cuda {
namespace {

struct DeviceFree {
    void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
    void operator()(void* p) const { cudaFreeHost(p); }
};
struct StreamDestroy {
    void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct EventDestroy {
    void operator()(CUevent_st* e) const { cudaEventDestroy(e); }
};
using EventPtr = std::unique_ptr<CUevent_st, EventDestroy>;

// An allocation failure as RESOURCE_EXHAUSTED naming the buffer; clears CUDA's last error.
Status alloc_status(cudaError_t err, const std::string& what, size_t bytes) {
    (void)cudaGetLastError();
    return cuda_status(err, ("allocating " + std::to_string(bytes) + " bytes of " + what).c_str());
}

struct Timer {
    cudaStream_t stream;
    cudaEvent_t start;
    cudaEvent_t stop;
};

// GB/s of copying `bytes` from src to dst: one untimed copy, then the median of `reps` timed ones.
StatusOr<double> time_copy(const Timer& t, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, int reps) {
    MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, t.stream));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(t.stream));
    std::vector<double> gbps;
    for (int r = 0; r < reps; ++r) {
        MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.start, t.stream));
        MOE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, t.stream));
        MOE_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.stop, t.stream));
        MOE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(t.stop));
        float ms = 0.0f;
        MOE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, t.start, t.stop));
        gbps.push_back(ms > 0.0f ? static_cast<double>(bytes) / (static_cast<double>(ms) * 1e-3) / 1e9 : 0.0);
    }
    return median(std::move(gbps));
}

}  // namespace

StatusOr<LinkBandwidth> measure_link(const BandwidthOptions& o) {
    MOE_RETURN_IF_ERROR(check_device(o.device));
    const size_t bytes = o.bytes;
    MOE_CUDA_DEVICE_SCOPE(o.device);  // also while the buffers below are freed

    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) return alloc_status(err, "device memory", bytes);
    const std::unique_ptr<void, DeviceFree> dev(p);
    err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) return alloc_status(err, "pinned host memory", bytes);
    const std::unique_ptr<void, HostFree> pinned(p);
    const std::unique_ptr<unsigned char[]> pageable(new (std::nothrow) unsigned char[bytes]);
    if (!pageable) return resource_exhausted("allocating " + std::to_string(bytes) + " bytes of pageable host memory");
    // Touched first, so that the timed copies do not include page faults.
    std::memset(pageable.get(), 0x5a, bytes);
    std::memset(pinned.get(), 0xa5, bytes);
    MOE_CUDA_RETURN_IF_ERROR(cudaMemset(dev.get(), 0x3c, bytes));

    cudaStream_t s = nullptr;
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const std::unique_ptr<CUstream_st, StreamDestroy> stream(s);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
    const EventPtr start(e0);
    MOE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
    const EventPtr stop(e1);
    const Timer t{s, e0, e1};

    LinkBandwidth r;
    MOE_ASSIGN_OR_RETURN(r.h2d_pinned, time_copy(t, dev.get(), pinned.get(), bytes, cudaMemcpyHostToDevice, o.repetitions));
    MOE_ASSIGN_OR_RETURN(r.d2h_pinned, time_copy(t, pinned.get(), dev.get(), bytes, cudaMemcpyDeviceToHost, o.repetitions));
    MOE_ASSIGN_OR_RETURN(r.h2d_pageable, time_copy(t, dev.get(), pageable.get(), bytes, cudaMemcpyHostToDevice, o.repetitions));
    MOE_ASSIGN_OR_RETURN(r.d2h_pageable, time_copy(t, pageable.get(), dev.get(), bytes, cudaMemcpyDeviceToHost, o.repetitions));
    return r;
}

}  // namespace moe::cuda
