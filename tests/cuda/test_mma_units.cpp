// The raw-unit schedule of the tensor-core GEMM for the decoded types (cuda/mma_units.h), replayed on the
// host against the rules of cp.async groups as the kernel (matmul_mma.cuh) issues and waits for them:
// before step 0, group {unit 0, activations 0} and group {unit 1}, a wait for all groups but the newest and
// the decode of step 0; in step kb, a wait for all but the newest and a barrier, group {activations kb + 1},
// group {the unit the schedule copies}, then the decode of step kb + 1 and step kb's MMAs. Every decode
// must find its unit in its slot and complete, every MMA its activations complete, and every unit be
// copied once, into a slot whose unit was decoded to its end before the barrier. Host only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "cuda/mma_units.h"

namespace {

using moe::cuda::mm::unit_copied_in_step;
using moe::cuda::mm::unit_of_step;
using moe::cuda::mm::unit_slot;

class Replay {
public:
    // copy_lead: how many steps earlier than the schedule says each unit is copied (0: the schedule).
    Replay(int period, int nsteps, int copy_lead = 0)
        : period_(period), nsteps_(nsteps), n_units_((nsteps + period - 1) / period), lead_(copy_lead),
          act_group_(static_cast<size_t>(nsteps), -1), unit_group_(static_cast<size_t>(n_units_), -1),
          decoded_upto_(static_cast<size_t>(n_units_), -1), decoded_in_(static_cast<size_t>(n_units_), -2) {}

    int run() {
        copy(0, -1);
        act_group_[0] = n_groups_++;
        if (n_units_ > 1) copy(1, -1);
        ++n_groups_;
        wait_all_but_newest();
        decode(0, -1);
        for (int kb = 0; kb < nsteps_; ++kb) {
            wait_all_but_newest();  // and the barrier
            if (act_group_[kb] < 0 || act_group_[kb] >= complete_) fail("MMAs before their activations", kb, -1);
            if (kb + 1 < nsteps_) act_group_[kb + 1] = n_groups_;
            ++n_groups_;
            if (kb + lead_ < nsteps_) copy(unit_copied_in_step(kb + lead_, period_, n_units_), kb);
            ++n_groups_;
            if (kb + 1 < nsteps_) decode(kb + 1, kb);
        }
        for (int u = 0; u < n_units_; ++u) {
            if (unit_group_[u] < 0) fail("a unit never copied", nsteps_, u);
            if (decoded_upto_[u] != last_step(u)) fail("a unit not decoded to its end", nsteps_, u);
        }
        return errors_;
    }

private:
    int last_step(int u) const { return std::min((u + 1) * period_, nsteps_) - 1; }
    void fail(const char* what, int step, int u) {
        if (errors_++ < 4) UNSCOPED_INFO(what << ": in step " << step << ", unit " << u);
    }
    void wait_all_but_newest() { complete_ = std::max(n_groups_ - 1, 0); }
    // Unit u copied by the code of step `step` (-1: before step 0), after that step's barrier.
    void copy(int u, int step) {
        if (u < 0) return;
        if (u >= n_units_ || unit_group_[u] >= 0) return fail("a unit copied twice or out of range", step, u);
        const int prev = slot_unit_[unit_slot(u)];
        if (prev >= 0 && (decoded_upto_[prev] != last_step(prev) || decoded_in_[prev] >= step)) {
            fail("a slot refilled before its unit was decoded to the end", step, u);
        }
        slot_unit_[unit_slot(u)] = u;
        unit_group_[u] = n_groups_;
    }
    // The groups of step s decoded by the code of step `step`.
    void decode(int s, int step) {
        const int u = unit_of_step(s, period_);
        if (slot_unit_[unit_slot(u)] != u) return fail("a decode found another unit in its slot", step, u);
        if (unit_group_[u] >= complete_) return fail("a decode of a unit still in flight", step, u);
        decoded_upto_[u] = s;
        decoded_in_[u] = step;
    }

    int period_, nsteps_, n_units_, lead_;
    std::vector<int> act_group_;     // the cp.async group of activations s
    std::vector<int> unit_group_;    // the cp.async group of unit u, -1 before its copy
    std::vector<int> decoded_upto_;  // the last step of unit u decoded so far
    std::vector<int> decoded_in_;    // the step whose code decoded it (-1: before step 0)
    int slot_unit_[2] = {-1, -1};
    int n_groups_ = 0;
    int complete_ = 0;  // groups [0, complete_) are complete
    int errors_ = 0;
};

}  // namespace

TEST_CASE("the decoded types' raw-unit schedule keeps every decode on a complete unit in its slot", "[cuda][matmul]") {
    // Period 4 is the kernel's (units of 8 groups, steps of 2); 2 and 8 too, so that the rules do not hold
    // by accident of one period. From one step to several units, partial last units included.
    for (int period : {2, 4, 8}) {
        for (int nsteps = 1; nsteps <= 40; ++nsteps) {
            INFO("period " << period << ", " << nsteps << " steps");
            CHECK(Replay(period, nsteps).run() == 0);
        }
    }
    CHECK(unit_copied_in_step(2, 4, 4) == -1);
    CHECK(unit_copied_in_step(3, 4, 4) == 2);  // step 3 decodes unit 0's last step: its slot takes unit 2
    CHECK(unit_copied_in_step(11, 4, 4) == -1);  // there is no unit 4
}

TEST_CASE("the raw-unit replay reports units copied a step early or still in flight", "[cuda][matmul]") {
    // Copied one step earlier, a unit lands in the slot of a unit with a step still to decode.
    CHECK(Replay(4, 16, 1).run() > 0);
    CHECK(Replay(2, 9, 1).run() > 0);
    // A unit per step: each is copied in the step before its decode, in the newest group, which the wait
    // leaves in flight (hence the kernel's kPeriod >= 2).
    CHECK(Replay(1, 8).run() > 0);
}
