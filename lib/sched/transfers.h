// Which bytes cross PCIe, and when: every copy between host and device that the scheduler makes.
// - Weights: a host-resident weight used on the device goes through the upload ring (a fixed set of
//   slots, each reused once the compute that read it is done). Expert matrices go whole (FULL), as
//   the experts the router picked (ACTIVE_ONLY, after reading its ids back), those it picked last
//   time ahead of the readback (ACTIVE_PREFETCH), or the device group of a split expert block (queued
//   a layer ahead by the split's look-ahead; only its selected experts under ACTIVE copies). AUTO is
//   ACTIVE_ONLY for small ubatches, FULL for large ones (copies_active_experts). A device-only weight
//   read on the host is fetched into a host buffer of its own (what bias duplication avoids).
// - The expert cache (sched/expert_cache.h): expert matrices that win an entry are uploaded there
//   instead of into the ring, and only their experts not already there cross PCIe; the entries stay
//   across ubatches until evicted or the policy changes.
// - Activations: a tensor needed on the other side is copied to the same offset of that side's arena.
// - Expert ids: read back for ACTIVE_ONLY, and gathered at the end of a ubatch for the counts.
// - Outputs computed on the device are downloaded into the caller's memory.
// - At context creation: the weights placed on the device and the bias duplicates (upload_weights).
// Ordering: an upload waits only for the fence of the last compute that read its slot; the host waits
// for the copies it reads (wait_host_fence), not for compute queued after them.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/graph.h"
#include "sched/expert_cache.h"
#include "sched/expert_plan.h"
#include "sched/policy.h"
#include "sched/run_state.h"
#include "sched/stats.h"
#include "sched/weight_table.h"

namespace moe::sched {

// --- Load time ---

// Bias duplication: an expert bias whose expert weights stay in host RAM gets a copy on the device too
// (ops use it while the policy's bias_dup is on), so neither side fetches it per use. Per weight of
// `weights`, placed on `sides`: whether it is such a bias.
std::vector<bool> duplicated_biases(std::span<Tensor* const> weights, std::span<const Side> sides);

// Where the weights of a context go at creation.
struct WeightUpload {
    Backend* device = nullptr;        // nullptr: a CPU context (everything used in place)
    Buffer* device_weights = nullptr;  // receives the device-side weights and duplicates, in order
    size_t align = 1;                  // each at an offset aligned to this
    // The page-locked registration holding a host-resident weight's bytes, or nullptr (pageable).
    std::function<Buffer*(const void* data, size_t n)> host_buffer_of;
    // Called with the bytes of each copy queued; an error (cancellation) stops the uploads.
    std::function<Status(uint64_t bytes)> progress;
};
// Copies the weights whose home is the device, and the duplicates, into up.device_weights (queued:
// synchronise before use) and points the device-home tensors there; host-home ones are used in place.
// Returns each weight's copies, for Scheduler::add_weight. On failure (a copy refused, progress
// cancelled) nothing is left in flight.
StatusOr<std::vector<WeightCopies>> upload_weights(std::span<Tensor* const> weights, std::span<const Side> sides,
                                                   const std::vector<bool>& duplicated, const WeightUpload& up);

// --- Run time ---

// Upload slots when the policy leaves offload_vram_budget at 0 (context creation reserves as many):
// two layers of up, gate and down in flight, and with the expert split two more for its look-ahead.
inline int auto_upload_slots(const Policy& p) { return p.expert_split != 0 ? 8 : 6; }

// One node may upload up to four operands (up, gate and their biases).
constexpr int kMinSlots = 4;

class Transfers {
public:
    // Hands the run's pending nodes to their backend; every copy is queued behind them.
    using Flush = std::function<Status(RunState&)>;
    // policy and split are the scheduler's, read at each call. REQUIRES: device != nullptr for every
    // call but the constructor and resize_ring.
    Transfers(Backend* device, const WeightTable& weights, const Policy& policy, const ExpertSplitPlan& split,
              Stats& stats, int n_layer, int n_expert, Flush flush);
    ~Transfers();
    Transfers(const Transfers&) = delete;
    Transfers& operator=(const Transfers&) = delete;

    // Sizes the upload ring for `policy` (allocated at first use). Forgets what ACTIVE_PREFETCH learned
    // and empties the expert cache (sized and allocated at first use). INVALID_ARGUMENT naming the field
    // for an offload_vram_budget below kMinSlots slots or an expert_cache below one expert matrix.
    Status set_policy(const Policy& policy);
    // At the start of each ubatch: ages the expert cache's use counts.
    void begin_ubatch() { cache_.next_ubatch(); }
    // Whether the last calls allocated device memory (the ring, the expert cache); clears the flag.
    bool take_allocated() { return std::exchange(allocated_, false); }

    // The operand src_index of `node` (a weight) as read on `side`: its copy there, uploaded or fetched
    // for this use when it has none. REQUIRES: the node's ids operand not yet rewritten.
    StatusOr<Tensor*> weight_operand(Tensor& node, int src_index, Side side, RunState& rs);
    // An activation as read on `side`: itself, or its copy at the same arena offset there.
    StatusOr<Tensor*> activation_operand(Tensor* src, Side side, RunState& rs);
    // A run's input that is in another device's memory (HostInput::peer): copied from `peer` into its
    // place in the device arena, where the device reads it, and from there into its place in the host
    // arena when host ops read it too (host_reads).
    Status peer_input(Tensor* input, Backend& peer, const void* src, bool host_reads, RunState& rs);
    // ACTIVE_PREFETCH: queues the upload of the experts this operand needed last time.
    Status prefetch_experts(Tensor& node, int src_index, RunState& rs);
    // Before the host blocks in the host part of split layer L (nodes[from]): queues the uploads of
    // the device part of the next split layer.
    Status look_ahead_split(const std::vector<Tensor*>& nodes, const std::vector<Side>& sides, size_t from,
                            RunState& rs);
    // Per node of a planned graph: whether its output goes to the host as soon as it is queued (device
    // nodes whose output a host part of a split expert block reads).
    static std::vector<uint8_t> eager_downloads(const Graph& graph, const std::vector<Side>& sides,
                                                const RunState& rs);
    // Downloads an output computed on the device into out (tensor->n_bytes() bytes).
    Status download_output(void* out, const Tensor& tensor);

