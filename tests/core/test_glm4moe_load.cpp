// glm4moe at load: the hyper-parameters of the tiny synthetic model read back as written, every bad or
// inconsistent one refused naming the full key and the value (read_hparams and moe_model_load alike), and
// bind_weights against an independent table of llama.cpp's glm4moe tensors: each missing or mis-shaped
// tensor named, nothing more bound than the architecture needs (the NextN layer's tensors included).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/gguf_edit.h"
#include "common/fake_weights.h"
#include "core/gguf.h"
#include "core/models/hparams.h"
#include "core/models/model_graph.h"
#include "core/models/synth.h"
#include "moeinfer/moeinfer.h"

using namespace moe;
using moe::test::FakeModel;
using moe::test::GgufEdit;
using moe::test::GgufEditValue;

namespace {

std::string tmp_file(const std::string& name) {
    std::filesystem::create_directories(MOE_TEST_TMP_DIR);
    return std::string(MOE_TEST_TMP_DIR) + "/glm4moe_" + name + "_" + std::to_string(getpid()) + ".gguf";
}

// The tiny glm4moe file (3 layers + the NextN layer, 4 heads / 2 kv of 32 with 16 rotary dims, 16 experts
// top-4 of FFN 32, 1 dense layer of FFN 96, 1 shared expert, scale 2.5), written once, removed at exit.
const std::string& tiny_file() {
    struct File {
        std::string path;
        ~File() {
            std::error_code ec;
            if (!path.empty()) std::filesystem::remove(path, ec);
        }
    };
    static File file;
    if (file.path.empty()) {
        moe_synth_params p;
        REQUIRE(synth_params_init(&p, "glm4moe").is_ok());
        p.preset = "tiny";
        p.expert_type = MOE_TYPE_F32;
        p.dense_type = MOE_TYPE_F32;
        const std::string path = tmp_file("tiny");
        REQUIRE(synth_write(path, p).is_ok());
        file.path = path;
    }
    return file.path;
}

StatusOr<HParams> read_edited(const GgufEdit& edit, const std::string& path) {
    moe::test::write_edited_gguf(tiny_file(), path, edit);
    auto f = GgufFile::open(path);
    REQUIRE(f.is_ok());
    return read_hparams(**f);
}

GgufEdit edit_of(const std::map<std::string, GgufEditValue>& metadata) {
    GgufEdit e;
    for (const auto& [k, v] : metadata) e.metadata["glm4moe." + k] = v;
    return e;
}

}  // namespace

TEST_CASE("glm4moe hyper-parameters read back from the tiny file", "[models][hparams][glm4moe]") {
    auto f = GgufFile::open(tiny_file());
    REQUIRE(f.is_ok());
    StatusOr<HParams> hp = read_hparams(**f);
    REQUIRE(hp.is_ok());
    CHECK(hp->arch == Arch::GLM4MOE);
    CHECK(hp->n_layer == 3);  // block_count 4 less the NextN layer
    CHECK(hp->n_nextn_layer == 1);
    CHECK(hp->head_dim == 32);
    CHECK(hp->rope_dims == 16);
    CHECK(hp->n_layer_dense_lead == 1);
    CHECK(hp->n_ff == 96);
    CHECK(hp->n_expert_shared == 1);
    CHECK(hp->expert_weights_norm);
    CHECK(hp->expert_weights_scale == 2.5f);
    CHECK(rope_params_for(*hp).n_dims == 16);

    // A file without the NextN layer (its tensors and the key gone, block_count 3) runs the same 3 layers.
    GgufEdit e = edit_of({{"nextn_predict_layers", std::monostate{}}, {"block_count", uint32_t{3}}});
    e.drop_tensor = [](const std::string& n) { return n.rfind("blk.3.", 0) == 0; };
    const std::string path = tmp_file("no_nextn");
    StatusOr<HParams> plain = read_edited(e, path);
    std::filesystem::remove(path);
    REQUIRE(plain.is_ok());
    CHECK(plain->n_layer == 3);
    CHECK(plain->n_nextn_layer == 0);
}

