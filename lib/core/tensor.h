// Tensors and the op set: the nodes of a compute graph.
//
// A tensor has a type, a shape ne[0..3] (ne[0] fastest, GGUF order), byte strides nb[0..3], and
// either data of its own (a weight, a KV cache, an allocated activation) or a view of another
// tensor's data (view_src + view_offset). A node is a tensor with op != NONE: its value is
// op(src[0], src[1], ...). Backends compute nodes; they never decide where nodes run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

namespace moe {

// The op set. Semantics (shapes are ne order; activations are F32 unless said otherwise; "rows"
// are the ne[0]-contiguous vectors; every op writes a contiguous dst unless it is a view):
enum class Op : int32_t {
    NONE = 0,     // a leaf: weight, input, KV cache
    VIEW,         // dst shares src0's data at view_offset with its own shape/strides (no compute)
    GET_ROWS,     // src0 [K, R] any type, src1 I32 [T] -> [K, T] F32: dst[:, t] = src0[:, src1[t]];
                  // an id of -1 (kNoExpert) gives a zero row
    RMS_NORM,     // src0 [K, ...]; src1 optional F32 [K] weight -> x / sqrt(mean(x^2) + eps) (* w). f[0] = eps
    MUL,          // src0 [K, ...] * src1, src1 broadcast: ne of src1 divides ne of src0 in every dim
    ADD,          // src0 + src1, same broadcasting as MUL
    MUL_MAT,      // src0 weight [K, N] any type, src1 F32 [K, M, ...] -> [N, M, ...]: dst[n,m] = sum_k src0[k,n] src1[k,m]
    MUL_MAT_ID,   // src0 experts [K, N, E], src1 F32 [K, B, T] (B = 1: one input row shared by all of the
                  // token's experts; B = n_used: one row per selected expert), src2 ids I32 [n_used, T]
                  // -> [N, n_used, T]: dst[:, j, t] = src0[:, :, ids[j,t]] . src1[:, B==1 ? 0 : j, t];
                  // an id of -1 (kNoExpert, see MASK_IDS) selects no expert: that dst row is left
                  // unwritten (WEIGHTED_SUM with ids skips it)
    MOE_UP_GATE,  // fused expert up+gate+activation: src0 up [K, F, E], src1 gate [K, F, E], src2 x F32 [K, T],
                  // src3 ids I32 [n_used, T], src4/src5 optional up/gate biases F32 [F, E]
                  // -> [F, n_used, T] = act(gate_e x + bg_e, up_e x + bu_e), act = i[0] (an Activation);
                  // SWIGLU_OAI takes alpha = f[0], limit = f[1] as SWIGLU_OAI below (0 = 1.702 / 7);
                  // rows of kNoExpert ids are left unwritten as in MUL_MAT_ID
    ROPE,         // src0 F32 [D, H, T], src1 positions I32 [T] -> rotated; RopeParams in op_params
    ATTENTION,    // src0 q F32 [D, H, T], src1 k [D, Hkv, n_kv] (F16 or F32), src2 v [D, Hkv, n_kv],
                  // src3 query positions I32 [T], src4 optional sinks F32 [H] -> [D, H, T].
                  // Key j (position j) is visible to a query at position p iff j <= p and
                  // (window == 0 or j > p - window). f[0] = scale, i[0] = window, i[1] = n_kv used.
    SOFTMAX,      // row-wise softmax over ne[0]
    TOPK,         // src0 F32 [E, T] -> I32 [k, T]: indices of the k largest per column, in descending
                  // order of value, ties to the lower index. i[0] = k
    GATHER,       // src0 F32 [E, T], src1 I32 [k, T] -> [k, T]: dst[j, t] = src0[src1[j, t], t]
    WEIGHTED_SUM, // src0 F32 [N, k, T], src1 F32 [k, T] -> [N, T]: sum_j src1[j,t] * src0[:, j, t];
                  // optional src2 ids I32 [k, T]: slots whose id is kNoExpert are skipped (not read)
    SILU,         // x * sigmoid(x)
    SWIGLU,       // src0 gate, src1 up (same shape) -> silu(gate) * up
    SWIGLU_OAI,   // src0 gate, src1 up -> (clamp(up, -L, L) + 1) * g * sigmoid(alpha * g), g = min(gate, L);
                  // f[0] = alpha (1.702), f[1] = L (7)
    CPY,          // src0 F32 -> src1 (a view of a persistent tensor, e.g. the KV cache; F16 or F32):
                  // converts and writes src0 into src1's bytes; dst is a view of src1 (for ordering).
                  // Optional src2 rows I32 [T] (the KV-cache write of a decode step whose nodes stay the
                  // same from token to token): src0 [A, B, T], src1 [A, B, N] and
                  // dst[:, :, rows[t]] = src0[:, :, t]; a row outside [0, N) is an error; the rows must be
                  // distinct (the backends write tokens in parallel)
    MASK_IDS,     // src0 ids I32 [k, T], src1 expert groups I32 [E] -> I32 [k, T]: ids[j, t] where
                  // src1[ids[j, t]] == i[0], else -1 (kNoExpert). Splits one expert block into parts that
                  // compute disjoint sets of experts (the hybrid scheduler's host/device expert split).
                  // i[1] != 0 (remap): src1 maps each expert to a row of the part's weights or -1, and
                  // dst[j, t] = src1[ids[j, t]] (the device part of a partly resident layer, whose
                  // weights are slices of its resident experts); kNoExpert ids stay kNoExpert
    SIGMOID,      // 1 / (1 + exp(-x)): the expert scores of sigmoid routers (glm4moe, deepseek2 V3)
    NORM_SCALE,   // src0 F32 [n, ...] -> same shape: each row times f[0], divided first by (its sum + 1e-20)
                  // when i[0] != 0 (Hugging Face's normalised top-k weights times routed_scaling_factor)
    CONCAT,       // src0 [A, H, T], src1 [B, H or 1, T] -> [A + B, H, T]: each row of src0 followed by
                  // the row of src1 (src1's one row per token repeated over H when its ne[1] = 1); both may
                  // be strided views (multi-head latent attention: q = [W_UK q_nope, q_rope]). Operands and
                  // dst F32 or F16 each (values converted, F16 rounded to nearest even); src1 may be
                  // absent (B = 0: a contiguous copy of src0 in dst's type)
    MUL_MAT_HEADS,  // src0 weight [K, N, H] any matmul type, src1 F32 [K, H, T] (rows may be strided)
                    // -> [N, H, T]: dst[:, h, t] = src0[:, :, h] . src1[:, h, t], one matrix per head
                    // (multi-head latent attention's absorbed W_UK and W_UV)
    GROUP_MASK,   // src0 F32 [E, T] -> [E, T]: the E experts form i[0] groups of consecutive experts, each
                  // scored by the sum of its i[2] largest entries; entries outside the i[1] best groups
                  // (ties to the lower group) become -inf (group-limited routing of DeepSeek-V2/V3)
    COUNT,
};

// The expert id that selects no expert (MASK_IDS output): MUL_MAT_ID and MOE_UP_GATE leave its rows
// unwritten, WEIGHTED_SUM with ids skips them, GET_ROWS gives a zero row.
constexpr int32_t kNoExpert = -1;

const char* op_name(Op op);

enum class Activation : int32_t { SILU = 0, SWIGLU_OAI = 1 };

// ROPE parameters (stored in op_params.f / .i): NeoX layout (rotate the two halves of the first
// n_dims elements) unless `interleaved`. YaRN: ext_factor > 0 blends interpolation and extrapolation per dimension
// between the correction dims of beta_fast and beta_slow; mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))
// scales cos and sin. ggml rounds the correction dims to integers (floor/ceil); Hugging Face does so
// only when the model's rope config says truncate=true, and gpt-oss says false.
struct RopeParams {
    int32_t n_dims = 0;
    int32_t n_ctx_orig = 0;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;   // 1 / YaRN factor
    float ext_factor = 0.0f;   // 0 disables YaRN
    float attn_factor = 1.0f;
    float beta_fast = 32.0f;
    float beta_slow = 1.0f;
    bool yarn_truncate = false;  // round the correction dims (ggml); false = HF with truncate=false
    // Rotate adjacent pairs (2i, 2i + 1) instead of the NeoX halves: ggml's NORM mode, which DeepSeek's
    // interleaved rotary (HF deepseek_v2/v3 apply_rotary_pos_emb) equals.
    bool interleaved = false;
};

// The YaRN ramp over pair indices i: ramp(i) = 1 - clamp((i - lo) / den, 0, 1). One definition for
// every backend: corr dims in float and floor/ceil'd with yarn_truncate (ggml's integers), in double
// otherwise (HF computes them in Python floats; at large positions the angles differ by thousands of
// radians, so a float corr dim would shift the blend visibly).
struct YarnRamp {
    double lo = 0.0;
    double den = 1.0;  // max(0.001, hi - lo)
};
YarnRamp yarn_ramp(const RopeParams& p);

struct OpParams {
    int32_t i[8] = {};
    float f[8] = {};
};

class Buffer;  // backend memory (core/backend.h)

constexpr int kMaxSrc = 6;

struct Tensor {
    Type type = Type::F32;
    int64_t ne[4] = {1, 1, 1, 1};
    size_t nb[4] = {0, 0, 0, 0};  // byte strides; nb[0] = element (or block) size
    void* data = nullptr;         // host pointer on host backends, device pointer on devices
    Buffer* buffer = nullptr;     // where data lives (nullptr until allocated)

    Op op = Op::NONE;
    Tensor* src[kMaxSrc] = {};
    OpParams params;

    Tensor* view_src = nullptr;   // VIEW / CPY: the tensor whose data this one shares
    size_t view_offset = 0;

    bool is_weight = false;       // model weights: placement decides where they live
    bool is_input = false;        // filled by the runtime before compute (tokens, positions)
    bool is_output = false;       // read by the runtime after compute (logits)
    int32_t layer = -1;           // model layer, for stats and placement; -1 = none
    std::string name;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    size_t n_bytes() const;       // of a contiguous tensor of this shape and type
    bool is_contiguous() const;
    RopeParams rope_params() const;
    void set_rope_params(const RopeParams& p);

    template <typename T> T* as() { return static_cast<T*>(data); }
    template <typename T> const T* as() const { return static_cast<const T*>(data); }
    // Pointer to row (i1, i2, i3).
    uint8_t* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
        return static_cast<uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
    }
};

// Sets ne and contiguous strides for `type`.
void set_shape(Tensor& t, Type type, int n_dims, const int64_t* ne);

}  // namespace moe
