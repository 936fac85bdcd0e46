// GgufFile::make_anonymous: mapped file pages replaced by anonymous memory in place (gguf.h says why).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/gguf.h"
#include "core/host_registry.h"

namespace moe {
namespace {

// The source pages are dropped from the process after each chunk is copied, so a run costs at most
// one chunk of extra resident memory while it is replaced.
constexpr size_t kChunk = size_t{16} << 20;

// Copies [begin, end) into a fresh anonymous area and moves that area over the range: one mremap per
// run keeps the number of mappings (vm.max_map_count) proportional to the runs, not to the bytes.
Status replace_range(uintptr_t begin, uintptr_t end) {
    const size_t n = end - begin;
    void* tmp = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) {
        return resource_exhausted("cannot map " + std::to_string(n) + " bytes of anonymous memory: " +
                                  std::strerror(errno));
    }
    auto* src = reinterpret_cast<uint8_t*>(begin);
    auto* dst = static_cast<uint8_t*>(tmp);
    for (size_t at = 0; at < n; at += kChunk) {
        const size_t m = std::min(kChunk, n - at);
        std::memcpy(dst + at, src + at, m);
        // A private file mapping never written: the pages come back from the page cache if read again
        // before the move, so dropping them is safe for concurrent readers.
        (void)::madvise(src + at, m, MADV_DONTNEED);
    }
    void* moved = ::mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, src);
    if (moved == MAP_FAILED) {
        const int err = errno;
        ::munmap(tmp, n);
        return io_error("cannot move " + std::to_string(n) + " bytes of anonymous memory over the file mapping: " +
                        std::strerror(err));
    }
    return Status::ok();
}

}  // namespace

Status GgufFile::make_anonymous(uintptr_t begin, uintptr_t end) {
    if (mapping_ == nullptr || begin >= end) return Status::ok();
    const size_t page = host_page_size();
    const auto map_begin = reinterpret_cast<uintptr_t>(mapping_);
    const uintptr_t map_end = map_begin + (size_ + page - 1) / page * page;
    if (begin % page != 0 || end % page != 0 || begin < map_begin || end > map_end) {
        return invalid_argument("make_anonymous: [" + std::to_string(begin - map_begin) + ", " +
                                std::to_string(end - map_begin) + ") is not a page-aligned range of the " +
                                std::to_string(map_end - map_begin) + "-byte mapping");
    }
    std::lock_guard<std::mutex> lock(anonymous_mutex_);
    // Replace the gaps between the ranges already replaced.
    uintptr_t at = begin;
    for (const auto& [b, e] : anonymous_) {
        if (e <= at) continue;
        if (b >= end) break;
        if (b > at) MOE_RETURN_IF_ERROR(replace_range(at, b));
        at = std::max(at, e);
        if (at >= end) break;
    }
    if (at < end) MOE_RETURN_IF_ERROR(replace_range(at, end));
    // Record [begin, end), merged with the ranges it touches.
    anonymous_.emplace_back(begin, end);
    std::sort(anonymous_.begin(), anonymous_.end());
    std::vector<std::pair<uintptr_t, uintptr_t>> merged;
    for (const auto& r : anonymous_) {
        if (!merged.empty() && r.first <= merged.back().second) {
            merged.back().second = std::max(merged.back().second, r.second);
        } else {
            merged.push_back(r);
        }
    }
    anonymous_ = std::move(merged);
    return Status::ok();
}

}  // namespace moe
