// Result records of moeinfer-bench and their three printers: text (markdown tables laid out like
// llama-sweep-bench's and llama-bench's), CSV (one header line, one line per row) and JSON (an array
// of one object per row). Printers only format: they never time or decode anything.
#ifndef MOEINFER_TOOLS_BENCH_OUTPUT_H
#define MOEINFER_TOOLS_BENCH_OUTPUT_H

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moeinfer/moeinfer.h"

namespace bench {

enum class OutputFormat { text, csv, json };

// What every row shares: the model and the context it ran with.
struct RunInfo {
    std::string model;       // "qwen3moe 1.21B Q8_0"
    std::string model_path;
    uint64_t size_bytes = 0; // tensor data
    uint64_t n_params = 0;
    std::string backend;     // "CPU"
    int32_t n_threads = 0;
    int32_t n_ctx = 0;
    int32_t n_ubatch = 0;
    std::string version;     // moe_version()

    // Appended to every CSV / JSON record, after the fields above.
    int32_t n_batch = 0;     // tokens per moe_decode call of a prefill; 0 = the whole prefill
    bool device_context = false;  // cuda or emulated: placement and policy apply
    std::string tensor_overrides;
    int32_t n_cpu_moe = 0;
    int32_t n_gpu_layers = -1;
    uint64_t vram_budget = 0;
    std::string offload_policy;   // the effective policy as an --offload-policy spec
    // The thresholds' sources per op (moe_sched_stats.offload_min_batch_source) and, where measured, what
    // they came from: "mul_mat=measured,...; link 25.1 GB/s, host mul_mat 812 GB/s, ..."
    std::string offload_thresholds;
    std::string backend_options;  // --backend-options as given
    std::string expert_copy;      // "full", "active", "prefetch" or "auto"
    bool bias_dup = true;
    uint64_t offload_vram_budget = 0;
    int32_t expert_split = MOE_EXPERT_SPLIT_AUTO;
    uint64_t weights_host_bytes = 0;    // placement (moe_sched_stats)
    uint64_t weights_device_bytes = 0;
    // The context's devices (moe_context_get_device_info, with each one's placement figures); with more
    // than one, the records carry their figures and statistics device by device ("dev<i>_...").
    struct Device {
        int32_t ordinal = 0;
        int32_t n_layers = 0;
        uint64_t weights_host_bytes = 0;
        uint64_t weights_device_bytes = 0;
    };
    std::vector<Device> devices;
};

// moe_sched_stats of one measured phase, summed over its timed runs (the placement figures are in RunInfo).
struct SchedStats {
    uint64_t n_runs = 0;  // moe_sched_stats added
#define MOE_BENCH_DECLARE(type, name, dims) type name dims{};
    MOE_SCHED_STATS_COUNTERS(MOE_BENCH_DECLARE)
#undef MOE_BENCH_DECLARE
    // A context over several devices: each device's (moe_context_get_device_stats), in its list's order.
    std::vector<SchedStats> devices;

    void add(const moe_sched_stats& s) {
        ++n_runs;
        accumulate(s);
    }
    void add(const SchedStats& o) {
        n_runs += o.n_runs;
        accumulate(o);
        if (devices.size() < o.devices.size()) devices.resize(o.devices.size());
        for (size_t d = 0; d < o.devices.size(); ++d) devices[d].add(o.devices[d]);
    }
    // Device d's statistics of one run, added.
    void add_device(size_t d, const moe_sched_stats& s) {
        if (devices.size() <= d) devices.resize(d + 1);
        devices[d].add(s);
    }

