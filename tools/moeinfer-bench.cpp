// moeinfer-bench: prefill / decode throughput of a model, as llama.cpp users know it:
//  - the sweep table of llama-sweep-bench (PP | TG | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s), and
//  - llama-bench's rows (pp512, tg128, ... with -r repetitions, mean ± sd),
// as markdown text, CSV or JSON, on a GGUF file or a synthetic model (--synthetic qwen3moe:layers=4).
// Written on the public C API only, like any user of the library.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "bench/args.h"
#include "bench/bandwidth.h"
#include "bench/cli.h"
#include "bench/load_report.h"
#include "bench/open.h"
#include "bench/output.h"
#include "bench/plot.h"
#include "bench/residency.h"
#include "bench/runner.h"
#include "bench/synthetic.h"
#include "moeinfer/moeinfer.h"

namespace {

using bench::Config;
using bench::Failure;

void print_help(const std::vector<bench::Option>& options) {
    std::printf(
        "usage: moeinfer-bench [options] MODEL.gguf\n"
        "       moeinfer-bench [options] --synthetic ARCH[:key=value...]\n"
        "       moeinfer-bench --bandwidth [--device auto|cpu|cuda] [-t N] [-r N] [-o FMT]\n"
        "\n"
        "Measures prompt processing (PP, prefill) and token generation (TG, decode) speed.\n"
        "Without -p/-n/-d/-r it runs a sweep over the context, as llama-sweep-bench does; with any of them\n"
        "it runs llama-bench style tests (pp512, tg128, ...). Tokens are random ids (see --seed).\n"
        "With --bandwidth it measures memory bandwidth instead (no model): host RAM read, and with --device cuda\n"
        "host<->device copies from pinned and pageable memory.\n");
    bench::print_options(stdout, options);
    std::printf("\nsynthetic spec keys:\n");
    for (const bench::SyntheticKey& k : bench::synthetic_keys()) std::printf("  %-16s %s\n", k.name, k.help);
    std::printf("\nbackend options (--backend-options key=value,...):\n%s", moe_backend_options_help());
    std::printf(
        "\nexamples:\n"
        "  moeinfer-bench --synthetic qwen3moe:preset=tiny -c 1024 -ub 128      # a short sweep\n"
        "  moeinfer-bench -m model.gguf -p 512,2048 -n 128 -r 5 -o json\n"
        "  moeinfer-bench --bandwidth --device cuda -r 5                      # GB/s of RAM and PCIe\n"
        "  moeinfer-bench -m model.gguf -ot exps=CPU -p 512 -n 32 --plot run.png   # heat map + timeline\n"
        "\nexit status: 0 on success, 1 when the library fails (its message is printed) or --plot could not write\n"
        "its picture (the benchmark's output is complete then), 2 on bad arguments.\n");
}

// "qwen3moe 30.53B Q8_0": architecture, parameter count and expert type, like llama-bench's model column.
std::string describe(const moe_model_info& info, uint64_t n_params, int32_t expert_type) {
    char size[32];
    if (n_params >= 1000000000ull) {
        std::snprintf(size, sizeof size, "%.2fB", static_cast<double>(n_params) / 1e9);
    } else {
        std::snprintf(size, sizeof size, "%.2fM", static_cast<double>(n_params) / 1e6);
    }
    std::string d = std::string(info.architecture != nullptr ? info.architecture : "?") + " " + size;
    const char* type = expert_type >= 0 ? moe_type_name(expert_type) : nullptr;
    if (type != nullptr) {
        std::string upper = type;
        for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        d += " " + upper;
    }
    return d;
}

// Fills what every output row repeats: the model's description, size and parameter count.
std::optional<Failure> describe_model(const moe_model* model, const moe_model_info& info, bench::RunInfo& run) {
    uint64_t n_params = 0;
    int32_t expert_type = -1;
    for (int32_t i = 0; i < info.n_tensors; ++i) {
        moe_tensor_info t;
        moe_tensor_info_init(&t);
        if (moe_model_get_tensor(model, i, &t) != MOE_STATUS_OK) return bench::library_error("reading tensor table");
        uint64_t n = 1;
        for (int32_t d = 0; d < t.n_dims && d < MOE_MAX_DIMS; ++d) n *= static_cast<uint64_t>(t.ne[d]);
        n_params += n;
        if (expert_type < 0 && t.name != nullptr && std::strstr(t.name, "_exps.") != nullptr) expert_type = t.type;
    }
    run.model = describe(info, n_params, expert_type);
    run.size_bytes = info.n_bytes;
    run.n_params = n_params;
    return std::nullopt;
}

const char* backend_name(int32_t device) {
    switch (device) {
        case MOE_DEVICE_CUDA: return "CUDA";
        case MOE_DEVICE_EMULATED: return "EMULATED";
        default: return "CPU";
    }
}

// "mul_mat=32,mul_mat_id=128,moe_up_gate=off": a policy's offload rules as an --offload-policy spec.
std::string offload_spec(const moe_sched_policy& p) {
    std::string spec;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        const moe_offload_rule& r = p.offload[op];
        spec += (op ? "," : "") + bench::offload_op_name(op) + "=" +
                (r.enabled == 0 ? std::string("off") : r.min_batch < 0 ? std::string("on") : std::to_string(r.min_batch));
    }
    return spec;
}

