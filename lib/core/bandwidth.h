// What the backends' optional bandwidth probes take and return (BackendFactory::measure_link,
// measure_host_read), shared by lib/cpu, lib/cuda and the runtime's moe_measure_bandwidth.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace moe {

// Copy bandwidths between host memory and one device, GB/s (1e9 B/s), medians of timed runs.
struct LinkBandwidth {
    double h2d_pinned = 0.0;
    double h2d_pageable = 0.0;
    double d2h_pinned = 0.0;
    double d2h_pageable = 0.0;
};

// Bandwidth of parallel reads of one host buffer, and the thread count that read it.
struct HostReadBandwidth {
    double gbps = 0.0;
    int n_threads = 0;
};

struct BandwidthOptions {
    int device = 0;       // device ordinal (measure_link)
    size_t bytes = 0;     // per copy (measure_link), or the host buffer's size (measure_host_read)
    int n_threads = 0;    // host readers; 0 = all available cores (measure_host_read)
    int repetitions = 5;  // timed runs after one untimed warm-up; the median is reported
};

// Median of `v` (mean of the two middle values for an even count); 0 for an empty vector.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    const double hi = v[mid];
    if (v.size() % 2 == 1) return hi;
    const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
    return 0.5 * (lo + hi);
}

}  // namespace moe