    // Weight bytes sent to the device: whole tensors plus ACTIVE_ONLY expert slices.
    uint64_t bytes_uploaded() const { return bytes_weights_full + bytes_weights_experts; }
    double per_ubatch(double total) const { return n_ubatches > 0 ? total / static_cast<double>(n_ubatches) : 0.0; }
    // `bytes` over the ubatches' wall time, in GB/s (1e9).
    double gbps(double bytes) const { return seconds_total > 0.0 ? bytes / seconds_total / 1e9 : 0.0; }
    // Upload rate: compare with the PCIe bandwidth.
    double upload_gbps() const { return gbps(static_cast<double>(bytes_uploaded())); }

private:
    template <class T>
    static void add_field(T& dst, T src) {
        dst += src;
    }
    template <class T, size_t N>
    static void add_field(T (&dst)[N], const T (&src)[N]) {
        for (size_t i = 0; i < N; ++i) dst[i] += src[i];
    }
    // S: moe_sched_stats or SchedStats (the same counters, MOE_SCHED_STATS_COUNTERS).
    template <class S>
    void accumulate(const S& s) {
#define MOE_BENCH_ADD(type, name, dims) add_field(name, s.name);
        MOE_SCHED_STATS_COUNTERS(MOE_BENCH_ADD)
#undef MOE_BENCH_ADD
    }
};

// "mul_mat", ... (moe_offload_op_name), "op<N>" for an op this build does not name.
inline std::string offload_op_name(int op) {
    const char* name = moe_offload_op_name(op);
    return name != nullptr ? name : "op" + std::to_string(op);
}

// One op kind's share of a test's time (moe_op_profile, copied).
struct ProfileEntry {
    std::string op;
    std::string backend;
    int64_t count = 0;
    double seconds = 0.0;
};

// A sweep row: `tg` single-token decodes and one `pp`-token prefill, both starting at depth n_kv.
struct SweepRow {
    int32_t pp = 0;
    int32_t tg = 0;
    int32_t n_kv = 0;
    double t_pp = 0.0;  // seconds
    double t_tg = 0.0;  // seconds, all tg tokens
    std::vector<ProfileEntry> profile;  // empty unless --verbose
    SchedStats pp_stats;  // of the prefill
    SchedStats tg_stats;  // of the tg single-token decodes
};

// A llama-bench row: a prefill of n_prompt tokens or n_gen single-token decodes after n_depth
// tokens already in the cache, timed `samples_s.size()` times.
struct BenchRow {
    int32_t n_prompt = 0;
    int32_t n_gen = 0;
    int32_t n_depth = 0;
    std::vector<double> samples_s;
    std::vector<ProfileEntry> profile;  // last repetition's; empty unless --verbose
    SchedStats stats;  // summed over the timed repetitions
};

// Mean and sample standard deviation (n - 1; 0 for a single value), as llama-bench reports them.
struct MeanSd {
    double mean = 0.0;
    double sd = 0.0;
};
inline MeanSd mean_sd(const std::vector<double>& v) {
    MeanSd r;
    if (v.empty()) return r;
    for (double x : v) r.mean += x;
    r.mean /= static_cast<double>(v.size());
    if (v.size() > 1) {
        double ss = 0.0;
        for (double x : v) ss += (x - r.mean) * (x - r.mean);
        r.sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
    }
    return r;
}

inline std::string test_name(const BenchRow& r) {
    std::string s = r.n_gen == 0 ? "pp" + std::to_string(r.n_prompt) : "tg" + std::to_string(r.n_gen);
    if (r.n_depth > 0) s += " @ d" + std::to_string(r.n_depth);
    return s;
}

inline std::vector<double> tokens_per_second(const BenchRow& r) {
    const double n = static_cast<double>(r.n_gen == 0 ? r.n_prompt : r.n_gen);
    std::vector<double> ts;
    for (double s : r.samples_s) ts.push_back(s > 0.0 ? n / s : 0.0);
    return ts;
}

inline double rate(int32_t tokens, double seconds) { return seconds > 0.0 ? tokens / seconds : 0.0; }

class Printer {
public:
    virtual ~Printer() = default;
    virtual void begin_sweep(const RunInfo& info) = 0;
    virtual void sweep_row(const RunInfo& info, const SweepRow& row) = 0;
    virtual void begin_bench(const RunInfo& info) = 0;
    virtual void bench_row(const RunInfo& info, const BenchRow& row) = 0;
    virtual void end(const RunInfo& info) = 0;
};

namespace detail {

inline std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

// Numbers for CSV/JSON: enough digits to round-trip timings; JSON has no NaN/Inf, so "null".
inline std::string number(double v) { return std::isfinite(v) ? fmt("%.9g", v) : "null"; }

inline std::string json_string(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

inline std::string csv_string(const std::string& s) {
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

// One record as ordered (key, value) pairs; `quoted` marks strings. CSV and JSON print the same
// scalar fields, so a CSV column always has a JSON key of the same name.
struct Field {
    std::string key;
    std::string value;
    bool quoted;
};

inline std::vector<Field> common_fields(const RunInfo& i) {
    return {{"model", i.model, true},
            {"model_path", i.model_path, true},
            {"size_bytes", std::to_string(i.size_bytes), false},
            {"n_params", std::to_string(i.n_params), false},
            {"backend", i.backend, true},
            {"n_threads", std::to_string(i.n_threads), false},
            {"n_ctx", std::to_string(i.n_ctx), false},
            {"n_ubatch", std::to_string(i.n_ubatch), false},
            {"version", i.version, true}};
}

// Run settings added after the llama-bench-like fields (placement and policy are empty / defaults
// on a CPU context).
inline std::vector<Field> run_fields(const RunInfo& i) {
    return {{"n_batch", std::to_string(i.n_batch), false},
            {"tensor_overrides", i.tensor_overrides, true},
            {"n_cpu_moe", std::to_string(i.n_cpu_moe), false},
            {"n_gpu_layers", std::to_string(i.n_gpu_layers), false},
            {"vram_budget", std::to_string(i.vram_budget), false},
            {"offload_policy", i.offload_policy, true},
            {"offload_thresholds", i.offload_thresholds, true},
            {"backend_options", i.backend_options, true},
            {"expert_copy", i.expert_copy, true},
            {"bias_dup", i.bias_dup ? "1" : "0", false},
            {"offload_vram_budget", std::to_string(i.offload_vram_budget), false},
            {"expert_split", std::to_string(i.expert_split), false},
            {"weights_host_bytes", std::to_string(i.weights_host_bytes), false},
            {"weights_device_bytes", std::to_string(i.weights_device_bytes), false}};
}

// Several devices: each one's ordinal, layers and placement ("dev1_ordinal", ...); none for one device.
inline void append_device_fields(std::vector<Field>& f, const RunInfo& i) {
    if (i.devices.size() < 2) return;
    for (size_t d = 0; d < i.devices.size(); ++d) {
        const std::string p = "dev" + std::to_string(d) + "_";
        const RunInfo::Device& dev = i.devices[d];
        f.push_back({p + "ordinal", std::to_string(dev.ordinal), false});
        f.push_back({p + "n_layers", std::to_string(dev.n_layers), false});
        f.push_back({p + "weights_host_bytes", std::to_string(dev.weights_host_bytes), false});
        f.push_back({p + "weights_device_bytes", std::to_string(dev.weights_device_bytes), false});
    }
}

// A phase's scheduler statistics as fields named prefix + the moe_sched_stats field ("sched_n_splits",
// "sched_n_offloaded_mul_mat_id", ...), plus derived "bytes_uploaded", "bytes_uploaded_per_ubatch"
// and "upload_gbps" (bytes uploaded / seconds_total, in 1e9 bytes per second).
inline void append_stats_fields(std::vector<Field>& f, const std::string& prefix, const SchedStats& s) {
    auto u = [&](const std::string& key, uint64_t v) { f.push_back({prefix + key, std::to_string(v), false}); };
    auto d = [&](const std::string& key, double v) { f.push_back({prefix + key, number(v), false}); };
    u("n_ubatches", s.n_ubatches);
    u("n_splits", s.n_splits);
    u("bytes_weights_full", s.bytes_weights_full);
    u("bytes_weights_experts", s.bytes_weights_experts);
    u("bytes_weights_skipped", s.bytes_weights_skipped);
    u("bytes_activations", s.bytes_activations);
    u("n_weight_copies", s.n_weight_copies);
    u("n_activation_copies", s.n_activation_copies);
    u("n_id_readbacks", s.n_id_readbacks);
    for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) u("n_offloaded_" + offload_op_name(op), s.n_offloaded[op]);
    for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) u("n_kept_host_" + offload_op_name(op), s.n_kept_host[op]);
    u("n_ops_host", s.n_ops_host);
    u("n_ops_device", s.n_ops_device);
    d("seconds_total", s.seconds_total);
    d("seconds_host_compute", s.seconds_host_compute);
    d("seconds_wait", s.seconds_wait);
    d("seconds_device_submit", s.seconds_device_submit);
    u("n_split_layers", s.n_split_layers);
    u("n_split_host_experts", s.n_split_host_experts);
    u("n_split_trials", s.n_split_trials);
    u("n_cache_hits", s.n_cache_hits);
    u("n_cache_misses", s.n_cache_misses);
    u("bytes_cache_saved", s.bytes_cache_saved);
    u("bytes_between_devices", s.bytes_between_devices);
    u("bytes_weights_relayed", s.bytes_weights_relayed);
    u("bytes_uploaded", s.bytes_uploaded());
    d("bytes_uploaded_per_ubatch", s.per_ubatch(static_cast<double>(s.bytes_uploaded())));
    d("upload_gbps", s.upload_gbps());
}

// Several devices: a phase's statistics device by device, as append_stats_fields with prefix + "dev<i>_"
// (zeros for a device without any: the CSV header comes from an empty row).
inline void append_device_stats_fields(std::vector<Field>& f, const std::string& prefix, const RunInfo& i,
                                       const SchedStats& s) {
    if (i.devices.size() < 2) return;
    for (size_t d = 0; d < i.devices.size(); ++d) {
        append_stats_fields(f, prefix + "dev" + std::to_string(d) + "_", d < s.devices.size() ? s.devices[d] : SchedStats{});
    }
}

inline std::vector<Field> sweep_fields(const RunInfo& info, const SweepRow& r) {
    std::vector<Field> f = common_fields(info);
    f.push_back({"pp", std::to_string(r.pp), false});
    f.push_back({"tg", std::to_string(r.tg), false});
    f.push_back({"n_kv", std::to_string(r.n_kv), false});
    f.push_back({"t_pp_s", number(r.t_pp), false});
    f.push_back({"speed_pp_tps", number(rate(r.pp, r.t_pp)), false});
    f.push_back({"t_tg_s", number(r.t_tg), false});
    f.push_back({"speed_tg_tps", number(rate(r.tg, r.t_tg)), false});
    for (Field& x : run_fields(info)) f.push_back(std::move(x));
    append_device_fields(f, info);
    append_stats_fields(f, "sched_pp_", r.pp_stats);
    append_stats_fields(f, "sched_tg_", r.tg_stats);
    append_device_stats_fields(f, "sched_pp_", info, r.pp_stats);
    append_device_stats_fields(f, "sched_tg_", info, r.tg_stats);
    return f;
}

inline std::vector<Field> bench_fields(const RunInfo& info, const BenchRow& r) {
    std::vector<Field> f = common_fields(info);
    const MeanSd s = mean_sd(r.samples_s);
    const MeanSd ts = mean_sd(tokens_per_second(r));
    f.push_back({"test", test_name(r), true});
    f.push_back({"n_prompt", std::to_string(r.n_prompt), false});
    f.push_back({"n_gen", std::to_string(r.n_gen), false});
    f.push_back({"n_depth", std::to_string(r.n_depth), false});
    f.push_back({"repetitions", std::to_string(r.samples_s.size()), false});
    f.push_back({"avg_s", number(s.mean), false});
    f.push_back({"stdev_s", number(s.sd), false});
    f.push_back({"avg_ts", number(ts.mean), false});
    f.push_back({"stdev_ts", number(ts.sd), false});
    for (Field& x : run_fields(info)) f.push_back(std::move(x));
    append_device_fields(f, info);
    append_stats_fields(f, "sched_", r.stats);
    append_device_stats_fields(f, "sched_", info, r.stats);
    return f;
}

inline std::string json_numbers(const std::vector<double>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + number(v[i]);
    return out + "]";
}

inline std::string json_profile(const std::vector<ProfileEntry>& p) {
    std::string out = "[";
    for (size_t i = 0; i < p.size(); ++i) {
        out += (i ? ", " : "") + std::string("{\"op\": ") + json_string(p[i].op) +
               ", \"backend\": " + json_string(p[i].backend) + ", \"count\": " + std::to_string(p[i].count) +
               ", \"seconds\": " + number(p[i].seconds) + "}";
    }
    return out + "]";
}

// 1536 -> "1.50 KiB".
inline std::string human_bytes(double bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t u = 0;
    while (bytes >= 1024.0 && u + 1 < std::size(units)) {
        bytes /= 1024.0;
        ++u;
    }
    return u == 0 ? fmt("%.0f B", bytes) : fmt("%.2f ", bytes) + units[u];
}

// A per-ubatch mean: "48", "1.5", "0.333".
inline std::string mean(double v) { return fmt("%.3g", v); }

// The text-mode scheduler summary: the placement and policy, then per phase (a test, or the sweep's
// PP / TG phases) what one ubatch moved and waited for, on average.
inline void print_sched_summary(FILE* out, const RunInfo& i,
                                const std::vector<std::pair<std::string, SchedStats>>& phases) {
    const std::string split = i.expert_split == MOE_EXPERT_SPLIT_AUTO ? "auto"
                              : i.expert_split == 0                   ? "off"
                                                                      : std::to_string(i.expert_split);
    std::fprintf(out, "\nscheduler: weights %s in host RAM, %s in device memory; offload %s, expert copy %s, "
                      "bias dup %s, expert split %s\n",
                 human_bytes(static_cast<double>(i.weights_host_bytes)).c_str(),
                 human_bytes(static_cast<double>(i.weights_device_bytes)).c_str(), i.offload_policy.c_str(),
                 i.expert_copy.c_str(), i.bias_dup ? "on" : "off", split.c_str());
    if (!i.offload_thresholds.empty()) std::fprintf(out, "offload thresholds: %s\n", i.offload_thresholds.c_str());
    if (i.devices.size() > 1) {
        for (size_t d = 0; d < i.devices.size(); ++d) {
            const RunInfo::Device& dev = i.devices[d];
            std::fprintf(out, "  CUDA%zu (device %d): %d layers, weights %s in host RAM, %s in device memory\n", d,
                         dev.ordinal, dev.n_layers, human_bytes(static_cast<double>(dev.weights_host_bytes)).c_str(),
                         human_bytes(static_cast<double>(dev.weights_device_bytes)).c_str());
        }
    }
    for (const auto& [name, st] : phases) {
        const auto per = [&st](double total) { return st.per_ubatch(total); };
        std::fprintf(out, "%s: %llu ubatches in %llu runs; per ubatch: %s uploaded (%s whole + %s experts, %s "
                          "skipped), %s activations, %s splits, %s id readbacks\n",
                     name.c_str(), static_cast<unsigned long long>(st.n_ubatches),
                     static_cast<unsigned long long>(st.n_runs),
                     human_bytes(per(static_cast<double>(st.bytes_uploaded()))).c_str(),
                     human_bytes(per(static_cast<double>(st.bytes_weights_full))).c_str(),
                     human_bytes(per(static_cast<double>(st.bytes_weights_experts))).c_str(),
                     human_bytes(per(static_cast<double>(st.bytes_weights_skipped))).c_str(),
                     human_bytes(per(static_cast<double>(st.bytes_activations))).c_str(),
                     mean(per(static_cast<double>(st.n_splits))).c_str(),
                     mean(per(static_cast<double>(st.n_id_readbacks))).c_str());
        std::string ops;
        for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
            ops += (op ? ", " : "") + offload_op_name(op) + " " + mean(per(static_cast<double>(st.n_offloaded[op]))) +
                   "/" + mean(per(static_cast<double>(st.n_kept_host[op])));
        }
        std::fprintf(out, "  ops with host weights, offloaded/kept on host per ubatch: %s\n", ops.c_str());
        if (st.n_split_layers > 0) {
            std::fprintf(out, "  expert split: %s layers per ubatch, %s experts per split layer on the host\n",
                         mean(per(static_cast<double>(st.n_split_layers))).c_str(),
                         mean(static_cast<double>(st.n_split_host_experts) / static_cast<double>(st.n_split_layers)).c_str());
        }
        std::fprintf(out, "  time per ubatch: %s ms (host compute %s ms, waiting for the device %s ms, handing work to "
                          "the device %s ms); upload %s GB/s\n",
                     fmt("%.3f", 1e3 * per(st.seconds_total)).c_str(),
                     fmt("%.3f", 1e3 * per(st.seconds_host_compute)).c_str(),
                     fmt("%.3f", 1e3 * per(st.seconds_wait)).c_str(),
                     fmt("%.3f", 1e3 * per(st.seconds_device_submit)).c_str(), fmt("%.2f", st.upload_gbps()).c_str());
        // Several devices: each one's share, per ubatch of the context (moe_context_get_device_stats).
        for (size_t d = 0; d < st.devices.size() && i.devices.size() > 1; ++d) {
            const SchedStats& ds = st.devices[d];
            // The upload rate per link: its own, and through the other GPUs' (upload relays).
            const double relayed = static_cast<double>(ds.bytes_weights_relayed);
            const double own = static_cast<double>(ds.bytes_uploaded()) - relayed;
            std::fprintf(out, "  CUDA%zu: per ubatch %s uploaded, %s between devices, %s ops on the device / %s on the "
                              "host, %s ms (host compute %s ms, waiting %s ms); upload %s GB/s (own link %s, relayed "
                              "through other GPUs %s)\n",
                         d, human_bytes(per(static_cast<double>(ds.bytes_uploaded()))).c_str(),
                         human_bytes(per(static_cast<double>(ds.bytes_between_devices))).c_str(),
                         mean(per(static_cast<double>(ds.n_ops_device))).c_str(),
                         mean(per(static_cast<double>(ds.n_ops_host))).c_str(),
                         fmt("%.3f", 1e3 * per(ds.seconds_total)).c_str(),
                         fmt("%.3f", 1e3 * per(ds.seconds_host_compute)).c_str(),
                         fmt("%.3f", 1e3 * per(ds.seconds_wait)).c_str(), fmt("%.2f", ds.upload_gbps()).c_str(),
                         fmt("%.2f", ds.gbps(own)).c_str(), fmt("%.2f", ds.gbps(relayed)).c_str());
        }
    }
    std::fprintf(out, "(upload GB/s = weight bytes uploaded / ubatch wall time; pinned PCIe 5.0 x16 tops out near 55 "
                      "GB/s)\n");
}

// ---- text: markdown tables ----

class TextPrinter : public Printer {
public:
    explicit TextPrinter(FILE* out) : out_(out) {}

