// ATTENTION, flash-style: causal, GQA, optional sliding window and sinks, K/V from the (F16 or F32)
// KV cache. The same function as cpu/ops_attention.cpp.
//
// Prompts with an F16 cache and D in {64, 128, 192} go to the tensor-core kernel (ops_attention_mma.cu,
// attention_mma_fits); this file's FP32 kernel takes the rest: decode, short prompts, F32 caches,
// other head sizes, unaligned views.
//
// A block takes one KV head g and a tile of R = 4 warps x rows_per_warp query rows, where the rows of
// a KV head are its (token, query head of the group) pairs in token-major order, so every K/V row a
// block loads serves all the group's heads of several tokens. The block walks the union of its rows'
// key ranges in tiles of 32 keys: K and V arrive in 16-byte chunks (the next tile's while the current
// one is computed, where registers allow) and are converted to F32 into shared memory once per tile,
// then each warp updates an online softmax (running max m, sum l, accumulator acc) for its rows in
// registers. Scores: lane j takes key j of the tile and dots it with each of the warp's query rows
// (K rows padded by 4 floats so the 16-byte loads of a quarter-warp hit 32 distinct banks). P.V:
// lane i owns output dims i, i+32, ...; the probabilities go through shared memory as broadcasts.
// Tiles that no row of a warp can see are skipped, so a sliding window costs O(window) at any depth.
//
// Decode (few rows) would leave most SMs idle, so the key range of each block is also split (split-K,
// grid z) down to kMinSplitKeys keys per split, at short contexts too: each split writes (m, l, acc)
// partials to scratch, counts itself in a per-(row tile, KV head) counter, and the last split to
// arrive merges the partials with the sink logit and resets the counter (threadfence reduction), so
// a decode step's attention is one launch. Without counters (ctx.attn_counters) a second kernel merges.
// The split count is chosen on the host from the shapes alone (positions are on the device); each
// block computes its real key range from the positions, so the choice only affects speed.
//
// Decoding (one row per warp) runs an instance compiled for one row, without the 8-row loops and
// registers. Where the output projection is a GEMV, the kernel also writes its result as that GEMV's
// Q8 activation rows (fusion_plan.h), which saves the projection's quantisation launch.
//
// Supported head sizes: D in {32, 64, 96, 128, 192, 256, 576 (deepseek2's latent attention; 192 its prompts)};
// K and V of one type (F16 or F32).
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/fusion_plan.h"
#include "cuda/launch.cuh"
#include "cuda/ops_attention_mma.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda {
namespace {

using ops::View;

constexpr int kBK = 32;              // keys per tile: one per lane
constexpr int kWarps = 4;            // warps per block
constexpr int kMaxRowsPerWarp = 8;   // register budget: acc is rows x D/32 floats per lane
constexpr int kThreads = kWarps * 32;
constexpr int kMinSplitKeys = 32;    // one key tile: a split-K chunk is never shorter
constexpr int kMaxSplit = 128;
constexpr int kBlocksPerSm = 4;      // split-K aims at this many blocks per SM (decode is latency-bound)
constexpr int kMergeWarps = 4;

struct AttnArgs {
    View q, k, v, d;
    const int32_t* pos;
    const float* sinks;  // nullptr: none
    float* part;         // split-K partials [n_split][T][H] x (m, l, acc[D]); nullptr when n_split == 1
    unsigned int* counters;  // split-K arrivals per (row tile, KV head); nullptr: attention_merge_kernel
    float scale;
    int window;
    int n_kv;
    int group;  // query heads per KV head
    int n_head;
    int64_t n_tok;
    int rows_per_warp;
    int n_split;
    bool kv_vec;  // K and V rows are 16-byte aligned: tiles load in 16-byte chunks
    // The result also as Q8 activation rows (ctx.q8_out; nullptr: none): token t's row at q8 + t *
    // q8_stride, int8 values of the n_head * D outputs, then their float scales per 32. A warp writes
    // a head's D outputs 32 at a time, so each Q8 block is one warp_quantize_q8_block, the rounding
    // quantize_q8_kernel would apply to the float result.
    uint8_t* q8;
    int64_t q8_stride;
};

// Writes output value o of (token t, head h, element lane + 32 * i) into the Q8 rows; every lane of
// the warp calls it with the same t, h, i.
template <int D>
__device__ __forceinline__ void store_q8(const AttnArgs& a, int64_t t, int64_t h, int i, float o, int lane) {
    uint8_t* row = a.q8 + t * a.q8_stride;
    const int64_t b = h * (D / 32) + i;  // the Q8 block
    ops::warp_quantize_q8_block(o, lane, reinterpret_cast<uint32_t*>(row + 32 * b),
                                reinterpret_cast<float*>(row + static_cast<int64_t>(a.n_head) * D) + b);
}

// The launch plan, shared by the scratch-size query and the launch.
struct Plan {
    int rows_per_warp;
    int64_t n_tiles;  // row tiles per KV head
    int n_split;
};

Plan make_plan(int64_t n_tok, int64_t group, int64_t n_head_kv, int64_t n_kv, int window, int n_sm) {
    Plan p{};
    const int64_t rows = n_tok * group;
    const int64_t target = kBlocksPerSm * static_cast<int64_t>(std::max(n_sm, 1));
    p.rows_per_warp = static_cast<int>(std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, kMaxRowsPerWarp));
    // Too few blocks while decoding: one row per warp, more row tiles (they share K/V tiles in L2).
    if (n_tok <= 8 && ((rows + kWarps * p.rows_per_warp - 1) / (kWarps * p.rows_per_warp)) * n_head_kv < target) p.rows_per_warp = 1;
    const int64_t tile_rows = static_cast<int64_t>(kWarps) * p.rows_per_warp;
    p.n_tiles = (rows + tile_rows - 1) / tile_rows;
    p.n_split = 1;
    const int64_t blocks = p.n_tiles * n_head_kv;
    if (blocks < target) {
        // The longest key range a tile can have, from the shapes: all keys, or a window plus the
        // tile's own tokens.
        const int64_t tile_tokens = (tile_rows + group - 1) / group + 1;
        const int64_t longest = window > 0 ? std::min<int64_t>(n_kv, window + tile_tokens) : n_kv;
        const int64_t want = (target + blocks - 1) / blocks;
        p.n_split = static_cast<int>(std::clamp<int64_t>(std::min(want, longest / kMinSplitKeys), 1, kMaxSplit));
    }
    return p;
}

