// Host -> device copies that SMs pull from page-locked host memory instead of the copy engine.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/status.h"

namespace moe::cuda {

// Up to this many bytes, copy_to_device from page-locked memory may be a kernel (see pull_from_host and
// CudaBackend::PullCopies).
inline constexpr size_t kPullCopyMaxBytes = size_t{64} << 20;

// The device-visible address of page-locked host memory at host (cudaHostAlloc / cudaHostRegister,
// mapped through unified addressing), or nullptr for pageable memory.
const void* mapped_device_pointer(const void* host);

// Copies n bytes from mapped page-locked host memory (src: its device-visible address) to device memory
// with a kernel on stream. REQUIRES: dst and src equally aligned modulo 16 (else INVALID_ARGUMENT).
// Why: a cudaMemcpyAsync H2D waits behind the copy engine's queue, which in hybrid runs holds hundreds
// of MB of expert uploads from the copy stream; a small activation on the critical path (a split
// layer's host result) would wait for them. The kernel's reads share PCIe with those uploads instead
// of queueing behind them.
Status pull_from_host(void* dst, const void* src, size_t n, cudaStream_t stream);

}  // namespace moe::cuda
