// MOE_HD marks a function that the CUDA kernels call as well as host code (__host__ __device__ under
// nvcc, nothing for a host compiler), so that a decoder is written once and tested on the host.
#pragma once

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif
