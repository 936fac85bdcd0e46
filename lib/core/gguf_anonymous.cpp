// GgufFile::make_anonymous: mapped file pages replaced by anonymous memory in place (gguf.h says why).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/gguf.h"
#include "core/host_registry.h"

namespace moe {
namespace {

// The largest piece one thread reads at a time. A piece's file pages, if something had faulted them
// into the mapping, are dropped once it is read, so a range costs at most threads x piece bytes of
// extra resident memory while it is replaced; piece_bytes() shrinks the piece for small files.
constexpr size_t kMaxPiece = size_t{16} << 20;
// Pieces and the anonymous area are laid out on this boundary (the x86-64 / arm64-4K transparent huge
// page): where the kernel backs the area with huge pages (transparent_hugepage=always), a piece fills
// whole ones and mremap moves them as they are instead of splitting them. They are not asked for
// (MADV_HUGEPAGE): faulting them in made the copy 4-5x slower on the build machine (docs/PERF.md).
constexpr size_t kHugePage = size_t{2} << 20;
#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;  // Linux 5.14's value, for older C library headers
#endif

// Pieces of 1% of the file per thread, so that the pages held twice stay far below the 5% a context may
// add to the file's size, even for a small file: whole huge pages from one huge page up (at most
// kMaxPiece), whole pages (at least 16) below.
size_t piece_bytes(uint64_t file_size, int n_threads, size_t page) {
    const uint64_t share = file_size / 100 / static_cast<uint64_t>(n_threads);
    if (share >= kHugePage) return static_cast<size_t>(std::min<uint64_t>(share / kHugePage * kHugePage, kMaxPiece));
    return std::max(static_cast<size_t>(share) / page * page, 16 * page);
}

// n bytes of fresh anonymous memory at an address congruent to `like` modulo kHugePage, so that a
// move to `like` keeps huge pages whole.
StatusOr<uint8_t*> map_aligned_like(uintptr_t like, size_t n) {
    const size_t span = n + kHugePage;
    void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        return resource_exhausted("cannot map " + std::to_string(n) + " bytes of anonymous memory: " +
                                  std::strerror(errno));
    }
    const auto r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t at = r + ((like - r) % kHugePage);
    // The slack before and after goes back, so no huge page can reach past the range.
    if (at > r) ::munmap(raw, at - r);
    if (r + span > at + n) ::munmap(reinterpret_cast<void*>(at + n), r + span - (at + n));
    return reinterpret_cast<uint8_t*>(at);
}

// Reads file bytes [off, off + n) into dst, retrying short reads and EINTR; bytes past the end of the
// file (the mapping's last page) are left as they are (zero in fresh memory, as in the mapping).
Status read_at(int fd, uint8_t* dst, size_t n, uint64_t off, uint64_t file_size) {
    const uint64_t end = std::min<uint64_t>(off + n, std::max(off, file_size));
    while (off < end) {
        const ssize_t got = ::pread(fd, dst, static_cast<size_t>(end - off), static_cast<off_t>(off));
        if (got < 0) {
            if (errno == EINTR) continue;
            return io_error("make_anonymous: read failed at file offset " + std::to_string(off) + ": " +
                            std::strerror(errno));
        }
        if (got == 0) {
            return io_error("make_anonymous: the file shrank (nothing to read at offset " + std::to_string(off) +
                            " of " + std::to_string(file_size) + " bytes)");
        }
        dst += got;
        off += static_cast<uint64_t>(got);
    }
    return Status::ok();
}

}  // namespace