template <int D>
constexpr size_t smem_floats(int rows) {
    return static_cast<size_t>(rows) * D + static_cast<size_t>(kBK) * (D + 4) + static_cast<size_t>(kBK) * D +
           static_cast<size_t>(rows) * kBK;
}

template <typename T>
__device__ __forceinline__ float to_f32(T x) {
    if constexpr (sizeof(T) == 2) {
        return __half2float(x);
    } else {
        return x;
    }
}

// K/V tiles in 16-byte chunks: kPerThread chunks per thread and tile, the K ones first. Where they
// fit in registers (kPrefetch: F16 up to D = 128, F32 up to D = 64), the chunks of the next tile are
// loaded while the current one is computed; otherwise a tile is loaded in batches right before use.
template <int D, typename KV>
struct TileLoad {
    static constexpr int kElems = 16 / static_cast<int>(sizeof(KV));
    static constexpr int kChunksPerRow = D / kElems;
    static constexpr int kChunks = kBK * kChunksPerRow;  // per K (or V) tile
    static constexpr int kPerThread = 2 * kChunks / kThreads;
    static constexpr int kHalf = kPerThread / 2;          // chunks [0, kHalf) are K, the rest V
    static constexpr bool kPrefetch = kPerThread <= 8;
    // D = 256 F32 (32 chunks) keeps element loads: its accumulators leave no registers for chunk
    // batches (ptxas spills), and an F32 cache that wide is rare.
    static constexpr bool kVec = kPerThread <= 16;
    static constexpr int kBatch = kPerThread <= 8 ? kPerThread : 4;  // chunks in registers at once
    static_assert(kChunks % kThreads == 0 && kPerThread % kBatch == 0, "tile chunks must split evenly");

    // Chunk u of this thread: K or V, key row j of the tile, first element e0.
    __device__ static void locate(int u, int tid, bool& is_v, int& j, int& e0) {
        is_v = u >= kHalf;
        const int cc = (is_v ? u - kHalf : u) * kThreads + tid;
        j = cc / kChunksPerRow;
        e0 = (cc % kChunksPerRow) * kElems;
    }

