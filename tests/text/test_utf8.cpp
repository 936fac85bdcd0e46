// UTF-8 decoding against glibc's decoder (mbrtowc in the C.UTF-8 locale) for every scalar value and
// for fresh random byte strings; the streaming carry (utf8_complete_prefix); the byte-level alphabet.
// Tokenization itself is compared with reference tokenizers in tests/python/test_tokenizer.py.
#include <catch2/catch.hpp>

#include <clocale>
#include <cstdio>
#include <cstring>
#include <cwchar>
#include <locale.h>
#include <random>
#include <set>
#include <string>

#include "text/byte_level.h"
#include "text/unicode_category.h"
#include "text/utf8.h"

namespace {

// glibc's reading of the character at s[pos]: its code point and length, or length 0 when invalid.
struct Ref {
    uint32_t cp;
    size_t len;
};

Ref glibc_decode(const std::string& s, size_t pos) {
    std::mbstate_t st{};
    wchar_t wc = 0;
    const size_t r = std::mbrtowc(&wc, s.data() + pos, s.size() - pos, &st);
    if (r == static_cast<size_t>(-1) || r == static_cast<size_t>(-2)) return {0, 0};
    return {static_cast<uint32_t>(wc), r == 0 ? 1 : r};  // r == 0: a NUL byte
}

std::string hex_of(const std::string& s) {
    std::string out;
    char buf[4];
    for (unsigned char c : s) {
        std::snprintf(buf, sizeof buf, "%02X ", c);
        out += buf;
    }
    return out;
}

struct Utf8Locale {
    locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    locale_t old = loc != nullptr ? uselocale(loc) : nullptr;
    ~Utf8Locale() {
        if (loc != nullptr) {
            uselocale(old);
            freelocale(loc);
        }
    }
};

}  // namespace

TEST_CASE("utf8: every scalar value encodes and decodes as glibc does", "[text]") {
    Utf8Locale l;
    if (l.loc == nullptr) {
        WARN("skipped: no C.UTF-8 locale");
        return;
    }
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        std::string s;
        moe::text::utf8_append(s, cp);
        const Ref ref = glibc_decode(s, 0);
        const moe::text::Utf8Char u = moe::text::utf8_decode(s, 0);
        if (ref.len != s.size() || ref.cp != cp || !u.valid || u.cp != cp || u.len != s.size()) {
            FAIL("U+" << std::hex << cp);
        }
        // Every proper prefix is an unfinished character and is held back.
        for (size_t k = 1; k < s.size(); ++k) REQUIRE(moe::text::utf8_complete_prefix(s.substr(0, k)) == 0);
        REQUIRE(moe::text::utf8_complete_prefix(s) == s.size());
    }
}

TEST_CASE("utf8: random bytes decode as glibc does; invalid bytes are single characters", "[text]") {
    Utf8Locale l;
    if (l.loc == nullptr) {
        WARN("skipped: no C.UTF-8 locale");
        return;
    }
    std::mt19937 gen(std::random_device{}());
    for (int round = 0; round < 20000; ++round) {
        std::string s(1 + gen() % 8, '\0');
        for (char& c : s) c = static_cast<char>(gen() % 2 ? 0x80 + gen() % 0x80 : gen() % 256);
        for (size_t pos = 0; pos < s.size();) {
            const moe::text::Utf8Char u = moe::text::utf8_decode(s, pos);
            Ref ref = glibc_decode(s, pos);
            // glibc still reads surrogates and the old 5- and 6-byte forms past U+10FFFF; RFC 3629 does not.
            if (ref.len != 0 && ((ref.cp >= 0xD800 && ref.cp <= 0xDFFF) || ref.cp > 0x10FFFF)) ref.len = 0;
            INFO("round " << round << " pos " << pos << " bytes " << hex_of(s) << " ours " << u.valid << "/" << u.len << "/" << u.cp << " glibc " << ref.len << "/" << ref.cp);
            if (ref.len == 0) {
                REQUIRE((!u.valid && u.len == 1 && u.cp == moe::text::kReplacementChar));
            } else {
                REQUIRE((u.valid && u.len == ref.len && u.cp == ref.cp));
            }
            pos += u.len;
        }
    }
}

TEST_CASE("utf8: a sequence that can never be completed is not held back", "[text]") {
    using moe::text::utf8_complete_prefix;
    CHECK(utf8_complete_prefix("ab\xE2\x82") == 2);      // U+20AC's first two bytes: wait for the third
    CHECK(utf8_complete_prefix("ab\xE2\x41") == 4);      // broken already
    CHECK(utf8_complete_prefix("ab\xED\xA0") == 4);      // a surrogate's start never becomes valid
    CHECK(utf8_complete_prefix("ab\xF4\x90") == 4);      // past U+10FFFF
    CHECK(utf8_complete_prefix("ab\xC0") == 3);          // an overlong lead
    CHECK(utf8_complete_prefix("\xF0\x9F\x98") == 0);
    CHECK(utf8_complete_prefix("") == 0);
}

TEST_CASE("byte-level alphabet: 256 distinct characters, printable bytes unchanged, inverse exact", "[text]") {
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        const uint32_t c = moe::text::byte_to_char(static_cast<uint8_t>(b));
        seen.insert(c);
        REQUIRE(moe::text::byte_of_char(c) == b);
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        REQUIRE((printable ? c == static_cast<uint32_t>(b) : c >= 0x100));
    }
    REQUIRE(seen.size() == 256);
    CHECK(moe::text::byte_to_char(' ') == 0x120);  // 'Ġ', as every GPT-2 style vocabulary spells a space
    CHECK(moe::text::byte_to_char('\n') == 0x10A); // 'Ċ'
    std::string all, back;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    std::string enc;
    moe::text::byte_level_encode(all, enc);
    moe::text::byte_level_decode(enc, back);
    CHECK(back == all);
}

TEST_CASE("unicode tables: categories and white space", "[text]") {
    using moe::text::Gc;
    using moe::text::general_category;
    CHECK(general_category('A') == Gc::Lu);
    CHECK(general_category('z') == Gc::Ll);
    CHECK(general_category('7') == Gc::Nd);
    CHECK(general_category(0x301) == Gc::Mn);
    CHECK(general_category(0x4E00) == Gc::Lo);
    CHECK(general_category(0x1F600) == Gc::So);
    CHECK(general_category(0x10FFFF) == Gc::Cn);
    CHECK(general_category(0x110000) == Gc::Cn);
    CHECK(moe::text::is_white_space(0x85));
    CHECK(!moe::text::is_white_space(0x1C));  // Python's isspace says yes; Oniguruma's \s says no
    CHECK(!moe::text::is_white_space(0x200B));
}
