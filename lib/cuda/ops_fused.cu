// Fused launches of fusion_plan.h that are not matrix products:
//
// row_chain: [WEIGHTED_SUM] [ADD] RMS_NORM, one block per row (the residual stream between a layer's
// halves, and the hidden-state norm alone), or, for the few rows of a decode step, a cluster of
// kChainCluster blocks per row, each a slice of it. Each thread keeps up to kPer elements of the row in
// registers: it reads every input first, the block (cluster) reduces the sum of squares, then the
// results are written in node order with a barrier between nodes whose outputs overlap, so an output
// may even reuse an input's bytes.
// The norm can also write its result as Q8 activation rows (ctx.q8_out): a warp holds 32 consecutive
// values, so a Q8 block is a warp max and a shuffle away, quantised exactly as quantize_q8_kernel
// (matmul_gemv.cu) would. Each value is computed with the separate kernels' arithmetic; only the
// order of the squares' sum differs.
//
// router_select: TOPK, GATHER of the chosen logits, SOFTMAX of them, one warp per token (lane j holds
// the j-th choice), one block; bitwise the separate kernels' results.
//
// attn_prep: the attention prologue, [RMS_NORM q, k] ROPE q, k [CPY k, v] into the cache; for up to
// kMaxPrepTokens tokens in one block: the token's cos / sin tables first (rope_math.cuh, as rope_kernel), then a warp
// per (head, token) row computes the norm (as rms_norm_kernel's warp rows: lane-strided squares, one
// warp sum) and the rotation into shared memory, and finally every node's output is written in node
// order (CPY converting to F16 as cpy_kernel does). Bitwise the separate kernels' results. Where no
// output overlaps another tensor of the launch (other than in place on its own rows), which is the
// decode graph's case, a warp per row over several blocks does the same without shared memory or
// barriers (attn_prep_rows_kernel, ~6 us instead of ~10 on an H100); for prefills a block per token
// (attn_prep_tokens_kernel: the token's cos / sin computed once) instead of two norms, two ropes and
// two copies.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include <cooperative_groups.h>

#include "cuda/fusion_plan.h"
#include "cuda/launch.cuh"
#include "cuda/ops_common.cuh"
#include "cuda/rope_math.cuh"
#include "cuda/router_select.cuh"

namespace moe::cuda {
namespace {

namespace cg = cooperative_groups;
using ops::View;

constexpr int kPer = 8;  // elements per thread: rows up to 8 * 1024 = kMaxChainRow
constexpr unsigned int kChainCluster = 8;  // blocks per row of a clustered chain (the portable cluster size)
constexpr int64_t kClusterMinRow = 1024;   // shorter rows keep one block
static_assert(kPer * 1024 == kMaxChainRow, "row chains hold a row in the registers of one block");

struct ChainArgs {
    View y, wts, wsum;             // WEIGHTED_SUM: y [N, k, T], wts [k, T] -> wsum [N, T]
    View add_a, add_b, add_dst;    // ADD: add_a + add_b; an operand that is the chain value is not read
    int add_prev;                  // 0: add_a is the WEIGHTED_SUM result, 1: add_b, 2: both, -1: neither
    View x;                        // RMS_NORM's src0 when it is an input (no ADD)
    View out;                      // RMS_NORM result
    const float* w;                // norm weight or nullptr
    float eps;
    uint8_t* q8;                   // Q8 rows of the result (nullptr: none)
    int64_t q8_stride;
    int64_t n;                     // row length
    int slice;                     // values per block of a cluster (kCluster), a multiple of 32
    int ordered;                   // outputs of two nodes may overlap: barriers between their writes
};

__device__ __forceinline__ const float* frow(const View& t, int64_t i1, int64_t i2, int64_t i3) {
    return reinterpret_cast<const float*>(ops::row_at(t, i1, i2, i3));
}

// Cluster operations exist from sm_90 on; the host launches clustered chains only there
// (OpContext::clusters), so older targets compile them to nothing.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#endif
}

// The cluster's blocks' part[0] values, added in rank order.
__device__ __forceinline__ float cluster_sum(float* part0) {
    float s = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cluster = cg::this_cluster();
    for (unsigned int b = 0; b < cluster.num_blocks(); ++b) s += *cluster.map_shared_rank(part0, b);
#else
    s = *part0;
#endif
    return s;
}

__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cg::this_cluster().block_rank());
#else
    return 0;
