// The sampler chain (semantics: the "Sampling" section of moeinfer.h). No stage sorts the vocabulary:
// top-k selects through a heap of k, top-p through a weighted quickselect, min-p filters; only the few
// candidates left are sorted (by id, for the draw), so a chain costs O(n_vocab) plus a sort of what
// survives it.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

namespace moe {
namespace {

constexpr const char* kAllMasked = "every token's logit is -inf (after the penalties and logit bias): nothing to sample";

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// Rank order: higher logit first, lower id first among equal logits (a total order, so every selection
// and tie is reproducible).
bool ranks_before(const SamplerCandidate& a, const SamplerCandidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

Status check_params(const moe_sampler_params& p, int32_t n_vocab) {
    if (n_vocab <= 0) return invalid_argument("n_vocab must be > 0 (got " + std::to_string(n_vocab) + ")");
    if (!std::isfinite(p.temperature)) {
        return invalid_argument("params->temperature must be finite (got " + num(p.temperature) + "; <= 0 is greedy)");
    }
    if (p.top_k < 0) return invalid_argument("params->top_k must be >= 0 (0: off; got " + std::to_string(p.top_k) + ")");
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
        return invalid_argument("params->top_p must be in (0, 1] (1: off; got " + num(p.top_p) + ")");
    }
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
        return invalid_argument("params->min_p must be in [0, 1] (0: off; got " + num(p.min_p) + ")");
    }
    if (p.min_keep < 0) return invalid_argument("params->min_keep must be >= 0 (got " + std::to_string(p.min_keep) + ")");
    if (p.repeat_last_n < -1) {
        return invalid_argument("params->repeat_last_n must be >= -1 (-1: all accepted tokens, 0: off; got " +
                                std::to_string(p.repeat_last_n) + ")");
    }
    if (!(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f)) {
        return invalid_argument("params->repeat_penalty must be finite and > 0 (1: off; got " + num(p.repeat_penalty) +
                                ")");
    }
    if (!std::isfinite(p.frequency_penalty)) {
        return invalid_argument("params->frequency_penalty must be finite (got " + num(p.frequency_penalty) + ")");
    }
    if (!std::isfinite(p.presence_penalty)) {
        return invalid_argument("params->presence_penalty must be finite (got " + num(p.presence_penalty) + ")");
    }
    if (p.n_logit_bias < 0) {
        return invalid_argument("params->n_logit_bias must be >= 0 (got " + std::to_string(p.n_logit_bias) + ")");
    }
    if (p.n_logit_bias > 0 && p.logit_bias == nullptr) {
        return invalid_argument("params->logit_bias is NULL but params->n_logit_bias is " +
                                std::to_string(p.n_logit_bias));
    }
    for (int32_t i = 0; i < p.n_logit_bias; ++i) {
        const moe_logit_bias& b = p.logit_bias[i];
        const std::string what = "params->logit_bias[" + std::to_string(i) + "]";
        if (b.token < 0 || b.token >= n_vocab) {
            return out_of_range(what + ".token = " + std::to_string(b.token) + " is outside [0, n_vocab = " +
                                std::to_string(n_vocab) + ")");
        }
        // -inf bans a token; +inf would make every other probability NaN.
        if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity()) {
            return invalid_argument(what + ".bias must be finite or -INFINITY (got " + num(b.bias) + ")");
        }
    }
    return Status::ok();
}

uint64_t random_seed() {
    std::random_device rd;
    uint64_t s = MOE_SAMPLER_SEED_RANDOM;
    // MOE_SAMPLER_SEED_RANDOM itself is never reported: passed back it would mean "random" again.
    while (s == MOE_SAMPLER_SEED_RANDOM) s = (uint64_t{rd()} << 32) ^ uint64_t{rd()};
    return s;
}

}  // namespace

