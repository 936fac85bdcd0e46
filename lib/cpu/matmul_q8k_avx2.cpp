// AVX2 kernels of the super-block kinds (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8K activation
// rows, and the Q8K quantiser (bit-identical to the scalar definition in matmul_q8k_scalar.cpp).
//
// A super-block of 256 is read as 8 chunks of 32 values, one ymm each. pmaddubsw multiplies unsigned
// weight bytes by the signed activations (pairs stay below 2^15: the largest unsigned value is 63,
// Q6_K's q + 32, and IQ4_XS's signed grid values take the sign trick, |w| <= 127); pmaddwd then
// multiplies the pairs by the group scales (int16: [scale of the chunk's first 16 | of its last 16]),
// summing into int32 lanes. The offsets that made the values unsigned (Q6_K 32, Q3_K 4) and the mins
// (Q2_K, Q4_K, Q5_K) multiply the activation sums of 16 (bsums), also with one pmaddwd. So each
// super-block yields the exact integer sums of the scalar kernel, spread over 8 lanes, converted and
// accumulated in float with d * d_x (and dmin * d_x): results equal the scalar path to float rounding.
//
// Micro-kernel: up to 4 weight rows x 2 tokens; per super-block a row's chunks are unpacked once and
// used for every token (the loop is matmul_q8k_driver.h's, shared with the AVX-512 kernels).
#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "cpu/matmul_kernels.h"
#include "cpu/matmul_q8k_driver.h"

namespace moe::cpu::mm::avx2 {
namespace {

constexpr int kRowsMax = 4;
constexpr int kColsMax = 2;
constexpr float kQuietNaN = std::bit_cast<float>(0x7FC00000u);
constexpr float kInf = std::bit_cast<float>(0x7F800000u);

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline float fp16(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Byte b of every 16-bit lane pair of `v`, (v >> shift) & mask per byte (shift < 8: 16-bit shifts
// move no bit of a byte's neighbour below the mask).
inline __m256i bits(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}

// One unpacked weight super-block: 8 chunks of 32 values (unsigned, or signed for kSigned kinds), the
// int16 scale vector of each chunk, and the int16 coefficients of the 16 bsums (the offsets' and the
// mins' terms).
struct Unpacked {
    __m256i v[8];
    __m256i sc[8];
    __m256i corr;   // added to the integer sum: -offset * scale per group of 16 (or zero)
    __m256i mins;   // min of each group of 16 (kinds with dmin)
    float d;
    float dmin;
};

// [s0 x 8 | s1 x 8] as int16: the scales of a chunk's two halves.
inline __m256i chunk_scales(int s0, int s1) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
}

// Group scales of 16 (int) as the 16 int16 lanes of a ymm.
inline __m256i lanes16(const int* s) {
    alignas(32) int16_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<int16_t>(s[i]);
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
}

struct Q2_KW {
    static constexpr size_t kBytes = sizeof(BlockQ2_K);
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ2_K*>(p);
        int sc[16], m[16];
        for (int g = 0; g < 16; ++g) {
            sc[g] = b->scales[g] & 15;
            m[g] = b->scales[g] >> 4;
        }
        for (int h = 0; h < 2; ++h) {
            const __m256i q = loadu256(b->qs + 32 * h);
            for (int s = 0; s < 4; ++s) {
                const int j = 4 * h + s;
                u.v[j] = bits(q, 2 * s, 3);
                u.sc[j] = chunk_scales(sc[2 * j], sc[2 * j + 1]);
            }
        }
        u.corr = _mm256_setzero_si256();
        u.mins = lanes16(m);
        u.d = fp16(p + offsetof(BlockQ2_K, d));
        u.dmin = fp16(p + offsetof(BlockQ2_K, dmin));
    }
};

struct Q3_KW {
    static constexpr size_t kBytes = sizeof(BlockQ3_K);
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ3_K*>(p);
        int sc[16], corr[16];
        for (int g = 0; g < 16; ++g) {
            sc[g] = kq::q3_k_scale(b->scales, g);
            corr[g] = -4 * sc[g];  // values are stored as q + 4
        }
        const __m256i hm = loadu256(b->hmask);
        for (int h = 0; h < 2; ++h) {
            const __m256i q = loadu256(b->qs + 32 * h);
            for (int s = 0; s < 4; ++s) {
                const int j = 4 * h + s;
                // element 32 j + l: two bits at 2 s of qs[32 h + l], the high bit (+4) at bit j of hmask[l]
                u.v[j] = _mm256_or_si256(bits(q, 2 * s, 3), _mm256_slli_epi16(bits(hm, j, 1), 2));
                u.sc[j] = chunk_scales(sc[2 * j], sc[2 * j + 1]);
            }
        }
        u.corr = lanes16(corr);
        u.mins = _mm256_setzero_si256();
        u.d = fp16(p + offsetof(BlockQ3_K, d));
        u.dmin = 0.0f;
    }
};

// Q4_K and Q5_K: chunk j (a group of 32) is the low (even j) or high (odd j) nibbles of qs[32 (j / 2) ..];
// Q5_K's fifth bit of element 32 j + l is bit j of qh[l].
template <typename Block, bool kFifth>
struct K4W {
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const Block*>(p);
        int m[16];
        for (int g = 0; g < 8; ++g) {
            int sc, mg;
            kq::scale_min_k4(b->scales, g, sc, mg);
            m[2 * g] = m[2 * g + 1] = mg;
            u.sc[g] = _mm256_set1_epi16(static_cast<int16_t>(sc));
        }
        for (int c = 0; c < 4; ++c) {
            const __m256i q = loadu256(b->qs + 32 * c);
            u.v[2 * c] = bits(q, 0, 15);
            u.v[2 * c + 1] = bits(q, 4, 15);
        }
        if constexpr (kFifth) {
            const __m256i qh = loadu256(b->qh);
            for (int j = 0; j < 8; ++j) u.v[j] = _mm256_or_si256(u.v[j], _mm256_slli_epi16(bits(qh, j, 1), 4));
        }
        u.corr = _mm256_setzero_si256();
        u.mins = lanes16(m);
        u.d = fp16(p + offsetof(Block, d));
        u.dmin = fp16(p + offsetof(Block, dmin));
    }
};
using Q4_KW = K4W<BlockQ4_K, false>;
using Q5_KW = K4W<BlockQ5_K, true>;

