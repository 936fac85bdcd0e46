#include "cpu/host_read.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/task_arenas.h"

namespace moe::cpu {
namespace {

// Four independent accumulators, so the adds are not one serial dependency chain.
uint64_t sum_words(const uint64_t* p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    for (; i < n; ++i) a0 += p[i];
    return a0 + a1 + a2 + a3;
}

struct FreeDeleter {
    void operator()(uint64_t* p) const { std::free(p); }
};

}  // namespace

uint64_t host_read_sum(const uint64_t* src, size_t n, tbb::task_arena& arena) {
    return arena.execute([&] {
        return tbb::parallel_reduce(
            tbb::blocked_range<size_t>(0, n, 4096), uint64_t{0},
            [src](const tbb::blocked_range<size_t>& r, uint64_t acc) {
                return acc + sum_words(src + r.begin(), r.size());
            },
            [](uint64_t a, uint64_t b) { return a + b; }, tbb::static_partitioner());
    });
}

StatusOr<HostReadBandwidth> measure_host_read(const BandwidthOptions& o) {
    // oneTBB never runs more threads than max_allowed_parallelism (the cores it may use), so a larger
    // request is reported as what actually read.
    const int limit = static_cast<int>(
        tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    const int n_threads = o.n_threads > 0 ? std::min(o.n_threads, limit) : limit;
    const size_t n = o.bytes / sizeof(uint64_t);
    const size_t bytes = n * sizeof(uint64_t);
    std::unique_ptr<uint64_t, FreeDeleter> buf(static_cast<uint64_t*>(std::aligned_alloc(64, (bytes + 63) & ~size_t{63})));
    if (!buf) return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes for the host read buffer");
    uint64_t* data = buf.get();

    TaskArenaLease lease(n_threads);
    tbb::task_arena& arena = lease.arena();
    arena.execute([&] {
        tbb::parallel_for(
            tbb::blocked_range<size_t>(0, n, 4096),
            [data](const tbb::blocked_range<size_t>& r) {
                for (size_t i = r.begin(); i < r.end(); ++i) data[i] = ((i + 1) * 0x9E3779B97F4A7C15ull) | 1u;
            },
            tbb::static_partitioner());
    });

    const uint64_t expected = host_read_sum(data, n, arena);  // also the warm-up
    std::vector<double> gbps;
    for (int rep = 0; rep < o.repetitions; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        const uint64_t sum = host_read_sum(data, n, arena);
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        if (sum != expected) return internal_error("host read: checksum changed between repetitions");
        gbps.push_back(dt.count() > 0.0 ? static_cast<double>(bytes) / dt.count() / 1e9 : 0.0);
    }
    return HostReadBandwidth{median(std::move(gbps)), n_threads};
}

}  // namespace moe::cpu
