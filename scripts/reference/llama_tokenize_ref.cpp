// llama.cpp's tokenizer on a test set, for the expected-ids files of tests/python/test_tokenizer_llama_cpp.py.
//
// Usage: llama_tokenize_ref VOCAB.gguf STRINGS.hex > OUT.json
//   STRINGS.hex: one test string per line, as the hex digits of its bytes (so NUL, CR and LF travel).
//   OUT.json: {"n_tokens": N, "results": [{"ids": [...], "ids_special": [...], "ids_add_special": [...],
//              "text": HEX, "text_special": HEX}, ...]}, one entry per line of STRINGS.hex:
//     ids              llama_tokenize(add_special = false, parse_special = false)
//     ids_special      llama_tokenize(add_special = false, parse_special = true)
//     ids_add_special  llama_tokenize(add_special = true,  parse_special = false)
//     text             llama_detokenize(ids,         remove_special = false, unparse_special = false)
//     text_special     llama_detokenize(ids_special, remove_special = false, unparse_special = true)
// Only llama.h's public API is used; the model is loaded with vocab_only.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::string from_hex(const std::string& hex) {
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
        if (hi < 0 || lo < 0) throw std::runtime_error("bad hex digit in '" + hex + "'");
        out += static_cast<char>(hi * 16 + lo);
    }
    return out;
}

std::string to_hex(const std::string& s) {
    static const char kDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out += kDigits[c >> 4];
        out += kDigits[c & 15];
    }
    return out;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool add_special,
                                  bool parse_special) {
    std::vector<llama_token> ids(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) throw std::runtime_error("llama_tokenize overflowed");
        ids.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), add_special, parse_special);
        if (n < 0) throw std::runtime_error("llama_tokenize failed twice");
    }
    ids.resize(static_cast<size_t>(n));
    return ids;
}

std::string detokenize(const llama_vocab* vocab, const std::vector<llama_token>& ids, bool unparse_special) {
    std::string text(ids.size() * 16 + 16, '\0');
    int32_t n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                                 static_cast<int32_t>(text.size()), false, unparse_special);
    if (n < 0) {
        text.resize(static_cast<size_t>(-n));
        n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()), text.data(),
                             static_cast<int32_t>(text.size()), false, unparse_special);
        if (n < 0) throw std::runtime_error("llama_detokenize failed twice");
    }
    text.resize(static_cast<size_t>(n));
    return text;
}

void write_ids(std::ostream& out, const std::vector<llama_token>& ids) {
    out << '[';
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << ']';
}

void quiet_log(ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s VOCAB.gguf STRINGS.hex > OUT.json\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        std::fprintf(stderr, "%s: llama.cpp could not load the vocabulary\n", argv[1]);
        return 1;
    }
    const llama_vocab* vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2]);
    if (!in) {
        std::fprintf(stderr, "%s: cannot open\n", argv[2]);
        return 1;
    }
    try {
        std::cout << "{\"n_tokens\": " << llama_vocab_n_tokens(vocab) << ", \"results\": [\n";
        std::string line;
        bool first = true;
        while (std::getline(in, line)) {
            const std::string text = from_hex(line);
            const auto ids = tokenize(vocab, text, false, false);
            const auto ids_special = tokenize(vocab, text, false, true);
            const auto ids_add = tokenize(vocab, text, true, false);
            std::cout << (first ? "" : ",\n") << "{\"ids\": ";
            write_ids(std::cout, ids);
            std::cout << ", \"ids_special\": ";
            write_ids(std::cout, ids_special);
            std::cout << ", \"ids_add_special\": ";
            write_ids(std::cout, ids_add);
            std::cout << ", \"text\": \"" << to_hex(detokenize(vocab, ids, false)) << "\", \"text_special\": \""
                      << to_hex(detokenize(vocab, ids_special, true)) << "\"}";
            first = false;
        }
        std::cout << "\n]}\n";
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", argv[1], e.what());
        llama_model_free(model);
        return 1;
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
