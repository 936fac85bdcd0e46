// The driver of the BF16 path (kernels in matmul_bf16.h; the super-block kinds' int8 tiles in
// matmul_i8.h): packs the activations of each expert's (token, slot) pairs into blocks of 16 once per
// op, cuts the work into jobs of (expert, <= 64 weight rows, <= 64 pairs), decodes each job's weights
// chunk by chunk and hands every finished F32 tile to the caller, which writes it out (plain product,
// or MOE_UP_GATE's activation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace moe::cpu::bf16path {

// One weight tensor [k, n_rows, n_expert] of a quantised kind (mm::WeightKind).
struct Operand {
    const uint8_t* data;
    size_t row_stride;     // bytes
    size_t expert_stride;  // bytes
    int kind;
};

// A finished job: acc[i][r * stride + c] = dot(row r0 + r of operand i's expert, pair first + c)
// for r < nr <= kMaxTileRows, c < nc.
constexpr int64_t kMaxTileRows = 64;
struct Tile {
    int32_t expert;
    int64_t r0, nr;
    int64_t first, nc;
    const float* acc[2];
    int64_t stride;
};

struct Problem {
    Operand w[2];
    int n_w;  // 1, or 2 (MOE_UP_GATE: both computed per job from the same activations)
    int64_t k;  // % 32 == 0 (every quantised kind)
    int64_t n_rows;
    int64_t n_expert;
    const int32_t* offsets;  // pairs of expert e: [offsets[e], offsets[e + 1])
    const int32_t* act_idx;  // activation row of each pair, or nullptr: pair i reads row i
    std::function<const float*(int64_t row)> act_row;
    std::function<void(const Tile&)> store;  // called from the worker threads, once per job
};

// Whether the BF16 path takes a product of weights of `kind` with n_pairs (token, slot) pairs spread
// over at most n_expert experts, on this CPU (cpu_features(), bf16_path()).
bool wanted(int kind, int64_t n_pairs, int64_t n_expert);

// Scratch bytes run() needs for these sizes (an upper bound, known before the pairs are grouped).
size_t scratch_bytes(int64_t k, int64_t n_rows, int64_t n_expert, int64_t n_pairs);

// REQUIRES: wanted() said yes; scratch: 64-byte aligned, scratch_bytes() long.
void run(const Problem& p, uint8_t* scratch);

}  // namespace moe::cpu::bf16path
