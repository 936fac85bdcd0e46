#include "sched/expert_runs.h"

#include <string>

#include "core/tensor.h"

namespace moe::sched {

StatusOr<std::vector<uint8_t>> selected_experts(std::span<const int32_t> ids, int n_expert) {
    std::vector<uint8_t> selected(static_cast<size_t>(n_expert), 0);
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t e = ids[i];
        if (e == kNoExpert) continue;
        if (e < 0 || e >= n_expert) {
            return out_of_range("expert id " + std::to_string(e) + " at index " + std::to_string(i) +
                                " is outside [0, " + std::to_string(n_expert) + ")");
        }
        selected[static_cast<size_t>(e)] = 1;
    }
    return selected;
}

std::vector<ExpertRun> coalesce_runs(std::span<const uint8_t> selected) {
    std::vector<ExpertRun> runs;
    const int32_t n = static_cast<int32_t>(selected.size());
    for (int32_t e = 0; e < n;) {
        if (!selected[static_cast<size_t>(e)]) {
            ++e;
            continue;
        }
        ExpertRun r{e, 0};
        while (e < n && selected[static_cast<size_t>(e)]) {
            ++r.count;
            ++e;
        }
        runs.push_back(r);
    }
    return runs;
}

}  // namespace moe::sched
