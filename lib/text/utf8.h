// UTF-8 decoding and encoding for the tokenizer.
//
// Invalid input is never an error here: a byte that does not start a well-formed sequence (a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate, a value past U+10FFFF)
// decodes as one character of its own, length 1, `valid` false. Callers classify it as U+FFFD
// would be classified and keep its byte, so byte-level vocabularies and byte fallback encode it
// exactly and detokenization gives it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moe::text {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

struct Utf8Char {
    uint32_t cp;   // the code point; kReplacementChar when !valid
    uint32_t len;  // bytes consumed, >= 1
    bool valid;
};

// Decodes the character starting at s[pos]. REQUIRES: pos < s.size().
Utf8Char utf8_decode(std::string_view s, size_t pos);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF, not a surrogate).
void utf8_append(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that does not end inside a sequence that later bytes could
// still complete: the streaming detokenizer returns that prefix and keeps the rest. A sequence that
// can never become valid is not held back.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace moe::text