    void begin_sweep(const RunInfo& i) override {
        std::fprintf(out_, "moeinfer-bench: %s, n_ctx = %d, n_ubatch = %d, n_threads = %d, backend = %s\n\n",
                     i.model.c_str(), i.n_ctx, i.n_ubatch, i.n_threads, i.backend.c_str());
        std::fprintf(out_, "|%6s | %6s | %6s | %8s | %8s | %8s | %8s |\n", "PP", "TG", "N_KV", "T_PP s", "S_PP t/s",
                     "T_TG s", "S_TG t/s");
        std::fprintf(out_, "|%6s-|-%6s-|-%6s-|-%8s-|-%8s-|-%8s-|-%8s-|\n", "------", "------", "------", "--------",
                     "--------", "--------", "--------");
        std::fflush(out_);
    }

    void sweep_row(const RunInfo&, const SweepRow& r) override {
        std::fprintf(out_, "|%6d | %6d | %6d | %8.3f | %8.2f | %8.3f | %8.2f |\n", r.pp, r.tg, r.n_kv, r.t_pp,
                     rate(r.pp, r.t_pp), r.t_tg, rate(r.tg, r.t_tg));
        std::fflush(out_);
        if (phases_.empty()) phases_ = {{"PP (all rows)", SchedStats{}}, {"TG (all rows)", SchedStats{}}};
        phases_[0].second.add(r.pp_stats);
        phases_[1].second.add(r.tg_stats);
    }

