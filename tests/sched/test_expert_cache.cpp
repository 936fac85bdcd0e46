// The expert cache's books (sched/expert_cache.h): entries taken and kept as documented, against the
// scores computed here by hand (expert bytes asked for, halved per ubatch).
#include <catch2/catch.hpp>

#include <deque>
#include <vector>

#include "sched/expert_cache.h"

using namespace moe::sched;

namespace {

// Expert matrices to key the cache with (only their addresses matter).
struct Matrices {
    std::deque<moe::Tensor> t;
    std::vector<char> host = std::vector<char>(16);
    const moe::Tensor* get(size_t i) {
        while (t.size() <= i) t.emplace_back();
        return &t[i];
    }
};

}  // namespace

TEST_CASE("expert cache: free entries first, then only a strictly higher score evicts", "[sched][expert_cache]") {
    Matrices m;
    ExpertCache c;
    CHECK_FALSE(c.use(m.get(0), m.host.data(), 100, {}).has_value());  // off: no entries
    c.reset(2, 4);
    REQUIRE(c.on());
    // Ubatch 0: A and B take the free entries; C (no history, as they) does not evict.
    const auto a = c.use(m.get(0), m.host.data(), 100, {});
    const auto b = c.use(m.get(1), m.host.data(), 100, {});
    REQUIRE(a.has_value());
    REQUIRE(b.has_value());
    CHECK(*a != *b);
    CHECK_FALSE(c.use(m.get(2), m.host.data(), 100, {}).has_value());
    c.valid(*a)[1] = 1;  // valid experts stay with the entry
    // Ubatch 1: all three scored 50; C comes first in the pass, and still does not win.
    c.next_ubatch();
    CHECK_FALSE(c.use(m.get(2), m.host.data(), 100, {}).has_value());
    CHECK(c.use(m.get(0), m.host.data(), 100, {}) == a);
    CHECK(c.use(m.get(1), m.host.data(), 100, {}) == b);
    CHECK(c.valid(*a)[1] == 1);
    // Ubatch 2: all scored 75; C asks for more, B is not used. What this ubatch asks counts from the next.
    c.next_ubatch();
    CHECK(c.use(m.get(0), m.host.data(), 100, {}) == a);
    CHECK_FALSE(c.use(m.get(2), m.host.data(), 200, {}).has_value());
    // Ubatch 3: A (75 + 100) / 2 = 87.5, B 75 / 2 = 37.5, C (75 + 200) / 2 = 137.5: C takes B's entry.
    c.next_ubatch();
    CHECK(c.use(m.get(2), m.host.data(), 100, {}) == b);
    CHECK(c.find(m.get(1), m.host.data()) == std::nullopt);
    CHECK(c.find(m.get(2), m.host.data()) == b);
    CHECK(c.valid(*b) == std::vector<uint8_t>(4, 0));  // C's experts start empty
    CHECK(c.use(m.get(0), m.host.data(), 100, {}) == a);
}

TEST_CASE("expert cache: busy entries are never taken, the host bytes are part of the key, scores fade",
          "[sched][expert_cache]") {
    Matrices m;
    ExpertCache c;
    c.reset(1, 2);
    const auto a = c.use(m.get(0), m.host.data(), 10, {});
    REQUIRE(a.has_value());
    // Ubatch 1: B (1000 / 2 = 500) beats A (10 / 2 = 5), but not while A's entry is held by the node being
    // prepared.
    CHECK_FALSE(c.use(m.get(1), m.host.data(), 1000, {}).has_value());
    c.next_ubatch();
    const std::vector<size_t> busy{*a};
    CHECK_FALSE(c.use(m.get(1), m.host.data(), 0, busy).has_value());
    CHECK(c.use(m.get(1), m.host.data(), 1000, {}) == a);
    // The same tensor over other host bytes is another matrix.
    CHECK(c.find(m.get(1), m.host.data() + 1) == std::nullopt);
    // From ubatch 2 on A asks for 10 per ubatch and B nothing: B's (500 + 1000) / 2^(u-1) against A's
    // 10 / 2^u + 10 * (1 - 2^(2-u)): B keeps the entry to ubatch 8 (11.7 > 9.88), A wins it at 9 (5.86 < 9.94).
    for (int u = 2; u <= 8; ++u) {
        c.next_ubatch();
        CHECK_FALSE(c.use(m.get(0), m.host.data(), 10, {}).has_value());
    }
    c.next_ubatch();
    CHECK(c.use(m.get(0), m.host.data(), 10, {}) == a);
    c.reset(1, 2);
    CHECK(c.find(m.get(0), m.host.data()) == std::nullopt);
}
