// AVX-512 kernels of the super-block kinds (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8K
// activation rows, and the Q8K quantiser (bit-identical to the scalar definition in
// matmul_q8k_scalar.cpp). The table that holds them is taken only on CPUs with AVX-512 VNNI.
//
// A super-block of 256 is read as 4 chunks of 64 values, one zmm each. vpmaddubsw multiplies unsigned
// weight bytes by the signed activations: the K-quants' values are unsigned as stored (at most 63,
// Q6_K's q + 32); IQ4_XS's signed grid values enter as |w| with the activations negated where w < 0
// (AVX-512 has no vpsignb), |w| <= 127. So a pair never exceeds 2 * 127 * 127 and never saturates.
// vpdpwssd (VNNI) then multiplies the pairs by the scale of their group (int16 lanes picked from the
// group scales with one vpermw) and adds them into int32 lanes. The offsets that made the values
// unsigned (Q3_K 4, Q6_K 32) and the mins (Q2_K, Q4_K, Q5_K) multiply the activation sums of 16
// (bsums) with one vpmaddwd. Each super-block so yields the exact integer sums of the scalar kernel,
// spread over 16 lanes, converted and accumulated in float with d * d_x (and dmin * d_x): results
// equal the scalar path to float rounding.
//
// At one token the weights are read once and each byte takes part in one product, so what bounds the
// speed is the unpacking of a super-block, not the products: every unpack here is a few whole-vector
// operations (scales included: no scalar loop, no store of scalars reloaded as a vector, which would
// stall on store forwarding). Where the packed order of a kind is not the element order, the
// activations are permuted to the weights' order instead (once per token and super-block, shared by
// every row of the micro-kernel): Q4_K / Q5_K nibbles of 64 bytes are elements [0, 32) + [64, 96)
// (low) and [32, 64) + [96, 128) (high); IQ4_XS's are groups of 16 per 128-bit lane.
//
// Micro-kernel: up to 4 weight rows x 4 tokens; per super-block a row is unpacked once and used for
// every token (the loop is matmul_q8k_driver.h's, shared with the AVX2 kernels).

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
constexpr int kOrWithMask = 0xF8;  // vpternlog: a | (b & c)

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline float fp16(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }
inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i loadu256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m512i loadu512(const uint8_t* p) { return _mm512_loadu_si512(p); }
// The 32 bytes at p in both halves of a zmm.
inline __m512i load_twice(const uint8_t* p) { return _mm512_broadcast_i64x4(loadu256(p)); }
inline __m512i byte_mask(int m) { return _mm512_set1_epi8(static_cast<char>(m)); }

// (v >> shift) & mask per byte (shift < 8: a 16-bit shift moves no bit of a byte's neighbour below
// the mask).
inline __m256i bits(__m256i v, int shift, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}
// [lo | hi]: the 32 bytes of lo, then those of hi.
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// 16-bit lanes 0-15 = a, lanes 16-31 = b.
inline __m512i halves16(int16_t a, int16_t b) {
    return _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1);
}
// Every byte of v shifted so that its bit `from_lo` (lower 32 bytes) / `from_hi` (upper 32 bytes)
// lands on bit `to`; other bits are garbage (the caller masks). Bits never cross into a neighbouring
// byte below the mask: the shifts stay within the byte for the bits kept.
// REQUIRES: both bits move the same way (both at or below `to`, or both at or above).
inline __m512i move_bits(__m512i v, int from_lo, int from_hi, int to) {
    if (from_lo <= to && from_hi <= to) {
        return _mm512_sllv_epi16(v, halves16(static_cast<int16_t>(to - from_lo), static_cast<int16_t>(to - from_hi)));
    }
    return _mm512_srlv_epi16(v, halves16(static_cast<int16_t>(from_lo - to), static_cast<int16_t>(from_hi - to)));
}

// Order of the activations the kinds' chunks line up with.
enum class XOrder {
    kElements,  // chunk q = elements [64 q, 64 q + 64)
    kK4,        // chunk 2 h + a = elements 128 h + 32 a + [0, 32) and + 64 (Q4_K, Q5_K nibbles)
    kIq4,       // chunk 2 h + a: 128-bit lane j = elements 128 h + 32 j + 16 a + [0, 16) (IQ4_XS nibbles)
};

// One unpacked weight super-block: 4 chunks of 64 unsigned values, the group scale of each pair of
// values (int16), the int16 coefficients of the 16 bsums (offsets, mins) and the super-scales.
// IQ4_XS: the values are |w| and neg[q] marks the negative ones.
struct Unpacked {
    __m512i v[4];
    __m512i sc[4];
    __mmask64 neg[4];
    __m256i corr;  // kinds with an offset: -offset * scale per group of 16, times the bsums
    __m256i mins;  // kinds with dmin: the min of each group of 16
    float d;
    float dmin;
};

