// AVX2 matrix-product kernels (AVX2 + FMA + F16C; compiled with those flags, chosen at run time).
//
// Quantised weights: one ymm holds one block of 32 (its activations gathered from the two halves of
// the interleaved Q8A row, see matmul_kernels.h). pmaddubsw multiplies unsigned by signed bytes and
// saturates pairs at int16, so the unsigned side must stay small: Q4_0 (nibble = w + 8), Q5_0 (5-bit
// value = w + 16) and MXFP4 (shuffled doubled e2m1 value + 12) are unsigned by construction and their
// offset is removed by the Q8A row's corr; Q4_1 / Q5_1 values are unsigned already, and their min adds
// m * d_x * sum(x_q) (the row's corr holds the sum); Q8_0 and IQ4_NL use |w| and sign(x, w) (|w| <= 128,
// so a pair never exceeds 2 * 128 * 127).
// pmaddwd with ones widens to 8 int32 lanes, which are converted and accumulated in float with the
// block scale d_w * d_x. A micro-kernel holds 4 weight rows x 2 tokens of accumulators.
//
// Float weights (F32, F16 via vcvtph2ps, BF16 by a 16-bit shift) multiply F32 activations with FMA.
#include <immintrin.h>

#include <bit>
#include <cstring>

#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm {
namespace {

constexpr int kRowsMax = 4;  // micro-kernel weight rows
constexpr int kColsMax = 2;  // micro-kernel tokens

// 2^(e - 128) for every e8m0 byte (see matmul_avx512.cpp); a constant table.
constexpr float e8m0_half(int e) {
    return std::bit_cast<float>(e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23));
}
struct E8m0Table {
    float v[256];
};
constexpr E8m0Table make_e8m0_table() {
    E8m0Table t{};
    for (int e = 0; e < 256; ++e) t.v[e] = e8m0_half(e);
    return t;
}
constexpr E8m0Table kE8m0Half = make_e8m0_table();
constexpr float kQuietNaN = std::bit_cast<float>(0x7FC00000u);
constexpr float kInf = std::bit_cast<float>(0x7F800000u);

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Weight rows are read R at a time; each read also fetches the same offset `pf` bytes further, in the
// rows this thread reads later (prefetch_offset; see matmul_avx512.cpp). Prefetches never fault.
inline void prefetch_ahead(const uint8_t* p, intptr_t pf) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(pf)),
                 _MM_HINT_T0);
}

inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The 32 nibbles of a 16-byte group as bytes in element order: [lo(q), hi(q)].
inline __m256i nibbles(__m128i q) {
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

// Q5_0 / Q5_1: byte j = 16 where bit j of the little-endian word at p (the fifth bits) is set, else 0.
inline __m256i fifth_bits(const uint8_t* p) {
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    // every byte j takes byte j / 8 of qh (each 128-bit lane holds all four), then tests bit j % 8
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Weight-block loaders: the block's 32 integer values and its scale. kSigned: values are signed
// (sign trick); otherwise they are the unsigned w + q8a_offset. kMin: the kind has a min (min(p)).
struct Q8_0W {
    static constexpr size_t kBytes = 34;
    static constexpr bool kSigned = true;
    static constexpr bool kMin = false;
    static __m256i values(const uint8_t* p) { return loadu256(p + 2); }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t*) { return 0.0f; }
};
struct Q4_0W {
    static constexpr size_t kBytes = 18;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static __m256i values(const uint8_t* p) { return nibbles(loadu128(p + 2)); }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t*) { return 0.0f; }
};
struct Mxfp4W {
    static constexpr size_t kBytes = 17;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static __m256i values(const uint8_t* p) {
        const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  //
                                               12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        return _mm256_shuffle_epi8(table, nibbles(loadu128(p + 1)));
    }
    static float scale(const uint8_t* p) { return kE8m0Half.v[p[0]]; }
    static float min(const uint8_t*) { return 0.0f; }
};
struct Q4_1W {  // { d, m, qs[16] }
    static constexpr size_t kBytes = 20;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static __m256i values(const uint8_t* p) { return nibbles(loadu128(p + 4)); }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t* p) { return _cvtsh_ss(load_u16(p + 2)); }
};
struct Q5_0W {  // { d, qh[4], qs[16] }
    static constexpr size_t kBytes = 22;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static __m256i values(const uint8_t* p) { return _mm256_or_si256(nibbles(loadu128(p + 6)), fifth_bits(p + 2)); }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t*) { return 0.0f; }
};
struct Q5_1W {  // { d, m, qh[4], qs[16] }
    static constexpr size_t kBytes = 24;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static __m256i values(const uint8_t* p) { return _mm256_or_si256(nibbles(loadu128(p + 8)), fifth_bits(p + 4)); }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t* p) { return _cvtsh_ss(load_u16(p + 2)); }
};
struct Iq4nlW {  // { d, qs[16] }: signed grid values by nibble
    static constexpr size_t kBytes = 18;
    static constexpr bool kSigned = true;
    static constexpr bool kMin = false;
    static __m256i values(const uint8_t* p) {
        const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                               -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        return _mm256_shuffle_epi8(table, nibbles(loadu128(p + 2)));
    }
    static float scale(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
    static float min(const uint8_t*) { return 0.0f; }
};

template <class W, int R, int C>
void micro_q(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    const int64_t nb = k / 32;
    const int64_t nbp = q8a_blocks(k);
    __m256 acc[R][C];
    float acc_min[R][C];  // the min terms (kinds with a min)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            acc[r][c] = _mm256_setzero_ps();
            acc_min[r][c] = 0.0f;
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
        __m256i v[R];
        float sw[R], mw[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t* wp = w + r * ws + b * W::kBytes;
            prefetch_ahead(wp, pf);
            v[r] = W::values(wp);
            sw[r] = W::scale(wp);
            mw[r] = W::min(wp);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m256i xv =
                _mm256_set_m128i(_mm_load_si128(reinterpret_cast<const __m128i*>(x[c] + q8a_half(b, 1))),
                                 _mm_load_si128(reinterpret_cast<const __m128i*>(x[c] + q8a_half(b, 0))));
            const float dx = reinterpret_cast<const float*>(x[c] + nbp * 32)[b];
            const int32_t corr = reinterpret_cast<const int32_t*>(x[c] + nbp * 36)[b];
            const __m256i bias = _mm256_zextsi128_si256(_mm_cvtsi32_si128(corr));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                __m256i d16;
                if constexpr (W::kSigned) {
                    d16 = _mm256_maddubs_epi16(_mm256_abs_epi8(v[r]), _mm256_sign_epi8(xv, v[r]));
                } else {
                    d16 = _mm256_maddubs_epi16(v[r], xv);
                }
                __m256i d32 = _mm256_madd_epi16(d16, ones);
                if constexpr (!W::kSigned && !W::kMin) d32 = _mm256_add_epi32(d32, bias);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d32), _mm256_set1_ps(sw[r] * dx), acc[r][c]);
                if constexpr (W::kMin) acc_min[r][c] += mw[r] * (dx * static_cast<float>(corr));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) out[c][r] = hsum(acc[r][c]) + acc_min[r][c];
    }
}

// ---- float weights ----

struct F32W {
    static constexpr size_t kElem = 4;
    static __m256 load(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
    static float scalar(const uint8_t* p) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
    }
};
struct F16W {
    static constexpr size_t kElem = 2;
    static __m256 load(const uint8_t* p) { return _mm256_cvtph_ps(loadu128(p)); }
    static float scalar(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
};
struct BF16W {
    static constexpr size_t kElem = 2;
    static __m256 load(const uint8_t* p) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128(p)), 16));
    }
    static float scalar(const uint8_t* p) {
        const uint32_t bits = static_cast<uint32_t>(load_u16(p)) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        return v;
    }
};

template <class W, int R, int C>
void micro_f(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    __m256 acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 wv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t* wp = w + r * ws + i * W::kElem;
            if (((i * W::kElem) & 63) == 0) prefetch_ahead(wp, pf);
            wv[r] = W::load(wp);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m256 xv = _mm256_load_ps(reinterpret_cast<const float*>(x[c]) + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            float s = hsum(acc[r][c]);
            const auto* xc = reinterpret_cast<const float*>(x[c]);
            for (int64_t j = i; j < k; ++j) s += W::scalar(w + r * ws + j * W::kElem) * xc[j];
            out[c][r] = s;
        }
    }
}

