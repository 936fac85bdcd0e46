#include "sched/transfers.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/allocator.h"
#include "sched/clock.h"
#include "sched/expert_runs.h"
#include "sched/graph_ops.h"
#include "sched/resident_experts.h"

namespace moe::sched {
namespace {

// Bytes from a tensor's first to its last element (strided views included).
size_t byte_extent(const Tensor& t) {
    if (t.is_contiguous()) return t.n_bytes();
    size_t extent = static_cast<size_t>(row_bytes(t.type, t.ne[0]));
    for (int d = 1; d < 4; ++d) extent += static_cast<size_t>(t.ne[d] - 1) * t.nb[d];
    return extent;
}

// Unmarks the experts an early upload already sent; returns the bytes that upload sent.
size_t drop_uploaded(std::vector<uint8_t>& experts, const std::vector<uint8_t>& uploaded, size_t per_expert) {
    size_t bytes = 0;
    for (size_t e = 0; e < experts.size(); ++e) {
        if (uploaded[e]) {
            experts[e] = 0;
            bytes += per_expert;
        }
    }
    return bytes;
}

}  // namespace

std::vector<bool> duplicated_biases(std::span<Tensor* const> weights, std::span<const Side> sides) {
    std::vector<bool> dup(weights.size(), false);
    std::unordered_map<std::string, Side> side_by_name;
    for (size_t i = 0; i < weights.size(); ++i) side_by_name[weights[i]->name] = sides[i];
    const std::string suffix = ".bias";
    for (size_t i = 0; i < weights.size(); ++i) {
        const std::string& name = weights[i]->name;
        if (!is_expert_tensor(name) || name.size() < suffix.size() ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
            continue;
        }
        auto it = side_by_name.find(name.substr(0, name.size() - suffix.size()) + ".weight");
        dup[i] = it != side_by_name.end() && it->second == Side::HOST;
    }
    return dup;
}

StatusOr<std::vector<WeightCopies>> upload_weights(std::span<Tensor* const> weights, std::span<const Side> sides,
                                                   const std::vector<bool>& duplicated, const WeightUpload& up) {
    std::vector<WeightCopies> copies(weights.size());
    size_t device_off = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
        Tensor& t = *weights[i];
        const size_t n = t.n_bytes();
        WeightCopies& c = copies[i];
        c.home = sides[i];
        c.host = t.data;  // the model's bytes, in place
        c.duplicate = duplicated[i];
        if (sides[i] == Side::HOST && up.device != nullptr) c.host_buffer = up.host_buffer_of(t.data, n);
        if (sides[i] == Side::DEVICE || duplicated[i]) {
            auto* dst = static_cast<uint8_t*>(up.device_weights->data()) + device_off;
            if (Status s = up.device->copy_to_device(dst, c.host, n); !s.is_ok()) {
                (void)up.device->synchronize();  // the copies queued before this one
                return s;
            }
            c.device = dst;
            c.device_buffer = up.device_weights;
            const size_t padded = (n + up.align - 1) / up.align * up.align;
            device_off += padded;
            if (Status s = up.progress ? up.progress(padded) : Status::ok(); !s.is_ok()) {
                // Cancelled: the queued copies still read the model and write device_weights, which the
                // caller frees next.
                (void)up.device->synchronize();
                return s;
            }
        }
        if (sides[i] == Side::DEVICE) {
            t.data = c.device;
            t.buffer = c.device_buffer;
            if (!duplicated[i]) c.host = nullptr;  // the mapping is not a copy ops may use (no duplication)
        } else {
            t.buffer = c.host_buffer;
        }
    }
    return copies;
}

Transfers::Transfers(Backend* device, const WeightTable& weights, const Policy& policy, const ExpertSplitPlan& split,
                     Stats& stats, int n_layer, int n_expert, Flush flush)
    : device_(device),
      weights_(weights),
      policy_(policy),
      split_(split),
      stats_(stats),
      n_layer_(n_layer),
      n_expert_(n_expert),
      flush_(std::move(flush)) {}

Transfers::~Transfers() = default;

