// The tensor-core GEMM (matmul_mma.cuh) for the decoded weight types (Q4_1 .. IQ4_XS, core/quant_decode.h):
// their instances compile here, beside matmul_gemm.cu's, so that the two sets build in parallel.
#include "cuda/matmul_mma.cuh"

namespace moe::cuda::mm {

Status launch_mma_decoded(Type w, const MmaParams& p, bool fused, int bn, int64_t n_col_tiles, cudaStream_t stream) {
    return with_decoded_type(w, [&](auto wt) -> Status {
        constexpr Type W = decltype(wt)::value;
        return fused ? launch_mma_bn<W, true, false>(p, bn, n_col_tiles, stream)
                     : launch_mma_bn<W, false, false>(p, bn, n_col_tiles, stream);
    });
}

}  // namespace moe::cuda::mm