// Reads [begin, end) from the file into a fresh anonymous area, piece by piece on n_threads threads,
// and moves that area over the range: one mremap per range keeps the number of mappings
// (vm.max_map_count) proportional to the ranges, not to the bytes. pread copies from the page cache in
// the kernel (or reads a cold file, the threads' reads in flight together), without faulting the
// file mapping in page by page.
Status GgufFile::replace_range(uintptr_t begin, uintptr_t end, int n_threads, std::atomic<uint64_t>* copied) {
    const size_t n = end - begin;
    MOE_ASSIGN_OR_RETURN(uint8_t* tmp, map_aligned_like(begin, n));
    const auto map_begin = reinterpret_cast<uintptr_t>(mapping_);
    const size_t piece = piece_bytes(size_, n_threads, host_page_size());
    // Pieces on absolute piece boundaries: huge pages whole (tmp is congruent to begin modulo kHugePage).
    const uintptr_t first = begin / piece * piece;
    const size_t n_pieces = (end - first + piece - 1) / piece;
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    Status error = Status::ok();
    const auto work = [&] {
        for (size_t i = next.fetch_add(1); i < n_pieces && !failed.load(); i = next.fetch_add(1)) {
            const uintptr_t a = std::max(begin, first + i * piece);
            const uintptr_t b = std::min(end, first + (i + 1) * piece);
            // Faulting the piece's fresh pages in with one call costs less than a fault per page inside
            // pread (10-15% of the read, measured on the build machine: docs/PERF.md); kernels before
            // 5.14 refuse it, and pread faults them in.
            (void)::madvise(tmp + (a - begin), b - a, kPopulateWrite);
            Status s = read_at(fd_, tmp + (a - begin), b - a, a - map_begin, size_);
            if (!s.is_ok()) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!failed.exchange(true)) error = std::move(s);
                return;
            }
            // A private file mapping never written: pages a reader faulted in come back from the page
            // cache if read again before the move, so dropping them is safe for concurrent readers.
            (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
            if (copied != nullptr) copied->fetch_add(b - a);
        }
    };
    const size_t helpers = std::min(n_pieces, static_cast<size_t>(std::max(n_threads, 1))) - 1;
    std::vector<std::thread> threads;
    threads.reserve(helpers);
    for (size_t t = 0; t < helpers; ++t) {
        try {
            threads.emplace_back(work);
        } catch (const std::system_error&) {
            break;  // the threads started (and this one) read every piece, more slowly
        }
    }
    work();
    for (std::thread& t : threads) t.join();
    if (failed.load()) {
        ::munmap(tmp, n);
        return error;
    }
    void* moved = ::mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(begin));
    if (moved == MAP_FAILED) {
        const int err = errno;
        ::munmap(tmp, n);
        return io_error("cannot move " + std::to_string(n) + " bytes of anonymous memory over the file mapping: " +
                        std::strerror(err));
    }
    return Status::ok();
}

Status GgufFile::make_anonymous(uintptr_t begin, uintptr_t end, int n_threads, std::atomic<uint64_t>* copied) {
    if (mapping_ == nullptr || begin >= end) return Status::ok();
    const size_t page = host_page_size();
    const auto map_begin = reinterpret_cast<uintptr_t>(mapping_);
    const uintptr_t map_end = map_begin + (size_ + page - 1) / page * page;
    if (begin % page != 0 || end % page != 0 || begin < map_begin || end > map_end) {
        return invalid_argument("make_anonymous: [" + std::to_string(begin - map_begin) + ", " +
                                std::to_string(end - map_begin) + ") is not a page-aligned range of the " +
                                std::to_string(map_end - map_begin) + "-byte mapping");
    }
    if (n_threads < 1) {
        return invalid_argument("make_anonymous: n_threads must be >= 1 (got " + std::to_string(n_threads) + ")");
    }
    std::lock_guard<std::mutex> lock(anonymous_mutex_);
    // Replace the gaps between the ranges already replaced.
    uintptr_t at = begin;
    for (const auto& [b, e] : anonymous_) {
        if (e <= at) continue;
        if (b >= end) break;
        if (b > at) MOE_RETURN_IF_ERROR(replace_range(at, b, n_threads, copied));
        at = std::max(at, e);
        if (at >= end) break;
    }
    if (at < end) MOE_RETURN_IF_ERROR(replace_range(at, end, n_threads, copied));
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