// ---- tiling of a GemmArgs call into micro-kernels ----

template <class W, bool kQuant, int R, int C>
void micro(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    if constexpr (kQuant) {
        micro_q<W, R, C>(w, ws, pf, x, out, k);
    } else {
        micro_f<W, R, C>(w, ws, pf, x, out, k);
    }
}

// kMicro[R - 1][C - 1]: the micro-kernel for an R x C corner of a tile.
template <class W, bool Q>
constexpr MicroFn kMicro[kRowsMax][kColsMax] = {
    {micro<W, Q, 1, 1>, micro<W, Q, 1, 2>},
    {micro<W, Q, 2, 1>, micro<W, Q, 2, 2>},
    {micro<W, Q, 3, 1>, micro<W, Q, 3, 2>},
    {micro<W, Q, 4, 1>, micro<W, Q, 4, 2>},
};

template <class W, bool kQuant>
void gemm(const GemmArgs& a) {
    tile_gemm(a, kMicro<W, kQuant>);
}

// ---- activation quantisation (bit-identical to the scalar definition in matmul_scalar.cpp) ----

void quantize_q8a(const float* x, int64_t k, WeightKind kind, uint8_t* dst) {
    const int64_t nb = k / 32;
    const int64_t nbp = q8a_blocks(k);
    const int32_t factor = q8a_corr_factor(kind);
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nbp * 32);
    auto* corr = reinterpret_cast<int32_t*>(dst + nbp * 36);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(kInf);
    for (int64_t b = 0; b < nb; ++b) {
        __m256 v[4], a[4];
        __m256 nonfinite = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(x + b * 32 + i * 8);
            a[i] = _mm256_and_ps(v[i], abs_mask);
            nonfinite = _mm256_or_ps(nonfinite, _mm256_cmp_ps(a[i], inf, _CMP_NLT_UQ));  // inf or NaN
        }
        __m128i* lo = reinterpret_cast<__m128i*>(qs + q8a_half(b, 0));
        __m128i* hi = reinterpret_cast<__m128i*>(qs + q8a_half(b, 1));
        if (_mm256_movemask_ps(nonfinite) != 0) {
            _mm_store_si128(lo, _mm_setzero_si128());
            _mm_store_si128(hi, _mm_setzero_si128());
            d[b] = kQuietNaN;
            corr[b] = 0;
            continue;
        }
        const __m256 m8 = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        // packs interleave the 128-bit lanes; the final permutation restores element order.
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm_store_si128(lo, _mm256_castsi256_si128(ordered));
        _mm_store_si128(hi, _mm256_extracti128_si256(ordered, 1));
        d[b] = amax / 127.0f;
        corr[b] = factor * _mm_cvtsi128_si32(s4);
    }
    for (int64_t b = nb; b < nbp; ++b) {
        _mm_store_si128(reinterpret_cast<__m128i*>(qs + q8a_half(b, 0)), _mm_setzero_si128());
        _mm_store_si128(reinterpret_cast<__m128i*>(qs + q8a_half(b, 1)), _mm_setzero_si128());
        d[b] = 0.0f;
        corr[b] = 0;
    }
}

}  // namespace

constinit const KernelTable kAvx2Kernels = {
    "avx2",
    quantize_q8a,
    avx2::quantize_q8k,
    {
        gemm<F32W, false>,
        gemm<F16W, false>,
        gemm<BF16W, false>,
        gemm<Q8_0W, true>,
        gemm<Q4_0W, true>,
        gemm<Mxfp4W, true>,
        gemm<Q4_1W, true>,
        gemm<Q5_0W, true>,
        gemm<Q5_1W, true>,
        gemm<Iq4nlW, true>,
        avx2::gemm_q2_k,
        avx2::gemm_q3_k,
        avx2::gemm_q4_k,
        avx2::gemm_q5_k,
        avx2::gemm_q6_k,
        avx2::gemm_iq4_xs,
    },
};

}  // namespace moe::cpu::mm
