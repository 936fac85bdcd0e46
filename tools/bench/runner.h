// The two measurement loops of moeinfer-bench, on a moe_context:
//  - sweep (llama-sweep-bench): at N_KV = 0, PP, 2*PP, ... time TG single-token decodes from depth N_KV,
//    then a PP-token prefill that also starts at N_KV (its positions rewind over the TG tokens), which
//    leaves exactly the next row's N_KV tokens in the cache: no re-decoding between rows.
//  - tests (llama-bench): pp<N> / tg<N> at depth d, one untimed warm-up, then -r timed repetitions,
//    each from an emptied cache refilled (untimed) to depth d.
// Warm-ups repeat while the automatic expert split still times trial ubatches (at most 8).
// Token ids are random (seeded) in [0, n_vocab): timings of MoE models depend on the routing, and
// random tokens spread it as real text roughly does.
#ifndef MOEINFER_TOOLS_BENCH_RUNNER_H
#define MOEINFER_TOOLS_BENCH_RUNNER_H

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "output.h"

namespace bench {

// A one-line status on stderr, redrawn in place; cleared before anything else is printed.
class Progress {
public:
    explicit Progress(bool enabled) : enabled_(enabled) {}

    void show(const std::string& text, bool force = false) {
        if (!enabled_) return;
        const auto now = std::chrono::steady_clock::now();
        if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;  // cheap on per-token calls
        std::fprintf(stderr, "\r\033[Kmoeinfer-bench: %s", text.c_str());
        std::fflush(stderr);
        shown_ = true;
        last_ = now;
    }

    bool enabled() const { return enabled_; }

    void clear() {
        if (!enabled_ || !shown_) return;
        std::fprintf(stderr, "\r\033[K");
        std::fflush(stderr);
        shown_ = false;
    }

private:
    bool enabled_;
    bool shown_ = false;
    std::chrono::steady_clock::time_point last_{};
};

class Runner {
public:
    Runner(moe_context* ctx, int32_t n_vocab, const Config& cfg, const RunInfo& info, Printer& printer,
           Progress& progress)
        : ctx_(ctx), cfg_(cfg), info_(info), printer_(printer), progress_(progress), rng_(cfg.seed),
          token_(0, n_vocab - 1) {}

    std::optional<Failure> sweep() {
        const int32_t pp = cfg_.sweep_pp;
        const int32_t tg = cfg_.sweep_tg;
        int32_t n_rows = 0;
        for (int64_t n_kv = 0; n_kv + std::max(pp, tg) <= cfg_.n_ctx; n_kv += pp) ++n_rows;

        if (cfg_.warmup) {
            progress_.show("warm-up", true);
            // Both graph shapes once; the prefill rewinds over the single token, so both fit any n_ctx.
            if (auto f = decode_random(1, 0, "warm-up decode")) return f;
            if (auto f = warm_up_until_settled([&] { return decode_random(pp, 0, "warm-up prefill"); })) return f;
        }
        if (moe_kv_clear(ctx_) != MOE_STATUS_OK) return library_error("moe_kv_clear");

        progress_.clear();
        printer_.begin_sweep(info_);
        for (int32_t row = 0; row < n_rows; ++row) {
            const int32_t n_kv = row * pp;
            SweepRow r{pp, tg, n_kv, 0.0, 0.0, {}, {}, {}};
            const std::string where = "sweep row " + std::to_string(row + 1) + "/" + std::to_string(n_rows) +
                                      " (N_KV = " + std::to_string(n_kv) + ")";
            if (auto f = start_profile()) return f;

            // The cache holds exactly n_kv tokens here (the previous row's prefill ends at n_kv).
            if (auto f = start_stats()) return f;
            const auto t_tg = Clock::now();
            for (int32_t i = 0; i < tg; ++i) {
                if (progress_.enabled()) {  // no string building inside the timing when off
                    progress_.show(where + ": TG " + std::to_string(i + 1) + "/" + std::to_string(tg));
                }
                if (auto f = decode_random(1, n_kv + i, "decode at N_KV = " + std::to_string(n_kv))) return f;
            }
            if (auto f = touch_logits()) return f;
            r.t_tg = seconds_since(t_tg);
            if (auto f = collect_stats(r.tg_stats)) return f;

            progress_.show(where + ": PP " + std::to_string(pp), true);
            if (auto f = start_stats()) return f;
            const auto t_pp = Clock::now();
            if (auto f = decode_random(pp, n_kv, "prefill at N_KV = " + std::to_string(n_kv))) return f;
            if (auto f = touch_logits()) return f;
            r.t_pp = seconds_since(t_pp);
            if (auto f = collect_stats(r.pp_stats)) return f;

            if (auto f = collect_profile(r.profile)) return f;
            progress_.clear();
            printer_.sweep_row(info_, r);
            show_profile(r.profile, "TG " + std::to_string(tg) + " + PP " + std::to_string(pp) + " at N_KV = " +
                                        std::to_string(n_kv));
        }
        progress_.clear();
        printer_.end(info_);
        return std::nullopt;
    }

