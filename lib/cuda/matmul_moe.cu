// MUL_MAT_ID and MOE_UP_GATE: products with the experts that the router picked, with no host round
// trip and no host synchronisation.
//
// Small batches (<= kGemvMaxCols tokens) run one GEMV job per (token, slot) pair that reads its
// expert id on the device (matmul_gemv.cu). Larger batches are grouped by expert on the device:
//   1. count pairs per expert (atomics) and remember each pair's expert; an id outside [0, E) raises
//      kErrorBadIndex, its output column becomes NaN and the pair joins no group (nothing reads out
//      of bounds);
//   2. one block scans the counts into group offsets and per-expert tile offsets (tiles of bn
//      columns);
//   3. each pair takes a slot in its group (atomics): perm lists the pairs sorted by expert. The
//      order inside a group varies from run to run, but every output column is computed on its own,
//      so results do not;
//   4. activations are converted to BF16 once (per token, or per pair row when B = n_used); the
//      grouped tensor-core kernel gathers them through perm while loading its tiles and scatters the
//      results straight into [N, n_used, T], so there is no separate gather or scatter pass.
// Weights of the decoded types (qd::decodes: Q4_1 .. IQ4_XS): with ExpertGemmDecode::FUSED, step 4's
// kernel decodes their tiles itself (matmul_mma.cuh), as for the other quantised types. With SCRATCH, the
// experts that step 1 counted pairs for are dequantised to BF16 rows in scratch first, and step 4 reads
// those, a chunk of experts at a time (expert_chunk): the scratch holds at most 32 experts' or
// kExpertBf16Bytes of BF16 rows (all of a Qwen3-30B layer's up and gate experts would be 805 MB,
// Qwen3-235B's 3.2 GB), each chunk's GEMM taking only its experts' column tiles.
// The grid of step 4 is sized on the host from an upper bound of the number of tiles; CTAs past the
// real count exit at once.
// Steps 1-3 depend only on the ids, so the down product of an expert block takes the route its up/gate
// product left in the scratch block (OpContext::moe_route_ready, planned by expert_route_carries): the
// route's arrays lead every layout, at the same offsets for the same ids. It then only writes NaN into
// the columns of out-of-range ids, as step 1 would have.
#include <algorithm>
#include <string>

#include "cuda/cuda_common.cuh"
#include "cuda/launch.cuh"
#include "cuda/matmul.cuh"
#include "cuda/ops_common.cuh"

namespace moe::cuda::mm {
namespace {

constexpr int kScanThreads = 1024;
// pair_expert of a pair that joins no group: a kNoExpert id (its columns stay unwritten) or an id out
// of range (its columns become NaN).
constexpr int32_t kPairNoExpert = -1;
constexpr int32_t kPairBadId = -2;

__device__ __forceinline__ void write_nan_column(float* dst, int64_t p, int64_t n_out) {
    for (int64_t r = 0; r < n_out; ++r) dst[p * n_out + r] = __int_as_float(0x7FC00000);
}

__global__ void route_count_kernel(const int32_t* ids, int64_t ids_stride, int n_used, int64_t n_pairs, int n_expert,
                                   int32_t* counts, int32_t* pair_expert, float* dst, int64_t n_out,
                                   unsigned int* error_flags) {
    pdl_grid_sync();
    const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= n_pairs) return;
    const int64_t t = p / n_used;
    const int64_t j = p - t * n_used;
    const int32_t e = ids[t * ids_stride + j];
    if (e < 0 || e >= n_expert) {
        if (e == kNoExpert) {  // a pair of another part of a split expert block: not written
            pair_expert[p] = kPairNoExpert;
            return;
        }
        pair_expert[p] = kPairBadId;
        ops::flag_error(error_flags, kErrorBadIndex);
        write_nan_column(dst, p, n_out);
        return;
    }
    pair_expert[p] = e;
    atomicAdd(&counts[e], 1);
}

// seg_off[e + 1] = sum of counts[0..e]; tile_off[e + 1] = sum of ceil(counts / bn); both start at 0.
__global__ void __launch_bounds__(kScanThreads) route_scan_kernel(const int32_t* counts, int n_expert, int bn,
                                                                  int32_t* seg_off, int32_t* tile_off) {
    pdl_grid_sync();
    __shared__ int s_seg[32];
    __shared__ int s_tile[32];
    __shared__ int carry_seg;
    __shared__ int carry_tile;
    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid & 31;
    const int warp = tid >> 5;
    if (tid == 0) {
        carry_seg = 0;
        carry_tile = 0;
        seg_off[0] = 0;
        tile_off[0] = 0;
    }
    __syncthreads();
    for (int base = 0; base < n_expert; base += kScanThreads) {
        const int e = base + tid;
        const int c = e < n_expert ? counts[e] : 0;
        int sc = c;
        int st = (c + bn - 1) / bn;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, sc, o);
            const int b = __shfl_up_sync(0xffffffffu, st, o);
            if (lane >= o) {
                sc += a;
                st += b;
            }
        }
        if (lane == 31) {
            s_seg[warp] = sc;
            s_tile[warp] = st;
        }
        __syncthreads();
        if (warp == 0) {
            int ws = s_seg[lane];
            int wt = s_tile[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int a = __shfl_up_sync(0xffffffffu, ws, o);
                const int b = __shfl_up_sync(0xffffffffu, wt, o);
                if (lane >= o) {
                    ws += a;
                    wt += b;
                }
            }
            s_seg[lane] = ws;
            s_tile[lane] = wt;
        }
        __syncthreads();
        if (e < n_expert) {
            seg_off[e + 1] = carry_seg + (warp > 0 ? s_seg[warp - 1] : 0) + sc;
            tile_off[e + 1] = carry_tile + (warp > 0 ? s_tile[warp - 1] : 0) + st;
        }
        __syncthreads();
        if (tid == 0) {
            carry_seg += s_seg[31];
            carry_tile += s_tile[31];
        }
        __syncthreads();
    }
}

