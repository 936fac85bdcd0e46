// Exit 0 when a CUDA device is usable; otherwise say so and exit 77 (ctest's "skipped").
#include <cstdio>

#include "cuda/cuda_backend.h"

int main() {
    const int n = moe::cuda::device_count();
    if (n == 0) {
        std::printf("skipped: no CUDA device\n");
        return 77;
    }
    std::printf("%d CUDA device(s)\n", n);
    return 0;
}
