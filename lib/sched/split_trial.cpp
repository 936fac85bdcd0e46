#include "sched/split_trial.h"

#include <algorithm>
#include <bit>

namespace moe::sched {

int SplitTrials::size_class(int n_tokens) { return std::bit_width(static_cast<unsigned>(std::max(n_tokens, 1))); }

SplitTrials::Choice SplitTrials::choose(int n_tokens) {
    auto it = trials_.find(n_tokens);
    if (it == trials_.end()) {
        // The decided trial of the closest size of the class, if any (ubatch times do not scale with
        // tokens: samples of other sizes are not compared, only their verdict is borrowed).
        const Trial* borrowed = nullptr;
        int distance = 0;
        for (const auto& [n, t] : trials_) {
            if (!t.decided() || size_class(n) != size_class(n_tokens)) continue;
            const int d = n > n_tokens ? n - n_tokens : n_tokens - n;
            if (borrowed == nullptr || d < distance) {
                borrowed = &t;
                distance = d;
            }
        }
        if (borrowed != nullptr) return {borrowed->split_wins(), false};
        it = trials_.emplace(n_tokens, Trial{}).first;
    }
    const Trial& t = it->second;
    if (t.decided()) return {t.split_wins(), false};
    return {t.samples[1] < t.samples[0], true};  // unsplit first, then alternate
}

void SplitTrials::record(int n_tokens, bool split, double seconds) {
    auto it = trials_.find(n_tokens);
    if (it == trials_.end() || it->second.decided() || !(seconds > 0.0)) return;
    Trial& t = it->second;
    const int k = split ? 1 : 0;
    t.best_seconds[k] = t.samples[k] == 0 ? seconds : std::min(t.best_seconds[k], seconds);
    ++t.samples[k];
}

bool SplitTrials::settled() const {
    return std::all_of(trials_.begin(), trials_.end(), [](const auto& e) { return e.second.decided(); });
}

}  // namespace moe::sched
