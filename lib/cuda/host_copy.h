// Copies from host memory to a GPU that work for any host range the weights come from.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/status.h"

namespace moe::cuda {

// cudaMemcpyAsync of n bytes from host memory to memory of `device` on `stream` (of that device). Weights
// used in place from the model file are page-locked in runs (runtime/host_weights.h): a range next to a
// run (a device-side tensor at load) can start in locked pages and end in pageable ones, and the driver
// refuses a copy across that border (cudaErrorInvalidValue). Such a copy is split at a page border until
// each part lies in one kind of memory.
Status copy_host_range(int device, void* dst_dev, const void* src_host, size_t n, cudaStream_t stream);

}  // namespace moe::cuda
