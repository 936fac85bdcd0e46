// moeinfer-bench's load report (with --verbose): how long loading the model and creating the context
// took, and the process's peak resident set, so load time and memory can be compared between builds
// and between a file in the page cache and a cold one (scripts/device_load_bench.sh).
#ifndef MOEINFER_TOOLS_BENCH_LOAD_REPORT_H
#define MOEINFER_TOOLS_BENCH_LOAD_REPORT_H

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "moeinfer/moeinfer.h"

namespace bench {

// The process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 where it cannot be read.
inline uint64_t peak_rss_bytes() {
    FILE* f = std::fopen("/proc/self/status", "r");
    if (f == nullptr) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof line, f) != nullptr) {
        if (std::strncmp(line, "VmHWM:", 6) == 0 && std::sscanf(line + 6, "%llu", &kib) == 1) break;
    }
    std::fclose(f);
    return static_cast<uint64_t>(kib) * 1024;
}

struct LoadTimes {
    double model_s = 0.0;    // moe_model_load
    double context_s = 0.0;  // moe_context_create
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "moeinfer-bench: load 2.41 s (model 0.00 s, context 2.41 s), peak RSS 3.95 GB, weights 3.70 GB, host
// weights 3.31 GB, page-locked 3.31 GB" on stderr (stdout stays a clean table / CSV / JSON).
inline void print_load_report(const LoadTimes& t, uint64_t weight_bytes, const moe_sched_stats& s) {
    const auto gb = [](uint64_t b) { return static_cast<double>(b) / 1e9; };
    std::fprintf(stderr,
                 "moeinfer-bench: load %.2f s (model %.2f s, context %.2f s), peak RSS %.2f GB, weights %.2f GB, "
                 "host weights %.2f GB, page-locked %.2f GB\n",
                 t.model_s + t.context_s, t.model_s, t.context_s, gb(peak_rss_bytes()), gb(weight_bytes),
                 gb(s.weights_host_bytes), gb(s.weights_host_pinned_bytes));
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_LOAD_REPORT_H
