#include "cuda/graph_signature.h"

#include <cstring>

namespace moe::cuda {

uint64_t hash_combine(uint64_t h, uint64_t v) {
    // splitmix64's finaliser over the running value.
    uint64_t x = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

namespace {

uint64_t ptr_word(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

void append_shape(const Tensor& t, std::vector<uint64_t>& w) {
    for (int d = 0; d < 4; ++d) w.push_back(static_cast<uint64_t>(t.ne[d]));
    for (int d = 0; d < 4; ++d) w.push_back(static_cast<uint64_t>(t.nb[d]));
    w.push_back(ptr_word(t.data));
}

void append_node(const Tensor& n, std::vector<uint64_t>& w) {
    w.push_back(static_cast<uint64_t>(n.op) | static_cast<uint64_t>(n.type) << 32);
    append_shape(n, w);
    uint64_t params[sizeof(OpParams) / sizeof(uint64_t)];
    std::memcpy(params, &n.params, sizeof params);
    w.insert(w.end(), params, params + sizeof(OpParams) / sizeof(uint64_t));
    for (int i = 0; i < kMaxSrc; ++i) {
        const Tensor* s = n.src[i];
        if (s == nullptr) {
            w.push_back(0);
            continue;
        }
        // A present src is never the word 0, even with a null type and data.
        w.push_back(uint64_t{1} << 63 | static_cast<uint64_t>(s->type) << 8 | static_cast<uint64_t>(i));
        append_shape(*s, w);
    }
}

uint64_t identity_of(uint64_t id, const Tensor& n) {
    id = hash_combine(id, static_cast<uint64_t>(n.op) | static_cast<uint64_t>(n.type) << 32);
    for (int d = 0; d < 4; ++d) id = hash_combine(id, static_cast<uint64_t>(n.ne[d]));
    for (const Tensor* s : n.src) {
        if (s != nullptr && s->is_weight) id = hash_combine(id, ptr_word(s->data));
    }
    return id;
}

}  // namespace

void SpanSignature::build(std::span<Tensor* const> nodes, std::span<const NodeExtra> extra) {
    static_assert(sizeof(OpParams) % sizeof(uint64_t) == 0, "OpParams is copied as whole words");
    words_.clear();
    offsets_.clear();
    hashes_.clear();
    offsets_.push_back(0);
    uint64_t id = hash_combine(0x6D6F65696E666572ull, nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
        const size_t first = words_.size();
        append_node(*nodes[i], words_);
        id = identity_of(id, *nodes[i]);
        if (!extra.empty()) {
            const NodeExtra& e = extra[i];
            words_.push_back(e.tag);
            id = hash_combine(id, e.tag);
            for (const Tensor* m : e.members) {
                append_node(*m, words_);
                id = identity_of(id, *m);
            }
        }
        // A cheap word hash: a collision only hides a change from the chunking, never from a replay.
        uint64_t h = 0;
        for (size_t k = first; k < words_.size(); ++k) h = ((h << 5 | h >> 59) ^ words_[k]) * 0x9E3779B97F4A7C15ull;
        hashes_.push_back(h);
        offsets_.push_back(words_.size());
    }
    identity_ = id;
}

}  // namespace moe::cuda
