// The stop-string matcher of moe_generate on random text split into random pieces. The contract: after
// the first piece with which the text contains a stop string, the text is cut where the earliest stop
// string in it starts. Reference: std::string::find on the text up to each piece's end. The released
// text is always a prefix of the reference's (never past a stop string) and, at the end, equal to it.
#include <catch2/catch.hpp>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/generate.h"

namespace {

std::string random_text(std::mt19937& rng, size_t n) {
    // A two-letter alphabet makes overlapping partial matches ("aab" in "aaab") common.
    std::string s;
    for (size_t i = 0; i < n; ++i) s += "ab"[rng() % 2];
    return s;
}

}  // namespace

TEST_CASE("StopMatcher: released text never passes the first stop string", "[runtime][generate]") {
    const unsigned seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    for (int trial = 0; trial < 2000; ++trial) {
        std::vector<std::string> stops;
        const int n_stops = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < n_stops; ++i) stops.push_back(random_text(rng, 1 + rng() % 5));
        const std::string text = random_text(rng, rng() % 40);
        std::vector<size_t> ends;  // piece boundaries (empty pieces included)
        for (size_t end = 0; end < text.size();) {
            end = std::min(text.size(), end + static_cast<size_t>(rng() % 5));
            ends.push_back(end);
        }
        size_t first = std::string::npos;
        for (const size_t end : ends) {
            const std::string seen = text.substr(0, end);
            for (const std::string& s : stops) first = std::min(first, seen.find(s));
            if (first != std::string::npos) break;
        }
        const std::string expected = text.substr(0, first);

        moe::StopMatcher m(stops);
        std::string released, piece;
        bool stopped = false;
        size_t pos = 0;
        for (const size_t end : ends) {
            stopped = m.push(std::string_view(text).substr(pos, end - pos), &piece);
            pos = end;
            released += piece;
            REQUIRE(expected.compare(0, released.size(), released) == 0);
            REQUIRE(released.size() <= expected.size());
            if (stopped) break;
        }
        if (!stopped) released += m.flush();
        INFO("text " << text << " stops " << stops[0]);
        REQUIRE(stopped == (first != std::string::npos));
        REQUIRE(released == expected);
    }
}
