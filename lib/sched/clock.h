// The scheduler's wall-clock timing (stats, the expert split's cost measurements).
#pragma once

#include <chrono>

namespace moe::sched {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace moe::sched
