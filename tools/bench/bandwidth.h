// moeinfer-bench --bandwidth: host read and host<->device copy bandwidths (moe_measure_bandwidth),
// one row per figure, as a markdown table, CSV or a JSON array (fields: device, test, bytes,
// n_threads, repetitions, gbps, version).
#ifndef MOEINFER_TOOLS_BENCH_BANDWIDTH_H
#define MOEINFER_TOOLS_BENCH_BANDWIDTH_H

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "output.h"

namespace bench {

struct BandwidthRow {
    const char* test;   // "host_read", "h2d_pinned", ...
    uint64_t bytes;     // bytes read or copied per run
    int32_t n_threads;  // readers for host_read; 0 for copies
    double gbps;
};

inline std::vector<BandwidthRow> bandwidth_rows(const moe_bandwidth_result& r, bool device) {
    std::vector<BandwidthRow> rows = {{"host_read", r.host_bytes, r.n_threads, r.host_read}};
    if (device) {
        rows.push_back({"h2d_pinned", r.bytes, 0, r.h2d_pinned});
        rows.push_back({"h2d_pageable", r.bytes, 0, r.h2d_pageable});
        rows.push_back({"d2h_pinned", r.bytes, 0, r.d2h_pinned});
        rows.push_back({"d2h_pageable", r.bytes, 0, r.d2h_pageable});
    }
    return rows;
}

inline std::string size_text(uint64_t bytes) {
    const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
    return mib >= 1024.0 ? detail::fmt("%.2f GiB", mib / 1024.0) : detail::fmt("%.2f MiB", mib);
}

inline void print_bandwidth(FILE* out, OutputFormat format, const char* device, const moe_bandwidth_result& r,
                            const std::vector<BandwidthRow>& rows) {
    const std::string version = moe_version();
    if (format == OutputFormat::text) {
        std::fprintf(out, "moeinfer-bench: bandwidth on %s, median of %d runs (GB/s = 1e9 bytes/s)\n\n", device,
                     r.repetitions);
        std::fprintf(out, "| %-12s | %10s | %7s | %9s |\n", "test", "size", "threads", "GB/s");
        std::fprintf(out, "| %-12s | %10s | %7s | %9s |\n", "------------", "---------:", "------:", "--------:");
        for (const BandwidthRow& row : rows) {
            std::fprintf(out, "| %-12s | %10s | %7s | %9.2f |\n", row.test, size_text(row.bytes).c_str(),
                         row.n_threads > 0 ? std::to_string(row.n_threads).c_str() : "-", row.gbps);
        }
        if (r.h2d_pageable > 0.0 && r.d2h_pageable > 0.0) {
            std::fprintf(out, "\npinned / pageable: H2D %.2fx, D2H %.2fx\n", r.h2d_pinned / r.h2d_pageable,
                         r.d2h_pinned / r.d2h_pageable);
        }
        std::fprintf(out, "\nbuild: moeinfer %s\n", version.c_str());
        return;
    }
    std::vector<std::vector<detail::Field>> records;
    for (const BandwidthRow& row : rows) {
        records.push_back({{"device", device, true},
                           {"test", row.test, true},
                           {"bytes", std::to_string(row.bytes), false},
                           {"n_threads", std::to_string(row.n_threads), false},
                           {"repetitions", std::to_string(r.repetitions), false},
                           {"gbps", detail::number(row.gbps), false},
                           {"version", version, true}});
    }
    if (format == OutputFormat::csv) {
        for (size_t i = 0; i < records[0].size(); ++i) std::fprintf(out, "%s%s", i ? "," : "", records[0][i].key.c_str());
        std::fputc('\n', out);
        for (const auto& f : records) {
            for (size_t i = 0; i < f.size(); ++i) {
                std::fprintf(out, "%s%s", i ? "," : "", (f[i].quoted ? detail::csv_string(f[i].value) : f[i].value).c_str());
            }
            std::fputc('\n', out);
        }
        return;
    }
    std::fputs("[\n", out);
    for (size_t k = 0; k < records.size(); ++k) {
        std::fputs("  {", out);
        const auto& f = records[k];
        for (size_t i = 0; i < f.size(); ++i) {
            std::fprintf(out, "%s\"%s\": %s", i ? ", " : "", f[i].key.c_str(),
                         (f[i].quoted ? detail::json_string(f[i].value) : f[i].value).c_str());
        }
        std::fputs(k + 1 < records.size() ? "},\n" : "}\n", out);
    }
    std::fputs("]\n", out);
}

inline std::optional<Failure> run_bandwidth(const Config& cfg) {
    moe_bandwidth_params p;
    moe_bandwidth_params_init(&p);
    p.device = cfg.device;
    p.n_threads = cfg.n_threads;
    p.repetitions = cfg.repetitions;
    if (cfg.bandwidth_mib > 0) {
        p.bytes = static_cast<uint64_t>(cfg.bandwidth_mib) << 20;
        p.host_bytes = p.bytes;
    }
    moe_bandwidth_result r;
    moe_bandwidth_result_init(&r);
    if (moe_measure_bandwidth(&p, &r) != MOE_STATUS_OK) return library_error("bandwidth measurement failed");
    const bool device = r.bytes > 0;  // copies measured: --device cuda, or auto with a GPU
    print_bandwidth(stdout, cfg.output, device ? "CUDA" : "CPU", r, bandwidth_rows(r, device));
    std::fflush(stdout);
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_BANDWIDTH_H
