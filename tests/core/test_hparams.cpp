// Hyper-parameter validation at model load: a synthetic model of each architecture, copied with one
// key (or a few) changed to each class of bad value, must fail to load with DATA_CORRUPT (UNIMPLEMENTED
// for valid but unsupported RoPE scaling) naming the full GGUF key and the value, both from read_hparams
// and from moe_model_load (whose message must name the path exactly once); valid edge values must load
// and read back as written. block_count must agree with the layers whose tensors the file holds.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "common/gguf_edit.h"
#include "core/gguf.h"
#include "core/models/hparams.h"
#include "core/models/synth.h"
#include "moeinfer/moeinfer.h"

using namespace moe;
using moe::test::GgufEdit;
using moe::test::GgufEditValue;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string tmp_file(const std::string& name) {
    std::filesystem::create_directories(MOE_TEST_TMP_DIR);
    return std::string(MOE_TEST_TMP_DIR) + "/hparams_" + name + "_" + std::to_string(getpid()) + ".gguf";
}

// The tiny synthetic model of `arch` (2 layers, head_dim 16 = n_embd / n_head), written once per
// process and removed at exit.
const std::string& tiny_file(const std::string& arch) {
    struct Files : std::map<std::string, std::string> {
        ~Files() {
            std::error_code ec;
            for (const auto& [a, path] : *this) std::filesystem::remove(path, ec);
        }
    };
    static Files files;
    auto it = files.find(arch);
    if (it != files.end()) return it->second;
    moe_synth_params p;
    REQUIRE(synth_params_init(&p, arch.c_str()).is_ok());
    p.preset = "tiny";
    p.expert_type = MOE_TYPE_F32;
    p.dense_type = MOE_TYPE_F32;
    const std::string path = tmp_file("tiny_" + arch);
    REQUIRE(synth_write(path, p).is_ok());
    return files.emplace(arch, path).first->second;
}