    __device__ static uint4 load(const AttnArgs& a, int g, int j0, int k_end, int u, int tid) {
        bool is_v;
        int j, e0;
        locate(u, tid, is_v, j, e0);
        const int key = j0 + j;
        if (key >= k_end) return make_uint4(0, 0, 0, 0);  // zeros: p = 0 must not meet a NaN
        const char* row = ops::row_at(is_v ? a.v : a.k, g, key, 0) + static_cast<int64_t>(e0) * sizeof(KV);
        return __ldg(reinterpret_cast<const uint4*>(row));
    }

    __device__ static void store(float* ks, float* vs, int u, int tid, const uint4& raw) {
        bool is_v;
        int j, e0;
        locate(u, tid, is_v, j, e0);
        float* dst = is_v ? vs + j * D + e0 : ks + j * (D + 4) + e0;
        if constexpr (sizeof(KV) == 2) {
            const __half2* h = reinterpret_cast<const __half2*>(&raw);
            const float2 f0 = __half22float2(h[0]), f1 = __half22float2(h[1]);
            const float2 f2 = __half22float2(h[2]), f3 = __half22float2(h[3]);
            reinterpret_cast<float4*>(dst)[0] = make_float4(f0.x, f0.y, f1.x, f1.y);
            reinterpret_cast<float4*>(dst)[1] = make_float4(f2.x, f2.y, f3.x, f3.y);
        } else {
            *reinterpret_cast<float4*>(dst) =
                make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z), __uint_as_float(raw.w));
        }
    }
};

// Merges the n_split partials of output row `row` (= t * n_head + h) with the sink into dst; one warp,
// `wts` holds kMaxSplit floats of its own. Partials come from other blocks: read through L2.
template <int D>
__device__ void merge_row(const AttnArgs& a, int64_t row, float* wts, int lane) {
    const int64_t t = row / a.n_head, h = row % a.n_head;
    const int64_t stride = a.n_tok * a.n_head * (D + 2);  // between splits
    const float* p0 = a.part + row * (D + 2);
    const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
    float mx = sink;
    for (int s = lane; s < a.n_split; s += 32) mx = fmaxf(mx, __ldcg(p0 + s * stride));
    mx = ops::warp_max(mx);
    auto* out = reinterpret_cast<float*>(ops::row_at(a.d, h, t, 0));
    if (mx == -INFINITY) {  // no key and no sink
        for (int e = lane; e < D; e += 32) {
            out[e] = 0.0f;
            if (a.q8 != nullptr) store_q8<D>(a, t, h, e / 32, 0.0f, lane);
        }
        return;
    }
    float total = 0.0f;
    for (int s = lane; s < a.n_split; s += 32) {
        const float ms = __ldcg(p0 + s * stride);
        const float w = ms == -INFINITY ? 0.0f : expf(ms - mx);
        wts[s] = w;
        total += w * __ldcg(p0 + s * stride + 1);
    }
    total = ops::warp_sum(total) + (a.sinks != nullptr ? expf(sink - mx) : 0.0f);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    __syncwarp();
    for (int e = lane; e < D; e += 32) {
        float o = 0.0f;
        for (int s = 0; s < a.n_split; ++s) {
            const float w = wts[s];
            if (w != 0.0f) o += w * __ldcg(p0 + s * stride + 2 + e);
        }
        out[e] = o * inv;
        if (a.q8 != nullptr) store_q8<D>(a, t, h, e / 32, o * inv, lane);  // e / 32 is the same on every lane
    }
    __syncwarp();  // wts is reused for the warp's next row
}

