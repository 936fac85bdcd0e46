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

StatusOr<std::vector<DerivedWeight>> join_kv_b(const HParams& hp, const GgufFile& file) {
    std::vector<DerivedWeight> out;
    const int64_t C = hp.kv_lora_rank, H = hp.n_head, Dn = hp.head_dim - hp.rope_dims, Dv = hp.head_dim_v;
    if (hp.arch != Arch::DEEPSEEK2 || Dv != Dn) return out;  // only the prefill form reads it, and only where Dv = Dn
    const auto shape_error = [](const GgufTensorInfo& t, int64_t a, int64_t b, int64_t c) {
        return data_corrupt("tensor '" + t.name + "': expected shape [" + std::to_string(a) + ", " + std::to_string(b) +
                            ", " + std::to_string(c) + "], got [" + std::to_string(t.ne[0]) + ", " +
                            std::to_string(t.ne[1]) + ", " + std::to_string(t.n_dims > 2 ? t.ne[2] : 1) + "]");
    };
    const int64_t n_rows = H * (Dn + Dv);
    std::vector<float> joint, row;  // one layer's, kept for the next
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const GgufTensorInfo* k_b = file.find_tensor(p + "attn_k_b.weight");
        const GgufTensorInfo* v_b = file.find_tensor(p + "attn_v_b.weight");
        if (k_b == nullptr || v_b == nullptr || file.find_tensor(p + "attn_kv_b.weight") != nullptr) continue;
        if (k_b->n_dims != 3 || k_b->ne[0] != Dn || k_b->ne[1] != C || k_b->ne[2] != H) {
            return shape_error(*k_b, Dn, C, H);
        }
        if (v_b->n_dims != 3 || v_b->ne[0] != C || v_b->ne[1] != Dv || v_b->ne[2] != H) {
            return shape_error(*v_b, C, Dv, H);
        }
        for (const GgufTensorInfo* t : {k_b, v_b}) {
            if (traits(t->type).to_float == nullptr) {
                return unimplemented("tensor '" + t->name + "': type " + traits(t->type).name +
                                     " has no float conversion");
            }
        }
        const auto is_float = [](Type t) { return t == Type::F32 || t == Type::F16 || t == Type::BF16; };
        Type type = Type::Q8_0;
        if (is_float(k_b->type) && is_float(v_b->type)) type = k_b->type == v_b->type ? k_b->type : Type::F32;
        if (type == Type::Q8_0 && C % traits(Type::Q8_0).block_size != 0) type = Type::F16;
        // The joint matrix in floats, row h * (Dn + Dv) + j: W_UK_h row j (column j of k_b's head h) for
        // j < Dn, then W_UV_h row j - Dn (v_b's row of head h).
        joint.resize(static_cast<size_t>(n_rows * C));
        row.resize(static_cast<size_t>(Dn));
        const size_t k_row_b = static_cast<size_t>(row_bytes(k_b->type, Dn));
        const size_t v_row_b = static_cast<size_t>(row_bytes(v_b->type, C));
        for (int64_t h = 0; h < H; ++h) {
            float* head = joint.data() + h * (Dn + Dv) * C;
            for (int64_t c = 0; c < C; ++c) {  // k_b's row (c, h) holds W_UK_h[:, c]
                const uint8_t* k_row = file.tensor_data(*k_b) + static_cast<size_t>(h * C + c) * k_row_b;
                traits(k_b->type).to_float(k_row, row.data(), Dn);
                for (int64_t j = 0; j < Dn; ++j) head[j * C + c] = row[static_cast<size_t>(j)];
            }
            for (int64_t j = 0; j < Dv; ++j) {
                traits(v_b->type).to_float(file.tensor_data(*v_b) + static_cast<size_t>(h * Dv + j) * v_row_b,
                                           head + (Dn + j) * C, C);
            }
        }
        DerivedWeight kv{p + "attn_kv_b.weight", type, {C, n_rows, 1}, {}};
        const size_t out_row_b = static_cast<size_t>(row_bytes(type, C));
        kv.data.resize(out_row_b * static_cast<size_t>(n_rows));
        for (int64_t r = 0; r < n_rows; ++r) {  // exact for F32, F16 and BF16: the values came from that type
            traits(type).from_float(joint.data() + r * C, kv.data.data() + static_cast<size_t>(r) * out_row_b, C);
        }
        out.push_back(std::move(kv));
    }
    return out;
}

}  // namespace moe
