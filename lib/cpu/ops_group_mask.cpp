// GROUP_MASK: group-limited routing. Per token, each group of E / n_group consecutive experts is scored
// by the sum of its top_n entries (DeepSeek-V3: top 2 of the biased sigmoid scores; V2: the maximum
// softmax probability), and the entries of every group outside the n_used best become -inf, so that a
// following TOPK picks only experts of the best groups.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/ops_common.h"

namespace moe::cpu {

Status group_mask(Tensor& dst) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_group_mask(dst));  // shared with the other backend
    const Tensor& x = *dst.src[0];
    const int64_t n_group = dst.params.i[0], n_used = dst.params.i[1], top_n = dst.params.i[2];
    const int64_t per_group = dst.ne[0] / n_group;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, dst.ne[1], 16), [&](const tbb::blocked_range<int64_t>& r) {
        std::vector<float> top(static_cast<size_t>(top_n));
        std::vector<float> score(static_cast<size_t>(n_group));
        std::vector<int64_t> order(static_cast<size_t>(n_group));
        for (int64_t t = r.begin(); t < r.end(); ++t) {
            const auto* xs = reinterpret_cast<const float*>(x.row(t));
            auto* d = reinterpret_cast<float*>(dst.row(t));
            for (int64_t gi = 0; gi < n_group; ++gi) {
                const float* v = xs + gi * per_group;
                // NaN ranks first (ops::rank_key), so a group holding a NaN score is kept and the NaN
                // reaches the output instead of being masked away.
                std::partial_sort_copy(v, v + per_group, top.begin(), top.end(),
                                       [](float a, float b) { return ops::rank_key(a) > ops::rank_key(b); });
                float sum = 0.0f;
                for (float e : top) sum += e;
                score[static_cast<size_t>(gi)] = sum;
            }
            for (int64_t gi = 0; gi < n_group; ++gi) order[static_cast<size_t>(gi)] = gi;
            // The n_used best groups; ties go to the lower group (stable).
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
                return ops::rank_key(score[static_cast<size_t>(a)]) > ops::rank_key(score[static_cast<size_t>(b)]);
            });
            for (int64_t k = 0; k < n_group; ++k) {
                const int64_t gi = order[static_cast<size_t>(k)];
                float* out = d + gi * per_group;
                if (k < n_used) {
                    if (out != xs + gi * per_group) std::memcpy(out, xs + gi * per_group, sizeof(float) * per_group);
                } else {
                    std::fill(out, out + per_group, -std::numeric_limits<float>::infinity());
                }
            }
        }
    });
    return Status::ok();
}

}  // namespace moe::cpu