    // Column widths as llama-bench's: negative = left-aligned; a ':' in the rule marks right alignment.
    void begin_bench(const RunInfo&) override {
        bench_ = true;
        std::fputc('|', out_);
        for (const Column& c : kColumns) std::fprintf(out_, " %*s |", c.width, c.name);
        std::fputs("\n|", out_);
        for (const Column& c : kColumns) {
            std::fprintf(out_, " %s%s |", std::string(static_cast<size_t>(std::abs(c.width)) - 1, '-').c_str(),
                         c.width > 0 ? ":" : "-");
        }
        std::fputc('\n', out_);
        std::fflush(out_);
    }

    void bench_row(const RunInfo& i, const BenchRow& r) override {
        const MeanSd ts = mean_sd(tokens_per_second(r));
        const double gib = 1024.0 * 1024.0 * 1024.0;
        const std::string size = i.size_bytes < gib ? fmt("%.2f MiB", i.size_bytes / (1024.0 * 1024.0))
                                                    : fmt("%.2f GiB", i.size_bytes / gib);
        const std::string params = i.n_params < 1000000000ull ? fmt("%.2f M", i.n_params / 1e6)
                                                              : fmt("%.2f B", i.n_params / 1e9);
        char speed[64];
        std::snprintf(speed, sizeof speed, "%.2f ± %.2f", ts.mean, ts.sd);
        const std::string values[] = {i.model, size, params, i.backend, std::to_string(i.n_threads), test_name(r),
                                      speed};
        std::fputc('|', out_);
        for (size_t c = 0; c < std::size(kColumns); ++c) {
            // "±" is two bytes in UTF-8 but one column on screen.
            const int width = kColumns[c].width + (c + 1 == std::size(kColumns) ? 1 : 0);
            std::fprintf(out_, " %*s |", width, values[c].c_str());
        }
        std::fputc('\n', out_);
        std::fflush(out_);
        phases_.emplace_back(test_name(r), r.stats);
    }

