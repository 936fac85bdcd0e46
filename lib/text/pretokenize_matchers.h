// The matchers behind pre_tokenize(): each answers "where does this pattern's match starting at
// character i end", over a piece of decoded text. Internal to lib/text.
#pragma once

#include <cstddef>
#include <cstdint>

#include "text/unicode_category.h"

namespace moe::text {

struct CharInfo {
    uint32_t cp;  // kReplacementChar for an invalid byte
    Gc gc;
    bool ws;      // \s
};

// A piece of text: chars [0, n). A matcher returns the end (> i) of the match that starts at i, or
// 0 when the pattern does not match there. Anchors and look-aheads see only the piece.
using Matcher = size_t (*)(const CharInfo* c, size_t n, size_t i);

// One pattern each, named after where they come from; the exact pattern is above each definition.
size_t match_llama3(const CharInfo* c, size_t n, size_t i);
size_t match_qwen2(const CharInfo* c, size_t n, size_t i);
size_t match_gpt4o(const CharInfo* c, size_t n, size_t i);
size_t match_gpt2(const CharInfo* c, size_t n, size_t i);
size_t match_default_punct(const CharInfo* c, size_t n, size_t i);
size_t match_numbers(const CharInfo* c, size_t n, size_t i);
size_t match_three_ascii_digits(const CharInfo* c, size_t n, size_t i);
size_t match_numbers_1_3(const CharInfo* c, size_t n, size_t i);
size_t match_deepseek_v3_cjk(const CharInfo* c, size_t n, size_t i);
size_t match_deepseek_v3_words(const CharInfo* c, size_t n, size_t i);
size_t match_newline_char(const CharInfo* c, size_t n, size_t i);
size_t match_deepseek_llm_letters(const CharInfo* c, size_t n, size_t i);
size_t match_deepseek_llm_punct(const CharInfo* c, size_t n, size_t i);
size_t match_trailing_space(const CharInfo* c, size_t n, size_t i);
size_t match_deepseek_llm_cjk(const CharInfo* c, size_t n, size_t i);

}  // namespace moe::text