Status Transfers::set_policy(const Policy& policy) {
    const size_t largest = weights_.largest_host_bytes();
    if (const size_t experts = largest_host_experts(); device_ != nullptr && experts > 0 && policy.expert_cache > 0 &&
                                                        static_cast<uint64_t>(policy.expert_cache) < experts) {
        return invalid_argument("expert_cache of " + std::to_string(policy.expert_cache) +
                                " bytes holds no expert matrix (the largest host-resident one has " +
                                std::to_string(experts) + " bytes); give at least that, 0 (off) or -1 (automatic)");
    }
    size_t n_slots = 0;
    if (largest > 0 && device_ != nullptr) {
        n_slots = policy.offload_vram_budget == 0 ? static_cast<size_t>(auto_upload_slots(policy))
                                                  : policy.offload_vram_budget / largest;
        if (n_slots < kMinSlots) {
            return invalid_argument("offload_vram_budget of " + std::to_string(policy.offload_vram_budget) +
                                    " bytes holds fewer than " + std::to_string(kMinSlots) +
                                    " upload slots of the largest host-resident weight (" + std::to_string(largest) +
                                    " bytes); give at least " + std::to_string(kMinSlots * largest) + " bytes or 0");
        }
    }
    if (n_slots != slots_.size() || largest != slot_size_) {
        if (device_ != nullptr) MOE_RETURN_IF_ERROR(device_->synchronize());  // queued uploads may use the ring
        slot_buffer_.reset();
        slots_.assign(n_slots, Slot{});
        slot_size_ = largest;
        next_slot_ = 0;
    }
    last_selected_.clear();
    // The cache's entries were filled under the old policy (and the ring's slot numbers may have moved).
    if (cache_buffer_ && device_ != nullptr) MOE_RETURN_IF_ERROR(device_->synchronize());
    cache_buffer_.reset();
    cache_.reset(0, n_expert_);
    cache_fences_.clear();
    cache_sized_ = false;
    return Status::ok();
}

// The bytes of the largest host-resident expert matrix: what one cache entry holds.
size_t Transfers::largest_host_experts() const {
    size_t largest = 0;
    for (int il = 0; il < n_layer_; ++il) {
        for (const Tensor* w : weights_.expert_matrices(il)) {
            const std::optional<WeightCopies> c = weights_.usable(w, true);
            if (c && c->device == nullptr && w->ne[2] == n_expert_) largest = std::max(largest, w->n_bytes());
        }
    }
    return largest;
}

// Sizes and allocates the expert cache at its first use, when the device's free memory already counts
// the weights, the KV cache, this ubatch's arenas and the upload ring. Automatic: half of what is free
// beyond a 1 GiB reserve (the CUDA context's scratch, larger ubatches' arenas, other contexts), refused
// allocations halved until one fits or nothing is left (then the cache stays off); no more entries than
// there are host-resident expert matrices.
Status Transfers::ensure_cache() {
    if (cache_sized_) return Status::ok();
    cache_sized_ = true;
    cache_entry_bytes_ = largest_host_experts();
    if (cache_entry_bytes_ == 0 || policy_.expert_cache == 0) return Status::ok();
    size_t matrices = 0;
    for (int il = 0; il < n_layer_; ++il) matrices += weights_.expert_matrices(il).size();
    const bool automatic = policy_.expert_cache == kExpertCacheAuto;
    constexpr uint64_t kReserve = uint64_t{1} << 30;
    const uint64_t free = device_->free_memory();
    const uint64_t budget = !automatic ? static_cast<uint64_t>(policy_.expert_cache)
                            : free > kReserve ? (free - kReserve) / 2
                                              : 0;
    for (size_t entries = std::min<uint64_t>(budget / cache_entry_bytes_, matrices); entries > 0; entries /= 2) {
        StatusOr<std::unique_ptr<Buffer>> b = device_->alloc_buffer(entries * cache_entry_bytes_);
        if (b.is_ok()) {
            cache_buffer_ = std::move(b).value();
            cache_.reset(entries, n_expert_);
            cache_fences_.assign(entries, 0);
            allocated_ = true;
            return Status::ok();
        }
        if (!automatic) {
            return b.status().with_context("allocating the expert cache of " + std::to_string(entries) + " expert matrices (" +
                                           std::to_string(entries * cache_entry_bytes_) + " bytes; policy expert_cache " +
                                           std::to_string(policy_.expert_cache) + ", 0 turns it off)");
        }
    }
    return Status::ok();
}

bool Transfers::cache_holds(const Tensor* w, const void* host) const { return cache_.find(w, host).has_value(); }

// The expert cache entries the node being prepared already holds (up and gate of one node), from its
// slot numbers.
std::vector<size_t> Transfers::held_entries(const RunState& rs) const {
    std::vector<size_t> entries;
    for (size_t s : rs.node_slots) {
        if (s >= slots_.size()) entries.push_back(s - slots_.size());
    }
    return entries;
}

bool Transfers::cached_whole(const Tensor* w) const {
    const std::optional<WeightCopies> c = weights_.usable(w, policy_.bias_dup);
    return c && c->device == nullptr && c->host != nullptr && cache_.complete(w, c->host).has_value();
}

