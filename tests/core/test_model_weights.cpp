// Weight binding and hyper-parameters: a model whose tensors or metadata do not fit its
// architecture gives a clear error naming the tensor or key, never a crash later.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "common/fake_weights.h"
#include "core/gguf_writer.h"
#include "core/models/model_graph.h"

using namespace moe;
using moe::test::FakeModel;

namespace {

HParams tiny_hparams(Arch arch) {
    HParams hp;
    hp.arch = arch;
    hp.arch_name = arch == Arch::GPT_OSS ? "gpt-oss" : "qwen3moe";
    hp.n_layer = 2;
    hp.n_embd = 64;
    hp.n_vocab = 100;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = 16;
    hp.n_expert = 8;
    hp.n_expert_used = 2;
    hp.n_ff_expert = 32;
    return hp;
}

// The tensors each architecture needs, written out independently of lib/core/models/weights.cpp
// from llama.cpp's tensor names (GGUF order: ne[0] fastest).
std::map<std::string, std::vector<int64_t>> expected_shapes(const HParams& hp) {
    const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, H = hp.n_head, K = hp.n_head_kv;
    const int64_t X = hp.n_expert, F = hp.n_ff_expert;
    std::map<std::string, std::vector<int64_t>> m{
        {"token_embd.weight", {E, V}}, {"output_norm.weight", {E}}, {"output.weight", {E, V}}};
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        m[p + "attn_norm.weight"] = {E};
        m[p + "attn_q.weight"] = {E, H * D};
        m[p + "attn_k.weight"] = {E, K * D};
        m[p + "attn_v.weight"] = {E, K * D};
        m[p + "attn_output.weight"] = {H * D, E};
        m[p + "ffn_gate_inp.weight"] = {E, X};
        m[p + "ffn_gate_exps.weight"] = {E, F, X};
        m[p + "ffn_up_exps.weight"] = {E, F, X};
        m[p + "ffn_down_exps.weight"] = {F, E, X};
        if (hp.arch == Arch::GPT_OSS) {
            m[p + "attn_q.bias"] = {H * D};
            m[p + "attn_k.bias"] = {K * D};
            m[p + "attn_v.bias"] = {K * D};
            m[p + "attn_output.bias"] = {E};
            m[p + "attn_sinks.weight"] = {H};
            m[p + "post_attention_norm.weight"] = {E};
            m[p + "ffn_gate_inp.bias"] = {X};
            m[p + "ffn_gate_exps.bias"] = {F, X};
            m[p + "ffn_up_exps.bias"] = {F, X};
            m[p + "ffn_down_exps.bias"] = {E, X};
        } else {
            m[p + "attn_q_norm.weight"] = {D};
            m[p + "attn_k_norm.weight"] = {D};
            m[p + "ffn_norm.weight"] = {E};
        }
    }
    return m;
}

}  // namespace

TEST_CASE("bind_weights accepts exactly the tensors each architecture needs", "[models]") {
    for (Arch arch : {Arch::QWEN3MOE, Arch::GPT_OSS}) {
        const HParams hp = tiny_hparams(arch);
        const auto shapes = expected_shapes(hp);
        FakeModel model(shapes);
        StatusOr<ModelWeights> w = bind_weights(hp, model.lookup());
        REQUIRE(w.is_ok());
        CHECK(w->layers.size() == 2);
        size_t marked = 0;
        for (const Tensor& t : model.tensors) marked += t.is_weight ? 1 : 0;
        CHECK(marked == shapes.size());  // every needed tensor was bound, none left over

        // Each missing tensor is named.
        for (const auto& [name, ne] : shapes) {
            FakeModel missing(shapes);
            missing.by_name.erase(name);
            StatusOr<ModelWeights> r = bind_weights(hp, missing.lookup());
            INFO(name);
            REQUIRE_FALSE(r.is_ok());
            CHECK(r.status().code() == MOE_STATUS_NOT_FOUND);
            CHECK(r.status().message().find("'" + name + "'") != std::string::npos);
        }
    }
}

