// AVX-512 matrix-product kernels (F/BW/VL/DQ + VNNI; compiled with those flags, chosen at run time).
//
// Quantised weights are turned into unsigned bytes (Q8_0: xor 0x80 = w + 128; Q4_0: the raw nibble =
// w + 8; Q5_0: the 5-bit value = w + 16; MXFP4: a 16-entry byte shuffle of the doubled e2m1 values +
// 12; IQ4_NL: a shuffle of the grid values + 128) and multiplied with the signed bytes of the Q8A
// activation row by vpdpbusd. The offset is removed by starting each block's accumulation at
// corr = -offset * sum(x) (in one lane of the block; the block's lanes share a scale), so no
// instruction per product is spent on it. The int32 lanes are converted and accumulated in float with
// the per-block scale d_w * d_x. Q4_1 / Q5_1 values are unsigned already (x = q d + m); their min adds
// m * d_x * sum(x_q), with the sum from the row's corr.
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
// row's last, partial quad) read nothing and get scale 0. kMin: the kind has a min (mins()).
struct Q8_0Q {
    static constexpr size_t kBytes = 34;
    static constexpr bool kMin = false;
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
    static __m128 mins(const uint8_t*, int) { return _mm_setzero_ps(); }
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

template <size_t kQs, size_t kBytes, bool kFull>
inline void split_nibbles(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
    const __m512i z = nibble_bytes<kQs, kBytes, kFull>(p, n);
    const __m512i m = _mm512_set1_epi8(0x0F);
    lo = _mm512_and_si512(z, m);
    hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m);
}

// Q5_0 / Q5_1: adds 16 to the values whose fifth bit is set. Bit j of block i's little-endian word
// qh (at kQh) belongs to element j: its low 16 bits go to lane i of lo, its high 16 bits to lane i of hi.
template <size_t kQh, size_t kBytes>
inline void add_fifth_bits(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
    uint64_t mlo = 0, mhi = 0;
    for (int i = 0; i < n; ++i) {
        uint32_t qh;
        std::memcpy(&qh, p + i * kBytes + kQh, 4);
        mlo |= static_cast<uint64_t>(qh & 0xFFFF) << (16 * i);
        mhi |= static_cast<uint64_t>(qh >> 16) << (16 * i);
    }
    const __m512i sixteen = _mm512_set1_epi8(16);
    lo = _mm512_mask_add_epi8(lo, static_cast<__mmask64>(mlo), lo, sixteen);
    hi = _mm512_mask_add_epi8(hi, static_cast<__mmask64>(mhi), hi, sixteen);
}

struct Q4_0Q {
    static constexpr size_t kBytes = 18;
    static constexpr bool kMin = false;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        split_nibbles<2, kBytes, kFull>(p, n, lo, hi);  // the raw nibble is w + 8
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
    static __m128 mins(const uint8_t*, int) { return _mm_setzero_ps(); }
};

struct Q4_1Q {  // { d, m, qs[16] }
    static constexpr size_t kBytes = 20;
    static constexpr bool kMin = true;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        split_nibbles<4, kBytes, kFull>(p, n, lo, hi);
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
    static __m128 mins(const uint8_t* p, int n) { return fp16_scales<kBytes>(p + 2, n); }
};

struct Q5_0Q {  // { d, qh[4], qs[16] }
    static constexpr size_t kBytes = 22;
    static constexpr bool kMin = false;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        if constexpr (kFull) n = 4;
        split_nibbles<6, kBytes, kFull>(p, n, lo, hi);
        add_fifth_bits<2, kBytes>(p, n, lo, hi);  // the 5-bit value is w + 16
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
    static __m128 mins(const uint8_t*, int) { return _mm_setzero_ps(); }
};

struct Q5_1Q {  // { d, m, qh[4], qs[16] }
    static constexpr size_t kBytes = 24;
    static constexpr bool kMin = true;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        if constexpr (kFull) n = 4;
        split_nibbles<8, kBytes, kFull>(p, n, lo, hi);
        add_fifth_bits<4, kBytes>(p, n, lo, hi);
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
    static __m128 mins(const uint8_t* p, int n) { return fp16_scales<kBytes>(p + 2, n); }
};