// One activation super-block: the 4 chunks in the weight kind's order, the bsums and the scale.
struct X {
    __m512i q[4];
    __m256i bs;
    float dx;
};

// sc[q] for kinds in element order from the 16 int16 scales of the groups of 16: int16 lane i of
// chunk q covers values 64 q + 2 i and + 1, of group 4 q + i / 8.
inline void chunk_scales16(__m256i s16, Unpacked& u) {
    const __m512i s = _mm512_castsi256_si512(s16);
    const __m512i base = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,  //
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int q = 0; q < 4; ++q) {
        u.sc[q] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<int16_t>(4 * q))), s);
    }
}
// -offset * scale per group of 16 (|scale| <= 128, offset <= 32: fits int16).
inline __m256i offset_corr(__m256i s16, int log2_offset) {
    return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_sll_epi16(s16, _mm_cvtsi32_si128(log2_offset)));
}

struct Q2_KW {
    static constexpr size_t kBytes = sizeof(BlockQ2_K);
    static constexpr XOrder kOrder = XOrder::kElements;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static constexpr bool kCorr = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ2_K*>(p);
        // chunk q: elements 128 h + 32 s + l for h = q / 2, s = 2 (q % 2) and + 1; two bits at 2 s of qs[32 h + l]
        for (int q = 0; q < 4; ++q) {
            const __m256i qs = loadu256(b->qs + 32 * (q / 2));
            const int s = 2 * (q % 2);
            u.v[q] = join(bits(qs, 2 * s, 3), bits(qs, 2 * s + 2, 3));
        }
        const __m256i s = _mm256_cvtepu8_epi16(loadu128(b->scales));  // scale: low nibble, min: high nibble
        chunk_scales16(_mm256_and_si256(s, _mm256_set1_epi16(15)), u);
        u.mins = _mm256_srli_epi16(s, 4);
        u.d = fp16(p + offsetof(BlockQ2_K, d));
        u.dmin = fp16(p + offsetof(BlockQ2_K, dmin));
    }
};

struct Q3_KW {
    static constexpr size_t kBytes = sizeof(BlockQ3_K);
    static constexpr XOrder kOrder = XOrder::kElements;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static constexpr bool kCorr = true;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ3_K*>(p);
        const __m256i hm = loadu256(b->hmask);
        for (int q = 0; q < 4; ++q) {
            // as Q2_K, plus the high bit (+4) of element 32 j + l at bit j of hmask[l], j = 2 q and 2 q + 1
            const __m256i qs = loadu256(b->qs + 32 * (q / 2));
            const int s = 2 * (q % 2);
            const __m256i lo = _mm256_or_si256(bits(qs, 2 * s, 3), _mm256_slli_epi16(bits(hm, 2 * q, 1), 2));
            const __m256i hi = _mm256_or_si256(bits(qs, 2 * s + 2, 3), _mm256_slli_epi16(bits(hm, 2 * q + 1, 1), 2));
            u.v[q] = join(lo, hi);
        }
        // kq::q3_k_scale for all 16: the low nibble of byte i % 8 (high half for i >= 8), the top 2 bits
        // from byte 8 + i % 4 at bit 2 (i / 4); stored as scale + 32. The 12 bytes are read as 8 + 4 (a
        // 16-byte load would pass the end of the block).
        const __m128i lo8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->scales)));
        const __m128i m4 = _mm_set1_epi16(15);
        const __m256i lo = _mm256_set_m128i(_mm_srli_epi16(lo8, 4), _mm_and_si128(lo8, m4));
        const __m256i h4 = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(load_u32(b->scales + 8)))));
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi16(h4, _mm256_setr_epi16(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)), _mm256_set1_epi16(3));
        const __m256i s16 = _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi16(32));
        chunk_scales16(s16, u);
        u.corr = offset_corr(s16, 2);  // values are stored as q + 4
        u.d = fp16(p + offsetof(BlockQ3_K, d));
        u.dmin = 0.0f;
    }
};

