// ATTENTION for prompts, on the tensor cores (flash-attention-2 style): the same function as
// cpu/ops_attention.cpp for F16 K/V caches and head sizes 64, 128 and 192.
//
// A block takes one KV head g and kRows query rows, where the rows of a KV head are its (token,
// query head of the group) pairs in token-major order: every K/V tile the block loads serves all the
// group's heads of kRows / group tokens, and the causal diagonal of a block is only that many keys
// wide. Each of the kWarps warps owns 16 rows, the M of one mma.sync m16n8k16.
//
// The block walks the union of its rows' key ranges in tiles of kKeys keys. K and V tiles travel
// from global to shared memory with cp.async, the next tile's while the current one is computed
// (two stages; keys past the range are zero-filled, so p = 0 never meets a NaN of an unused cache
// row). Per tile and warp:
//   S = Q K^T   Q (pre-scaled by scale * log2 e, rounded to F16) in registers for the whole walk,
//               K fragments by ldmatrix, F32 accumulators;
//   mask        only on tiles that some row of the warp sees in part (diagonal, window edge, tail);
//   softmax     online, in base 2, in F32 registers: a row's max over the 4 lanes that hold it;
//   O += P V    P rounded to F16 straight from the S accumulators (their layout is the A operand's),
//               V fragments by ldmatrix.trans, F32 accumulators.
// A warp skips the tiles none of its rows can see, so a sliding window costs O(window) at any depth.
// The finished rows meet the sink logit (as in the FP32 kernel) and go straight to dst.
//
// Rounding: Q and P are F16 (11 significant bits) where the CPU keeps F32; K and V are F16 in both.
// Shared memory rows are padded by 8 halves so the 8 rows of an ldmatrix hit distinct banks.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/ops_attention_mma.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

struct MmaArgs {
    View q, k, v, d;
    const int32_t* pos;
    const float* sinks;  // nullptr: none
    float q_scale;       // scale * log2 e: scores come out in base-2 units
    int window;
    int n_kv;
    int group;      // query heads per KV head
    int n_head_kv;
    int64_t n_tok;
    int64_t n_tiles;  // row tiles per KV head
};

template <int D>
struct Layout {
    static constexpr int kStride = D + 8;          // halves per shared K/V row (padded)
    static constexpr int kTile = kKeys * kStride;  // halves per K (or V) tile
    static constexpr size_t kBytes = 2 * 2 * static_cast<size_t>(kTile) * sizeof(__half);  // 2 stages x (K, V)
    static constexpr int kChunksPerRow = D / 8;    // 16-byte chunks
    static constexpr int kLoads = kKeys * kChunksPerRow / kThreads;  // per thread, per K (or V) tile
    static_assert(kKeys * kChunksPerRow % kThreads == 0, "tile chunks must split evenly over the threads");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; !full writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// c += a b: a 16x16 F16 (row-major fragment), b 16x8 F16 (column-major fragment), c 16x8 F32.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (lo, hi) as an F16 pair, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x by the special-function unit; results below 2^-126 flush to 0 (a weight that small adds
// nothing next to the row's largest, which is 1).
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Query row f of KV head g: its (head, token), or nullptr past the last row.
__device__ __forceinline__ const float* q_row(const MmaArgs& a, int g, int64_t f) {
    if (f >= a.n_tok * a.group) return nullptr;
    const int64_t t = f / a.group, h = static_cast<int64_t>(g) * a.group + f % a.group;
    return reinterpret_cast<const float*>(ops::row_at(a.q, h, t, 0));
}

// Writes one finished row: O / (sum of exps, the sink's included), in dst's (head, token) row.
template <int D>
__device__ __forceinline__ void store_row(const MmaArgs& a, int g, int64_t f, const float (&o)[D / 8][4], int half,
                                          float m, float l, int c0) {
    if (f >= a.n_tok * a.group) return;
    const int64_t t = f / a.group, h = static_cast<int64_t>(g) * a.group + f % a.group;
    const float sink = a.sinks != nullptr ? a.sinks[h] * kLog2e : -INFINITY;
    const float mx = fmaxf(sink, m);
    float w = 0.0f, inv = 0.0f;
    if (mx != -INFINITY) {  // some key or a sink
        w = m == -INFINITY ? 0.0f : exp2f(m - mx);
        const float total = (a.sinks != nullptr ? exp2f(sink - mx) : 0.0f) + w * l;
        inv = total > 0.0f ? w / total : 0.0f;
    }
    auto* out = reinterpret_cast<float*>(ops::row_at(a.d, h, t, 0));
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        out[dt * 8 + c0] = o[dt][2 * half] * inv;
        out[dt * 8 + c0 + 1] = o[dt][2 * half + 1] * inv;
    }
}