__global__ void route_scatter_kernel(const int32_t* pair_expert, int64_t n_pairs, const int32_t* seg_off,
                                     int32_t* cursor, int32_t* perm) {
    pdl_grid_sync();
    const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p >= n_pairs) return;
    const int32_t e = pair_expert[p];
    if (e < 0) return;
    perm[seg_off[e] + atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(p);
}

// A product that reuses a route: the NaN columns of its out-of-range ids (the route's builder flagged them).
__global__ void route_bad_columns_kernel(const int32_t* pair_expert, int64_t n_pairs, float* dst, int64_t n_out) {
    pdl_grid_sync();
    const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (p < n_pairs && pair_expert[p] == kPairBadId) write_nan_column(dst, p, n_out);
}

bool use_gemv(const MoeArgs& a) { return moe_takes_gemv(a); }

// Whether the tensor-core path dequantises the routed experts to BF16 scratch rows first.
bool dequantises_experts(const MoeArgs& a) { return qd::decodes(a.w.type) && a.decode == ExpertGemmDecode::SCRATCH; }

// Scratch for the BF16 rows of a chunk of decoded experts (up and gate together), and at most
// kMaxChunkExperts experts per chunk; a chunk is one expert where an expert alone is larger. Chunks of 32
// experts or 256 MiB keep the tensor-core kernel's grid at about a wave or more per chunk for the Qwen3
// shapes at pp512 (32 of 128 experts for 30B up+gate, 10 for 235B), and the count bound keeps many small
// experts to small chunks too.
constexpr size_t kExpertBf16Bytes = size_t{256} << 20;
constexpr int64_t kMaxChunkExperts = 32;

// Experts per chunk: as many as the bounds allow, then evened out over the chunks that takes.
int64_t expert_chunk(const MoeArgs& a) {
    const size_t per_expert = static_cast<size_t>(a.w.n * a.w.k) * 2 * (a.fused ? 2 : 1);
    const int64_t fit = std::clamp<int64_t>(static_cast<int64_t>(kExpertBf16Bytes / std::max<size_t>(per_expert, 1)),
                                            1, kMaxChunkExperts);
    const int64_t n_expert = std::max<int64_t>(a.w.n_expert, 1);
    const int64_t chunks = (n_expert + fit - 1) / fit;
    return (n_expert + chunks - 1) / chunks;
}

// The BF16 rows [n_chunk][N][K] at data that dequant_experts_bf16 made of n_chunk experts of w.
WeightArg bf16_experts(const WeightArg& w, void* data, int64_t n_chunk) {
    WeightArg b = w;
    b.type = Type::BF16;
    b.data = static_cast<const uint8_t*>(data);
    b.nb1 = 2 * w.k;
    b.nb2 = b.nb1 * w.n;
    b.end = b.data + b.nb2 * n_chunk;
    b.constant = false;
    return b;
}

