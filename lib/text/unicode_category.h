// Unicode general categories and the character classes the pre-tokenizers' patterns use
// (\p{L}, \p{Lu}, \p{N}, \p{M}, \p{P}, \p{S}, \s). The table is generated (unicode_tables.cpp).
#pragma once

#include <cstdint>

namespace moe::text {

// General category, in the generator's order (scripts/gen_unicode_tables.py). Cn = unassigned.
enum class Gc : uint8_t {
    Cn, Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps,
    Pe, Pi, Pf, Po, Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co,
};

struct GcRun {
    uint32_t first;  // the run covers [first, next run's first)
    Gc gc;
};

extern const char kUnicodeVersion[];  // of the generated table, e.g. "14.0.0"
extern const GcRun kGcRuns[];
extern const int kGcRunCount;

// Category of `cp`; Cn for values past U+10FFFF.
Gc general_category(uint32_t cp);

inline bool gc_is_letter(Gc g) { return g >= Gc::Lu && g <= Gc::Lo; }
inline bool gc_is_mark(Gc g) { return g >= Gc::Mn && g <= Gc::Me; }
inline bool gc_is_number(Gc g) { return g >= Gc::Nd && g <= Gc::No; }
inline bool gc_is_punct(Gc g) { return g >= Gc::Pc && g <= Gc::Po; }
inline bool gc_is_symbol(Gc g) { return g >= Gc::Sm && g <= Gc::So; }

// \s of Oniguruma and of llama.cpp's regexes: the White_Space property (which is not Python's
// str.isspace: U+001C..U+001F are not white space here).
bool is_white_space(uint32_t cp);

}  // namespace moe::text