void Transfers::count_cache(int layer, uint64_t hits, uint64_t misses, uint64_t saved_bytes) {
    stats_.n_cache_hits += hits;
    stats_.n_cache_misses += misses;
    stats_.bytes_cache_saved += saved_bytes;
    if (layer < 0 || layer >= n_layer_) return;
    for (std::vector<uint64_t>* v : {&stats_.cache_layer_hits, &stats_.cache_layer_misses, &stats_.cache_layer_bytes_saved}) {
        v->resize(static_cast<size_t>(n_layer_), 0);
    }
    const auto l = static_cast<size_t>(layer);
    stats_.cache_layer_hits[l] += hits;
    stats_.cache_layer_misses[l] += misses;
    stats_.cache_layer_bytes_saved[l] += saved_bytes;
}

Status Transfers::ensure_ring() {
    if (slots_.empty()) return internal_error("scheduler: an upload is needed but no upload slots are configured");
    if (slot_buffer_) return Status::ok();
    StatusOr<std::unique_ptr<Buffer>> b = device_->alloc_buffer(slots_.size() * slot_size_);
    if (!b.is_ok()) return b.status().with_context("allocating " + std::to_string(slots_.size()) + " upload slots");
    slot_buffer_ = std::move(b).value();
    allocated_ = true;
    return Status::ok();
}

uint8_t* Transfers::slot_data(size_t slot) {
    if (slot >= slots_.size()) {
        return static_cast<uint8_t*>(cache_buffer_->data()) + (slot - slots_.size()) * cache_entry_bytes_;
    }
    return static_cast<uint8_t*>(slot_buffer_->data()) + slot * slot_size_;
}

void Transfers::fence_slots(const std::vector<size_t>& slots, uint64_t fence) {
    for (size_t s : slots) (s < slots_.size() ? slots_[s].fence : cache_fences_[s - slots_.size()]) = fence;
}

Status Transfers::wait_for_device(RunState& rs) {
    const Clock::time_point t0 = Clock::now();
    MOE_RETURN_IF_ERROR(device_->synchronize());
    stats_.seconds_wait += seconds_since(t0);
    rs.host_waits = false;
    return Status::ok();
}

Status Transfers::wait_host_fence(RunState& rs) {
    if (!rs.host_waits) return Status::ok();
    MOE_RETURN_IF_ERROR(mark_queued_copies(rs));
    if (rs.host_fence == 0) return wait_for_device(rs);
    const Clock::time_point t0 = Clock::now();
    MOE_RETURN_IF_ERROR(device_->wait_fence(rs.host_fence));
    stats_.seconds_wait += seconds_since(t0);
    rs.host_waits = false;
    rs.host_fence = 0;
    return Status::ok();
}

// The host must wait for the copy just queued before its next compute. The fence is marked later, once
// for every copy queued in a row (mark_queued_copies): a layer of hybrid decoding copies two activations
// to the host and one back, and each fence is a call into the driver on the scheduler's thread.
Status Transfers::mark_copy(RunState& rs) {
    rs.copies_unmarked = true;
    rs.host_waits = true;
    return Status::ok();
}

Status Transfers::mark_queued_copies(RunState& rs) {
    if (!rs.copies_unmarked) return Status::ok();
    MOE_ASSIGN_OR_RETURN(rs.host_fence, device_->mark_compute());
    rs.copies_unmarked = false;
    return Status::ok();
}

StatusOr<Tensor*> Transfers::activation_operand(Tensor* src, Side side, RunState& rs) {
    const Tensor* st = storage_of(src);
    const Side from = rs.side_of_storage(st, weights_);
    if (from == side) return src;
    if (Tensor* copy = rs.shadow(src, side)) return copy;
    if (!rs.plan.offsets.count(st)) {
        return internal_error("scheduler: '" + src->name + "' lives outside the activation arenas on the " +
                              side_name(from) + " but is needed on the " + side_name(side));
    }
    MOE_RETURN_IF_ERROR(flush_(rs));
    const size_t n = byte_extent(*src);
    auto* src_bytes = static_cast<uint8_t*>(src->data);
    uint8_t* dst = rs.base[static_cast<int>(side)] + (src_bytes - rs.base[static_cast<int>(from)]);
    if (side == Side::DEVICE) {
        MOE_RETURN_IF_ERROR(device_->copy_to_device(dst, src_bytes, n));
    } else {
        MOE_RETURN_IF_ERROR(device_->copy_to_host(dst, src_bytes, n));
    }
    // D2H: the host reads it; H2D: the host must not reuse the source before.
    MOE_RETURN_IF_ERROR(mark_copy(rs));
    stats_.bytes_activations += n;
    ++stats_.n_activation_copies;
    Tensor* shadow = rs.substitute(*src, dst, rs.arena[static_cast<int>(side)]);
    rs.shadows[src][static_cast<size_t>(side)] = shadow;
    return shadow;
}