#endif
}

// Block-wide barrier, or cluster-wide when the row is split over a cluster (kCluster).
template <bool kCluster>
__device__ __forceinline__ void chain_barrier() {
    if constexpr (kCluster) {
        cluster_sync();
    } else {
        __syncthreads();
    }
}

// kCluster: a row is split over the cluster's blocks (a.slice values each, rank order), for the few
// rows of a decode step: one block per row left a ~10 us chain of dependent instructions on one SM.
// The blocks' sums of squares meet through distributed shared memory, added in rank order.
template <bool kWsum, bool kAdd, bool kCluster>
__global__ void __launch_bounds__(1024) row_chain_kernel(ChainArgs a) {
    pdl_grid_sync_small();
    // Values per thread: a cluster's slices have a thread per value (the host sizes the blocks so),
    // which keeps the decode step's chain of dependent instructions short.
    constexpr int P = kCluster ? 1 : kPer;
    __shared__ float part[32];
    const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
    const int lane = tid & 31, warp = tid >> 5;
    const int64_t r = kCluster ? blockIdx.y : blockIdx.x;
    int begin = 0, end = static_cast<int>(a.n);
    if constexpr (kCluster) {
        begin = cluster_rank() * a.slice;
        end = min(end, begin + a.slice);
    }
    int64_t i1 = r, i2 = 0, i3 = 0;  // decoding has one row: skip the 64-bit divisions
    if (r >= a.out.ne[1]) ops::split_row(r, a.out.ne[1], a.out.ne[2], i1, i2, i3);

    // Phase 1: every read.
    float wv[P], sv[P], xv[P], gv[P];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const int i = begin + tid + j * nt;  // rows are at most kMaxChainRow long
        wv[j] = sv[j] = xv[j] = 0.0f;
        gv[j] = 1.0f;
        if (i >= end) continue;
        float x = 0.0f;
        if constexpr (kWsum) {  // as weighted_sum_kernel: token t = r of the [N, T] result
            wv[j] = ops::weighted_sum_at(a.y, a.wts, r, i);
            x = wv[j];
        }
        if constexpr (kAdd) {
            const float lhs = a.add_prev == 0 || a.add_prev == 2 ? wv[j] : frow(a.add_a, i1, i2, i3)[i];
            const float rhs = a.add_prev == 1 || a.add_prev == 2 ? wv[j] : frow(a.add_b, i1, i2, i3)[i];
            sv[j] = lhs + rhs;
            x = sv[j];
        }
        if constexpr (!kWsum && !kAdd) x = frow(a.x, i1, i2, i3)[i];
        xv[j] = x;
        if (a.w != nullptr) gv[j] = a.w[i];
        ss += x * x;
    }
    // The block's sum of squares.
    ss = ops::warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float v = lane < (nt >> 5) ? part[lane] : 0.0f;
        v = ops::warp_sum(v);
        if (lane == 0) part[0] = v;
    }
    if constexpr (kCluster) {
        // Every block's reads are done (and its part[0] written) before any block writes or reads a
        // sum: the barrier orders outputs after all of the row's reads, as __syncthreads does below.
        cluster_sync();
        ss = cluster_sum(&part[0]);
    } else {
        __syncthreads();
        ss = part[0];
    }
    // The mean and the root in double, as the CPU kernel does.
    const auto scale = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(a.n) + a.eps));

    // Phase 2: the writes, node by node (a barrier between two nodes whose outputs may overlap).
    if constexpr (kWsum) {
        auto* d = reinterpret_cast<float*>(ops::row_at(a.wsum, r, 0, 0));
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const int i = begin + tid + j * nt;
            if (i < end) d[i] = wv[j];
        }
        if (a.ordered) chain_barrier<kCluster>();
    }
    if constexpr (kAdd) {
        auto* d = reinterpret_cast<float*>(ops::row_at(a.add_dst, i1, i2, i3));
#pragma unroll
        for (int j = 0; j < P; ++j) {
            const int i = begin + tid + j * nt;
            if (i < end) d[i] = sv[j];
        }
        if (a.ordered) chain_barrier<kCluster>();
    }
    auto* d = reinterpret_cast<float*>(ops::row_at(a.out, i1, i2, i3));
    uint8_t* q8row = a.q8 != nullptr ? a.q8 + r * a.q8_stride : nullptr;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const int i = begin + tid + j * nt;
        if (i >= end) continue;  // with Q8 rows n % 32 == 0 and slices too: whole warps leave together
        const float y = a.w != nullptr ? xv[j] * scale * gv[j] : xv[j] * scale;
        d[i] = y;
        if (q8row != nullptr) {
            const int64_t b = i >> 5;  // this warp's 32 values are block b
            ops::warp_quantize_q8_block(y, lane, reinterpret_cast<uint32_t*>(q8row + 32 * b),
                                        reinterpret_cast<float*>(q8row + a.n) + b);
        }
    }
    if constexpr (kCluster) cluster_sync();  // no block leaves while others read its part[0]
}

