#include "core/models/mla_split.h"

#include <cstring>

namespace moe {
namespace {

// Element i of a row of `type` floats (F32 or F16) at dst.
void put(Type type, uint8_t* dst, int64_t i, float v) {
    if (type == Type::F32) {
        std::memcpy(dst + i * 4, &v, 4);
    } else {
        const uint16_t h = fp32_to_fp16(v);
        std::memcpy(dst + i * 2, &h, 2);
    }
}

}  // namespace

StatusOr<std::vector<DerivedWeight>> split_kv_b(const HParams& hp, const GgufFile& file) {
    std::vector<DerivedWeight> out;
    if (hp.arch != Arch::DEEPSEEK2) return out;
    const int64_t C = hp.kv_lora_rank, H = hp.n_head, Dn = hp.head_dim - hp.rope_dims, Dv = hp.head_dim_v;
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const GgufTensorInfo* kv_b = file.find_tensor(p + "attn_kv_b.weight");
        if (kv_b == nullptr || file.find_tensor(p + "attn_k_b.weight") != nullptr) continue;
        if (kv_b->n_dims != 2 || kv_b->ne[0] != C || kv_b->ne[1] != H * (Dn + Dv)) {
            return data_corrupt("tensor '" + kv_b->name + "': expected shape [" + std::to_string(C) + ", " +
                                std::to_string(H * (Dn + Dv)) + "], got [" + std::to_string(kv_b->ne[0]) + ", " +
                                std::to_string(kv_b->ne[1]) + "]");
        }
        const TypeTraits& tt = traits(kv_b->type);
        if (tt.to_float == nullptr) {
            return unimplemented("tensor '" + kv_b->name + "': type " + tt.name + " has no float conversion");
        }
        const Type type = kv_b->type == Type::F32 ? Type::F32 : Type::F16;
        const size_t esz = type == Type::F32 ? 4 : 2;
        DerivedWeight k{p + "attn_k_b.weight", type, {Dn, C, H}, {}};
        DerivedWeight v{p + "attn_v_b.weight", type, {C, Dv, H}, {}};
        k.data.resize(static_cast<size_t>(Dn * C * H) * esz);
        v.data.resize(static_cast<size_t>(C * Dv * H) * esz);
        const uint8_t* src = file.tensor_data(*kv_b);
        const size_t row_b = static_cast<size_t>(row_bytes(kv_b->type, C));
        std::vector<float> row(static_cast<size_t>(C));
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t j = 0; j < Dn + Dv; ++j) {
                tt.to_float(src + static_cast<size_t>(h * (Dn + Dv) + j) * row_b, row.data(), C);
                for (int64_t c = 0; c < C; ++c) {
                    if (j < Dn) {
                        put(type, k.data.data(), (h * C + c) * Dn + j, row[static_cast<size_t>(c)]);  // [Dn, C, H]
                    } else {
                        put(type, v.data.data(), (h * Dv + (j - Dn)) * C + c, row[static_cast<size_t>(c)]);  // [C, Dv, H]
                    }
                }
            }
        }
        out.push_back(std::move(k));
        out.push_back(std::move(v));
    }
    return out;
}

}  // namespace moe
