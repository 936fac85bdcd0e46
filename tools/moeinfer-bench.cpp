// moeinfer-bench: prefill / decode throughput of a model, as llama.cpp users know it:
//  - the sweep table of llama-sweep-bench (PP | TG | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s), and
//  - llama-bench's rows (pp512, tg128, ... with -r repetitions, mean ± sd),
// as markdown text, CSV or JSON, on a GGUF file or a synthetic model (--synthetic qwen3moe:layers=4).
// Written on the public C API only, like any user of the library.
#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "bench/args.h"
#include "bench/bandwidth.h"
#include "bench/cli.h"
#include "bench/load_report.h"
#include "bench/output.h"
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
    std::printf(
        "\nexamples:\n"
        "  moeinfer-bench --synthetic qwen3moe:preset=tiny -c 1024 -ub 128      # a short sweep\n"
        "  moeinfer-bench -m model.gguf -p 512,2048 -n 128 -r 5 -o json\n"
        "  moeinfer-bench --bandwidth --device cuda -r 5                      # GB/s of RAM and PCIe\n"
        "\nexit status: 0 on success, 1 when the library fails (its message is printed), 2 on bad arguments.\n");
}

// CPUs this process may run on (the affinity mask, as taskset / cgroups set it).
int32_t available_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int32_t>(n) : 1;
}

struct ModelDeleter {
    void operator()(moe_model* m) const { moe_model_free(m); }
};
struct ContextDeleter {
    void operator()(moe_context* c) const { moe_context_free(c); }
};
using ModelPtr = std::unique_ptr<moe_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<moe_context, ContextDeleter>;