// MR: the most rows a warp takes (kMaxRowsPerWarp, or 1 for decoding, where the per-row registers and
// loops of 8 rows would cost more instructions than the tile's own work).
template <int D, typename KV, int MR>
__global__ void __launch_bounds__(kThreads) attention_kernel(const __grid_constant__ AttnArgs a) {
    pdl_grid_sync_small();
    using TL = TileLoad<D, KV>;
    constexpr int kPerLane = D / 32;
    extern __shared__ float4 smem4[];
    const int rpw = MR == 1 ? 1 : a.rows_per_warp;
    const int R = kWarps * rpw;
    float* qs = reinterpret_cast<float*>(smem4);  // [R][D], pre-scaled
    float* ks = qs + R * D;                       // [kBK][D + 4]
    float* vs = ks + kBK * (D + 4);               // [kBK][D]
    float* ps = vs + kBK * D;                     // [R][kBK]

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = blockIdx.y;
    const int split = blockIdx.z;
    const int64_t n_rows = a.n_tok * a.group;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;

    // Each row's key range, read by one thread each (one round trip for all the positions).
    __shared__ int s_lo[kWarps * MR], s_hi[kWarps * MR];
    if (tid < R) {
        int lo = 0, hi = 0;
        if (row0 + tid < n_rows) attention_key_range(a.pos[(row0 + tid) / a.group], a.n_kv, a.window, lo, hi);
        s_lo[tid] = lo;
        s_hi[tid] = hi;
    }
    __syncthreads();
    // Union of the tile's key ranges.
    int blo = a.n_kv, bhi = 0;
    for (int r = 0; r < R; ++r) {
        const int64_t f = row0 + r;
        if (f >= n_rows) break;
        const int lo = s_lo[r], hi = s_hi[r];
        if (lo < hi) {
            blo = min(blo, lo);
            bhi = max(bhi, hi);
        }
    }
    if (bhi < blo) bhi = blo;
    int k_begin = blo, k_end = bhi;
    if (a.n_split > 1) {
        int chunk = (bhi - blo + a.n_split - 1) / a.n_split;
        chunk = (chunk + kBK - 1) / kBK * kBK;
        k_begin = min(bhi, blo + split * chunk);
        k_end = min(bhi, k_begin + chunk);
    }

    // This warp's rows: validity, key range (clipped to the split), head and token.
    bool valid[MR];
    int rlo[MR], rhi[MR];
#pragma unroll
    for (int r = 0; r < MR; ++r) {
        const int64_t f = row0 + warp * rpw + r;
        valid[r] = r < rpw && f < n_rows;
        rlo[r] = 0;
        rhi[r] = 0;
        if (valid[r]) {
            rlo[r] = s_lo[warp * rpw + r];
            rhi[r] = s_hi[warp * rpw + r];
            rlo[r] = max(rlo[r], k_begin);
            rhi[r] = max(rlo[r], min(rhi[r], k_end));
        }
    }

    // Query rows into shared memory (zeros past the last row).
    for (int idx = tid; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, e = idx % D;
        const int64_t f = row0 + r;
        float x = 0.0f;
        if (f < n_rows) {  // n_rows < 2^31 (checked on the host): 32-bit division
            const int fi = static_cast<int>(f);
            const int t = fi / a.group, h = g * a.group + fi % a.group;
            x = reinterpret_cast<const float*>(ops::row_at(a.q, h, t, 0))[e] * a.scale;
        }
        qs[idx] = x;
    }

    float m[MR], l[MR], acc[MR][kPerLane];
#pragma unroll
    for (int r = 0; r < MR; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[r][i] = 0.0f;
    }

    uint4 pre[TL::kPrefetch ? TL::kPerThread : 1];  // the next tile's chunks (kPrefetch)
    if (TL::kPrefetch && a.kv_vec && k_begin < k_end) {
#pragma unroll
        for (int u = 0; u < (TL::kPrefetch ? TL::kPerThread : 0); ++u) pre[u] = TL::load(a, g, k_begin, k_end, u, tid);
    }

    for (int j0 = k_begin; j0 < k_end; j0 += kBK) {
        __syncthreads();  // the previous tile (and, first time, nothing) is no longer read
        if (TL::kVec && a.kv_vec) {
            if constexpr (TL::kPrefetch) {
#pragma unroll
                for (int u = 0; u < TL::kPerThread; ++u) TL::store(ks, vs, u, tid, pre[u]);
                if (j0 + kBK < k_end) {  // in flight while this tile is computed
#pragma unroll
                    for (int u = 0; u < TL::kPerThread; ++u) pre[u] = TL::load(a, g, j0 + kBK, k_end, u, tid);
                }
            } else if constexpr (TL::kVec) {
                for (int b = 0; b < TL::kPerThread; b += TL::kBatch) {
                    uint4 buf[TL::kBatch];
#pragma unroll
                    for (int u = 0; u < TL::kBatch; ++u) buf[u] = TL::load(a, g, j0, k_end, b + u, tid);
#pragma unroll
                    for (int u = 0; u < TL::kBatch; ++u) TL::store(ks, vs, b + u, tid, buf[u]);
                }
            }
        } else {  // unaligned views (and D = 256 F32): element by element
            for (int idx = tid; idx < kBK * D; idx += blockDim.x) {
                const int j = idx / D, e = idx % D;
                const int key = j0 + j;
                float kx = 0.0f, vx = 0.0f;  // keys past the range are zeros: p = 0 must not meet a NaN
                if (key < k_end) {
                    kx = to_f32(reinterpret_cast<const KV*>(ops::row_at(a.k, g, key, 0))[e]);
                    vx = to_f32(reinterpret_cast<const KV*>(ops::row_at(a.v, g, key, 0))[e]);
                }
                ks[j * (D + 4) + e] = kx;
                vs[j * D + e] = vx;
            }
        }
        __syncthreads();

        bool any = false;  // the same on every lane: it depends only on the warp's rows
#pragma unroll
        for (int r = 0; r < MR; ++r) {
            any |= valid[r] && max(rlo[r], j0) < min(rhi[r], j0 + kBK);
        }
        if (!any) continue;

        // Scores: lane = key j0 + lane, against each of the warp's rows.
        float s[MR];
#pragma unroll
        for (int r = 0; r < MR; ++r) s[r] = 0.0f;
        const float4* k4 = reinterpret_cast<const float4*>(ks + lane * (D + 4));
        const float4* q4 = reinterpret_cast<const float4*>(qs + warp * rpw * D);
#pragma unroll 4
        for (int c = 0; c < D / 4; ++c) {
            const float4 kv = k4[c];
#pragma unroll
            for (int r = 0; r < MR; ++r) {
                if (r < rpw) {
                    const float4 qv = q4[r * (D / 4) + c];
                    s[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }

        // Online softmax update per row.
        const int key = j0 + lane;
        float* pw = ps + warp * rpw * kBK;
#pragma unroll
        for (int r = 0; r < MR; ++r) {
            if (r >= rpw) continue;
            const bool vis = valid[r] && key >= rlo[r] && key < rhi[r];
            const float sv = vis ? s[r] : -INFINITY;
            const float m_new = fmaxf(m[r], ops::warp_max(sv));
            float p = 0.0f, corr = 1.0f;
            if (m_new != -INFINITY) {  // some key seen: otherwise nothing changes
                p = vis ? expf(sv - m_new) : 0.0f;
                corr = expf(m[r] - m_new);  // 0 when m[r] is -inf
            }
            l[r] = l[r] * corr + ops::warp_sum(p);
            m[r] = m_new;
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) acc[r][i] *= corr;
            pw[r * kBK + lane] = p;
        }
        __syncwarp();

        // acc += P . V
#pragma unroll 4
        for (int j = 0; j < kBK; ++j) {
            float vv[kPerLane];
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) vv[i] = vs[j * D + lane + 32 * i];
#pragma unroll
            for (int r = 0; r < MR; ++r) {
                if (r < rpw) {
                    const float pr = pw[r * kBK + j];
#pragma unroll
                    for (int i = 0; i < kPerLane; ++i) acc[r][i] += pr * vv[i];
                }
            }
        }
    }

    // Results: finished rows (with the sink) into dst, or this split's partials.
#pragma unroll
    for (int r = 0; r < MR; ++r) {
        if (!valid[r]) continue;
        const int f = static_cast<int>(row0) + warp * rpw + r;
        const int t = f / a.group, h = g * a.group + f % a.group;
        if (a.n_split == 1) {
            const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
            const float mx = fmaxf(sink, m[r]);
            float w = 0.0f, inv = 0.0f;
            if (mx != -INFINITY) {
                w = m[r] == -INFINITY ? 0.0f : expf(m[r] - mx);
                const float total = (a.sinks != nullptr ? expf(sink - mx) : 0.0f) + w * l[r];
                inv = total > 0.0f ? 1.0f / total : 0.0f;
            }
            auto* out = reinterpret_cast<float*>(ops::row_at(a.d, h, t, 0));
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const float o = w * acc[r][i] * inv;
                out[lane + 32 * i] = o;
                if (a.q8 != nullptr) store_q8<D>(a, t, h, i, o, lane);  // valid[r] is the same on every lane
            }
        } else {
            float* p = a.part + ((static_cast<int64_t>(split) * a.n_tok + t) * a.n_head + h) * (D + 2);
            if (lane == 0) {
                p[0] = m[r];
                p[1] = l[r];
            }
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) p[2 + lane + 32 * i] = acc[r][i];
        }
    }
    if (a.n_split == 1 || a.counters == nullptr) return;

    // The last split of this (row tile, KV head) to arrive merges the tile's rows.
    __shared__ unsigned int s_last;
    __shared__ float wts[kWarps][kMaxSplit];
    __threadfence();  // this block's partials are visible before it counts itself
    __syncthreads();
    if (tid == 0) {
        const unsigned int idx = blockIdx.y * gridDim.x + blockIdx.x;
        const unsigned int before = atomicAdd(&a.counters[idx], 1u);
        s_last = before + 1 == static_cast<unsigned int>(a.n_split) ? 1u : 0u;
        if (s_last != 0u) a.counters[idx] = 0u;  // ready for the next launch (stream-ordered after this one)
    }
    __syncthreads();
    if (s_last == 0u) return;
    __threadfence();
    for (int r = warp; r < R; r += kWarps) {
        const int64_t f = row0 + r;
        if (f >= n_rows) break;
        const int64_t t = f / a.group, h = static_cast<int64_t>(g) * a.group + f % a.group;
        merge_row<D>(a, t * a.n_head + h, wts[warp], lane);
    }
}

