#include "sched/expert_splitter.h"

#include <algorithm>
#include <cmath>

namespace moe::sched {

void SplitTiming::record(Clock::time_point t_wait, Clock::time_point t_start, double seconds, int layer) {
    const double wait = std::chrono::duration<double>(t_start - t_wait).count();
    min_wait_seconds = host_flushes == 0 ? wait : std::min(min_wait_seconds, wait);
    if (host_flushes == 0) {
        first_start = t_wait;
        first_layer = layer;
    }
    if (host_flushes == 0 || layer != last_layer) ++host_layers;
    last_end = Clock::now();
    last_layer = layer;
    wait_seconds += wait;
    host_seconds += seconds;
    ++host_flushes;
}

ExpertSplitter::ExpertSplitter(bool has_device, const WeightTable& weights, const Policy& policy,
                               const Assignment& assignment, int n_layer, int n_expert, int n_expert_used)
    : has_device_(has_device),
      weights_(weights),
      policy_(policy),
      assignment_(assignment),
      n_layer_(n_layer),
      n_expert_(n_expert),
      n_expert_used_(n_expert_used) {}

// How many experts of `layer` the host takes (order: the layer's experts, fewest expected tokens
// first): the count that minimises the slower of the two parts, the host's (the device's latency and
// the host's own work between host parts, then its pairs) and the upload of the device's experts
// (which the device computes under).
// *expected_pairs: the (token, expert) pairs the host is expected to compute with that count.
int ExpertSplitter::choose_host_experts(int layer, int n_tokens, std::vector<int32_t>& order, double* expected_pairs) const {
    const size_t n = static_cast<size_t>(n_expert_);
    const double uniform = static_cast<double>(n_tokens) * n_expert_used_ / n_expert_;
    std::vector<double> expected(n, uniform);
    if (last_counts_tokens_ > 0 && !last_counts_.empty()) {
        // Halfway between the last prompt ubatch's count and the mean: the least used experts of one
        // ubatch are only partly the least used of the next (all of them regress to the mean under
        // uniform routing; a trained router keeps much of its skew).
        const double scale = static_cast<double>(n_tokens) / last_counts_tokens_;
        for (size_t e = 0; e < n; ++e) {
            expected[e] = 0.5 * (uniform + scale * last_counts_[static_cast<size_t>(layer) * n + e]);
        }
    }
    order.resize(n);
    for (size_t e = 0; e < n; ++e) order[e] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return expected[a] < expected[b]; });
    auto pairs_of = [&](int m) {
        double p = 0.0;
        for (int j = 0; j < m; ++j) p += expected[static_cast<size_t>(order[static_cast<size_t>(j)])];
        return p;
    };
    if (policy_.expert_split != kExpertSplitAuto) {
        const int m = std::min(policy_.expert_split, n_expert_ - 1);
        *expected_pairs = pairs_of(m);
        return m;
    }

    size_t bytes = 0;
    double flops = 0.0;
    for (const Tensor* w : weights_.expert_matrices(layer)) {
        bytes += w->nb[2];
        flops += 2.0 * static_cast<double>(w->ne[0]) * static_cast<double>(w->ne[1]);
    }
    // Until a split has measured the host: the host's rate at prompt sizes from the context's calibration
    // (an expert's bytes at that rate), else 1 TFLOP/s, what a 16-core AVX-512 machine sustains here.
    // Without a first guess near the truth a host slower than that is sent into split trials that lose,
    // and a faster one (AMX) is never given a split, so never measured. The measurement is per expected
    // pair, so it also corrects the expectation's bias.
    const double prefill_gbps = assignment_.calibration().host_prefill_gbps;
    const double per_pair = host_s_per_pair_ > 0.0 ? host_s_per_pair_
                            : prefill_gbps > 0.0   ? static_cast<double>(bytes) / (prefill_gbps * 1e9)
                                                   : flops / 1e12;
    const double per_upload = upload_s_per_byte_ * static_cast<double>(bytes);
    // Without a split the layer uploads every expert (FULL) or about those the router picks (the ACTIVE
    // copies; expected distinct experts under uniform routing), and the split's device part the same
    // share of its group. A split must save at least 5% of that: it also costs activation copies, an
    // extra add and a host thread that cannot queue ahead while it computes.
    double share = 1.0;
    if (copies_active_experts(policy_, n_expert_used_, n_tokens, n_expert_)) {
        const double miss = 1.0 - static_cast<double>(n_expert_used_) / n_expert_;
        share = 1.0 - std::pow(miss, static_cast<double>(n_tokens));
    }
    double best = 0.95 * per_upload * n_expert_ * share;
    int best_m = 0;
    double pairs = 0.0;
    for (int m = 1; m < n_expert_; ++m) {
        pairs += expected[static_cast<size_t>(order[static_cast<size_t>(m - 1)])];
        const double t = std::max(host_serial_s_ + per_pair * pairs, per_upload * share * (n_expert_ - m));
        if (t < best) {
            best = t;
            best_m = m;
        }
    }
    *expected_pairs = pairs_of(best_m);
    return best_m;
}

