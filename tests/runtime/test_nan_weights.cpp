// A corrupt file must not give plausible numbers: a NaN planted in one weight of a tiny synthetic model
// (a bias, a norm, an attention sink, a router, a dense or an expert matrix, the embeddings) makes
// every logit non-finite, on the CPU backend and on the emulated device (experts on either side).
// The NaN goes where every token meets it (element 0 of every row of the tensor: the row's first
// value, or its first block's scale; or one expert's router row, which every token scores), so a
// kernel that swallows NaN anywhere on the way (a clamped exp, a max or a top-k that drops it, a
// softmax row of NaN made zeros) leaves finite logits and fails.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"

namespace {

using moe::test::TinyModel;

// A NaN to plant: element 0 of every row of the tensor, or of row `row` only (one expert's router row).
struct Plant {
    Plant(const char* n, int64_t r = -1) : name(n), row(r) {}  // NOLINT: implicit from a name
    std::string name;
    int64_t row;
};

// Writes NaN into element 0 of the planted rows of a tensor of the GGUF at `path` (in place): an F32
// or F16 value, or the fp16 scale that opens every block of Q8_0 / Q4_0 / Q4_1 / Q5_x / IQ4_NL rows.
void plant_nan(const TinyModel& m, const std::string& path, const Plant& plant) {
    const std::string& name = plant.name;
    int32_t idx = -1;
    REQUIRE(moe_model_find_tensor(m.get(), name.c_str(), &idx) == MOE_STATUS_OK);
    moe_tensor_info ti;
    moe_tensor_info_init(&ti);
    REQUIRE(moe_model_get_tensor(m.get(), idx, &ti) == MOE_STATUS_OK);
    uint64_t n_rows = 1;
    for (int d = 1; d < ti.n_dims; ++d) n_rows *= static_cast<uint64_t>(ti.ne[d]);
    const uint64_t row_bytes = ti.n_bytes / n_rows;
    std::vector<uint8_t> nan_bytes;
    if (ti.type == MOE_TYPE_F32) {
        const float f = std::numeric_limits<float>::quiet_NaN();
        nan_bytes.resize(4);
        std::memcpy(nan_bytes.data(), &f, 4);
    } else {
        const bool fp16_scale_first = ti.type == MOE_TYPE_F16 || ti.type == MOE_TYPE_Q8_0 || ti.type == MOE_TYPE_Q4_0 ||
                                      ti.type == MOE_TYPE_Q4_1 || ti.type == MOE_TYPE_Q5_0 ||
                                      ti.type == MOE_TYPE_Q5_1 || ti.type == MOE_TYPE_IQ4_NL;
        INFO(name << " has type " << ti.type);
        REQUIRE(fp16_scale_first);
        nan_bytes = {0x00, 0x7E};  // fp16 quiet NaN, little-endian
    }
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    for (uint64_t r = 0; r < n_rows; ++r) {
        if (plant.row >= 0 && r != static_cast<uint64_t>(plant.row)) continue;
        f.seekp(static_cast<std::streamoff>(ti.file_offset + r * row_bytes));
        f.write(reinterpret_cast<const char*>(nan_bytes.data()), static_cast<std::streamsize>(nan_bytes.size()));
    }
    REQUIRE(f.good());
}

struct LoadedModel {
    moe_model* model = nullptr;
    explicit LoadedModel(const std::string& path) {
        REQUIRE(moe_model_load(path.c_str(), nullptr, &model) == MOE_STATUS_OK);
    }
    ~LoadedModel() { moe_model_free(model); }
    LoadedModel(const LoadedModel&) = delete;
    LoadedModel& operator=(const LoadedModel&) = delete;
};

struct Placement {
    int32_t device;
    const char* overrides;
};

std::vector<float> decode_logits(moe_model* m, const Placement& pl, const std::vector<int32_t>& tokens) {
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.n_ubatch = 16;
    p.n_threads = 2;
    p.device = pl.device;
    p.tensor_overrides = pl.overrides;
    moe_context* ctx = nullptr;
    const moe_status s = moe_context_create(m, &p, &ctx);
    INFO(moe_last_error());
    REQUIRE(s == MOE_STATUS_OK);
    std::vector<float> logits = moe::test::decode_all(ctx, tokens);
    moe_context_free(ctx);
    return logits;
}

size_t count_finite(const std::vector<float>& v) {
    size_t n = 0;
    for (const float x : v) n += std::isfinite(x) ? 1 : 0;
    return n;
}

void check_arch(const char* arch, const std::vector<Plant>& tensors) {
    std::mt19937 rng(std::random_device{}());
    const uint64_t seed = rng();
    INFO(arch << " seed " << seed);
    TinyModel base(arch, "moe_nan", seed);
    const int32_t nv = base.info().n_vocab;
    std::uniform_int_distribution<int32_t> tok(0, nv - 1);
    std::vector<int32_t> tokens(5);
    for (auto& t : tokens) t = tok(rng);
    const Placement placements[] = {{MOE_DEVICE_CPU, nullptr}, {MOE_DEVICE_EMULATED, nullptr},
                                    {MOE_DEVICE_EMULATED, "exps=CPU"}};
    // The untouched file gives finite logits everywhere, so a non-finite result below is the NaN's.
    for (const Placement& pl : placements) {
        REQUIRE(count_finite(decode_logits(base.get(), pl, tokens)) == tokens.size() * static_cast<size_t>(nv));
    }
    const std::string path = base.path() + ".nan.gguf";
    for (const Plant& name : tensors) {
        INFO("NaN in " << name.name << " row " << name.row);
        std::filesystem::copy_file(base.path(), path, std::filesystem::copy_options::overwrite_existing);
        plant_nan(base, path, name);
        {
            LoadedModel m(path);
            for (const Placement& pl : placements) {
                INFO("device " << pl.device << " -ot " << (pl.overrides != nullptr ? pl.overrides : "(none)"));
                CHECK(count_finite(decode_logits(m.model, pl, tokens)) == 0);
            }
        }
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
}

}  // namespace

TEST_CASE("a NaN in a gpt-oss weight makes every logit non-finite", "[nan]") {
    check_arch("gpt-oss", {"blk.0.attn_q.bias", "blk.0.attn_k.weight", "blk.0.attn_v.bias", "blk.0.attn_sinks.weight",
                           "blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight", {"blk.0.ffn_gate_inp.weight", 3},
                           "blk.0.ffn_gate_inp.bias", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.bias",
                           "token_embd.weight", "output_norm.weight"});
}

TEST_CASE("a NaN in a qwen3moe weight makes every logit non-finite", "[nan]") {
    check_arch("qwen3moe", {"blk.0.attn_q.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_norm.weight",
                            "blk.0.ffn_gate_inp.weight", {"blk.0.ffn_gate_inp.weight", 3}, "blk.0.ffn_gate_exps.weight",
                            "blk.0.ffn_down_exps.weight"});
}

TEST_CASE("a NaN in a deepseek2 weight makes every logit non-finite", "[nan]") {
    // The router goes through SIGMOID, the selection bias, GROUP_MASK and TOPK: one expert's NaN score
    // must keep its group and be chosen. (A NaN in exp_probs_b alone only steers the choice: the chosen
    // expert's weight comes from the unbiased score, so it cannot show in the logits.)
    check_arch("deepseek2", {"blk.0.attn_kv_a_mqa.weight", "blk.0.attn_q_b.weight", "blk.1.ffn_gate_inp.weight",
                             {"blk.1.ffn_gate_inp.weight", 5}, "blk.1.ffn_down_shexp.weight",
                             "blk.1.ffn_up_exps.weight"});
}
