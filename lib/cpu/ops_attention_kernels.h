// The per-ISA inner kernels of ATTENTION (cpu/ops_attention.cpp drives them): converting K/V rows
// from F16 and updating one query row's online softmax with a run of keys. One table per
// instruction set, chosen at each call from cpu_features().
//
// Included by files compiled with AVX2 / AVX-512 flags: only declarations here, so no out-of-line
// copy of wide-ISA code can be picked by the linker for code that runs on a narrower CPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::cpu::attn {

// dst[r * d + i] = F16 element i of the row at src + r * stride, for r < n_rows, i < d.
using F16RowsFn = void (*)(const uint8_t* src, size_t stride, int64_t n_rows, int64_t d, float* dst);

// nr query rows (pre-scaled; row r at q + r * d) that see the same keys krow[0..n) and values
// vrow[0..n) (d floats each), n >= 1. For each row r: scores s_j = q_r . k_j, then the online-softmax
// update
//   m' = max(m, max_j s_j); l = l e^(m - m') + sum_j e^(s_j - m'); acc = acc e^(m - m') + sum_j e^(s_j - m') v_j
// of m[r], l[r] and acc[r * d ..]. m[r] may be -inf (nothing seen yet). s: scratch for nr * n floats.
// Rows are taken together so that each K/V load serves several of them.
using RowsUpdateFn = void (*)(const float* q, int64_t nr, const float* const* krow, const float* const* vrow, int64_t n,
                              int64_t d, float* s, float* m, float* l, float* acc);

struct KernelTable {
    const char* name;
    F16RowsFn f16_rows;
    RowsUpdateFn rows_update;
};

// ops_attention.cpp (baseline x86-64), ops_attention_avx2.cpp (AVX2+FMA+F16C),
// ops_attention_avx512.cpp (AVX-512 F/BW/VL/DQ). Constant-initialised.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

}  // namespace moe::cpu::attn
