#include "text/detokenize.h"

#include <string_view>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace moe::text {

namespace {

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The byte of a "<0xXX>" token, or -1.
int byte_token_value(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void append_unescaped_spm(std::string_view t, std::string& out) {
    static constexpr std::string_view kSpace = "\xE2\x96\x81";
    for (size_t pos = 0; pos < t.size();) {
        if (t.substr(pos, 3) == kSpace) {
            out += ' ';
            pos += 3;
        } else {
            out += t[pos++];
        }
    }
}

}  // namespace

void token_to_piece(const Vocab& v, int32_t id, bool render_special, std::string& out) {
    const std::string& t = v.text(id);
    switch (v.type(id)) {
        case TokenType::NORMAL:
            if (v.kind() == VocabKind::BPE) {
                byte_level_decode(t, out);
            } else {
                append_unescaped_spm(t, out);
            }
            return;
        case TokenType::BYTE: {
            const int b = byte_token_value(t);
            if (b >= 0) {
                out += static_cast<char>(b);
            } else {
                out += t;  // a byte token not written "<0xXX>": its text is the best guess
            }
            return;
        }
        case TokenType::USER_DEFINED:
            out += t;
            return;
        case TokenType::CONTROL:
        case TokenType::UNKNOWN:
        case TokenType::UNUSED:
        case TokenType::UNDEFINED:
            if (render_special) out += t;
            return;
    }
}

void Detokenizer::feed(const int32_t* ids, size_t n, std::string& out) {
    for (size_t i = 0; i < n; ++i) {
        const size_t before = carry_.size();
        token_to_piece(*v_, ids[i], render_special_, carry_);
        if (at_start_ && carry_.size() > before) {
            if (v_->kind() == VocabKind::SPM && v_->add_space_prefix() && v_->type(ids[i]) == TokenType::NORMAL &&
                carry_[before] == ' ') {
                carry_.erase(before, 1);
            }
            at_start_ = false;
        }
    }
    const size_t whole = utf8_complete_prefix(carry_);
    out.append(carry_, 0, whole);
    carry_.erase(0, whole);
}

void Detokenizer::flush(std::string& out) {
    out += carry_;
    carry_.clear();
    at_start_ = true;
}

}  // namespace moe::text