// "mul_mat=41 measured, mul_mat_id=1210 measured, moe_up_gate=1210 measured (link 25.1 GB/s; host / device
// GB/s x tokens: mul_mat 812 / 9.01e+04, ...)": the offload thresholds in effect, where each came from and
// what the measured ones were computed from (docs/POLICY.md).
std::string threshold_summary(const moe_sched_stats& s) {
    std::string out;
    for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        const char* source = moe_threshold_source_name(s.offload_min_batch_source[op]);
        out += (op ? ", " : "") + bench::offload_op_name(op) + "=" + std::to_string(s.offload_min_batch[op]) + " " +
               (source != nullptr ? source : "?");
    }
    if (s.offload_link_gbps > 0.0) {
        out += " (link " + bench::detail::fmt("%.3g", s.offload_link_gbps) + " GB/s; host / device GB/s x tokens:";
        for (int32_t op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
            if (s.offload_host_gbps[op] <= 0.0) continue;
            out += " " + bench::offload_op_name(op) + " " + bench::detail::fmt("%.3g", s.offload_host_gbps[op]) + " / " +
                   bench::detail::fmt("%.3g", s.offload_device_gbps[op]);
        }
        if (s.offload_host_prefill_gbps > 0.0) {
            out += "; host at prompt sizes " + bench::detail::fmt("%.3g", s.offload_host_prefill_gbps);
        }
        out += ")";
    }
    return out;
}

// The placement settings, the effective policy and where the weights went, for the output records.
std::optional<Failure> describe_placement(const moe_context* ctx, const Config& cfg, bench::RunInfo& run) {
    moe_sched_stats stats{};
    stats.struct_size = sizeof stats;
    if (moe_context_get_stats(ctx, &stats) != MOE_STATUS_OK) return bench::library_error("moe_context_get_stats");
    run.weights_host_bytes = stats.weights_host_bytes;
    run.weights_device_bytes = stats.weights_device_bytes;
    int32_t n_devices = 0;
    if (moe_context_get_n_devices(ctx, &n_devices) != MOE_STATUS_OK) return bench::library_error("moe_context_get_n_devices");
    run.devices.clear();
    for (int32_t d = 0; d < n_devices; ++d) {
        moe_device_info info{};
        info.struct_size = sizeof info;
        moe_sched_stats ds{};
        ds.struct_size = sizeof ds;
        if (moe_context_get_device_info(ctx, d, &info) != MOE_STATUS_OK) {
            return bench::library_error("moe_context_get_device_info");
        }
        if (moe_context_get_device_stats(ctx, d, &ds) != MOE_STATUS_OK) {
            return bench::library_error("moe_context_get_device_stats");
        }
        run.devices.push_back({info.ordinal, info.n_layers, ds.weights_host_bytes, ds.weights_device_bytes});
    }
    if (!run.device_context) {
        run.n_gpu_layers = 0;
        return std::nullopt;
    }
    run.tensor_overrides = bench::join(cfg.tensor_overrides, ",");
    run.n_cpu_moe = cfg.n_cpu_moe;
    run.n_gpu_layers = cfg.n_gpu_layers;
    run.vram_budget = cfg.vram_budget;
    moe_sched_policy p;
    moe_sched_policy_init(&p);
    if (moe_context_get_policy(ctx, &p) != MOE_STATUS_OK) return bench::library_error("moe_context_get_policy");
    run.offload_policy = offload_spec(p);
    run.offload_thresholds = threshold_summary(stats);
    run.expert_copy = p.expert_copy == MOE_EXPERT_COPY_ACTIVE_ONLY       ? "active"
                      : p.expert_copy == MOE_EXPERT_COPY_ACTIVE_PREFETCH ? "prefetch"
                      : p.expert_copy == MOE_EXPERT_COPY_AUTO            ? "auto"
                                                                         : "full";
    run.bias_dup = p.bias_dup != 0;
    run.offload_vram_budget = p.offload_vram_budget;
    run.expert_split = p.expert_split;
    return std::nullopt;
}

