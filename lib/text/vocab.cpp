#include "text/vocab.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace moe::text {

namespace {

const char kTokens[] = "tokenizer.ggml.tokens";

// Token texts that end a turn in the chat formats of the model families we run (llama.cpp keeps
// the same list, as converters rarely record these ids).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

std::string key_name(std::string_view key) { return std::string(key); }

// The array at `key` with elements of a type `ok` accepts, or nullptr when absent.
template <typename Ok>
StatusOr<const GgufValue*> find_array(const GgufFile& f, std::string_view key, size_t want_count, const char* what,
                                      Ok ok) {
    const GgufValue* v = f.find(key);
    if (v == nullptr) return static_cast<const GgufValue*>(nullptr);
    if (v->type != GgufValueType::ARRAY || !ok(v->array_type)) {
        const std::string found = v->type == GgufValueType::ARRAY
                                      ? std::string("an array of ") + gguf_value_type_name(v->array_type)
                                      : std::string("a ") + gguf_value_type_name(v->type);
        return data_corrupt(key_name(key) + ": expected an array of " + what + ", found " + found);
    }
    if (want_count != 0 && v->array.size() != want_count) {
        return data_corrupt(key_name(key) + ": " + std::to_string(v->array.size()) + " elements, but " + kTokens +
                            " has " + std::to_string(want_count));
    }
    return v;
}

bool is_int_type(GgufValueType t) {
    return t != GgufValueType::STRING && t != GgufValueType::ARRAY && t != GgufValueType::FLOAT32 &&
           t != GgufValueType::FLOAT64;
}

// An optional bool/integer flag.
StatusOr<bool> get_flag(const GgufFile& f, std::string_view key, bool dflt) {
    if (f.find(key) == nullptr) return dflt;
    MOE_ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
    return v != 0;
}

}  // namespace

StatusOr<std::unique_ptr<Vocab>> Vocab::from_gguf(const GgufFile& file) {
    const GgufValue* model = file.find("tokenizer.ggml.model");
    if (model == nullptr) return std::unique_ptr<Vocab>();
    MOE_ASSIGN_OR_RETURN(std::string name, file.get_string("tokenizer.ggml.model"));
    if (name == "none" || name == "no_vocab") return std::unique_ptr<Vocab>();
    std::unique_ptr<Vocab> v(new Vocab());
    if (name == "gpt2") {
        v->kind_ = VocabKind::BPE;
    } else if (name == "llama") {
        v->kind_ = VocabKind::SPM;
    } else {
        return unimplemented("tokenizer.ggml.model '" + name + "' is not supported (supported: gpt2, llama)");
    }
    v->model_name_ = name;
    MOE_RETURN_IF_ERROR(v->load(file));
    return v;
}

Status Vocab::load(const GgufFile& file) {
    if (kind_ == VocabKind::BPE) {
        pre_name_ = "default";  // what llama.cpp assumes for a file without tokenizer.ggml.pre
        if (file.find("tokenizer.ggml.pre") != nullptr) {
            MOE_ASSIGN_OR_RETURN(pre_name_, file.get_string("tokenizer.ggml.pre"));
        }
        MOE_ASSIGN_OR_RETURN(pre_, pre_tokenizer_from_name(pre_name_));
        // Defaults as llama.cpp applies them; the file's keys override them (load_special).
        ignore_merges_ = pre_ == PreTokenizer::LLAMA3 && pre_name_ != "glm4" && pre_name_ != "chatglm-bpe";
        add_bos_ = ignore_merges_;
        add_space_prefix_ = false;
    } else {
        bos_ = 1;
        eos_ = 2;
        unk_ = 0;
        add_bos_ = true;
        add_space_prefix_ = true;
    }
    MOE_RETURN_IF_ERROR(load_tokens(file));
    if (kind_ == VocabKind::BPE) MOE_RETURN_IF_ERROR(load_merges(file));
    return load_special(file);
}

Status Vocab::load_tokens(const GgufFile& file) {
    MOE_ASSIGN_OR_RETURN(const GgufValue* tokens, find_array(file, kTokens, 0, "string", [](GgufValueType t) {
                             return t == GgufValueType::STRING;
                         }));
    if (tokens == nullptr) return data_corrupt(std::string(kTokens) + " not found (tokenizer.ggml.model is " + model_name_ + ")");
    const size_t n = tokens->array.size();
    if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
        return data_corrupt(std::string(kTokens) + ": " + std::to_string(n) + " tokens");
    }
    MOE_ASSIGN_OR_RETURN(const GgufValue* scores, find_array(file, "tokenizer.ggml.scores", n, "float", [](GgufValueType t) {
                             return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
                         }));
    MOE_ASSIGN_OR_RETURN(const GgufValue* types, find_array(file, "tokenizer.ggml.token_type", n, "integer", is_int_type));

    texts_.resize(n);
    types_.assign(n, TokenType::NORMAL);
    if (scores != nullptr) scores_.resize(n);
    ids_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        texts_[i] = tokens->array[i].s;
        if (scores != nullptr) scores_[i] = static_cast<float>(scores->array[i].f);
        if (types != nullptr) {
            const int64_t t = types->array[i].i;
            if (t < 0 || t > static_cast<int64_t>(TokenType::BYTE)) {
                return data_corrupt("tokenizer.ggml.token_type[" + std::to_string(i) + "] is " + std::to_string(t) +
                                    " (valid: 0..6)");
            }
            types_[i] = static_cast<TokenType>(t);
        }
        if (!texts_[i].empty()) ids_.emplace(texts_[i], static_cast<int32_t>(i));  // the first keeps a shared text
    }

    for (int b = 0; b < 256; ++b) {
        std::string text;
        if (kind_ == VocabKind::BPE) {
            utf8_append(text, byte_to_char(static_cast<uint8_t>(b)));
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "<0x%02X>", b);
            text = buf;
        }
        byte_tokens_[b] = find(text);
    }

    for (size_t i = 0; i < n; ++i) {
        const TokenType t = types_[i];
        if ((t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN) && !texts_[i].empty()) {
            special_.push_back(static_cast<int32_t>(i));
        }
    }
    std::stable_sort(special_.begin(), special_.end(),
                     [this](int32_t a, int32_t b) { return text(a).size() > text(b).size(); });
    return Status::ok();
}

