// Portable matrix-product kernels: the fallback for CPUs without AVX2, and the definition of the Q8A
// activation quantiser that the SIMD versions reproduce bit for bit. The super-block kinds (Q2_K ..
// Q6_K, IQ4_XS) and their Q8K activations are in matmul_q8k_scalar.cpp.
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
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
    const int32_t factor = q8a_corr_factor(kind);
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
        corr[b] = factor * sum;
    }
    for (int64_t b = nb; b < nbp; ++b) {
        std::memset(qs + q8a_half(b, 0), 0, 16);
        std::memset(qs + q8a_half(b, 1), 0, 16);
        d[b] = 0.0f;
        corr[b] = 0;
    }
}

// One weight block against one activation block (its two halves): the signed integer dot product of
// the block's integer values q with the activations, the scale d and, for the kinds x = q d + m, the
// min m (0 for the others). The block's contribution is dot * d * d_x + m * d_x * sum(x_q).
struct BlockDot {
    int32_t dot;
    float d;
    float m;
};

template <typename Block>
Block load_block(const uint8_t* wb) {
    Block b;
    std::memcpy(&b, wb, sizeof b);
    return b;
}

// Element j < 32 of a nibble-packed block: the low nibble of byte j for j < 16, the high one of j - 16.
int nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

// The fifth bits of Q5_0 / Q5_1: bit j of the little-endian word qh belongs to element j.
int fifth_bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

template <typename Value>
int32_t dot32(const int8_t* lo, const int8_t* hi, Value value) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += value(j) * lo[j] + value(j + 16) * hi[j];
    return s;
}

BlockDot block_dot_q8_0(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockQ8_0>(wb);
    return {dot32(lo, hi, [&](int j) { return b.qs[j]; }), fp16_to_fp32(b.d), 0.0f};
}

BlockDot block_dot_q4_0(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockQ4_0>(wb);
    return {dot32(lo, hi, [&](int j) { return nibble(b.qs, j) - 8; }), fp16_to_fp32(b.d), 0.0f};
}

BlockDot block_dot_mxfp4(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockMXFP4>(wb);
    return {dot32(lo, hi, [&](int j) { return kMxfp4Values[nibble(b.qs, j)]; }), e8m0_to_fp32_half(b.e), 0.0f};
}

BlockDot block_dot_q4_1(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockQ4_1>(wb);
    return {dot32(lo, hi, [&](int j) { return nibble(b.qs, j); }), fp16_to_fp32(b.d), fp16_to_fp32(b.m)};
}

BlockDot block_dot_q5_0(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockQ5_0>(wb);
    return {dot32(lo, hi, [&](int j) { return (nibble(b.qs, j) | fifth_bit(b.qh, j) << 4) - 16; }),
            fp16_to_fp32(b.d), 0.0f};
}

BlockDot block_dot_q5_1(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockQ5_1>(wb);
    return {dot32(lo, hi, [&](int j) { return nibble(b.qs, j) | fifth_bit(b.qh, j) << 4; }), fp16_to_fp32(b.d),
            fp16_to_fp32(b.m)};
}

BlockDot block_dot_iq4_nl(const uint8_t* wb, const int8_t* lo, const int8_t* hi) {
    const auto b = load_block<BlockIQ4_NL>(wb);
    return {dot32(lo, hi, [&](int j) { return kIq4nlValues[nibble(b.qs, j)]; }), fp16_to_fp32(b.d), 0.0f};
}

// kMin: the kind has a min, whose term takes the block sum of the activations (corr, see
// q8a_corr_factor).
template <BlockDot (*Dot)(const uint8_t*, const int8_t*, const int8_t*), size_t kBlockBytes, bool kMin>
void gemm_quant(const GemmArgs& a) {
    const int64_t nb = a.k / 32;
    const int64_t nbp = q8a_blocks(a.k);
    for (int64_t c = 0; c < a.n_cols; ++c) {
        const uint8_t* row = a.act + (a.act_idx ? a.act_idx[c] : c) * a.act_stride;
        const auto* qs = reinterpret_cast<const int8_t*>(row);
        const auto* xd = reinterpret_cast<const float*>(row + nbp * 32);
        const auto* xsum = reinterpret_cast<const int32_t*>(row + nbp * 36);
        float* out = a.out + (a.out_idx ? a.out_idx[c] : c) * a.out_stride;
        for (int64_t r = 0; r < a.n_rows; ++r) {
            const uint8_t* w = a.w + r * a.w_stride;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const BlockDot bd = Dot(w + b * kBlockBytes, qs + q8a_half(b, 0), qs + q8a_half(b, 1));
                acc += static_cast<float>(bd.dot) * (bd.d * xd[b]);
                if constexpr (kMin) acc += bd.m * (xd[b] * static_cast<float>(xsum[b]));
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
    scalar::quantize_q8k,
    {
        gemm_float<load_f32>,
        gemm_float<load_f16>,
        gemm_float<load_bf16>,
        gemm_quant<block_dot_q8_0, sizeof(BlockQ8_0), false>,
        gemm_quant<block_dot_q4_0, sizeof(BlockQ4_0), false>,
        gemm_quant<block_dot_mxfp4, sizeof(BlockMXFP4), false>,
        gemm_quant<block_dot_q4_1, sizeof(BlockQ4_1), true>,
        gemm_quant<block_dot_q5_0, sizeof(BlockQ5_0), false>,
        gemm_quant<block_dot_q5_1, sizeof(BlockQ5_1), true>,
        gemm_quant<block_dot_iq4_nl, sizeof(BlockIQ4_NL), false>,
        scalar::gemm_q2_k,
        scalar::gemm_q3_k,
        scalar::gemm_q4_k,
        scalar::gemm_q5_k,
        scalar::gemm_q6_k,
        scalar::gemm_iq4_xs,
    },
};

}  // namespace moe::cpu::mm
