// moeinfer-bench's settings and its option table. A new flag is one row in make_options() plus the
// field it fills in Config; validation that spans several flags lives in finish_config().
#ifndef MOEINFER_TOOLS_BENCH_ARGS_H
#define MOEINFER_TOOLS_BENCH_ARGS_H

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "output.h"
#include "synthetic.h"

namespace bench {

enum class Mode { sweep, bench, bandwidth };

inline moe_sched_policy default_policy() {
    moe_sched_policy p;
    moe_sched_policy_init(&p);
    return p;
}

struct Config {
    // Model: a GGUF path, or a synthetic spec written to a cached file.
    std::string model_path;
    std::optional<SyntheticSpec> synthetic;
    std::string synthetic_dir;  // default: $TMPDIR or /tmp

    // Context.
    int32_t n_ctx = 0;  // 0 = auto (sweep: 4096; tests: the longest test)
    int32_t n_ubatch = 512;
    int32_t n_batch = 0;    // tokens per moe_decode call of a prefill; 0 = the whole prefill in one call
    int32_t n_threads = 0;  // 0 = all cores
    int32_t device = MOE_DEVICE_AUTO;

    // Placement and scheduling (device contexts only).
    std::vector<std::string> tensor_overrides;  // -ot entries, joined with ',' for the library
    int32_t n_cpu_moe = 0;
    int32_t n_gpu_layers = -1;
    uint64_t vram_budget = 0;
    // Several devices (llama.cpp's -dev, -sm, -ts, -mg; a --vram-budget list): empty for the defaults.
    std::vector<int32_t> devices;
    std::vector<float> tensor_split;
    std::vector<uint64_t> vram_budgets;  // given only when --vram-budget lists more than one size
    int32_t main_gpu = 0;
    int32_t split_mode = MOE_SPLIT_LAYER;
    int32_t emulated_devices = 0;  // --device emulated:N: the backend option emulated_devices=N (0: none)
    moe_sched_policy policy = default_policy();
    bool expert_counts = false;
    std::string backend_options;  // --backend-options, passed as moe_context_params.backend_options
    std::string plot_path;  // --plot: the PNG (its data goes to the same name with .json)
    std::string expert_profile;  // --expert-profile: read before placement when it exists, else written after

    // Sweep (llama-sweep-bench).
    int32_t sweep_pp = 0;  // 0 = n_ubatch
    int32_t sweep_tg = 32;

    // Tests (llama-bench).
    std::vector<int32_t> n_prompt = {512};
    std::vector<int32_t> n_gen = {128};
    std::vector<int32_t> n_depth = {0};
    int32_t repetitions = 3;

    bool warmup = true;
    uint64_t seed = 1234;  // of the random token ids
    OutputFormat output = OutputFormat::text;
    bool verbose = false;
    std::optional<bool> progress;  // unset = on when stderr is a terminal
    bool help = false;

    // Bandwidth (--bandwidth; no model).
    bool bandwidth = false;
    int32_t bandwidth_mib = 0;  // 0 = the library's defaults (1 GiB copies, host read of max(1 GiB, 2 GiB))

    Mode mode = Mode::sweep;
    GivenSet given;
};

constexpr int32_t kSweepCtx = 4096;

// Flags that configure a device context's placement or scheduling: an error with --device cpu.
inline const std::vector<std::string>& device_only_flags() {
    static const std::vector<std::string> flags = {"--n-gpu-layers",
                                                   "--override-tensor",
                                                   "--n-cpu-moe",
                                                   "--cpu-moe",
                                                   "--offload-policy",
                                                   "--expert-copy",
                                                   "--offload-only-active-experts",
                                                   "--no-offload-only-active-experts",
                                                   "--no-bias-dup",
                                                   "--vram-budget",
                                                   "--offload-budget",
                                                   "--dev",
                                                   "--tensor-split",
                                                   "--main-gpu",
                                                   "--split-mode"};
    return flags;
}

inline std::string join(const std::vector<std::string>& items, const char* separator) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
    return out;
}