StatusOr<std::unique_ptr<Sampler>> Sampler::create(const moe_sampler_params& params, int32_t n_vocab) {
    MOE_RETURN_IF_ERROR(check_params(params, n_vocab));
    std::vector<std::pair<int32_t, float>> bias;
    bias.reserve(static_cast<size_t>(params.n_logit_bias));
    for (int32_t i = 0; i < params.n_logit_bias; ++i) bias.emplace_back(params.logit_bias[i].token, params.logit_bias[i].bias);
    const uint64_t seed = params.seed == MOE_SAMPLER_SEED_RANDOM ? random_seed() : params.seed;
    return std::unique_ptr<Sampler>(new Sampler(params, n_vocab, std::move(bias), seed));
}

Sampler::Sampler(const moe_sampler_params& params, int32_t n_vocab, std::vector<std::pair<int32_t, float>> bias,
                 uint64_t seed)
    : params_(params), n_vocab_(n_vocab), bias_(std::move(bias)), seed_(seed), rng_(seed) {
    params_.logit_bias = nullptr;  // borrowed by create only
}

Status Sampler::accept(const int32_t* tokens, int32_t n_tokens) {
    if (n_tokens < 0) return invalid_argument("n_tokens must be >= 0 (got " + std::to_string(n_tokens) + ")");
    if (n_tokens > 0 && tokens == nullptr) return invalid_argument("tokens is NULL");
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab_) {
            return out_of_range("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                " is outside [0, n_vocab = " + std::to_string(n_vocab_) + ")");
        }
    }
    const int32_t last_n = params_.repeat_last_n;
    if (last_n == 0) return Status::ok();
    for (int32_t i = 0; i < n_tokens; ++i) {
        ++counts_[tokens[i]];
        if (last_n < 0) continue;  // every token counts; no window to slide
        window_.push_back(tokens[i]);
        if (window_.size() > static_cast<size_t>(last_n)) {
            const auto old = counts_.find(window_.front());
            if (--old->second == 0) counts_.erase(old);
            window_.pop_front();
        }
    }
    return Status::ok();
}

void Sampler::reset() {
    window_.clear();
    counts_.clear();
    rng_.seed(seed_);
}

Status Sampler::load_logits(const float* logits, int32_t n_vocab) {
    if (logits == nullptr) return invalid_argument("logits is NULL");
    if (n_vocab != n_vocab_) {
        return invalid_argument("n_vocab (" + std::to_string(n_vocab) + ") differs from the sampler's n_vocab (" +
                                std::to_string(n_vocab_) + ")");
    }
    constexpr float kInf = std::numeric_limits<float>::infinity();
    logits_.assign(logits, logits + n_vocab);
    bool bad = false;  // NaN or +inf; a branch-free scan, the culprit is looked for only when there is one
    for (const float l : logits_) bad |= !(l < kInf);
    if (bad) {
        const auto i = std::find_if(logits_.begin(), logits_.end(), [](float l) { return !(l < kInf); }) - logits_.begin();
        return invalid_argument("logits[" + std::to_string(i) + "] is " + num(logits_[static_cast<size_t>(i)]) +
                                " (logits must be finite or -inf)");
    }

    const moe_sampler_params& p = params_;
    if (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
        for (const auto& [token, count] : counts_) {
            float& l = logits_[static_cast<size_t>(token)];
            l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
            l -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
        }
    }
    for (const auto& [token, bias] : bias_) logits_[static_cast<size_t>(token)] += bias;
    // Only these tokens changed; +inf can come from a finite logit overflowing float here.
    const auto overflowed = [&](int32_t token) -> Status {
        if (logits_[static_cast<size_t>(token)] < kInf) return Status::ok();
        return invalid_argument("the logit of token " + std::to_string(token) +
                                " overflows to +inf after the penalties and logit bias");
    };
    for (const auto& entry : counts_) MOE_RETURN_IF_ERROR(overflowed(entry.first));
    for (const auto& entry : bias_) MOE_RETURN_IF_ERROR(overflowed(entry.first));
    return Status::ok();
}