// Q4_K and Q5_K: byte 32 c + l of qs holds element 64 c + l (low nibble) and 64 c + 32 + l (high), so
// 64 bytes give chunk 2 h (low nibbles: elements 128 h + [0, 32) and + [64, 96)) and 2 h + 1 (high).
// Q5_K's fifth bit of element 32 j + l is bit j of qh[l]. The 8 six-bit scales and mins are unpacked
// as in kq::scale_min_k4, four at a time in 32-bit lanes.
template <typename Block, bool kFifth>
struct K4W {
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr XOrder kOrder = XOrder::kK4;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = true;
    static constexpr bool kCorr = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const Block*>(p);
        const __m512i m4 = byte_mask(0x0F);
        for (int h = 0; h < 2; ++h) {
            const __m512i qs = loadu512(b->qs + 64 * h);
            u.v[2 * h] = _mm512_and_si512(qs, m4);
            u.v[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
        }
        if constexpr (kFifth) {
            // chunk 2 h + a: elements 32 j + l with j = 4 h + a (lower half) and 4 h + a + 2 (upper)
            const __m512i qh = load_twice(b->qh);
            const __m512i bit4 = byte_mask(0x10);
            for (int q = 0; q < 4; ++q) {
                const int j = 4 * (q / 2) + q % 2;
                u.v[q] = _mm512_ternarylogic_epi32(u.v[q], move_bits(qh, j, j + 2, 4), bit4, kOrWithMask);
            }
        }
        // 32-bit words w0 w1 w2 of the 12 scale bytes -> [sc0-3 | sc4-7 | m0-3 | m4-7]:
        //   sc0-3 = w0 & 63, sc4-7 = (w2 & 15) | (w0 >> 6) << 4, m0-3 = w1 & 63, m4-7 = (w2 >> 4 & 15) | (w1 >> 6) << 4
        const __m128i w = loadu128(b->scales);  // 12 bytes + 4 of what follows in the block
        const __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
        const __m128i t = _mm_srli_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)), 2);
        const __m128i sm = _mm_or_si128(_mm_and_si128(a, _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F)),
                                        _mm_and_si128(t, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
        const __m256i s16 = _mm256_cvtepu8_epi16(sm);  // int16 lanes: sc0..sc7, m0..m7
        const __m512i s = _mm512_castsi256_si512(s16);
        // chunk 2 h + a: lanes 0-15 of group 4 h + a, lanes 16-31 of group 4 h + a + 2 (of 32)
        for (int q = 0; q < 4; ++q) {
            const int g = 4 * (q / 2) + q % 2;
            u.sc[q] = _mm512_permutexvar_epi16(halves16(static_cast<int16_t>(g), static_cast<int16_t>(g + 2)), s);
        }
        // the min of group of 32 number i / 2 for bsum i
        u.mins = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), s16);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(p + offsetof(Block, d)))));
        static_assert(offsetof(Block, dmin) == offsetof(Block, d) + 2);
        u.d = _mm_cvtss_f32(dd);
        u.dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
    }
};
using Q4_KW = K4W<BlockQ4_K, false>;
using Q5_KW = K4W<BlockQ5_K, true>;

struct Q6_KW {
    static constexpr size_t kBytes = sizeof(BlockQ6_K);
    static constexpr XOrder kOrder = XOrder::kElements;
    static constexpr bool kSigned = false;
    static constexpr bool kMin = false;
    static constexpr bool kCorr = true;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockQ6_K*>(p);
        // One load per chunk and the top bits joined from two 256-bit halves: unpacking two chunks from
        // each load with variable shifts (as Q5_K) is faster from L2 but slower with the weights streaming
        // from DRAM (measured on Zen 4 in 64-row tiles), which is what decoding does.
        for (int q = 0; q < 4; ++q) {
            // chunk q = elements 128 h + 64 a + m (h = q / 2, a = q % 2, m < 64): nibble a of ql[64 h + m],
            // top bits at 2 (2 a + m / 32) of qh[32 h + m % 32]
            const int h = q / 2, a = q % 2;
            const __m512i ql =
                _mm512_and_si512(_mm512_srl_epi16(loadu512(b->ql + 64 * h), _mm_cvtsi32_si128(4 * a)), byte_mask(0x0F));
            const __m256i qh = loadu256(b->qh + 32 * h);
            const __m512i top = join(bits(qh, 4 * a, 3), bits(qh, 4 * a + 2, 3));
            u.v[q] = _mm512_or_si512(ql, _mm512_slli_epi16(top, 4));
        }
        const __m256i s16 = _mm256_cvtepi8_epi16(loadu128(reinterpret_cast<const uint8_t*>(b->scales)));
        chunk_scales16(s16, u);
        u.corr = offset_corr(s16, 5);  // values are stored as q + 32
        u.d = fp16(p + offsetof(BlockQ6_K, d));
        u.dmin = 0.0f;
    }
};

