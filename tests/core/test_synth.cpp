// Synthetic models: files of both architectures and every expert type are read back by the GGUF
// reader and checked against llama.cpp's tensor names, shapes and metadata keys (written out here
// independently of lib/core/models/synth_*.cpp), the weight statistics the generator promises, the
// routing-skew formula, determinism (same seed -> same bytes, for any thread count), parameter
// validation, cancellation and I/O errors.
//
// The [.synth-real] test writes 2-layer files of every real preset in every expert type (several GB
// each); it is hidden: run it with `moeinfer_tests "[.synth-real]"`.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/models/hparams.h"
#include "core/models/synth.h"
#include "core/types.h"
#include "moeinfer/moeinfer.h"

namespace {

using moe::GgufFile;
using moe::GgufTensorInfo;
using moe::Type;

std::string tmp_path(const std::string& name) { return std::string(MOE_TEST_TMP_DIR) + "/synth_" + name; }

bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

std::vector<char> read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

moe_synth_params params(const char* arch, const char* preset) {
    moe_synth_params p;
    REQUIRE(moe::synth_params_init(&p, arch).is_ok());
    p.preset = preset;
    return p;
}

std::unique_ptr<GgufFile> write_and_open(const std::string& path, const moe_synth_params& p) {
    const moe::Status s = moe::synth_write(path, p);
    INFO(s.message());
    REQUIRE(s.is_ok());
    CHECK_FALSE(file_exists(path + ".tmp"));
    auto f = GgufFile::open(path);
    INFO(f.status().message());
    REQUIRE(f.is_ok());
    return std::move(f).value();
}

// ---- what llama.cpp expects (src/llama-arch.cpp names; src/models/{qwen3moe,openai-moe}.cpp shapes) ----

struct Shape {
    int n_layer, n_embd, n_vocab, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff;
};

struct Expect {
    Type type;
    std::vector<int64_t> ne;
};

std::map<std::string, Expect> expected_tensors(bool gpt_oss, const Shape& s, Type experts, Type dense) {
    std::map<std::string, Expect> m;
    const int64_t d = s.n_embd, q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_head_kv} * s.head_dim;
    m["token_embd.weight"] = {dense, {d, s.n_vocab}};
    m["output_norm.weight"] = {Type::F32, {d}};
    m["output.weight"] = {dense, {d, s.n_vocab}};
    for (int l = 0; l < s.n_layer; ++l) {
        const std::string b = "blk." + std::to_string(l) + ".";
        m[b + "attn_norm.weight"] = {Type::F32, {d}};
        m[b + "attn_q.weight"] = {dense, {d, q}};
        m[b + "attn_k.weight"] = {dense, {d, kv}};
        m[b + "attn_v.weight"] = {dense, {d, kv}};
        m[b + "attn_output.weight"] = {dense, {q, d}};
        m[b + "ffn_gate_inp.weight"] = {Type::F32, {d, s.n_expert}};
        m[b + "ffn_gate_exps.weight"] = {experts, {d, s.n_ff, s.n_expert}};
        m[b + "ffn_up_exps.weight"] = {experts, {d, s.n_ff, s.n_expert}};
        m[b + "ffn_down_exps.weight"] = {experts, {s.n_ff, d, s.n_expert}};
        if (gpt_oss) {
            m[b + "attn_q.bias"] = {Type::F32, {q}};
            m[b + "attn_k.bias"] = {Type::F32, {kv}};
            m[b + "attn_v.bias"] = {Type::F32, {kv}};
            m[b + "attn_output.bias"] = {Type::F32, {d}};
            m[b + "attn_sinks.weight"] = {Type::F32, {s.n_head}};
            m[b + "post_attention_norm.weight"] = {Type::F32, {d}};
            m[b + "ffn_gate_inp.bias"] = {Type::F32, {s.n_expert}};
            m[b + "ffn_gate_exps.bias"] = {Type::F32, {s.n_ff, s.n_expert}};
            m[b + "ffn_up_exps.bias"] = {Type::F32, {s.n_ff, s.n_expert}};
            m[b + "ffn_down_exps.bias"] = {Type::F32, {d, s.n_expert}};
        } else {
            m[b + "attn_q_norm.weight"] = {Type::F32, {s.head_dim}};
            m[b + "attn_k_norm.weight"] = {Type::F32, {s.head_dim}};
            m[b + "ffn_norm.weight"] = {Type::F32, {d}};
        }
    }
    return m;
}

void check_tensors(const GgufFile& f, bool gpt_oss, const Shape& s, Type experts, Type dense) {
    const auto want = expected_tensors(gpt_oss, s, experts, dense);
    CHECK(f.tensors().size() == want.size());
    for (const GgufTensorInfo& t : f.tensors()) {
        INFO("tensor " << t.name);
        auto it = want.find(t.name);
        REQUIRE(it != want.end());
        CHECK(t.type == it->second.type);
        REQUIRE(t.n_dims == static_cast<int>(it->second.ne.size()));
        for (int i = 0; i < t.n_dims; ++i) CHECK(t.ne[i] == it->second.ne[static_cast<size_t>(i)]);
    }
}

