// Python's str.strip() / lstrip(c) / rstrip(c) / split(sep) on UTF-8 (see pystr.h).
#include "text/chat/pystr.h"

#include <cstdint>

#include "text/utf8.h"

namespace moe::text::chat {
namespace {

// Py_UNICODE_ISSPACE: the characters str.isspace() accepts.
bool is_py_space(uint32_t cp) {
    if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    switch (cp) {
        case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

// Length of the whitespace character ending at s[end) (0 when the last character is not one).
size_t space_before(std::string_view s, size_t end) {
    // A UTF-8 character is at most 4 bytes: find where the last one starts.
    size_t start = end;
    for (size_t k = 1; k <= 4 && k <= end; ++k) {
        const auto b = static_cast<unsigned char>(s[end - k]);
        if ((b & 0xC0) != 0x80) {
            start = end - k;
            break;
        }
    }
    if (start == end) return 0;
    const Utf8Char c = utf8_decode(s, start);
    if (start + c.len != end) return 0;  // the last bytes do not form one whole character
    return c.valid && is_py_space(c.cp) ? c.len : 0;
}

}  // namespace

std::string_view py_strip(std::string_view s) {
    size_t b = 0;
    while (b < s.size()) {
        const Utf8Char c = utf8_decode(s, b);
        if (!c.valid || !is_py_space(c.cp)) break;
        b += c.len;
    }
    size_t e = s.size();
    while (e > b) {
        const size_t n = space_before(s, e);
        if (n == 0) break;
        e -= n;
    }
    return s.substr(b, e - b);
}

std::string_view py_lstrip_char(std::string_view s, char c) {
    size_t b = 0;
    while (b < s.size() && s[b] == c) ++b;
    return s.substr(b);
}

std::string_view py_rstrip_char(std::string_view s, char c) {
    size_t e = s.size();
    while (e > 0 && s[e - 1] == c) --e;
    return s.substr(0, e);
}

std::string_view py_split_first(std::string_view s, std::string_view sep) {
    const size_t p = s.find(sep);
    return p == std::string_view::npos ? s : s.substr(0, p);
}

std::string_view py_split_last(std::string_view s, std::string_view sep) {
    const size_t p = s.rfind(sep);
    return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

}  // namespace moe::text::chat
