#include "runtime/host_weights.h"

#include <algorithm>

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

StatusOr<HostWeights> HostWeights::register_ranges(Backend& device, std::span<const HostRange> ranges, GgufFile& file,
                                                   const std::function<Status(uint64_t)>& progress) {
    HostWeights w;
    for (const Run& run : merged_runs(ranges)) {
        const size_t n = run.end - run.begin;
        // Anonymous memory of our own from here on (a no-op for a file read into memory), locked for
        // reading and writing like any allocation.
        Status own = file.make_anonymous(run.begin, run.end);
        StatusOr<std::unique_ptr<Buffer>> b =
            own.is_ok() ? device.register_host(reinterpret_cast<void*>(run.begin), n, /*read_only=*/false)
                        : StatusOr<std::unique_ptr<Buffer>>(std::move(own));
        if (b.is_ok()) {
            w.runs_.push_back(std::move(b).value());
        } else if (w.first_refusal_.empty()) {
            w.first_refusal_ = b.status().message();
        }
        MOE_RETURN_IF_ERROR(progress(n));
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
