// The current CUDA device of the calling thread, made a backend's own for one call. CUDA allocates,
// launches and creates streams, events and handles on the thread's current device, which belongs to the
// thread, not to a backend: a backend on GPU 1 called from a thread whose current device is GPU 0 (a
// second context, a Python thread, the bench) would otherwise allocate and launch on GPU 0. Every public
// entry of the CUDA backend therefore opens a DeviceScope on its device.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_common.cuh"

namespace moe::cuda {

// Makes `device` current and restores the caller's current device on destruction, so that a caller
// driving backends on several GPUs (the stages of a ubatch) or its own CUDA code sees its device
// unchanged. cudaSetDevice runs only when the device is not current already (one GPU: never after the
// first call), so a scope costs a cudaGetDevice, a thread-local read in the runtime.
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        status_ = cuda_status(cudaGetDevice(&prev_), "cudaGetDevice");
        if (!status_.is_ok()) {
            (void)cudaGetLastError();
            prev_ = -1;
            return;
        }
        if (prev_ == device) return;
        status_ = cuda_status(cudaSetDevice(device), ("cudaSetDevice(" + std::to_string(device) + ")").c_str());
        if (!status_.is_ok()) (void)cudaGetLastError();
        switched_ = status_.is_ok();
    }
    ~DeviceScope() {
        if (switched_ && cudaSetDevice(prev_) != cudaSuccess) (void)cudaGetLastError();
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

    // OK once `device` is current; the driver's error otherwise (the scope then changed nothing).
    const Status& status() const { return status_; }

private:
    int prev_ = -1;
    bool switched_ = false;
    Status status_;
};

}  // namespace moe::cuda

// Opens a DeviceScope on `device` for the rest of the enclosing block, returning its error when the
// device cannot be made current.
#define MOE_CUDA_DEVICE_SCOPE(device)                                \
    const ::moe::cuda::DeviceScope moe_cuda_device_scope_(device); \
    MOE_RETURN_IF_ERROR(moe_cuda_device_scope_.status())
