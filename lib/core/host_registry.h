// Host memory page-locked in place (Backend::register_host), counted per process. Page-locking belongs
// to the process, not to a backend object: CUDA refuses to register a range again while another
// context of the process holds it (cudaErrorHostMemoryAlreadyRegistered), and unregistering it from
// one context would unlock it under the others. So each backend kind that locks pages keeps one
// registry for the process: the same range asked for again is shared and unlocked when its last holder
// lets go. A test hook refuses registrations, so that the pageable path runs in CI (on the emulated
// device) and on a GPU whose driver would lock the pages. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "core/backend.h"

namespace moe {

class HostRegistry {
public:
    using Lock = std::function<Status(void* p, size_t n)>;
    using Unlock = std::function<void(void* p, size_t n)>;

    HostRegistry() = default;
    HostRegistry(const HostRegistry&) = delete;
    HostRegistry& operator=(const HostRegistry&) = delete;

    // The registry of the backend kind `backend` ("cuda", "emulated"). Lives as long as the process.
    static HostRegistry& of(std::string_view backend);

    // A host buffer over [p, p + n) that holds the range locked until it is destroyed: lock() runs
    // unless exactly this range is held already (then it is shared); unlock() runs when the last
    // holder's buffer is destroyed. A range that overlaps a held one without being it:
    // FAILED_PRECONDITION (the caller uses it pageable).
    StatusOr<std::unique_ptr<Buffer>> acquire(Backend* backend, void* p, size_t n, const Lock& lock,
                                              const Unlock& unlock);
    // Whether [p, p + n) lies inside one held range.
    bool contains(const void* p, size_t n) const;
    // Ranges held now.
    size_t n_ranges() const;

    // --- Test hook (internal API; never set by the library itself) ---
    // While on, acquire() fails as a driver that cannot lock the pages would (ranges already held
    // stay shared).
    void set_refuse(bool on);

private:
    struct Range {
        size_t n = 0;
        int holders = 0;
        Unlock unlock;
    };
    class Held;
    void release(void* p);

    mutable std::mutex mu_;
    std::map<uintptr_t, Range> ranges_;  // by start address; disjoint. Guarded by mu_.
    bool refuse_ = false;                // guarded by mu_
};

// The page size, and [p, p + n) widened to whole pages (what page-locking covers).
size_t host_page_size();
void page_align(const void* p, size_t n, uintptr_t* begin, uintptr_t* end);

}  // namespace moe