    void end(const RunInfo& i) override {
        if (i.device_context && !phases_.empty()) print_sched_summary(out_, i, phases_);
        if (bench_) std::fprintf(out_, "\nbuild: moeinfer %s\n", i.version.c_str());
        std::fflush(out_);
    }

private:
    struct Column {
        const char* name;
        int width;
    };
    static constexpr Column kColumns[] = {{"model", -30}, {"size", 10},  {"params", 10}, {"backend", -10},
                                          {"threads", 7}, {"test", 15},  {"t/s", 20}};
    FILE* out_;
    bool bench_ = false;
    std::vector<std::pair<std::string, SchedStats>> phases_;  // for the scheduler summary
};

// ---- CSV ----

class CsvPrinter : public Printer {
public:
    explicit CsvPrinter(FILE* out) : out_(out) {}
    void begin_sweep(const RunInfo& i) override { header(sweep_fields(i, SweepRow{})); }
    void sweep_row(const RunInfo& i, const SweepRow& r) override { line(sweep_fields(i, r)); }
    void begin_bench(const RunInfo& i) override { header(bench_fields(i, BenchRow{})); }
    void bench_row(const RunInfo& i, const BenchRow& r) override { line(bench_fields(i, r)); }
    void end(const RunInfo&) override { std::fflush(out_); }

private:
    void header(const std::vector<Field>& f) {
        for (size_t i = 0; i < f.size(); ++i) std::fprintf(out_, "%s%s", i ? "," : "", f[i].key.c_str());
        std::fputc('\n', out_);
        std::fflush(out_);
    }
    void line(const std::vector<Field>& f) {
        for (size_t i = 0; i < f.size(); ++i) {
            const std::string v = f[i].quoted ? csv_string(f[i].value) : f[i].value;
            std::fprintf(out_, "%s%s", i ? "," : "", v.c_str());
        }
        std::fputc('\n', out_);
        std::fflush(out_);
    }
    FILE* out_;
};

// ---- JSON: written row by row, so an interrupted run still shows what it measured ----

class JsonPrinter : public Printer {
public:
    explicit JsonPrinter(FILE* out) : out_(out) {}
    void begin_sweep(const RunInfo&) override { std::fputs("[\n", out_); }
    void sweep_row(const RunInfo& i, const SweepRow& r) override {
        record(sweep_fields(i, r), r.profile.empty() ? "" : ", \"profile\": " + json_profile(r.profile));
    }
    void begin_bench(const RunInfo&) override { std::fputs("[\n", out_); }
    void bench_row(const RunInfo& i, const BenchRow& r) override {
        std::string extra = ", \"samples_s\": " + json_numbers(r.samples_s) +
                            ", \"samples_ts\": " + json_numbers(tokens_per_second(r));
        if (!r.profile.empty()) extra += ", \"profile\": " + json_profile(r.profile);
        record(bench_fields(i, r), extra);
    }
    void end(const RunInfo&) override {
        std::fputs(first_ ? "]\n" : "\n]\n", out_);
        std::fflush(out_);
    }

private:
    void record(const std::vector<Field>& f, const std::string& extra) {
        std::fputs(first_ ? "  {" : ",\n  {", out_);
        first_ = false;
        for (size_t i = 0; i < f.size(); ++i) {
            const std::string v = f[i].quoted ? json_string(f[i].value) : f[i].value;
            std::fprintf(out_, "%s\"%s\": %s", i ? ", " : "", f[i].key.c_str(), v.c_str());
        }
        std::fprintf(out_, "%s}", extra.c_str());
        std::fflush(out_);
    }
    FILE* out_;
    bool first_ = true;
};

}  // namespace detail

