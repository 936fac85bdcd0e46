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
        T& t = chunks_[chunk_][used_++];
        if (chunk_ < reused_chunks_) t = T{};  // left from before clear()
        return t;
    }
    size_t size() const { return size_; }
    // Forgets every element (pointers to them dangle); keeps the chunks for the next ones.
    void clear() {
        reused_chunks_ = size_ == 0 ? reused_chunks_ : std::max(reused_chunks_, chunk_ + 1);
        chunk_ = 0;
        used_ = 0;
        size_ = 0;
    }

private:
    std::vector<std::unique_ptr<T[]>> chunks_;
    size_t chunk_ = 0;          // the chunk being filled
    size_t used_ = 0;           // its elements in use
    size_t size_ = 0;
    size_t reused_chunks_ = 0;  // chunks [0, this) hold elements from before a clear()
};

}  // namespace moe