// ik_llama.cpp's -op form: integers only, "op,on_off[,op,on_off...]" with ggml op numbers.
inline bool is_numeric_offload_spec(const std::string& spec) {
    if (spec.empty()) return false;
    for (const char ch : spec) {
        if (!std::isdigit(static_cast<unsigned char>(ch)) && ch != ',' && ch != '-') return false;
    }
    return true;
}

// The op numbers are positions in ik_llama.cpp's ggml_op enum, which grew between its versions
// (GGML_OP_MUL_MAT_ID was 27 in May 2025 and is 28 at commit 8337e4c, where 27 is GGML_OP_MUL_MAT), so a
// number cannot be mapped to an op without knowing the version it was written for.
inline std::string numeric_offload_spec_error(const std::string& spec) {
    return "'" + spec + "' looks like ik_llama.cpp's op-number pairs, whose numbers changed between its "
           "versions; name the ops instead: mul_mat, mul_mat_id, moe_up_gate or all, =off, =on or =N "
           "(e.g. -op mul_mat_id=off,moe_up_gate=off for ik's -op 27,0,29,0 of May 2025; docs/LLAMA_FLAGS.md)";
}

// Flags a llama.cpp or ik_llama.cpp user types that have no counterpart here: each is refused with the
// reason, rather than as an unknown option (docs/LLAMA_FLAGS.md maps every such flag).
struct NotTaken {
    const char* short_name;
    const char* long_name;
    const char* reason;
};

inline const std::vector<NotTaken>& not_taken_flags() {
    static const std::vector<NotTaken> flags = {
        {"-fa", "--flash-attn", "not needed: attention is always flash-style (fused, K*Q never materialised)"},
        {"-fmoe", "--fused-moe",
         "not needed: the expert up and gate products and the activation are always one fused op (MOE_UP_GATE)"},
        {"-mla", "--mla-use",
         "not needed: deepseek2 models always run MLA the way that is faster there: decode in the absorbed form "
         "over the latent cache, prompts with the cached latents decompressed once per ubatch"},
        {"-amb", "--attention-max-batch",
         "not needed: it caps ik_llama.cpp's K*Q buffer; moeinfer's flash-style attention never builds one"},
        {"-rtr", "--run-time-repack",
         "not needed: the CPU kernels read the GGUF block layouts directly, so there is nothing to repack (and "
         "ik_llama.cpp's repacked experts can no longer be offloaded)"},
        {"-ctk", "--cache-type-k", "not supported: the KV cache is F16; quantised K/V caches are not implemented"},
        {"-ctv", "--cache-type-v", "not supported: the KV cache is F16; quantised K/V caches are not implemented"},
    };
    return flags;
}