int64_t meta_int(const GgufFile& f, const std::string& key) {
    auto v = f.get_int(key);
    INFO(key << ": " << v.status().message());
    REQUIRE(v.is_ok());
    return *v;
}

double meta_float(const GgufFile& f, const std::string& key) {
    auto v = f.get_float(key);
    INFO(key << ": " << v.status().message());
    REQUIRE(v.is_ok());
    return *v;
}

void check_metadata(const GgufFile& f, bool gpt_oss, const Shape& s) {
    const std::string a = gpt_oss ? "gpt-oss." : "qwen3moe.";
    CHECK(*f.get_string("general.architecture") == (gpt_oss ? "gpt-oss" : "qwen3moe"));
    CHECK(f.get_string("general.name").is_ok());
    CHECK(meta_int(f, a + "block_count") == s.n_layer);
    CHECK(meta_int(f, a + "embedding_length") == s.n_embd);
    CHECK(meta_int(f, a + "attention.head_count") == s.n_head);
    CHECK(meta_int(f, a + "attention.head_count_kv") == s.n_head_kv);
    CHECK(meta_int(f, a + "attention.key_length") == s.head_dim);
    CHECK(meta_int(f, a + "attention.value_length") == s.head_dim);
    CHECK(meta_int(f, a + "rope.dimension_count") == s.head_dim);
    CHECK(meta_int(f, a + "expert_count") == s.n_expert);
    CHECK(meta_int(f, a + "expert_used_count") == s.n_expert_used);
    CHECK(meta_int(f, a + "expert_feed_forward_length") == s.n_ff);
    CHECK(meta_int(f, a + "context_length") == (gpt_oss ? 131072 : 40960));
    CHECK(meta_float(f, a + "rope.freq_base") == (gpt_oss ? 150000.0 : 1e6));
    CHECK(meta_float(f, a + "attention.layer_norm_rms_epsilon") == Approx(gpt_oss ? 1e-5 : 1e-6));
    if (gpt_oss) {
        CHECK(meta_int(f, a + "attention.sliding_window") > 0);
        CHECK(*f.get_string(a + "rope.scaling.type") == "yarn");
        CHECK(meta_float(f, a + "rope.scaling.factor") == 32.0);
        CHECK(meta_int(f, a + "rope.scaling.original_context_length") == 4096);
    }
    CHECK(meta_int(f, "moeinfer.synthetic.seed") >= 0);
    CHECK(f.find("moeinfer.synthetic.routing_skew") != nullptr);

    // The tokenizer llama.cpp's SPM loader accepts: unique texts, byte tokens, one entry per embedding row.
    CHECK(*f.get_string("tokenizer.ggml.model") == "llama");
    const moe::GgufValue* tokens = f.find("tokenizer.ggml.tokens");
    const moe::GgufValue* scores = f.find("tokenizer.ggml.scores");
    const moe::GgufValue* types = f.find("tokenizer.ggml.token_type");
    REQUIRE(tokens != nullptr);
    REQUIRE(scores != nullptr);
    REQUIRE(types != nullptr);
    CHECK(tokens->array_type == moe::GgufValueType::STRING);
    CHECK(scores->array_type == moe::GgufValueType::FLOAT32);
    CHECK(types->array_type == moe::GgufValueType::INT32);  // llama.cpp reads the array as int32
    REQUIRE(tokens->array.size() == static_cast<size_t>(s.n_vocab));
    CHECK(scores->array.size() == tokens->array.size());
    CHECK(types->array.size() == tokens->array.size());
    CHECK(tokens->array[0].s == "<unk>");
    CHECK(tokens->array[1].s == "<s>");
    CHECK(tokens->array[2].s == "</s>");
    CHECK(tokens->array[3 + 0x0A].s == "<0x0A>");  // SPM's newline token
    CHECK(types->array[3 + 0x0A].i == 6);         // LLAMA_TOKEN_TYPE_BYTE
    std::vector<std::string> texts;
    for (const auto& t : tokens->array) texts.push_back(t.s);
    std::sort(texts.begin(), texts.end());
    CHECK(std::adjacent_find(texts.begin(), texts.end()) == texts.end());
    CHECK(meta_int(f, "tokenizer.ggml.bos_token_id") == 1);
    CHECK(meta_int(f, "tokenizer.ggml.eos_token_id") == 2);
}

