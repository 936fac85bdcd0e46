// A model's vocabulary, read from its GGUF metadata (tokenizer.ggml.*): token texts, types and
// scores, BPE merges, the pre-tokenizer, special token ids and the add-BOS/EOS flags.
//
// Immutable after from_gguf(); any number of threads may tokenize with it at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/gguf.h"
#include "core/status.h"
#include "text/pretokenize.h"

namespace moe::text {

// Token types as GGUF stores them (tokenizer.ggml.token_type; llama.cpp's llama_token_type).
enum class TokenType : int32_t {
    UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

enum class VocabKind {
    BPE,  // "gpt2": byte-level BPE with merge ranks and a pre-tokenizer
    SPM,  // "llama": SentencePiece-style BPE by token score, with byte fallback
};

inline constexpr int32_t kNoToken = -1;

// Hash that lets unordered_map<std::string, ...> be searched with a string_view.
struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Vocab {
public:
    // Reads the vocabulary; nullptr (and OK) when the file has none (no tokenizer.ggml.model, or
    // "none" / "no_vocab"). Errors: UNIMPLEMENTED for an unsupported tokenizer.ggml.model or
    // tokenizer.ggml.pre (the message lists the supported ones), DATA_CORRUPT for malformed
    // metadata (the message names the key and element).
    static StatusOr<std::unique_ptr<Vocab>> from_gguf(const GgufFile& file);

    VocabKind kind() const { return kind_; }
    const std::string& model_name() const { return model_name_; }  // "gpt2", "llama"
    const std::string& pre_name() const { return pre_name_; }      // "" for SPM
    PreTokenizer pre() const { return pre_; }

    int32_t n_tokens() const { return static_cast<int32_t>(texts_.size()); }
    bool valid(int32_t id) const { return id >= 0 && id < n_tokens(); }
    // REQUIRES: valid(id) for the three below.
    const std::string& text(int32_t id) const { return texts_[static_cast<size_t>(id)]; }
    TokenType type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
    float score(int32_t id) const { return scores_.empty() ? 0.0f : scores_[static_cast<size_t>(id)]; }
    // The id of the token whose text is `text` (the first one, should several share it), or kNoToken.
    int32_t find(std::string_view text) const;

    // Special ids, kNoToken when the model has none.
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t eot() const { return eot_; }
    int32_t eom() const { return eom_; }
    int32_t unk() const { return unk_; }
    int32_t pad() const { return pad_; }
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    // BPE: a word that is itself a token is emitted whole, without applying merges (llama3).
    bool ignore_merges() const { return ignore_merges_; }
    // End of generation: EOS, EOT, EOM and the tokens whose text ends a turn ("<|im_end|>", ...).
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const { return eog_; }

    // The token of byte `b`: for BPE the byte's character in the byte-level alphabet, for SPM the
    // "<0xXX>" byte token. kNoToken when the vocabulary lacks it.
    int32_t byte_token(uint8_t b) const { return byte_tokens_[b]; }

    // BPE merge of the adjacent tokens (left, right): its rank (lower merges first) and the token it
    // makes. nullptr when there is none.
    struct Merge {
        int32_t rank;
        int32_t result;
    };
    const Merge* find_merge(int32_t left, int32_t right) const;

    // Control, user-defined and unknown tokens with non-empty text, longest text first: the tokens
    // that tokenize() looks for in the text before splitting it into words.
    const std::vector<int32_t>& special_tokens() const { return special_; }
    // Whether white space after the special token `id`, where tokenize() finds it, is dropped (Hugging
    // Face's `rstrip` on an added token; GGUF does not record it, see load_rstrip).
    bool rstrip(int32_t id) const { return !rstrip_.empty() && rstrip_[static_cast<size_t>(id)]; }

private:
    Vocab() = default;
    Status load(const GgufFile& file);
    Status load_tokens(const GgufFile& file);
    Status load_merges(const GgufFile& file);
    Status load_special(const GgufFile& file);
    Status load_rstrip(const GgufFile& file);

    VocabKind kind_ = VocabKind::BPE;
    std::string model_name_;
    std::string pre_name_;
    PreTokenizer pre_ = PreTokenizer::DEFAULT;
    std::vector<std::string> texts_;
    std::vector<TokenType> types_;
    std::vector<float> scores_;
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
    std::unordered_map<uint64_t, Merge> merges_;
    int32_t byte_tokens_[256] = {};
    std::vector<int32_t> special_;
    std::vector<int32_t> eog_;
    std::vector<bool> rstrip_;  // by id; empty when no token strips
    int32_t bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken, unk_ = kNoToken, pad_ = kNoToken;
    bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false, ignore_merges_ = false;
};

}  // namespace moe::text
