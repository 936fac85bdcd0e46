// AVX-512 matrix-product kernels (F/BW/VL/DQ + VNNI; compiled with those flags, chosen at run time).
//
// Quantised weights are turned into unsigned bytes (Q8_0: xor 0x80 = w + 128; Q4_0: the raw nibble =
// w + 8; MXFP4: a 16-entry byte shuffle of the doubled e2m1 values + 12) and multiplied with the
// signed bytes of the Q8A activation row by vpdpbusd. The offset is removed by starting each block's
// accumulation at corr = -offset * sum(x) (in one lane of the block; the block's lanes share a scale),
// so no instruction per product is spent on it. The int32 lanes are converted and accumulated in
// float with the per-block scale d_w * d_x.
//
// A zmm holds the first 16 values of four blocks (Q4_0 / MXFP4: their low nibbles) and another the
// last 16 (high nibbles), against the matching halves of the interleaved Q8A row (one 128-bit lane per
// block), so unpacking needs no lane shuffles and the convert / scale / accumulate runs once per four
// blocks. A micro-kernel keeps up to 4 weight rows x 4 tokens of accumulators in registers, so each weight
// load serves 4 tokens and each activation load 4 rows.
//
// Float weights (F32, F16 via vcvtph2ps, BF16 by a 16-bit shift) multiply F32 activations with FMA,
// in the same 4 x 4 register tiling.
//
// Weights are prefetched ahead of use (see prefetch_ahead / prefetch_offset): without it, reading a
// few rows at a time leaves a single-token GEMV far below DRAM bandwidth.

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (GCC bug
// 105593, fixed in 13); the warning points into the header, so it is silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <bit>
#include <cstring>

#include "cpu/matmul_kernels.h"

namespace moe::cpu::mm {
namespace {

constexpr int kRowsMax = 4;  // micro-kernel weight rows
constexpr int kColsMax = 4;  // micro-kernel tokens

// 2^(e - 128) for every e8m0 byte: the MXFP4 scale for values doubled to integers (a constant table,
// so nothing runs at start-up).
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

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Weight rows are read R at a time, which makes R short streams that hardware prefetchers follow
// poorly. Each read also fetches the same offset `pf` bytes further, in the rows this thread reads
// later (prefetch_offset), which turns the short streams into one sweep ahead of the arithmetic,
// across tiles and jobs. kLines * 64 covers what a row advances per step (a quad of blocks: 136 bytes
// of Q8_0, 72 of Q4_0, 68 of MXFP4; 64 bytes of F32 per step, of F16 / BF16 every other step), so
// consecutive steps prefetch every line. Prefetches never fault, so a stale or far address is harmless.
template <int kLines>
inline void prefetch_ahead(const uint8_t* p, intptr_t pf) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(pf);
    for (int i = 0; i < kLines; ++i) _mm_prefetch(reinterpret_cast<const char*>(a + 64 * i), _MM_HINT_T0);
}

inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The fp16 scales of up to four blocks kBytes apart, gathered in one 64-bit word and converted at once.
template <size_t kBytes>
inline __m128 fp16_scales(const uint8_t* p, int n) {
    uint64_t h = load_u16(p);
    for (int i = 1; i < n; ++i) h |= static_cast<uint64_t>(load_u16(p + i * kBytes)) << (16 * i);
    return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h)));
}

// Quantised weights four blocks at a time: lo = elements 0-15 of blocks 0..3 (one 128-bit lane per
// block), hi = elements 16-31, as unsigned bytes; scales() = the four block scales. Blocks n..3 (a
// row's last, partial quad) read nothing and get scale 0.
struct Q8_0Q {
    static constexpr size_t kBytes = 34;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        lo = _mm512_zextsi128_si512(loadu128(p + 2));
        hi = _mm512_zextsi128_si512(loadu128(p + 18));
        if (kFull || n > 1) {
            lo = _mm512_inserti32x4(lo, loadu128(p + kBytes + 2), 1);
            hi = _mm512_inserti32x4(hi, loadu128(p + kBytes + 18), 1);
        }
        if (kFull || n > 2) {
            lo = _mm512_inserti32x4(lo, loadu128(p + 2 * kBytes + 2), 2);
            hi = _mm512_inserti32x4(hi, loadu128(p + 2 * kBytes + 18), 2);
        }
        if (kFull || n > 3) {
            lo = _mm512_inserti32x4(lo, loadu128(p + 3 * kBytes + 2), 3);
            hi = _mm512_inserti32x4(hi, loadu128(p + 3 * kBytes + 18), 3);
        }
        const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));  // w + 128
        lo = _mm512_xor_si512(lo, bias);
        hi = _mm512_xor_si512(hi, bias);
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
};

