// Device-side pieces shared by the CUDA matrix-product kernels (cuda/matmul_*.cu): how a 32-element
// block of each weight type is decoded from bytes staged in shared memory, bounds-guarded loads of
// weight bytes, BF16 packing, the gated activations, and the tensor-core primitives.
//
// Weight blocks are 34 (Q8_0), 18 (Q4_0) or 17 (MXFP4) bytes, so a block can start at any byte
// address. Kernels therefore copy weight bytes with aligned 16- or 4-byte loads into shared memory,
// keeping the source misalignment, and decode each block from there with funnel shifts
// (qd::words_at, core/quant_decode_words.h), which turn any byte offset into aligned 32-bit words.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/quant_decode_words.h"
#include "core/tensor.h"
#include "core/types.h"

namespace moe::cuda::mm {

// Bytes of one 32-element block (for float types: 32 elements).
__host__ __device__ constexpr int block_bytes(Type t) {
    return t == Type::F32 ? 128 : t == Type::F16 || t == Type::BF16 ? 64 : t == Type::Q8_0 ? 34 : t == Type::Q4_0 ? 18 : 17;
}
__host__ __device__ constexpr bool is_quant(Type t) { return t == Type::Q8_0 || t == Type::Q4_0 || t == Type::MXFP4; }

// ---- bytes ----

// The 16 bytes at p (16-byte aligned); where [p, p + 16) leaves [lo, hi), only the bytes inside are
// read and the others are 0. Weights are streamed once, hence the non-coherent path.
__device__ __forceinline__ uint4 load16_guarded(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
    if (p >= lo && p + 16 <= hi) return __ldg(reinterpret_cast<const uint4*>(p));
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        if (p + i >= lo && p + i < hi) w[i / 4] |= static_cast<uint32_t>(p[i]) << (8 * (i % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The same for 4 bytes at a 4-byte aligned p.
__device__ __forceinline__ uint32_t load4_guarded(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
    if (p >= lo && p + 4 <= hi) return __ldg(reinterpret_cast<const uint32_t*>(p));
    uint32_t w = 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (p + i >= lo && p + i < hi) w |= static_cast<uint32_t>(p[i]) << (8 * i);
    }
    return w;
}

template <int A, typename T>
__device__ __forceinline__ const uint8_t* align_down(const T* p) {
    return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(A - 1));
}

// ---- scalar formats ----

__device__ __forceinline__ float fp16_bits_to_float(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}
__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float((bits & 0xFFFFu) << 16); }

// MXFP4's scale 2^(e - 128) (the e2m1 values are stored doubled), as core/types.cpp computes it.
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return __uint_as_float(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
}

// Four e2m1 nibbles (one per byte, values 0..15) -> their doubled values as four int8 bytes
// (kMxfp4Values): two byte permutes over the 16-entry table, chosen per byte by the nibble's bit 3.
__device__ __forceinline__ uint32_t mxfp4_lut4(uint32_t nib4) {
    const uint32_t lo3 = nib4 & 0x07070707u;
    const uint32_t y = lo3 | (lo3 >> 4);
    const uint32_t sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel);  // 0 1 2 3 4 6 8 12
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);  // 0 -1 -2 -3 -4 -6 -8 -12
    const uint32_t m = ((nib4 >> 3) & 0x01010101u) * 0xFFu;
    return (pos & ~m) | (neg & m);
}

__device__ __forceinline__ int sbyte(uint32_t w, int b) { return static_cast<int8_t>((w >> (8 * b)) & 0xFFu); }

// A 4-bit block (Q4_0 or MXFP4) at byte offset off of s: its scale as a float (MXFP4's E8M0 scale halved,
// see e8m0_half) and its 16 bytes of packed nibbles (elements j and 16 + j in the low / high nibble of
// byte j).
template <Type W>
__device__ __forceinline__ void nibble_block(const uint32_t* s, int off, float& scale, uint32_t (&q)[4]) {
    static_assert(W == Type::Q4_0 || W == Type::MXFP4, "4-bit blocks only");
    if constexpr (W == Type::Q4_0) {
        scale = fp16_bits_to_float(qd::word_at(s, off));
        qd::words_at<4>(s, off + 2, q);
    } else {
        scale = e8m0_half(qd::word_at(s, off) & 0xFFu);
        qd::words_at<4>(s, off + 1, q);
    }
}

