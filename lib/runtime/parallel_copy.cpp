#include "runtime/parallel_copy.h"

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace moe {
namespace {

// 8 MiB chunks: large enough that scheduling costs nothing, small enough to balance the threads (page
// faults of a fresh mapping make chunk times uneven).
constexpr size_t kChunk = size_t{8} << 20;

}  // namespace

ParallelCopier::ParallelCopier(int n_threads)
    : single_thread_(n_threads == 1), arena_(n_threads > 0 ? n_threads : tbb::info::default_concurrency()) {}

void ParallelCopier::copy(void* dst, const void* src, size_t n) {
    if (n <= kChunk || single_thread_) {
        std::memcpy(dst, src, n);
        return;
    }
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const size_t chunks = (n + kChunk - 1) / kChunk;
    arena_.arena().execute([&] {
        tbb::parallel_for(tbb::blocked_range<size_t>(0, chunks, 1), [&](const tbb::blocked_range<size_t>& r) {
            for (size_t c = r.begin(); c < r.end(); ++c) {
                const size_t off = c * kChunk;
                std::memcpy(d + off, s + off, std::min(kChunk, n - off));
            }
        });
    });
}

}  // namespace moe
