// Opening a model and a context from the shared Config (moeinfer-bench, moeinfer-run): the synthetic
// file when asked for, the progress line while loading, the placement flags, and the check that
// placement flags are not quietly ignored by a CPU context.
#ifndef MOEINFER_TOOLS_BENCH_OPEN_H
#define MOEINFER_TOOLS_BENCH_OPEN_H

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "args.h"
#include "cli.h"
#include "load_report.h"
#include "synthetic.h"
#include "moeinfer/moeinfer.h"

namespace bench {

// CPUs this process may run on (the affinity mask, as taskset / cgroups set it).
inline int32_t available_cores() {
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

// What the progress line says: the tool and what is loading.
struct LoadLabel {
    const char* tool;
    const char* what;
};

inline int on_load_progress(float fraction, void* label) {
    const auto* l = static_cast<const LoadLabel*>(label);
    std::fprintf(stderr, "\r\033[K%s: loading %s: %3d%%", l->tool, l->what, static_cast<int>(fraction * 100.0f));
    std::fflush(stderr);
    return 1;
}

struct Opened {
    ModelPtr model;
    ContextPtr ctx;
    moe_model_info info{};
    moe_context_params params{};  // as passed to moe_context_create (string fields dangle afterwards)
    LoadTimes load_times;
    int32_t device = MOE_DEVICE_CPU;  // the context's, after auto
    bool profile_read = false;        // cfg.expert_profile existed and was set on the model
};

// Loads cfg's model (writing the synthetic file first) and creates a context with cfg's settings.
// `live`: show the progress line on stderr, prefixed by `tool`.
inline std::optional<Failure> open_model_and_context(Config& cfg, bool live, const char* tool, Opened& out) {
    if (cfg.synthetic) {
        if (auto f = ensure_synthetic_file(*cfg.synthetic, cfg.synthetic_dir, live, cfg.verbose, cfg.model_path)) {
            return f;
        }
    }
    LoadLabel model_label{tool, "model"};
    LoadLabel weights_label{tool, "weights (locking host pages, uploading)"};
    moe_model_params mp;
    moe_model_params_init(&mp);
    if (live) {
        mp.progress = &on_load_progress;
        mp.progress_user_data = &model_label;
    }
    moe_model* raw_model = nullptr;
    const auto load_start = std::chrono::steady_clock::now();
    const moe_status load_status = moe_model_load(cfg.model_path.c_str(), &mp, &raw_model);
    out.load_times.model_s = seconds_since(load_start);
    if (live) std::fprintf(stderr, "\r\033[K");
    // The library's message names the path.
    if (load_status != MOE_STATUS_OK) return library_error("cannot load the model");
    out.model.reset(raw_model);

    moe_model_info_init(&out.info);
    if (moe_model_get_info(out.model.get(), &out.info) != MOE_STATUS_OK) return library_error("moe_model_get_info");
    if (out.info.n_vocab <= 0) return Failure{1, "model '" + cfg.model_path + "' reports no vocabulary (n_vocab = 0)"};
    if (!cfg.expert_profile.empty() && std::filesystem::exists(cfg.expert_profile)) {
        // The library's message names the file and what does not match.
        if (moe_model_set_expert_profile(out.model.get(), cfg.expert_profile.c_str()) != MOE_STATUS_OK) {
            return library_error("cannot use the expert profile");
        }
        out.profile_read = true;
    }

    moe_context_params& cp = out.params;
    moe_context_params_init(&cp);
    cp.n_ctx = cfg.n_ctx;
    cp.n_ubatch = cfg.n_ubatch;
    cp.n_threads = cfg.n_threads > 0 ? cfg.n_threads : available_cores();
    cp.device = cfg.device;
    const std::string overrides = join(cfg.tensor_overrides, ",");
    // --device emulated:N shows N emulated devices, as a machine shows its GPUs.
    std::string options = cfg.backend_options;
    if (cfg.emulated_devices > 0) options += (options.empty() ? "" : ",") + ("emulated_devices=" + std::to_string(cfg.emulated_devices));
    cp.backend_options = options.empty() ? nullptr : options.c_str();
    if (cfg.device != MOE_DEVICE_CPU) {  // a CPU context (auto without a GPU too) ignores these
        cp.tensor_overrides = overrides.c_str();
        cp.n_cpu_moe = cfg.n_cpu_moe;
        cp.n_gpu_layers = cfg.n_gpu_layers;
        cp.vram_budget = cfg.vram_budget;
        cp.devices = cfg.devices.empty() ? nullptr : cfg.devices.data();
        cp.n_devices = static_cast<int32_t>(cfg.devices.size());
        cp.tensor_split = cfg.tensor_split.empty() ? nullptr : cfg.tensor_split.data();
        cp.n_tensor_split = static_cast<int32_t>(cfg.tensor_split.size());
        cp.vram_budgets = cfg.vram_budgets.empty() ? nullptr : cfg.vram_budgets.data();
        cp.n_vram_budgets = static_cast<int32_t>(cfg.vram_budgets.size());
        cp.main_gpu = cfg.main_gpu;
        cp.split_mode = cfg.split_mode;
        cp.policy = &cfg.policy;
        if (live) {
            cp.progress = &on_load_progress;
            cp.progress_user_data = &weights_label;
        }
    }
    moe_context* raw_ctx = nullptr;
    const auto create_start = std::chrono::steady_clock::now();
    const moe_status ctx_status = moe_context_create(out.model.get(), &cp, &raw_ctx);
    out.load_times.context_s = seconds_since(create_start);
    cp.tensor_overrides = nullptr;
    cp.backend_options = nullptr;
    cp.devices = nullptr;
    cp.tensor_split = nullptr;
    cp.vram_budgets = nullptr;
    cp.policy = nullptr;
    cp.progress = nullptr;
    cp.progress_user_data = nullptr;
    if (live && cfg.device != MOE_DEVICE_CPU) std::fprintf(stderr, "\r\033[K");
    if (ctx_status != MOE_STATUS_OK) {
        return library_error("cannot create a context (n_ctx " + std::to_string(cp.n_ctx) + ", n_ubatch " +
                             std::to_string(cp.n_ubatch) + ")");
    }
    out.ctx.reset(raw_ctx);
    if (moe_context_get_device(out.ctx.get(), &out.device) != MOE_STATUS_OK) {
        return library_error("moe_context_get_device");
    }
    if (out.device == MOE_DEVICE_CPU) {
        // Only --device auto gets here with these flags (finish_config refuses them with --device cpu): the
        // placement asked for must not quietly become a CPU run instead.
        for (const std::string& f : device_only_flags()) {
            if (cfg.given.count(f) > 0) {
                return usage_error(f + " applies to a device context, and --device auto found no CUDA device "
                                       "(none in this build, or no GPU): give --device cuda, or emulated "
                                       "to try the flags in host memory");
            }
        }
    }
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_OPEN_H
