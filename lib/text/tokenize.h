// Text to tokens: special tokens found in the text first, then the vocabulary's algorithm (byte-level
// BPE or SentencePiece-style) on the text between them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "text/vocab.h"

namespace moe::text {

struct TokenizeOptions {
    // Add BOS / EOS where the vocabulary asks for them (tokenizer.ggml.add_bos_token / add_eos_token).
    bool add_special = true;
    // Text equal to a control token ("<|im_start|>") becomes that token; otherwise it is ordinary
    // text. User-defined tokens are always matched, as in llama.cpp.
    bool parse_special = false;
};

// Appends the tokens of `text` (any bytes; invalid UTF-8 is documented in utf8.h) to `out`.
void tokenize(const Vocab& v, std::string_view text, const TokenizeOptions& opt, std::vector<int32_t>& out);

}  // namespace moe::text
