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
//   - Large grids do not trigger their dependents (griddepcontrol.launch_dependents): the trigger is then
//     implicit once all of a grid's blocks have exited, so the next grid's launch overlaps only the
//     previous grid's completion (memory flush, retirement). Triggering right after the wait in every
//     kernel was measured slower (Q30-16 all-GPU tg128 -3%, docs/PERF.md): the next grid's blocks then
//     start as soon as the last wave of this one is resident and are placed on whichever SMs have room,
//     i.e. packed onto the SMs that freed first, so a memory-bound GEMV of one block per few rows runs
//     on part of the GPU.
//   - Small grids (at most kPdlEarlyTriggerBlocks blocks: the decode step's row chains, attention
//     prologue, attention, router and activation quantisation) trigger right after their wait
//     (pdl_grid_sync_small()): they occupy a few SMs, so the next grid's blocks are spread over the
//     rest, resident and parked at their own wait when the small kernel ends, and the next kernel's
//     launch and block ramp-up (~2 us per GEMV under ncu) overlap the small kernel. The trigger only
//     lets the next grid launch: its wait still returns after this grid has completed.
//
// Why this keeps stream order exact:
//   - Nothing of a kernel runs before its wait (no global write, no early return, no global read but of
//     model weights), so a kernel only ever overlaps the previous one with threads parked at the wait.
//     In particular no kernel writes memory that its predecessor may still read. The one exception,
//     reads of model weights (WeightArg::constant): no kernel writes those bytes, and uploads into them
//     are copies, which the next kernel does not overlap (below). The dense GEMVs load their first
//     weight bytes before the wait, so those loads overlap the (small, early-triggering) kernel before.
//     Such a kernel loads everything else with coherent loads: ptxas moves ld.global.nc (__ldg) loads
//     above the wait. scripts/check_pdl_sass.py checks the machine code for loads before waits.
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

// Grids of at most this many blocks trigger their dependents early (see above).
constexpr unsigned int kPdlEarlyTriggerBlocks = 32;

// pdl_grid_sync(), then, in a grid of at most kPdlEarlyTriggerBlocks blocks, the early trigger.
__device__ __forceinline__ void pdl_grid_sync_small() {
    pdl_grid_sync();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (gridDim.x * gridDim.y * gridDim.z <= kPdlEarlyTriggerBlocks) asm volatile("griddepcontrol.launch_dependents;" :::);
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

// Queues kernel<<<grid, block, smem, stream>>>(args...) in clusters of cluster_x blocks along x (1:
// no clusters; sm_90 thread block clusters, at most 8 for a portable size), with PDL when
// pdl_launches(); the Status names `name` on a launch error (which is cleared, so that it does not
// resurface at a later check).
template <typename... Params, typename... Args>
Status launch_kernel_clusters(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, unsigned int cluster_x, Args&&... args) {
    cudaLaunchAttribute attr[2] = {};
    unsigned int n_attr = 0;
    if (pdl_launches()) {
        attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attr++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n_attr].id = cudaLaunchAttributeClusterDimension;
        attr[n_attr].val.clusterDim.x = cluster_x;
        attr[n_attr].val.clusterDim.y = 1;
        attr[n_attr++].val.clusterDim.z = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = n_attr > 0 ? attr : nullptr;
    cfg.numAttrs = n_attr;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return cuda_status(err, name);
}

// The same without clusters.
template <typename... Params, typename... Args>
Status launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, Args&&... args) {
    return launch_kernel_clusters(name, kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace moe::cuda
