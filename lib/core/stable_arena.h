// Objects that never move once created (pointers to them stay valid until the arena is destroyed),
// allocated kChunk at a time. Why not std::deque: libstdc++ gives each element of a type over 256
// bytes (Tensor is) its own allocation, one malloc and free per graph node per ubatch.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace moe {

template <class T, size_t kChunk = 128>
class StableArena {
public:
    // A new value-initialised element at the end.
    T& emplace_back() {
        if (chunks_.empty() || used_ == kChunk) {
            chunks_.push_back(std::make_unique<T[]>(kChunk));
            used_ = 0;
        }
        ++size_;
        return chunks_.back()[used_++];
    }
    size_t size() const { return size_; }

private:
    std::vector<std::unique_ptr<T[]>> chunks_;
    size_t used_ = 0;  // elements of the last chunk in use
    size_t size_ = 0;
};

}  // namespace moe