// The tensor's values as floats; only its first rows when it holds more than max_elems values.
std::vector<float> dequantize(const GgufFile& f, const std::string& name, int64_t max_elems = int64_t{1} << 22) {
    const GgufTensorInfo* t = f.find_tensor(name);
    REQUIRE(t != nullptr);
    const int64_t rows = std::max<int64_t>(1, std::min(t->n_elements(), max_elems) / t->ne[0]);
    const int64_t n = rows * t->ne[0];
    std::vector<float> out(static_cast<size_t>(n));
    moe::traits(t->type).to_float(f.tensor_data(*t), out.data(), n);
    return out;
}

struct Stats {
    double mean = 0, std = 0, min = 0, max = 0;
};

Stats stats(const std::vector<float>& x) {
    Stats s;
    double sum = 0, sq = 0;
    s.min = s.max = x[0];
    for (float v : x) {
        sum += v;
        sq += static_cast<double>(v) * v;
        s.min = std::min<double>(s.min, v);
        s.max = std::max<double>(s.max, v);
    }
    s.mean = sum / static_cast<double>(x.size());
    s.std = std::sqrt(std::max(0.0, sq / static_cast<double>(x.size()) - s.mean * s.mean));
    return s;
}

// Relative tolerance on a weight's std: 4-bit types round coarsely.
double std_tolerance(Type t) { return t == Type::Q4_0 || t == Type::MXFP4 ? 0.15 : 0.05; }

void check_weight_statistics(const GgufFile& f, bool gpt_oss, const Shape& s, Type experts, Type dense) {
    const double d = s.n_embd;
    {
        const std::vector<float> e = dequantize(f, "token_embd.weight");
        std::vector<float> rest;  // without qwen3moe's bias channel
        for (size_t i = 0; i < e.size(); ++i) {
            if (gpt_oss || i % static_cast<size_t>(s.n_embd) != 0) {
                rest.push_back(e[i]);
            } else {
                CHECK(e[i] == 1.0f);  // qwen3moe's router bias channel: 1 in every token
            }
        }
        const Stats st = stats(rest);
        CHECK(st.std == Approx(1.0).epsilon(std_tolerance(dense)));
        CHECK(std::abs(st.mean) < 0.05);
    }
    {
        const Stats st = stats(dequantize(f, "blk.0.attn_q.weight"));
        CHECK(st.std == Approx(1.0 / std::sqrt(d)).epsilon(std_tolerance(dense)));
    }
    {
        const Stats up = stats(dequantize(f, "blk.0.ffn_up_exps.weight"));
        CHECK(up.std == Approx(1.0 / std::sqrt(d)).epsilon(std_tolerance(experts)));
        CHECK(std::abs(up.mean) < 0.1 * up.std);
        const Stats down = stats(dequantize(f, "blk.0.ffn_down_exps.weight"));
        CHECK(down.std == Approx(0.2 / std::sqrt(static_cast<double>(s.n_ff))).epsilon(std_tolerance(experts)));
    }
    const std::string norm = gpt_oss ? "blk.0.post_attention_norm.weight" : "blk.0.ffn_norm.weight";
    for (const std::string& name : {std::string("blk.0.attn_norm.weight"), norm, std::string("output_norm.weight")}) {
        const Stats st = stats(dequantize(f, name));
        CHECK(st.min >= 0.9);
        CHECK(st.max <= 1.1);
        CHECK(st.max - st.min > 0.05);  // not constant
    }
    // Router rows have unit norm (qwen3moe: outside the bias channel).
    const std::vector<float> router = dequantize(f, "blk.0.ffn_gate_inp.weight");
    for (int e = 0; e < s.n_expert; ++e) {
        double ss = 0;
        for (int i = gpt_oss ? 0 : 1; i < s.n_embd; ++i) {
            const double v = router[static_cast<size_t>(e) * static_cast<size_t>(s.n_embd) + static_cast<size_t>(i)];
            ss += v * v;
        }
        CHECK(std::sqrt(ss) == Approx(1.0).epsilon(1e-5));
    }
    if (gpt_oss) {
        const Stats b = stats(dequantize(f, "blk.0.attn_q.bias"));
        CHECK(b.max <= 0.02 * std::sqrt(3.0) + 1e-6);
        CHECK(b.std > 0.005);
        const Stats sinks = stats(dequantize(f, "blk.0.attn_sinks.weight"));
        CHECK(sinks.max - sinks.min > 0.01);
    }
}

// The per-expert logit offsets of layer `l`: gpt-oss's router bias, qwen3moe's bias channel.
std::vector<float> skew_offsets(const GgufFile& f, bool gpt_oss, int layer, const Shape& s) {
    const std::string b = "blk." + std::to_string(layer) + ".";
    if (gpt_oss) return dequantize(f, b + "ffn_gate_inp.bias");
    const std::vector<float> w = dequantize(f, b + "ffn_gate_inp.weight");
    std::vector<float> out;
    for (int e = 0; e < s.n_expert; ++e) out.push_back(w[static_cast<size_t>(e) * static_cast<size_t>(s.n_embd)]);
    return out;
}

