// Runs of adjacent selected experts: ACTIVE_ONLY uploads each run with one copy.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace moe::sched {

struct ExpertRun {
    int32_t first = 0;
    int32_t count = 0;
};

// Marks the experts that `ids` selects; kNoExpert selects none (the ids of a part of a split expert
// block). OUT_OF_RANGE for any other id outside [0, n_expert).
StatusOr<std::vector<uint8_t>> selected_experts(std::span<const int32_t> ids, int n_expert);

// Maximal runs of consecutive selected experts, in increasing order.
std::vector<ExpertRun> coalesce_runs(std::span<const uint8_t> selected);

}  // namespace moe::sched
