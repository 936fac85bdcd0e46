#include "sched/split_trial.h"

#include <algorithm>
#include <bit>

namespace moe::sched {

int SplitTrials::size_class(int n_tokens) { return std::bit_width(static_cast<unsigned>(std::max(n_tokens, 1))); }

bool SplitTrials::want_split(int n_tokens) const {
    const auto it = trials_.find(size_class(n_tokens));
    if (it == trials_.end()) return true;
    const Trial& t = it->second;
    if (t.samples[1] == 0) return true;
    if (t.samples[0] == 0) return false;
    if (t.samples[1] < 2) return true;
    return t.best_s_per_token[1] < t.best_s_per_token[0];
}

void SplitTrials::record(int n_tokens, bool split, double seconds) {
    if (n_tokens <= 0 || !(seconds > 0.0)) return;
    Trial& t = trials_[size_class(n_tokens)];
    const int k = split ? 1 : 0;
    const double per_token = seconds / n_tokens;
    t.best_s_per_token[k] = t.samples[k] == 0 ? per_token : std::min(t.best_s_per_token[k], per_token);
    ++t.samples[k];
}

}  // namespace moe::sched