// The k best finite logits of logits_ into cand_, ranked, in one pass: a heap of the best k seen so far,
// whose worst entry rejects almost every later logit with one comparison.
void Sampler::gather_top_k(size_t k) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    cand_.clear();
    float worst = kNegInf;  // a later logit must beat this (an equal one has a higher id, so ranks after)
    for (size_t i = 0; i < logits_.size(); ++i) {
        const float l = logits_[i];
        if (l <= worst) continue;
        cand_.push_back({static_cast<int32_t>(i), l, 0.0});
        std::push_heap(cand_.begin(), cand_.end(), ranks_before);  // front: the worst kept
        if (cand_.size() > k) {
            std::pop_heap(cand_.begin(), cand_.end(), ranks_before);
            cand_.pop_back();
        }
        if (cand_.size() == k) worst = cand_.front().logit;
    }
    std::sort_heap(cand_.begin(), cand_.end(), ranks_before);
    order_ = Order::kRanked;
}

void Sampler::gather_all() {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    cand_.clear();
    for (size_t i = 0; i < logits_.size(); ++i) {
        if (logits_[i] != kNegInf) cand_.push_back({static_cast<int32_t>(i), logits_[i], 0.0});
    }
    order_ = Order::kById;
}

void Sampler::top_p() {
    if (params_.top_p >= 1.0f) return;
    softmax(1.0);
    const double top_p = static_cast<double>(params_.top_p);
    size_t keep = cand_.size();
    if (order_ == Order::kRanked) {
        double cum = 0.0;
        for (size_t i = 0; i < cand_.size(); ++i) {
            cum += cand_[i].p;
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
    } else {
        keep = select_mass(top_p);
        order_ = Order::kAny;
    }
    const size_t min_keep = std::min(static_cast<size_t>(std::max(params_.min_keep, 1)), cand_.size());
    if (keep < min_keep) {
        // The next best after the first `keep` fill up to min_keep.
        if (order_ != Order::kRanked) {
            const auto first = cand_.begin() + static_cast<std::ptrdiff_t>(keep);
            std::nth_element(first, cand_.begin() + static_cast<std::ptrdiff_t>(min_keep - 1), cand_.end(), ranks_before);
        }
        keep = min_keep;
    }
    cand_.resize(keep);
}

// Weighted quickselect: reorders cand_ so that its first m entries are the m best, for the smallest m
// whose probabilities sum to at least `mass` (cand_.size() when rounding leaves the total below it), and
// returns m. Expected O(n); the entries end in no particular order.
size_t Sampler::select_mass(double mass) {
    size_t lo = 0, hi = cand_.size();  // the cut lies in (lo, hi]; [0, lo) are in, with `mass` still to find
    while (lo < hi) {
        // Median of three as the pivot, moved to lo.
        const size_t mid = lo + (hi - lo) / 2;
        size_t a = lo, b = mid, c = hi - 1;
        if (ranks_before(cand_[b], cand_[a])) std::swap(a, b);
        if (ranks_before(cand_[c], cand_[b])) std::swap(b, c);
        if (ranks_before(cand_[b], cand_[a])) std::swap(a, b);
        std::swap(cand_[lo], cand_[b]);
        const SamplerCandidate pivot = cand_[lo];
        const auto split = std::partition(cand_.begin() + static_cast<std::ptrdiff_t>(lo + 1),
                                          cand_.begin() + static_cast<std::ptrdiff_t>(hi),
                                          [&](const SamplerCandidate& x) { return ranks_before(x, pivot); });
        const size_t n_better = static_cast<size_t>(split - cand_.begin()) - (lo + 1);
        // Pivot to its place: after the better ones.
        std::swap(cand_[lo], cand_[lo + n_better]);
        double better = 0.0;
        for (size_t i = lo; i < lo + n_better; ++i) better += cand_[i].p;
        const size_t pivot_at = lo + n_better;
        if (better >= mass) {
            hi = pivot_at;  // the cut lies among the better ones
        } else if (better + pivot.p >= mass) {
            return pivot_at + 1;
        } else {
            mass -= better + pivot.p;
            lo = pivot_at + 1;
        }
    }
    return hi;
}

void Sampler::min_p() {
    if (params_.min_p <= 0.0f) return;
    float max_logit = -std::numeric_limits<float>::infinity();
    for (const SamplerCandidate& c : cand_) max_logit = std::max(max_logit, c.logit);
    // p_i >= min_p * p_max  <=>  logit_i >= max_logit + ln(min_p), with no softmax needed.
    const double threshold = static_cast<double>(max_logit) + std::log(static_cast<double>(params_.min_p));
    const size_t min_keep = static_cast<size_t>(params_.min_keep);
    const size_t n_pass = static_cast<size_t>(std::count_if(
        cand_.begin(), cand_.end(), [&](const SamplerCandidate& c) { return static_cast<double>(c.logit) >= threshold; }));
    if (n_pass >= min_keep) {
        // A stable filter: whatever order cand_ has survives.
        cand_.erase(std::remove_if(cand_.begin(), cand_.end(),
                                   [&](const SamplerCandidate& c) { return static_cast<double>(c.logit) < threshold; }),
                    cand_.end());
        return;
    }
    // Too few pass: the min_keep best stay.
    const size_t keep = std::min(min_keep, cand_.size());
    if (order_ != Order::kRanked) {
        std::nth_element(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep - 1), cand_.end(), ranks_before);
        order_ = Order::kAny;
    }
    cand_.resize(keep);
}