// ---- router ----

// blockDim (32, T): warp t takes token t (router_select.cuh).
template <int kKeys>
__global__ void router_kernel(View x, View ids, View vals, View probs, int k) {
    pdl_grid_sync_small();
    router_select_token<kKeys>(x, ids, vals, probs, k, static_cast<int>(threadIdx.x), threadIdx.y, true);
}

// ---- attention prologue ----

constexpr int kPrepStreams = 4;
constexpr int kPrepWrites = 6;

// Rows that go through the same steps: q (norm, rope), k (norm, rope, cache), v (cache).
struct PrepStream {
    View src;          // [D, H, T] input rows
    View norm;         // RMS_NORM dst (has_norm)
    const float* w;    // its weight or nullptr
    float eps;
    View rope;         // ROPE dst (has_rope)
    int has_norm, has_rope;
    int rows;          // H * T
    int row0;          // first row among all streams' rows
    int nbuf, rbuf;    // shared-memory offsets (floats) of the norm and rope results; -1: none
};

struct PrepWrite {
    int stream;
    int what;            // 0: norm dst, 1: rope dst, 2: cache (dst view `cpy`)
    View cpy;
    int to_f16;
    const int32_t* rows;  // a cache write with rows (CPY's src2): token t's row; nullptr: row t
};

struct PrepArgs {
    PrepStream s[kPrepStreams];
    int n_streams;
    PrepWrite w[kPrepWrites];
    int n_writes;
    int d, t, total_rows;
    const int32_t* pos;
    RopeArgs rope;
    unsigned int* err;  // kErrorBadIndex: a cache write's row outside the cache (not written)
};

// Row (h, t) of write w's destination, or nullptr where a cache row index is outside the cache.
__device__ __forceinline__ char* prep_write_row(const PrepArgs& a, const PrepWrite& w, const View& dv, int h, int t) {
    if (w.rows == nullptr) return ops::row_at(dv, h, t, 0);
    const int32_t row = w.rows[t];
    if (row < 0 || row >= dv.ne[2]) {
        ops::flag_error(a.err, kErrorBadIndex);
        return nullptr;
    }
    return ops::row_at(dv, h, row, 0);
}

// The row steps both prologue kernels share, so that they compute bitwise the same values.
// Global row gr: its stream, and (head, token) within the stream's [D, H, T] rows.
__device__ __forceinline__ int prep_stream_of(const PrepArgs& a, int gr) {
    int si = 0;
#pragma unroll
    for (int k = 1; k < kPrepStreams; ++k) {
        if (k < a.n_streams && gr >= a.s[k].row0) si = k;
    }
    return si;
}

// Lane's values e = lane + 32 i of row (h, t) of the stream's input.
template <int D>
__device__ __forceinline__ void load_prep_row(const PrepStream& st, int h, int t, int lane, float (&v)[D / 32]) {
    const auto* x = reinterpret_cast<const float*>(ops::row_at(st.src, h, t, 0));
#pragma unroll
    for (int i = 0; i < D / 32; ++i) v[i] = x[lane + 32 * i];
}

// RMS_NORM of a warp's row in place, as rms_norm_kernel's warp rows: lane-strided squares, one warp sum.
template <int D>
__device__ __forceinline__ void norm_prep_row(const PrepStream& st, int lane, float (&v)[D / 32]) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < D / 32; ++i) ss += v[i] * v[i];
    ss = ops::warp_sum(ss);
    const auto scale = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / static_cast<double>(D) + st.eps));
#pragma unroll
    for (int i = 0; i < D / 32; ++i) v[i] = st.w != nullptr ? v[i] * scale * st.w[lane + 32 * i] : v[i] * scale;
}