struct Q6_KW {
    static constexpr size_t kBytes = sizeof(BlockQ6_K);
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(p);
        int corr[16];
        for (int g = 0; g < 16; ++g) corr[g] = -32 * b->scales[g];  // values are stored as q + 32
        for (int h = 0; h < 2; ++h) {
            const __m256i qh = loadu256(b->qh + 32 * h);
            for (int s = 0; s < 4; ++s) {
                // chunk j = 4 h + s, element 128 h + 32 s + l: nibble s / 2 of ql[64 h + 32 (s % 2) + l],
                // top bits at 2 s of qh[32 h + l]
                const int j = 4 * h + s;
                const __m256i ql = loadu256(b->ql + 64 * h + 32 * (s % 2));
                u.v[j] = _mm256_or_si256(bits(ql, 4 * (s / 2), 15), _mm256_slli_epi16(bits(qh, 2 * s, 3), 4));
                u.sc[j] = chunk_scales(b->scales[2 * j], b->scales[2 * j + 1]);
            }
        }
        u.corr = lanes16(corr);
        u.mins = _mm256_setzero_si256();
        u.d = fp16(p + offsetof(BlockQ6_K, d));
        u.dmin = 0.0f;
    }
};

struct Iq4_XSW {
    static constexpr size_t kBytes = sizeof(BlockIQ4_XS);
    static constexpr bool kSigned = true;
    static constexpr bool kMin = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockIQ4_XS*>(p);
        const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                               -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        for (int g = 0; g < 8; ++g) {
            // group g: elements 0-15 in the low nibbles of qs[16 g ..], 16-31 in the high ones
            const __m128i q = loadu128(b->qs + 16 * g);
            const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
            u.v[g] = _mm256_shuffle_epi8(table, n);
            u.sc[g] = _mm256_set1_epi16(static_cast<int16_t>(kq::iq4_xs_scale(*b, g) - 32));
        }
        u.corr = _mm256_setzero_si256();
        u.mins = _mm256_setzero_si256();
        u.d = fp16(p + offsetof(BlockIQ4_XS, d));
        u.dmin = 0.0f;
    }
};