struct MoeLayout {
    void* acts = nullptr;
    int32_t* counts = nullptr;  // [2 E]: counts, then the scatter cursors
    int32_t* seg_off = nullptr;
    int32_t* tile_off = nullptr;
    int32_t* pair_expert = nullptr;
    int32_t* perm = nullptr;
    void* w_bf16 = nullptr;     // dequantises_experts: a chunk of experts (and the gate's) as BF16 rows [chunk][N][K]
    void* gate_bf16 = nullptr;
    int64_t chunk = 0;          // experts per chunk
};

MoeLayout moe_layout(const MoeArgs& a, Carver& c) {
    MoeLayout l;
    const int64_t x_rows = a.b_rows * a.n_tokens;
    if (use_gemv(a)) {
        l.acts = c.take<uint8_t>(static_cast<size_t>(x_rows) * gemv_act_row_bytes(a.w.type, a.w.k));
        return l;
    }
    // The route first: its offsets depend only on the experts and pairs (see moe_routes_match).
    const size_t e = static_cast<size_t>(a.w.n_expert);
    const size_t pairs = static_cast<size_t>(a.n_used * a.n_tokens);
    l.counts = c.take<int32_t>(2 * e);
    l.seg_off = c.take<int32_t>(e + 1);
    l.tile_off = c.take<int32_t>(e + 1);
    l.pair_expert = c.take<int32_t>(pairs);
    l.perm = c.take<int32_t>(pairs);
    l.acts = c.take<uint16_t>(static_cast<size_t>(x_rows * a.w.k));
    if (dequantises_experts(a)) {
        l.chunk = expert_chunk(a);
        const size_t n = static_cast<size_t>(l.chunk * a.w.n * a.w.k);
        l.w_bf16 = c.take<uint16_t>(n);
        if (a.fused) l.gate_bf16 = c.take<uint16_t>(n);
    }
    return l;
}

}  // namespace

bool moe_takes_gemv(const MoeArgs& a) {
    return a.n_tokens <= kGemvMaxCols && a.n_used * a.n_tokens <= static_cast<int64_t>(ops::kMaxGridYZ);
}

bool moe_routes_match(const MoeArgs& built, const MoeArgs& next) {
    return !use_gemv(built) && !use_gemv(next) && built.w.n > 0 && built.n_used * built.n_tokens > 0 &&
           built.ids == next.ids && built.ids_stride == next.ids_stride && built.n_used == next.n_used &&
           built.n_tokens == next.n_tokens && built.w.n_expert == next.w.n_expert;
}

size_t moe_scratch(const MoeArgs& a) {
    Carver c(nullptr);
    (void)moe_layout(a, c);
    return c.used();
}

