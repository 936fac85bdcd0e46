// ATTENTION on the tensor cores (ops_attention_mma.cu): the prefill kernel that ops_attention.cu
// hands a node to when attention_mma_fits says so; everything else keeps the FP32 kernel there.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "core/tensor.h"

namespace moe::cuda {

// Keys [lo, hi) visible to a query at position p (the CPU's key_range): j <= p, j < n_kv and,
// with a window, j > p - window.
__device__ __forceinline__ void attention_key_range(int p, int n_kv, int window, int& lo, int& hi) {
    hi = min(p, n_kv - 1) + 1;
    lo = window > 0 ? max(0, p - window + 1) : 0;
    if (hi < lo) hi = lo;
}

// Prompts of at least this many tokens take the tensor-core kernel. Shorter ones (decode, a few
// draft tokens) keep the FP32 kernel, whose split-K fills the device when there are few rows.
constexpr int64_t kAttnMmaMinTokens = 32;

// Whether attention_mma computes this (checked) node: F16 K and V with 16-byte aligned rows, head
// size 64 or 128, at least kAttnMmaMinTokens query tokens. Data pointers are device pointers.
bool attention_mma_fits(const Tensor& dst);

// REQUIRES: check_attention(dst) passed and attention_mma_fits(dst).
Status attention_mma(Tensor& dst, cudaStream_t stream);

}  // namespace moe::cuda