inline std::vector<Option> make_options(Config& c) {
    auto int_flag = [](int32_t& field, int32_t min, int32_t max) -> OptionHandler {
        return [&field, min, max](const std::string& v) { return parse_int32(v, min, max, field); };
    };
    auto list_flag = [](std::vector<int32_t>& field, int32_t min) -> OptionHandler {
        return [&field, min](const std::string& v) { return parse_int_list(v, min, INT32_MAX, field); };
    };
    auto switch_flag = [](bool& field, bool value) -> OptionHandler {
        return [&field, value](const std::string&) -> std::optional<std::string> {
            field = value;
            return std::nullopt;
        };
    };
    const std::string model = "Model";
    const std::string ctx = "Run (both modes)";
    const std::string sweep = "Sweep mode (llama-sweep-bench; the default when no -p/-n/-d/-r is given)";
    const std::string tests = "Test mode (llama-bench; chosen by any of -p/-n/-d/-r)";
    const std::string sched = "Placement and scheduling (--device cuda or emulated)";
    const std::string bw = "Bandwidth mode (--bandwidth; no model: uses --device, -t, -r, -o)";
    const std::string out = "Output";
    auto size_flag = [](uint64_t& field) -> OptionHandler {
        return [&field](const std::string& v) { return parse_size(v, field); };
    };
    const std::string not_taken = "llama.cpp / ik_llama.cpp flags that moeinfer-bench refuses, and why";
    std::vector<Option> options = {
        {"-m", "--model", "PATH", "GGUF model file (or give PATH as the only positional argument)", "", model,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return "needs a file path";
             c.model_path = v;
             return std::nullopt;
         }},
        {"", "--synthetic", "SPEC",
         "synthetic model ARCH[:key=value...], ARCH = qwen3moe, gpt-oss, glm4moe or deepseek2, keys: preset, layers, "
         "experts, recipe, dense, embd, n_expert, n_expert_used, ff, vocab, n_head, n_head_kv, head_dim, seed, skew "
         "(e.g. qwen3moe:preset=tiny, qwen3moe:layers=4:experts=q8_0, qwen3moe:recipe=q4_k_m); written once into "
         "--synthetic-dir and reused",
         "", model,
         [&c](const std::string& v) -> std::optional<std::string> {
             SyntheticSpec s;
             if (auto err = parse_synthetic_spec(v, s)) return err;
             c.synthetic = std::move(s);
             return std::nullopt;
         }},
        {"", "--synthetic-dir", "DIR", "where synthetic models are cached", "$TMPDIR or /tmp", model,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return "needs a directory";
             c.synthetic_dir = v;
             return std::nullopt;
         }},
        {"-c", "--ctx-size", "N", "KV cache size in tokens; the sweep runs up to it",
         "sweep: " + std::to_string(kSweepCtx) + "; tests: the longest test", ctx, int_flag(c.n_ctx, 1, INT32_MAX)},
        {"-ub", "--ubatch-size", "N", "tokens per graph evaluation (micro-batch)", "512", ctx,
         int_flag(c.n_ubatch, 1, INT32_MAX)},
        {"-b", "--batch-size", "N",
         "tokens per moe_decode call in a prefill (the PP phase, and filling the cache to depth); the library "
         "splits each call into ubatches of --ubatch-size. As in llama.cpp, the ubatch is at most the batch",
         "the whole prefill in one call", ctx, int_flag(c.n_batch, 1, INT32_MAX)},
        {"-t", "--threads", "N", "CPU threads", "all cores", ctx, int_flag(c.n_threads, 1, 4096)},
        {"", "--device", "auto|cpu|cuda|emulated|emulated:N",
         "auto: cuda when this build has CUDA and a GPU is present, else cpu (the backend column says which), "
         "as a CUDA build of llama.cpp does. cpu: every op on the CPU. cuda: the GPUs plus the CPU, weights "
         "placed by the flags below (by default all on the GPU if they fit, else the experts spill to host "
         "RAM; with several GPUs and no -dev / -ts / -sm none / -ot naming CUDAn, the GPUs filled one after the other in order of free "
         "memory, a model that fits one staying on it) and ops scheduled by the offload policy. emulated: like cuda with a host-memory backend playing "
         "the GPU (for testing placement and scheduling without a GPU; slower than cpu); emulated:N plays a "
         "host with N GPUs (up to 8, each with its own memory), used as cuda uses the GPUs of a machine",
         "auto", ctx,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "auto") {
                 c.device = MOE_DEVICE_AUTO;
             } else if (v == "cpu") {
                 c.device = MOE_DEVICE_CPU;
             } else if (v == "cuda") {
                 c.device = MOE_DEVICE_CUDA;
             } else if (v == "emulated") {
                 c.device = MOE_DEVICE_EMULATED;
             } else if (v.rfind("emulated:", 0) == 0) {
                 int32_t n = 0;
                 if (auto err = parse_int32(v.substr(9), 1, 8, n)) return "emulated:N: " + *err;
                 c.device = MOE_DEVICE_EMULATED;
                 c.emulated_devices = n;
             } else {
                 return "expected auto, cpu, cuda, emulated or emulated:N, got '" + v + "'";
             }
             return std::nullopt;
         }},
        {"-ngl", "--n-gpu-layers", "N",
         "the weights of the last N layers go to the device, the others stay in host RAM; the output head goes "
         "to the device when N > the layer count; -1, all or auto: all (the experts still spill to host RAM when "
         "the weights do not fit, see --vram-budget)",
         "-1", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "all" || v == "auto") {
                 c.n_gpu_layers = -1;
                 return std::nullopt;
             }
             return parse_int32(v, -1, INT32_MAX, c.n_gpu_layers);
         }},
        {"-ot", "--override-tensor", "REGEX=BACKEND",
         "place the tensors whose GGUF name matches REGEX (searched, ECMAScript syntax) in host RAM (CPU) or "
         "device memory (GPU, CUDA0, DEVICE), e.g. -ot exps=CPU; repeatable and comma-separated, first match "
         "wins; applied before --n-cpu-moe and --n-gpu-layers",
         "none", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.find('=') == std::string::npos) return "expected REGEX=BACKEND, got '" + v + "'";
             c.tensor_overrides.push_back(v);
             return std::nullopt;
         }},
        {"-ncmoe", "--n-cpu-moe", "N",
         "keep the expert tensors (weights and biases) of layers 0 .. N-1 in host RAM (the first N, as llama.cpp; "
         "ik_llama.cpp's llama-server and sweep-bench keep the last N)",
         "0", sched, int_flag(c.n_cpu_moe, 0, INT32_MAX)},
        {"-cmoe", "--cpu-moe", "", "keep every expert tensor in host RAM: the same as -ot exps=CPU", "", sched,
         [&c](const std::string&) -> std::optional<std::string> {
             c.tensor_overrides.push_back("exps=CPU");
             return std::nullopt;
         }},
        {"", "--vram-budget", "SIZE[,SIZE...]",
         "device memory for weights (e.g. 20GiB, 8G, 512MiB; K/M/G are powers of 1000, KiB/MiB/GiB of 1024); "
         "expert tensors move to host RAM, largest first, until the rest fits; 0: the free memory minus the KV "
         "cache, activations, offload slots and 1 GiB. A list gives one budget per device (20GiB,20GiB for two "
         "24 GB cards); one size applies to every device",
         "0", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             std::vector<uint64_t> sizes;
             size_t start = 0;
             while (start <= v.size()) {
                 const size_t comma = std::min(v.find(',', start), v.size());
                 uint64_t n = 0;
                 if (auto err = parse_size(v.substr(start, comma - start), n)) return err;
                 sizes.push_back(n);
                 start = comma + 1;
             }
             c.vram_budget = sizes[0];
             c.vram_budgets = sizes.size() > 1 ? sizes : std::vector<uint64_t>{};
             return std::nullopt;
         }},
        {"-dev", "--dev", "LIST",
         "the devices to use, comma-separated: CUDAn (or EMULATEDn with --device emulated, or the ordinal n); "
         "the first is CUDA0 of -ot and -mg; -dev CUDA0 keeps to GPU 0",
         "every GPU (cuda; emulated:N: its N), filled in order of free memory unless -ts, -sm none or an -ot naming a "
         "device (CUDAn) is given", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             c.devices.clear();
             size_t start = 0;
             while (start <= v.size()) {
                 const size_t comma = std::min(v.find(',', start), v.size());
                 std::string item = v.substr(start, comma - start);
                 for (const char* prefix : {"CUDA", "cuda", "EMULATED", "emulated"}) {
                     if (item.rfind(prefix, 0) == 0) item = item.substr(std::string(prefix).size());
                 }
                 int32_t n = 0;
                 if (parse_int32(item, 0, INT32_MAX, n)) return "expected CUDAn[,CUDAn...], got '" + v + "'";
                 c.devices.push_back(n);
                 start = comma + 1;
             }
             return std::nullopt;
         }},
        {"-sm", "--split-mode", "none|layer|row",
         "how the model spreads over the devices: layer: whole layers per device, by --tensor-split; none: "
         "only the device --main-gpu; row (rows of every matrix across devices) is not implemented",
         "layer", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "none") {
                 c.split_mode = MOE_SPLIT_NONE;
             } else if (v == "layer") {
                 c.split_mode = MOE_SPLIT_LAYER;
             } else if (v == "row") {
                 c.split_mode = MOE_SPLIT_ROW;
             } else {
                 return "expected none, layer or row, got '" + v + "'";
             }
             return std::nullopt;
         }},
        {"-ts", "--tensor-split", "P0,P1,...",
         "proportions of the layers per device (e.g. 3,1; '/' separates too, as in llama.cpp), the layers dealt "
         "out in order",
         "without -dev: the devices filled one after the other in order of free memory (--vram-budget where "
         "given); with -dev: proportional to the --vram-budget list, else each device's free memory", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             c.tensor_split.clear();
             size_t start = 0;
             while (start <= v.size()) {
                 const size_t sep = std::min(v.find_first_of(",/", start), v.size());
                 const std::string item = v.substr(start, sep - start);
                 char* end = nullptr;
                 const float x = std::strtof(item.c_str(), &end);
                 if (item.empty() || end != item.c_str() + item.size()) return "expected numbers, got '" + v + "'";
                 c.tensor_split.push_back(x);  // the library names a negative one
                 start = sep + 1;
             }
             return std::nullopt;
         }},
        {"-mg", "--main-gpu", "N", "with --split-mode none: the index (in --dev, else among every GPU) of the only device used", "0", sched,
         int_flag(c.main_gpu, 0, INT32_MAX)},
        {"-op", "--offload-policy", "SPEC",
         "which ops with weights in host RAM run on the device, from which ubatch size: op=N|on|off[,...] with "
         "op = mul_mat, mul_mat_id, moe_up_gate or all; N: offload from ubatches of N tokens; on: from the "
         "default threshold (32 for mul_mat, 32 * n_expert / n_expert_used for the expert ops); off: never "
         "offload (compute on the CPU); repeatable, applied in order (e.g. --offload-policy all=off,mul_mat_id=512). "
         "ik_llama.cpp's numeric pairs (-op 27,0) are refused: its op numbers differ between its versions",
         "all=on", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (is_numeric_offload_spec(v)) return numeric_offload_spec_error(v);
             moe_sched_policy p = c.policy;
             if (moe_sched_policy_parse_offload(&p, v.c_str()) != MOE_STATUS_OK) {
                 const char* detail = moe_last_error();
                 return detail != nullptr && detail[0] != '\0' ? std::string(detail)
                                                               : "bad offload spec '" + v + "'";
             }
             c.policy = p;
             return std::nullopt;
         }},
        {"", "--expert-copy", "auto|full|active|prefetch",
         "what an offloaded expert op uploads: full expert tensors, only the experts the router selected "
         "(one readback of its choices per layer; adjacent experts in one copy), prefetch: active, with the "
         "experts the layer used in the previous ubatch uploaded before the readback, or auto: active while the "
         "ubatch has fewer than 2 * n_expert (token, expert) pairs (more than 13% of the experts unselected under "
         "uniform routing), full from there on",
         "auto", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "full") {
                 c.policy.expert_copy = MOE_EXPERT_COPY_FULL;
             } else if (v == "active") {
                 c.policy.expert_copy = MOE_EXPERT_COPY_ACTIVE_ONLY;
             } else if (v == "prefetch") {
                 c.policy.expert_copy = MOE_EXPERT_COPY_ACTIVE_PREFETCH;
             } else if (v == "auto") {
                 c.policy.expert_copy = MOE_EXPERT_COPY_AUTO;
             } else {
                 return "expected auto, full, active or prefetch, got '" + v + "'";
             }
             return std::nullopt;
         }},
        {"-ooae", "--offload-only-active-experts", "",
         "ik_llama.cpp's spelling of --expert-copy active: offloaded expert ops upload only the experts the router "
         "selected",
         "", sched,
         [&c](const std::string&) -> std::optional<std::string> {
             c.policy.expert_copy = MOE_EXPERT_COPY_ACTIVE_ONLY;
             return std::nullopt;
         }},
        {"-no-ooae", "--no-offload-only-active-experts", "",
         "ik_llama.cpp's spelling of --expert-copy full (ours defaults to auto; ik_llama.cpp's to -ooae)", "", sched,
         [&c](const std::string&) -> std::optional<std::string> {
             c.policy.expert_copy = MOE_EXPERT_COPY_FULL;
             return std::nullopt;
         }},
        {"", "--no-bias-dup", "",
         "do not keep a device copy of the expert biases whose weights are in host RAM (offloaded expert ops "
         "then take them from host RAM)",
         "", sched,
         [&c](const std::string&) -> std::optional<std::string> {
             c.policy.bias_dup = 0;
             return std::nullopt;
         }},
        {"", "--expert-split", "auto|off|N",
         "while a layer's host-resident experts are offloaded, the host computes N of them (the least used) at the "
         "same time as the device computes the rest; auto balances measured upload time and host throughput, then "
         "keeps the split only where timed ubatches show it faster",
         "auto", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "auto") {
                 c.policy.expert_split = MOE_EXPERT_SPLIT_AUTO;
             } else if (v == "off") {
                 c.policy.expert_split = 0;
             } else {
                 char* end = nullptr;
                 const long n = std::strtol(v.c_str(), &end, 10);
                 if (v.empty() || *end != '\0' || n < 0 || n > INT32_MAX) {
                     return "expected auto, off or a number of experts >= 0, got '" + v + "'";
                 }
                 c.policy.expert_split = static_cast<int32_t>(n);
             }
             return std::nullopt;
         }},
        {"", "--offload-budget", "SIZE",
         "device memory for the staging slots that offloaded weights are uploaded into (units as --vram-budget); "
         "0: 8 slots of the largest host-resident weight, 6 with --expert-split off",
         "0", sched, size_flag(c.policy.offload_vram_budget)},
        {"", "--expert-cache", "auto|off|SIZE",
         "device memory that keeps the experts offloaded expert ops uploaded for the next ubatches, so that only "
         "experts not there yet cross PCIe (units as --vram-budget); auto: half the device's free memory beyond "
         "1 GiB when the first expert is uploaded; off (or 0): none",
         "auto", sched,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "auto") {
                 c.policy.expert_cache = MOE_EXPERT_CACHE_AUTO;
                 return std::nullopt;
             }
             if (v == "off") {
                 c.policy.expert_cache = 0;
                 return std::nullopt;
             }
             uint64_t bytes = 0;
             if (auto err = parse_size(v, bytes)) return err;
             if (bytes > static_cast<uint64_t>(INT64_MAX)) return "expected at most " + std::to_string(INT64_MAX) + " bytes";
             c.policy.expert_cache = static_cast<int64_t>(bytes);
             return std::nullopt;
         }},
        {"", "--sweep", "", "run the sweep: at N_KV = 0, PP, 2*PP, ... time TG single-token decodes, then a PP-token "
                            "prefill, both from depth N_KV",
         "", sweep, [](const std::string&) { return std::optional<std::string>(); }},
        {"", "--sweep-pp", "N", "prefill tokens per row (PP), also the N_KV step", "--ubatch-size", sweep,
         int_flag(c.sweep_pp, 1, INT32_MAX)},
        {"", "--sweep-tg", "N", "single-token decodes per row (TG)", "32", sweep, int_flag(c.sweep_tg, 1, INT32_MAX)},
        {"-p", "--n-prompt", "LIST", "prefill tests, comma-separated token counts (0 = none)", "512", tests,
         list_flag(c.n_prompt, 0)},
        {"-n", "--n-gen", "LIST", "generation tests, comma-separated token counts (0 = none)", "128", tests,
         list_flag(c.n_gen, 0)},
        {"-d", "--n-depth", "LIST", "tokens already in the KV cache before each test, comma-separated", "0", tests,
         list_flag(c.n_depth, 0)},
        {"-r", "--repetitions", "N",
         "timed runs per test (after an untimed warm-up, repeated while --expert-split auto is still timing its "
         "trials); t/s is their mean ± sd (--bandwidth: GB/s is their median, default 5)",
         "3", tests, int_flag(c.repetitions, 1, 1000000)},
        {"", "--bandwidth", "",
         "measure memory bandwidth instead of a model: host RAM read by -t threads (cpu), plus host->device and "
         "device->host copies from pinned and pageable memory (--device cuda); prints GB/s per test",
         "", bw, switch_flag(c.bandwidth, true)},
        {"", "--bandwidth-mib", "N",
         "MiB per copy and of the host read buffer (small values let CPU caches inflate the host read figure)",
         "1024 per copy, host read 2048", bw, int_flag(c.bandwidth_mib, 1, 1 << 20)},
        {"", "--no-warmup", "", "skip the untimed warm-up run", "", ctx, switch_flag(c.warmup, false)},
        {"", "--backend-options", "STR",
         "backend switches, key=value[,key=value...] (keys listed below; a key left out takes its environment "
         "variable, else its default), e.g. cuda_graphs=off,offload_calibration=off; a bad key or value is "
         "refused by the library, naming it",
         "none", ctx,
         [&c](const std::string& v) -> std::optional<std::string> {
             c.backend_options = v;
             return std::nullopt;
         }},
        {"", "--seed", "N", "seed of the random token ids", "1234", ctx,
         [&c](const std::string& v) -> std::optional<std::string> {
             long long s = 0;
             if (auto err = parse_int(v, 0, LLONG_MAX, s)) return err;
             c.seed = static_cast<uint64_t>(s);
             return std::nullopt;
         }},
        {"-o", "--output", "FMT", "text (markdown tables), csv or json (one record per row)", "text", out,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "text" || v == "md") {
                 c.output = OutputFormat::text;
             } else if (v == "csv") {
                 c.output = OutputFormat::csv;
             } else if (v == "json") {
                 c.output = OutputFormat::json;
             } else {
                 return "expected text, csv or json, got '" + v + "'";
             }
             return std::nullopt;
         }},
        {"-v", "--verbose", "",
         "after each row, print the time per op kind (op, backend, count, seconds, %) on stderr; profiling "
         "synchronises after every op, so timings include a little overhead",
         "", out, switch_flag(c.verbose, true)},
        {"", "--expert-counts", "",
         "after the run, print per layer how many experts the router used and the least and most tokens one "
         "expert got, over the timed runs (stdout after the table in text mode, stderr with csv / json)",
         "", out, switch_flag(c.expert_counts, true)},
        {"", "--plot", "FILE.png",
         "after the run, write the expert activation heat map (resident layers framed) and the per-ubatch "
         "timeline of the whole run as FILE.png, their data as FILE.json; rendered by `python3 -m "
         "moeinfer.plot`, which needs python3 with matplotlib and the moeinfer package (found next to this "
         "tool in a build tree, else on PYTHONPATH); $MOEINFER_PYTHON names another interpreter. A failed "
         "rendering leaves the benchmark's output as it is and exits with status 1",
         "", out,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a file name");
             c.plot_path = v;
             return std::nullopt;
         }},
        {"", "--expert-profile", "FILE",
         "expert activation profile: when FILE exists, the context places its experts by it (under a VRAM "
         "budget the hottest experts of each layer stay on the device, the rest in host RAM; a profile of "
         "another model is an error); when it does not, the run's activation counts are written to it "
         "afterwards, for the next run",
         "", out,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return std::string("expected a file name");
             c.expert_profile = v;
             return std::nullopt;
         }},
        {"", "--progress", "", "show a progress line on stderr", "on when stderr is a terminal", out,
         [&c](const std::string&) -> std::optional<std::string> {
             c.progress = true;
             return std::nullopt;
         }},
        {"", "--no-progress", "", "never show the progress line", "", out,
         [&c](const std::string&) -> std::optional<std::string> {
             c.progress = false;
             return std::nullopt;
         }},
        {"-h", "--help", "", "show this help and exit", "", out, switch_flag(c.help, true)},
    };
    for (const NotTaken& n : not_taken_flags()) {
        options.push_back({n.short_name, n.long_name, "", n.reason, "", not_taken,
                           [n](const std::string&) -> std::optional<std::string> {
                               return std::string(n.reason) + " (docs/LLAMA_FLAGS.md)";
                           }});
    }
    return options;
}