Status moe_run(const MoeArgs& a, const OpContext& ctx) {
    const int64_t n_pairs = a.n_used * a.n_tokens;
    if (n_pairs == 0 || a.w.n == 0) return Status::ok();
    Carver c(ctx.scratch);
    const MoeLayout l = moe_layout(a, c);
    if (c.used() > ctx.scratch_size) {
        return internal_error("cuda expert matmul: scratch of " + std::to_string(ctx.scratch_size) + " bytes, " +
                              std::to_string(c.used()) + " needed");
    }
    const int64_t x_rows = a.b_rows * a.n_tokens;
    const WeightArg* gate = a.fused ? &a.gate : nullptr;
    const GluParams* glu = a.fused ? &a.glu : nullptr;

    if (ctx.moe_route_ready && use_gemv(a)) return internal_error("cuda expert matmul: a route handed to a GEMV");
    if (use_gemv(a)) {
        const void* acts = l.acts;
        if (ctx.q8_act != nullptr && q8_acts(a.w.type) && a.b_rows == 1) {
            acts = ctx.q8_act;  // quantised already by the norm that produced x (fusion_plan.h)
        } else {
            MOE_RETURN_IF_ERROR(gemv_prepare(a.x, x_rows, a.w.k, a.w.type, l.acts, ctx.stream));
        }
        GemvRoute r;
        r.ids = a.ids;
        r.ids_stride = a.ids_stride;
        r.n_used = static_cast<int>(a.n_used);
        r.b_rows = static_cast<int>(a.b_rows);
        r.n_pairs = n_pairs;
        r.n_sm = ctx.n_sm;
        r.error_flags = ctx.error_flags;
        r.bias = a.bias;
        return gemv(a.w, gate, acts, 1, &r, glu, a.dst, ctx.stream);
    }

    if (a.bias.rows != nullptr) return internal_error("cuda expert matmul: bias rows in the epilogue need the GEMV path");
    const int n_expert = static_cast<int>(a.w.n_expert);
    const int bn = mma_route_tile_cols(static_cast<double>(n_pairs) / static_cast<double>(std::min<int64_t>(n_expert, n_pairs)));
    constexpr int kThreads = 256;
    const auto pair_blocks = static_cast<unsigned int>((n_pairs + kThreads - 1) / kThreads);
    if (ctx.moe_route_ready) {
        MOE_RETURN_IF_ERROR(launch_kernel("route_bad_columns_kernel", route_bad_columns_kernel, pair_blocks, kThreads, 0,
                                          ctx.stream, l.pair_expert, n_pairs, a.dst, a.w.n));
    } else {
        MOE_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(l.counts, 0, sizeof(int32_t) * 2 * static_cast<size_t>(n_expert), ctx.stream));
        MOE_RETURN_IF_ERROR(launch_kernel("route_count_kernel", route_count_kernel, pair_blocks, kThreads, 0, ctx.stream,
                                          a.ids, a.ids_stride, static_cast<int>(a.n_used), n_pairs, n_expert, l.counts,
                                          l.pair_expert, a.dst, a.w.n, ctx.error_flags));
        MOE_RETURN_IF_ERROR(launch_kernel("route_scan_kernel", route_scan_kernel, 1, kScanThreads, 0, ctx.stream,
                                          l.counts, n_expert, bn, l.seg_off, l.tile_off));
        MOE_RETURN_IF_ERROR(launch_kernel("route_scatter_kernel", route_scatter_kernel, pair_blocks, kThreads, 0,
                                          ctx.stream, l.pair_expert, n_pairs, l.seg_off, l.counts + n_expert, l.perm));
    }
    MOE_RETURN_IF_ERROR(prepare_bf16(a.x, x_rows, a.w.k, l.acts, ctx.stream));

    MmaRoute route;
    route.tile_off = l.tile_off;
    route.seg_off = l.seg_off;
    route.perm = l.perm;
    route.n_expert = n_expert;
    route.n_used = static_cast<int>(a.n_used);
    route.b_rows = static_cast<int>(a.b_rows);
    route.x_rows = x_rows;
    // Each non-empty expert adds at most one partial tile.
    route.max_tiles = n_pairs / bn + std::min<int64_t>(n_expert, n_pairs) + 1;
    if (!dequantises_experts(a)) return mma_gemm(a.w, a.fused ? &a.gate : nullptr, l.acts, 0, &route, bn, glu, a.dst, ctx.stream);

    // Decoded types through scratch, a chunk of experts at a time: the chunk's routed experts as BF16 rows
    // (the others are skipped), then the BF16 kernel over the chunk's column tiles.
    for (int64_t e0 = 0; e0 < n_expert; e0 += l.chunk) {
        const int64_t e1 = std::min<int64_t>(n_expert, e0 + l.chunk);
        MOE_RETURN_IF_ERROR(dequant_experts_bf16(a.w, e0, e1, l.counts, l.w_bf16, ctx.stream));
        const WeightArg w = bf16_experts(a.w, l.w_bf16, e1 - e0);
        WeightArg gw{};
        if (a.fused) {
            MOE_RETURN_IF_ERROR(dequant_experts_bf16(a.gate, e0, e1, l.counts, l.gate_bf16, ctx.stream));
            gw = bf16_experts(a.gate, l.gate_bf16, e1 - e0);
        }
        route.e_lo = static_cast<int>(e0);
        route.e_hi = static_cast<int>(e1);
        route.max_tiles = n_pairs / bn + std::min<int64_t>(e1 - e0, n_pairs) + 1;
        MOE_RETURN_IF_ERROR(mma_gemm(w, a.fused ? &gw : nullptr, l.acts, 0, &route, bn, glu, a.dst, ctx.stream));
    }
    return Status::ok();
}

}  // namespace moe::cuda::mm
