// The raw-unit schedule of the tensor-core GEMM for the decoded types (matmul_mma.cuh), in plain C++ so
// that tests/cuda/test_mma_units.cpp can replay it on the host against the cp.async rules: a row's raw
// bytes arrive a unit of 256 elements at a time into one of two slots, and a unit serves `period`
// consecutive k-steps.
#pragma once

#include "core/host_device.h"

namespace moe::cuda::mm {

// The unit whose groups step s decodes.
MOE_HD constexpr int unit_of_step(int s, int period) { return s / period; }
// The shared-memory slot of unit u.
MOE_HD constexpr int unit_slot(int u) { return u & 1; }
// The unit that step kb copies, after its barrier and in its second cp.async group (units 0 and 1 are
// copied before step 0), or -1 for none: unit u + 2 in the step that decodes unit u's last group (step
// kb decodes step kb + 1), so that its slot is unit u's, whose decodes all ran before the barrier.
MOE_HD constexpr int unit_copied_in_step(int kb, int period, int n_units) {
    const int u = (kb + 1) % period == 0 ? (kb + 1) / period + 1 : -1;
    return u < n_units ? u : -1;
}

}  // namespace moe::cuda::mm
