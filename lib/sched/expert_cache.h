// The expert cache: device memory where experts of host-resident expert matrices, once uploaded for an
// offloaded op, stay for the ubatches after it, so that they cross PCIe once instead of every ubatch.
// This object keeps the books (which matrix holds which entry, which of its experts are valid, what to
// evict); sched/transfers.h owns the memory and makes the copies.
// - Granularity: an entry holds one expert matrix, each expert at its own offset. The kernels read an
//   expert matrix as one strided block [K, N, n_expert], so an expert has no other place to live than
//   its slot in its matrix's window; an entry fills up expert by expert (what the ops asked for) and is
//   evicted as a whole.
// - Keys: the weight tensor and the host bytes it is uploaded from (a weight registered again with
//   other bytes misses). Transfers forgets every entry when the policy changes.
// - Eviction: LFU with aging. Each use adds the expert bytes it asked for to its matrix's count
//   (resident or not); what was asked for k ubatches ago counts 2^-k (next_ubatch ages). Matrices are
//   compared by their score: the aged count of the ubatches before the current one, so that the order
//   of the uses within a pass does not matter. A matrix takes a free entry, or the entry of the resident
//   matrix with the lowest score (the first such entry) if its own is strictly higher; otherwise it goes
//   through the upload ring as before. LRU would thrash: a forward pass visits the layers in a fixed
//   cycle, and with a cycle longer than the cache LRU always evicts the matrix the next ubatch needs
//   first, so nothing would ever hit (a decay in time rather than in ubatches does the same: it favours
//   whoever was used last). Matrices used alike have equal scores, so the resident set stays and hits
//   every time; it changes only for matrices asked for more, or residents no longer asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace moe::sched {

class ExpertCache {
public:
    // Forgets everything and makes `entries` empty entries of n_expert experts each.
    void reset(size_t entries, int n_expert);
    // Ages the scores: the uses recorded from now on belong to the next ubatch.
    void next_ubatch() { ++ubatch_; }
    size_t entries() const { return entries_.size(); }
    bool on() const { return !entries_.empty(); }

    // Records a use of `weight` (uploaded from `host`) that reads `requested_bytes` of its experts and
    // returns its entry: the one it holds, a free one, or the one of the resident matrix with the lowest
    // score if weight's is strictly higher (that matrix's experts are forgotten). nullopt when weight
    // loses to every resident matrix, or when the cache is off. Entries in `busy` are never taken.
    std::optional<size_t> use(const Tensor* weight, const void* host, uint64_t requested_bytes,
                              std::span<const size_t> busy);
    // The entry `weight` holds (uploaded from `host`), without recording a use.
    std::optional<size_t> find(const Tensor* weight, const void* host) const;
    // Per expert of the matrix in `entry`: 1 once its bytes were uploaded there. After marking experts
    // valid, call filled(entry).
    std::vector<uint8_t>& valid(size_t entry) { return entries_[entry].valid; }
    // Notes that experts of `entry` were marked valid: an entry that now holds every expert is complete.
    void filled(size_t entry);
    // The entry of `weight` (uploaded from `host`) if it holds every expert: a use reads it whatever the
    // router picks, with nothing to send (the scheduler then runs even a one-token use on the device).
    std::optional<size_t> complete(const Tensor* weight, const void* host) const;
    // Changes whenever the set of complete entries may have changed (an entry completed, taken over by
    // another matrix, or everything forgotten): plans that chose sides from that set are stale.
    uint64_t generation() const { return generation_; }

private:
    struct Key {
        const Tensor* weight = nullptr;
        const void* host = nullptr;
        bool operator==(const Key&) const = default;
    };
    struct KeyHash {
        size_t operator()(const Key& k) const {
            return std::hash<const void*>()(k.weight) ^ (std::hash<const void*>()(k.host) << 1);
        }
    };
    struct Score {
        double past = 0.0;     // the aged count of the ubatches before `ubatch`, as of `ubatch`
        double current = 0.0;  // asked for in `ubatch`
        uint64_t ubatch = 0;   // the last ubatch with a use
    };
    struct Entry {
        std::optional<Key> key;  // nullopt: free
        std::vector<uint8_t> valid;
        bool complete = false;  // every expert valid
    };
    double score(const Key& key) const;

    int n_expert_ = 0;
    uint64_t ubatch_ = 0;
    uint64_t generation_ = 0;
    std::vector<Entry> entries_;
    std::unordered_map<Key, Score, KeyHash> score_;  // expert bytes asked for, every matrix seen
    std::unordered_map<Key, size_t, KeyHash> where_;  // resident matrix -> its entry
};

}  // namespace moe::sched
