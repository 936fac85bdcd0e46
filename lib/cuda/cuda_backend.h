// The CUDA backend: device buffers, pinned host buffers, a compute stream and a copy stream.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "core/backend.h"

namespace moe::cuda {

// Device memory (cudaMalloc).
class DeviceBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, int device, size_t size);
    ~DeviceBuffer() override;
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return false; }

private:
    DeviceBuffer(Backend* b, void* data, size_t size) : Buffer(b), data_(data), size_(size) {}
    void* data_;
    size_t size_;
};

// Page-locked host memory (cudaHostAlloc): weights that stay in RAM but may be uploaded. Pinned
// memory roughly doubles H2D bandwidth over pageable (mmap'd) memory.
class PinnedHostBuffer final : public Buffer {
public:
    static StatusOr<std::unique_ptr<Buffer>> allocate(Backend* backend, size_t size);
    ~PinnedHostBuffer() override;
    void* data() override { return data_; }
    size_t size() const override { return size_; }
    bool is_host() const override { return true; }

private:
    PinnedHostBuffer(Backend* b, void* data, size_t size) : Buffer(b), data_(data), size_(size) {}
    void* data_;
    size_t size_;
};

class CudaBackend final : public Backend {
public:
    static StatusOr<std::unique_ptr<Backend>> create(int device);
    ~CudaBackend() override;

    const char* name() const override { return "cuda"; }
    bool is_host() const override { return false; }
    bool supports_op(const Tensor& node) const override;
    StatusOr<std::unique_ptr<Buffer>> alloc_buffer(size_t size) override;
    StatusOr<std::unique_ptr<Buffer>> alloc_pinned_host_buffer(size_t size);
    Status compute(std::span<Tensor* const> nodes) override;
    Status synchronize() override;

    cudaStream_t compute_stream() const { return compute_stream_; }
    cudaStream_t copy_stream() const { return copy_stream_; }

private:
    explicit CudaBackend(int device) : device_(device) {}
    int device_;
    cudaStream_t compute_stream_ = nullptr;
    cudaStream_t copy_stream_ = nullptr;
};

// Number of usable CUDA devices (0 when there is no driver or no GPU).
int device_count();

// Registers "cuda" in the backend registry (called by the generated backends_init.cpp).
void register_backend();

}  // namespace moe::cuda
