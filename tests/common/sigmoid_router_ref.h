// The sigmoid router (glm4moe; deepseek2 V3 / Kimi-K2: blocks::route_biased_sigmoid) in float64, and
// random router inputs with exact ties, for the tests of the CPU ops chain and the fused CUDA kernel.
// The reference follows Hugging Face's DeepSeek-V3 MoEGate (noaux_tc): scores = sigmoid(logits); the
// choice = scores + bias; with a group limit each group scores the sum of its two best choices, the
// n_used best groups (ties to the lower group) stay and the rest are -inf (llama.cpp's and moeinfer's
// fill; HF fills 0, the same while the kept choices are positive); the k best choices (ties to the
// lower index) are weighted by their unbiased scores, over the scores' sum + 1e-20 when normalising,
// times the scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace moe::test {

struct RouterCase {
    int64_t E, T;
    int k;
    int n_group, n_used;  // {1, 1}: no group limit
    bool bias, normalize;
    float scale;
};

// Fresh logits [E, T] (token-major) and bias [E] with exact ties: some experts copy another's logit and
// bias, and with a group limit group 1 copies group 0's bias, and in every other token its logits, so
// two groups tie as well.
inline void random_router_inputs(std::mt19937_64& rng, const RouterCase& c, std::vector<float>& logits,
                                 std::vector<float>& bias) {
    std::uniform_real_distribution<float> l(-4.0f, 4.0f), b(-0.1f, 0.1f);
    std::uniform_int_distribution<int64_t> pick(0, c.E - 1);
    logits.resize(static_cast<size_t>(c.E * c.T));
    bias.resize(static_cast<size_t>(c.E));
    for (float& x : logits) x = l(rng);
    for (float& x : bias) x = c.bias ? b(rng) : 0.0f;
    const int64_t per = c.E / c.n_group;
    if (c.n_group > 1) {
        for (int64_t e = 0; e < per; ++e) bias[static_cast<size_t>(per + e)] = bias[static_cast<size_t>(e)];
    }
    for (int64_t d = 0; d < c.E / 8; ++d) {  // duplicated experts (their bias too)
        const int64_t from = pick(rng), to = pick(rng);
        if (c.n_group > 1 && to / per <= 1) continue;  // group 1 stays a copy of group 0
        bias[static_cast<size_t>(to)] = bias[static_cast<size_t>(from)];
        for (int64_t t = 0; t < c.T; ++t) {
            logits[static_cast<size_t>(t * c.E + to)] = logits[static_cast<size_t>(t * c.E + from)];
        }
    }
    for (int64_t t = 0; c.n_group > 1 && t < c.T; t += 2) {
        float* row = logits.data() + t * c.E;
        std::copy(row, row + per, row + per);
    }
}

struct RouterChoice {
    std::vector<int32_t> ids;     // k, best first
    std::vector<double> weights;  // k
    bool decided = true;  // every gap that orders the ids, and the group boundary, is >= 1e-5 or an exact
                          // tie of identical inputs: float arithmetic within a few ulp chooses the same
};

// Token t's choice in float64.
inline RouterChoice reference_route(const RouterCase& c, const std::vector<float>& logits,
                                    const std::vector<float>& bias, int64_t t) {
    const float* l = logits.data() + t * c.E;
    std::vector<double> score(static_cast<size_t>(c.E)), v(static_cast<size_t>(c.E));
    for (int64_t e = 0; e < c.E; ++e) {
        score[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
        v[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + static_cast<double>(bias[static_cast<size_t>(e)]);
    }
    const auto same_input = [&](int64_t a, int64_t b) {
        return l[a] == l[b] && bias[static_cast<size_t>(a)] == bias[static_cast<size_t>(b)];
    };
    RouterChoice out;
    std::vector<int64_t> allowed(static_cast<size_t>(c.E));
    std::iota(allowed.begin(), allowed.end(), 0);
    if (c.n_used < c.n_group) {
        const int64_t per = c.E / c.n_group;
        std::vector<double> gs(static_cast<size_t>(c.n_group));
        for (int64_t gi = 0; gi < c.n_group; ++gi) {
            std::vector<double> g(v.begin() + gi * per, v.begin() + (gi + 1) * per);
            std::sort(g.rbegin(), g.rend());
            gs[static_cast<size_t>(gi)] = g[0] + g[1];
        }
        std::vector<int64_t> groups(static_cast<size_t>(c.n_group));
        std::iota(groups.begin(), groups.end(), 0);
        std::stable_sort(groups.begin(), groups.end(),
                         [&](int64_t a, int64_t b) { return gs[static_cast<size_t>(a)] > gs[static_cast<size_t>(b)]; });
        const int64_t last = groups[static_cast<size_t>(c.n_used - 1)], first_out = groups[static_cast<size_t>(c.n_used)];
        bool copies = true;
        for (int64_t e = 0; e < per; ++e) copies = copies && same_input(last * per + e, first_out * per + e);
        if (!copies && gs[static_cast<size_t>(last)] - gs[static_cast<size_t>(first_out)] < 1e-5) out.decided = false;
        allowed.clear();
        for (int j = 0; j < c.n_used; ++j) {
            for (int64_t e = 0; e < per; ++e) allowed.push_back(groups[static_cast<size_t>(j)] * per + e);
        }
        std::sort(allowed.begin(), allowed.end());
    }
    std::stable_sort(allowed.begin(), allowed.end(),
                     [&](int64_t a, int64_t b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
    for (size_t j = 0; j + 1 < allowed.size() && j < static_cast<size_t>(c.k); ++j) {
        const int64_t a = allowed[j], b = allowed[j + 1];
        if (!same_input(a, b) && v[static_cast<size_t>(a)] - v[static_cast<size_t>(b)] < 1e-5) out.decided = false;
    }
    double sum = 0.0;
    for (int j = 0; j < c.k; ++j) {
        const int64_t e = allowed[static_cast<size_t>(j)];
        out.ids.push_back(static_cast<int32_t>(e));
        out.weights.push_back(score[static_cast<size_t>(e)]);
        sum += score[static_cast<size_t>(e)];
    }
    for (double& w : out.weights) w = w / (c.normalize ? sum + 1e-20 : 1.0) * c.scale;
    return out;
}

}  // namespace moe::test