// Merges the n_split partials of each (token, head) row with the sink: one warp per row.
template <int D>
__global__ void attention_merge_kernel(AttnArgs a) {
    pdl_grid_sync_small();
    __shared__ float wts[kMergeWarps][kMaxSplit];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.y;
    if (row >= a.n_tok * a.n_head) return;
    merge_row<D>(a, row, wts[threadIdx.y], static_cast<int>(threadIdx.x));
}

template <int D, typename KV>
Status launch(AttnArgs a, const Plan& plan, int64_t n_head_kv, cudaStream_t stream) {
    const size_t shm = smem_floats<D>(kWarps * plan.rows_per_warp) * sizeof(float);
    const auto kernel = plan.rows_per_warp == 1 ? attention_kernel<D, KV, 1> : attention_kernel<D, KV, kMaxRowsPerWarp>;
    if (shm > 48 * 1024) {
        MOE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(shm)));
    }
    const dim3 grid(static_cast<unsigned int>(plan.n_tiles), static_cast<unsigned int>(n_head_kv),
                    static_cast<unsigned int>(plan.n_split));
    MOE_RETURN_IF_ERROR(launch_kernel("attention_kernel", kernel, grid, kThreads, shm, stream, a));
    if (plan.n_split > 1 && a.counters == nullptr) {
        const int64_t n_rows = a.n_tok * a.n_head;
        MOE_RETURN_IF_ERROR(launch_kernel("attention_merge_kernel", attention_merge_kernel<D>,
                                          ops::ceil_div(n_rows, kMergeWarps), dim3(32, kMergeWarps), 0, stream, a));
    }
    return Status::ok();
}

