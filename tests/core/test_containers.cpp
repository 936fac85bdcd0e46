// The scheduler's flat containers against the standard ones they replace: PointerMap against
// std::unordered_map on random keys, StableArena's reuse after clear().
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/pointer_map.h"
#include "core/stable_arena.h"
#include "core/tensor.h"

using moe::PointerMap;
using moe::StableArena;

namespace {

// Every entry of `got` is in `want` with the same value, and the sizes agree.
void check_same(const PointerMap<const int*, uint64_t>& got, const std::unordered_map<const int*, uint64_t>& want) {
    REQUIRE(got.size() == want.size());
    size_t visited = 0;
    for (const auto& [k, v] : got) {
        ++visited;
        const auto it = want.find(k);
        REQUIRE(it != want.end());
        CHECK(it->second == v);
    }
    CHECK(visited == want.size());
    for (const auto& [k, v] : want) {
        const auto it = got.find(k);
        REQUIRE(it != got.end());
        CHECK(it->second == v);
        CHECK(got.count(k) == 1);
        CHECK(got.at(k) == v);
    }
}

}  // namespace

TEST_CASE("PointerMap: inserts, finds and iterates as std::unordered_map does, across clears", "[core]") {
    std::mt19937_64 rng(std::random_device{}());
    // Keys: addresses in one array (neighbours collide in the low bits) and a few far ones.
    std::vector<int> pool(4096);
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    PointerMap<const int*, uint64_t> map;
    for (int round = 0; round < 4; ++round) {
        std::unordered_map<const int*, uint64_t> want;
        const size_t n = round == 3 ? 0 : std::uniform_int_distribution<size_t>(1, 3000)(rng);
        if (round == 1) map.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            const int* k = &pool[pick(rng)];
            const uint64_t v = rng();
            if (i % 3 == 0) {
                map[k] += v;  // value-initialised when new, like std::unordered_map
                want[k] += v;
            } else {
                map[k] = v;
                want[k] = v;
            }
        }
        check_same(map, want);
        // Keys never inserted are absent.
        for (int i = 0; i < 200; ++i) {
            const int* k = &pool[pick(rng)];
            if (want.count(k) == 0) {
                CHECK(map.find(k) == map.end());
                CHECK(map.count(k) == 0);
                CHECK_THROWS_AS(map.at(k), std::out_of_range);
            }
        }
        map.clear();
        CHECK(map.empty());
        CHECK(map.begin() == map.end());
    }
}

TEST_CASE("StableArena: elements after clear() are fresh, earlier addresses reused, none moved", "[core]") {
    StableArena<moe::Tensor, 4> arena;
    std::vector<moe::Tensor*> first;
    for (int i = 0; i < 10; ++i) {
        moe::Tensor& t = arena.emplace_back();
        t.name = std::to_string(i);
        t.layer = i;
        first.push_back(&t);
    }
    for (int i = 0; i < 10; ++i) CHECK(first[static_cast<size_t>(i)]->layer == i);  // stable while growing
    arena.clear();
    CHECK(arena.size() == 0);
    std::vector<moe::Tensor*> second;
    for (int i = 0; i < 14; ++i) {
        moe::Tensor& t = arena.emplace_back();
        CHECK(t.name.empty());  // value-initialised, not what the element held before
        CHECK(t.layer == -1);
        CHECK(t.data == nullptr);
        t.layer = 100 + i;
        second.push_back(&t);
    }
    CHECK(arena.size() == 14);
    // The first ten reuse the earlier chunks' elements in order; the rest are new.
    for (size_t i = 0; i < 10; ++i) CHECK(second[i] == first[i]);
    for (int i = 0; i < 14; ++i) CHECK(second[static_cast<size_t>(i)]->layer == 100 + i);
    // A clear() of an arena filled less than before still refreshes every reused element.
    arena.clear();
    arena.emplace_back().layer = 7;
    arena.clear();
    for (int i = 0; i < 14; ++i) CHECK(arena.emplace_back().layer == -1);
}