// user_data: what is loading ("model", "weights (locking host pages, uploading)").
int on_load_progress(float fraction, void* what) {
    std::fprintf(stderr, "\r\033[Kmoeinfer-bench: loading %s: %3d%%", static_cast<const char*>(what),
                 static_cast<int>(fraction * 100.0f));
    std::fflush(stderr);
    return 1;
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

// The placement settings, the effective policy and where the weights went, for the output records.
std::optional<Failure> describe_placement(const moe_context* ctx, const Config& cfg, bench::RunInfo& run) {
    moe_sched_stats stats{};
    stats.struct_size = sizeof stats;
    if (moe_context_get_stats(ctx, &stats) != MOE_STATUS_OK) return bench::library_error("moe_context_get_stats");
    run.weights_host_bytes = stats.weights_host_bytes;
    run.weights_device_bytes = stats.weights_device_bytes;
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
    run.expert_copy = p.expert_copy == MOE_EXPERT_COPY_ACTIVE_ONLY       ? "active"
                      : p.expert_copy == MOE_EXPERT_COPY_ACTIVE_PREFETCH ? "prefetch"
                                                                         : "full";
    run.bias_dup = p.bias_dup != 0;
    run.offload_vram_budget = p.offload_vram_budget;
    run.expert_split = p.expert_split;
    return std::nullopt;
}

std::optional<Failure> run(Config& cfg) {
    const bool live = cfg.progress.value_or(isatty(STDERR_FILENO) != 0);
    if (cfg.synthetic) {
        if (auto f = bench::ensure_synthetic_file(*cfg.synthetic, cfg.synthetic_dir, live, cfg.verbose,
                                                  cfg.model_path)) {
            return f;
        }
    }

    moe_model_params mp;
    moe_model_params_init(&mp);
    if (live) {
        mp.progress = &on_load_progress;
        mp.progress_user_data = const_cast<char*>("model");
    }
    moe_model* raw_model = nullptr;
    bench::LoadTimes load_times;
    const auto load_start = std::chrono::steady_clock::now();
    const moe_status load_status = moe_model_load(cfg.model_path.c_str(), &mp, &raw_model);
    load_times.model_s = bench::seconds_since(load_start);
    if (live) std::fprintf(stderr, "\r\033[K");
    // The library's message names the path.
    if (load_status != MOE_STATUS_OK) return bench::library_error("cannot load the model");
    const ModelPtr model(raw_model);

    moe_model_info info;
    moe_model_info_init(&info);
    if (moe_model_get_info(model.get(), &info) != MOE_STATUS_OK) return bench::library_error("moe_model_get_info");
    if (info.n_vocab <= 0) return Failure{1, "model '" + cfg.model_path + "' reports no vocabulary (n_vocab = 0)"};

    moe_context_params cp;
    moe_context_params_init(&cp);
    cp.n_ctx = cfg.n_ctx;
    cp.n_ubatch = cfg.n_ubatch;
    cp.n_threads = cfg.n_threads > 0 ? cfg.n_threads : available_cores();
    cp.device = cfg.device;
    const std::string overrides = bench::join(cfg.tensor_overrides, ",");
    if (cfg.device != MOE_DEVICE_CPU) {  // a CPU context (auto without a GPU too) ignores these
        cp.tensor_overrides = overrides.c_str();
        cp.n_cpu_moe = cfg.n_cpu_moe;
        cp.n_gpu_layers = cfg.n_gpu_layers;
        cp.vram_budget = cfg.vram_budget;
        cp.policy = &cfg.policy;
        if (live) {
            cp.progress = &on_load_progress;
            cp.progress_user_data = const_cast<char*>("weights (locking host pages, uploading)");
        }
    }
    moe_context* raw_ctx = nullptr;
    const auto create_start = std::chrono::steady_clock::now();
    const moe_status ctx_status = moe_context_create(model.get(), &cp, &raw_ctx);
    load_times.context_s = bench::seconds_since(create_start);
    if (live && cfg.device != MOE_DEVICE_CPU) std::fprintf(stderr, "\r\033[K");
    if (ctx_status != MOE_STATUS_OK) {
        return bench::library_error("cannot create a context (n_ctx " + std::to_string(cp.n_ctx) + ", n_ubatch " +
                                    std::to_string(cp.n_ubatch) + ")");
    }
    const ContextPtr ctx(raw_ctx);
    if (cfg.verbose) {
        moe_sched_stats stats{};
        stats.struct_size = sizeof stats;
        if (moe_context_get_stats(ctx.get(), &stats) != MOE_STATUS_OK) return bench::library_error("moe_context_get_stats");
        bench::print_load_report(load_times, info.n_bytes, stats);
    }
    int32_t device = MOE_DEVICE_CPU;
    if (moe_context_get_device(ctx.get(), &device) != MOE_STATUS_OK) return bench::library_error("moe_context_get_device");
    const bool device_context = device != MOE_DEVICE_CPU;
    if (!device_context) {
        // Only --device auto gets here with these flags (finish_config refuses them with --device cpu): a
        // benchmark of the placement asked for must not quietly measure a CPU run instead.
        for (const std::string& f : bench::device_only_flags()) {
            if (cfg.given.count(f) > 0) {
                return bench::usage_error(f + " applies to a device context, and --device auto found no CUDA device "
                                              "(none in this build, or no GPU): give --device cuda, or emulated "
                                              "to try the flags in host memory");
            }
        }
    }

    bench::RunInfo run;
    if (auto f = describe_model(model.get(), info, run)) return f;
    run.model_path = cfg.model_path;
    run.backend = backend_name(device);
    run.n_threads = cp.n_threads;
    run.n_ctx = cp.n_ctx;
    run.n_ubatch = cp.n_ubatch;
    run.version = moe_version();
    run.n_batch = cfg.n_batch;
    run.device_context = device_context;
    if (auto f = describe_placement(ctx.get(), cfg, run)) return f;

    const std::unique_ptr<bench::Printer> printer = bench::make_printer(cfg.output, stdout);
    bench::Progress progress(live);
    bench::Runner runner(ctx.get(), info.n_vocab, cfg, run, *printer, progress);
    if (auto f = cfg.mode == bench::Mode::sweep ? runner.sweep() : runner.tests()) return f;
    if (cfg.expert_counts) {
        // stdout would break CSV / JSON; text goes under the table.
        FILE* out = cfg.output == bench::OutputFormat::text ? stdout : stderr;
        std::fflush(stdout);
        bench::print_expert_counts(out, info.n_layer, info.n_expert, info.n_expert_used, runner.expert_counts());
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