Status Vocab::load_merges(const GgufFile& file) {
    const char* key = "tokenizer.ggml.merges";
    MOE_ASSIGN_OR_RETURN(const GgufValue* merges, find_array(file, key, 0, "string", [](GgufValueType t) {
                             return t == GgufValueType::STRING;
                         }));
    if (merges == nullptr) return data_corrupt(std::string(key) + " not found (a gpt2 tokenizer needs its merges)");
    merges_.reserve(merges->array.size());
    std::string joined;
    for (size_t r = 0; r < merges->array.size(); ++r) {
        const std::string& m = merges->array[r].s;
        const size_t sp = m.find(' ', 1);  // a token may start with a space; the separator follows it
        if (sp == std::string::npos) {
            return data_corrupt(std::string(key) + "[" + std::to_string(r) + "] '" + m +
                                "' is not two tokens separated by a space");
        }
        const std::string_view left = std::string_view(m).substr(0, sp);
        const std::string_view right = std::string_view(m).substr(sp + 1);
        joined.assign(left);
        joined.append(right);
        const int32_t l = find(left), rt = find(right), res = find(joined);
        // A merge whose parts or result are not tokens could never produce a token; skip it.
        if (l == kNoToken || rt == kNoToken || res == kNoToken) continue;
        const uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(rt);
        merges_.emplace(k, Merge{static_cast<int32_t>(r), res});  // the first (lowest) rank wins
    }
    return Status::ok();
}

Status Vocab::load_special(const GgufFile& file) {
    if (pre_name_ == "glm4" || pre_name_ == "chatglm-bpe") bos_ = kNoToken;  // GLM has no BOS unless the file names one
    struct IdKey {
        const char* key;
        int32_t* id;
    };
    const IdKey keys[] = {
        {"tokenizer.ggml.bos_token_id", &bos_},     {"tokenizer.ggml.eos_token_id", &eos_},
        {"tokenizer.ggml.eot_token_id", &eot_},     {"tokenizer.ggml.eom_token_id", &eom_},
        {"tokenizer.ggml.unknown_token_id", &unk_}, {"tokenizer.ggml.padding_token_id", &pad_},
    };
    for (const IdKey& k : keys) {
        if (file.find(k.key) == nullptr) continue;
        MOE_ASSIGN_OR_RETURN(int64_t id, file.get_int(k.key));
        if (id < 0 || id >= n_tokens()) {
            return data_corrupt(std::string(k.key) + " is " + std::to_string(id) + ", outside the vocabulary [0, " +
                                std::to_string(n_tokens()) + ")");
        }
        *k.id = static_cast<int32_t>(id);
    }
    MOE_ASSIGN_OR_RETURN(add_bos_, get_flag(file, "tokenizer.ggml.add_bos_token", add_bos_));
    MOE_ASSIGN_OR_RETURN(add_eos_, get_flag(file, "tokenizer.ggml.add_eos_token", add_eos_));
    MOE_ASSIGN_OR_RETURN(add_space_prefix_, get_flag(file, "tokenizer.ggml.add_space_prefix", add_space_prefix_));
    if (add_bos_ && bos_ == kNoToken) {
        return data_corrupt("tokenizer.ggml.add_bos_token is true but the model has no BOS token");
    }
    if (add_eos_ && eos_ == kNoToken) {
        return data_corrupt("tokenizer.ggml.add_eos_token is true but the model has no EOS token");
    }

    for (int32_t id : {eos_, eot_, eom_}) {
        if (id != kNoToken) eog_.push_back(id);
    }
    for (const char* t : kEogTexts) {
        const int32_t id = find(t);
        if (id != kNoToken) eog_.push_back(id);
    }
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
    return load_rstrip(file);
}

// Phi-3's tokenizer.json marks its added tokens (the chat markers, "</s>") rstrip, all but "<unk>",
// "<s>" and "<|endoftext|>". GGUF keeps no such flag; llama.cpp recognises these models by
// general.name as we do here (and the test against it holds us to the same tokens).
Status Vocab::load_rstrip(const GgufFile& file) {
    if (file.find("general.name") == nullptr) return Status::ok();
    MOE_ASSIGN_OR_RETURN(std::string name, file.get_string("general.name"));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return Status::ok();
    rstrip_.assign(texts_.size(), false);
    for (int32_t id : special_) rstrip_[static_cast<size_t>(id)] = true;
    if (const int32_t id = find("</s>"); id != kNoToken) rstrip_[static_cast<size_t>(id)] = true;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) {
        if (const int32_t id = find(t); id != kNoToken) rstrip_[static_cast<size_t>(id)] = false;
    }
    return Status::ok();
}

int32_t Vocab::find(std::string_view text) const {
    const auto it = ids_.find(text);
    return it == ids_.end() ? kNoToken : it->second;
}

bool Vocab::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

const Vocab::Merge* Vocab::find_merge(int32_t left, int32_t right) const {
    const uint64_t k = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    const auto it = merges_.find(k);
    return it == merges_.end() ? nullptr : &it->second;
}

}  // namespace moe::text