Status Transfers::peer_input(Tensor* input, Backend& peer, const void* src, bool host_reads, RunState& rs) {
    if (!rs.plan.offsets.count(input) || rs.side_of_storage(input, weights_) != Side::HOST) {
        return internal_error("scheduler: input '" + input->name + "' has no place in the host activation arena");
    }
    MOE_RETURN_IF_ERROR(flush_(rs));
    const size_t n = input->n_bytes();
    auto* host_bytes = static_cast<uint8_t*>(input->data);
    uint8_t* dst = rs.base[static_cast<int>(Side::DEVICE)] + (host_bytes - rs.base[static_cast<int>(Side::HOST)]);
    MOE_RETURN_IF_ERROR(mark_queued_copies(rs));  // the copy waits for the peer: earlier copies need not
    MOE_RETURN_IF_ERROR(device_->copy_from_peer(dst, peer, src, n));
    rs.shadows[input][static_cast<size_t>(Side::DEVICE)] =
        rs.substitute(*input, dst, rs.arena[static_cast<int>(Side::DEVICE)]);
    if (!host_reads) return Status::ok();
    MOE_RETURN_IF_ERROR(device_->copy_to_host(host_bytes, dst, n));
    MOE_RETURN_IF_ERROR(mark_copy(rs));  // the host reads it
    stats_.bytes_activations += n;
    ++stats_.n_activation_copies;
    return Status::ok();
}

StatusOr<const std::vector<int32_t>*> Transfers::read_ids(const Tensor* ids, RunState& rs) {
    const Tensor* st = storage_of(ids);
    if (auto it = rs.ids_on_host.find(st); it != rs.ids_on_host.end()) return &it->second;
    if (!ids->is_contiguous() || ids->type != Type::I32) {
        return internal_error("scheduler: expert ids '" + ids->name + "' must be contiguous I32");
    }
    std::vector<int32_t> v(static_cast<size_t>(ids->n_elements()));
    MOE_RETURN_IF_ERROR(flush_(rs));
    if (rs.side_of_storage(st, weights_) == Side::HOST) {
        MOE_RETURN_IF_ERROR(wait_host_fence(rs));
        std::memcpy(v.data(), ids->data, v.size() * sizeof(int32_t));
    } else {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(device_->read_now(v.data(), ids->data, v.size() * sizeof(int32_t)));
        stats_.seconds_wait += seconds_since(t0);
        ++stats_.n_id_readbacks;
    }
    return &(rs.ids_on_host[st] = std::move(v));
}

