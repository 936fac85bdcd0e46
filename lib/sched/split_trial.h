// The automatic expert split's final say: the cost model proposes a split, and ubatches timed with
// and without it decide, per ubatch-size class (tokens rounded down to a power of two, times per token).
#pragma once

#include <map>

namespace moe::sched {

class SplitTrials {
public:
    // Whether the next ubatch of n_tokens tokens, for which the cost model wants a split, splits. Order
    // per class: split, unsplit, split, then the faster by its best sample. The first ubatch of a shape
    // pays one-off costs (plans, arena growth, CUDA graph captures): the split takes that sample and is
    // timed again; the unsplit ubatch after it is warm. Samples keep coming from the choice in force,
    // whose best can only improve: a decision stands unless the policy changes (clear()).
    bool want_split(int n_tokens) const;
    // A ubatch of n_tokens ran in `seconds`, split or not.
    void record(int n_tokens, bool split, double seconds);
    void clear() { trials_.clear(); }

private:
    struct Trial {
        double best_s_per_token[2] = {0.0, 0.0};  // [0] unsplit, [1] split; valid where samples > 0
        int samples[2] = {0, 0};
    };
    static int size_class(int n_tokens);
    std::map<int, Trial> trials_;
};

}  // namespace moe::sched