struct Mxfp4Q {
    static constexpr size_t kBytes = 17;
    static constexpr bool kMin = false;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        split_nibbles<1, kBytes, kFull>(p, n, lo, hi);
        // doubled e2m1 value + 12, by nibble
        const __m512i table =
            _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
        lo = _mm512_shuffle_epi8(table, lo);
        hi = _mm512_shuffle_epi8(table, hi);
    }
    static __m128 scales(const uint8_t* p, int n) {
        __m128 v = _mm_load_ss(&kE8m0Half.v[p[0]]);
        if (n > 1) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[kBytes]]), 0x10);
        if (n > 2) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[2 * kBytes]]), 0x20);
        if (n > 3) v = _mm_insert_ps(v, _mm_load_ss(&kE8m0Half.v[p[3 * kBytes]]), 0x30);
        return v;
    }
    static __m128 mins(const uint8_t*, int) { return _mm_setzero_ps(); }
};

struct Iq4nlQ {  // { d, qs[16] }: grid value + 128 by nibble
    static constexpr size_t kBytes = 18;
    static constexpr bool kMin = false;
    template <bool kFull>
    static void values(const uint8_t* p, int n, __m512i& lo, __m512i& hi) {
        split_nibbles<2, kBytes, kFull>(p, n, lo, hi);
        const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(
            1, 24, 45, 63, 79, 93, 106, 118, static_cast<char>(129), static_cast<char>(141), static_cast<char>(153),
            static_cast<char>(166), static_cast<char>(181), static_cast<char>(197), static_cast<char>(217),
            static_cast<char>(241)));
        lo = _mm512_shuffle_epi8(table, lo);
        hi = _mm512_shuffle_epi8(table, hi);
    }
    static __m128 scales(const uint8_t* p, int n) { return fp16_scales<kBytes>(p, n); }
    static __m128 mins(const uint8_t*, int) { return _mm_setzero_ps(); }
};

// [v0 x 4, v1 x 4, v2 x 4, v3 x 4]: one value per block of a quad, spread over the block's lane.
inline __m512 spread_quad(__m128 v) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                 _mm512_zextps128_ps512(v));
}

// One quad step of the quantised micro-kernel: per (row, token) two vpdpbusd (first and second
// halves) into the same per-block lanes, then one convert, scale and accumulate for four blocks. Kinds
// with a min add m * (d_x * sum(x_q)), the sum in one lane per block.
template <class W, int R, int C, bool kFull>
inline void q_step(const uint8_t* w, size_t ws, intptr_t pf, const uint8_t* const* x, int64_t nbp, int64_t g, int n,
                   __m512 (&acc)[R][C]) {
    if constexpr (kFull) n = 4;
    __m512i lo[R], hi[R];
    __m512 s[R], m[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const uint8_t* wp = w + r * ws + 4 * g * W::kBytes;
        prefetch_ahead<(4 * W::kBytes + 63) / 64>(wp, pf);
        W::template values<kFull>(wp, n, lo[r], hi[r]);
        s[r] = spread_quad(W::scales(wp, n));
        if constexpr (W::kMin) m[r] = spread_quad(W::mins(wp, n));
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
        const __m512i xlo = _mm512_load_si512(x[c] + 128 * g);
        const __m512i xhi = _mm512_load_si512(x[c] + 128 * g + 64);
        const __m512 xs = spread_quad(_mm_load_ps(reinterpret_cast<const float*>(x[c] + nbp * 32) + 4 * g));
        const __m128i c4 = _mm_load_si128(reinterpret_cast<const __m128i*>(x[c] + nbp * 36) + g);
        const __m512i corr = _mm512_maskz_expand_epi32(0x1111, _mm512_zextsi128_si512(c4));
        const __m512i bias = W::kMin ? _mm512_setzero_si512() : corr;
        const __m512 xsum = W::kMin ? _mm512_mul_ps(_mm512_cvtepi32_ps(corr), xs) : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, lo[r], xlo), hi[r], xhi);
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s[r], xs), acc[r][c]);
            if constexpr (W::kMin) acc[r][c] = _mm512_fmadd_ps(m[r], xsum, acc[r][c]);
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
        corr[b] = factor * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
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
    avx512::quantize_q8k,
    {
        gemm<F32W, false>,
        gemm<F16W, false>,
        gemm<BF16W, false>,
        gemm<Q8_0Q, true>,
        gemm<Q4_0Q, true>,
        gemm<Mxfp4Q, true>,
        gemm<Q4_1Q, true>,
        gemm<Q5_0Q, true>,
        gemm<Q5_1Q, true>,
        gemm<Iq4nlQ, true>,
        avx512::gemm_q2_k,
        avx512::gemm_q3_k,
        avx512::gemm_q4_k,
        avx512::gemm_q5_k,
        avx512::gemm_q6_k,
        avx512::gemm_iq4_xs,
    },
};

}  // namespace moe::cpu::mm