template <int D>
__global__ void __launch_bounds__(1024) attn_prep_kernel(const __grid_constant__ PrepArgs a) {
    pdl_grid_sync_small();
    extern __shared__ float sm[];  // cos / sin per token ([t][D]: cos half, sin half), then row buffers
    constexpr int kPerLane = D / 32;
    constexpr int kHalf = D / 2;
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int n_warps = static_cast<int>(blockDim.x) >> 5;
    for (int i = tid; i < a.t * kHalf; i += blockDim.x) {
        const int t = i / kHalf, p = i % kHalf;
        rope_cos_sin(a.rope, p, a.pos[t], sm[t * D + p], sm[t * D + kHalf + p]);
    }
    __syncthreads();
    // Rows: every read, the norms and the rotations, into shared memory.
    for (int gr = warp; gr < a.total_rows; gr += n_warps) {
        const PrepStream& st = a.s[prep_stream_of(a, gr)];
        const int r = gr - st.row0;
        const int nh = static_cast<int>(st.src.ne[1]);
        const int h = r % nh, t = r / nh;
        float v[kPerLane];
        load_prep_row<D>(st, h, t, lane, v);
        if (st.has_norm) {
            norm_prep_row<D>(st, lane, v);
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) sm[st.nbuf + r * D + lane + 32 * i] = v[i];
        }
        if (st.has_rope) {
            const float* cs = sm + t * D;
            constexpr int kH = kPerLane / 2;  // element i pairs with i + kH (e and e + D/2)
#pragma unroll
            for (int i = 0; i < kH; ++i) {
                const int e = lane + 32 * i;
                const float x0 = v[i], x1 = v[i + kH];
                const float c = cs[e], s = cs[kHalf + e];
                sm[st.rbuf + r * D + e] = __fmul_rn(x0, c) - __fmul_rn(x1, s);
                sm[st.rbuf + r * D + e + kHalf] = __fmul_rn(x0, s) + __fmul_rn(x1, c);
            }
        }
        if (!st.has_norm && !st.has_rope) {
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) sm[st.rbuf + r * D + lane + 32 * i] = v[i];
        }
    }
    // Writes, node by node, a warp per row: the row's address is formed once, not per element (per-
    // element 64-bit index math made this phase most of the kernel's instructions).
    for (int wi = 0; wi < a.n_writes; ++wi) {
        __syncthreads();
        const PrepWrite& w = a.w[wi];
        const PrepStream& st = a.s[w.stream];
        const int buf = w.what == 0 ? st.nbuf : st.rbuf;
        const View& dv = w.what == 0 ? st.norm : w.what == 1 ? st.rope : w.cpy;
        const bool to_f16 = w.what == 2 && w.to_f16;
        const int nh = static_cast<int>(st.src.ne[1]);
        for (int r = warp; r < st.rows; r += n_warps) {
            char* row = prep_write_row(a, w, dv, r % nh, r / nh);
            if (row == nullptr) continue;
            const float* src = sm + buf + r * D;
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const int e = lane + 32 * i;
                if (to_f16) {
                    reinterpret_cast<unsigned short*>(row)[e] = ops::to_half_bits(src[e]);
                } else {
                    reinterpret_cast<float*>(row)[e] = src[e];
                }
            }
        }
    }
}