// The AVX2 side of the shared loop (matmul_q8k_driver.h).
struct Avx2 {
    static constexpr int kRows = kRowsMax;
    static constexpr int kCols = kColsMax;
    using Unpacked = avx2::Unpacked;
    using Acc = __m256;
    struct X {
        const uint8_t* xq;  // the 256 int8 values, read chunk by chunk
        __m256i bs;
        float dx;
    };
    static Acc zero() { return _mm256_setzero_ps(); }
    template <class W>
    static X load_x(const uint8_t* row, int64_t nb, int64_t b) {
        return {row + 256 * b, loadu256(row + nb * 260 + 32 * b), reinterpret_cast<const float*>(row + nb * 256)[b]};
    }
    static float reduce(Acc acc) { return hsum(acc); }
    template <class W>
    static Acc block(const Unpacked& u, const X& x, Acc acc) {
        const uint8_t* xq = x.xq;
        const __m256i bs = x.bs;
        const float dx = x.dx;
        __m256i isum = _mm256_madd_epi16(u.corr, bs);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32 * j));
            __m256i d16;
            if constexpr (W::kSigned) {
                d16 = _mm256_maddubs_epi16(_mm256_abs_epi8(u.v[j]), _mm256_sign_epi8(xv, u.v[j]));
            } else {
                d16 = _mm256_maddubs_epi16(u.v[j], xv);
            }
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(d16, u.sc[j]));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(u.d * dx), acc);
        if constexpr (W::kMin) {
            const __m256i msum = _mm256_madd_epi16(u.mins, bs);
            acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(u.dmin * dx), acc);
        }
        return acc;
    }
};

template <class W>
void gemm(const GemmArgs& a) {
    q8k_gemm<Avx2, W>(a);
}

}  // namespace

void quantize_q8k(const float* x, int64_t k, uint8_t* dst) {
    const int64_t nb = k / kQK_K;
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nb * 256);
    auto* bsums = reinterpret_cast<int16_t*>(dst + nb * 260);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(kInf);
    for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + b * kQK_K;
        __m256 m8 = _mm256_setzero_ps();
        __m256 nonfinite = _mm256_setzero_ps();
        for (int i = 0; i < 32; ++i) {
            const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), abs_mask);
            nonfinite = _mm256_or_ps(nonfinite, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
            m8 = _mm256_max_ps(m8, a);
        }
        int8_t* q = qs + b * kQK_K;
        int16_t* bs = bsums + b * 16;
        if (_mm256_movemask_ps(nonfinite) != 0) {
            std::memset(q, 0, kQK_K);
            std::memset(bs, 0, 32);
            d[b] = kQuietNaN;
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const __m256 vid = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        for (int g = 0; g < 8; ++g) {  // 32 values per step
            __m256i v[4];
            for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * i), vid));
            for (int h = 0; h < 2; ++h) {
                const __m256i s8 = _mm256_add_epi32(v[2 * h], v[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
                bs[2 * g + h] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
            }
            // packs interleave the 128-bit lanes; the permutation restores element order
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        d[b] = amax / 127.0f;
    }
}

void gemm_q2_k(const GemmArgs& a) { gemm<Q2_KW>(a); }
void gemm_q3_k(const GemmArgs& a) { gemm<Q3_KW>(a); }
void gemm_q4_k(const GemmArgs& a) { gemm<Q4_KW>(a); }
void gemm_q5_k(const GemmArgs& a) { gemm<Q5_KW>(a); }
void gemm_q6_k(const GemmArgs& a) { gemm<Q6_KW>(a); }
void gemm_iq4_xs(const GemmArgs& a) { gemm<Iq4_XSW>(a); }

}  // namespace moe::cpu::mm::avx2
