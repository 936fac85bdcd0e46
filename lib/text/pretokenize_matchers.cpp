// Each matcher reproduces one regular expression of a model family's pre-tokenizer, as Oniguruma
// (Hugging Face tokenizers) runs it: alternatives tried left to right, greedy quantifiers that give
// back characters when what follows fails. The pattern is quoted above each matcher.
#include "text/pretokenize_matchers.h"

namespace moe::text {

namespace {

bool is_L(const CharInfo& x) { return gc_is_letter(x.gc); }
bool is_N(const CharInfo& x) { return gc_is_number(x.gc); }
bool is_M(const CharInfo& x) { return gc_is_mark(x.gc); }
bool is_P(const CharInfo& x) { return gc_is_punct(x.gc); }
bool is_S(const CharInfo& x) { return gc_is_symbol(x.gc); }
bool is_crlf(const CharInfo& x) { return x.cp == '\r' || x.cp == '\n'; }
bool is_ws(const CharInfo& x) { return x.ws; }
// [^\s\p{L}\p{N}]
bool is_other(const CharInfo& x) { return !x.ws && !is_L(x) && !is_N(x); }
// [^\r\n\p{L}\p{N}]: the optional first character of a word
bool is_word_prefix(const CharInfo& x) { return !is_crlf(x) && !is_L(x) && !is_N(x); }
bool is_ascii_letter(const CharInfo& x) { return (x.cp | 0x20) >= 'a' && (x.cp | 0x20) <= 'z'; }
bool in_range(uint32_t cp, uint32_t lo, uint32_t hi) { return cp >= lo && cp <= hi; }

// End of the run of `pred` characters starting at i.
template <typename Pred>
size_t run(const CharInfo* c, size_t n, size_t i, Pred pred) {
    while (i < n && pred(c[i])) ++i;
    return i;
}

// ` ?X+`: an optional U+0020, then a run of X.
template <typename Pred>
size_t space_then_run(const CharInfo* c, size_t n, size_t i, Pred pred) {
    if (c[i].cp == ' ' && i + 1 < n && pred(c[i + 1])) return run(c, n, i + 1, pred);
    return pred(c[i]) ? run(c, n, i, pred) : 0;
}

// `\s?X+`: an optional white-space character, then a run of X.
template <typename Pred>
size_t ws_then_run(const CharInfo* c, size_t n, size_t i, Pred pred) {
    if (c[i].ws && i + 1 < n && pred(c[i + 1])) return run(c, n, i + 1, pred);
    return pred(c[i]) ? run(c, n, i, pred) : 0;
}

// Simple case folding as (?i:...) applies it to the contraction letters: ASCII, and U+017F LATIN
// SMALL LETTER LONG S, which folds to 's'. No other character folds to one of "strevmld".
uint32_t fold(uint32_t cp) {
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    return cp == 0x17F ? 's' : cp;
}

// `'s|'t|'re|'ve|'m|'ll|'d`, case-insensitively when `ci` ((?i:...)).
size_t contraction(const CharInfo* c, size_t n, size_t i, bool ci) {
    if (i >= n || c[i].cp != '\'') return 0;
    static const char* const kAlts[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (const char* alt : kAlts) {
        size_t k = i + 1;
        for (const char* a = alt; *a != '\0'; ++a, ++k) {
            if (k >= n || (ci ? fold(c[k].cp) : c[k].cp) != static_cast<uint32_t>(*a)) {
                k = 0;
                break;
            }
        }
        if (k != 0) return k;
    }
    return 0;
}

// `\s*[\r\n]+|\s+(?!\S)|\s+` at a white-space character. \s* takes the whole run and gives back up
// to the run's last CR/LF; \s+(?!\S) gives back the run's last character when a non-space follows.
size_t space_tail(const CharInfo* c, size_t n, size_t i) {
    const size_t r = run(c, n, i, is_ws);
    for (size_t k = r; k > i; --k) {
        if (is_crlf(c[k - 1])) return k;
    }
    if (r == n || r - i == 1) return r;  // (?!\S) holds at the end; a single space falls to \s+
    return r - 1;
}

// `[^\r\n\p{L}\p{N}]?\p{L}+`
size_t prefixed_letters(const CharInfo* c, size_t n, size_t i) {
    if (is_word_prefix(c[i]) && i + 1 < n && is_L(c[i + 1])) return run(c, n, i + 1, is_L);
    return is_L(c[i]) ? run(c, n, i, is_L) : 0;
}

// ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with `/` in the tail for gpt-4o: `[\r\n/]*`)
size_t punct_run(const CharInfo* c, size_t n, size_t i, bool slash) {
    const size_t e = space_then_run(c, n, i, is_other);
    if (e == 0) return 0;
    return run(c, n, e, [slash](const CharInfo& x) { return is_crlf(x) || (slash && x.cp == '/'); });
}

size_t digits(const CharInfo* c, size_t n, size_t i, size_t max) {
    size_t e = i;
    while (e < n && e - i < max && is_N(c[e])) ++e;
    return e > i ? e : 0;
}

// The llama3 pattern with \p{N}{1,max_digits}:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t llama3_like(const CharInfo* c, size_t n, size_t i, size_t max_digits) {
    if (size_t e = contraction(c, n, i, true)) return e;
    if (size_t e = prefixed_letters(c, n, i)) return e;
    if (size_t e = digits(c, n, i, max_digits)) return e;
    if (size_t e = punct_run(c, n, i, false)) return e;
    return c[i].ws ? space_tail(c, n, i) : 0;
}

// gpt-4o's two word alternatives, with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}]:
//   lower_tail: [^\r\n\p{L}\p{N}]?U*W+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   otherwise:  [^\r\n\p{L}\p{N}]?U+W*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
// Lm, Lo and marks are in both classes, so U* may have to give characters back to W+.
bool is_upperish(const CharInfo& x) {
    return x.gc == Gc::Lu || x.gc == Gc::Lt || x.gc == Gc::Lm || x.gc == Gc::Lo || is_M(x);
}
bool is_lowerish(const CharInfo& x) { return x.gc == Gc::Ll || x.gc == Gc::Lm || x.gc == Gc::Lo || is_M(x); }

size_t gpt4o_word(const CharInfo* c, size_t n, size_t i, bool lower_tail) {
    // A prefix character is tried first; without it the same start may still match.
    for (int with_prefix = is_word_prefix(c[i]) ? 1 : 0; with_prefix >= 0; --with_prefix) {
        const size_t s = i + static_cast<size_t>(with_prefix);
        const size_t u = run(c, n, s, is_upperish);
        size_t e = 0;
        if (lower_tail) {
            for (size_t k = u + 1; k-- > s;) {  // U* gives back one character at a time
                if (k < n && is_lowerish(c[k])) {
                    e = run(c, n, k, is_lowerish);
                    break;
                }
            }
        } else if (u > s) {
            e = run(c, n, u, is_lowerish);
        }
        if (e != 0) {
            const size_t ce = contraction(c, n, e, true);
            return ce != 0 ? ce : e;
        }
    }
    return 0;
}

}  // namespace

size_t match_llama3(const CharInfo* c, size_t n, size_t i) { return llama3_like(c, n, i, 3); }

size_t match_qwen2(const CharInfo* c, size_t n, size_t i) { return llama3_like(c, n, i, 1); }

// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_gpt4o(const CharInfo* c, size_t n, size_t i) {
    if (size_t e = gpt4o_word(c, n, i, true)) return e;
    if (size_t e = gpt4o_word(c, n, i, false)) return e;
    if (size_t e = digits(c, n, i, 3)) return e;
    if (size_t e = punct_run(c, n, i, true)) return e;
    return c[i].ws ? space_tail(c, n, i) : 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
size_t match_gpt2(const CharInfo* c, size_t n, size_t i) {
    if (size_t e = contraction(c, n, i, false)) return e;
    if (size_t e = space_then_run(c, n, i, is_L)) return e;
    if (size_t e = space_then_run(c, n, i, is_N)) return e;
    if (size_t e = space_then_run(c, n, i, is_other)) return e;
    if (!c[i].ws) return 0;
    const size_t r = run(c, n, i, is_ws);
    if (r == n) return r;
    return r - i >= 2 ? r - 1 : 0;
}

// [\p{P}\$\+<=>\^~\|]+
size_t match_default_punct(const CharInfo* c, size_t n, size_t i) {
    const size_t e = run(c, n, i, [](const CharInfo& x) {
        switch (x.cp) {
            case '$': case '+': case '<': case '=': case '>': case '^': case '~': case '|':
                return true;
            default:
                return is_P(x);
        }
    });
    return e > i ? e : 0;
}

// \p{N}+
size_t match_numbers(const CharInfo* c, size_t n, size_t i) {
    const size_t e = run(c, n, i, is_N);
    return e > i ? e : 0;
}

// [0-9][0-9][0-9]
size_t match_three_ascii_digits(const CharInfo* c, size_t n, size_t i) {
    for (size_t k = i; k < i + 3; ++k) {
        if (k >= n || c[k].cp < '0' || c[k].cp > '9') return 0;
    }
    return i + 3;
}

// \p{N}{1,3}
size_t match_numbers_1_3(const CharInfo* c, size_t n, size_t i) { return digits(c, n, i, 3); }

// [一-龥\u3040-ゟ゠-ヿ]+
size_t match_deepseek_v3_cjk(const CharInfo* c, size_t n, size_t i) {
    const size_t e = run(c, n, i, [](const CharInfo& x) {
        return in_range(x.cp, 0x4E00, 0x9FA5) || in_range(x.cp, 0x3040, 0x309F) || in_range(x.cp, 0x30A0, 0x30FF);
    });
    return e > i ? e : 0;
}

// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
// ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek_v3_words(const CharInfo* c, size_t n, size_t i) {
    const uint32_t cp = c[i].cp;
    const bool ascii_punct = in_range(cp, 0x21, 0x2F) || in_range(cp, 0x3A, 0x40) || in_range(cp, 0x5B, 0x60) ||
                             in_range(cp, 0x7B, 0x7E);
    if (ascii_punct && i + 1 < n && is_ascii_letter(c[i + 1])) return run(c, n, i + 1, is_ascii_letter);
    const auto is_LM = [](const CharInfo& x) { return is_L(x) || is_M(x); };
    const bool prefix = !is_crlf(c[i]) && !is_L(c[i]) && !is_P(c[i]) && !is_S(c[i]);
    if (prefix && i + 1 < n && is_LM(c[i + 1])) return run(c, n, i + 1, is_LM);
    if (is_LM(c[i])) return run(c, n, i, is_LM);
    const auto is_PS = [](const CharInfo& x) { return is_P(x) || is_S(x); };
    if (size_t e = space_then_run(c, n, i, is_PS)) return run(c, n, e, is_crlf);
    return c[i].ws ? space_tail(c, n, i) : 0;
}

