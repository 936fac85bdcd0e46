#include <cstdlib>
#include <algorithm>
#include <new>

#include "cpu/cpu_ops.h"

namespace moe::cpu {

void Scratch::AlignedFree::operator()(void* p) const { std::free(p); }

void* Scratch::get(size_t bytes) {
    if (bytes > size_) {
        // Grow by at least 1.5x so a sequence of growing requests does not reallocate every time.
        size_t want = std::max(bytes, size_ + size_ / 2);
        want = (want + 63) & ~size_t{63};
        void* p = std::aligned_alloc(64, want);
        if (p == nullptr) throw std::bad_alloc();
        mem_.reset(p);
        size_ = want;
    }
    return mem_.get();
}

}  // namespace moe::cpu
