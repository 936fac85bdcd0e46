// deepseek2's K/V up-projections in both forms, whichever the file lacks made at load: the per-head
// attn_k_b / attn_v_b that the absorbed attention (decode) multiplies by, and the joint attn_kv_b that
// decompresses the cached latent into per-head keys and values (prefill, graph_deepseek2.cpp). Files
// converted before llama.cpp split attn_kv_b hold only the joint one; newer files only the split ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/models/hparams.h"
#include "core/status.h"
#include "core/types.h"

namespace moe {

// A weight made from the file's tensors: its name, type, shape (GGUF order) and bytes.
struct DerivedWeight {
    std::string name;
    Type type = Type::F32;
    int64_t ne[3] = {1, 1, 1};
    std::vector<uint8_t> data;
};

// For every layer with blk.N.attn_kv_b.weight ([kv_lora_rank, n_head * (nope + head_dim_v)]: per head,
// nope rows of W_UK then head_dim_v rows of W_UV) and no blk.N.attn_k_b.weight: attn_k_b ([nope,
// kv_lora_rank, n_head], W_UK transposed per head, as llama.cpp's converter writes it) and attn_v_b
// ([kv_lora_rank, head_dim_v, n_head]). F32 from an F32 attn_kv_b, F16 otherwise (the values of a
// quantised tensor, rounded to F16). Nothing for other architectures or split files. DATA_CORRUPT for an
// attn_kv_b of another shape, UNIMPLEMENTED for a type without a float conversion.
StatusOr<std::vector<DerivedWeight>> split_kv_b(const HParams& hp, const GgufFile& file);

// For every layer with blk.N.attn_k_b.weight and attn_v_b.weight and no attn_kv_b.weight: attn_kv_b
// ([kv_lora_rank, n_head * (nope + head_dim_v)], the layout split_kv_b reads). F32, F16 or BF16 when both are
// that type, F32 when both are of float types but differ, else Q8_0 of their values (~1 GB for DeepSeek-V3's
// 61 layers, half of F16). Nothing for other architectures, joint files, or head_dim_v != nope (where the
// prefill form, its only reader, does not run: model_graph.h mla_decompressed). DATA_CORRUPT for a k_b or v_b
// of another shape, UNIMPLEMENTED for a type without a float conversion.
StatusOr<std::vector<DerivedWeight>> join_kv_b(const HParams& hp, const GgufFile& file);

}  // namespace moe