// Row (h, t) of stream si by one warp: load, norm, rotation, then its row of every node in node order.
// cs: token t's cos / sin pairs in shared memory (cos half, sin half), or nullptr: the lanes compute
// their own (rope_cos_sin is the same function either way: bitwise the same values).
template <int D>
__device__ __forceinline__ void prep_row(const PrepArgs& a, int si, int h, int t, int lane, const float* cs) {
    constexpr int kPerLane = D / 32;
    constexpr int kH = kPerLane / 2;  // element i pairs with i + kH (e and e + D/2)
    const PrepStream& st = a.s[si];
    float v[kPerLane];
    load_prep_row<D>(st, h, t, lane, v);
    float c[kH], sn[kH];
    if (st.has_rope) {
#pragma unroll
        for (int i = 0; i < kH; ++i) {
            const int e = lane + 32 * i;
            if (cs != nullptr) {
                c[i] = cs[e];
                sn[i] = cs[D / 2 + e];
            } else {
                rope_cos_sin(a.rope, e, a.pos[t], c[i], sn[i]);
            }
        }
    }
    const auto store_row = [&](char* row, const float (&val)[kPerLane], bool to_f16) {
        if (row == nullptr) return;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int e = lane + 32 * i;
            if (to_f16) {
                reinterpret_cast<unsigned short*>(row)[e] = ops::to_half_bits(val[i]);
            } else {
                reinterpret_cast<float*>(row)[e] = val[i];
            }
        }
    };
    if (st.has_norm) {
        norm_prep_row<D>(st, lane, v);
        store_row(ops::row_at(st.norm, h, t, 0), v, false);
    }
    if (st.has_rope) {
        float o[kPerLane];
#pragma unroll
        for (int i = 0; i < kH; ++i) {
            o[i] = __fmul_rn(v[i], c[i]) - __fmul_rn(v[i + kH], sn[i]);
            o[i + kH] = __fmul_rn(v[i], sn[i]) + __fmul_rn(v[i + kH], c[i]);
        }
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) v[i] = o[i];
        store_row(ops::row_at(st.rope, h, t, 0), v, false);
    }
    for (int wi = 0; wi < a.n_writes; ++wi) {  // this stream's cache copies
        const PrepWrite& w = a.w[wi];
        if (w.what == 2 && w.stream == si) store_row(prep_write_row(a, w, w.cpy, h, t), v, w.to_f16 != 0);
    }
}

// The same, one warp per (head, token) row over as many blocks as rows need, no shared memory and
// no barrier: each warp computes its token's cos / sin pairs (2 per lane at D = 128), reads its row,
// and writes its row of every node in node order. Used only where every output is disjoint from every
// other tensor of the launch, or is its own stream's rows (in place), so that no warp's write can
// meet another warp's read or write (attn_prep_rows_apart, fusion_plan.h). Bitwise the block kernel's
// results.
constexpr int kPrepRowWarps = 4;

template <int D>
__global__ void __launch_bounds__(kPrepRowWarps * 32) attn_prep_rows_kernel(const __grid_constant__ PrepArgs a) {
    pdl_grid_sync_small();
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gr = static_cast<int>(blockIdx.x) * kPrepRowWarps + (static_cast<int>(threadIdx.x) >> 5);
    if (gr >= a.total_rows) return;
    const int si = prep_stream_of(a, gr);
    const PrepStream& st = a.s[si];
    const int r = gr - st.row0;
    const int nh = static_cast<int>(st.src.ne[1]);
    prep_row<D>(a, si, r % nh, r / nh, lane, nullptr);
}

// Prefills (more than kMaxPrepTokens tokens): a block per token computes the token's cos / sin pairs
// once into shared memory, then a warp per row of the token's heads in every stream. Where each row
// computed its own (the rows kernel), the double-precision sincos of every (head, token) row took
// most of a Qwen3 layer's 25 us at 512 tokens (H100, PERF.md 2026-11-25). Same conditions as the rows kernel
// (outputs apart); bitwise its results.
constexpr int kPrepTokenWarps = 8;

template <int D>
__global__ void __launch_bounds__(kPrepTokenWarps * 32) attn_prep_tokens_kernel(const __grid_constant__ PrepArgs a) {
    pdl_grid_sync_small();
    __shared__ float cs[D];
    const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int t = static_cast<int>(blockIdx.x);
    for (int p = tid; p < D / 2; p += kPrepTokenWarps * 32) rope_cos_sin(a.rope, p, a.pos[t], cs[p], cs[D / 2 + p]);
    __syncthreads();
    for (int si = 0; si < a.n_streams; ++si) {
        const int nh = static_cast<int>(a.s[si].src.ne[1]);
        for (int h = warp; h < nh; h += kPrepTokenWarps) prep_row<D>(a, si, h, t, lane, cs);
    }
}

bool is_f32_rows(const Tensor* t) { return t != nullptr && t->type == Type::F32 && t->data != nullptr && t->nb[0] == 4; }

bool same_tensor(const Tensor* a, const Tensor* b) {
    if (a == nullptr || b == nullptr || a->data != b->data) return false;
    for (int d = 0; d < 4; ++d) {
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d]) return false;
    }
    return true;
}

}  // namespace

