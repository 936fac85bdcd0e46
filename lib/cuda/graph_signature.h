// What a span of nodes looks like to the CUDA kernels: per node, the words its launches are computed
// from (op, type, shape, strides, data pointer and params of the node, and the same of each src; no
// CUDA kernel reads anything else of a node). Two spans with equal words queue the same kernels with
// the same arguments on the same backend state, so a CUDA graph captured for one is replayed for the
// other without capturing again. Plain host code: no CUDA calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace moe::cuda {

// What a launch at a node's place does besides the node's own op (fusion_plan.h): a tag, and the other
// nodes it computes, whose words become part of the node's words.
struct NodeExtra {
    uint64_t tag = 0;
    std::span<Tensor* const> members;
};

class SpanSignature {
public:
    // Rebuilds the signature of `nodes` (reusing the storage of the last build); `extra` is empty or
    // has one entry per node.
    void build(std::span<Tensor* const> nodes, std::span<const NodeExtra> extra = {});

    size_t size() const { return hashes_.size(); }
    // The hash of node i's words: it changes between two builds iff (barring collisions) what node i
    // launches changes.
    uint64_t node_hash(size_t i) const { return hashes_[i]; }
    // The words of nodes [begin, end), compared exactly before a captured graph is replayed.
    std::span<const uint64_t> words(size_t begin, size_t end) const {
        return std::span<const uint64_t>(words_).subspan(offsets_[begin], offsets_[end] - offsets_[begin]);
    }
    // A hash of what stays fixed while one model span is decoded step after step: node count, ops,
    // dst types and shapes, and the data pointers of weight srcs. Activation and KV-cache pointers,
    // src shapes and params (n_kv) are left out: they may change from one step to the next.
    uint64_t identity() const { return identity_; }

private:
    std::vector<uint64_t> words_;
    std::vector<size_t> offsets_;  // size() + 1 entries: node i's words are [offsets_[i], offsets_[i + 1])
    std::vector<uint64_t> hashes_;
    uint64_t identity_ = 0;
};

// A 64-bit mix of h and v (not cryptographic; collisions only cost a recapture, never a wrong replay,
// because replays compare words).
uint64_t hash_combine(uint64_t h, uint64_t v);

}  // namespace moe::cuda