const Shape kTinyShape = {2, 64, 512, 4, 2, 16, 8, 2, 64};
const Type kExpertTypes[] = {Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::F32};

}  // namespace

TEST_CASE("synth: tiny files of both architectures and every expert type", "[synth]") {
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        const bool gpt_oss = std::string(arch) == "gpt-oss";
        for (Type experts : kExpertTypes) {
            INFO(arch << " with " << moe::type_name(experts) << " experts");
            moe_synth_params p = params(arch, "tiny");
            p.expert_type = static_cast<int32_t>(experts);
            p.seed = std::random_device{}();
            const std::string path = tmp_path(std::string("tiny_") + arch + "_" + moe::type_name(experts) + ".gguf");
            auto f = write_and_open(path, p);
            check_tensors(*f, gpt_oss, kTinyShape, experts, Type::F16);
            check_metadata(*f, gpt_oss, kTinyShape);
            check_weight_statistics(*f, gpt_oss, kTinyShape, experts, Type::F16);
            CHECK(meta_int(*f, "moeinfer.synthetic.seed") == static_cast<int64_t>(p.seed));

            auto hp = moe::read_hparams(*f);
            INFO(hp.status().message());
            REQUIRE(hp.is_ok());
            CHECK(hp->n_layer == 2);
            CHECK(hp->n_vocab == 512);
            CHECK(hp->head_dim == 16);
            CHECK(hp->sliding_window == (gpt_oss ? 8 : 0));
            if (experts == Type::Q8_0 || experts == Type::MXFP4) CHECK(f->file_size() < 500 * 1024);
        }
    }
}

