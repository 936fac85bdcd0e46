// Tokens to text: each token's piece (its bytes), and a streaming detokenizer that returns only
// whole UTF-8 characters and keeps an unfinished one for the next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "text/vocab.h"

namespace moe::text {

// Appends the bytes token `id` stands for: a normal token's text (byte-level vocabularies: the
// bytes its characters encode; SPM: U+2581 as a space), a byte token's byte, a user-defined token's
// text. Control, unknown, unused and undefined tokens give their text when render_special, else
// nothing. REQUIRES: v.valid(id).
void token_to_piece(const Vocab& v, int32_t id, bool render_special, std::string& out);

// Copyable state of one stream of tokens.
class Detokenizer {
public:
    Detokenizer(const Vocab& v, bool render_special) : v_(&v), render_special_(render_special) {}

    // Appends to `out` the text of `ids` (REQUIRES: all valid) up to the last whole character; an
    // unfinished UTF-8 sequence at the end is kept for the next call. SPM vocabularies that prefix a
    // space to the text (add_space_prefix) lose the first piece's leading space, as sentencepiece
    // decodes.
    void feed(const int32_t* ids, size_t n, std::string& out);

    // Appends the kept bytes (an unfinished character, as it is) and starts a new stream.
    void flush(std::string& out);

    size_t pending() const { return carry_.size(); }

private:
    const Vocab* v_;
    bool render_special_;
    bool at_start_ = true;
    std::string carry_;
};

}  // namespace moe::text
