// ATTENTION inner kernels for AVX2 + FMA + F16C (compiled with those flags; run only when the CPU has
// them). Everything here has internal linkage except the table. See ops_attention_kernels.h.
#include <immintrin.h>

#include "cpu/ops_attention_kernels.h"

namespace moe::cpu::attn {
namespace {

void f16_rows(const uint8_t* src, size_t stride, int64_t n_rows, int64_t d, float* dst) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const auto* h = reinterpret_cast<const uint16_t*>(src + static_cast<size_t>(r) * stride);
        float* f = dst + r * d;
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) {
            _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
        }
        for (; i < d; ++i) f[i] = _cvtsh_ss(h[i]);
    }
}

inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// The four horizontal sums of v0..v3 as one vector {sum v0, sum v1, sum v2, sum v3}.
inline __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    const __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps(v0, v1), _mm256_unpackhi_ps(v0, v1));
    const __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps(v2, v3), _mm256_unpackhi_ps(v2, v3));
    const __m256 u = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t1))),
                                   _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t1))));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// e^x for x <= 0, 0 below -87.33, NaN for NaN: the Cephes reduction and polynomial of
// ops::exp_approx, with FMA. A NaN score must reach the softmax sum (a corrupt weight shows as NaN
// logits), so the clamp puts x second: max_ps returns its second operand when either is NaN.
inline __m256 exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33f);
    const __m256 round = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 xc = _mm256_max_ps(lo, x);
    const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), round);
    const __m256 n = _mm256_sub_ps(t, round);
    const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(er, scale));
}

inline __m256i tail_mask(int64_t n) {  // lanes [0, min(n, 8)) set
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 8 ? n : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Masked load for the last, partial vector of a row; full vectors use plain loads.
inline __m256 load(const float* p, int64_t left) {
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(left));
}
inline void store(float* p, int64_t left, __m256 v) {
    if (left >= 8) {
        _mm256_storeu_ps(p, v);
    } else {
        _mm256_maskstore_ps(p, tail_mask(left), v);
    }
}

constexpr int kRows = 2;  // query rows per register tile (16 ymm registers: 2 x 4 accumulators)
constexpr int kKeys = 4;  // keys per score tile

// s[r * lds + j] = q_r . k_j for r < 2, j < nk <= 4. Callers pass a short tile by repeating the last
// row (its row of s is then written twice, with the same values) and the last key (not stored).
// Register arrays are only indexed by constants, so they stay in registers.
void score_tile(const float* const* q, const float* const* k, int nk, int64_t d, float* const* s) {
    __m256 acc[kRows][kKeys];
    for (auto& row : acc)
        for (auto& a : row) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        __m256 kv[kKeys];
        for (int j = 0; j < kKeys; ++j) kv[j] = load(k[j] + i, d - i);
        for (int r = 0; r < kRows; ++r) {
            const __m256 qv = load(q[r] + i, d - i);
            for (int j = 0; j < kKeys; ++j) acc[r][j] = _mm256_fmadd_ps(qv, kv[j], acc[r][j]);
        }
    }
    const __m128i keys = _mm_cmpgt_epi32(_mm_set1_epi32(nk), _mm_setr_epi32(0, 1, 2, 3));
    for (int r = 0; r < kRows; ++r) _mm_maskstore_ps(s[r], keys, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

// acc_r += sum_j p_r[j] v_j over columns [e, e + 8 * C) (clipped to d) for 2 rows (a short tile
// repeats its last row: same inputs, same values written twice).
template <int C>
void value_tile(const float* const* p, const float* const* v, int64_t n, int64_t e, int64_t d, float* const* acc) {
    __m256 a[kRows][C];
    for (int r = 0; r < kRows; ++r) {
        for (int c = 0; c < C; ++c) a[r][c] = load(acc[r] + e + 8 * c, d - e - 8 * c);
    }
    for (int64_t j = 0; j < n; ++j) {
        __m256 vv[C];
        for (int c = 0; c < C; ++c) vv[c] = load(v[j] + e + 8 * c, d - e - 8 * c);
        for (int r = 0; r < kRows; ++r) {
            const __m256 pr = _mm256_broadcast_ss(p[r] + j);
            for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(pr, vv[c], a[r][c]);
        }
    }
    for (int r = 0; r < kRows; ++r) {
        for (int c = 0; c < C; ++c) store(acc[r] + e + 8 * c, d - e - 8 * c, a[r][c]);
    }
}

void rows_update(const float* q, int64_t nr, const float* const* krow, const float* const* vrow, int64_t n, int64_t d,
                 float* s, float* m, float* l, float* acc) {
    // Scores, in 2 x 4 tiles.
    for (int64_t r0 = 0; r0 < nr; r0 += kRows) {
        int64_t rows[kRows];
        for (int r = 0; r < kRows; ++r) rows[r] = r0 + r < nr ? r0 + r : nr - 1;
        const float* qp[kRows];
        for (int r = 0; r < kRows; ++r) qp[r] = q + rows[r] * d;
        for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
            const int jn = static_cast<int>(n - j0 < kKeys ? n - j0 : kKeys);
            const float* kp[kKeys];
            float* sp[kRows];
            for (int j = 0; j < kKeys; ++j) kp[j] = krow[j0 + (j < jn ? j : jn - 1)];
            for (int r = 0; r < kRows; ++r) sp[r] = s + rows[r] * n + j0;
            score_tile(qp, kp, jn, d, sp);
        }
    }
    // Online softmax per row: p_j = e^(s_j - m'), and acc rescaled by e^(m - m').
    for (int64_t r = 0; r < nr; ++r) {
        float* sr = s + r * n;
        float m_new = m[r];
        for (int64_t j = 0; j < n; ++j) m_new = sr[j] > m_new ? sr[j] : m_new;
        const __m256 vm = _mm256_set1_ps(m_new);
        __m256 vsum = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j += 8) {
            const __m256 e = exp_nonpos(_mm256_sub_ps(load(sr + j, n - j), vm));
            const __m256 ez = n - j >= 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(tail_mask(n - j)));
            store(sr + j, n - j, ez);
            vsum = _mm256_add_ps(vsum, ez);
        }
        const float corr = _mm256_cvtss_f32(exp_nonpos(_mm256_set1_ps(m[r] - m_new)));  // 0 when m[r] is -inf
        l[r] = l[r] * corr + hsum(vsum);
        m[r] = m_new;
        if (corr != 1.0f) {
            const __m256 vc = _mm256_set1_ps(corr);
            float* ar = acc + r * d;
            for (int64_t e = 0; e < d; e += 8) store(ar + e, d - e, _mm256_mul_ps(load(ar + e, d - e), vc));
        }
    }
    // Values: 2 rows x 32 columns of accumulators per pass over the keys.
    for (int64_t r0 = 0; r0 < nr; r0 += kRows) {
        const float* pp[kRows];
        float* ap[kRows];
        for (int r = 0; r < kRows; ++r) {
            const int64_t row = r0 + r < nr ? r0 + r : nr - 1;
            pp[r] = s + row * n;
            ap[r] = acc + row * d;
        }
        int64_t e = 0;
        for (; e + 32 <= d; e += 32) value_tile<4>(pp, vrow, n, e, d, ap);
        for (; e < d; e += 8) value_tile<1>(pp, vrow, n, e, d, ap);
    }
}

}  // namespace

const KernelTable kAvx2Kernels = {"avx2", f16_rows, rows_update};

}  // namespace moe::cpu::attn
