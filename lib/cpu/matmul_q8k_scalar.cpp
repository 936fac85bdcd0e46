// Portable kernels of the super-block kinds (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8K
// activation rows, and the definition of the Q8K quantiser that the SIMD versions reproduce bit for
// bit. These are the reference the SIMD kernels must equal: per super-block of 256, an exact int32
// sum of (group scale x integer dot product of the group), and for the kinds with mins an exact int32
// sum of (group min x activation sum of the group); then in float
//   acc += (d * d_x) * isum - (dmin * d_x) * msum.
// Bounds: |isum| <= 256 * 127 * max|q| * max|scale| (Q6_K: 256 * 127 * 32 * 128 < 2^31), so the
// integer parts never overflow.
#include <cmath>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "core/types.h"
#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm::scalar {
namespace {

// One super-block's integer sums and its float super-scales.
struct SuperDot {
    int32_t isum;
    int32_t msum;
    float d;
    float dmin;
};

template <typename Block>
Block load_block(const uint8_t* wb) {
    Block b;
    std::memcpy(&b, wb, sizeof b);
    return b;
}

// sum over the group [e0, e0 + n) of value(e) * q[e].
template <typename Value>
int32_t group_dot(const int8_t* q, int e0, int n, Value value) {
    int32_t s = 0;
    for (int e = e0; e < e0 + n; ++e) s += value(e) * q[e];
    return s;
}

SuperDot dot_q2_k(const uint8_t* wb, const int8_t* q, const int16_t* bsums) {
    const auto b = load_block<BlockQ2_K>(wb);
    SuperDot r{0, 0, fp16_to_fp32(b.d), fp16_to_fp32(b.dmin)};
    for (int g = 0; g < 16; ++g) {
        r.isum += (b.scales[g] & 15) * group_dot(q, 16 * g, 16, [&](int e) { return kq::two_bits(b.qs, e); });
        r.msum += (b.scales[g] >> 4) * bsums[g];
    }
    return r;
}

SuperDot dot_q3_k(const uint8_t* wb, const int8_t* q, const int16_t*) {
    const auto b = load_block<BlockQ3_K>(wb);
    SuperDot r{0, 0, fp16_to_fp32(b.d), 0.0f};
    for (int g = 0; g < 16; ++g) {
        r.isum += kq::q3_k_scale(b.scales, g) * group_dot(q, 16 * g, 16, [&](int e) { return kq::q3_k_value(b, e); });
    }
    return r;
}

// Q4_K and Q5_K: 8 groups of 32 with 6-bit scales and mins; value(b, e) is element e's q.
template <typename Block, int (*Value)(const Block&, int)>
SuperDot dot_k4(const uint8_t* wb, const int8_t* q, const int16_t* bsums) {
    const auto b = load_block<Block>(wb);
    SuperDot r{0, 0, fp16_to_fp32(b.d), fp16_to_fp32(b.dmin)};
    for (int g = 0; g < 8; ++g) {
        int sc, m;
        kq::scale_min_k4(b.scales, g, sc, m);
        r.isum += sc * group_dot(q, 32 * g, 32, [&](int e) { return Value(b, e); });
        r.msum += m * (bsums[2 * g] + bsums[2 * g + 1]);
    }
    return r;
}
int q4_k_value(const BlockQ4_K& b, int e) { return kq::nibble_k(b.qs, e); }
int q5_k_value(const BlockQ5_K& b, int e) { return kq::nibble_k(b.qs, e) | kq::high_bit(b.qh, e) << 4; }

SuperDot dot_q6_k(const uint8_t* wb, const int8_t* q, const int16_t*) {
    const auto b = load_block<BlockQ6_K>(wb);
    SuperDot r{0, 0, fp16_to_fp32(b.d), 0.0f};
    for (int g = 0; g < 16; ++g) {
        r.isum += b.scales[g] * group_dot(q, 16 * g, 16, [&](int e) { return kq::q6_k_value(b, e); });
    }
    return r;
}

SuperDot dot_iq4_xs(const uint8_t* wb, const int8_t* q, const int16_t*) {
    const auto b = load_block<BlockIQ4_XS>(wb);
    SuperDot r{0, 0, fp16_to_fp32(b.d), 0.0f};
    for (int g = 0; g < 8; ++g) {
        const uint8_t* qs = b.qs + 16 * g;
        const int32_t dot = group_dot(q, 32 * g, 32, [&](int e) {
            const int j = e - 32 * g;
            return kIq4nlValues[j < 16 ? qs[j] & 15 : qs[j - 16] >> 4];
        });
        r.isum += (kq::iq4_xs_scale(b, g) - 32) * dot;
    }
    return r;
}

template <SuperDot (*Dot)(const uint8_t*, const int8_t*, const int16_t*), size_t kBlockBytes>
void gemm_super(const GemmArgs& a) {
    const int64_t nb = a.k / kQK_K;
    for (int64_t c = 0; c < a.n_cols; ++c) {
        const uint8_t* row = a.act + (a.act_idx ? a.act_idx[c] : c) * a.act_stride;
        const auto* qs = reinterpret_cast<const int8_t*>(row);
        const auto* xd = reinterpret_cast<const float*>(row + nb * 256);
        const auto* bsums = reinterpret_cast<const int16_t*>(row + nb * 260);
        float* out = a.out + (a.out_idx ? a.out_idx[c] : c) * a.out_stride;
        for (int64_t r = 0; r < a.n_rows; ++r) {
            const uint8_t* w = a.w + r * a.w_stride;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const SuperDot s = Dot(w + b * kBlockBytes, qs + b * 256, bsums + b * 16);
                acc += (s.d * xd[b]) * static_cast<float>(s.isum);
                acc -= (s.dmin * xd[b]) * static_cast<float>(s.msum);
            }
            out[r] = acc;
        }
    }
}

}  // namespace

