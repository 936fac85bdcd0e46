// CUDA error handling: every CUDA / cuBLAS call is checked and turned into a Status (device OOM ->
// RESOURCE_EXHAUSTED, never an abort).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/status.h"

namespace moe::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return Status::ok();
    const std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    if (err == cudaErrorMemoryAllocation) return resource_exhausted(msg);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return failed_precondition(msg);
    return internal_error(msg);
}

inline Status cublas_status(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
    const std::string msg = std::string(what) + ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")";
    if (st == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted(msg);
    return internal_error(msg);
}

}  // namespace moe::cuda

#define MOE_CUDA_RETURN_IF_ERROR(call) MOE_RETURN_IF_ERROR(::moe::cuda::cuda_status((call), #call))
#define MOE_CUBLAS_RETURN_IF_ERROR(call) MOE_RETURN_IF_ERROR(::moe::cuda::cublas_status((call), #call))