// IQ4_XS: group g of 32 is qs[16 g ..], elements 32 g + l in the low nibbles and 32 g + 16 + l in the
// high ones; 64 bytes give chunk 2 h (low nibbles of groups 4 h .. 4 h + 3, one per 128-bit lane) and
// 2 h + 1 (high nibbles).
struct Iq4_XSW {
    static constexpr size_t kBytes = sizeof(BlockIQ4_XS);
    static constexpr XOrder kOrder = XOrder::kIq4;
    static constexpr bool kSigned = true;
    static constexpr bool kMin = false;
    static constexpr bool kCorr = false;
    static void unpack(const uint8_t* p, Unpacked& u) {
        const auto* b = reinterpret_cast<const BlockIQ4_XS*>(p);
        const __m512i table = _mm512_broadcast_i32x4(
            _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
        const __m512i m4 = byte_mask(0x0F);
        for (int h = 0; h < 2; ++h) {
            const __m512i qs = loadu512(b->qs + 64 * h);
            const __m512i nib[2] = {_mm512_and_si512(qs, m4), _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4)};
            for (int a = 0; a < 2; ++a) {
                const __m512i w = _mm512_shuffle_epi8(table, nib[a]);
                u.neg[2 * h + a] = _mm512_movepi8_mask(w);
                u.v[2 * h + a] = _mm512_abs_epi8(w);
            }
        }
        // kq::iq4_xs_scale for the 8 groups: low nibble from scales_l[g / 2], top 2 bits at 2 g of scales_h
        const __m128i l = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(load_u32(b->scales_l))));
        const __m128i lo = _mm_unpacklo_epi16(_mm_and_si128(l, _mm_set1_epi16(15)), _mm_srli_epi16(l, 4));
        const __m128i hi = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16(static_cast<int16_t>(b->scales_h)),
                                                        _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                         _mm_set1_epi16(3));
        const __m128i s8 = _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
        const __m512i s = _mm512_castsi128_si512(s8);
        // chunk 2 h + a: 128-bit lane j is group 4 h + j
        for (int h = 0; h < 2; ++h) {
            const __m512i idx = _mm512_add_epi16(
                _mm512_set1_epi16(static_cast<int16_t>(4 * h)),
                _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
            u.sc[2 * h] = u.sc[2 * h + 1] = _mm512_permutexvar_epi16(idx, s);
        }
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
    using X = avx512::X;
    static Acc zero() { return _mm512_setzero_ps(); }
    static float reduce(Acc acc) { return _mm512_reduce_add_ps(acc); }
    template <class W>
    static X load_x(const uint8_t* row, int64_t nb, int64_t b) {
        X x;
        const uint8_t* xq = row + 256 * b;
        for (int h = 0; h < 2; ++h) {
            const __m512i x0 = _mm512_load_si512(xq + 128 * h), x1 = _mm512_load_si512(xq + 128 * h + 64);
            if constexpr (W::kOrder == XOrder::kElements) {
                x.q[2 * h] = x0;
                x.q[2 * h + 1] = x1;
            } else if constexpr (W::kOrder == XOrder::kK4) {  // 128-bit lanes [0 1 | 0 1] and [2 3 | 2 3]
                x.q[2 * h] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(1, 0, 1, 0));
                x.q[2 * h + 1] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 2, 3, 2));
            } else {  // kIq4: lanes [0 2 | 0 2] and [1 3 | 1 3]
                x.q[2 * h] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
                x.q[2 * h + 1] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
            }
        }
        x.bs = loadu256(row + nb * 260 + 32 * b);
        x.dx = reinterpret_cast<const float*>(row + nb * 256)[b];
        return x;
    }
    template <class W>
    static Acc block(const Unpacked& u, const X& x, Acc acc) {
        // two dependency chains of vpdpwssd instead of one of four
        __m512i isum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        if constexpr (W::kCorr) isum[0] = _mm512_zextsi256_si512(_mm256_madd_epi16(u.corr, x.bs));
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            __m512i xv = x.q[q];
            if constexpr (W::kSigned) xv = _mm512_mask_sub_epi8(xv, u.neg[q], _mm512_setzero_si512(), xv);
            isum[q % 2] = _mm512_dpwssd_epi32(isum[q % 2], _mm512_maddubs_epi16(u.v[q], xv), u.sc[q]);
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[0], isum[1])), _mm512_set1_ps(u.d * x.dx), acc);
        if constexpr (W::kMin) {
            const __m512i msum = _mm512_zextsi256_si512(_mm256_madd_epi16(u.mins, x.bs));
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_set1_ps(u.dmin * x.dx), acc);
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
