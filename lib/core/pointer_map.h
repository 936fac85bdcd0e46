// A hash map keyed by pointers, its entries in one array (open addressing, linear probing).
// Why not std::unordered_map: the scheduler rebuilds its per-node tables (which side produced a
// tensor, each tensor's arena offset) for every ubatch, ~1,500 entries per decode step of a 48-layer
// model. A node-based map allocates and frees each entry and scatters them over the heap; while the
// host's expert products stream a layer's weights through the caches, every lookup and the free of
// every entry missed them (hybrid decode profile, docs/PERF.md 2026-11-28: ~1 ms a token). Here a
// table that is cleared keeps its array, and a lookup reads one or two neighbouring entries.
// No erase (nothing needs it); nullptr is not a valid key.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moe {

template <class K, class V>
class PointerMap {
    static_assert(std::is_pointer_v<K>, "PointerMap keys are pointers");

public:
    using value_type = std::pair<K, V>;

    template <bool kConst>
    class Iter {
        using Slot = std::conditional_t<kConst, const value_type, value_type>;

    public:
        Iter(Slot* at, Slot* end) : at_(at), end_(end) { skip(); }
        Slot& operator*() const { return *at_; }
        Slot* operator->() const { return at_; }
        Iter& operator++() {
            ++at_;
            skip();
            return *this;
        }
        bool operator==(const Iter& o) const { return at_ == o.at_; }

    private:
        void skip() {
            while (at_ != end_ && at_->first == nullptr) ++at_;
        }
        Slot* at_;
        Slot* end_;
    };
    using iterator = Iter<false>;
    using const_iterator = Iter<true>;

    iterator begin() { return {slots_.data(), slots_.data() + slots_.size()}; }
    iterator end() { return {slots_.data() + slots_.size(), slots_.data() + slots_.size()}; }
    const_iterator begin() const { return {slots_.data(), slots_.data() + slots_.size()}; }
    const_iterator end() const { return {slots_.data() + slots_.size(), slots_.data() + slots_.size()}; }

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

    // Room for n entries without growing.
    void reserve(size_t n) {
        if (n * 2 > slots_.size()) rehash(std::bit_ceil(std::max<size_t>(n * 2, 16)));
    }
    // Empties the map, keeping its array.
    void clear() {
        if (size_ == 0) return;
        for (value_type& s : slots_) s = value_type{};
        size_ = 0;
    }

    iterator find(K key) {
        const size_t i = slot_of(key);
        return i != kNone ? iterator(slots_.data() + i, slots_.data() + slots_.size()) : end();
    }
    const_iterator find(K key) const {
        const size_t i = slot_of(key);
        return i != kNone ? const_iterator(slots_.data() + i, slots_.data() + slots_.size()) : end();
    }
    size_t count(K key) const { return slot_of(key) != kNone ? 1 : 0; }
    const V& at(K key) const {
        const size_t i = slot_of(key);
        if (i == kNone) throw std::out_of_range("PointerMap::at: no such key");
        return slots_[i].second;
    }
    // The value of key, value-initialised when new.
    V& operator[](K key) {
        MOE_ASSERT(key != nullptr);  // the empty slots' key
        if (const size_t i = slot_of(key); i != kNone) return slots_[i].second;
        reserve(size_ + 1);
        value_type& s = slots_[probe_free(key)];
        s.first = key;
        s.second = V{};
        ++size_;
        return s.second;
    }

private:
    size_t home(K key) const {
        // Fibonacci hashing of the address without its alignment bits; the table's size is a power of 2.
        const uint64_t h = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key)) >> 4) * 0x9E3779B97F4A7C15ull;
        return static_cast<size_t>(h >> (64 - std::countr_zero(slots_.size())));
    }
    static constexpr size_t kNone = ~size_t{0};
    // The slot holding key, or kNone.
    size_t slot_of(K key) const {
        if (size_ == 0) return kNone;
        const size_t mask = slots_.size() - 1;
        for (size_t i = home(key);; i = (i + 1) & mask) {
            if (slots_[i].first == key) return i;
            if (slots_[i].first == nullptr) return kNone;
        }
    }
    size_t probe_free(K key) const {
        const size_t mask = slots_.size() - 1;
        size_t i = home(key);
        while (slots_[i].first != nullptr) i = (i + 1) & mask;
        return i;
    }
    void rehash(size_t n_slots) {
        std::vector<value_type> old(n_slots);
        old.swap(slots_);
        for (value_type& s : old) {
            if (s.first != nullptr) slots_[probe_free(s.first)] = std::move(s);
        }
    }

    std::vector<value_type> slots_;  // empty slots have a null key
    size_t size_ = 0;
};

}  // namespace moe