// Settings that depend on several flags: the mode, the model source, defaults derived from others,
// and flags that do not apply to the chosen mode (an error, rather than silently ignored).
inline std::optional<std::string> finish_config(Config& c) {
    const auto given = [&c](const char* name) { return c.given.count(name) > 0; };
    static const char* const test_flags[] = {"--n-prompt", "--n-gen", "--n-depth", "--repetitions"};
    static const char* const sweep_flags[] = {"--sweep-pp", "--sweep-tg"};
    if (given("--bandwidth")) {
        static const char* const bandwidth_flags[] = {"--bandwidth", "--bandwidth-mib", "--device", "--threads",
                                                      "--repetitions", "--output", "--progress", "--no-progress"};
        for (const std::string& g : c.given) {
            if (std::find(std::begin(bandwidth_flags), std::end(bandwidth_flags), g) == std::end(bandwidth_flags)) {
                return g + " does not apply to --bandwidth";
            }
        }
        if (!c.model_path.empty()) return "--bandwidth takes no model (got '" + c.model_path + "')";
        if (!given("--repetitions")) c.repetitions = 5;
        if (c.repetitions > 1000) return "--repetitions: at most 1000 with --bandwidth";
        c.mode = Mode::bandwidth;
        return std::nullopt;
    }
    if (given("--bandwidth-mib")) return "--bandwidth-mib applies to --bandwidth only";

    bool any_test_flag = false;
    for (const char* f : test_flags) any_test_flag = any_test_flag || given(f);
    if (given("--sweep")) {
        for (const char* f : test_flags) {
            if (given(f)) return std::string(f) + " does not apply to --sweep (it selects test mode)";
        }
    }
    c.mode = any_test_flag ? Mode::bench : Mode::sweep;
    if (c.mode == Mode::bench) {
        for (const char* f : sweep_flags) {
            if (given(f)) return std::string(f) + " applies to --sweep only, not with -p/-n/-d/-r";
        }
    }

    if (c.device == MOE_DEVICE_CPU) {
        for (const std::string& f : device_only_flags()) {
            if (given(f.c_str())) return f + " applies to --device cuda or emulated (a CPU context places nothing)";
        }
    }
    {
        int expert_copy_flags = 0;
        for (const char* f : {"--expert-copy", "--offload-only-active-experts", "--no-offload-only-active-experts"}) {
            expert_copy_flags += given(f) ? 1 : 0;
        }
        if (expert_copy_flags > 1) return "give one of --expert-copy, -ooae and -no-ooae (they set the same thing)";
    }
    // As llama.cpp: a ubatch never exceeds the batch.
    if (c.n_batch > 0 && c.n_batch < c.n_ubatch) c.n_ubatch = c.n_batch;

    if (!c.model_path.empty() && c.synthetic) return "give either a model path or --synthetic, not both";
    if (c.model_path.empty() && !c.synthetic) return "no model: give a GGUF path (-m PATH) or --synthetic SPEC";
    if (c.synthetic_dir.empty()) {
        const char* tmp = std::getenv("TMPDIR");
        c.synthetic_dir = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
    }

    if (c.mode == Mode::sweep) {
        if (c.sweep_pp == 0) c.sweep_pp = c.n_ubatch;
        if (c.n_ctx == 0) c.n_ctx = kSweepCtx;
        const int32_t need = std::max(c.sweep_pp, c.sweep_tg);
        if (need > c.n_ctx) {
            return "--ctx-size " + std::to_string(c.n_ctx) + " is too small for one sweep row (needs " +
                   std::to_string(need) + " = max(--sweep-pp, --sweep-tg))";
        }
        return std::nullopt;
    }

    bool any_test = false;
    int64_t longest = 0;
    for (int32_t d : c.n_depth) {
        for (int32_t p : c.n_prompt) {
            if (p == 0) continue;
            longest = std::max<int64_t>(longest, int64_t{d} + p);
            any_test = true;
        }
        for (int32_t n : c.n_gen) {
            if (n == 0) continue;
            longest = std::max<int64_t>(longest, int64_t{d} + n);
            any_test = true;
        }
    }
    if (!any_test) return "nothing to run: every -p and -n value is 0";
    if (longest > INT32_MAX) return "the longest test (depth + tokens) exceeds " + std::to_string(INT32_MAX) + " tokens";
    if (c.n_ctx == 0) {
        c.n_ctx = static_cast<int32_t>(longest);
    } else if (c.n_ctx < longest) {
        return "--ctx-size " + std::to_string(c.n_ctx) + " is too small: the longest test needs " +
               std::to_string(longest) + " tokens (depth + prompt or generated tokens)";
    }
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_ARGS_H