// Q4_0 and MXFP4: the 16 nibble bytes of four blocks in one zmm, split into low and high nibbles.
template <size_t kQs, size_t kBytes, bool kFull>
inline __m512i nibble_bytes(const uint8_t* p, int n) {
    __m512i z = _mm512_zextsi128_si512(loadu128(p + kQs));
    if (kFull || n > 1) z = _mm512_inserti32x4(z, loadu128(p + kBytes + kQs), 1);
    if (kFull || n > 2) z = _mm512_inserti32x4(z, loadu128(p + 2 * kBytes + kQs), 2);
    if (kFull || n > 3) z = _mm512_inserti32x4(z, loadu128(p + 3 * kBytes + kQs), 3);
    return z;
}

struct Q4_0Q {
    static constexpr size_t kBytes = 18;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        const __m512i z = nibble_bytes<2, kBytes, kFull>(p, n);
        const __m512i m = _mm512_set1_epi8(0x0F);
        lo = _mm512_and_si512(z, m);  // the raw nibble is w + 8
        hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m);
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
};

struct Mxfp4Q {
    static constexpr size_t kBytes = 17;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        const __m512i z = nibble_bytes<1, kBytes, kFull>(p, n);
        const __m512i m = _mm512_set1_epi8(0x0F);
        // doubled e2m1 value + 12, by nibble
        const __m512i table =
            _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
        lo = _mm512_shuffle_epi8(table, _mm512_and_si512(z, m));
        hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(z, 4), m));
    }
    static __m128 scales(const uint8_t* p, int n) {
        __m128 v = _mm_load_ss(&kE8m0Half.v[p[0]]);
        if (n > 1) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[kBytes]]), 0x10);
        if (n > 2) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[2 * kBytes]]), 0x20);
        if (n > 3) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[3 * kBytes]]), 0x30);
        return v;
    }
};

// [v0 x 4, v1 x 4, v2 x 4, v3 x 4]: one value per block of a quad, spread over the block's lane.
inline __m512 spread_quad(__m128 v) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                 _mm512_zextps128_ps512(v));
}

// One quad step of the quantised micro-kernel: per (row, token) two vpdpbusd (first and second
// halves) into the same per-block lanes, then one convert, scale and accumulate for four blocks.
template <class W, int R, int C, bool kFull>
inline void q_step(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, int64_t nbp, int64_t g, int n,
                   __m512 (&acc)[R][C]) {
    if constexpr (kFull) n = 4;
    __m512i lo[R], hi[R];
    __m512 s[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const uint8_t* wp = w + r * ws + 4 * g * W::kBytes;
        prefetch_ahead<(4 * W::kBytes + 63) / 64>(wp, pf);
        W::template values<kFull>(wp, n, lo[r], hi[r]);
        s[r] = spread_quad(W::scales(wp, n));
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
        const __m512i xlo = _mm512_load_si512(x[c] + 128 * g);
        const __m512i xhi = _mm512_load_si512(x[c] + 128 * g + 64);
        const __m512 xs = spread_quad(_mm_load_ps(reinterpret_cast<const float*>(x[c] + nbp * 32) + 4 * g));
        const __m128i c4 = _mm_load_si128(reinterpret_cast<const __m128i*>(x[c] + nbp * 36) + g);
        const __m512i bias = _mm512_maskz_expand_epi32(0x1111, _mm512_zextsi128_si512(c4));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, lo[r], xlo), hi[r], xhi);
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s[r], xs), acc[r][c]);
        }
    }
}

