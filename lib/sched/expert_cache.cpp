#include "sched/expert_cache.h"

#include <algorithm>
#include <cmath>

namespace moe::sched {

void ExpertCache::reset(size_t entries, int n_expert) {
    n_expert_ = n_expert;
    entries_.assign(entries, Entry{});
    score_.clear();
    where_.clear();
    ++generation_;
}

void ExpertCache::filled(size_t entry) {
    Entry& e = entries_[entry];
    if (e.complete || std::find(e.valid.begin(), e.valid.end(), uint8_t{0}) != e.valid.end()) return;
    e.complete = true;
    ++generation_;
}

std::optional<size_t> ExpertCache::complete(const Tensor* weight, const void* host) const {
    const std::optional<size_t> e = find(weight, host);
    if (!e || !entries_[*e].complete) return std::nullopt;
    return e;
}

std::optional<size_t> ExpertCache::find(const Tensor* weight, const void* host) const {
    const auto it = where_.find(Key{weight, host});
    if (it == where_.end()) return std::nullopt;
    return it->second;
}

// The score of `key` in the current ubatch: its aged count before it.
double ExpertCache::score(const Key& key) const {
    const auto it = score_.find(key);
    if (it == score_.end()) return 0.0;
    const Score& s = it->second;
    if (s.ubatch == ubatch_) return s.past;
    const uint64_t age = ubatch_ - s.ubatch;
    return age >= 1024 ? 0.0 : std::ldexp(s.past + s.current, -static_cast<int>(age));
}

std::optional<size_t> ExpertCache::use(const Tensor* weight, const void* host, uint64_t requested_bytes,
                                       std::span<const size_t> busy) {
    if (!on()) return std::nullopt;
    const Key key{weight, host};
    const double own = score(key);
    Score& s = score_[key];
    if (s.ubatch != ubatch_) s = Score{own, 0.0, ubatch_};
    s.current += static_cast<double>(requested_bytes);
    if (const auto it = where_.find(key); it != where_.end()) return it->second;
    auto is_busy = [&](size_t e) { return std::find(busy.begin(), busy.end(), e) != busy.end(); };
    std::optional<size_t> victim;
    double victim_score = 0.0;
    for (size_t e = 0; e < entries_.size(); ++e) {
        if (is_busy(e)) continue;
        if (!entries_[e].key) {
            victim = e;
            break;
        }
        const double other = score(*entries_[e].key);
        if (!victim || other < victim_score) {
            victim = e;
            victim_score = other;
        }
    }
    if (!victim) return std::nullopt;
    Entry& entry = entries_[*victim];
    if (entry.key) {
        if (victim_score >= own) return std::nullopt;
        where_.erase(*entry.key);
    }
    if (entry.complete) ++generation_;
    entry.key = key;
    entry.valid.assign(static_cast<size_t>(n_expert_), 0);
    entry.complete = false;
    where_[key] = *victim;
    return victim;
}

}  // namespace moe::sched
