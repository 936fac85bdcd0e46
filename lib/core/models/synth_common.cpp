// Parts of synthetic models shared by the architectures: general metadata, the minimal tokenizer,
// and the common tensor initialisers.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/models/synth_model.h"

namespace moe::synth {
namespace {

// llama.cpp's llama_ftype of a file whose bulk (the experts) is `t`; informational only.
uint32_t file_type_of(Type t) {
    switch (t) {
        case Type::F32: return 0;    // ALL_F32
        case Type::F16: return 1;    // MOSTLY_F16
        case Type::Q4_0: return 2;   // MOSTLY_Q4_0
        case Type::Q8_0: return 7;   // MOSTLY_Q8_0
        case Type::BF16: return 32;  // MOSTLY_BF16
        case Type::MXFP4: return 38; // MOSTLY_MXFP4_MOE
        case Type::Q4_1: return 3;   // MOSTLY_Q4_1
        case Type::Q5_0: return 8;   // MOSTLY_Q5_0
        case Type::Q5_1: return 9;   // MOSTLY_Q5_1
        case Type::Q2_K: return 10;  // MOSTLY_Q2_K
        case Type::Q3_K: return 11;  // MOSTLY_Q3_K_S
        case Type::Q4_K: return 14;  // MOSTLY_Q4_K_S
        case Type::Q5_K: return 16;  // MOSTLY_Q5_K_S
        case Type::Q6_K: return 18;  // MOSTLY_Q6_K
        case Type::IQ4_NL: return 25; // MOSTLY_IQ4_NL
        case Type::IQ4_XS: return 30; // MOSTLY_IQ4_XS
        default: return 0;           // not a weight type; resolve_config refuses it
    }
}

// llama.cpp token types (llama_token_type).
constexpr int32_t kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokByte = 6;
constexpr int kFirstFiller = 3 + 256;

// A SentencePiece-style ("llama") vocabulary llama.cpp accepts: <unk>, <s>, </s>, the 256 byte
// tokens (SPM needs "<0x0A>" for its newline token and falls back to bytes for any text), then
// unique filler tokens up to n_vocab (the loader asserts that token texts are unique).
void tokenizer_metadata(GgufWriter& w, int n_vocab) {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    tokens.reserve(static_cast<size_t>(n_vocab));
    auto add = [&](std::string text, float score, int32_t type) {
        tokens.push_back(std::move(text));
        scores.push_back(score);
        types.push_back(type);
    };
    add("<unk>", 0.0f, kTokUnknown);
    add("<s>", 0.0f, kTokControl);
    add("</s>", 0.0f, kTokControl);
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 0.0f, kTokByte);
    }
    for (int i = kFirstFiller; i < n_vocab; ++i) add("tok" + std::to_string(i), -static_cast<float>(i), kTokNormal);

    w.add_string("tokenizer.ggml.model", "llama");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_float32_array("tokenizer.ggml.scores", scores);
    w.add_int32_array("tokenizer.ggml.token_type", types);
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0);
    w.add_uint32("tokenizer.ggml.bos_token_id", 1);
    w.add_uint32("tokenizer.ggml.eos_token_id", 2);
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_bool("tokenizer.ggml.add_eos_token", false);
}

}  // namespace

void common_metadata(GgufWriter& w, const Config& c) {
    const bool recipe = c.recipe != Recipe::NONE;
    char name[160];
    std::snprintf(name, sizeof name, "moeinfer synthetic %s (%d layers, %s %s, skew %.2f, seed %llu)",
                  c.preset.c_str(), c.n_layer, recipe ? recipe_name(c.recipe) : type_name(c.expert_type),
                  recipe ? "recipe" : "experts", static_cast<double>(c.routing_skew),
                  static_cast<unsigned long long>(c.seed));
    w.add_string("general.architecture", c.arch_name);
    w.add_string("general.type", "model");
    w.add_string("general.name", name);
    w.add_uint32("general.file_type", recipe ? recipe_file_type(c.recipe) : file_type_of(c.expert_type));
    w.add_uint32("general.quantization_version", 2);
    w.add_uint64("moeinfer.synthetic.seed", c.seed);
    w.add_float32("moeinfer.synthetic.routing_skew", c.routing_skew);
    w.add_string("moeinfer.synthetic.preset", c.preset);
    tokenizer_metadata(w, c.n_vocab);
}

TensorSpec dense_weight(std::string name, const Config& c, int64_t fan_in, int64_t n_out, float scale) {
    // U with std scale / sqrt(fan_in): a unit-rms input gives outputs of rms ~scale.
    return {std::move(name), c.dense_type, {fan_in, n_out}, Init::UNIFORM, 0.0f,
            scale / std::sqrt(static_cast<float>(fan_in))};
}

TensorSpec norm_weight(std::string name, int64_t n) {
    return {std::move(name), Type::F32, {n}, Init::UNIFORM, 1.0f, kNormSpread / 1.7320508f};
}

TensorSpec bias(std::string name, std::vector<int64_t> ne) {
    return {std::move(name), Type::F32, std::move(ne), Init::UNIFORM, 0.0f, kBiasStd};
}

}  // namespace moe::synth
