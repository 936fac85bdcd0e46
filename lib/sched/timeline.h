// Per-ubatch timeline: when each ubatch ran and how its time and bytes split between uploads, host
// compute and the device, kept in a bounded ring for plots (moe_context_get_timeline). Off by default;
// when on, it costs two snapshots of a few counters per ubatch. The figures are the host's view, the
// same as the stats': device work is asynchronous, so what the device did shows as the host's wait.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/clock.h"
#include "sched/stats.h"

namespace moe::sched {

struct UbatchTiming {
    int32_t n_tokens = 0;
    bool ok = true;                    // false: the ubatch failed part-way
    double t_start = 0;                // seconds since the timeline was switched on
    double t_end = 0;
    double seconds_host_compute = 0;   // the stats' counters over this ubatch
    double seconds_device_submit = 0;
    double seconds_wait = 0;
    uint64_t bytes_weights = 0;        // bytes_weights_full + bytes_weights_experts
    uint64_t bytes_activations = 0;
};

class Timeline {
public:
    // Keeps the last `capacity` ubatches (0: off), dropping what was recorded; times start now.
    void enable(size_t capacity);
    bool on() const { return capacity_ > 0; }
    // REQUIRES: on(). Brackets one ubatch; `end` reads the counters `begin` saw grow.
    void begin(const Stats& s, Clock::time_point t_start);
    void end(const Stats& s, int n_tokens, bool ok);
    // Oldest first.
    std::vector<UbatchTiming> records() const;
    // Ubatches recorded since enable() that the ring no longer holds.
    uint64_t dropped() const { return n_recorded_ - ring_.size(); }

private:
    size_t capacity_ = 0;
    Clock::time_point origin_{};
    UbatchTiming open_;  // begin()'s snapshot: counters as they were, t_start
    std::vector<UbatchTiming> ring_;
    size_t next_ = 0;  // where the next record goes once the ring is full
    uint64_t n_recorded_ = 0;
};

}  // namespace moe::sched