// q = nearest-even(x * (127 / amax)), d = amax / 127 per 256 values: the exact float operations of
// the Q8A quantiser, so every ISA gets identical rows. A super-block holding inf or NaN gets q = 0,
// bsums = 0 and d = NaN.
void quantize_q8k(const float* x, int64_t k, uint8_t* dst) {
    const int64_t nb = k / kQK_K;
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nb * 256);
    auto* bsums = reinterpret_cast<int16_t*>(dst + nb * 260);
    for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + b * kQK_K;
        int8_t* q = qs + b * kQK_K;
        int16_t* bs = bsums + b * 16;
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < kQK_K; ++j) {
            finite = finite && std::isfinite(xb[j]);
            amax = std::fmax(amax, std::fabs(xb[j]));
        }
        if (!finite) {
            std::memset(q, 0, kQK_K);
            std::memset(bs, 0, 16 * sizeof(int16_t));
            d[b] = std::nanf("");
            continue;
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; ++j) {
                q[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
                sum += q[j];
            }
            bs[g] = static_cast<int16_t>(sum);
        }
        d[b] = amax / 127.0f;
    }
}

void gemm_q2_k(const GemmArgs& a) { gemm_super<dot_q2_k, sizeof(BlockQ2_K)>(a); }
void gemm_q3_k(const GemmArgs& a) { gemm_super<dot_q3_k, sizeof(BlockQ3_K)>(a); }
void gemm_q4_k(const GemmArgs& a) { gemm_super<dot_k4<BlockQ4_K, q4_k_value>, sizeof(BlockQ4_K)>(a); }
void gemm_q5_k(const GemmArgs& a) { gemm_super<dot_k4<BlockQ5_K, q5_k_value>, sizeof(BlockQ5_K)>(a); }
void gemm_q6_k(const GemmArgs& a) { gemm_super<dot_q6_k, sizeof(BlockQ6_K)>(a); }
void gemm_iq4_xs(const GemmArgs& a) { gemm_super<dot_iq4_xs, sizeof(BlockIQ4_XS)>(a); }

}  // namespace moe::cpu::mm::scalar