template <int D>
__global__ void __launch_bounds__(kThreads, D <= 64 ? 2 : 1) attention_mma_kernel(const __grid_constant__ MmaArgs a) {
    pdl_grid_sync();
    using L = Layout<D>;
    extern __shared__ uint4 smem_raw[];
    __half* kv_smem = reinterpret_cast<__half*>(smem_raw);  // [stage][K, V][kKeys][kStride]
    __shared__ int s_lo[kRows], s_hi[kRows];
    __shared__ int s_blo, s_bhi;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = static_cast<int>(blockIdx.x % a.n_head_kv);
    const int64_t tile = a.n_tiles - 1 - blockIdx.x / a.n_head_kv;  // the longest (latest) tiles first
    const int64_t row0 = tile * kRows;
    const int64_t n_rows = a.n_tok * a.group;

    // Each row's key range (one thread each) and the block's union of them.
    if (tid == 0) {
        s_blo = a.n_kv;
        s_bhi = 0;
    }
    __syncthreads();
    if (tid < kRows) {
        int lo = 0, hi = 0;
        if (row0 + tid < n_rows) attention_key_range(a.pos[(row0 + tid) / a.group], a.n_kv, a.window, lo, hi);
        s_lo[tid] = lo;
        s_hi[tid] = hi;
        if (lo < hi) {
            atomicMin(&s_blo, lo);
            atomicMax(&s_bhi, hi);
        }
    }
    __syncthreads();
    const int k_begin = s_blo, k_end = max(s_bhi, s_blo);

    // This lane's two rows (the fragment rows lane / 4 and lane / 4 + 8 of the warp's 16) and the
    // warp's bounds: [w_lo, w_hi) some row sees, [all_lo, all_hi) every row sees.
    const int c0 = (lane % 4) * 2;
    const int ra = warp * 16 + lane / 4, rb = ra + 8;
    const int lo_a = s_lo[ra], hi_a = s_hi[ra], lo_b = s_lo[rb], hi_b = s_hi[rb];
    const int w_lo = __reduce_min_sync(0xffffffffu, min(lo_a < hi_a ? lo_a : INT_MAX, lo_b < hi_b ? lo_b : INT_MAX));
    const int w_hi = __reduce_max_sync(0xffffffffu, max(lo_a < hi_a ? hi_a : 0, lo_b < hi_b ? hi_b : 0));
    const int all_lo = __reduce_max_sync(0xffffffffu, max(lo_a, lo_b));
    const int all_hi = __reduce_min_sync(0xffffffffu, min(hi_a, hi_b));

    // Q fragments (A operands of S = Q K^T), for the whole walk.
    uint32_t qf[D / 16][4];
    {
        const float* qa = q_row(a, g, row0 + ra);
        const float* qb = q_row(a, g, row0 + rb);
        const float s = a.q_scale;
        const auto at = [s](const float* r, int e) { return r != nullptr ? r[e] * s : 0.0f; };
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const int e = kk * 16 + c0;
            qf[kk][0] = pack_f16(at(qa, e), at(qa, e + 1));
            qf[kk][1] = pack_f16(at(qb, e), at(qb, e + 1));
            qf[kk][2] = pack_f16(at(qa, e + 8), at(qa, e + 9));
            qf[kk][3] = pack_f16(at(qb, e + 8), at(qb, e + 9));
        }
    }

    // K and V tile of keys [j0, j0 + kKeys) into stage `stage`, as one cp.async group.
    const auto load_tile = [&](int stage, int j0) {
        __half* ks = kv_smem + stage * 2 * L::kTile;
        __half* vs = ks + L::kTile;
#pragma unroll
        for (int u = 0; u < L::kLoads; ++u) {
            const int c = u * kThreads + tid;
            const int j = c / L::kChunksPerRow, e = (c % L::kChunksPerRow) * 8;
            const bool full = j0 + j < k_end;
            const int key = full ? j0 + j : k_begin;  // a valid address even where nothing is read
            const int off = j * L::kStride + e;
            cp_async16(smem_addr(ks + off), ops::row_at(a.k, g, key, 0) + e * 2, full);
            cp_async16(smem_addr(vs + off), ops::row_at(a.v, g, key, 0) + e * 2, full);
        }
        cp_async_commit();
    };

    // ldmatrix row addresses of this lane within a tile (bytes). K, non-transposed, matrices
    // (keys 0-7, dims 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): b0, b1 of two 8-key n-tiles.
    // V, transposed, matrices (keys 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): b0, b1
    // of two 8-dim n-tiles.
    const uint32_t k_lane = ((lane / 16 * 8 + lane % 8) * L::kStride + (lane / 8 % 2) * 8) * 2;
    const uint32_t v_lane = ((lane / 8 % 2 * 8 + lane % 8) * L::kStride + (lane / 16) * 8) * 2;
    const uint32_t smem0 = smem_addr(kv_smem);

    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's columns only

    const int n_iter = (k_end - k_begin + kKeys - 1) / kKeys;
    if (n_iter > 0) load_tile(0, k_begin);
    for (int it = 0; it < n_iter; ++it) {
        const int j0 = k_begin + it * kKeys;
        if (it + 1 < n_iter) {
            load_tile((it + 1) % 2, j0 + kKeys);
        } else {
            cp_async_commit();  // an empty group: "all but the newest group" stays this tile
        }
        cp_async_wait_one();
        __syncthreads();  // this tile's chunks from every thread are in shared memory

        if (j0 + kKeys > w_lo && j0 < w_hi) {  // some row of the warp sees some key of the tile
            const uint32_t ks = smem0 + static_cast<uint32_t>((it % 2) * 2 * L::kTile * 2);
            const uint32_t vs = ks + static_cast<uint32_t>(L::kTile * 2);

            float s[kKeys / 8][4];
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
                for (int n2 = 0; n2 < kKeys / 16; ++n2) {
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4(ks + k_lane + static_cast<uint32_t>((n2 * 16 * L::kStride + kk * 16) * 2), b0, b1, b2, b3);
                    mma_f16(s[2 * n2], qf[kk], b0, b1);
                    mma_f16(s[2 * n2 + 1], qf[kk], b2, b3);
                }
            }

            if (!(j0 >= all_lo && j0 + kKeys <= all_hi)) {  // some key is hidden from some row
#pragma unroll
                for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = j0 + nt * 8 + c0 + e;
                        if (key < lo_a || key >= hi_a) s[nt][e] = -INFINITY;
                        if (key < lo_b || key >= hi_b) s[nt][2 + e] = -INFINITY;
                    }
                }
            }

            // Online softmax, base 2.
            float mx_a = m_a, mx_b = m_b;
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt) {
                mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
                mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
            }
            mx_a = quad_max(mx_a);
            mx_b = quad_max(mx_b);
            const float base_a = mx_a == -INFINITY ? 0.0f : mx_a;  // no key yet: p = 0, corr = 0
            const float base_b = mx_b == -INFINITY ? 0.0f : mx_b;
            const float corr_a = exp2_fast(m_a - base_a), corr_b = exp2_fast(m_b - base_b);
            m_a = mx_a;
            m_b = mx_b;
            l_a *= corr_a;
            l_b *= corr_b;
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                o[dt][0] *= corr_a;
                o[dt][1] *= corr_a;
                o[dt][2] *= corr_b;
                o[dt][3] *= corr_b;
            }
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt) {
                s[nt][0] = exp2_fast(s[nt][0] - base_a);
                s[nt][1] = exp2_fast(s[nt][1] - base_a);
                s[nt][2] = exp2_fast(s[nt][2] - base_b);
                s[nt][3] = exp2_fast(s[nt][3] - base_b);
                l_a += s[nt][0] + s[nt][1];
                l_b += s[nt][2] + s[nt][3];
            }

            // O += P V, 16 keys per step.
