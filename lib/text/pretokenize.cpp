#include "text/pretokenize.h"

#include <utility>

#include "text/pretokenize_matchers.h"
#include "text/utf8.h"

namespace moe::text {

namespace {

struct NameEntry {
    const char* name;
    PreTokenizer pre;
};

// Names as the GGUF converters write them (llama.cpp's convert_hf_to_gguf.py), aliases included.
constexpr NameEntry kNames[] = {
    {"default", PreTokenizer::DEFAULT},
    {"llama3", PreTokenizer::LLAMA3},
    {"llama-v3", PreTokenizer::LLAMA3},
    {"llama-bpe", PreTokenizer::LLAMA3},
    {"glm4", PreTokenizer::LLAMA3},
    {"chatglm-bpe", PreTokenizer::LLAMA3},
    {"qwen2", PreTokenizer::QWEN2},
    {"deepseek-r1-qwen", PreTokenizer::QWEN2},
    {"gpt-4o", PreTokenizer::GPT4O},
    {"deepseek-v3", PreTokenizer::DEEPSEEK_V3},
    {"deepseek-llm", PreTokenizer::DEEPSEEK_LLM},
};

struct Stages {
    const Matcher* matchers;
    size_t count;
};

// Patterns applied one after another, each splitting every piece the previous ones left
// (a Hugging Face Sequence of Split pre-tokenizers, behaviour "Isolated").
Stages stages_of(PreTokenizer pre) {
    static constexpr Matcher kDefault[] = {match_default_punct, match_gpt2, match_numbers, match_three_ascii_digits};
    static constexpr Matcher kLlama3[] = {match_llama3};
    static constexpr Matcher kQwen2[] = {match_qwen2};
    static constexpr Matcher kGpt4o[] = {match_gpt4o};
    static constexpr Matcher kDeepseekV3[] = {match_numbers_1_3, match_deepseek_v3_cjk, match_deepseek_v3_words};
    static constexpr Matcher kDeepseekLlm[] = {match_newline_char,   match_deepseek_llm_letters,
                                               match_deepseek_llm_punct, match_trailing_space,
                                               match_deepseek_llm_cjk, match_numbers};
    switch (pre) {
        case PreTokenizer::DEFAULT: return {kDefault, std::size(kDefault)};
        case PreTokenizer::LLAMA3: return {kLlama3, std::size(kLlama3)};
        case PreTokenizer::QWEN2: return {kQwen2, std::size(kQwen2)};
        case PreTokenizer::GPT4O: return {kGpt4o, std::size(kGpt4o)};
        case PreTokenizer::DEEPSEEK_V3: return {kDeepseekV3, std::size(kDeepseekV3)};
        case PreTokenizer::DEEPSEEK_LLM: return {kDeepseekLlm, std::size(kDeepseekLlm)};
    }
    MOE_ASSERT(false);
    return {nullptr, 0};
}

using Piece = std::pair<size_t, size_t>;  // [first, last) in characters

// Splits each piece by `match`: every match is a piece, and so is each run of characters between
// matches.
void split(Matcher match, const std::vector<CharInfo>& chars, const std::vector<Piece>& in, std::vector<Piece>& out) {
    out.clear();
    for (const Piece& p : in) {
        const CharInfo* c = chars.data() + p.first;
        const size_t n = p.second - p.first;
        size_t gap = 0;
        size_t i = 0;
        while (i < n) {
            const size_t e = match(c, n, i);
            if (e == 0) {
                ++i;
                continue;
            }
            if (gap < i) out.emplace_back(p.first + gap, p.first + i);
            out.emplace_back(p.first + i, p.first + e);
            i = gap = e;
        }
        if (gap < n) out.emplace_back(p.first + gap, p.first + n);
    }
}

}  // namespace

StatusOr<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
    for (const NameEntry& e : kNames) {
        if (name == e.name) return e.pre;
    }
    return unimplemented("tokenizer.ggml.pre '" + std::string(name) + "' is not supported (supported: " +
                         supported_pre_tokenizer_names() + ")");
}

std::string supported_pre_tokenizer_names() {
    std::string s;
    for (const NameEntry& e : kNames) {
        if (!s.empty()) s += ", ";
        s += e.name;
    }
    return s;
}

void pre_tokenize(PreTokenizer pre, std::string_view text, std::vector<std::string_view>& words) {
    std::vector<CharInfo> chars;
    std::vector<size_t> offsets;  // byte offset of each character, and of the end
    chars.reserve(text.size());
    offsets.reserve(text.size() + 1);
    for (size_t pos = 0; pos < text.size();) {
        const Utf8Char u = utf8_decode(text, pos);
        chars.push_back({u.cp, general_category(u.cp), is_white_space(u.cp)});
        offsets.push_back(pos);
        pos += u.len;
    }
    offsets.push_back(text.size());
    if (chars.empty()) return;

    std::vector<Piece> pieces{{0, chars.size()}};
    std::vector<Piece> next;
    const Stages stages = stages_of(pre);
    for (size_t s = 0; s < stages.count; ++s) {
        split(stages.matchers[s], chars, pieces, next);
        pieces.swap(next);
    }
    for (const Piece& p : pieces) words.push_back(text.substr(offsets[p.first], offsets[p.second] - offsets[p.first]));
}

}  // namespace moe::text
