#include "sched/split_trial.h"

#include <algorithm>
#include <bit>

namespace moe::sched {

int SplitTrials::size_class(int n_tokens) { return std::bit_width(static_cast<unsigned>(std::max(n_tokens, 1))); }

// Fewer samples first; on a tie unsplit at 0 + 0, split at 1 + 1 (unsplit, split, split, unsplit).
bool SplitTrials::Trial::next_split() const {
    if (samples[0] != samples[1]) return samples[1] < samples[0];
    return samples[0] % 2 == 1;
}

const SplitTrials::Trial* SplitTrials::closest_decided(int n_tokens) const {
    // Samples of other sizes are not compared (ubatch times do not scale with tokens); only their
    // verdict is borrowed.
    const Trial* best = nullptr;
    int distance = 0;
    for (const auto& [n, t] : trials_) {
        if (n == n_tokens || !t.decided() || size_class(n) != size_class(n_tokens)) continue;
        const int d = n > n_tokens ? n - n_tokens : n_tokens - n;
        if (best == nullptr || d < distance) {
            best = &t;
            distance = d;
        }
    }
    return best;
}

std::optional<bool> SplitTrials::verdict(int n_tokens) const {
    if (auto it = trials_.find(n_tokens); it != trials_.end() && it->second.decided()) return it->second.split_wins();
    if (const Trial* t = closest_decided(n_tokens)) return t->split_wins();
    return std::nullopt;
}

SplitTrials::Choice SplitTrials::choose(int n_tokens) {
    if (const std::optional<bool> v = verdict(n_tokens)) {
        // A decided verdict of the range replaces an own trial still running (a rare size).
        if (auto it = trials_.find(n_tokens); it != trials_.end() && !it->second.decided()) trials_.erase(it);
        return {*v, false};
    }
    return {trials_[n_tokens].next_split(), true};
}

void SplitTrials::record(int n_tokens, bool split, double seconds) {
    auto it = trials_.find(n_tokens);
    if (it == trials_.end() || it->second.decided() || !(seconds > 0.0)) return;
    Trial& t = it->second;
    const int k = split ? 1 : 0;
    t.sum_seconds[k] += seconds;
    ++t.samples[k];
}

bool SplitTrials::settled() const {
    return std::all_of(trials_.begin(), trials_.end(), [](const auto& e) { return e.second.decided(); });
}

}  // namespace moe::sched