// ---- a quantised block against Q8 activations (GEMV) ----

// Weight block as 8 words of int8 values in element order (words 0-3: elements 0-15, 4-7: 16-31)
// and its float scale: dot = scale * sum(dp4a(w, x)).
struct QBlock {
    int w[8];
    float scale;
};

template <Type W>
__device__ __forceinline__ QBlock load_qblock(const uint32_t* s, int off) {
    QBlock b;
    if constexpr (W == Type::Q8_0) {
        b.scale = fp16_bits_to_float(qd::word_at(s, off));
        uint32_t q[8];
        qd::words_at<8>(s, off + 2, q);
#pragma unroll
        for (int i = 0; i < 8; ++i) b.w[i] = static_cast<int>(q[i]);
    } else {
        uint32_t q[4];
        nibble_block<W>(s, off, b.scale, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lo = q[i] & 0x0F0F0F0Fu;
            const uint32_t hi = (q[i] >> 4) & 0x0F0F0F0Fu;
            if constexpr (W == Type::Q4_0) {
                b.w[i] = static_cast<int>(__vsub4(lo, 0x08080808u));
                b.w[i + 4] = static_cast<int>(__vsub4(hi, 0x08080808u));
            } else {
                b.w[i] = static_cast<int>(mxfp4_lut4(lo));
                b.w[i + 4] = static_cast<int>(mxfp4_lut4(hi));
            }
        }
    }
    return b;
}

__device__ __forceinline__ int qblock_dot(const QBlock& b, const int4& x0, const int4& x1) {
    int s = __dp4a(b.w[0], x0.x, 0);
    s = __dp4a(b.w[1], x0.y, s);
    s = __dp4a(b.w[2], x0.z, s);
    s = __dp4a(b.w[3], x0.w, s);
    s = __dp4a(b.w[4], x1.x, s);
    s = __dp4a(b.w[5], x1.y, s);
    s = __dp4a(b.w[6], x1.z, s);
    s = __dp4a(b.w[7], x1.w, s);
    return s;
}

// ---- any block to floats (GEMV float weights, dequantisation, tensor-core tiles) ----

