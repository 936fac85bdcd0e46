// Which nodes of a span the CUDA backend computes together in one launch, decided per compute() call
// from the span alone (plain host code, no CUDA calls). Decoding runs ~30 small kernels per layer, each
// a few microseconds; these launches replace the commonest runs of them:
//   kGemvGroup  consecutive MUL_MATs of one activation on the GEMV path (q, k, v), each optionally
//               followed by an ADD of a bias row: one quantisation, one GEMV launch over all weights,
//               the bias added in the epilogue;
//   kRowChain   [WEIGHTED_SUM] [ADD] RMS_NORM over rows of up to kMaxChainRow floats (the residual
//               add and the next norm): one block per row, optionally also writing the norm's result
//               quantised to Q8 into an activation slot (below);
//   kRouter     TOPK, GATHER of the chosen logits, SOFTMAX of them: one warp per token;
//   kAttnPrep   the attention prologue: [RMS_NORM q, k] ROPE q, k [CPY k, v into the KV cache], one
//               block for a few tokens (per-head norms, rotation and cache writes of every head), or a
//               warp per (head, token) row over many blocks where the outputs lie apart (prefills too);
//   kMoeBias    MUL_MAT_ID on the GEMV path, GET_ROWS of the experts' bias rows by the same ids, ADD
//               of the two (GPT-OSS's down projection): the bias rows picked and added in the GEMV
//               epilogue, all three results written;
//   kRouterGemv the router's product of one token with float weights [ADD bias] and its kRouter parts:
//               the GEMV's last block (a fence and a counter) selects the experts;
//   kDenseGroup consecutive MUL_MATs of one activation on the dequantise + cuBLAS path (prefill q, k,
//               v without bias adds): one BF16 copy of the activation, then each product's
//               dequantisation and GEMM in node order.
//   kSigmoidRouter the sigmoid router (glm4moe, deepseek2 V3 / Kimi-K2): SIGMOID of the logits, [ADD of
//               the selection bias], [GROUP_MASK], TOPK, GATHER of the unbiased scores, NORM_SCALE: one
//               warp per token (sigmoid_router_parts below says which spans qualify).
// Besides fusing, the plan lets an expert block's down product on the tensor cores take the route (its
// tokens grouped by expert) that the up/gate product launched right before it built from the same ids
// (LaunchItem::route_from_prev): one small launch per prefill layer instead of a memset and three.
// A Q8 activation slot holds the norm's result as the GEMV kernels read it (int8 rows and a scale per
// 32 values, exactly what their own quantisation would write): the GEMV nodes that read that tensor
// later (q, k, v; the experts' up/gate) take it from the slot instead of quantising it again. An
// ATTENTION node on the FP32 kernel fills a slot the same way for the output projection, which reads
// its result as rows of n_head * D values.
//
// Correctness rests on memory ranges: parts of a launch are consecutive nodes; a fused kernel reads
// every input of a row before writing any output of it and writes outputs in node order, and where
// several blocks run, every pair of an output and another tensor of the launch is either disjoint or
// the very same rows (equal data and strides). A slot is used only while no node between its producer
// and its consumer writes bytes of the norm's result. Every part must pass its own op's checks, so a
// node the kernels would refuse is never fused and reports its error as before.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace moe::cuda {

enum class FusedKind : uint8_t {
    kNone = 0,
    kGemvGroup,
    kRowChain,
    kRouter,
    kAttnPrep,
    kMoeBias,
    kRouterGemv,
    kDenseGroup,
    kSigmoidRouter
};
constexpr int kFusedKinds = 9;

constexpr int kMaxParts = 6;         // a group of 3 MUL_MAT + ADD pairs
constexpr int kMaxQ8Slots = 4;
// kAttnPrep in one block (attn_prep_kernel): its tokens, (head, token) rows (4 per warp of 32) and
// shared memory. Launches whose outputs lie apart (attn_prep_rows_apart: prefills too) have no limits.
constexpr int kMaxPrepTokens = 4;
constexpr int kMaxPrepRows = 128;
constexpr int64_t kMaxPrepFloats = 24 * 1024;  // its shared memory: tables and rows, 96 KiB
constexpr int64_t kMaxChainRow = 8192;  // floats per row of a kRowChain launch (8 per thread of 1024)

