// The automatic expert split's final say: the cost model proposes a split, and ubatches timed with
// and without it decide, per ubatch size.
#pragma once

#include <map>
#include <optional>

namespace moe::sched {

class SplitTrials {
public:
    struct Choice {
        bool split = true;
        bool timed = false;  // the ubatch is a trial sample: record() its time
    };
    // For the next ubatch of n_tokens tokens, for which the cost model wants a split. Per size the
    // samples go unsplit, split, split, unsplit (the side with fewer samples first), and the faster mean
    // wins: within one long prompt the ubatches run at growing cache depths, and this order gives both
    // sides the same mean depth. A size without a decided trial of its own takes the verdict of the
    // closest decided size of its power-of-two range (a prompt's last, shorter ubatch; an undecided
    // trial of its own is dropped then), else it runs its own. A verdict stands until clear().
    Choice choose(int n_tokens);
    // The verdict for n_tokens (own or borrowed), without starting a trial; nullopt while undecided.
    std::optional<bool> verdict(int n_tokens) const;
    // A trial sample of n_tokens ran in `seconds`, split or not.
    void record(int n_tokens, bool split, double seconds);
    void clear() { trials_.clear(); }
    // Whether every trial started has decided.
    bool settled() const;

private:
    static constexpr int kSamples = 2;  // per side
    struct Trial {
        double sum_seconds[2] = {0.0, 0.0};  // [0] unsplit, [1] split
        int samples[2] = {0, 0};
        bool decided() const { return samples[0] >= kSamples && samples[1] >= kSamples; }
        bool split_wins() const { return sum_seconds[1] * samples[0] < sum_seconds[0] * samples[1]; }
        bool next_split() const;
    };
    static int size_class(int n_tokens);
    const Trial* closest_decided(int n_tokens) const;  // in the same range, other than n_tokens's own
    std::map<int, Trial> trials_;  // by n_tokens
};

}  // namespace moe::sched