// v[j] = element 16 h + j of the block at byte offset off of s (h = 0 or 1).
template <Type W>
__device__ __forceinline__ void decode_half(const uint32_t* s, int off, int h, float (&v)[16]) {
    if constexpr (W == Type::F32) {
        uint32_t w[16];
        qd::words_at<16>(s, off + 64 * h, w);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = __uint_as_float(w[i]);
    } else if constexpr (W == Type::F16 || W == Type::BF16) {
        uint32_t w[8];
        qd::words_at<8>(s, off + 32 * h, w);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if constexpr (W == Type::F16) {
                v[2 * i] = fp16_bits_to_float(w[i]);
                v[2 * i + 1] = fp16_bits_to_float(w[i] >> 16);
            } else {
                v[2 * i] = bf16_bits_to_float(w[i]);
                v[2 * i + 1] = bf16_bits_to_float(w[i] >> 16);
            }
        }
    } else if constexpr (W == Type::Q8_0) {
        const float d = fp16_bits_to_float(qd::word_at(s, off));
        uint32_t q[4];
        qd::words_at<4>(s, off + 2 + 16 * h, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int b = 0; b < 4; ++b) v[4 * i + b] = static_cast<float>(sbyte(q[i], b)) * d;
        }
    } else {
        uint32_t q[4];
        float d;
        nibble_block<W>(s, off, d, q);
        const int sh = 4 * h;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t nib = (q[i] >> sh) & 0x0F0F0F0Fu;
            const uint32_t vals = W == Type::Q4_0 ? __vsub4(nib, 0x08080808u) : mxfp4_lut4(nib);
#pragma unroll
            for (int b = 0; b < 4; ++b) v[4 * i + b] = static_cast<float>(sbyte(vals, b)) * d;
        }
    }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Four bytes (u - bias) * d -> two packed BF16 pairs, elements in byte order (qd::byte_minus: each byte
// made the float byte - bias exactly by a byte permute and one subtraction, cheaper than an integer-to-float
// conversion, which runs at a quarter of the rate of float adds).
__device__ __forceinline__ void bytes_scaled_bf16(uint32_t u, float magic_plus_bias, float d, uint32_t& lo,
                                                  uint32_t& hi) {
    lo = pack_bf16x2(qd::byte_minus(u, 0, magic_plus_bias) * d, qd::byte_minus(u, 1, magic_plus_bias) * d);
    hi = pack_bf16x2(qd::byte_minus(u, 2, magic_plus_bias) * d, qd::byte_minus(u, 3, magic_plus_bias) * d);
}

// Sixteen bytes (u - bias) * d -> 8 packed BF16 pairs, elements in byte order: the FMA form of
// quant_decode.h (qd::byte_fma: one byte permute and one FMA, where byte_minus * d takes a permute, a
// subtraction and a product) for a finite d, byte_minus * d otherwise (one branch per half block). Exact
// for a finite FP16 d and bias 8 or 128: the product is exact inside the FMA and (2^15 + bias) d has at most
// 24 significant bits. It differs from byte_minus * d only in the sign of a zero (+0 where d < 0 gives -0),
// which no sum of products can tell apart.
__device__ __forceinline__ void bytes16_scaled_bf16(const uint32_t (&u)[4], float bias, float d, uint32_t (&out)[8]) {
    if (isfinite(d)) {
        const qd::OneFma f = qd::one_fma(d, bias, 0.0f);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[2 * i] = pack_bf16x2(qd::byte_fma(u[i], 0, f), qd::byte_fma(u[i], 1, f));
            out[2 * i + 1] = pack_bf16x2(qd::byte_fma(u[i], 2, f), qd::byte_fma(u[i], 3, f));
        }
    } else {
        constexpr float kMagic = 8388608.0f;  // 2^23
#pragma unroll
        for (int i = 0; i < 4; ++i) bytes_scaled_bf16(u[i], kMagic + bias, d, out[2 * i], out[2 * i + 1]);
    }
}