TEST_CASE("glm4moe: every bad or inconsistent hyper-parameter is named with its value", "[models][hparams][glm4moe]") {
    using M = std::map<std::string, GgufEditValue>;
    const auto D = MOE_STATUS_DATA_CORRUPT;
    const auto U = MOE_STATUS_UNIMPLEMENTED;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
        M metadata;
        moe_status code;
        std::string key, value;  // the key without "glm4moe.", the value text ("" when absent)
    };
    const std::vector<Case> cases = {
        {M{{"nextn_predict_layers", uint32_t{4}}}, D, "nextn_predict_layers", "4"},   // no layer left to run
        {M{{"nextn_predict_layers", int32_t{-1}}}, D, "nextn_predict_layers", "-1"},
        {M{{"leading_dense_block_count", uint32_t{3}}}, D, "leading_dense_block_count", "3"},  // no MoE layer
        {M{{"leading_dense_block_count", int32_t{-2}}}, D, "leading_dense_block_count", "-2"},
        {M{{"feed_forward_length", std::monostate{}}}, D, "feed_forward_length", ""},  // the dense layer's size
        {M{{"feed_forward_length", uint32_t{0}}}, D, "feed_forward_length", "0"},
        {M{{"expert_gating_func", uint32_t{1}}}, U, "expert_gating_func", "1"},  // softmax: not glm4moe's
        {M{{"expert_weights_scale", 0.0f}}, D, "expert_weights_scale", "0"},
        {M{{"expert_weights_scale", nan}}, D, "expert_weights_scale", "nan"},
        {M{{"expert_shared_count", uint32_t{0}}}, D, "expert_shared_count", "0"},
        {M{{"rope.dimension_count", uint32_t{15}}}, D, "rope.dimension_count", "15"},  // odd
        {M{{"rope.dimension_count", uint32_t{64}}}, D, "rope.dimension_count", "64"},  // beyond head_dim 32
        {M{{"attention.value_length", uint32_t{16}}}, D, "attention.value_length", "16"},
        {M{{"attention.key_length", uint32_t{0}}}, D, "attention.key_length", "0"},
        // block_count must count the NextN layer the file holds.
        {M{{"block_count", uint32_t{3}}}, D, "block_count", "3"},
    };
    for (const Case& c : cases) {
        const std::string key = "glm4moe." + c.key;
        INFO(key << " -> " << (c.value.empty() ? "<removed>" : c.value));
        const std::string path = tmp_file("bad");
        StatusOr<HParams> hp = read_edited(edit_of(c.metadata), path);
        REQUIRE_FALSE(hp.is_ok());
        const std::string& msg = hp.status().message();
        INFO(msg);
        CHECK(hp.status().code() == c.code);
        CHECK(msg.find("'" + key + "'") != std::string::npos);
        if (!c.value.empty()) CHECK(msg.find("= " + c.value) != std::string::npos);

        moe_model* model = nullptr;
        CHECK(moe_model_load(path.c_str(), nullptr, &model) == c.code);
        CHECK(model == nullptr);
        CHECK(std::string(moe_last_error()).find(msg) != std::string::npos);
        std::filesystem::remove(path);
    }
}

