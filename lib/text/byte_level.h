// GPT-2's byte-level alphabet: byte-level BPE vocabularies (tokenizer.ggml.model "gpt2") store
// every byte as a printable character (0x21 '!' stays '!', 0x20 ' ' becomes U+0120 'Ġ', ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moe::text {

// The character byte `b` is written as.
uint32_t byte_to_char(uint8_t b);

// The byte the character `cp` stands for, or -1 when `cp` is not in the alphabet.
int byte_of_char(uint32_t cp);

// Appends `bytes` written in the alphabet.
void byte_level_encode(std::string_view bytes, std::string& out);

// Appends the bytes `text` (written in the alphabet) stands for. A character outside the alphabet
// is copied as it is (its UTF-8 bytes).
void byte_level_decode(std::string_view text, std::string& out);

}  // namespace moe::text