StatusOr<ExpertSplitPlan> ExpertSplitter::plan(int n_tokens, bool profiling, Transfers& transfers) {
    split_ = ExpertSplitPlan{};
    timed_ = false;
    expected_pairs_ = 0.0;  // host parts of a ubatch without this split (partly resident layers) teach nothing
    if (!has_device_ || policy_.expert_split == 0 || n_expert_ < 2 || n_layer_ <= 0) return split_;
    for (OffloadOp op : {OffloadOp::MOE_UP_GATE, OffloadOp::MUL_MAT_ID}) {
        if (!policy_.rule(op).enabled || n_tokens < assignment_.min_batch(op)) return split_;
    }
    ExpertSplitPlan p;
    p.layers.assign(static_cast<size_t>(n_layer_), 0);
    p.groups.assign(static_cast<size_t>(n_layer_) * static_cast<size_t>(n_expert_), kDeviceExpertGroup);
    struct LayerChoice {
        int layer;
        int m;
        std::vector<int32_t> order;  // the layer's experts, fewest expected tokens first
        double pairs;
    };
    std::vector<LayerChoice> choices;
    int wanted = 0;
    for (int il = 0; il < n_layer_; ++il) {
        if (!weights_.experts_host_only(il)) continue;
        if (policy_.expert_split == kExpertSplitAuto) {
            MOE_ASSIGN_OR_RETURN(upload_s_per_byte_, transfers.upload_seconds_per_byte());
        }
        LayerChoice c{il, 0, {}, 0.0};
        c.m = choose_host_experts(il, n_tokens, c.order, &c.pairs);
        wanted += c.m > 0;
        choices.push_back(std::move(c));
    }
    // Automatic: all splittable layers or none. Splitting a few layers only is not worth it, and a set
    // of split layers that changes from ubatch to ubatch changes the graph's shape (new plans, new CUDA
    // graph captures); layers whose own balance wants no split give the host their least used expert.
    const bool automatic = policy_.expert_split == kExpertSplitAuto;
    if (wanted == 0 || (automatic && 2 * wanted < static_cast<int>(choices.size()))) return split_;
    if (automatic) {
        // The model leaves out costs it cannot see (activation copies, the host thread that stops queueing
        // work while it computes): timed ubatches with and without the split have the last word.
        // While profiling (per-op synchronisation would skew the samples) no trial runs: a verdict if
        // there is one, else the model's choice.
        const SplitTrials::Choice c =
            profiling ? SplitTrials::Choice{trials_.verdict(n_tokens).value_or(true), false} : trials_.choose(n_tokens);
        timed_ = c.timed;
        timed_on_ = c.split;
        if (!c.split) return split_;
    }
    uint64_t host_experts = 0;
    double expected_pairs = 0.0;
    for (LayerChoice& c : choices) {
        if (c.m <= 0) {
            if (!automatic) continue;
            c.m = 1;
            c.pairs = 0.0;  // left out of the learned host cost (which then errs high)
        }
        p.layers[static_cast<size_t>(c.layer)] = 1;
        int32_t* g = p.groups.data() + static_cast<size_t>(c.layer) * static_cast<size_t>(n_expert_);
        for (int j = 0; j < c.m; ++j) g[c.order[static_cast<size_t>(j)]] = kHostExpertGroup;
        host_experts += static_cast<uint64_t>(c.m);
        expected_pairs += c.pairs;
    }
    p.n_layers = static_cast<uint64_t>(std::count(p.layers.begin(), p.layers.end(), uint8_t{1}));
    p.n_host_experts = host_experts;
    split_ = std::move(p);
    expected_pairs_ = expected_pairs;
    return split_;
}

void ExpertSplitter::finish(const SplitTiming& timing, int n_tokens, double seconds, bool fair, bool profiling,
                            Stats& stats) {
    // Per-op synchronisation (profiling) would skew every term.
    if (!profiling) learn(timing);
    if (timed_) {
        // A ubatch that allocated arenas or slots paid one-off costs: not a fair sample (the trial
        // asks for the same side again).
        if (fair) trials_.record(n_tokens, timed_on_, seconds);
        ++stats.n_split_trials;
    }
    // Counted once the split ran (the graph of the plan), not when it was planned.
    stats.n_split_layers += split_.n_layers;
    stats.n_split_host_experts += split_.n_host_experts;
    split_.n_layers = split_.n_host_experts = 0;
}

// Folds this ubatch's host-part measurements into the costs the next split balances.
void ExpertSplitter::learn(const SplitTiming& timing) {
    if (timing.host_flushes == 0 || expected_pairs_ <= 0.0) return;
    const double per_pair = timing.host_seconds / expected_pairs_;
    // What the host's side of a split layer costs besides its expert pairs: the device's latency from
    // the host's result to the next layer's inputs (the shortest wait: the longer ones also wait for
    // uploads, which the balance counts on the other side) and the host's own work between two host
    // parts (queueing the device's nodes and uploads, bookkeeping), which no wait shows.
    // The second term only over consecutive split layers (a layer that does not split in between adds
    // device work that is not the host's); a layer's host part may take several flushes.
    double serial = timing.min_wait_seconds;
    const int layers = timing.host_layers;
    if (layers >= 2 && timing.last_layer - timing.first_layer == layers - 1) {
        const double span = std::chrono::duration<double>(timing.last_end - timing.first_start).count();
        serial += std::max(0.0, span - timing.host_seconds - timing.wait_seconds) / (layers - 1);
    }
    const bool first = host_s_per_pair_ <= 0.0;
    host_s_per_pair_ = first ? per_pair : 0.5 * (host_s_per_pair_ + per_pair);
    host_serial_s_ = first ? serial : 0.5 * (host_serial_s_ + serial);
}

void ExpertSplitter::observe_counts(std::vector<uint32_t> counts, int n_tokens) {
    // A prompt ubatch predicts the next prompt ubatch (decode steps do not).
    if (n_tokens < n_expert_) return;
    last_counts_ = std::move(counts);
    last_counts_tokens_ = n_tokens;
}

}  // namespace moe::sched