template <typename KV>
Status launch_d(int64_t d, AttnArgs a, const Plan& plan, int64_t n_head_kv, cudaStream_t stream) {
    switch (d) {
        case 32: return launch<32, KV>(a, plan, n_head_kv, stream);
        case 64: return launch<64, KV>(a, plan, n_head_kv, stream);
        case 96: return launch<96, KV>(a, plan, n_head_kv, stream);
        case 128: return launch<128, KV>(a, plan, n_head_kv, stream);
        case 192: return launch<192, KV>(a, plan, n_head_kv, stream);
        case 256: return launch<256, KV>(a, plan, n_head_kv, stream);
        case 576: return launch<576, KV>(a, plan, n_head_kv, stream);
        default: break;
    }
    return unimplemented("ATTENTION: head size D = " + std::to_string(d) +
                         " has no CUDA kernel (supported: 32, 64, 96, 128, 192, 256, 576)");
}

Status check_inputs(const Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_attention(dst));  // shared with the other backend
    const Tensor& k = *dst.src[1];
    if (k.type != dst.src[2]->type) {
        return unimplemented("ATTENTION: k is " + ops::type_str(k.type) + " and v is " +
                             ops::type_str(dst.src[2]->type) + "; the CUDA kernel needs one type for both");
    }
    if (k.ne[1] > ops::kMaxGridYZ) {
        return invalid_argument("ATTENTION: too many KV heads (" + std::to_string(k.ne[1]) + ")");
    }
    const Tensor& q = *dst.src[0];
    if (q.ne[1] * q.ne[2] > 0x7fffffff) {  // the kernel indexes (token, head) rows with 32-bit integers
        return invalid_argument("ATTENTION: too many query rows (" + std::to_string(q.ne[1] * q.ne[2]) + ")");
    }
    return Status::ok();
}

