// The automatic expert split's final say: the cost model proposes a split, and ubatches timed with
// and without it decide, per ubatch size.
#pragma once

#include <map>

namespace moe::sched {

class SplitTrials {
public:
    struct Choice {
        bool split = true;
        bool timed = false;  // the ubatch is a trial sample: record() its time
    };
    // For the next ubatch of n_tokens tokens, for which the cost model wants a split. Per size: unsplit,
    // split, unsplit, split, then the faster by its best sample (symmetric, so one-off costs of a first
    // run, such as arena growth, plans or CUDA graph captures, weigh on both sides alike). A size that has
    // no trial of its own follows a decided one of the same power-of-two class (a prompt's last, shorter
    // ubatch), else it starts its own. A decision stands until clear() (a new policy).
    Choice choose(int n_tokens);
    // A trial sample of n_tokens ran in `seconds`, split or not.
    void record(int n_tokens, bool split, double seconds);
    void clear() { trials_.clear(); }
    // Whether every trial started has decided.
    bool settled() const;

private:
    static constexpr int kSamples = 2;  // per side
    struct Trial {
        double best_seconds[2] = {0.0, 0.0};  // [0] unsplit, [1] split; valid where samples > 0
        int samples[2] = {0, 0};
        bool decided() const { return samples[0] >= kSamples && samples[1] >= kSamples; }
        bool split_wins() const { return best_seconds[1] < best_seconds[0]; }
    };
    static int size_class(int n_tokens);
    std::map<int, Trial> trials_;  // by n_tokens
};

}  // namespace moe::sched