StatusOr<Tensor*> Transfers::weight_operand(Tensor& node, int src_index, Side side, RunState& rs) {
    Tensor* w = node.src[src_index];
    const std::optional<WeightCopies> c = weights_.usable(w, policy_.bias_dup);
    if (!c) return internal_error("scheduler: weight '" + w->name + "' was not registered");
    const size_t n = w->n_bytes();
    if (side == Side::HOST) {
        if (c->host != nullptr) return c->host == w->data ? w : rs.substitute(*w, c->host, c->host_buffer);
        // A weight that lives only in device memory, read on the host: fetched for this use (what bias
        // duplication avoids).
        std::unique_ptr<Buffer>& buf = download_buffers_[w];
        if (!buf) {
            MOE_ASSIGN_OR_RETURN(buf, device_->alloc_host_buffer(n));
        }
        MOE_RETURN_IF_ERROR(flush_(rs));
        MOE_RETURN_IF_ERROR(device_->copy_to_host(buf->data(), c->device, n));
        MOE_RETURN_IF_ERROR(mark_copy(rs));
        stats_.bytes_weights_full += n;
        ++stats_.n_weight_copies;
        return rs.substitute(*w, buf->data(), buf.get());
    }
    // The device part of a partly resident layer reads its resident experts' slice (ids remapped to it).
    if (rs.group_of(node) == kDeviceExpertGroup && c->resident.n_experts > 0) return slice_operand(*w, c->resident, rs);
    if (c->device != nullptr) return c->device == w->data ? w : rs.substitute(*w, c->device, c->device_buffer);

    // Host-resident weight used on the device: upload what this use reads into its expert cache entry,
    // or into the next slot of the ring (or the slot its prefetch already took).
    MOE_RETURN_IF_ERROR(flush_(rs));
    const auto pre = rs.prefetched.find({&node, src_index});
    const bool experts = is_expert_matrix(node, src_index) && w->ne[2] == n_expert_;
    std::vector<uint8_t> needed;
    // A matrix the cache holds whole reads every expert there. Without reading the ids back its hits are
    // known for whole copies (every expert) and for one token's selection (its distinct experts); other
    // uses (several tokens' selection, a split's part) count them from the ids below.
    if (experts && pre == rs.prefetched.end() && rs.group_of(node) < 0 &&
        (!uploads_active_experts(node, src_index) || op_tokens(node) == 1)) {
        if (const std::optional<size_t> entry = cache_.complete(w, c->host)) {
            return whole_cached_operand(node, src_index, c->host, *entry, rs);
        }
    }
    if (experts) {
        MOE_ASSIGN_OR_RETURN(needed, needed_experts(node, src_index, rs));
        MOE_RETURN_IF_ERROR(ensure_cache());
    }
    const size_t per_expert = experts ? w->nb[2] : 0;
    const auto n_needed = static_cast<uint64_t>(std::count(needed.begin(), needed.end(), uint8_t{1}));
    if (experts && pre == rs.prefetched.end() && cache_.on()) {
        const std::vector<size_t> busy = held_entries(rs);
        if (const std::optional<size_t> entry = cache_.use(w, c->host, n_needed * per_expert, busy)) {
            return cached_operand(node, src_index, *c, std::move(needed), *entry, rs);
        }
    }
    MOE_RETURN_IF_ERROR(ensure_ring());
    size_t slot = 0;
    if (pre != rs.prefetched.end()) {
        slot = pre->second.slot;
        rs.reserved_slots.erase(slot);
    } else {
        MOE_ASSIGN_OR_RETURN(slot, take_slot(rs));
    }
    rs.node_slots.push_back(slot);
    uint8_t* dst = slot_data(slot);
    const auto* src = static_cast<const uint8_t*>(c->host);
    const uint64_t after = slots_[slot].fence;
    if (experts && cache_.on()) count_cache(node.layer, 0, n_needed, 0);
    if (experts && sliced(node, src_index, rs)) {
        // The device group of a split block, the selected experts (ACTIVE copies), or both; less what an
        // early upload (the split's look-ahead, ACTIVE_PREFETCH) already sent.
        const size_t prefetched = pre != rs.prefetched.end() ? drop_uploaded(needed, pre->second.uploaded, per_expert) : 0;
        MOE_ASSIGN_OR_RETURN(const size_t sent, upload_experts(dst, src, per_expert, needed, after));
        stats_.bytes_weights_skipped += n - sent - prefetched;
    } else {
        MOE_RETURN_IF_ERROR(send(dst, src, n, after));
        stats_.bytes_weights_full += n;
        ++stats_.n_weight_copies;
    }
    // Compute from here on waits for the uploads queued so far: this node's (early ones included) and
    // earlier ones. Until now it did not, so the look-ahead's uploads for the next split layer hold up
    // neither this layer's host part's inputs nor its result's way back (whose fence comes first).
    MOE_RETURN_IF_ERROR(mark_queued_copies(rs));
    MOE_RETURN_IF_ERROR(device_->order_after_uploads());
    return rs.substitute(*w, dst, slot_buffer_.get());
}

// The experts of expert matrix operand src_index of node that this use reads: every one, or the
// device group of a split block; under ACTIVE copies, only those of them the router selected (the ids
// read back; a split's device part reads its masked ids, whose other experts are kNoExpert).
StatusOr<std::vector<uint8_t>> Transfers::needed_experts(Tensor& node, int src_index, RunState& rs) {
    std::vector<uint8_t> experts = splits_experts_of(node, src_index, rs) ? device_experts(node.layer)
                                                                      : std::vector<uint8_t>(static_cast<size_t>(n_expert_), 1);
    if (!uploads_active_experts(node, src_index)) return experts;
    MOE_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, read_ids(expert_ids_of(node), rs));
    MOE_ASSIGN_OR_RETURN(std::vector<uint8_t> selected, selected_experts(*ids, n_expert_));
    for (size_t e = 0; e < experts.size(); ++e) experts[e] = experts[e] && selected[e];
    // ACTIVE_PREFETCH's next early upload (not for a split's device part, which the look-ahead sends).
    if (policy_.expert_copy == ExpertCopy::ACTIVE_PREFETCH && rs.group_of(node) < 0) {
        last_selected_[node.src[src_index]] = std::move(selected);
    }
    return experts;
}

