#include "text/unicode_category.h"

#include <algorithm>

namespace moe::text {

Gc general_category(uint32_t cp) {
    // Most text is ASCII: a table built once from the runs answers it without a search.
    static const auto ascii = [] {
        struct Table { Gc gc[128]; } t{};
        int r = 0;
        for (uint32_t c = 0; c < 128; ++c) {
            while (r + 1 < kGcRunCount && kGcRuns[r + 1].first <= c) ++r;
            t.gc[c] = kGcRuns[r].gc;
        }
        return t;
    }();
    if (cp < 128) return ascii.gc[cp];
    if (cp > 0x10FFFF) return Gc::Cn;
    const GcRun* end = kGcRuns + kGcRunCount;
    const GcRun* it = std::upper_bound(kGcRuns, end, cp, [](uint32_t c, const GcRun& run) { return c < run.first; });
    return (it - 1)->gc;  // kGcRuns[0].first == 0, so `it` is past the first run
}

bool is_white_space(uint32_t cp) {
    // The White_Space property (PropList.txt); stable since Unicode 6.3.
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
        case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
            return true;
        default:
            return cp >= 0x2000 && cp <= 0x200A;
    }
}

}  // namespace moe::text
