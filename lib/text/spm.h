// SentencePiece-style BPE (tokenizer.ggml.model "llama"), as llama.cpp and sentencepiece's BPE
// model do it: start from the characters, repeatedly merge the adjacent pair whose concatenation
// is the token of highest score (the leftmost among equal scores); a character that is no token
// becomes its bytes' "<0xXX>" tokens (byte fallback), or the unknown token.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "text/vocab.h"

namespace moe::text {

// Appends the tokens of `text`, whose spaces are already written as U+2581.
void spm_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

}  // namespace moe::text