TEST_CASE("synth: the newer expert types and the type recipes", "[synth]") {
    // Whole super-blocks everywhere: n_embd, n_head * head_dim and n_ff_expert are 256; 8 layers show
    // which get more bits. n_head / n_head_kv = 4 (IQ4_XS gives such attn_v Q5_K).
    const Shape shape = {8, 256, 512, 4, 1, 64, 8, 2, 256};
    auto write = [&](const char* arch, const Shape& s, int32_t experts, const char* recipe, const std::string& path) {
        moe_synth_params p = params(arch, "tiny");
        p.n_layer = s.n_layer;
        p.n_embd = s.n_embd;
        p.n_head_kv = s.n_head_kv;
        p.head_dim = s.head_dim;
        p.n_ff_expert = s.n_ff;
        p.expert_type = experts;
        p.recipe = recipe;
        p.seed = std::random_device{}();
        return write_and_open(path, p);
    };
    SECTION("every newer type as the expert type") {
        for (Type t : {Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::Q2_K, Type::Q3_K, Type::Q4_K,
                       Type::Q5_K, Type::Q6_K, Type::IQ4_XS}) {
            INFO(moe::type_name(t));
            auto f = write("qwen3moe", shape, static_cast<int32_t>(t), nullptr, tmp_path("newer_experts.gguf"));
            check_tensors(*f, false, shape, t, Type::F16);
            // The values are the generator's (std 1/sqrt(n_embd)) within what the type rounds off.
            const Stats up = stats(dequantize(*f, "blk.0.ffn_up_exps.weight"));
            CHECK(up.std == Approx(1.0 / 16.0).epsilon(t == Type::Q2_K || t == Type::Q3_K ? 0.3 : 0.15));
        }
    }
    SECTION("recipes put llama.cpp's types by role") {
        // llama.cpp's use_more_bits(i, 8): layers 0, 3, 6 and 7 (i < 1, i >= 7, (i - 1) % 3 == 2).
        const std::vector<int> more = {0, 3, 6, 7};
        struct Want {
            const char* recipe;
            uint32_t file_type;
            Type embd, output, qko, v_more, v_other, gate_up, down_more, down_other;
        };
        const Want wants[] = {
            {"q4_k_m", 15, Type::Q4_K, Type::Q6_K, Type::Q4_K, Type::Q6_K, Type::Q4_K, Type::Q4_K, Type::Q6_K, Type::Q4_K},
            {"Q5_K_M", 17, Type::Q5_K, Type::Q6_K, Type::Q5_K, Type::Q6_K, Type::Q5_K, Type::Q5_K, Type::Q6_K, Type::Q5_K},
            {"q3_k_xl", 13, Type::Q4_K, Type::Q6_K, Type::Q4_K, Type::Q5_K, Type::Q5_K, Type::Q3_K, Type::Q4_K, Type::Q4_K},
            {"iq4_xs", 30, Type::IQ4_XS, Type::Q6_K, Type::IQ4_XS, Type::Q5_K, Type::Q5_K, Type::IQ4_XS, Type::IQ4_XS,
             Type::IQ4_XS},
        };
        for (const Want& w : wants) {
            INFO("recipe " << w.recipe);
            auto f = write("qwen3moe", shape, -1, w.recipe, tmp_path("recipe.gguf"));
            CHECK(meta_int(*f, "general.file_type") == w.file_type);
            for (const GgufTensorInfo& t : f->tensors()) {
                INFO("tensor " << t.name);
                const std::string& n = t.name;
                const int layer = n.rfind("blk.", 0) == 0 ? std::stoi(n.substr(4)) : -1;
                const bool m = std::find(more.begin(), more.end(), layer) != more.end();
                auto has = [&](const char* role) { return n.find(role) != std::string::npos; };
                Type want = Type::F32;  // norms and routers
                if (n == "token_embd.weight") want = w.embd;
                if (n == "output.weight") want = w.output;
                if (has(".attn_q.weight") || has(".attn_k.weight") || has(".attn_output.weight")) want = w.qko;
                if (has(".attn_v.weight")) want = m ? w.v_more : w.v_other;
                if (has(".ffn_gate_exps.weight") || has(".ffn_up_exps.weight")) want = w.gate_up;
                if (has(".ffn_down_exps.weight")) want = m ? w.down_more : w.down_other;
                CHECK(moe::type_name(t.type) == std::string(moe::type_name(want)));
            }
        }
    }
    SECTION("rows that are not whole super-blocks take llama.cpp's fallback types") {
        // The tiny preset: n_embd = n_ff = n_head * head_dim = 64. Q4_K -> Q5_0, Q6_K -> Q8_0, Q3_K and
        // IQ4_XS -> IQ4_NL, Q5_K -> Q5_1.
        const Shape tiny = {2, 64, 512, 4, 2, 16, 8, 2, 64};
        auto f = write("gpt-oss", tiny, -1, "q3_k_xl", tmp_path("recipe_fallback.gguf"));
        std::map<std::string, Type> want = {
            {"token_embd.weight", Type::Q5_0},          {"output.weight", Type::Q8_0},
            {"blk.1.attn_q.weight", Type::Q5_0},        {"blk.1.attn_v.weight", Type::Q5_1},
            {"blk.1.ffn_gate_exps.weight", Type::IQ4_NL}, {"blk.1.ffn_down_exps.weight", Type::Q5_0},
            {"blk.1.ffn_gate_inp.weight", Type::F32},   {"blk.1.attn_sinks.weight", Type::F32},
        };
        for (const auto& [name, type] : want) {
            INFO(name);
            const GgufTensorInfo* t = f->find_tensor(name);
            REQUIRE(t != nullptr);
            CHECK(moe::type_name(t->type) == std::string(moe::type_name(type)));
        }
    }
    SECTION("a recipe is named and excludes expert_type / dense_type") {
        moe_synth_params p = params("qwen3moe", "tiny");
        p.recipe = "q4_k_s";
        moe::Status s = moe::synth_write(tmp_path("invalid.gguf"), p);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains("recipe: unknown 'q4_k_s' (expected q4_k_m, q5_k_m, q3_k_xl, iq4_xs"));
        p.recipe = "q4_k_m";
        p.dense_type = MOE_TYPE_Q8_0;
        s = moe::synth_write(tmp_path("invalid.gguf"), p);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains("expert_type and dense_type must be -1"));
        p = params("qwen3moe", "tiny");
        p.expert_type = MOE_TYPE_Q4_K;  // n_embd 64
        s = moe::synth_write(tmp_path("invalid.gguf"), p);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains("n_embd: 64 is not a multiple of 256, which expert_type q4_K needs"));
        CHECK_FALSE(file_exists(tmp_path("invalid.gguf")));
    }
}

