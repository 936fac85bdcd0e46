// Pre-tokenizers: split text into the words that byte-level BPE encodes one at a time, as the
// regular expressions of each model family do (tokenizer.ggml.pre). Hand-written matchers of the
// exact patterns, no regex engine (pretokenize_matchers.cpp); leftmost-first alternation and
// backtracking are reproduced where they matter.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moe::text {

enum class PreTokenizer {
    DEFAULT,       // "default": llama.cpp's fallback for BPE vocabularies
    LLAMA3,        // "llama3" (aliases "llama-v3", "llama-bpe"); also GLM-4 ("glm4", "chatglm-bpe")
    QWEN2,         // "qwen2" (Qwen2/2.5/3): the llama3 pattern with single digits
    GPT4O,         // "gpt-4o" (GPT-OSS, o200k): case-aware words, contractions attached
    DEEPSEEK_V3,   // "deepseek-v3"
    DEEPSEEK_LLM,  // "deepseek-llm"
};

// The pre-tokenizer named by tokenizer.ggml.pre. UNIMPLEMENTED for other names; the message lists
// the supported ones.
StatusOr<PreTokenizer> pre_tokenizer_from_name(std::string_view name);

// "default, llama3, llama-v3, ..." for messages.
std::string supported_pre_tokenizer_names();

// Appends the words of `text` to `words`, in order; their concatenation is `text`. Words are views
// into `text`. Invalid UTF-8 bytes are characters of their own, classified as U+FFFD (a symbol).
void pre_tokenize(PreTokenizer pre, std::string_view text, std::vector<std::string_view>& words);

}  // namespace moe::text
