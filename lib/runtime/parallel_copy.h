// Large host-to-host copies with several threads: context creation copies every host-resident weight
// of a device context into pinned memory (~10 GB for a 30B MoE), which one memcpy from a fresh file
// mapping does at a few GB/s.
#pragma once

#include <cstddef>

namespace moe {

// Copies n bytes from src to dst (not overlapping) in chunks spread over up to n_threads threads
// (0: all cores). Small copies stay on the calling thread.
void parallel_copy(void* dst, const void* src, size_t n, int n_threads);

}  // namespace moe
