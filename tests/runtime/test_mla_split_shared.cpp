// deepseek2 files converted before llama.cpp split attn_kv_b: the split (mla_split.h) is made once per
// model and shared by its contexts, not copied by each (~2 GB per context for DeepSeek-V3). Two contexts
// created at once on one such model bind their attn_k_b / attn_v_b to the model's one copy, and give
// bitwise the same logits as each other and as a context made after them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/gguf_edit.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "core/types.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "runtime/model.h"

namespace {

// The values of tensor `name` of f as floats.
std::vector<float> tensor_floats(const moe::GgufFile& f, const std::string& name) {
    const moe::GgufTensorInfo* t = f.find_tensor(name);
    REQUIRE(t != nullptr);
    std::vector<float> out(static_cast<size_t>(t->n_elements()));
    REQUIRE(moe::traits(t->type).to_float != nullptr);
    moe::traits(t->type).to_float(f.tensor_data(*t), out.data(), t->n_elements());
    return out;
}

// `split` (a synthetic deepseek2 file) as converted before the split: per layer the joint
// attn_kv_b [C, H * (Dn + Dv)] (per head, Dn rows of W_UK then Dv rows of W_UV) instead of attn_k_b
// [Dn, C, H] / attn_v_b [C, Dv, H], and the per-head sizes in key_length / value_length.
void write_joint_kv_b(const moe_model& split, const std::string& dst) {
    const moe::HParams& hp = split.hparams;
    const int64_t C = hp.kv_lora_rank, H = hp.n_head, Dv = hp.head_dim_v, Dn = hp.head_dim - hp.rope_dims;
    moe::test::GgufEdit edit;
    edit.metadata["deepseek2.attention.key_length"] = static_cast<uint32_t>(hp.head_dim);
    edit.metadata["deepseek2.attention.value_length"] = static_cast<uint32_t>(Dv);
    edit.metadata["deepseek2.attention.key_length_mla"] = std::monostate{};
    edit.metadata["deepseek2.attention.value_length_mla"] = std::monostate{};
    edit.metadata["deepseek2.attention.head_count_kv"] = static_cast<uint32_t>(H);
    edit.drop_tensor = [](const std::string& n) {
        return n.find(".attn_k_b.") != std::string::npos || n.find(".attn_v_b.") != std::string::npos;
    };
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const std::vector<float> k = tensor_floats(*split.file, p + "attn_k_b.weight");
        const std::vector<float> v = tensor_floats(*split.file, p + "attn_v_b.weight");
        moe::test::GgufEdit::Tensor joint{p + "attn_kv_b.weight", {C, H * (Dn + Dv)}, {}};
        joint.data.resize(static_cast<size_t>(C * H * (Dn + Dv)));
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t j = 0; j < Dn + Dv; ++j) {
                for (int64_t c = 0; c < C; ++c) {
                    const float x = j < Dn ? k[static_cast<size_t>((h * C + c) * Dn + j)]
                                           : v[static_cast<size_t>((h * Dv + (j - Dn)) * C + c)];
                    joint.data[static_cast<size_t>((h * (Dn + Dv) + j) * C + c)] = x;
                }
            }
        }
        edit.add_tensors.push_back(std::move(joint));
    }
    moe::test::write_edited_gguf(split.path, dst, edit);
}

// A context on `device`; overrides as moe_context_params.tensor_overrides. No Catch2 macros: it also
// runs on a second thread.
moe_status make_context(moe_model* model, int32_t device, const char* overrides, moe_context** ctx,
                        std::string* error) {
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 32;
    p.n_ubatch = 8;
    p.n_threads = 1;
    p.device = device;
    p.tensor_overrides = overrides;
    const moe_status s = moe_context_create(model, &p, ctx);
    if (s != MOE_STATUS_OK) *error = moe_last_error();
    return s;
}

}  // namespace

TEST_CASE("the joint attn_kv_b split is made once per model and shared by its contexts", "[runtime][mla]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    moe::test::TinyModel split("deepseek2", "mla_shared", seed);
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("mla_shared_joint_" + std::to_string(seed) + "_" + std::to_string(getpid()) + ".gguf"))
                                 .string();
    write_joint_kv_b(*split.get(), path);
    moe_model* model = nullptr;
    REQUIRE(moe_model_load(path.c_str(), nullptr, &model) == MOE_STATUS_OK);
    const int n_layer = model->hparams.n_layer;

    // Two contexts created at once (the split races unless the model makes it under a lock): a CPU one,
    // and one on the emulated device that keeps the split weights on the host side (used in place from
    // the shared copy, page-locked by both registrations of it: host_registry.h).
    moe_context* ctx[2] = {};
    std::string error[2];
    moe_status status[2] = {};
    std::thread other([&] {
        status[1] = make_context(model, MOE_DEVICE_EMULATED, "attn_[kv]_b=CPU", &ctx[1], &error[1]);
    });
    status[0] = make_context(model, MOE_DEVICE_CPU, nullptr, &ctx[0], &error[0]);
    other.join();
    for (int i = 0; i < 2; ++i) {
        INFO("context " << i << ": " << error[i]);
        REQUIRE(status[i] == MOE_STATUS_OK);
    }

    // One copy, the model's: 2 tensors per layer, each context's weights pointing into it.
    REQUIRE(model->derived.size() == static_cast<size_t>(2 * n_layer));
    uint64_t derived_bytes = 0;
    for (const moe::DerivedWeight& d : model->derived) {
        derived_bytes += d.data.size();
        for (moe_context* c : ctx) {
            INFO(d.name);
            REQUIRE(c->weight_by_name.at(d.name)->data == d.data.data());
        }
    }
    const moe::HParams& hp = model->hparams;
    const uint64_t per_layer = static_cast<uint64_t>(hp.kv_lora_rank) * hp.n_head *
                               (hp.head_dim - hp.rope_dims + hp.head_dim_v) * sizeof(float);  // F32 from F32
    CHECK(derived_bytes == per_layer * static_cast<uint64_t>(n_layer));

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int32_t> tokens(11);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(hp.n_vocab));
    const std::vector<float> first = moe::test::decode_all(ctx[0], tokens);
    moe_context_free(ctx[0]);
    moe_context* later = nullptr;  // made after a context that used the split weights is freed
    std::string later_error;
    const moe_status later_status = make_context(model, MOE_DEVICE_CPU, nullptr, &later, &later_error);
    INFO(later_error);
    REQUIRE(later_status == MOE_STATUS_OK);
    CHECK(moe::test::decode_all(later, tokens) == first);
    // The emulated device computes with the CPU kernels: its logits agree up to float reassociation.
    const std::vector<float> device = moe::test::decode_all(ctx[1], tokens);
    REQUIRE(device.size() == first.size());
    float max_abs = 0.0f, max_diff = 0.0f;
    for (size_t i = 0; i < first.size(); ++i) {
        max_abs = std::max(max_abs, std::abs(first[i]));
        max_diff = std::max(max_diff, std::abs(device[i] - first[i]));
    }
    CHECK(max_diff <= 1e-4f * max_abs);
    moe_context_free(later);
    moe_context_free(ctx[1]);
    moe_model_free(model);
    std::error_code ec;
    std::filesystem::remove(path, ec);
}