template <class W, int R, int C>
void micro_q(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    const int64_t nb = k / 32;
    const int64_t nbp = q8a_blocks(k);
    __m512 acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    const int64_t nq = nb / 4;
    for (int64_t g = 0; g < nq; ++g) q_step<W, R, C, true>(w, ws, pf, x, nbp, g, 4, acc);
    if (nb % 4 != 0) q_step<W, R, C, false>(w, ws, pf, x, nbp, nq, static_cast<int>(nb % 4), acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) out[c][r] = _mm512_reduce_add_ps(acc[r][c]);
    }
}

// ---- float weights ----

struct F32W {
    static constexpr size_t kElem = 4;
    static __m512 load(const uint8_t* p) { return _mm512_loadu_ps(p); }
    static __m512 load_masked(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16W {
    static constexpr size_t kElem = 2;
    static __m512 load(const uint8_t* p) { return _mm512_cvtph_ps(loadu256(p)); }
    static __m512 load_masked(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};
struct BF16W {
    static constexpr size_t kElem = 2;
    static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
    static __m512 load(const uint8_t* p) { return widen(loadu256(p)); }
    static __m512 load_masked(const uint8_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

template <class W, int R, int C>
void micro_f(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out, int64_t k) {
    __m512 acc[R][C];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512 wv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t* wp = w + r * ws + i * W::kElem;
            if (((i * W::kElem) & 63) == 0) prefetch_ahead<1>(wp, pf);
            wv[r] = W::load(wp);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_load_ps(reinterpret_cast<const float*>(x[c]) + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (i < k) {
        // The activation rows are zero-padded to 16 elements; only the weights need a mask.
        const auto m = static_cast<__mmask16>((1u << (k - i)) - 1u);
        __m512 wv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) wv[r] = W::load_masked(w + r * ws + i * W::kElem, m);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_load_ps(reinterpret_cast<const float*>(x[c]) + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) out[c][r] = _mm512_reduce_add_ps(acc[r][c]);
    }
}

// ---- tiling of a GemmArgs call into micro-kernels ----

// pf: bytes from a weight row to the row prefetched while it is read (prefetch_offset).
using MicroFn = void (*)(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, float* const* out,
                        int64_t k);

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
    {micro<W, Q, 1, 1>, micro<W, Q, 1, 2>, micro<W, Q, 1, 3>, micro<W, Q, 1, 4>},
    {micro<W, Q, 2, 1>, micro<W, Q, 2, 2>, micro<W, Q, 2, 3>, micro<W, Q, 2, 4>},
    {micro<W, Q, 3, 1>, micro<W, Q, 3, 2>, micro<W, Q, 3, 3>, micro<W, Q, 3, 4>},
    {micro<W, Q, 4, 1>, micro<W, Q, 4, 2>, micro<W, Q, 4, 3>, micro<W, Q, 4, 4>},
};

// Bytes from row r0 of the tile to the row prefetched while rows r0.. are read: whole row groups
// ahead in this thread's stream of weights (the tile's rows, then the caller's next tile), at least
// kPrefetchBytes ahead so that short rows still cover the DRAM latency. Addresses are computed as
// integers: the target may lie outside every array (prefetches never fault).
constexpr size_t kPrefetchBytes = 4096;
intptr_t prefetch_offset(const GemmArgs& a, int64_t r0) {
    const size_t group_bytes = kRowsMax * a.w_stride;
    const size_t groups = group_bytes >= kPrefetchBytes ? 1 : (kPrefetchBytes + group_bytes - 1) / group_bytes;
    const int64_t target = r0 + static_cast<int64_t>(groups) * kRowsMax;  // row index in the stream
    const uintptr_t base = reinterpret_cast<uintptr_t>(a.w);
    const uintptr_t to =
        target < a.n_rows || a.next_w == nullptr
            ? base + static_cast<uintptr_t>(target) * a.w_stride
            : reinterpret_cast<uintptr_t>(a.next_w) + static_cast<uintptr_t>(target - a.n_rows) * a.w_stride;
    return static_cast<intptr_t>(to - (base + static_cast<uintptr_t>(r0) * a.w_stride));
}

// Rows outer, tokens inner: the kRowsMax weight rows of one step stay in L1 while every token of the
// tile passes over them.
template <class W, bool kQuant>
void gemm(const GemmArgs& a) {
    for (int64_t r0 = 0; r0 < a.n_rows; r0 += kRowsMax) {
        const int nr = static_cast<int>(a.n_rows - r0 < kRowsMax ? a.n_rows - r0 : kRowsMax);
        const uint8_t* w = a.w + r0 * a.w_stride;
        const intptr_t pf = prefetch_offset(a, r0);
        for (int64_t c0 = 0; c0 < a.n_cols; c0 += kColsMax) {
            const int nc = static_cast<int>(a.n_cols - c0 < kColsMax ? a.n_cols - c0 : kColsMax);
            const uint8_t* x[kColsMax];
            float* out[kColsMax];
            for (int c = 0; c < nc; ++c) {
                const int64_t ac = a.act_idx ? a.act_idx[c0 + c] : c0 + c;
                const int64_t oc = a.out_idx ? a.out_idx[c0 + c] : c0 + c;
                x[c] = a.act + ac * a.act_stride;
                out[c] = a.out + oc * a.out_stride + r0;
            }
            kMicro<W, kQuant>[nr - 1][nc - 1](w, a.w_stride, pf, x, out, a.k);
        }
    }
}

// ---- activation quantisation (bit-identical to the scalar definition in matmul_scalar.cpp) ----

void quantize_q8a(const float* x, int64_t k, WeightKind kind, uint8_t* dst) {
    const int64_t nb = k / 32;
    const int64_t nbp = q8a_blocks(k);
    const int32_t offset = q8a_offset(kind);
    auto* qs = reinterpret_cast<int8_t*>(dst);
    auto* d = reinterpret_cast<float*>(dst + nbp * 32);
    auto* corr = reinterpret_cast<int32_t*>(dst + nbp * 36);
    constexpr int kNonFinite = 0x01 | 0x08 | 0x10 | 0x80;  // fpclass: QNaN, +inf, -inf, SNaN
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 x0 = _mm512_loadu_ps(x + b * 32);
        const __m512 x1 = _mm512_loadu_ps(x + b * 32 + 16);
        auto* lo = reinterpret_cast<__m128i*>(qs + q8a_half(b, 0));
        auto* hi = reinterpret_cast<__m128i*>(qs + q8a_half(b, 1));
        if ((_mm512_fpclass_ps_mask(x0, kNonFinite) | _mm512_fpclass_ps_mask(x1, kNonFinite)) != 0) {
            _mm_store_si128(lo, _mm_setzero_si128());
            _mm_store_si128(hi, _mm_setzero_si128());
            d[b] = kQuietNaN;
            corr[b] = 0;
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        _mm_store_si128(lo, _mm512_cvtsepi32_epi8(q0));
        _mm_store_si128(hi, _mm512_cvtsepi32_epi8(q1));
        d[b] = amax / 127.0f;
        corr[b] = -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
    for (int64_t b = nb; b < nbp; ++b) {
        _mm_store_si128(reinterpret_cast<__m128i*>(qs + q8a_half(b, 0)), _mm_setzero_si128());
        _mm_store_si128(reinterpret_cast<__m128i*>(qs + q8a_half(b, 1)), _mm_setzero_si128());
        d[b] = 0.0f;
        corr[b] = 0;
    }
}

}  // namespace

constinit const KernelTable kAvx512Kernels = {
    "avx512_vnni",
    quantize_q8a,
    {
        gemm<F32W, false>,
        gemm<F16W, false>,
        gemm<BF16W, false>,
        gemm<Q8_0Q, true>,
        gemm<Q4_0Q, true>,
        gemm<Mxfp4Q, true>,
    },
};

}  // namespace moe::cpu::mm
