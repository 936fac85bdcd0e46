#include "text/utf8.h"

namespace moe::text {

namespace {

// Expected length of a sequence starting with `b` (0 for a byte that cannot start one), and the
// valid range of its second byte (RFC 3629 table 3-7: no overlongs, no surrogates, <= U+10FFFF).
struct Lead {
    uint32_t len;
    uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
    if (b < 0x80) return {1, 0, 0};
    if (b < 0xC2) return {0, 0, 0};
    if (b < 0xE0) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b < 0xF0) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b < 0xF4) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

Utf8Char utf8_decode(std::string_view s, size_t pos) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
    const size_t left = s.size() - pos;
    const Lead lead = lead_of(p[0]);
    if (lead.len == 1) return {p[0], 1, true};
    const Utf8Char bad{kReplacementChar, 1, false};
    if (lead.len == 0 || left < lead.len || p[1] < lead.lo || p[1] > lead.hi) return bad;
    for (uint32_t i = 2; i < lead.len; ++i) {
        if (!is_cont(p[i])) return bad;
    }
    uint32_t cp = p[0] & (0x7F >> lead.len);
    for (uint32_t i = 1; i < lead.len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
    return {cp, lead.len, true};
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last 3 bytes can belong to an unfinished sequence.
    const size_t n = s.size();
    const size_t from = n > 3 ? n - 3 : 0;
    for (size_t start = from; start < n; ++start) {
        const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + start;
        const Lead lead = lead_of(p[0]);
        if (lead.len <= 1 || start + lead.len <= n) continue;  // not a lead, or complete (valid or not)
        // A proper prefix of a sequence: held back only while every byte so far could still be valid.
        bool viable = true;
        for (size_t i = 1; start + i < n; ++i) {
            const uint8_t b = p[i];
            if (i == 1 ? (b < lead.lo || b > lead.hi) : !is_cont(b)) viable = false;
        }
        if (viable) return start;
    }
    return n;
}

}  // namespace moe::text