#pragma unroll
            for (int kt = 0; kt < kKeys / 16; ++kt) {
                const uint32_t p[4] = {pack_f16(s[2 * kt][0], s[2 * kt][1]), pack_f16(s[2 * kt][2], s[2 * kt][3]),
                                       pack_f16(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                                       pack_f16(s[2 * kt + 1][2], s[2 * kt + 1][3])};
#pragma unroll
                for (int d2 = 0; d2 < D / 16; ++d2) {
                    uint32_t b0, b1, b2, b3;
                    ldmatrix_x4_trans(vs + v_lane + static_cast<uint32_t>((kt * 16 * L::kStride + d2 * 16) * 2), b0, b1,
                                      b2, b3);
                    mma_f16(o[2 * d2], p, b0, b1);
                    mma_f16(o[2 * d2 + 1], p, b2, b3);
                }
            }
        }
        __syncthreads();  // the stage is read by every warp before the next-but-one tile lands in it
    }

    store_row<D>(a, g, row0 + ra, o, 0, m_a, quad_sum(l_a), c0);
    store_row<D>(a, g, row0 + rb, o, 1, m_b, quad_sum(l_b), c0);
}

template <int D>
Status launch(const MmaArgs& a, cudaStream_t stream) {
    constexpr size_t shm = Layout<D>::kBytes;
    if constexpr (shm > 48 * 1024) {
        MOE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(attention_mma_kernel<D>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(shm)));
    }
    const int64_t blocks = a.n_tiles * a.n_head_kv;
    return launch_kernel("attention_mma_kernel", attention_mma_kernel<D>, static_cast<unsigned int>(blocks), kThreads,
                         shm, stream, a);
}

}  // namespace

