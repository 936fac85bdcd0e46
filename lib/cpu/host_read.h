// Host memory read bandwidth: the "cpu" factory's measure_host_read probe and its kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tbb/task_arena.h>

#include "core/bandwidth.h"
#include "core/status.h"

namespace moe::cpu {

// Wrapping sum of the n words at src, read by the threads of `arena` in contiguous slices. The sum
// is what keeps the compiler from dropping the reads; every byte of every word changes it.
uint64_t host_read_sum(const uint64_t* src, size_t n, tbb::task_arena& arena);

// Times host_read_sum over a buffer of o.bytes (rounded down to whole words) filled with non-zero
// words by the same threads (so first-touch spreads its pages over the NUMA nodes the readers use).
// o.n_threads = 0 uses every core oneTBB may use; larger requests are capped there.
// REQUIRES: o.bytes >= 8, o.repetitions >= 1, o.n_threads >= 0.
StatusOr<HostReadBandwidth> measure_host_read(const BandwidthOptions& o);

}  // namespace moe::cpu