struct LaunchItem {
    Tensor* node = nullptr;  // == part[0]: the launch happens where this node was
    FusedKind kind = FusedKind::kNone;
    std::array<Tensor*, kMaxParts> part{};  // every node this launch computes, in span order
    int n_part = 1;
    int q8_in = -1;   // the activation's Q8 rows are ready in this slot (GEMV nodes, kGemvGroup)
    int q8_out = -1;  // the result (kRowChain: the RMS_NORM's; an ATTENTION node's) is also written to
                      // this slot as Q8 rows
    bool route_from_prev = false;  // a MUL_MAT_ID that takes the expert route the previous item (an
                                   // expert product of the same ids) built (expert_route_carries)

    // What the launch does besides its nodes' own words (for CUDA graph signatures).
    uint64_t tag() const {
        return static_cast<uint64_t>(kind) | static_cast<uint64_t>(n_part) << 8 |
               static_cast<uint64_t>(q8_in + 1) << 16 | static_cast<uint64_t>(q8_out + 1) << 24 |
               static_cast<uint64_t>(route_from_prev) << 32;
    }
};

struct FusionPlan {
    std::vector<LaunchItem> items;  // in launch order; nodes that are parts of an item appear only there
    size_t slot_bytes = 0;          // bytes of one Q8 slot (0: no slots used)
    int n_slots = 0;
};

// The nodes of a kSigmoidRouter launch by role; add and mask are nullptr where the span has none.
struct SigmoidRouterParts {
    Tensor* sigmoid = nullptr;  // scores = SIGMOID(logits F32 [E, T])
    Tensor* add = nullptr;      // choice = scores + bias (F32 [E])
    Tensor* mask = nullptr;     // GROUP_MASK of the choice
    Tensor* topk = nullptr;     // ids I32 [k, T] of the (masked) choice
    Tensor* gather = nullptr;   // the scores of the ids
    Tensor* norm = nullptr;     // NORM_SCALE of those: the weights
};
constexpr int64_t kMaxSigmoidRouterExperts = 512;  // experts per token held in one warp's registers
constexpr int kMaxSigmoidRouterGroups = 32;
constexpr int kMaxSigmoidRouterTokens = 32;  // one warp each, one block
// Whether `parts` (consecutive nodes) form a sigmoid router the fused kernel computes as the separate
// kernels would: SIGMOID [ADD of an [E] row to its result] [GROUP_MASK of the choice, at most
// kMaxSigmoidRouterGroups groups] TOPK of the choice, GATHER(scores, ids), NORM_SCALE of the gather;
// F32 rows with unit element stride, E <= kMaxSigmoidRouterExperts, 1..kMaxSigmoidRouterTokens tokens,
// k <= 32; every part passes its op's checks. Fills *out when so.
bool sigmoid_router_parts(std::span<Tensor* const> parts, SigmoidRouterParts* out);