Status row_chain(std::span<Tensor* const> parts, const OpContext& ctx) {
    Tensor* wsum = nullptr;
    Tensor* add = nullptr;
    size_t i = 0;
    if (i < parts.size() && parts[i]->op == Op::WEIGHTED_SUM) wsum = parts[i++];
    if (i < parts.size() && parts[i]->op == Op::ADD) add = parts[i++];
    if (i + 1 != parts.size() || parts[i]->op != Op::RMS_NORM || (wsum != nullptr && add == nullptr)) {
        return internal_error("row_chain: expected [WEIGHTED_SUM] [ADD] RMS_NORM");
    }
    Tensor& norm = *parts[i];
    MOE_RETURN_IF_ERROR(moe::op_checks::check_rms_norm(norm));
    const int64_t n = norm.ne[0], rows = norm.n_rows();
    if (n == 0 || rows == 0) return Status::ok();
    if (n > kMaxChainRow || rows > 0x7fffffff) return internal_error("row_chain: rows too long or too many");
    ChainArgs a{};
    a.out = ops::view_of(norm);
    a.w = norm.src[1] != nullptr ? norm.src[1]->as<float>() : nullptr;
    a.eps = norm.params.f[0];
    a.n = n;
    a.add_prev = -1;
    if (wsum != nullptr) {
        if (!is_f32_rows(wsum->src[0]) || !is_f32_rows(wsum->src[1]) || !is_f32_rows(wsum) || wsum->ne[0] != n ||
            wsum->ne[1] != rows || wsum->src[0]->ne[0] != n || wsum->src[0]->ne[2] != rows ||
            wsum->src[1]->ne[0] != wsum->src[0]->ne[1] || wsum->src[0]->ne[1] < 1) {
            return internal_error("row_chain: WEIGHTED_SUM does not match the chain");
        }
        a.y = ops::view_of(*wsum->src[0]);
        a.wts = ops::view_of(*wsum->src[1]);
        a.wsum = ops::view_of(*wsum);
    }
    if (add != nullptr) {
        if (!is_f32_rows(add) || !is_f32_rows(add->src[0]) || !is_f32_rows(add->src[1]) ||
            !moe::op_checks::same_shape(*add, norm) || !moe::op_checks::same_shape(*add->src[0], norm) ||
            !moe::op_checks::same_shape(*add->src[1], norm) || !same_tensor(norm.src[0], add)) {
            return internal_error("row_chain: ADD does not match the chain");
        }
        const bool p0 = wsum != nullptr && same_tensor(add->src[0], wsum);
        const bool p1 = wsum != nullptr && same_tensor(add->src[1], wsum);
        if (wsum != nullptr && !p0 && !p1) return internal_error("row_chain: ADD does not read the WEIGHTED_SUM");
        a.add_prev = p0 && p1 ? 2 : p0 ? 0 : p1 ? 1 : -1;
        a.add_a = ops::view_of(*add->src[0]);
        a.add_b = ops::view_of(*add->src[1]);
        a.add_dst = ops::view_of(*add);
    } else {
        a.x = ops::view_of(*norm.src[0]);
    }
    if (ctx.q8_out != nullptr) {
        if (n % 32 != 0) return internal_error("row_chain: Q8 rows need a multiple of 32 values");
        a.q8 = static_cast<uint8_t*>(ctx.q8_out);
        a.q8_stride = static_cast<int64_t>(q8_row_bytes(n));
    }
    // Outputs of two nodes that may overlap must be written in node order.
    const Tensor* outs[] = {wsum, add, &norm};
    for (int x = 0; x < 3; ++x) {
        for (int y = x + 1; y < 3; ++y) {
            if (outs[x] != nullptr && outs[y] != nullptr && byte_range(*outs[x]).overlaps(byte_range(*outs[y]))) {
                a.ordered = 1;
            }
        }
    }
    // Few rows (decoding) of at least kClusterMinRow values: each row split over a cluster of
    // kChainCluster blocks. Otherwise few rows: the widest block, for latency; many rows: ~4 values
    // per thread.
    const bool clustered = ctx.clusters && n >= kClusterMinRow && rows * kChainCluster <= ctx.n_sm && rows <= 65535;
    int64_t per_block = n;
    if (clustered) {
        a.slice = static_cast<int>(ops::ceil_div(ops::ceil_div(n, kChainCluster), 32) * 32);
        per_block = a.slice;
    }
    const int64_t per = rows <= ctx.n_sm ? 1 : 4;
    int64_t threads = ((per_block + per - 1) / per + 31) / 32 * 32;
    threads = std::max<int64_t>(threads, ((per_block + kPer - 1) / kPer + 31) / 32 * 32);
    threads = std::min<int64_t>(std::max<int64_t>(threads, 32), 1024);
    const auto block = static_cast<unsigned int>(threads);
    const auto kernel_for = [&](auto cluster) {  // the instance of this chain's parts
        constexpr bool kCluster = decltype(cluster)::value;
        if (wsum != nullptr) return row_chain_kernel<true, true, kCluster>;
        if (add != nullptr) return row_chain_kernel<false, true, kCluster>;
        return row_chain_kernel<false, false, kCluster>;
    };
    if (clustered) {
        if (threads < a.slice) return internal_error("row_chain: a cluster slice needs a thread per value");
        const dim3 grid(kChainCluster, static_cast<unsigned int>(rows));
        return launch_kernel_clusters("row_chain_kernel", kernel_for(std::true_type{}), grid, block, 0, ctx.stream,
                                      kChainCluster, a);
    }
    return launch_kernel("row_chain_kernel", kernel_for(std::false_type{}), static_cast<unsigned int>(rows), block, 0,
                         ctx.stream, a);
}

