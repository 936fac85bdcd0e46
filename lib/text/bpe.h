// Byte-level BPE (tokenizer.ggml.model "gpt2"): pre-tokenize, then merge each word's bytes by
// merge rank, lowest first, the leftmost pair among equal ranks (as Hugging Face tokenizers and
// llama.cpp do).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "text/vocab.h"

namespace moe::text {

// Appends the tokens of `text` (no special-token handling here). REQUIRES: v.kind() == BPE.
void bpe_tokenize(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

// Appends the tokens of one word (raw bytes).
void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out);

}  // namespace moe::text