    // The ubatch's expert ids: fetch_expert_ids queues the copies of those only on the device (before
    // the outputs' copies, so that a blocking output copy does not hold them up) and says where each
    // set of ids will be, valid once the device is synchronised.
    using IdSources = std::vector<std::pair<const Tensor*, const int32_t*>>;
    StatusOr<IdSources> fetch_expert_ids(RunState& rs);

    // The host waits for the copies it is about to read or overwrite (not for compute queued after).
    Status wait_host_fence(RunState& rs);
    // Marks the fence of the copies queued since the last one. Every place that queues other work on the
    // compute stream behind copies (device compute, an upload order, a peer copy) calls it first, so that
    // the host's wait for the copies does not include that work.
    Status mark_queued_copies(RunState& rs);
    // The slots the pending nodes read are reused only after `fence` (their compute). Slot numbers from
    // the ring's size on are the expert cache's entries.
    void fence_slots(const std::vector<size_t>& slots, uint64_t fence);
    // Whether the expert cache holds every expert of host-resident expert matrix `w`: a use on the device
    // then sends nothing, so even one token runs there.
    bool cached_whole(const Tensor* w) const;
    // Changes whenever the set of matrices cached_whole says yes to may have changed.
    uint64_t cache_generation() const { return cache_.generation(); }
    // Device bytes the expert cache holds (0 until its first use, or when off).
    size_t cache_bytes() const { return cache_buffer_ ? cache_buffer_->size() : 0; }
    // Seconds per byte of an upload into a slot: the fastest of 3 of the largest host-resident weight, once.
    StatusOr<double> upload_seconds_per_byte();

private:
    struct Slot {
        uint64_t fence = 0;  // compute fence after the last use of this slot
    };
    Status ensure_ring();
    StatusOr<size_t> take_slot(RunState& rs);
    uint8_t* slot_data(size_t slot);
    Status send(void* dst, const void* src, size_t n, uint64_t after);
    StatusOr<size_t> upload_experts(uint8_t* dst, const uint8_t* src, size_t per_expert,
                                    const std::vector<uint8_t>& experts, uint64_t after);
    Status early_upload(Tensor& node, int src_index, const void* host, std::vector<uint8_t> experts, RunState& rs);
    bool uploads_active_experts(const Tensor& node, int src_index) const;
    bool sliced(const Tensor& node, int src_index, const RunState& rs) const;
    bool splits_experts_of(const Tensor& node, int src_index, const RunState& rs) const;
    std::vector<uint8_t> device_experts(int layer) const;
    StatusOr<std::vector<uint8_t>> needed_experts(Tensor& node, int src_index, RunState& rs);
    size_t largest_host_experts() const;
    Status ensure_cache();
    StatusOr<Tensor*> whole_cached_operand(Tensor& node, int src_index, const void* host, size_t entry, RunState& rs);
    StatusOr<Tensor*> cached_operand(Tensor& node, int src_index, const WeightCopies& c, std::vector<uint8_t> needed,
                                     size_t entry, RunState& rs);
    bool cache_holds(const Tensor* w, const void* host) const;
    std::vector<size_t> held_entries(const RunState& rs) const;
    void count_cache(int layer, uint64_t hits, uint64_t misses, uint64_t saved_bytes);
    StatusOr<const std::vector<int32_t>*> read_ids(const Tensor* ids, RunState& rs);
    Status wait_for_device(RunState& rs);
    Status mark_copy(RunState& rs);

    Backend* device_;
    const WeightTable& weights_;
    const Policy& policy_;
    const ExpertSplitPlan& split_;
    Stats& stats_;
    int n_layer_;
    int n_expert_;
    Flush flush_;

    // The upload ring.
    std::unique_ptr<Buffer> slot_buffer_;
    size_t slot_size_ = 0;
    std::vector<Slot> slots_;
    size_t next_slot_ = 0;
    bool allocated_ = false;
    double upload_s_per_byte_ = 0.0;  // measured once, on first use

    // The expert cache: entries of cache_entry_bytes_ each, slot numbers slots_.size() + entry.
    ExpertCache cache_;
    std::unique_ptr<Buffer> cache_buffer_;
    size_t cache_entry_bytes_ = 0;
    std::vector<uint64_t> cache_fences_;  // per entry: compute fence after its last use
    bool cache_sized_ = false;            // sized (and allocated) for the current policy

    // ACTIVE_PREFETCH: per expert tensor, the experts selected the last time it was uploaded.
    std::unordered_map<const Tensor*, std::vector<uint8_t>> last_selected_;
    std::unordered_map<const Tensor*, std::unique_ptr<Buffer>> download_buffers_;  // device-only weights used on host
    std::unique_ptr<Buffer> ids_staging_;  // page-locked: where fetch_expert_ids gathers the device's expert ids
};

}  // namespace moe::sched