size_t count_of(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

struct BadCase {
    const char* arch;
    std::map<std::string, GgufEditValue> metadata;  // keys without the "<arch>." prefix
    moe_status code;
    std::string key;    // the key the message must name, without the prefix
    std::string value;  // the value text the message must show ("" when the key is missing)
    std::function<bool(const std::string&)> drop_tensor = {};
    std::vector<std::pair<std::string, int64_t>> add_f32 = {};
};

GgufEdit to_edit(const std::string& arch, const std::map<std::string, GgufEditValue>& metadata) {
    GgufEdit e;
    for (const auto& [k, v] : metadata) e.metadata[arch + "." + k] = v;
    return e;
}

std::vector<BadCase> bad_cases() {
    using M = std::map<std::string, GgufEditValue>;
    const auto D = MOE_STATUS_DATA_CORRUPT;
    const auto U = MOE_STATUS_UNIMPLEMENTED;
    std::vector<BadCase> cases;
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        const bool oss = std::string(arch) == "gpt-oss";
        // Every count: zero, negative, beyond 2^30, and (required ones) absent.
        std::vector<std::string> counts = {"block_count",        "embedding_length",      "attention.head_count",
                                           "attention.head_count_kv", "expert_count",    "expert_used_count",
                                           "expert_feed_forward_length", "context_length", "attention.key_length",
                                           "attention.value_length", "rope.dimension_count"};
        if (oss) counts.insert(counts.end(), {"attention.sliding_window", "rope.scaling.original_context_length"});
        for (const std::string& k : counts) {
            cases.push_back({arch, M{{k, uint32_t{0}}}, D, k, "0"});
            cases.push_back({arch, M{{k, int32_t{-1}}}, D, k, "-1"});
            cases.push_back({arch, M{{k, uint64_t{1} << 31}}, D, k, "2147483648"});
            cases.push_back({arch, M{{k, std::string("8")}}, D, k, ""});  // a string where a number belongs
        }
        for (const char* k : {"block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                              "expert_count", "expert_used_count", "expert_feed_forward_length", "context_length"}) {
            cases.push_back({arch, M{{k, std::monostate{}}}, D, k, ""});
        }
        if (oss) {
            cases.push_back(
                {arch, M{{"attention.sliding_window", std::monostate{}}}, D, "attention.sliding_window", ""});
            // YaRN (the preset's factor is 32) without the context length it was trained at.
            cases.push_back({arch, M{{"rope.scaling.original_context_length", std::monostate{}}}, D,
                             "rope.scaling.original_context_length", ""});
        }
        // Counts that contradict each other (the tiny preset: 4 heads, 2 kv heads, 8 experts, head size 16).
        cases.push_back({arch, M{{"attention.head_count_kv", uint32_t{3}}}, D, "attention.head_count_kv", "3"});
        cases.push_back({arch, M{{"attention.head_count_kv", uint32_t{8}}}, D, "attention.head_count_kv", "8"});
        cases.push_back({arch, M{{"expert_used_count", uint32_t{9}}}, D, "expert_used_count", "9"});
        cases.push_back({arch, M{{"attention.key_length", uint32_t{15}}}, D, "attention.key_length", "15"});
        cases.push_back({arch, M{{"attention.value_length", uint32_t{32}}}, D, "attention.value_length", "32"});
        cases.push_back({arch, M{{"rope.dimension_count", uint32_t{8}}}, D, "rope.dimension_count", "8"});
        // No key_length, and n_embd (64) is no multiple of n_head (6; 2 kv heads divide it).
        cases.push_back({arch,
                         M{{"attention.key_length", std::monostate{}}, {"attention.value_length", std::monostate{}},
                           {"rope.dimension_count", std::monostate{}}, {"attention.head_count", uint32_t{6}}},
                         D, "attention.key_length", ""});
        // Floats: NaN, infinities, out of range, and a float64 that overflows a float32.
        for (const auto& [v, text] : std::vector<std::pair<GgufEditValue, std::string>>{
                 {0.0f, "0"}, {-1.0f, "-1"}, {kNaN, "nan"}, {kInf, "inf"}, {-kInf, "-inf"}, {1e39, "1e+39"}}) {
            cases.push_back({arch, M{{"rope.freq_base", v}}, D, "rope.freq_base", text});
        }
        for (const auto& [v, text] : std::vector<std::pair<GgufEditValue, std::string>>{
                 {-0.5f, "-0.5"}, {-1.0f, "-1"}, {kNaN, "nan"}, {kInf, "inf"}, {1e39, "1e+39"}}) {
            cases.push_back({arch, M{{"attention.layer_norm_rms_epsilon", v}}, D, "attention.layer_norm_rms_epsilon",
                             text});
        }
        for (const auto& [v, text] : std::vector<std::pair<GgufEditValue, std::string>>{
                 {0.0f, "0"}, {-1.0f, "-1"}, {0.5f, "0.5"}, {kNaN, "nan"}, {kInf, "inf"}}) {
            cases.push_back({arch, M{{"rope.scaling.factor", v}}, D, "rope.scaling.factor", text});
        }
        cases.push_back({arch, M{{"rope.freq_base", std::string("1e4")}}, D, "rope.freq_base", ""});
        // RoPE scaling that is valid but not implemented: refused, never run unscaled.
        cases.push_back(
            {arch, M{{"rope.scaling.type", std::string("longrope")}}, U, "rope.scaling.type", "'longrope'"});
        cases.push_back({arch, M{{"rope.scaling.type", std::string("linear")}, {"rope.scaling.factor", 4.0f}}, U,
                         "rope.scaling.factor", "4"});
        // block_count against the layers present: fewer, more, a hole, an extra layer.
        cases.push_back({arch, M{{"block_count", uint32_t{1}}}, D, "block_count", "1"});
        cases.push_back({arch, M{{"block_count", uint32_t{3}}}, D, "block_count", "3"});
        cases.push_back({arch, M{{"block_count", uint32_t{1} << 30}}, D, "block_count", "1073741824"});
        auto drop_blk1 = [](const std::string& n) { return n.rfind("blk.1.", 0) == 0; };
        cases.push_back({arch, M{}, D, "block_count", "2", drop_blk1});
        cases.push_back({arch, M{}, D, "block_count", "2", {}, {{"blk.7.attn_norm.weight", 64}}});
    }
    // qwen3moe: YaRN (HF's variant for Qwen3) and a factor without a type (linear for llama.cpp).
    cases.push_back({"qwen3moe",
                     M{{"rope.scaling.type", std::string("yarn")}, {"rope.scaling.factor", 4.0f},
                       {"rope.scaling.original_context_length", uint32_t{32768}}},
                     U, "rope.scaling.type", "'yarn'"});
    cases.push_back({"qwen3moe", M{{"rope.scaling.factor", 4.0f}}, U, "rope.scaling.factor", "4"});
    return cases;
}

std::string describe(const BadCase& c) {
    std::string s = std::string(c.arch) + ":";
    for (const auto& [k, v] : c.metadata) {
        s += " " + k + "=";
        if (std::holds_alternative<std::monostate>(v)) s += "<removed>";
        if (const auto* x = std::get_if<uint32_t>(&v)) s += std::to_string(*x) + "u32";
        if (const auto* x = std::get_if<int32_t>(&v)) s += std::to_string(*x) + "i32";
        if (const auto* x = std::get_if<uint64_t>(&v)) s += std::to_string(*x) + "u64";
        if (const auto* x = std::get_if<float>(&v)) s += std::to_string(*x) + "f32";
        if (const auto* x = std::get_if<double>(&v)) s += std::to_string(*x) + "f64";
        if (const auto* x = std::get_if<std::string>(&v)) s += "'" + *x + "'";
    }
    if (c.drop_tensor) s += " (without blk.1.*)";
    for (const auto& [name, n] : c.add_f32) s += " (plus " + name + ")";
    return s;
}

}  // namespace

