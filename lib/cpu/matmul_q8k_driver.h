// The loop shared by the SIMD kernels of the super-block kinds (matmul_q8k_avx2.cpp,
// matmul_q8k_avx512.cpp): super-blocks outer, then weight rows (each unpacked once, with its weights
// prefetched ahead), then tokens; the ISA supplies the unpacked block, the accumulator and the
// integer dot product of one unpacked super-block with one Q8K activation super-block.
//
// An ISA is a struct with
//   static constexpr int kRows, kCols;            the largest micro-kernel (weight rows x tokens)
//   using Unpacked = ...;                         one weight super-block, unpacked
//   using Acc = ...;                              F32 accumulator of one (row, token)
//   using X = ...;                                one activation super-block as the kernels read it
//   static Acc zero();
//   template <class W> static X load_x(const uint8_t* row, int64_t nb, int64_t b);
//                                                 super-block b of a Q8K row of nb super-blocks (loaded
//                                                 once per micro-kernel step and used for every row)
//   template <class W> static Acc block(const Unpacked& u, const X& x, Acc acc);
//                                                 acc + this super-block's dot times its scales
//   static float reduce(Acc acc);
// and a weight kind W has `kBytes` and `static void unpack(const uint8_t* p, Isa::Unpacked& u)`.
//
// Included by files compiled with different ISA flags: everything here has internal linkage.
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm {
namespace {

template <class Isa, class W, int R, int C>
void q8k_micro(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    const int64_t nb = k / 256;
    typename Isa::Acc acc[R][C];
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) acc[r][c] = Isa::zero();
    }
    for (int64_t b = 0; b < nb; ++b) {
        typename Isa::X xb[C];
        for (int c = 0; c < C; ++c) xb[c] = Isa::template load_x<W>(x[c], nb, b);
        for (int r = 0; r < R; ++r) {
            const uint8_t* wp = w + r * ws + b * W::kBytes;
            for (size_t line = 0; line < W::kBytes; line += 64) {
                _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wp + line) +
                                                           static_cast<uintptr_t>(pf)),
                             _MM_HINT_T0);
            }
            typename Isa::Unpacked u;
            W::unpack(wp, u);
            for (int c = 0; c < C; ++c) acc[r][c] = Isa::template block<W>(u, xb[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) out[c][r] = Isa::reduce(acc[r][c]);
    }
}

// micro[R - 1][C - 1] = q8k_micro<Isa, W, R, C> for every corner size.
template <class Isa, class W>
struct Q8kMicroTable {
    MicroFn micro[Isa::kRows][Isa::kCols];
};
template <class Isa, class W, int... I>
constexpr Q8kMicroTable<Isa, W> make_q8k_micro_table(std::integer_sequence<int, I...>) {
    return {{q8k_micro<Isa, W, I / Isa::kCols + 1, I % Isa::kCols + 1>...}};
}
template <class Isa, class W>
constexpr Q8kMicroTable<Isa, W> kQ8kMicro =
    make_q8k_micro_table<Isa, W>(std::make_integer_sequence<int, Isa::kRows * Isa::kCols>());

template <class Isa, class W>
void q8k_gemm(const GemmArgs& a) {
    tile_gemm(a, kQ8kMicro<Isa, W>.micro);
}

}  // namespace
}  // namespace moe::cpu::mm
