#include "core/backend_registry.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"

namespace moe::cuda {

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

StatusOr<std::unique_ptr<Buffer>> DeviceBuffer::allocate(Backend* backend, int device, size_t size) {
    MOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(size, 1));
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_status(err, ("cudaMalloc of " + std::to_string(size) + " bytes").c_str());
    }
    return std::unique_ptr<Buffer>(new DeviceBuffer(backend, p, size));
}

DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

StatusOr<std::unique_ptr<Buffer>> PinnedHostBuffer::allocate(Backend* backend, size_t size) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(size, 1), cudaHostAllocPortable);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_status(err, ("cudaHostAlloc of " + std::to_string(size) + " bytes").c_str());
    }
    return std::unique_ptr<Buffer>(new PinnedHostBuffer(backend, p, size));
}

PinnedHostBuffer::~PinnedHostBuffer() { cudaFreeHost(data_); }

StatusOr<std::unique_ptr<Backend>> CudaBackend::create(int device) {
    const int n = device_count();
    if (device < 0 || device >= n) {
        return failed_precondition("CUDA device " + std::to_string(device) + " is not available (" +
                                   std::to_string(n) + " device(s) found)");
    }
    std::unique_ptr<CudaBackend> b(new CudaBackend(device));
    MOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->compute_stream_, cudaStreamNonBlocking));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->copy_stream_, cudaStreamNonBlocking));
    return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::~CudaBackend() {
    if (compute_stream_) cudaStreamDestroy(compute_stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

// The op kernels arrive with the CUDA backend issue; until then the backend offers memory and
// streams but computes nothing, so every op stays on the CPU.
bool CudaBackend::supports_op(const Tensor&) const { return false; }

StatusOr<std::unique_ptr<Buffer>> CudaBackend::alloc_buffer(size_t size) {
    return DeviceBuffer::allocate(this, device_, size);
}

StatusOr<std::unique_ptr<Buffer>> CudaBackend::alloc_pinned_host_buffer(size_t size) {
    return PinnedHostBuffer::allocate(this, size);
}

Status CudaBackend::compute(std::span<Tensor* const> nodes) {
    if (!nodes.empty()) {
        return unimplemented(std::string("cuda backend: op ") + op_name(nodes.front()->op) + " has no CUDA kernel yet");
    }
    return Status::ok();
}

Status CudaBackend::synchronize() {
    MOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
    MOE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_));
    return Status::ok();
}

void register_backend() {
    register_backend_factory(BackendFactory{
        "cuda",
        [] { return device_count(); },
        [](const BackendOptions& o) { return CudaBackend::create(o.device); },
    });
}

}  // namespace moe::cuda