TEST_CASE("synth: real presets declare llama.cpp's shapes", "[synth]") {
    // One layer and a small vocabulary keep the files small; every tensor keeps its real shape, and
    // the metadata says the real values.
    struct Case {
        const char* arch;
        const char* preset;
        Shape shape;  // with n_layer 1 and n_vocab 1024
        Type experts;
    };
    const Case cases[] = {
        {"qwen3moe", "qwen3-30b-a3b", {1, 2048, 1024, 32, 4, 128, 128, 8, 768}, Type::Q4_0},
        {"gpt-oss", "gpt-oss-20b", {1, 2880, 1024, 64, 8, 64, 32, 4, 2880}, Type::Q4_0},
    };
    for (const Case& c : cases) {
        INFO(c.preset);
        const bool gpt_oss = std::string(c.arch) == "gpt-oss";
        moe_synth_params p = params(c.arch, c.preset);
        p.n_layer = 1;
        p.n_vocab = 1024;
        p.expert_type = static_cast<int32_t>(c.experts);
        p.routing_skew = 0.5f;
        auto f = write_and_open(tmp_path(std::string(c.preset) + "_1layer.gguf"), p);
        check_tensors(*f, gpt_oss, c.shape, c.experts, Type::F16);
        check_metadata(*f, gpt_oss, c.shape);
        check_weight_statistics(*f, gpt_oss, c.shape, c.experts, Type::F16);
        if (gpt_oss) CHECK(meta_int(*f, "gpt-oss.attention.sliding_window") == 128);
        CHECK(meta_int(*f, gpt_oss ? "gpt-oss.feed_forward_length" : "qwen3moe.feed_forward_length") ==
              (gpt_oss ? 2880 : 6144));
        std::remove(tmp_path(std::string(c.preset) + "_1layer.gguf").c_str());
    }
    // Qwen3-235B-A22B (HF config: 94 layers, hidden 4096, 64 / 4 heads of 128, 128 experts, top 8, expert FFN
    // 1536, dense FFN 12288): 8 of its 128 experts keep the one-layer file at 90 MB (128 would be 1.4 GB: the
    // hidden "[.synth-real]" case writes those); every other shape and value is the preset's.
    {
        const Shape shape{1, 4096, 1024, 64, 4, 128, 8, 8, 1536};
        moe_synth_params p = params("qwen3moe", "qwen3-235b-a22b");
        p.n_layer = 1;
        p.n_vocab = 1024;
        p.n_expert = 8;
        p.expert_type = MOE_TYPE_Q4_0;
        const std::string path = tmp_path("qwen3-235b-a22b_1layer.gguf");
        auto f = write_and_open(path, p);
        check_tensors(*f, false, shape, Type::Q4_0, Type::F16);
        check_metadata(*f, false, shape);
        CHECK(meta_int(*f, "qwen3moe.feed_forward_length") == 12288);
        CHECK(meta_int(*f, "qwen3moe.context_length") == 40960);
        f.reset();
        std::remove(path.c_str());
    }
}

TEST_CASE("synth: 2-layer files of every real preset and expert type", "[.synth-real]") {
    struct Case {
        const char* arch;
        const char* preset;
        Shape shape;
    };
    const Case cases[] = {
        {"qwen3moe", "qwen3-30b-a3b", {2, 2048, 151936, 32, 4, 128, 128, 8, 768}},
        {"gpt-oss", "gpt-oss-20b", {2, 2880, 201088, 64, 8, 64, 32, 4, 2880}},
        {"gpt-oss", "gpt-oss-120b", {2, 2880, 201088, 64, 8, 64, 128, 4, 2880}},
        {"qwen3moe", "qwen3-235b-a22b", {2, 4096, 151936, 64, 4, 128, 128, 8, 1536}},
    };
    for (const Case& c : cases) {
        for (Type experts : kExpertTypes) {
            INFO(c.preset << " with " << moe::type_name(experts) << " experts");
            const bool gpt_oss = std::string(c.arch) == "gpt-oss";
            moe_synth_params p = params(c.arch, c.preset);
            p.n_layer = 2;
            p.expert_type = static_cast<int32_t>(experts);
            const std::string path = tmp_path("real.gguf");
            auto f = write_and_open(path, p);
            check_tensors(*f, gpt_oss, c.shape, experts, Type::F16);
            check_metadata(*f, gpt_oss, c.shape);
            REQUIRE(moe::read_hparams(*f).is_ok());
            f.reset();
            std::remove(path.c_str());
        }
    }
}

TEST_CASE("synth: the same seed gives the same bytes, whatever the thread count", "[synth]") {
    // F32 experts of 256 x 512 x 72 are 37.7 MB: several chunks and two write batches per tensor.
    moe_synth_params p = params("qwen3moe", "tiny");
    p.n_layer = 1;
    p.n_embd = 256;
    p.n_ff_expert = 512;
    p.n_expert = 72;
    p.n_vocab = 4096;
    p.expert_type = MOE_TYPE_F32;
    p.routing_skew = 0.3f;
    p.seed = std::random_device{}();
    INFO("seed " << p.seed);
    const std::string a = tmp_path("det_a.gguf"), b = tmp_path("det_b.gguf"), c = tmp_path("det_c.gguf");
    REQUIRE(moe::synth_write(a, p).is_ok());
    {
        tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
        REQUIRE(moe::synth_write(b, p).is_ok());
    }
    const std::vector<char> bytes_a = read_all(a);
    CHECK(bytes_a.size() > size_t{100} << 20);
    CHECK(bytes_a == read_all(b));

    p.seed += 1;
    REQUIRE(moe::synth_write(c, p).is_ok());
    const std::vector<char> bytes_c = read_all(c);
    REQUIRE(bytes_c.size() == bytes_a.size());
    // Only the seed metadata and the weights differ; almost every weight byte must.
    size_t differ = 0;
    for (size_t i = 0; i < bytes_a.size(); ++i) differ += bytes_a[i] != bytes_c[i];
    CHECK(differ > bytes_a.size() / 2);
    for (const std::string& path : {a, b, c}) std::remove(path.c_str());

    // Same for the gpt-oss tiny file (every tensor kind).
    moe_synth_params g = params("gpt-oss", "tiny");
    g.routing_skew = 0.7f;
    REQUIRE(moe::synth_write(a, g).is_ok());
    {
        tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
        REQUIRE(moe::synth_write(b, g).is_ok());
    }
    CHECK(read_all(a) == read_all(b));
}