    std::optional<Failure> tests() {
        std::vector<BenchRow> plan;
        for (int32_t p : cfg_.n_prompt) {
            for (int32_t d : cfg_.n_depth) {
                if (p > 0) plan.push_back(BenchRow{p, 0, d, {}, {}, {}});
            }
        }
        for (int32_t n : cfg_.n_gen) {
            for (int32_t d : cfg_.n_depth) {
                if (n > 0) plan.push_back(BenchRow{0, n, d, {}, {}, {}});
            }
        }
        printer_.begin_bench(info_);
        for (size_t t = 0; t < plan.size(); ++t) {
            BenchRow& r = plan[t];
            const std::string name = test_name(r);
            const std::string where = "test " + std::to_string(t + 1) + "/" + std::to_string(plan.size()) + " " + name;
            if (cfg_.warmup) {
                progress_.show(where + ": warm-up", true);
                double ignored = 0.0;
                if (auto f = warm_up_until_settled([&] { return run_test(r, false, ignored, nullptr); })) return f;
            }
            for (int32_t rep = 0; rep < cfg_.repetitions; ++rep) {
                progress_.show(where + ": run " + std::to_string(rep + 1) + "/" + std::to_string(cfg_.repetitions),
                               true);
                // Only the last repetition is profiled: the counters cannot be paused while the
                // cache is refilled to depth between repetitions.
                const bool profile = cfg_.verbose && rep + 1 == cfg_.repetitions;
                double s = 0.0;
                if (auto f = run_test(r, profile, s, &r.stats)) return f;
                r.samples_s.push_back(s);
            }
            if (auto f = collect_profile(r.profile)) return f;
            progress_.clear();
            printer_.bench_row(info_, r);
            show_profile(r.profile, name + " (last run)");
        }
        progress_.clear();
        printer_.end(info_);
        return std::nullopt;
    }

    // Tokens per (layer, expert) over every timed phase: counts[layer * n_expert + expert] (empty
    // unless --expert-counts or --plot).
    const std::vector<uint64_t>& expert_counts() const { return expert_counts_; }

private:
    using Clock = std::chrono::steady_clock;

    static double seconds_since(Clock::time_point t0) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
    }

    // n random tokens at positions first_pos, first_pos + 1, ..., in moe_decode calls of --batch-size
    // tokens (one call without it); the library splits each call into ubatches. A first_pos below
    // n_past rewinds the sequence there.
    std::optional<Failure> decode_random(int32_t n, int32_t first_pos, const std::string& what) {
        tokens_.resize(static_cast<size_t>(n));
        positions_.resize(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) {
            tokens_[static_cast<size_t>(i)] = token_(rng_);
            positions_[static_cast<size_t>(i)] = first_pos + i;
        }
        const int32_t batch = cfg_.n_batch > 0 ? cfg_.n_batch : n;
        for (int32_t done = 0; done < n; done += batch) {
            const int32_t count = std::min(batch, n - done);
            const auto at = static_cast<size_t>(done);
            if (moe_decode(ctx_, tokens_.data() + at, positions_.data() + at, count, 0) != MOE_STATUS_OK) {
                progress_.clear();
                return library_error(what + " (" + std::to_string(count) + " tokens at position " +
                                     std::to_string(first_pos + done) + ")");
            }
        }
        return std::nullopt;
    }

    // Reads the logits back, so a timing never ends before the result a caller would use exists.
    std::optional<Failure> touch_logits() {
        const float* logits = nullptr;
        int32_t rows = 0;
        int32_t vocab = 0;
        if (moe_get_logits(ctx_, &logits, &rows, &vocab) != MOE_STATUS_OK) return library_error("moe_get_logits");
        return std::nullopt;
    }

    // One run of a test: empty the cache, fill it to depth (untimed), then time the test itself;
    // `stats`, when given, receives the scheduler statistics of the timed part.
    std::optional<Failure> run_test(const BenchRow& r, bool profile, double& seconds, SchedStats* stats) {
        if (moe_kv_clear(ctx_) != MOE_STATUS_OK) return library_error("moe_kv_clear");
        if (r.n_depth > 0) {
            if (auto f = decode_random(r.n_depth, 0, "filling the cache to depth " + std::to_string(r.n_depth))) return f;
        }
        if (profile) {
            if (auto f = start_profile()) return f;
        }
        if (stats != nullptr) {
            if (auto f = start_stats()) return f;
        }
        const std::string what = test_name(r);
        const auto t0 = Clock::now();
        if (r.n_gen == 0) {
            if (auto f = decode_random(r.n_prompt, r.n_depth, what)) return f;
        } else {
            for (int32_t i = 0; i < r.n_gen; ++i) {
                if (auto f = decode_random(1, r.n_depth + i, what)) return f;
            }
        }
        if (auto f = touch_logits()) return f;
        seconds = seconds_since(t0);
        if (stats != nullptr) return collect_stats(*stats);
        return std::nullopt;
    }