// [\r\n]
size_t match_newline_char(const CharInfo* c, size_t /*n*/, size_t i) { return is_crlf(c[i]) ? i + 1 : 0; }

// \s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+
// The class as code points (several of its characters, e.g. U+2126 OHM SIGN and U+212A KELVIN
// SIGN, have canonical equivalents that text tools silently substitute).
size_t match_deepseek_llm_letters(const CharInfo* c, size_t n, size_t i) {
    static constexpr uint32_t kRanges[][2] = {
        {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
        {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D},
        {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5},
        {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
        {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
        {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
        {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4},
        {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
        {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124},
        {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
        {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
        {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E},
        {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
        {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
        {0x1E900, 0x1E943},
    };
    return ws_then_run(c, n, i, [](const CharInfo& x) {
        for (const auto& r : kRanges) {
            if (x.cp < r[0]) return false;  // sorted
            if (x.cp <= r[1]) return true;
        }
        return false;
    });
}

// \s?[!-/:-~！-／：-～‘-‟　-。]+
size_t match_deepseek_llm_punct(const CharInfo* c, size_t n, size_t i) {
    return ws_then_run(c, n, i, [](const CharInfo& x) {
        return in_range(x.cp, 0x21, 0x2F) || in_range(x.cp, 0x3A, 0x7E) || in_range(x.cp, 0xFF01, 0xFF0F) ||
               in_range(x.cp, 0xFF1A, 0xFF5E) || in_range(x.cp, 0x2018, 0x201F) || in_range(x.cp, 0x3000, 0x3002);
    });
}

// \s+$ (pieces here hold no '\n' but a lone one, so "end of line" and "end of piece" agree)
size_t match_trailing_space(const CharInfo* c, size_t n, size_t i) {
    if (!c[i].ws) return 0;
    return run(c, n, i, is_ws) == n ? n : 0;
}

// [一-龥ࠀ-一가-퟿]+
size_t match_deepseek_llm_cjk(const CharInfo* c, size_t n, size_t i) {
    const size_t e = run(c, n, i, [](const CharInfo& x) {
        return in_range(x.cp, 0x4E00, 0x9FA5) || in_range(x.cp, 0x0800, 0x4E00) || in_range(x.cp, 0xAC00, 0xD7FF);
    });
    return e > i ? e : 0;
}

}  // namespace moe::text