Plan plan_for(const Tensor& dst, int n_sm) {
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    return make_plan(q.ne[2], q.ne[1] / k.ne[1], k.ne[1], dst.params.i[1], dst.params.i[0], n_sm);
}

}  // namespace

bool attention_uses_tensor_cores(const Tensor& node) {
    return node.op == Op::ATTENTION && check_inputs(node).is_ok() && attention_mma_fits(node);
}

bool attention_writes_q8(const Tensor& node) {
    // The FP32 kernel's outputs, dense [D, n_head, T] (head sizes are multiples of 32).
    return node.op == Op::ATTENTION && check_inputs(node).is_ok() && !attention_mma_fits(node) &&
           node.type == Type::F32 && node.nb[0] == 4 && node.nb[1] == 4 * static_cast<size_t>(node.ne[0]) &&
           node.nb[2] == node.nb[1] * static_cast<size_t>(node.ne[1]) && node.ne[3] == 1 && node.ne[0] % 32 == 0;
}

size_t attention_scratch_bytes(const Tensor& node, int n_sm) {
    if (node.op != Op::ATTENTION || !check_inputs(node).is_ok()) return 0;
    const Plan plan = plan_for(node, n_sm);
    if (plan.n_split <= 1) return 0;
    const Tensor& q = *node.src[0];
    return static_cast<size_t>(plan.n_split) * static_cast<size_t>(q.ne[2] * q.ne[1]) *
           static_cast<size_t>(q.ne[0] + 2) * sizeof(float);
}

Status attention(Tensor& dst, const OpContext& ctx) {
    if (dst.op != Op::ATTENTION) return invalid_argument(std::string("attention: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_inputs(dst));
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    if (q.ne[0] == 0 || q.ne[1] == 0 || q.ne[2] == 0) return Status::ok();  // an empty output
    if (attention_mma_fits(dst)) {
        if (ctx.q8_out != nullptr) return internal_error("ATTENTION: Q8 rows asked of the tensor-core kernel");
        return attention_mma(dst, ctx.stream);
    }
    const Plan plan = plan_for(dst, ctx.n_sm);
    AttnArgs a{};
    set_attention_operands(a, dst);
    a.scale = dst.params.f[0];
    a.group = static_cast<int>(q.ne[1] / k.ne[1]);
    a.n_head = static_cast<int>(q.ne[1]);
    a.n_tok = q.ne[2];
    a.rows_per_warp = plan.rows_per_warp;
    a.n_split = plan.n_split;
    a.kv_vec = rows_aligned16(k) && rows_aligned16(*dst.src[2]);
    if (ctx.q8_out != nullptr) {
        if (!attention_writes_q8(dst)) return internal_error("ATTENTION: Q8 rows asked of a result that has none");
        a.q8 = static_cast<uint8_t*>(ctx.q8_out);
        a.q8_stride = static_cast<int64_t>(q8_row_bytes(q.ne[0] * q.ne[1]));
    }
    if (plan.n_split > 1) {
        const size_t need = attention_scratch_bytes(dst, ctx.n_sm);
        if (ctx.scratch == nullptr || ctx.scratch_size < need) {
            return internal_error("ATTENTION: scratch of " + std::to_string(ctx.scratch_size) + " bytes, need " +
                                  std::to_string(need));
        }
        a.part = static_cast<float*>(ctx.scratch);
        if (plan.n_tiles * k.ne[1] <= kAttnCounters) a.counters = ctx.attn_counters;
    }
    if (k.type == Type::F16) return launch_d<__half>(q.ne[0], a, plan, k.ne[1], ctx.stream);
    return launch_d<float>(q.ne[0], a, plan, k.ne[1], ctx.stream);
}

}  // namespace moe::cuda