TEST_CASE("model load names every bad hyper-parameter by its key and value", "[models][hparams]") {
    const std::vector<BadCase> cases = bad_cases();
    for (const BadCase& c : cases) {
        INFO(describe(c));
        GgufEdit edit = to_edit(c.arch, c.metadata);
        edit.drop_tensor = c.drop_tensor;
        edit.add_f32 = c.add_f32;
        const std::string path = tmp_file("bad");
        moe::test::write_edited_gguf(tiny_file(c.arch), path, edit);
        const std::string key = std::string(c.arch) + "." + c.key;

        auto f = GgufFile::open(path);
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        REQUIRE_FALSE(hp.is_ok());
        const std::string& msg = hp.status().message();
        INFO(msg);
        CHECK(hp.status().code() == c.code);
        CHECK(msg.find("'" + key + "'") != std::string::npos);
        if (!c.value.empty()) CHECK(msg.find("= " + c.value) != std::string::npos);

        // The same through the public API: refused at load, not at the first decode.
        moe_model* model = nullptr;
        CHECK(moe_model_load(path.c_str(), nullptr, &model) == c.code);
        CHECK(model == nullptr);
        const std::string api_msg = moe_last_error();
        INFO(api_msg);
        CHECK(api_msg.find(msg) != std::string::npos);
        CHECK(count_of(api_msg, path) == 1);
        moe_model_free(model);
        std::filesystem::remove(path);
    }
}

TEST_CASE("model load accepts valid edge values and reads them back", "[models][hparams]") {
    using M = std::map<std::string, GgufEditValue>;
    struct GoodCase {
        const char* arch;
        M metadata;
        std::function<void(const HParams&)> check;
    };
    const std::vector<GoodCase> cases = {
        {"qwen3moe", M{{"attention.layer_norm_rms_epsilon", 0.0f}},
         [](const HParams& hp) { CHECK(hp.rms_eps == 0.0f); }},
        {"qwen3moe", M{{"rope.freq_base", 0.5}}, [](const HParams& hp) { CHECK(hp.rope_freq_base == 0.5f); }},
        {"qwen3moe", M{{"rope.scaling.type", std::string("none")}},
         [](const HParams& hp) { CHECK(hp.rope_yarn_factor == 1.0f); }},
        {"qwen3moe", M{{"rope.scaling.type", std::string("linear")}, {"rope.scaling.factor", 1.0f}},
         [](const HParams& hp) { CHECK(hp.rope_yarn_factor == 1.0f); }},
        // head_dim from n_embd / n_head when the head sizes are left out.
        {"qwen3moe",
         M{{"attention.key_length", std::monostate{}}, {"attention.value_length", std::monostate{}},
           {"rope.dimension_count", std::monostate{}}},
         [](const HParams& hp) { CHECK(hp.head_dim == 16); }},
        // expert_used_count == expert_count, head_count_kv == head_count (no GQA).
        {"gpt-oss", M{{"expert_used_count", uint32_t{8}}, {"attention.head_count_kv", uint32_t{4}}},
         [](const HParams& hp) {
             CHECK(hp.n_expert_used == 8);
             CHECK(hp.n_head_kv == 4);
         }},
        // YaRN factor 1: no scaling, so no original context length is needed.
        {"gpt-oss", M{{"rope.scaling.factor", 1.0f}, {"rope.scaling.original_context_length", std::monostate{}}},
         [](const HParams& hp) {
             CHECK(hp.rope_yarn_factor == 1.0f);
             CHECK(hp.rope_yarn_orig_ctx == 0);
         }},
        // A gpt-oss file that leaves the scaling type out still means YaRN.
        {"gpt-oss", M{{"rope.scaling.type", std::monostate{}}, {"rope.scaling.factor", 4.0}},
         [](const HParams& hp) {
             CHECK(hp.rope_yarn_factor == 4.0f);
             CHECK(hp.rope_yarn_orig_ctx == 4096);
         }},
        {"gpt-oss", M{{"rope.freq_base", uint32_t{150000}}, {"context_length", uint32_t{1} << 30}},
         [](const HParams& hp) {
             CHECK(hp.rope_freq_base == 150000.0f);
             CHECK(hp.n_ctx_train == 1 << 30);
         }},
    };
    for (const GoodCase& c : cases) {
        const std::string path = tmp_file("good");
        moe::test::write_edited_gguf(tiny_file(c.arch), path, to_edit(c.arch, c.metadata));
        auto f = GgufFile::open(path);
        REQUIRE(f.is_ok());
        StatusOr<HParams> hp = read_hparams(**f);
        INFO(c.arch << ": " << (hp.is_ok() ? "" : hp.status().message()));
        REQUIRE(hp.is_ok());
        CHECK(hp->n_layer == 2);
        c.check(*hp);
        std::filesystem::remove(path);
    }
}
