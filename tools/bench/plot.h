// moeinfer-bench --plot FILE.png: the run's expert activation counts, the layers whose experts are
// resident on the device and the per-ubatch timeline, written as JSON (FILE.json) and rendered by the
// Python helper `python3 -m moeinfer.plot` (matplotlib): the picture is drawn by a plotting library,
// not here. The benchmark's own output is complete before any of this runs.
#ifndef MOEINFER_TOOLS_BENCH_PLOT_H
#define MOEINFER_TOOLS_BENCH_PLOT_H

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "output.h"

extern char** environ;

namespace bench {

// Ubatches the timeline keeps (the last ones of the run): 4 MiB of records.
constexpr int32_t kPlotTimelineCapacity = 65536;

// FILE.png -> FILE.json; any other name gets .json appended.
inline std::string plot_data_path(const std::string& png) {
    const std::string ext = ".png";
    if (png.size() > ext.size() && png.compare(png.size() - ext.size(), ext.size(), ext) == 0) {
        return png.substr(0, png.size() - ext.size()) + ".json";
    }
    return png + ".json";
}

inline std::optional<Failure> start_plot_timeline(moe_context* ctx) {
    if (moe_context_set_timeline(ctx, kPlotTimelineCapacity) != MOE_STATUS_OK) {
        return library_error("moe_context_set_timeline");
    }
    return std::nullopt;
}

// The plot's data as JSON (the keys moeinfer.plot reads; see its docstring).
inline std::optional<Failure> write_plot_data(moe_context* ctx, const moe_model_info& info, const RunInfo& run,
                                              const std::vector<uint64_t>& counts, const std::string& path) {
    const auto n_layer = static_cast<size_t>(info.n_layer);
    const auto n_expert = static_cast<size_t>(info.n_expert);
    if (counts.size() != n_layer * n_expert) {
        return Failure{1, "--plot: " + std::to_string(counts.size()) + " expert counts for " +
                              std::to_string(n_layer) + " layers x " + std::to_string(n_expert) + " experts"};
    }
    int32_t n = 0;
    uint64_t dropped = 0;
    if (moe_context_get_timeline(ctx, nullptr, 0, &n, nullptr) != MOE_STATUS_OK) {
        return library_error("moe_context_get_timeline");
    }
    std::vector<moe_ubatch_timing> tl(static_cast<size_t>(n));
    if (n > 0 && moe_context_get_timeline(ctx, tl.data(), n, &n, &dropped) != MOE_STATUS_OK) {
        return library_error("moe_context_get_timeline");
    }
    tl.resize(std::min(tl.size(), static_cast<size_t>(n)));

    std::string j = "{\"title\": " + detail::json_string(run.model + " on " + run.backend + " (counts over the timed runs)");
    j += ", \"model\": " + detail::json_string(run.model_path) + ", \"backend\": " + detail::json_string(run.backend);
    j += ", \"n_expert_used\": " + std::to_string(info.n_expert_used) + ", \"expert_counts\": [";
    for (size_t l = 0; l < n_layer; ++l) {
        j += l ? ", [" : "[";
        for (size_t e = 0; e < n_expert; ++e) j += (e ? ", " : "") + std::to_string(counts[l * n_expert + e]);
        j += "]";
    }
    // Placement keeps a layer's experts all on one side: ffn_up_exps answers for the layer.
    j += "], \"resident_layers\": [";
    for (size_t l = 0; l < n_layer; ++l) {
        const std::string name = "blk." + std::to_string(l) + ".ffn_up_exps.weight";
        int32_t location = MOE_LOCATION_HOST;
        const moe_status s = moe_context_tensor_location(ctx, name.c_str(), &location, nullptr);
        if (s != MOE_STATUS_OK && s != MOE_STATUS_NOT_FOUND) return library_error("moe_context_tensor_location");
        j += std::string(l ? ", " : "") + (s == MOE_STATUS_OK && location == MOE_LOCATION_DEVICE ? "true" : "false");
    }
    j += "], \"timeline\": {";
    const auto column = [&j, &tl](const char* key, auto value, bool first = false) {
        j += std::string(first ? "" : ", ") + detail::json_string(key) + ": [";
        for (size_t i = 0; i < tl.size(); ++i) j += (i ? ", " : "") + value(tl[i]);
        j += "]";
    };
    column("n_tokens", [](const moe_ubatch_timing& t) { return std::to_string(t.n_tokens); }, true);
    column("ok", [](const moe_ubatch_timing& t) { return std::string(t.ok ? "true" : "false"); });
    column("t_start", [](const moe_ubatch_timing& t) { return detail::number(t.t_start); });
    column("t_end", [](const moe_ubatch_timing& t) { return detail::number(t.t_end); });
    column("seconds_host_compute", [](const moe_ubatch_timing& t) { return detail::number(t.seconds_host_compute); });
    column("seconds_device_submit", [](const moe_ubatch_timing& t) { return detail::number(t.seconds_device_submit); });
    column("seconds_wait", [](const moe_ubatch_timing& t) { return detail::number(t.seconds_wait); });
    column("bytes_weights", [](const moe_ubatch_timing& t) { return std::to_string(t.bytes_weights); });
    column("bytes_activations", [](const moe_ubatch_timing& t) { return std::to_string(t.bytes_activations); });
    j += "}, \"timeline_dropped\": " + std::to_string(dropped) + "}\n";

    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return Failure{1, "--plot: cannot write '" + path + "': " + std::strerror(errno)};
    const bool written = std::fwrite(j.data(), 1, j.size(), f) == j.size();
    if (std::fclose(f) != 0 || !written) return Failure{1, "--plot: writing '" + path + "' failed"};
    return std::nullopt;
}

// <dir of this executable>/../python when it holds the moeinfer package (an in-tree build), else "".
inline std::string build_tree_python_dir() {
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "";
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    const std::string python = dir + "/../python";
    struct stat st {};
    return stat((python + "/moeinfer/plot.py").c_str(), &st) == 0 ? python : "";
}

// Runs `$MOEINFER_PYTHON (default python3) -m moeinfer.plot JSON PNG`; a failure names what is needed.
inline std::optional<Failure> render_plot(const std::string& json, const std::string& png) {
    const char* env_python = std::getenv("MOEINFER_PYTHON");
    const std::string python = env_python != nullptr && env_python[0] != '\0' ? env_python : "python3";
    if (const std::string dir = build_tree_python_dir(); !dir.empty()) {
        const char* old = std::getenv("PYTHONPATH");
        const std::string path = old != nullptr && old[0] != '\0' ? dir + ":" + old : dir;
        setenv("PYTHONPATH", path.c_str(), 1);
    }
    std::vector<std::string> args = {python, "-m", "moeinfer.plot", json, png};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string needs = "; it needs " + python +
                              " with matplotlib (pip install matplotlib) and the moeinfer package (PYTHONPATH)"
                              "; the data is in " + json;
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = 0;
    if (const int err = posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ); err != 0) {
        return Failure{1, "--plot: cannot run " + python + " (" + std::strerror(err) + ")" + needs};
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return Failure{1, "--plot: waiting for " + python + ": " + std::strerror(errno)};
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
    const std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return Failure{1, "--plot: `" + python + " -m moeinfer.plot` failed (" + how + ") writing " + png + needs};
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_PLOT_H
