// The expert split: in a prompt ubatch whose expert weights all live in host RAM, each split layer's
// expert block computes in two parts at the same time, the host's group of experts on the host and the
// rest on the device (which uploads only those). The splitter decides, per ubatch, which layers split
// and which experts the host takes, balancing the host's measured cost per (token, expert) pair
// against the measured upload time of the device's experts, predicted from the last prompt ubatch's
// activation counts. With MOE_EXPERT_SPLIT_AUTO, ubatches timed with and without the split decide
// (sched/split_trial.h). The graph is then built with the plan's groups (sched/expert_plan.h); the
// scheduler times the host parts (SplitTiming) and hands the measurements back after the run.
#pragma once

#include <vector>

#include "core/status.h"
#include "sched/assignment.h"
#include "sched/expert_plan.h"
#include "sched/policy.h"
#include "sched/split_trial.h"
#include "sched/stats.h"
#include "sched/transfers.h"
#include "sched/weight_table.h"

namespace moe::sched {

class ExpertSplitter {
public:
    // policy is the scheduler's, read at each call; has_device false: never splits.
    ExpertSplitter(bool has_device, const WeightTable& weights, const Policy& policy, const Assignment& assignment,
                   int n_layer, int n_expert, int n_expert_used);

    // The split of the next ubatch of n_tokens tokens (see Scheduler::plan_expert_split). profiling:
    // no trial runs (per-op synchronisation would skew the samples). transfers times the link once.
    StatusOr<ExpertSplitPlan> plan(int n_tokens, bool profiling, Transfers& transfers);
    // The plan of the ubatch being planned or run (groups empty when it does not split).
    const ExpertSplitPlan& current() const { return split_; }
    // After a ubatch ran: learns the host's costs from its timing, records a trial sample (fair: it
    // paid no one-off allocations), and counts the split into stats.
    void finish(const SplitTiming& timing, int n_tokens, double seconds, bool fair, bool profiling, Stats& stats);
    // The ubatch's activation counts ([n_layer][n_expert]), from which the next split predicts.
    void observe_counts(std::vector<uint32_t> counts, int n_tokens);
    // A new policy: the trials start again.
    void clear_trials() { trials_.clear(); }

private:
    int choose_host_experts(int layer, int n_tokens, std::vector<int32_t>& order, double* expected_pairs) const;
    void learn(const SplitTiming& timing);

    bool has_device_;
    const WeightTable& weights_;
    const Policy& policy_;
    const Assignment& assignment_;
    int n_layer_;
    int n_expert_;
    int n_expert_used_;

    // The groups of the ubatch being planned/run ([n_layer][n_expert], empty when off).
    ExpertSplitPlan split_;
    // The measured costs it balances.
    double upload_s_per_byte_ = 0.0;  // Transfers::upload_seconds_per_byte, once measured
    double host_s_per_pair_ = 0.0;    // host seconds per expected (token, expert) pair of a host part
    double expected_pairs_ = 0.0;     // of the planned ubatch's host parts
    double host_serial_s_ = 0.0;      // per split layer: the host side's cost besides its pairs
    // The last prompt ubatch's activation counts it predicts from.
    std::vector<uint32_t> last_counts_;  // [n_layer][n_expert]
    int last_counts_tokens_ = 0;
    SplitTrials trials_;  // automatic split: timed ubatches with and without
    bool timed_ = false;     // the planned ubatch is a sample for trials_
    bool timed_on_ = false;  // ... run split
};

}  // namespace moe::sched