// An expert matrix whose cache entry holds every expert: read there, with no ids read back and nothing
// sent. The use still counts for the entry's score; its hits are every expert under whole copies, one
// token's selection (experts per token, all distinct) under ACTIVE copies.
StatusOr<Tensor*> Transfers::whole_cached_operand(Tensor& node, int src_index, const void* host, size_t entry,
                                                  RunState& rs) {
    Tensor* w = node.src[src_index];
    const size_t per_expert = w->nb[2];
    const Tensor* ids = expert_ids_of(node);
    const uint64_t hits = uploads_active_experts(node, src_index) && ids != nullptr
                              ? static_cast<uint64_t>(std::min<int64_t>(ids->ne[0], n_expert_))
                              : static_cast<uint64_t>(n_expert_);
    const std::optional<size_t> held = cache_.use(w, host, hits * per_expert, held_entries(rs));
    if (held != entry) return internal_error("scheduler: the expert cache moved '" + w->name + "' while it was read");
    rs.node_slots.push_back(slots_.size() + entry);
    stats_.bytes_weights_skipped += w->n_bytes() - hits * per_expert;
    count_cache(node.layer, hits, 0, hits * per_expert);
    return rs.substitute(*w, slot_data(slots_.size() + entry), cache_buffer_.get());
}

// Uploads into the cache entry of the operand the experts it reads that the entry lacks; the others
// are hits. The entry's previous readers are done first (its fence), as for a ring slot.
StatusOr<Tensor*> Transfers::cached_operand(Tensor& node, int src_index, const WeightCopies& c,
                                            std::vector<uint8_t> needed, size_t entry, RunState& rs) {
    Tensor* w = node.src[src_index];
    const size_t per_expert = w->nb[2];
    const size_t slot = slots_.size() + entry;
    rs.node_slots.push_back(slot);
    std::vector<uint8_t>& valid = cache_.valid(entry);
    uint64_t hits = 0, misses = 0;
    for (size_t e = 0; e < needed.size(); ++e) {
        if (!needed[e]) continue;
        if (valid[e]) {
            needed[e] = 0;
            ++hits;
        } else {
            valid[e] = 1;
            ++misses;
        }
    }
    if (misses > 0) cache_.filled(entry);
    const uint64_t used = (hits + misses) * per_expert;
    stats_.bytes_weights_skipped += w->n_bytes() - used;
    count_cache(node.layer, hits, misses, hits * per_expert);
    if (misses > 0) {
        uint8_t* dst = slot_data(slot);
        const auto* src = static_cast<const uint8_t*>(c.host);
        if (!sliced(node, src_index, rs)) {  // FULL: every expert is missing (first use of the entry)
            MOE_RETURN_IF_ERROR(send(dst, src, w->n_bytes(), cache_fences_[entry]));
            stats_.bytes_weights_full += w->n_bytes();
            ++stats_.n_weight_copies;
        } else {
            MOE_RETURN_IF_ERROR(upload_experts(dst, src, per_expert, needed, cache_fences_[entry]).status());
        }
        MOE_RETURN_IF_ERROR(mark_queued_copies(rs));  // the host's wait for earlier copies skips the uploads
        MOE_RETURN_IF_ERROR(device_->order_after_uploads());
    }
    return rs.substitute(*w, slot_data(slot), cache_buffer_.get());
}

// Every weight upload of a run: the device's upload, with the bytes it relayed through other devices' links
// counted (Backend::add_upload_relay).
Status Transfers::send(void* dst, const void* src, size_t n, uint64_t after) {
    const uint64_t relayed = device_->relayed_bytes();
    MOE_RETURN_IF_ERROR(device_->upload(dst, src, n, after));
    stats_.bytes_weights_relayed += device_->relayed_bytes() - relayed;
    return Status::ok();
}

// Uploads the marked experts of an expert tensor (src) into its slot (dst), one copy per run of
// adjacent experts, at their own offsets; returns the bytes sent (counted in bytes_weights_experts).
StatusOr<size_t> Transfers::upload_experts(uint8_t* dst, const uint8_t* src, size_t per_expert,
                                           const std::vector<uint8_t>& experts, uint64_t after) {
    size_t sent = 0;
    for (const ExpertRun& r : coalesce_runs(experts)) {
        const size_t offset = static_cast<size_t>(r.first) * per_expert;
        const size_t bytes = static_cast<size_t>(r.count) * per_expert;
        MOE_RETURN_IF_ERROR(send(dst + offset, src + offset, bytes, after));
        sent += bytes;
        ++stats_.n_weight_copies;
    }
    stats_.bytes_weights_experts += sent;
    return sent;
}

// Whether this use of an expert matrix sends experts one run at a time (bytes_weights_experts) rather
// than the whole matrix at once (bytes_weights_full).
bool Transfers::sliced(const Tensor& node, int src_index, const RunState& rs) const {
    return splits_experts_of(node, src_index, rs) || uploads_active_experts(node, src_index);
}