Status router_select(std::span<Tensor* const> parts, const OpContext& ctx) {
    if (parts.size() != 3 || parts[0]->op != Op::TOPK || parts[1]->op != Op::GATHER || parts[2]->op != Op::SOFTMAX) {
        return internal_error("router_select: expected TOPK, GATHER, SOFTMAX");
    }
    const Tensor& tk = *parts[0];
    const Tensor& ga = *parts[1];
    const Tensor& sm = *parts[2];
    const Tensor* x = tk.src[0];
    const int k = tk.params.i[0];
    if (!is_f32_rows(x) || x->ne[2] != 1 || x->ne[3] != 1 || k < 1 || k > 32 || k > x->ne[0] || x->ne[1] < 1 ||
        x->ne[1] > 32 || tk.type != Type::I32 || tk.data == nullptr || tk.nb[0] != 4 || tk.ne[0] != k ||
        tk.ne[1] != x->ne[1] || !same_tensor(ga.src[0], x) || !same_tensor(ga.src[1], &tk) || !is_f32_rows(&ga) ||
        !moe::op_checks::same_shape(ga, tk) || !same_tensor(sm.src[0], &ga) || !is_f32_rows(&sm) ||
        !moe::op_checks::same_shape(sm, ga)) {
        return internal_error("router_select: the parts do not form a router");
    }
    const auto kernel = x->ne[0] <= 32 * kRouterKeys ? router_kernel<kRouterKeys> : router_kernel<0>;
    return launch_kernel("router_kernel", kernel, 1, dim3(32, static_cast<unsigned int>(x->ne[1])), 0, ctx.stream,
                         ops::view_of(*x), ops::view_of(tk), ops::view_of(ga), ops::view_of(sm), k);
}