    // Runs a warm-up, again while it timed trial ubatches of the automatic expert split (up to
    // kMaxWarmups runs), so that the timed runs measure the split's decision, not its trials.
    template <class Run>
    std::optional<Failure> warm_up_until_settled(Run run) {
        constexpr int kMaxWarmups = 8;  // a trial takes 4 timed ubatches, plus those that allocate
        for (int w = 0; w < kMaxWarmups; ++w) {
            uint64_t before = 0, after = 0;
            if (auto f = split_trials(before)) return f;
            if (auto f = run()) return f;
            if (auto f = split_trials(after)) return f;
            if (after == before) return std::nullopt;
        }
        std::fprintf(stderr, "moeinfer-bench: the automatic expert split still timed trial ubatches after %d "
                             "warm-ups; the timed runs may include some\n", kMaxWarmups);
        return std::nullopt;
    }

    std::optional<Failure> split_trials(uint64_t& n) {
        moe_sched_stats s{};
        s.struct_size = sizeof s;
        if (moe_context_get_stats(ctx_, &s) != MOE_STATUS_OK) return library_error("moe_context_get_stats");
        n = s.n_split_trials;
        return std::nullopt;
    }

    // Zeroes the scheduler statistics (and expert counts) before a timed phase.
    std::optional<Failure> start_stats() {
        if (moe_context_reset_stats(ctx_) != MOE_STATUS_OK) return library_error("moe_context_reset_stats");
        return std::nullopt;
    }

    // Adds the statistics of the phase since start_stats() to `out`, and its expert counts to the totals.
    std::optional<Failure> collect_stats(SchedStats& out) {
        moe_sched_stats s{};
        s.struct_size = sizeof s;
        if (moe_context_get_stats(ctx_, &s) != MOE_STATUS_OK) return library_error("moe_context_get_stats");
        out.add(s);
        int32_t n_devices = 0;
        if (moe_context_get_n_devices(ctx_, &n_devices) != MOE_STATUS_OK) return library_error("moe_context_get_n_devices");
        for (int32_t d = 0; d < n_devices && n_devices > 1; ++d) {
            moe_sched_stats ds{};
            ds.struct_size = sizeof ds;
            if (moe_context_get_device_stats(ctx_, d, &ds) != MOE_STATUS_OK) {
                return library_error("moe_context_get_device_stats");
            }
            out.add_device(static_cast<size_t>(d), ds);
        }
        if (!cfg_.expert_counts && cfg_.plot_path.empty() && cfg_.expert_profile.empty()) return std::nullopt;
        int64_t n = 0;
        if (moe_context_get_expert_counts(ctx_, nullptr, 0, &n) != MOE_STATUS_OK) {
            return library_error("moe_context_get_expert_counts");
        }
        counts_.assign(static_cast<size_t>(n), 0);
        if (n > 0 && moe_context_get_expert_counts(ctx_, counts_.data(), n, &n) != MOE_STATUS_OK) {
            return library_error("moe_context_get_expert_counts");
        }
        if (expert_counts_.size() != counts_.size()) expert_counts_.assign(counts_.size(), 0);
        for (size_t i = 0; i < counts_.size(); ++i) expert_counts_[i] += counts_[i];
        return std::nullopt;
    }

    // Resets the per-op counters (moe_context_set_profiling resets them when it turns them on).
    std::optional<Failure> start_profile() {
        if (!cfg_.verbose) return std::nullopt;
        if (moe_context_set_profiling(ctx_, 1) != MOE_STATUS_OK) return library_error("moe_context_set_profiling");
        return std::nullopt;
    }

    // Copies the per-op counters out (nothing unless --verbose).
    std::optional<Failure> collect_profile(std::vector<ProfileEntry>& out) {
        if (!cfg_.verbose) return std::nullopt;
        int32_t n = 0;
        if (moe_context_get_profile(ctx_, nullptr, 0, &n) != MOE_STATUS_OK) {
            return library_error("moe_context_get_profile");
        }
        std::vector<moe_op_profile> entries(static_cast<size_t>(n));
        if (n > 0 && moe_context_get_profile(ctx_, entries.data(), n, &n) != MOE_STATUS_OK) {
            return library_error("moe_context_get_profile");
        }
        out.clear();
        for (int32_t i = 0; i < n && i < static_cast<int32_t>(entries.size()); ++i) {
            const moe_op_profile& e = entries[static_cast<size_t>(i)];
            out.push_back(ProfileEntry{e.op != nullptr ? e.op : "?", e.backend != nullptr ? e.backend : "?", e.count,
                                       e.seconds});
        }
        return std::nullopt;
    }

    // Prints a row's profile on stderr, after the row itself (stdout is flushed first so that a
    // terminal shows them in order).
    void show_profile(const std::vector<ProfileEntry>& profile, const std::string& title) {
        if (!cfg_.verbose) return;
        std::fflush(stdout);
        print_profile(stderr, title, profile);
    }

    moe_context* ctx_;
    const Config& cfg_;
    const RunInfo& info_;
    Printer& printer_;
    Progress& progress_;
    std::mt19937_64 rng_;
    std::uniform_int_distribution<int32_t> token_;
    std::vector<int32_t> tokens_;
    std::vector<int32_t> positions_;
    std::vector<uint64_t> counts_;         // one phase's expert counts (scratch)
    std::vector<uint64_t> expert_counts_;  // summed over the timed phases
};

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_RUNNER_H
