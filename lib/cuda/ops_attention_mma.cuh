// ATTENTION on the tensor cores (ops_attention_mma.cu): the prefill kernel that ops_attention.cu
// hands a node to when attention_mma_fits says so; everything else keeps the FP32 kernel there.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "core/tensor.h"
#include "cuda/ops_common.cuh"

namespace moe::cuda {

// Keys [lo, hi) visible to a query at position p (the CPU's key_range): j <= p, j < n_kv and,
// with a window, j > p - window.
__device__ __forceinline__ void attention_key_range(int p, int n_kv, int window, int& lo, int& hi) {
    hi = min(p, n_kv - 1) + 1;
    lo = window > 0 ? max(0, p - window + 1) : 0;
    if (hi < lo) hi = lo;
}

// The operands and parameters both attention kernels take from an ATTENTION node alike: the q, k, v
// and output views, query positions, sinks (nullptr: none), window and n_kv. Args: either kernel's
// argument struct (the scale they keep in different units).
template <class Args>
void set_attention_operands(Args& a, const Tensor& dst) {
    a.q = ops::view_of(*dst.src[0]);
    a.k = ops::view_of(*dst.src[1]);
    a.v = ops::view_of(*dst.src[2]);
    a.d = ops::view_of(dst);
    a.pos = dst.src[3]->as<int32_t>();
    a.sinks = dst.src[4] != nullptr ? dst.src[4]->as<float>() : nullptr;
    a.window = dst.params.i[0];
    a.n_kv = dst.params.i[1];
}

// Whether a K or V tensor's rows start 16-byte aligned (tiles then load in 16-byte chunks).
inline bool rows_aligned16(const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.nb[1] % 16 == 0 && t.nb[2] % 16 == 0;
}

// Prompts of at least this many tokens take the tensor-core kernel. Shorter ones (decode, a few
// draft tokens) keep the FP32 kernel, whose split-K fills the device when there are few rows.
constexpr int64_t kAttnMmaMinTokens = 32;

// Whether attention_mma computes this (checked) node: F16 K and V with 16-byte aligned rows, head
// size 64, 128 or 192, at least kAttnMmaMinTokens query tokens. Data pointers are device pointers.
bool attention_mma_fits(const Tensor& dst);

// REQUIRES: check_attention(dst) passed and attention_mma_fits(dst).
Status attention_mma(Tensor& dst, cudaStream_t stream);

}  // namespace moe::cuda