// Queries the planner asks of the kernels (matmul.cu); each answers from shapes and types only.
// The activation a GEMV node quantises to Q8 (MUL_MAT, MOE_UP_GATE, MUL_MAT_ID with one row per token,
// small batch, quantised weights), or nullptr.
const Tensor* gemv_q8_activation(const Tensor& node);
// True when MUL_MAT `node` passes its checks and takes the GEMV path.
bool mul_mat_takes_gemv(const Tensor& node);
// True when MUL_MAT `node` passes its checks and takes the dequantise + cuBLAS path (gemm_dense).
bool mul_mat_takes_dequant_gemm(const Tensor& node);
// True when MUL_MAT `node` passes its checks and takes the float-weight row kernel of the GEMV (one
// block per output row: F32 / F16 / BF16 weights of at most 1024 rows) with one activation row.
bool mul_mat_takes_row_kernel(const Tensor& node);
// True when MUL_MAT_ID `node` passes its checks and takes the GEMV path (one job per routed pair).
bool mul_mat_id_takes_gemv(const Tensor& node);
// True when MUL_MAT_ID `next`, launched right after the expert product `built` (MOE_UP_GATE or
// MUL_MAT_ID), may take the route (pairs grouped by expert) that `built` leaves in the scratch block:
// both pass their checks and are grouped on the tensor cores with the same ids, pairs and expert
// count, and `built` writes no byte of the ids (LaunchItem::route_from_prev).
bool expert_route_carries(const Tensor& built, const Tensor& next);
// Where a span of nodes may be cut into two compute() calls at no cost (CudaBackend::cut_after): after an
// expert block's up/gate GEMV (decode), or after its down product on the tensor cores (prefill: not
// between up/gate and down, whose route it takes). No fused launch or Q8 hand-off crosses these nodes.
bool span_cut_after(const Tensor& node);
// Where the CUDA backend cuts a step (CudaBackend::cut_after): at the span_cut_after nodes of layers 0, 1,
// 3, 7, 15, ... Each cut ends a graph launch, across which kernels do not overlap (graph_runner.h), so the
// spans double in length: the host prepares each while the device computes the one before (half as long,
// but the host's share of a layer is a fraction of the device's), with ~log2(layers) cuts per step.
bool step_cut_after(const Tensor& node);
// Whether the parts of a kAttnPrep item (as matched: norms, ropes, copies) may run a warp per (head,
// token) row over several blocks, with no barrier between one row's reads and another row's writes:
// every output (norm, rope and copy rows) is disjoint from every other tensor the launch reads or
// writes, except the rows of its own stream (a head's input, norm, rope and the copy of that rope)
// where the two are exactly the same rows and no other stream reads them.
bool attn_prep_rows_apart(std::span<Tensor* const> parts);
// Whether a kAttnPrep cache write (CPY `cpy`, its src0 present) has the shapes the fused prologue writes:
// src0's own, or with rows (CPY's src2) [A, B, T] into [A, B, N] with an I32 row index per token.
bool cache_write_fits(const Tensor& cpy);
// True when ATTENTION `node` passes its checks and can also write its result as Q8 rows of n_head * D
// values per token (ops_attention.cu: the FP32 kernel, dense output).
bool attention_writes_q8(const Tensor& node);

// Parts of a kGemvGroup item (MUL_MAT [ADD bias] ...): dead[p] for a MUL_MAT part that the launch need not
// write: it is followed by its bias ADD, is no graph output, no other part reads it, and a later part's
// output overwrites bytes of it. (The memory plan reuses bytes only of tensors whose last reader has run,
// so nothing reads the product after that part; unfused, the bias ADD was its only reader in between.)
// The planner's disjointness rules and the launch both use this.
void group_dead_products(std::span<Tensor* const> parts, std::array<bool, kMaxParts>& dead);

// Bytes of one Q8 activation row of k values as the GEMV kernels read it: int8 qs[k], float d[k / 32],
// rounded up to 16.
inline size_t q8_row_bytes(int64_t k) {
    const size_t bytes = static_cast<size_t>(k) + 4 * static_cast<size_t>(k / 32);
    return (bytes + 15) & ~size_t{15};
}

// Bytes [lo, hi) of a tensor's elements (views included).
struct ByteRange {
    uintptr_t lo = 0, hi = 0;
    bool overlaps(const ByteRange& o) const { return lo < o.hi && o.lo < hi; }
};
ByteRange byte_range(const Tensor& t);

// Plans `nodes` (every one launches kernels: no NONE / VIEW). With enabled == false every node is its
// own item and no slot is used.
void plan_fusions(std::span<Tensor* const> nodes, bool enabled, FusionPlan& out);

}  // namespace moe::cuda
