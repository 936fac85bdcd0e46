// AVX-512 kernels of the super-block kinds (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8K
// activation rows, and the Q8K quantiser (bit-identical to the scalar definition in
// matmul_q8k_scalar.cpp).
//
// A super-block of 256 is read as 4 chunks of 64 values, one zmm each. vpmaddubsw multiplies unsigned
// weight bytes by the signed activations: the K-quants' values are unsigned as stored (at most 63,
// Q6_K's q + 32); IQ4_XS's signed grid values enter as |w| with the activations negated where w < 0
// (AVX-512 has no vpsignb), |w| <= 127. So a pair never exceeds 2 * 127 * 127 and never saturates.
// vpmaddwd then multiplies the pairs by the scale of their group of 16 (int16 lanes picked from the
// 16 group scales with one vpermw), summing into int32 lanes. The offsets that made the values
// unsigned (Q3_K 4, Q6_K 32) and the mins (Q2_K, Q4_K, Q5_K) multiply the activation sums of 16
// (bsums) with one vpmaddwd. Each super-block so yields the exact integer sums of the scalar kernel,
// spread over 16 lanes, converted and accumulated in float with d * d_x (and dmin * d_x): results
// equal the scalar path to float rounding.
//
// Micro-kernel: up to 4 weight rows x 4 tokens; per super-block a row's chunks are unpacked once and
// used for every token (the loop is matmul_q8k_driver.h's, shared with the AVX2 kernels).

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (GCC bug
// 105593, fixed in 13); the warning points into the header, so it is silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <bit>
#include <cstddef>
#include <cstring>

#include "core/quant_blocks.h"
#include "core/quant_k_layout.h"
#include "cpu/matmul_kernels.h"
#include "cpu/matmul_q8k_driver.h"

namespace moe::cpu::mm::avx512 {
namespace {

constexpr int kRowsMax = 4;
constexpr int kColsMax = 4;
constexpr float kQuietNaN = std::bit_cast<float>(0x7FC00000u);

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline float fp16(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// (v >> shift) & mask per byte (shift < 8: a 16-bit shift moves no bit of a byte's neighbour below
// the mask).
inline __m256i bits(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}
inline __m512i bits(__m512i v, int shift, int mask) {
    return _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi8(static_cast<char>(mask)));
}
// [lo | hi]: the 32 bytes of lo, then those of hi.
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// One unpacked weight super-block: 4 chunks of 64 unsigned values, the group scale of each pair of
// values (int16), the int16 coefficients of the 16 bsums (offsets, mins) and the super-scales.
// IQ4_XS: the values are |w| and neg[q] marks the negative ones.
struct Unpacked {
    __m512i v[4];
    __m512i sc[4];
    __mmask64 neg[4];
    __m256i corr;  // added to the integer sum: -offset * scale per group of 16 (or zero)
    __m256i mins;  // min of each group of 16 (kinds with dmin)
    float d;
    float dmin;
};

// sc[q]: int16 lane i of chunk q covers values 64 q + 2 i and + 1, of group of 16 number 4 q + i / 8.
inline void chunk_scales(const int* s16, Unpacked& u) {
    alignas(32) int16_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<int16_t>(s16[i]);
    const __m512i s = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(t)));
    for (int q = 0; q < 4; ++q) {
        const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(4 * q)),
                                             _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,  //
                                                              1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
        u.sc[q] = _mm512_permutexvar_epi16(idx, s);
    }
}

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
        // chunk q: elements 128 h + 32 s + l for h = q / 2, s = 2 (q % 2) and + 1; two bits at 2 s of qs[32 h + l]
        for (int q = 0; q < 4; ++q) {
            const __m256i qs = loadu256(b->qs + 32 * (q / 2));
            const int s = 2 * (q % 2);
            u.v[q] = join(bits(qs, 2 * s, 3), bits(qs, 2 * s + 2, 3));
        }
        chunk_scales(sc, u);
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
        for (int q = 0; q < 4; ++q) {
            // as Q2_K, plus the high bit (+4) of element 32 j + l at bit j of hmask[l], j = 2 q and 2 q + 1
            const __m256i qs = loadu256(b->qs + 32 * (q / 2));
            const int s = 2 * (q % 2);
            const __m256i lo = _mm256_or_si256(bits(qs, 2 * s, 3), _mm256_slli_epi16(bits(hm, 2 * q, 1), 2));
            const __m256i hi = _mm256_or_si256(bits(qs, 2 * s + 2, 3), _mm256_slli_epi16(bits(hm, 2 * q + 1, 1), 2));
            u.v[q] = join(lo, hi);
        }
        chunk_scales(sc, u);
        u.corr = lanes16(corr);
        u.mins = _mm256_setzero_si256();
        u.d = fp16(p + offsetof(BlockQ3_K, d));
        u.dmin = 0.0f;
    }
};