TEST_CASE("bind_weights names a tensor with the wrong shape or type", "[models]") {
    const HParams hp = tiny_hparams(Arch::GPT_OSS);
    const auto shapes = expected_shapes(hp);
    {
        auto bad = shapes;
        bad["blk.1.ffn_down_exps.weight"] = {hp.n_ff_expert, hp.n_embd, hp.n_expert - 1};
        FakeModel model(bad);
        StatusOr<ModelWeights> r = bind_weights(hp, model.lookup());
        REQUIRE_FALSE(r.is_ok());
        INFO(r.status().message());
        CHECK(r.status().code() == MOE_STATUS_DATA_CORRUPT);
        CHECK(r.status().message().find("blk.1.ffn_down_exps.weight") != std::string::npos);
        CHECK(r.status().message().find("[32, 64, 7]") != std::string::npos);
    }
    {
        FakeModel model(shapes);
        Tensor* sinks = model.by_name.at("blk.0.attn_sinks.weight");
        set_shape(*sinks, Type::F16, 1, sinks->ne);
        StatusOr<ModelWeights> r = bind_weights(hp, model.lookup());
        REQUIRE_FALSE(r.is_ok());
        CHECK(r.status().code() == MOE_STATUS_DATA_CORRUPT);
        CHECK(r.status().message().find("attn_sinks") != std::string::npos);
        CHECK(r.status().message().find("f16") != std::string::npos);
    }
}

namespace {

// A GGUF file with the given architecture keys, a token_embd tensor and a norm of each of the two
// layers (block_count must match the layers present), for read_hparams.
std::string write_meta_file(const std::string& arch, bool with_expert_count, int64_t embd_rows) {
    const std::string path = std::string(MOE_TEST_TMP_DIR) + "/hparams_" + arch + ".gguf";
    GgufWriter w;
    w.add_string("general.architecture", arch);
    const std::string a = arch + ".";
    w.add_uint32(a + "block_count", 2);
    w.add_uint32(a + "embedding_length", 64);
    w.add_uint32(a + "attention.head_count", 4);
    w.add_uint32(a + "attention.head_count_kv", 2);
    if (with_expert_count) w.add_uint32(a + "expert_count", 8);
    w.add_uint32(a + "expert_used_count", 2);
    w.add_uint32(a + "expert_feed_forward_length", 32);
    w.add_uint32(a + "context_length", 4096);
    w.add_uint32(a + "attention.sliding_window", 8);
    w.add_tensor("token_embd.weight", Type::F32, {embd_rows, 100});
    w.add_tensor("blk.0.attn_norm.weight", Type::F32, {64});
    w.add_tensor("blk.1.attn_norm.weight", Type::F32, {64});
    REQUIRE(w.begin(path).is_ok());
    std::vector<float> zeros(static_cast<size_t>(embd_rows * 100), 0.5f);
    REQUIRE(w.append(zeros.data(), zeros.size() * sizeof(float)).is_ok());
    for (int il = 0; il < 2; ++il) REQUIRE(w.append(zeros.data(), 64 * sizeof(float)).is_ok());
    REQUIRE(w.finish().is_ok());
    return path;
}

}  // namespace

TEST_CASE("read_hparams: supported, unknown and incomplete architectures", "[models]") {
    {
        auto f = GgufFile::open(write_meta_file("gpt-oss", true, 64));
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        REQUIRE(hp.is_ok());
        CHECK(hp->n_vocab == 100);
        CHECK(hp->head_dim == 16);
        CHECK(hp->sliding_window == 8);
    }
    {
        auto f = GgufFile::open(write_meta_file("llama", true, 64));
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        REQUIRE_FALSE(hp.is_ok());
        CHECK(hp.status().code() == MOE_STATUS_UNIMPLEMENTED);
        CHECK(hp.status().message().find("'llama'") != std::string::npos);
    }
    {
        auto f = GgufFile::open(write_meta_file("qwen3moe", false, 64));
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        REQUIRE_FALSE(hp.is_ok());
        CHECK(hp.status().code() == MOE_STATUS_DATA_CORRUPT);
        CHECK(hp.status().message().find("qwen3moe.expert_count") != std::string::npos);
    }
    {
        auto f = GgufFile::open(write_meta_file("qwen3moe", true, 32));
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        REQUIRE_FALSE(hp.is_ok());
        CHECK(hp.status().message().find("token_embd.weight") != std::string::npos);
    }
}