bool attention_mma_fits(const Tensor& dst) {
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    const Tensor& v = *dst.src[2];
    return (q.ne[0] == 64 || q.ne[0] == 128 || q.ne[0] == 192) && k.type == Type::F16 && v.type == Type::F16 &&
           q.ne[2] >= kAttnMmaMinTokens && rows_aligned16(k) && rows_aligned16(v);
}

Status attention_mma(Tensor& dst, cudaStream_t stream) {
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    MmaArgs a{};
    set_attention_operands(a, dst);
    a.q_scale = dst.params.f[0] * kLog2e;
    a.group = static_cast<int>(q.ne[1] / k.ne[1]);
    a.n_head_kv = static_cast<int>(k.ne[1]);
    a.n_tok = q.ne[2];
    a.n_tiles = (a.n_tok * a.group + kRows - 1) / kRows;
    if (a.n_tiles * a.n_head_kv > INT32_MAX) {
        return invalid_argument("ATTENTION: " + std::to_string(a.n_tiles * a.n_head_kv) + " blocks is too many");
    }
    if (q.ne[0] == 64) return launch<64>(a, stream);
    if (q.ne[0] == 192) return launch<192>(a, stream);  // deepseek2's prefill: 128 nope + 64 rope dims
    return launch<128>(a, stream);
}

}  // namespace moe::cuda