inline std::unique_ptr<Printer> make_printer(OutputFormat format, FILE* out) {
    switch (format) {
        case OutputFormat::csv: return std::make_unique<detail::CsvPrinter>(out);
        case OutputFormat::json: return std::make_unique<detail::JsonPrinter>(out);
        case OutputFormat::text: break;
    }
    return std::make_unique<detail::TextPrinter>(out);
}

// --expert-counts: per layer, how many of the n_expert experts got a token and the least / most / mean
// tokens per expert (counts[layer * n_expert + expert], summed over the timed runs).
inline void print_expert_counts(FILE* out, int32_t n_layer, int32_t n_expert, int32_t n_expert_used,
                                const std::vector<uint64_t>& counts) {
    std::fprintf(out, "\nexpert activations over the timed runs (tokens per expert; %d experts, top-%d):\n", n_expert,
                 n_expert_used);
    std::fprintf(out, "| layer |    used |      min |      max |       mean | max/mean |\n");
    std::fprintf(out, "| ----: | ------: | -------: | -------: | ---------: | -------: |\n");
    for (int32_t l = 0; l < n_layer; ++l) {
        const size_t first = static_cast<size_t>(l) * static_cast<size_t>(n_expert);
        if (first + static_cast<size_t>(n_expert) > counts.size()) break;
        uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
        int32_t used = 0;
        for (int32_t e = 0; e < n_expert; ++e) {
            const uint64_t c = counts[first + static_cast<size_t>(e)];
            lo = std::min(lo, c);
            hi = std::max(hi, c);
            sum += c;
            used += c > 0 ? 1 : 0;
        }
        const double avg = n_expert > 0 ? static_cast<double>(sum) / n_expert : 0.0;
        const std::string used_text = std::to_string(used) + "/" + std::to_string(n_expert);
        std::fprintf(out, "| %5d | %7s | %8llu | %8llu | %10.1f | %8s |\n", l, used_text.c_str(),
                     static_cast<unsigned long long>(n_expert > 0 ? lo : 0), static_cast<unsigned long long>(hi), avg,
                     avg > 0.0 ? detail::fmt("%.2f", static_cast<double>(hi) / avg).c_str() : "-");
    }
    std::fflush(out);
}

// The --verbose profile of one test, on stderr (stdout stays a clean table / CSV / JSON).
inline void print_profile(FILE* out, const std::string& title, std::vector<ProfileEntry> entries) {
    double total = 0.0;
    for (const ProfileEntry& e : entries) total += e.seconds;
    std::sort(entries.begin(), entries.end(),
              [](const ProfileEntry& a, const ProfileEntry& b) { return a.seconds > b.seconds; });
    std::fprintf(out, "profile of %s:\n  %-16s %-8s %10s %12s %7s\n", title.c_str(), "op", "backend", "count",
                 "seconds", "%");
    for (const ProfileEntry& e : entries) {
        std::fprintf(out, "  %-16s %-8s %10lld %12.6f %6.1f%%\n", e.op.c_str(), e.backend.c_str(),
                     static_cast<long long>(e.count), e.seconds, total > 0.0 ? 100.0 * e.seconds / total : 0.0);
    }
    std::fprintf(out, "  %-16s %-8s %10s %12.6f %6.1f%%\n", "total", "", "", total, total > 0.0 ? 100.0 : 0.0);
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_OUTPUT_H
