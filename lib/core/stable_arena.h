// Objects that never move once created (pointers to them stay valid until the arena is destroyed),
// allocated kChunk at a time. Why not std::deque: libstdc++ gives each element of a type over 256
// bytes (Tensor is) its own allocation, one malloc and free per graph node per ubatch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace moe {

template <class T, size_t kChunk = 128>
class StableArena {
public:
    // A new value-initialised element at the end.
    T& emplace_back() {
        if (size_ == 0 || used_ == kChunk) {
            if (size_ != 0) ++chunk_;
            if (chunk_ == chunks_.size()) chunks_.push_back(std::make_unique<T[]>(kChunk));
            used_ = 0;
        }
        ++size_;
        return chunks_[chunk_][used_++];
    }
    size_t size() const { return size_; }
    // Forgets every element (pointers to them dangle), resetting those in use to fresh values; keeps the
    // chunks for the next ones.
    void clear() {
        for (size_t c = 0; size_ != 0 && c <= chunk_; ++c) {
            std::fill_n(chunks_[c].get(), c < chunk_ ? kChunk : used_, T{});
        }
        chunk_ = 0;
        used_ = 0;
        size_ = 0;
    }

private:
    std::vector<std::unique_ptr<T[]>> chunks_;  // every element not in use is value-initialised
    size_t chunk_ = 0;  // the chunk being filled
    size_t used_ = 0;   // its elements in use
    size_t size_ = 0;
};

}  // namespace moe