Status attn_prep(std::span<Tensor* const> parts, const OpContext& ctx) {
    Tensor* norms[2] = {};
    Tensor* ropes[2] = {};
    Tensor* cpys[2] = {};
    int nn = 0, nr = 0, nc = 0;
    for (Tensor* p : parts) {
        if (p->op == Op::RMS_NORM && nr == 0 && nn < 2) {
            norms[nn++] = p;
        } else if (p->op == Op::ROPE && nc == 0 && nr < 2) {
            ropes[nr++] = p;
        } else if (p->op == Op::CPY && nc < 2) {
            cpys[nc++] = p;
        } else {
            return internal_error("attn_prep: expected [RMS_NORM x2] ROPE x1-2 [CPY x1-2]");
        }
    }
    if (nr == 0 || (nn != 0 && nn != nr)) return internal_error("attn_prep: norms do not match the ropes");
    PrepArgs a{};
    const Tensor& x0 = *ropes[0]->src[0];
    a.d = static_cast<int>(x0.ne[0]);
    a.t = static_cast<int>(x0.ne[2]);
    a.pos = ropes[0]->src[1]->as<int32_t>();
    a.rope = rope_args(ropes[0]->rope_params());
    if ((a.d != 64 && a.d != 128) || a.t < 1) return internal_error("attn_prep: unsupported shape");
    int off = a.t * a.d;  // after the cos / sin tables
    int rows = 0;
    for (int k = 0; k < nr; ++k) {
        MOE_RETURN_IF_ERROR(moe::op_checks::check_rope(*ropes[k]));
        PrepStream& st = a.s[a.n_streams++];
        const Tensor& src = nn > 0 ? *norms[k]->src[0] : *ropes[k]->src[0];
        if (src.ne[0] != a.d || src.ne[2] != a.t || ropes[k]->src[0]->ne[1] != src.ne[1]) {
            return internal_error("attn_prep: rows differ in shape");
        }
        st.src = ops::view_of(src);
        st.rows = static_cast<int>(src.ne[1] * src.ne[2]);
        st.row0 = rows;
        rows += st.rows;
        st.nbuf = -1;
        if (nn > 0) {
            MOE_RETURN_IF_ERROR(moe::op_checks::check_rms_norm(*norms[k]));
            st.has_norm = 1;
            st.norm = ops::view_of(*norms[k]);
            st.w = norms[k]->src[1] != nullptr ? norms[k]->src[1]->as<float>() : nullptr;
            st.eps = norms[k]->params.f[0];
            st.nbuf = off;
            off += st.rows * a.d;
        }
        st.has_rope = 1;
        st.rope = ops::view_of(*ropes[k]);
        st.rbuf = off;
        off += st.rows * a.d;
    }
    // Writes in node order: norms, ropes, then the cache copies.
    for (int k = 0; k < nn; ++k) a.w[a.n_writes++] = PrepWrite{k, 0, {}, 0, nullptr};
    for (int k = 0; k < nr; ++k) a.w[a.n_writes++] = PrepWrite{k, 1, {}, 0, nullptr};
    a.err = ctx.error_flags;
    for (int k = 0; k < nc; ++k) {
        const Tensor& c = *cpys[k];
        const Tensor* s = c.src[0];
        if (s == nullptr || s->type != Type::F32 || s->nb[0] != 4 || !cache_write_fits(c) || s->ne[0] != a.d ||
            s->ne[2] != a.t || (c.type != Type::F16 && c.type != Type::F32)) {
            return internal_error("attn_prep: CPY does not match");
        }
        int stream = -1;
        for (int r = 0; r < nr; ++r) {
            if (same_tensor(s, ropes[r])) stream = r;
        }
        if (stream < 0) {  // rows of its own, copied as they are
            if (a.n_streams == kPrepStreams) return internal_error("attn_prep: too many streams");
            stream = a.n_streams++;
            PrepStream& st = a.s[stream];
            st.src = ops::view_of(*s);
            st.rows = static_cast<int>(s->ne[1] * s->ne[2]);
            st.row0 = rows;
            rows += st.rows;
            st.nbuf = -1;
            st.rbuf = off;
            off += st.rows * a.d;
        }
        const int32_t* row_index = c.src[2] != nullptr ? c.src[2]->as<int32_t>() : nullptr;
        a.w[a.n_writes++] = PrepWrite{stream, 2, ops::view_of(c), c.type == Type::F16 ? 1 : 0, row_index};
    }
    a.total_rows = rows;
    if (attn_prep_rows_apart(parts)) {
        if (a.t > kMaxPrepTokens) {
            const auto kernel = a.d == 64 ? attn_prep_tokens_kernel<64> : attn_prep_tokens_kernel<128>;
            return launch_kernel("attn_prep_tokens_kernel", kernel, static_cast<unsigned int>(a.t),
                                 kPrepTokenWarps * 32, 0, ctx.stream, a);
        }
        const auto kernel = a.d == 64 ? attn_prep_rows_kernel<64> : attn_prep_rows_kernel<128>;
        return launch_kernel("attn_prep_rows_kernel", kernel, static_cast<unsigned int>(ops::ceil_div(rows, kPrepRowWarps)),
                             kPrepRowWarps * 32, 0, ctx.stream, a);
    }
    if (a.t > kMaxPrepTokens || rows > kMaxPrepRows || off > kMaxPrepFloats) {
        return internal_error("attn_prep: too many rows for one block");
    }
    const size_t shm = static_cast<size_t>(off) * sizeof(float);
    const int threads = std::min(1024, std::max(32 * rows, 128));
    const auto kernel = a.d == 64 ? attn_prep_kernel<64> : attn_prep_kernel<128>;
    if (shm > 48 * 1024) {
        MOE_CUDA_RETURN_IF_ERROR(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm)));
    }
    return launch_kernel("attn_prep_kernel", kernel, 1, threads, shm, ctx.stream, a);
}

}  // namespace moe::cuda
