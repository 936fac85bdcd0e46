#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace moe::text {

namespace {

// Printable Latin-1 bytes keep their code point; the other 68 bytes take U+0100, U+0101, ... in order.
bool printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

const std::array<uint32_t, 256>& table() {
    static const std::array<uint32_t, 256> t = [] {
        std::array<uint32_t, 256> a{};
        uint32_t next = 0x100;
        for (int b = 0; b < 256; ++b) a[static_cast<size_t>(b)] = printable(b) ? static_cast<uint32_t>(b) : next++;
        return a;
    }();
    return t;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) { return table()[b]; }

int byte_of_char(uint32_t cp) {
    // The alphabet is U+0021..U+0143; the inverse is a table over that span.
    static const std::array<int16_t, 0x144> inverse = [] {
        std::array<int16_t, 0x144> a;
        a.fill(-1);
        for (int b = 0; b < 256; ++b) a[table()[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
        return a;
    }();
    return cp < inverse.size() ? inverse[cp] : -1;
}

void byte_level_encode(std::string_view bytes, std::string& out) {
    for (char ch : bytes) utf8_append(out, byte_to_char(static_cast<uint8_t>(ch)));
}

void byte_level_decode(std::string_view text, std::string& out) {
    for (size_t pos = 0; pos < text.size();) {
        const Utf8Char u = utf8_decode(text, pos);
        const int b = u.valid ? byte_of_char(u.cp) : -1;
        if (b >= 0) {
            out += static_cast<char>(b);
        } else {
            out.append(text.substr(pos, u.len));
        }
        pos += u.len;
    }
}

}  // namespace moe::text