TEST_CASE("synth: routing skew offsets follow the documented formula", "[synth]") {
    // offset of the expert of popularity rank r of n = -5 * skew * r / (n - 1); ranks are a per-layer
    // permutation of the experts.
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        const bool gpt_oss = std::string(arch) == "gpt-oss";
        for (float skew : {0.0f, 0.4f, 0.9f}) {
            INFO(arch << " skew " << skew);
            moe_synth_params p = params(arch, "tiny");
            p.routing_skew = skew;
            p.n_expert = 16;
            auto f = write_and_open(tmp_path(std::string("skew_") + arch + ".gguf"), p);
            CHECK(meta_float(*f, "moeinfer.synthetic.routing_skew") == Approx(skew));
            Shape s = kTinyShape;
            s.n_expert = 16;
            std::vector<std::vector<float>> layers;
            for (int l = 0; l < 2; ++l) {
                std::vector<float> off = skew_offsets(*f, gpt_oss, l, s);
                layers.push_back(off);
                std::sort(off.begin(), off.end(), std::greater<float>());
                for (int r = 0; r < 16; ++r) {
                    CHECK(off[static_cast<size_t>(r)] == Approx(-5.0 * skew * r / 15.0).margin(1e-6));
                }
            }
            // The popular experts are scattered: the two layers rank them differently.
            if (skew > 0) CHECK(layers[0] != layers[1]);
        }
    }
}

TEST_CASE("synth: progress and cancellation", "[synth]") {
    moe_synth_params p = params("gpt-oss", "tiny");
    struct Log {
        std::vector<float> fractions;
        int cancel_at = -1;
    } log;
    p.progress = [](float f, void* user) -> int {
        auto* l = static_cast<Log*>(user);
        l->fractions.push_back(f);
        return static_cast<int>(l->fractions.size()) == l->cancel_at ? 0 : 1;
    };
    p.progress_user_data = &log;
    const std::string path = tmp_path("progress.gguf");
    REQUIRE(moe::synth_write(path, p).is_ok());
    REQUIRE(log.fractions.size() > 10);
    CHECK(std::is_sorted(log.fractions.begin(), log.fractions.end()));
    CHECK(log.fractions.front() > 0.0f);
    CHECK(log.fractions.back() == 1.0f);

    std::remove(path.c_str());
    log.fractions.clear();
    log.cancel_at = 5;
    const moe::Status s = moe::synth_write(path, p);
    CHECK(s.code() == MOE_STATUS_CANCELLED);
    CHECK_THAT(s.message(), Catch::Contains("cancelled by the progress callback"));
    CHECK(log.fractions.size() == 5);
    CHECK_FALSE(file_exists(path));
    CHECK_FALSE(file_exists(path + ".tmp"));
}

