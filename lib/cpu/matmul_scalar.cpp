// Portable matrix-product kernels: the fallback for CPUs without AVX2, and the definition of the Q8A
// activation quantiser that the SIMD versions reproduce bit for bit.
#include <cmath>
#include <cstring>

#include "core/types.h"
#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm {
namespace {

// q = nearest-even(x * (127 / amax)), d = amax / 127. Every ISA computes these exact float operations
// (one IEEE division per block, one multiplication per value, rounding in the default mode), so the
// quantised rows are identical whichever kernel family runs. A block holding inf or NaN gets q = 0
// and d = NaN on every ISA. The halves of each block go where q8a_half puts them.
void quantize_q8a(const float* x, int64_t k, WeightKind kind, uint8_t* dst) {
    const int64_t nb = k / 32;
    const int64_t nbp = q8a_blocks(k);
    const int32_t offset = q8a_offset(kind);
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nbp * 32);
    auto* corr = reinterpret_cast<int32_t*>(dst + nbp * 36);
    for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + b * 32;
        int8_t* lo = qs + q8a_half(b, 0);
        int8_t* hi = qs + q8a_half(b, 1);
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < 32; ++j) {
            finite = finite && std::isfinite(xb[j]);
            amax = std::fmax(amax, std::fabs(xb[j]));
        }
        if (!finite) {
            // An inf or NaN makes the block's scale NaN, so every dot product that uses it is NaN.
            std::memset(lo, 0, 16);
            std::memset(hi, 0, 16);
            d[b] = std::nanf("");
            corr[b] = 0;
            continue;
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t q[32];
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) {
            q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
            sum += q[j];
        }
        std::memcpy(lo, q, 16);
        std::memcpy(hi, q + 16, 16);
        d[b] = amax / 127.0f;
        corr[b] = -offset * sum;
    }
    for (int64_t b = nb; b < nbp; ++b) {
        std::memset(qs + q8a_half(b, 0), 0, 16);
        std::memset(qs + q8a_half(b, 1), 0, 16);
        d[b] = 0.0f;
        corr[b] = 0;
    }
}

// Signed integer dot product of one weight block with one activation block (its two halves), and the
// weight scale.
int32_t block_dot_q8_0(const uint8_t* wb, const int8_t* lo, const int8_t* hi, float* scale) {
    BlockQ8_0 b;
    std::memcpy(&b, wb, sizeof b);
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += b.qs[j] * lo[j] + b.qs[j + 16] * hi[j];
    *scale = fp16_to_fp32(b.d);
    return s;
}

int32_t block_dot_q4_0(const uint8_t* wb, const int8_t* lo, const int8_t* hi, float* scale) {
    BlockQ4_0 b;
    std::memcpy(&b, wb, sizeof b);
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += ((b.qs[j] & 15) - 8) * lo[j] + ((b.qs[j] >> 4) - 8) * hi[j];
    *scale = fp16_to_fp32(b.d);
    return s;
}

int32_t block_dot_mxfp4(const uint8_t* wb, const int8_t* lo, const int8_t* hi, float* scale) {
    BlockMXFP4 b;
    std::memcpy(&b, wb, sizeof b);
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += kMxfp4Values[b.qs[j] & 15] * lo[j] + kMxfp4Values[b.qs[j] >> 4] * hi[j];
    *scale = e8m0_to_fp32_half(b.e);
    return s;
}

template <int32_t (*BlockDot)(const uint8_t*, const int8_t*, const int8_t*, float*), size_t kBlockBytes>
void gemm_quant(const GemmArgs& a) {
    const int64_t nb = a.k / 32;
    const int64_t nbp = q8a_blocks(a.k);
    for (int64_t c = 0; c < a.n_cols; ++c) {
        const uint8_t* row = a.act + (a.act_idx ? a.act_idx[c] : c) * a.act_stride;
        const auto* qs = reinterpret_cast<const int8_t*>(row);
        const auto* xd = reinterpret_cast<const float*>(row + nbp * 32);
        float* out = a.out + (a.out_idx ? a.out_idx[c] : c) * a.out_stride;
        for (int64_t r = 0; r < a.n_rows; ++r) {
            const uint8_t* w = a.w + r * a.w_stride;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                float ws;
                const int32_t dot = BlockDot(w + b * kBlockBytes, qs + q8a_half(b, 0), qs + q8a_half(b, 1), &ws);
                acc += static_cast<float>(dot) * (ws * xd[b]);
            }
            out[r] = acc;
        }
    }
}

float load_f32(const uint8_t* p, int64_t i) {
    float v;
    std::memcpy(&v, p + i * 4, 4);
    return v;
}
float load_f16(const uint8_t* p, int64_t i) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return fp16_to_fp32(h);
}
float load_bf16(const uint8_t* p, int64_t i) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return bf16_to_fp32(h);
}

template <float (*Load)(const uint8_t*, int64_t)>
void gemm_float(const GemmArgs& a) {
    for (int64_t c = 0; c < a.n_cols; ++c) {
        const auto* x = reinterpret_cast<const float*>(a.act + (a.act_idx ? a.act_idx[c] : c) * a.act_stride);
        float* out = a.out + (a.out_idx ? a.out_idx[c] : c) * a.out_stride;
        for (int64_t r = 0; r < a.n_rows; ++r) {
            const uint8_t* w = a.w + r * a.w_stride;
            float acc = 0.0f;
            for (int64_t i = 0; i < a.k; ++i) acc += Load(w, i) * x[i];
            out[r] = acc;
        }
    }
}

}  // namespace

const KernelTable kScalarKernels = {
    "scalar",
    quantize_q8a,
    {
        gemm_float<load_f32>,
        gemm_float<load_f16>,
        gemm_float<load_bf16>,
        gemm_quant<block_dot_q8_0, sizeof(BlockQ8_0)>,
        gemm_quant<block_dot_q4_0, sizeof(BlockQ4_0)>,
        gemm_quant<block_dot_mxfp4, sizeof(BlockMXFP4)>,
    },
};

}  // namespace moe::cpu::mm
