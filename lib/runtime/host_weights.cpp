#include "runtime/host_weights.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "core/host_registry.h"

namespace moe {
namespace {

struct Run {
    uintptr_t begin = 0, end = 0;  // page-aligned
};

// The ranges widened to whole pages, sorted, merged where they touch or overlap: CUDA cannot register
// a page twice, and one registration per run of tensors costs less than one per tensor.
std::vector<Run> merged_runs(std::span<const HostRange> ranges) {
    std::vector<Run> pages;
    for (const HostRange& r : ranges) {
        if (r.n == 0) continue;
        Run p;
        page_align(r.data, r.n, &p.begin, &p.end);
        pages.push_back(p);
    }
    std::sort(pages.begin(), pages.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
    std::vector<Run> runs;
    for (const Run& p : pages) {
        if (!runs.empty() && p.begin <= runs.back().end) {
            runs.back().end = std::max(runs.back().end, p.end);
        } else {
            runs.push_back(p);
        }
    }
    return runs;
}

}  // namespace

int HostWeights::convert_threads(int n_threads) {
    constexpr int kMaxConvertThreads = 8;
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    return std::clamp(n_threads > 0 ? n_threads : cores, 1, kMaxConvertThreads);
}

StatusOr<HostWeights> HostWeights::register_ranges(Backend& device, std::span<const HostRange> ranges, GgufFile& file,
                                                   int n_threads, const std::function<Status(uint64_t)>& progress) {
    HostWeights w;
    const std::vector<Run> runs = merged_runs(ranges);
    const int threads = convert_threads(n_threads);
    // Bytes read into anonymous memory so far, over all runs (the conversion's threads add to it).
    std::atomic<uint64_t> copied{0};
    const auto convert = [&](size_t i) {
        return std::async(std::launch::async, [&file, &copied, run = runs[i], threads] {
            return file.make_anonymous(run.begin, run.end, threads, &copied);
        });
    };
    uint64_t reported = 0;  // progress reported so far, in bytes of the runs
    const auto advance_to = [&](uint64_t target) -> Status {
        if (target <= reported) return Status::ok();
        const uint64_t n = target - reported;
        reported = target;
        return progress(n);
    };
    uint64_t through = 0;  // bytes of the runs up to the current one
    // While a run is read, one report per kProgressStep bytes read (strictly inside the run: its end is
    // reported once it is locked), so the reports are the same whatever the threads' timing.
    constexpr uint64_t kProgressStep = uint64_t{64} << 20;
    const auto report_read = [&]() -> Status {
        const uint64_t upto = std::min(copied.load(), through - 1);
        for (uint64_t m = (reported / kProgressStep + 1) * kProgressStep; m <= upto; m += kProgressStep) {
            MOE_RETURN_IF_ERROR(advance_to(m));
        }
        return Status::ok();
    };
    std::future<Status> next = runs.empty() ? std::future<Status>() : convert(0);
    for (size_t i = 0; i < runs.size(); ++i) {
        const Run& run = runs[i];
        const size_t n = run.end - run.begin;
        through += n;
        // The run's pages are read on the conversion's threads; progress follows them from here (an
        // early return waits for the conversion in the future's destructor).
        while (next.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
            MOE_RETURN_IF_ERROR(report_read());
        }
        Status own = next.get();
        MOE_RETURN_IF_ERROR(report_read());
        // The run is anonymous memory of our own from here on (make_anonymous is a no-op for a file read
        // into memory), locked for reading and writing like any allocation; the next run is read meanwhile.
        if (i + 1 < runs.size()) next = convert(i + 1);
        StatusOr<std::unique_ptr<Buffer>> b =
            own.is_ok() ? device.register_host(reinterpret_cast<void*>(run.begin), n, /*read_only=*/false)
                        : StatusOr<std::unique_ptr<Buffer>>(std::move(own));
        if (b.is_ok()) {
            w.runs_.push_back(std::move(b).value());
        } else if (w.first_refusal_.empty()) {
            w.first_refusal_ = b.status().message();
        }
        MOE_RETURN_IF_ERROR(advance_to(through));
    }
    for (const HostRange& r : ranges) {
        if (w.buffer_of(r.data, r.n) != nullptr) w.locked_bytes_ += r.n;
    }
    return w;
}

Buffer* HostWeights::buffer_of(const void* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = std::upper_bound(runs_.begin(), runs_.end(), a, [](uintptr_t x, const std::unique_ptr<Buffer>& b) {
        return x < reinterpret_cast<uintptr_t>(b->data());
    });
    if (it == runs_.begin()) return nullptr;
    --it;
    const auto begin = reinterpret_cast<uintptr_t>((*it)->data());
    return a + n <= begin + (*it)->size() ? it->get() : nullptr;
}

uint64_t HostWeights::run_bytes(std::span<const HostRange> ranges) {
    uint64_t total = 0;
    for (const Run& run : merged_runs(ranges)) total += run.end - run.begin;
    return total;
}

}  // namespace moe
