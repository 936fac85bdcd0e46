// Host <-> device copy bandwidth: the "cuda" factory's measure_link probe.
#pragma once

#include "core/bandwidth.h"
#include "core/status.h"

namespace moe::cuda {

// H2D and D2H copies of o.bytes between device o.device and page-locked (cudaHostAlloc) or pageable
// (new[], touched first) host memory, each timed with CUDA events on one stream: one untimed
// warm-up copy, then the median of o.repetitions. Every buffer is freed on every path.
// REQUIRES: o.bytes > 0, o.repetitions >= 1.
StatusOr<LinkBandwidth> measure_link(const BandwidthOptions& o);

}  // namespace moe::cuda