// Whether this use of an expert matrix uploads only the selected experts (of the split's device group,
// for its device part): by the policy, and under AUTO by the (token, expert) pairs of the node's ids.
bool Transfers::uploads_active_experts(const Tensor& node, int src_index) const {
    const Tensor* ids = expert_ids_of(node);
    return ids != nullptr && is_expert_matrix(node, src_index) && node.src[src_index]->ne[2] == n_expert_ &&
           copies_active_experts(policy_, ids->ne[0], ids->ne[1], n_expert_);
}

// The next slot of the ring that neither an early upload nor the node being prepared holds.
StatusOr<size_t> Transfers::take_slot(RunState& rs) {
    for (size_t tries = 0; tries < slots_.size(); ++tries) {
        const size_t s = next_slot_++ % slots_.size();
        if (!rs.reserved_slots.count(s) && std::find(rs.node_slots.begin(), rs.node_slots.end(), s) == rs.node_slots.end()) {
            return s;
        }
    }
    return internal_error("scheduler: every upload slot is held by an early upload");
}

bool Transfers::splits_experts_of(const Tensor& node, int src_index, const RunState& rs) const {
    return rs.group_of(node) == kDeviceExpertGroup && is_expert_matrix(node, src_index) && !split_.groups.empty() &&
           node.layer >= 0 && node.layer < n_layer_ && node.src[src_index]->ne[2] == n_expert_;
}

std::vector<uint8_t> Transfers::device_experts(int layer) const {
    std::vector<uint8_t> on_device(static_cast<size_t>(n_expert_));
    const int32_t* g = split_.groups.data() + static_cast<size_t>(layer) * static_cast<size_t>(n_expert_);
    for (size_t e = 0; e < on_device.size(); ++e) on_device[e] = g[e] == kDeviceExpertGroup;
    return on_device;
}

// The look-ahead keeps the copy engine streaming (and the device computes layer L+1's part as soon as
// the host's result of L arrives) instead of waiting for the host to reach those nodes.
Status Transfers::look_ahead_split(const std::vector<Tensor*>& nodes, const std::vector<Side>& sides, size_t from,
                                   RunState& rs) {
    int layer = -1;
    // Only with slots to spare: the held slots wait for their nodes, and the nodes in between (biases,
    // offloaded dense weights) must still find kMinSlots free.
    constexpr size_t kHeld = 3;  // up, gate and down of one layer
    if (slots_.size() < rs.reserved_slots.size() + kHeld + kMinSlots) return Status::ok();
    for (size_t j = from; j < nodes.size(); ++j) {
        Tensor& n = *nodes[j];
        if (rs.group_of(n) != kDeviceExpertGroup || (n.op != Op::MOE_UP_GATE && n.op != Op::MUL_MAT_ID) ||
            sides[j] != Side::DEVICE) {
            continue;
        }
        if (n.layer == nodes[from]->layer) continue;  // this layer's part is already on its way
        if (layer >= 0 && n.layer != layer) break;
        layer = n.layer;
        for (int k = 0; k < kMaxSrc; ++k) {
            if (n.src[k] == nullptr || !n.src[k]->is_weight || !splits_experts_of(n, k, rs)) continue;
            if (rs.prefetched.count({&n, k})) continue;
            const std::optional<WeightCopies> c = weights_.usable(n.src[k], policy_.bias_dup);
            if (!c || c->device != nullptr || c->resident.n_experts > 0) continue;
            // Under ACTIVE copies the device part waits for its ids; a cached matrix sends only what
            // its entry lacks, when the node comes.
            if (uploads_active_experts(n, k) || cache_holds(n.src[k], c->host)) continue;
            if (rs.reserved_slots.size() + kMinSlots >= slots_.size()) return Status::ok();
            MOE_RETURN_IF_ERROR(early_upload(n, k, c->host, device_experts(n.layer), rs));
        }
    }
    return Status::ok();
}

// Queued before the router's choices are read back, so that it overlaps the compute already queued.
Status Transfers::prefetch_experts(Tensor& node, int src_index, RunState& rs) {
    const Tensor* w = node.src[src_index];
    const std::optional<WeightCopies> c = weights_.usable(w, policy_.bias_dup);
    if (!c || c->device != nullptr || !uploads_active_experts(node, src_index) || rs.group_of(node) >= 0 ||
        cache_holds(w, c->host)) {
        return Status::ok();
    }
    MOE_RETURN_IF_ERROR(flush_(rs));
    std::vector<uint8_t> experts(static_cast<size_t>(n_expert_), 0);
    if (auto it = last_selected_.find(w); it != last_selected_.end()) experts = it->second;
    return early_upload(node, src_index, c->host, std::move(experts), rs);
}