namespace {

HParams tiny_hparams() {
    HParams hp;
    hp.arch = Arch::GLM4MOE;
    hp.arch_name = "glm4moe";
    hp.n_layer = 3;
    hp.n_embd = 64;
    hp.n_vocab = 100;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = 32;
    hp.rope_dims = 16;
    hp.n_expert = 16;
    hp.n_expert_used = 4;
    hp.n_ff_expert = 32;
    hp.n_layer_dense_lead = 1;
    hp.n_ff = 96;
    hp.n_expert_shared = 2;  // shared FFN 64: distinct from every other size
    return hp;
}

// llama.cpp's glm4moe tensors (llama_model_glm4_moe::load_arch_tensors), written out independently of
// lib/core/models/weights.cpp; GGUF order, ne[0] fastest.
std::map<std::string, std::vector<int64_t>> expected_shapes(const HParams& hp, bool qk_norm) {
    const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, H = hp.n_head, K = hp.n_head_kv;
    const int64_t X = hp.n_expert, F = hp.n_ff_expert, S = hp.n_ff_expert * hp.n_expert_shared, FF = hp.n_ff;
    std::map<std::string, std::vector<int64_t>> m{
        {"token_embd.weight", {E, V}}, {"output_norm.weight", {E}}, {"output.weight", {E, V}}};
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        m[p + "attn_norm.weight"] = {E};
        m[p + "attn_q.weight"] = {E, H * D};
        m[p + "attn_k.weight"] = {E, K * D};
        m[p + "attn_v.weight"] = {E, K * D};
        m[p + "attn_q.bias"] = {H * D};
        m[p + "attn_k.bias"] = {K * D};
        m[p + "attn_v.bias"] = {K * D};
        m[p + "attn_output.weight"] = {H * D, E};
        if (qk_norm) {
            m[p + "attn_q_norm.weight"] = {D};
            m[p + "attn_k_norm.weight"] = {D};
        }
        m[p + "post_attention_norm.weight"] = {E};
        if (il < hp.n_layer_dense_lead) {
            m[p + "ffn_gate.weight"] = {E, FF};
            m[p + "ffn_up.weight"] = {E, FF};
            m[p + "ffn_down.weight"] = {FF, E};
            continue;
        }
        m[p + "ffn_gate_inp.weight"] = {E, X};
        m[p + "exp_probs_b.bias"] = {X};
        m[p + "ffn_gate_exps.weight"] = {E, F, X};
        m[p + "ffn_up_exps.weight"] = {E, F, X};
        m[p + "ffn_down_exps.weight"] = {F, E, X};
        m[p + "ffn_gate_shexp.weight"] = {E, S};
        m[p + "ffn_up_shexp.weight"] = {E, S};
        m[p + "ffn_down_shexp.weight"] = {S, E};
    }
    return m;
}

}  // namespace

TEST_CASE("glm4moe bind_weights: exactly llama.cpp's tensors, each missing or mis-shaped one named", "[models][glm4moe]") {
    const HParams hp = tiny_hparams();
    for (const bool qk_norm : {true, false}) {
        INFO("q/k norms: " << qk_norm);
        auto shapes = expected_shapes(hp, qk_norm);
        auto with_nextn = shapes;  // a NextN layer's tensors are in the file but not the model's
        with_nextn["blk.3.nextn.eh_proj.weight"] = {2 * hp.n_embd, hp.n_embd};
        with_nextn["blk.3.ffn_up_exps.weight"] = {hp.n_embd, hp.n_ff_expert, hp.n_expert};
        FakeModel model(with_nextn);
        StatusOr<ModelWeights> w = bind_weights(hp, model.lookup());
        REQUIRE(w.is_ok());
        size_t marked = 0;
        for (const Tensor& t : model.tensors) marked += t.is_weight ? 1 : 0;
        CHECK(marked == shapes.size());
        CHECK(w->layers[0].ffn_up != nullptr);
        CHECK(w->layers[0].up_exps == nullptr);
        CHECK(w->layers[1].up_shexp != nullptr);
        CHECK(w->layers[2].exp_probs_b != nullptr);
        CHECK((w->layers[1].q_norm != nullptr) == qk_norm);

        for (const auto& [name, ne] : shapes) {
            INFO(name);
            FakeModel missing(shapes);
            missing.by_name.erase(name);
            StatusOr<ModelWeights> r = bind_weights(hp, missing.lookup());
            REQUIRE_FALSE(r.is_ok());
            CHECK(r.status().code() == MOE_STATUS_NOT_FOUND);
            // A lone q or k norm: the other one, the removed tensor, is named as missing from the pair.
            CHECK(r.status().message().find("'" + name + "'") != std::string::npos);

            auto wrong = shapes;
            wrong[name][0] += 1;
            FakeModel bad(wrong);
            StatusOr<ModelWeights> b = bind_weights(hp, bad.lookup());
            REQUIRE_FALSE(b.is_ok());
            CHECK(b.status().code() == MOE_STATUS_DATA_CORRUPT);
            CHECK(b.status().message().find("'" + name + "'") != std::string::npos);
        }
    }
}
