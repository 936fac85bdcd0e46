// ATTENTION with explicit tiling, for tests that must reach every code path (block edges, the
// split-K decode path, the single-pass path) on small shapes. cpu::attention() is
// attention_tuned(dst, scratch, {}).
#pragma once

#include <cstdint>

#include "cpu/cpu_ops.h"

namespace moe::cpu {

struct AttentionTuning {
    int32_t key_block = 0;   // keys converted and scored together; 0 = default (64)
    int32_t query_tile = 0;  // tokens per task (each task takes all H/Hkv heads of one KV head); 0 = default
    int32_t n_split = 0;     // key-range splits per task, reduced at the end; 0 = automatic, 1 = never
};

Status attention_tuned(Tensor& dst, Scratch& scratch, const AttentionTuning& tuning);

}  // namespace moe::cpu
