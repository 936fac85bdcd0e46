#include "text/tokenize.h"

#include <algorithm>
#include <string>

#include "text/bpe.h"
#include "text/spm.h"

namespace moe::text {

namespace {

// A stretch of the text: raw bytes still to tokenize, or a special token already found.
struct Fragment {
    int32_t token;  // kNoToken for raw text
    std::string_view text;
};

// What C's isspace() accepts, as llama.cpp strips it after an rstrip token.
constexpr std::string_view kAsciiSpace = " \t\n\v\f\r";

// Splits raw fragments at every occurrence of each special token, longest token first (so
// "<|im_start|>" wins over a shorter token inside it), as llama.cpp does.
std::vector<Fragment> partition(const Vocab& v, std::string_view text, bool parse_special) {
    std::vector<Fragment> frags;
    if (!text.empty()) frags.push_back({kNoToken, text});
    std::vector<Fragment> next;
    for (int32_t id : v.special_tokens()) {
        const TokenType t = v.type(id);
        if (!parse_special && (t == TokenType::CONTROL || t == TokenType::UNKNOWN)) continue;
        const std::string_view s = v.text(id);
        next.clear();
        for (const Fragment& f : frags) {
            if (f.token != kNoToken) {
                next.push_back(f);
                continue;
            }
            std::string_view raw = f.text;
            for (size_t at = raw.find(s); at != std::string_view::npos; at = raw.find(s)) {
                if (at > 0) next.push_back({kNoToken, raw.substr(0, at)});
                next.push_back({id, s});
                raw = raw.substr(at + s.size());
                if (v.rstrip(id)) raw = raw.substr(std::min(raw.size(), raw.find_first_not_of(kAsciiSpace)));
            }
            if (!raw.empty()) next.push_back({kNoToken, raw});
        }
        frags.swap(next);
    }
    return frags;
}

void spm_fragment(const Vocab& v, std::string_view raw, bool space_prefix, std::vector<int32_t>& out) {
    static const char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space
    std::string escaped;
    escaped.reserve(raw.size() + 8);
    if (space_prefix) escaped += kSpace;
    for (char ch : raw) {
        if (ch == ' ') {
            escaped += kSpace;
        } else {
            escaped += ch;
        }
    }
    spm_tokenize(v, escaped, out);
}

}  // namespace

void tokenize(const Vocab& v, std::string_view text, const TokenizeOptions& opt, std::vector<int32_t>& out) {
    if (opt.add_special && v.add_bos()) out.push_back(v.bos());
    // SPM prefixes a space to the text at the start and after each special token (llama.cpp).
    bool after_special = true;
    for (const Fragment& f : partition(v, text, opt.parse_special)) {
        if (f.token != kNoToken) {
            out.push_back(f.token);
            after_special = true;
            continue;
        }
        if (v.kind() == VocabKind::BPE) {
            bpe_tokenize(v, f.text, out);
        } else {
            spm_fragment(v, f.text, v.add_space_prefix() && after_special, out);
        }
        after_special = false;
    }
    if (opt.add_special && v.add_eos()) out.push_back(v.eos());
}

}  // namespace moe::text
