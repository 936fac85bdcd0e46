// Device memory as the device backends hand it out. A meter per backend kind counts the live bytes
// (so a test sees that a failed operation left nothing behind), and a test hook refuses allocations
// (a byte limit, "the device has N bytes", or "the k-th allocation from now fails"), so the device
// out-of-memory paths run in CI on the emulated device and on a GPU without filling the card.
//
// Device backends call acquire() before and release() after they allocate and free device memory,
// and report every refused allocation with device_exhausted(). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moe {

class DeviceMemoryMeter {
public:
    static constexpr size_t kNoLimit = SIZE_MAX;

    // The meter of the backend kind `backend` ("cuda", "emulated"): all its devices and contexts in
    // this process together. Lives as long as the process.
    static DeviceMemoryMeter& of(std::string_view backend);

    // Counts n bytes about to be allocated, with `device_free` bytes free as the device reports them;
    // RESOURCE_EXHAUSTED (device_exhausted's message) when the test hook refuses them.
    Status acquire(size_t n, size_t device_free, std::string_view backend);
    // Uncounts n bytes freed (or acquired and then not allocated after all).
    void release(size_t n);
    size_t live_bytes() const;
    // What the device reports free, capped by the test limit.
    size_t free_bytes(size_t device_free) const;

    // --- Test hooks (internal API; never set by the library itself) ---
    // The device holds `total` bytes in all (live bytes included); kNoLimit: as many as it has.
    void set_limit(size_t total);
    // The k-th acquire() from now fails (1: the next one); 0: none.
    void fail_nth(uint64_t k);
    // Removes the limit and the pending failure.
    void clear_hooks();
    // From now on, remember the size of every allocation asked for (granted or not), in order; the
    // sizes asked since, and stop. A test finds with them what a backend allocates for itself before the
    // allocation it wants to refuse.
    void start_recording();
    std::vector<size_t> stop_recording();
    // Allocations refused so far, by the hook or by the device (reported through note_refused()).
    uint64_t n_refused() const;
    void note_refused();

private:
    mutable std::mutex mu_;
    size_t live_ = 0;                 // guarded by mu_
    size_t limit_ = kNoLimit;         // guarded by mu_
    uint64_t fail_countdown_ = 0;     // guarded by mu_; 0: no failure pending
    uint64_t n_refused_ = 0;          // guarded by mu_
    bool recording_ = false;          // guarded by mu_
    std::vector<size_t> recorded_;    // guarded by mu_
};

// "<backend>: cannot allocate N bytes of device memory (F bytes free)": the RESOURCE_EXHAUSTED of a
// device allocation; callers add what the bytes were for.
Status device_exhausted(std::string_view backend, size_t n, size_t free);

}  // namespace moe