// a * b + c per BF16 lane, rounded once (fma.rn.bf16x2: exact intermediate, subnormals kept; sm_80+).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// decode_half's 16 values as 8 packed BF16 pairs: the same values, rounded to BF16 (RN), bit for bit,
// except that NaNs (inf / NaN scales only) may carry another payload and Q8_0's and Q4_0's zeros are
// +0 under a negative scale. Q8_0 and Q4_0 take the byte-permute + FMA conversion above (qd::byte_fma;
// Q8_0's signed bytes biased by 128 first; the A/B is in PERF.md, 2026-11-25). MXFP4 computes in BF16
// (fma.bf16x2, two values per instruction instead of F32 products and conversions: its expert GEMMs
// +5-9% in PERF.md's 2026-11-23 A/B, where the same change for Q4_0 gained nothing):
// the doubled e2m1 values k (0, 1, 2, 3, 4, 6, 8, 12, signed) are built as BF16 bit patterns by byte
// permutes (nibble 8, "-0", gives +0 like mxfp4_lut4), and the scale 2^(e - 128) is a BF16 exactly
// (e8m0_half's low 16 bits are 0). k * scale is (1 or 1.5) * 2^n with n >= -128: exact in F32 and in
// BF16 (whose subnormals reach 2^-133) up to n = 127, and inf in both from n = 128. So the BF16
// product (fma with -0: RN(x + -0) = x, zero signs kept) is RN(F32 k * scale).
// tests/cuda/test_decode_bf16.cpp checks every scale and value against the CPU's dequantisation.
template <Type W>
__device__ __forceinline__ void decode_half_bf16(const uint32_t* s, int off, int h, uint32_t (&out)[8]) {
    constexpr uint32_t kNegZero2 = 0x80008000u;
    if constexpr (W == Type::Q8_0) {
        const float d = fp16_bits_to_float(qd::word_at(s, off));
        uint32_t q[4];
        qd::words_at<4>(s, off + 2 + 16 * h, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] ^= 0x80808080u;  // signed bytes biased by 128
        bytes16_scaled_bf16(q, 128.0f, d, out);
    } else if constexpr (W == Type::MXFP4) {
        uint32_t q[4];
        float d;
        nibble_block<W>(s, off, d, q);
        const uint32_t db = __float_as_uint(d) >> 16;
        const uint32_t dd = db | (db << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t nib = (q[i] >> (4 * h)) & 0x0F0F0F0Fu;  // one nibble per byte
            const uint32_t lo3 = nib & 0x07070707u;                // |k|'s index 0..7
            const uint32_t y = lo3 | (lo3 >> 4);
            const uint32_t sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);
            // BF16 of 0, 1, 2, 3, 4, 6, 8, 12: high bytes, low bytes, and 0x80 where the value is not 0.
            const uint32_t hi = __byte_perm(0x40403F00u, 0x41414040u, sel);
            const uint32_t lo = __byte_perm(0x40008000u, 0x4000C080u, sel);
            const uint32_t nz = __byte_perm(0x80808000u, 0x80808080u, sel);
            const uint32_t hs = hi | ((nib << 4) & nz);  // the nibble's sign bit -> bit 7 of the high byte
            out[2 * i] = fma_bf16x2(__byte_perm(lo, hs, 0x5140u), dd, kNegZero2);
            out[2 * i + 1] = fma_bf16x2(__byte_perm(lo, hs, 0x7362u), dd, kNegZero2);
        }
    } else if constexpr (W == Type::Q4_0) {
        uint32_t q[4];
        float d;
        nibble_block<W>(s, off, d, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = (q[i] >> (4 * h)) & 0x0F0F0F0Fu;  // this half's nibbles, one per byte
        bytes16_scaled_bf16(q, 8.0f, d, out);
    } else {
        float v[16];
        decode_half<W>(s, off, h, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
    }
}

// 8 packed BF16 pairs -> two 16-byte stores (dst 16-byte aligned).
__device__ __forceinline__ void store_u32x8(void* dst, const uint32_t (&w)[8]) {
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// ---- gated activations (MOE_UP_GATE), the CPU's formulas ----

struct GluParams {
    const float* bias_up;    // [F, E] rows of bias_stride floats, or nullptr
    const float* bias_gate;
    int64_t bias_stride;
    int act;                 // Activation
    float alpha;
    float limit;
};

__device__ __forceinline__ float sigmoidf_(float x) {
    const float e = expf(-fabsf(x));
    const float inv = 1.0f / (1.0f + e);
    return x >= 0.0f ? inv : e * inv;
}

__device__ __forceinline__ float glu_apply(const GluParams& p, float g, float u) {
    if (p.act == static_cast<int>(Activation::SILU)) return g * sigmoidf_(g) * u;
    const float x = p.limit < g ? p.limit : g;                              // std::min(g, limit)
    const float y = u < -p.limit ? -p.limit : (p.limit < u ? p.limit : u);  // std::clamp
    return x * sigmoidf_(p.alpha * x) * (y + 1.0f);
}

// ---- tensor-core primitives (sm_80+) ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
// 4 bytes global -> shared, asynchronously, through L1 (dst and src 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's newest groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a (16x16, row-major) * b (16x8, column-major), BF16 inputs, F32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- F32 activation rows ----

// An F32 tensor [K, ne1, ne2, ne3] with contiguous rows, as its rows 0 .. ne1*ne2*ne3 - 1.
struct RowsF32 {
    const uint8_t* data;
    int64_t ne1, ne2;
    int64_t nb1, nb2, nb3;
};

__device__ __forceinline__ const float* row_f32(const RowsF32& x, int64_t r) {
    if (r < x.ne1) return reinterpret_cast<const float*>(x.data + r * x.nb1);  // most callers: no divisions
    const int64_t i1 = r % x.ne1;
    const int64_t i23 = r / x.ne1;
    return reinterpret_cast<const float*>(x.data + i1 * x.nb1 + (i23 % x.ne2) * x.nb2 + (i23 / x.ne2) * x.nb3);
}

}  // namespace moe::cuda::mm