void Sampler::softmax(double inv_temperature) {
    double max_logit = -std::numeric_limits<double>::infinity();
    for (const SamplerCandidate& c : cand_) max_logit = std::max(max_logit, static_cast<double>(c.logit));
    double sum = 0.0;
    for (SamplerCandidate& c : cand_) {
        c.p = std::exp((static_cast<double>(c.logit) - max_logit) * inv_temperature);
        sum += c.p;
    }
    for (SamplerCandidate& c : cand_) c.p /= sum;
}

Status Sampler::run_chain(const float* logits, int32_t n_vocab) {
    MOE_RETURN_IF_ERROR(load_logits(logits, n_vocab));
    if (params_.temperature <= 0.0f) {
        // Greedy: the first maximum in id order. top-k, top-p and min-p always keep the best candidate, so
        // they cannot change the answer.
        const auto best = std::max_element(logits_.begin(), logits_.end());
        if (*best == -std::numeric_limits<float>::infinity()) return invalid_argument(kAllMasked);
        cand_ = {{static_cast<int32_t>(best - logits_.begin()), *best, 1.0}};
        order_ = Order::kRanked;
        return Status::ok();
    }
    const size_t k = static_cast<size_t>(params_.top_k);
    if (k > 0 && k < logits_.size()) {
        gather_top_k(k);
    } else {
        gather_all();
    }
    if (cand_.empty()) return invalid_argument(kAllMasked);
    top_p();
    min_p();
    softmax(1.0 / static_cast<double>(params_.temperature));
    if (order_ != Order::kById) {
        std::sort(cand_.begin(), cand_.end(), [](const SamplerCandidate& a, const SamplerCandidate& b) { return a.id < b.id; });
        order_ = Order::kById;
    }
    return Status::ok();
}

Status Sampler::apply(const float* logits, int32_t n_vocab, std::vector<SamplerCandidate>* ranked) {
    MOE_RETURN_IF_ERROR(run_chain(logits, n_vocab));
    *ranked = cand_;
    // By probability; equal probabilities (equal tempered logits) by id, as rank order has it.
    std::sort(ranked->begin(), ranked->end(), [](const SamplerCandidate& a, const SamplerCandidate& b) {
        return a.p > b.p || (a.p == b.p && a.id < b.id);
    });
    return Status::ok();
}

StatusOr<int32_t> Sampler::sample(const float* logits, int32_t n_vocab) {
    MOE_RETURN_IF_ERROR(run_chain(logits, n_vocab));
    if (params_.temperature <= 0.0f) return cand_[0].id;  // greedy: the PRNG does not move
    // Every other draw takes exactly one PRNG output, however many candidates are left, so that the k-th
    // draw since creation or reset always uses the k-th output. u in [0, 1) from its top 53 bits: the same
    // on every platform, unlike std::uniform_real_distribution, whose algorithm the standard leaves open.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    double total = 0.0;
    for (const SamplerCandidate& c : cand_) total += c.p;
    const double target = u * total;
    double cum = 0.0;
    for (const SamplerCandidate& c : cand_) {
        cum += c.p;
        if (cum > target) return c.id;
    }
    return cand_.back().id;  // rounding left target at the very end of the sum
}

}  // namespace moe