// Q4_K and Q5_K: chunk q is the low nibbles (elements 64 q ..) then the high nibbles (64 q + 32 ..) of
// qs[32 q ..]; Q5_K's fifth bit of element 32 j + l is bit j of qh[l].
template <typename Block, bool kFifth>
struct K4W {
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const Block*>(p);
        int sc[16], m[16];
        for (int g = 0; g < 8; ++g) {
            int s, mg;
            kq::scale_min_k4(b->scales, g, s, mg);
            sc[2 * g] = sc[2 * g + 1] = s;
            m[2 * g] = m[2 * g + 1] = mg;
        }
        for (int q = 0; q < 4; ++q) {
            const __m256i qs = loadu256(b->qs + 32 * q);
            __m256i lo = bits(qs, 0, 15), hi = bits(qs, 4, 15);
            if constexpr (kFifth) {
                const __m256i qh = loadu256(b->qh);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(bits(qh, 2 * q, 1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(bits(qh, 2 * q + 1, 1), 4));
            }
            u.v[q] = join(lo, hi);
        }
        chunk_scales(sc, u);
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
        int sc[16], corr[16];
        for (int g = 0; g < 16; ++g) {
            sc[g] = b->scales[g];
            corr[g] = -32 * sc[g];  // values are stored as q + 32
        }
        for (int q = 0; q < 4; ++q) {
            // chunk q = elements 128 h + 64 a + m (h = q / 2, a = q % 2, m < 64): nibble a of ql[64 h + m],
            // top bits at 2 (2 a + m / 32) of qh[32 h + m % 32]
            const int h = q / 2, a = q % 2;
            const __m512i ql = bits(_mm512_loadu_si512(b->ql + 64 * h), 4 * a, 15);
            const __m256i qh = loadu256(b->qh + 32 * h);
            const __m512i top = join(bits(qh, 4 * a, 3), bits(qh, 4 * a + 2, 3));
            u.v[q] = _mm512_or_si512(ql, _mm512_slli_epi16(top, 4));
        }
        chunk_scales(sc, u);
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
        const __m512i table = _mm512_broadcast_i32x4(
            _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
        int sc[16];
        for (int g = 0; g < 8; ++g) sc[2 * g] = sc[2 * g + 1] = kq::iq4_xs_scale(*b, g) - 32;
        for (int q = 0; q < 4; ++q) {
            // chunk q = groups 2 q and 2 q + 1, each the low then the high nibbles of its 16 bytes
            const __m256i qs = loadu256(b->qs + 32 * q);
            const __m512i z = join(bits(qs, 0, 15), bits(qs, 4, 15));  // [lo g, lo g+1, hi g, hi g+1]
            const __m512i w = _mm512_shuffle_epi8(table, _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)));
            u.neg[q] = _mm512_movepi8_mask(w);
            u.v[q] = _mm512_abs_epi8(w);
        }
        chunk_scales(sc, u);
        u.corr = _mm256_setzero_si256();
        u.mins = _mm256_setzero_si256();
        u.d = fp16(p + offsetof(BlockIQ4_XS, d));
        u.dmin = 0.0f;
    }
};

// The AVX-512 side of the shared loop (matmul_q8k_driver.h).
struct Avx512 {
    static constexpr int kRows = kRowsMax;
    static constexpr int kCols = kColsMax;
    using Unpacked = avx512::Unpacked;
    using Acc = __m512;
    using BSums = __m256i;
    static Acc zero() { return _mm512_setzero_ps(); }
    static BSums load_bsums(const uint8_t* p) { return loadu256(p); }
    static float reduce(Acc acc) { return _mm512_reduce_add_ps(acc); }
    template <class W>
    static Acc block(const Unpacked& u, const uint8_t* xq, BSums bs, float dx, Acc acc) {
        __m512i isum = _mm512_zextsi256_si512(_mm256_madd_epi16(u.corr, bs));
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            __m512i xv = _mm512_load_si512(xq + 64 * q);
            if constexpr (W::kSigned) xv = _mm512_mask_sub_epi8(xv, u.neg[q], _mm512_setzero_si512(), xv);
            const __m512i d16 = _mm512_maddubs_epi16(u.v[q], xv);
            isum = _mm512_add_epi32(isum, _mm512_madd_epi16(d16, u.sc[q]));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(u.d * dx), acc);
        if constexpr (W::kMin) {
            const __m512i msum = _mm512_zextsi256_si512(_mm256_madd_epi16(u.mins, bs));
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_set1_ps(u.dmin * dx), acc);
        }
        return acc;
    }
};

template <class W>
void gemm(const GemmArgs& a) {
    q8k_gemm<Avx512, W>(a);
}

}  // namespace

void quantize_q8k(const float* x, int64_t k, uint8_t* dst) {
    const int64_t nb = k / kQK_K;
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nb * 256);
    auto* bsums = reinterpret_cast<int16_t*>(dst + nb * 260);
    constexpr int kNonFinite = 0x01 | 0x08 | 0x10 | 0x80;  // fpclass: QNaN, +inf, -inf, SNaN
    for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + b * kQK_K;
        __m512 m16 = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int i = 0; i < 16; ++i) {
            const __m512 v = _mm512_loadu_ps(xb + 16 * i);
            bad |= _mm512_fpclass_ps_mask(v, kNonFinite);
            m16 = _mm512_max_ps(m16, _mm512_abs_ps(v));
        }
        int8_t* q = qs + b * kQK_K;
        int16_t* bs = bsums + b * 16;
        if (bad != 0) {
            std::memset(q, 0, kQK_K);
            std::memset(bs, 0, 32);
            d[b] = kQuietNaN;
            continue;
        }
        const float amax = _mm512_reduce_max_ps(m16);
        const __m512 vid = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        for (int g = 0; g < 16; ++g) {
            const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), vid));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * g), _mm512_cvtsepi32_epi8(v));
            bs[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
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

}  // namespace moe::cpu::mm::avx512
