// moeinfer-bench's settings and its option table. A new flag is one row in make_options() plus the
// field it fills in Config; validation that spans several flags lives in finish_config().
#ifndef MOEINFER_TOOLS_BENCH_ARGS_H
#define MOEINFER_TOOLS_BENCH_ARGS_H

#include <algorithm>
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

struct Config {
    // Model: a GGUF path, or a synthetic spec written to a cached file.
    std::string model_path;
    std::optional<SyntheticSpec> synthetic;
    std::string synthetic_dir;  // default: $TMPDIR or /tmp

    // Context.
    int32_t n_ctx = 0;  // 0 = auto (sweep: 4096; tests: the longest test)
    int32_t n_ubatch = 512;
    int32_t n_threads = 0;  // 0 = all cores
    int32_t device = MOE_DEVICE_CPU;

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
    const std::string bw = "Bandwidth mode (--bandwidth; no model: uses --device, -t, -r, -o)";
    const std::string out = "Output";
    return {
        {"-m", "--model", "PATH", "GGUF model file (or give PATH as the only positional argument)", "", model,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v.empty()) return "needs a file path";
             c.model_path = v;
             return std::nullopt;
         }},
        {"", "--synthetic", "SPEC",
         "synthetic model ARCH[:key=value...], ARCH = qwen3moe or gpt-oss, keys: preset, layers, experts, dense, "
         "embd, n_expert, n_expert_used, ff, vocab, n_head, n_head_kv, head_dim, seed, skew (e.g. "
         "qwen3moe:preset=tiny, qwen3moe:layers=4:experts=q8_0); written once into --synthetic-dir and reused",
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
        {"-t", "--threads", "N", "CPU threads", "all cores", ctx, int_flag(c.n_threads, 1, 4096)},
        {"", "--device", "cpu|cuda", "where every op runs (cuda: all weights on GPU 0; hybrid placement comes with the scheduler)",
         "cpu", ctx,
         [&c](const std::string& v) -> std::optional<std::string> {
             if (v == "cpu") {
                 c.device = MOE_DEVICE_CPU;
             } else if (v == "cuda") {
                 c.device = MOE_DEVICE_CUDA;
             } else {
                 return "--device: expected cpu or cuda, got '" + v + "'";
             }
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
         "timed runs per test (after one untimed warm-up); t/s is their mean ± sd (--bandwidth: GB/s is their "
         "median, default 5)",
         "3", tests, int_flag(c.repetitions, 1, 1000000)},
        {"", "--bandwidth", "",
         "measure memory bandwidth instead of a model: host RAM read by -t threads (cpu), plus host->device and "
         "device->host copies from pinned and pageable memory (--device cuda); prints GB/s per test",
         "", bw, switch_flag(c.bandwidth, true)},
        {"", "--bandwidth-mib", "N",
         "MiB per copy and of the host read buffer (small values let CPU caches inflate the host read figure)",
         "1024 per copy, host read 2048", bw, int_flag(c.bandwidth_mib, 1, 1 << 20)},
        {"", "--no-warmup", "", "skip the untimed warm-up run", "", ctx, switch_flag(c.warmup, false)},
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