std::optional<Failure> run(Config& cfg) {
    const bool live = cfg.progress.value_or(isatty(STDERR_FILENO) != 0);
    bench::Opened opened;
    if (auto f = bench::open_model_and_context(cfg, live, "moeinfer-bench", opened)) return f;
    moe_model* const model = opened.model.get();
    moe_context* const ctx = opened.ctx.get();
    const moe_model_info& info = opened.info;
    const moe_context_params& cp = opened.params;
    const int32_t device = opened.device;
    const bool device_context = device != MOE_DEVICE_CPU;
    if (cfg.verbose) {
        moe_sched_stats stats{};
        stats.struct_size = sizeof stats;
        if (moe_context_get_stats(ctx, &stats) != MOE_STATUS_OK) return bench::library_error("moe_context_get_stats");
        bench::print_load_report(opened.load_times, info.n_bytes, stats);
    }

    bench::RunInfo run;
    if (auto f = describe_model(model, info, run)) return f;
    run.model_path = cfg.model_path;
    run.backend = backend_name(device);
    run.n_threads = cp.n_threads;
    run.n_ctx = cp.n_ctx;
    run.n_ubatch = cp.n_ubatch;
    run.version = moe_version();
    run.n_batch = cfg.n_batch;
    run.backend_options = cfg.backend_options;
    run.device_context = device_context;
    if (auto f = describe_placement(ctx, cfg, run)) return f;

    const std::unique_ptr<bench::Printer> printer = bench::make_printer(cfg.output, stdout);
    bench::Progress progress(live);
    bench::Runner runner(ctx, info.n_vocab, cfg, run, *printer, progress);
    if (!cfg.plot_path.empty()) {
        if (auto f = bench::start_plot_timeline(ctx)) return f;
    }
    if (auto f = cfg.mode == bench::Mode::sweep ? runner.sweep() : runner.tests()) return f;
    if (cfg.expert_counts) {
        // stdout would break CSV / JSON; text goes under the table.
        FILE* out = cfg.output == bench::OutputFormat::text ? stdout : stderr;
        std::fflush(stdout);
        bench::print_expert_counts(out, info.n_layer, info.n_expert, info.n_expert_used, runner.expert_counts());
    }
    if (device_context && (cfg.verbose || !cfg.expert_profile.empty())) {
        std::fflush(stdout);
        if (auto f = bench::print_residency(stderr, ctx, info)) return f;
    }
    if (!cfg.expert_profile.empty() && !opened.profile_read) {
        // The timed runs' counts (the context's are reset before each test).
        const std::vector<uint64_t>& counts = runner.expert_counts();
        if (moe_model_save_expert_profile(model, counts.data(), static_cast<int64_t>(counts.size()),
                                          cfg.expert_profile.c_str()) != MOE_STATUS_OK) {
            return bench::library_error("cannot write the expert profile");
        }
        std::fprintf(stderr, "moeinfer-bench: expert profile written to %s\n", cfg.expert_profile.c_str());
    }
    if (!cfg.plot_path.empty()) {
        const std::string data = bench::plot_data_path(cfg.plot_path);
        if (auto f = bench::write_plot_data(ctx, info, run, runner.expert_counts(), data)) return f;
        if (auto f = bench::render_plot(data, cfg.plot_path)) return f;
    }
    return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
    Config cfg;
    const std::vector<bench::Option> options = bench::make_options(cfg);
    auto positional = [&cfg](const std::string& arg) -> std::optional<std::string> {
        if (!cfg.model_path.empty()) return "unexpected argument '" + arg + "' (the model is already '" + cfg.model_path + "')";
        cfg.model_path = arg;
        return std::nullopt;
    };
    std::optional<std::string> err = bench::parse_command_line(argc, argv, options, positional, cfg.given);
    if (!err && cfg.help) {
        print_help(options);
        return 0;
    }
    if (!err) err = bench::finish_config(cfg);
    if (err) {
        std::fprintf(stderr, "moeinfer-bench: %s (see --help)\n", err->c_str());
        return 2;
    }
    if (std::optional<Failure> f = cfg.mode == bench::Mode::bandwidth ? bench::run_bandwidth(cfg) : run(cfg)) {
        std::fflush(stdout);
        std::fprintf(stderr, "moeinfer-bench: %s\n", f->message.c_str());
        return f->exit_code;
    }
    return 0;
}
