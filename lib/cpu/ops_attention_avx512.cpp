// ATTENTION inner kernels for AVX-512 F/BW/VL/DQ (compiled with those flags; run only when the CPU
// has them). Everything here has internal linkage except the table. See ops_attention_kernels.h.
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (GCC bug
// 105593, fixed in 13); the warning points into the header, so it is silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "cpu/ops_attention_kernels.h"

namespace moe::cpu::attn {
namespace {

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // 0 <= n < 16

void f16_rows(const uint8_t* src, size_t stride, int64_t n_rows, int64_t d, float* dst) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const auto* h = reinterpret_cast<const uint16_t*>(src + static_cast<size_t>(r) * stride);
        float* f = dst + r * d;
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) {
            _mm512_storeu_ps(f + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
        }
        if (i < d) {
            const __mmask16 k = tail_mask(d - i);
            _mm512_mask_storeu_ps(f + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h + i)));
        }
    }
}

// e^x for x <= 0, 0 below -87.33, NaN for NaN: the Cephes reduction and polynomial of
// ops::exp_approx, with FMA. A NaN score must reach the softmax sum (a corrupt weight shows as NaN
// logits), so NaN lanes are kept (unordered compare) and the clamp puts x second: max_ps returns its
// second operand when either is NaN.
inline __m512 exp_nonpos(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33f);
    const __m512 round = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    const __m512 xc = _mm512_max_ps(lo, x);
    const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), round);
    const __m512 n = _mm512_sub_ps(t, round);
    const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 er = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(keep, er, scale);
}

// The four horizontal sums of v0..v3 as one vector {sum v0, sum v1, sum v2, sum v3}.
inline __m128 hsum4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    // Each 128-bit lane now holds partial {v0, v1, v2, v3} sums: add the four lanes.
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

constexpr int kTile = 4;  // query rows x keys (scores) and query rows (values) per register tile

// s[r * lds + j] = q_r . k_j for r < 4, j < nk <= 4: 16 accumulators, each K and Q load used four
// times. Callers pass a short tile by repeating the last row (its row of s is then written twice, with
// the same values) and the last key (not stored). Register arrays are only indexed by constants, so
// they stay in registers.
void score_tile(const float* const* q, const float* const* k, int nk, int64_t d, float* const* s) {
    __m512 acc[kTile][kTile];
    for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(d - i);
        __m512 kv[kTile];
        for (int j = 0; j < kTile; ++j) kv[j] = _mm512_maskz_loadu_ps(m, k[j] + i);
        for (int r = 0; r < kTile; ++r) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q[r] + i);
            for (int j = 0; j < kTile; ++j) acc[r][j] = _mm512_fmadd_ps(qv, kv[j], acc[r][j]);
        }
    }
    const auto keys = static_cast<__mmask8>((1u << nk) - 1u);
    for (int r = 0; r < kTile; ++r) _mm_mask_storeu_ps(s[r], keys, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

// acc_r += sum_j p_r[j] v_j over columns [e, e + 16 * C) for 4 rows (a short tile repeats its last
// row: same inputs, same values written twice); the last vector of the range is masked with `last`.
template <int C>
void value_tile(const float* const* p, const float* const* v, int64_t n, int64_t e, __mmask16 last, float* const* acc) {
    __m512 a[kTile][C];
    for (int r = 0; r < kTile; ++r) {
        for (int c = 0; c < C; ++c) {
            a[r][c] = _mm512_maskz_loadu_ps(c == C - 1 ? last : static_cast<__mmask16>(0xFFFF), acc[r] + e + 16 * c);
        }
    }
    for (int64_t j = 0; j < n; ++j) {
        __m512 vv[C];
        for (int c = 0; c < C; ++c) {
            vv[c] = _mm512_maskz_loadu_ps(c == C - 1 ? last : static_cast<__mmask16>(0xFFFF), v[j] + e + 16 * c);
        }
        for (int r = 0; r < kTile; ++r) {
            const __m512 pr = _mm512_set1_ps(p[r][j]);
            for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(pr, vv[c], a[r][c]);
        }
    }
    for (int r = 0; r < kTile; ++r) {
        for (int c = 0; c < C; ++c) {
            _mm512_mask_storeu_ps(acc[r] + e + 16 * c, c == C - 1 ? last : static_cast<__mmask16>(0xFFFF), a[r][c]);
        }
    }
}

void rows_update(const float* q, int64_t nr, const float* const* krow, const float* const* vrow, int64_t n, int64_t d,
                 float* s, float* m, float* l, float* acc) {
    // Scores, in 4 x 4 tiles.
    for (int64_t r0 = 0; r0 < nr; r0 += kTile) {
        int64_t rows[kTile];
        for (int r = 0; r < kTile; ++r) rows[r] = r0 + r < nr ? r0 + r : nr - 1;
        const float* qp[kTile];
        for (int r = 0; r < kTile; ++r) qp[r] = q + rows[r] * d;
        for (int64_t j0 = 0; j0 < n; j0 += kTile) {
            const int jn = static_cast<int>(n - j0 < kTile ? n - j0 : kTile);
            const float* kp[kTile];
            float* sp[kTile];
            for (int j = 0; j < kTile; ++j) kp[j] = krow[j0 + (j < jn ? j : jn - 1)];
            for (int r = 0; r < kTile; ++r) sp[r] = s + rows[r] * n + j0;
            score_tile(qp, kp, jn, d, sp);
        }
    }
    // Online softmax per row: p_j = e^(s_j - m'), and acc rescaled by e^(m - m').
    for (int64_t r = 0; r < nr; ++r) {
        float* sr = s + r * n;
        __m512 vmax = _mm512_set1_ps(m[r]);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 k = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - j);
            vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, sr + j));
        }
        const float m_new = _mm512_reduce_max_ps(vmax);
        const __m512 vm = _mm512_set1_ps(m_new);
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 k = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - j);
            const __m512 e = _mm512_maskz_mov_ps(k, exp_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + j), vm)));
            _mm512_mask_storeu_ps(sr + j, k, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        const float corr = _mm512_cvtss_f32(exp_nonpos(_mm512_set1_ps(m[r] - m_new)));  // 0 when m[r] is -inf
        l[r] = l[r] * corr + _mm512_reduce_add_ps(vsum);
        m[r] = m_new;
        if (corr != 1.0f) {
            const __m512 vc = _mm512_set1_ps(corr);
            float* ar = acc + r * d;
            for (int64_t e = 0; e < d; e += 16) {
                const __mmask16 k = d - e >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(d - e);
                _mm512_mask_storeu_ps(ar + e, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, ar + e), vc));
            }
        }
    }
    // Values: 4 rows x 64 columns of accumulators per pass over the keys.
    for (int64_t r0 = 0; r0 < nr; r0 += kTile) {
        const float* pp[kTile];
        float* ap[kTile];
        for (int r = 0; r < kTile; ++r) {
            const int64_t row = r0 + r < nr ? r0 + r : nr - 1;
            pp[r] = s + row * n;
            ap[r] = acc + row * d;
        }
        int64_t e = 0;
        for (; e + 64 <= d; e += 64) value_tile<4>(pp, vrow, n, e, static_cast<__mmask16>(0xFFFF), ap);
        for (; e < d; e += 16) {
            value_tile<1>(pp, vrow, n, e, d - e >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(d - e), ap);
        }
    }
}

}  // namespace

const KernelTable kAvx512Kernels = {"avx512", f16_rows, rows_update};

}  // namespace moe::cpu::attn
