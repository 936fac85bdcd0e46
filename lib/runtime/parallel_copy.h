// Large host-to-host copies with several threads: context creation copies every host-resident weight
// of a device context into pinned memory (~10 GB for a 30B MoE), which one memcpy from a fresh file
// mapping does at a few GB/s.
#pragma once

#include <cstddef>

#include "core/task_arenas.h"

namespace moe {

// One per batch of copies (the weights of a context): its thread arena is made once, not per copy.
class ParallelCopier {
public:
    // Up to n_threads threads (0: all cores).
    explicit ParallelCopier(int n_threads);

    // Copies n bytes from src to dst (not overlapping) in chunks spread over the arena's threads.
    // Small copies stay on the calling thread.
    void copy(void* dst, const void* src, size_t n);

private:
    bool single_thread_;
    TaskArenaLease arena_;  // initialised lazily by TBB, on the first large copy
};

}  // namespace moe
