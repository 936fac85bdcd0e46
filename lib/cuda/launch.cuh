// Kernel launches of lib/cuda, with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A decode step is ~200 small kernels; between two of them the GPU drains one grid, then starts the
// next (~1.5-2 us each, even inside a CUDA graph). With PDL the next kernel of the stream is launched
// before the previous one has fully completed, and waits on the device instead:
//   - launch_kernel() sets cudaLaunchAttributeProgrammaticStreamSerialization while the calling thread
//     is inside a PdlScope(true) (the CUDA backend opens one around each launch when PDL is on, see
//     CudaBackend::pdl_enabled()); elsewhere it is a plain launch.
//   - Every kernel begins with pdl_grid_sync(): every thread waits (griddepcontrol.wait) until the
//     previous grid of the stream has completed and its memory is visible. Without a programmatic
//     predecessor the wait returns at once; below sm_90 it compiles to nothing.
//   - No kernel triggers its dependents (griddepcontrol.launch_dependents): the trigger is then implicit
//     once all of a grid's blocks have exited, so the next grid's launch overlaps only the previous
//     grid's completion (memory flush, retirement). Triggering right after the wait was measured slower
//     (Q30-16 all-GPU tg128 -3%, docs/PERF.md): the next grid's blocks then start as soon as the last
//     wave of this one is resident and are placed on whichever SMs have room, i.e. packed onto the SMs
//     that freed first, so a memory-bound GEMV of one block per few rows runs on part of the GPU.
//
// Why this keeps stream order exact:
//   - Nothing of a kernel runs before its wait (no global read, no global write, no early return), so a
//     kernel only ever overlaps the previous one with threads parked at the wait. In particular no
//     kernel writes memory that its predecessor may still read.
//   - The wait covers only the immediate predecessor, and transitively the rest: the predecessor could
//     not complete before its own wait returned, i.e. before its predecessor completed. That is why the
//     wait is unconditional in every thread of every kernel: a kernel that could finish without waiting
//     would let its successor run ahead of the grid before it.
//   - Counters a kernel resets for its next launch (the split-K attention's arrivals) are written before
//     that kernel completes, so the next launch, which waits (transitively), sees them reset.
//   - Only kernel -> kernel edges become programmatic. A memcpy / memset / event between two kernels
//     is an ordinary stream-ordered operation: it starts after the kernel before it has completed, and
//     the kernel after it starts after it. Kernels launched without the attribute (cuBLAS) are serialised
//     as usual: they start after our previous kernel has completed; our next kernel waits for them.
//   - Under stream capture the attribute becomes a programmatic edge of the graph (CUDA 12.3+; checked
//     by tests/cuda/test_pdl.cpp), with the same semantics at replay. Between two graph launches, or a
//     graph and an eager kernel, ordering is the ordinary stream order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "core/status.h"
#include "cuda/cuda_common.cuh"

namespace moe::cuda {

// The first statement of every kernel (see above). Every thread must execute it.
__device__ __forceinline__ void pdl_grid_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launch_kernel() on this thread launches with PDL (false outside any PdlScope).
bool pdl_launches();

// Sets pdl_launches() for this thread while in scope (restores the previous value on exit).
// REQUIRES: `on` only for a device of compute capability 9.0 or later.
class PdlScope {
public:
    explicit PdlScope(bool on);
    ~PdlScope();
    PdlScope(const PdlScope&) = delete;
    PdlScope& operator=(const PdlScope&) = delete;

private:
    bool prev_;
};

// Queues kernel<<<grid, block, smem, stream>>>(args...), with PDL when pdl_launches(); the Status
// names `name` on a launch error (which is cleared, so that it does not resurface at a later check).
template <typename... Params, typename... Args>
Status launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    const bool pdl = pdl_launches();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return cuda_status(err, name);
}

}  // namespace moe::cuda