// Uploads the marked experts of operand src_index of node into a slot held until the node takes it
// (weight_operand then sends only what is still missing). REQUIRES: nothing pending.
Status Transfers::early_upload(Tensor& node, int src_index, const void* host, std::vector<uint8_t> experts,
                               RunState& rs) {
    MOE_RETURN_IF_ERROR(ensure_ring());
    MOE_ASSIGN_OR_RETURN(const size_t slot, take_slot(rs));
    rs.reserved_slots.insert(slot);
    MOE_RETURN_IF_ERROR(upload_experts(slot_data(slot), static_cast<const uint8_t*>(host), node.src[src_index]->nb[2],
                                       experts, slots_[slot].fence)
                            .status());
    rs.prefetched[{&node, src_index}] = RunState::Prefetch{slot, std::move(experts)};
    return Status::ok();
}

std::vector<uint8_t> Transfers::eager_downloads(const Graph& graph, const std::vector<Side>& sides,
                                                const RunState& rs) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    std::vector<uint8_t> eager(nodes.size(), 0);
    std::unordered_map<const Tensor*, size_t> index;
    for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (rs.group_of(*nodes[i]) != kHostExpertGroup || sides[i] != Side::HOST) continue;
        for (const Tensor* s : nodes[i]->src) {
            if (s == nullptr || s->is_weight) continue;
            const auto it = index.find(storage_of(s));
            if (it != index.end() && sides[it->second] == Side::DEVICE && nodes[it->second]->op != Op::VIEW) {
                eager[it->second] = 1;
            }
        }
    }
    return eager;
}

Status Transfers::download_output(void* out, const Tensor& tensor) {
    return device_->copy_to_host(out, tensor.data, tensor.n_bytes());
}

StatusOr<Transfers::IdSources> Transfers::fetch_expert_ids(RunState& rs) {
    // Ids still only on the device are gathered into page-locked staging in one transfer (a copy per
    // layer costs a few microseconds of device time each: ~0.2 ms per token on 48 layers).
    IdSources sources;
    std::vector<const Tensor*> fetched;
    std::vector<DeviceRegion> regions;
    size_t fetch_bytes = 0;
    for (const Tensor* ids : rs.moe_ids) {
        if (auto it = rs.ids_on_host.find(ids); it != rs.ids_on_host.end()) {
            sources.emplace_back(ids, it->second.data());
        } else if (rs.side_of_storage(ids, weights_) == Side::HOST) {
            sources.emplace_back(ids, ids->as<int32_t>());
        } else if (const Tensor* sh = rs.shadow(ids, Side::HOST)) {
            sources.emplace_back(ids, sh->as<int32_t>());
        } else {
            fetched.push_back(ids);
            const size_t n = static_cast<size_t>(ids->n_elements()) * sizeof(int32_t);
            regions.push_back(DeviceRegion{ids->data, n});
            fetch_bytes += n;
        }
    }
    if (fetch_bytes == 0) return sources;
    if (!ids_staging_ || ids_staging_->size() < fetch_bytes) {
        ids_staging_.reset();
        MOE_ASSIGN_OR_RETURN(ids_staging_, device_->alloc_host_buffer(fetch_bytes));
    }
    auto* staging = static_cast<uint8_t*>(ids_staging_->data());
    MOE_RETURN_IF_ERROR(device_->gather_to_host(staging, regions));
    size_t offset = 0;
    for (size_t i = 0; i < fetched.size(); ++i) {
        sources.emplace_back(fetched[i], reinterpret_cast<const int32_t*>(staging + offset));
        offset += regions[i].n;
    }
    return sources;
}

// The link as the uploads see it: one upload of the largest host-resident weight into slot 0.
StatusOr<double> Transfers::upload_seconds_per_byte() {
    if (upload_s_per_byte_ > 0.0) return upload_s_per_byte_;
    const Tensor* largest = weights_.largest_host_weight();
    if (largest == nullptr) return internal_error("scheduler: no host-resident weight to time an upload with");
    const void* src = weights_.usable(largest, true)->host;
    MOE_RETURN_IF_ERROR(ensure_ring());
    MOE_RETURN_IF_ERROR(device_->synchronize());  // slot 0 may still be in use
    // The fastest of a few: one upload that the OS delays would make every later split look better than it is.
    constexpr int kTimedUploads = 3;
    double fastest = 0.0;
    for (int i = 0; i < kTimedUploads; ++i) {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(device_->upload(slot_buffer_->data(), src, largest->n_bytes(), 0));
        MOE_RETURN_IF_ERROR(device_->synchronize());
        const double s = seconds_since(t0);
        fastest = i == 0 ? s : std::min(fastest, s);
    }
    upload_s_per_byte_ = std::max(fastest, 1e-9) / static_cast<double>(largest->n_bytes());
    return upload_s_per_byte_;
}

}  // namespace moe::sched