TEST_CASE("synth: parameters are validated with named errors", "[synth]") {
    moe_synth_params p;
    CHECK(moe::synth_params_init(&p, "llama").code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe::synth_params_init(nullptr, "qwen3moe").code() == MOE_STATUS_INVALID_ARGUMENT);
    REQUIRE(moe::synth_params_init(&p, nullptr).is_ok());
    CHECK(std::string(p.architecture) == "qwen3moe");
    CHECK(std::string(p.preset) == "qwen3-30b-a3b");
    CHECK(p.struct_size == sizeof p);
    CHECK(p.seed == 42);
    CHECK(p.expert_type == -1);
    CHECK(p.dense_type == -1);
    REQUIRE(moe::synth_params_init(&p, "gpt-oss").is_ok());
    CHECK(std::string(p.preset) == "gpt-oss-20b");

    struct Case {
        const char* what;
        void (*edit)(moe_synth_params&);
        const char* message;
    };
    const Case cases[] = {
        {"arch", [](moe_synth_params& q) { q.architecture = "mixtral"; }, "architecture: unknown 'mixtral'"},
        {"preset", [](moe_synth_params& q) { q.preset = "huge"; }, "preset: unknown 'huge' for architecture 'qwen3moe'"},
        {"preset of the other arch", [](moe_synth_params& q) { q.preset = "gpt-oss-20b"; }, "preset: unknown 'gpt-oss-20b'"},
        {"negative", [](moe_synth_params& q) { q.n_layer = -2; }, "n_layer: -2 is negative"},
        {"vocab", [](moe_synth_params& q) { q.n_vocab = 100; }, "n_vocab: 100 is too small"},
        {"gqa", [](moe_synth_params& q) { q.n_head_kv = 3; }, "n_head: 4 is not a multiple of n_head_kv 3"},
        {"head dim", [](moe_synth_params& q) { q.head_dim = 15; }, "head_dim: 15 is odd"},
        {"top-k", [](moe_synth_params& q) { q.n_expert_used = 9; }, "n_expert_used: 9 exceeds n_expert 8"},
        {"block", [](moe_synth_params& q) { q.n_embd = 80; }, "n_embd: 80 is not a multiple of 32, which expert_type q8_0 needs"},
        {"ff block", [](moe_synth_params& q) { q.n_ff_expert = 48; q.expert_type = MOE_TYPE_MXFP4; },
         "n_ff_expert: 48 is not a multiple of 32, which expert_type mxfp4 needs"},
        {"dense block", [](moe_synth_params& q) { q.dense_type = MOE_TYPE_Q4_0; q.head_dim = 6; },
         "n_head * head_dim: 24 is not a multiple of 32, which dense_type q4_0 needs"},
        {"expert type", [](moe_synth_params& q) { q.expert_type = 99; }, "expert_type: 99 is not a weight type"},
        {"dense type", [](moe_synth_params& q) { q.dense_type = 26; }, "dense_type: 26 is not a weight type"},
        {"skew 1", [](moe_synth_params& q) { q.routing_skew = 1.0f; }, "routing_skew: 1.000000 is outside [0, 1)"},
        {"skew < 0", [](moe_synth_params& q) { q.routing_skew = -0.1f; }, "routing_skew"},
        {"skew NaN", [](moe_synth_params& q) { q.routing_skew = std::nanf(""); }, "routing_skew"},
        {"struct_size", [](moe_synth_params& q) { q.struct_size = 4; }, "struct_size: 4 is too small"},
    };
    for (const Case& c : cases) {
        INFO(c.what);
        moe_synth_params q = params("qwen3moe", "tiny");
        c.edit(q);
        const moe::Status s = moe::synth_write(tmp_path("invalid.gguf"), q);
        CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(s.message(), Catch::Contains(c.message));
        CHECK_FALSE(file_exists(tmp_path("invalid.gguf")));
    }
}

TEST_CASE("synth: only the fields inside struct_size are read", "[synth]") {
    // A caller built against an older header whose struct ended before `seed`: the garbage after it
    // (a bad progress pointer among it) must not be read, and the defaults apply.
    moe_synth_params old = params("gpt-oss", "tiny");
    old.struct_size = offsetof(moe_synth_params, seed);
    old.seed = 12345;
    old.routing_skew = 7.0f;  // invalid if it were read
    old.progress = reinterpret_cast<moe_progress_fn>(static_cast<uintptr_t>(0x10));
    const std::string a = tmp_path("old_caller.gguf"), b = tmp_path("new_caller.gguf");
    const moe::Status s = moe::synth_write(a, old);
    INFO(s.message());
    REQUIRE(s.is_ok());
    moe_synth_params now = params("gpt-oss", "tiny");  // seed 42, skew 0
    REQUIRE(moe::synth_write(b, now).is_ok());
    CHECK(read_all(a) == read_all(b));
}

TEST_CASE("synth: I/O errors name the path and leave no file behind", "[synth]") {
    const std::string path = tmp_path("no_such_dir/model.gguf");
    const moe::Status s = moe::synth_write(path, params("qwen3moe", "tiny"));
    CHECK(s.code() == MOE_STATUS_IO_ERROR);
    CHECK_THAT(s.message(), Catch::Contains(path) && Catch::Contains("No such file or directory"));
    CHECK(moe::synth_write("", params("qwen3moe", "tiny")).code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("synth: the C API", "[synth]") {
    moe_synth_params p;
    CHECK(moe_synth_params_init(nullptr, "qwen3moe") == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_synth_params_init(&p, "gpt2") == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("architecture: unknown 'gpt2'"));
    REQUIRE(moe_synth_params_init(&p, "qwen3moe") == MOE_STATUS_OK);
    p.preset = "tiny";
    CHECK(moe_synth_write(nullptr, &p) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_synth_write(tmp_path("c.gguf").c_str(), nullptr) == MOE_STATUS_INVALID_ARGUMENT);
    p.n_expert_used = 20;
    CHECK(moe_synth_write(tmp_path("c.gguf").c_str(), &p) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("n_expert_used: 20 exceeds n_expert 8"));
    p.n_expert_used = 0;
    CHECK(moe_synth_write(tmp_path("c.gguf").c_str(), &p) == MOE_STATUS_OK);
    CHECK(std::string(moe_last_error()).empty());
    CHECK(file_exists(tmp_path("c.gguf")));
}
