#include "sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/allocator.h"
#include "core/stable_arena.h"
#include "sched/clock.h"
#include "sched/expert_runs.h"

namespace moe::sched {
namespace {

// Bytes from a tensor's first to its last element (strided views included).
size_t byte_extent(const Tensor& t) {
    if (t.is_contiguous()) return t.n_bytes();
    size_t extent = static_cast<size_t>(row_bytes(t.type, t.ne[0]));
    for (int d = 1; d < 4; ++d) extent += static_cast<size_t>(t.ne[d] - 1) * t.nb[d];
    return extent;
}

// The ids operand of an expert op, or nullptr.
const Tensor* expert_ids_of(const Tensor& node) {
    if (node.op == Op::MUL_MAT_ID) return node.src[2];
    if (node.op == Op::MOE_UP_GATE) return node.src[3];
    return nullptr;
}

// Whether operand src_index of node is an expert matrix that ACTIVE_ONLY may upload in part.
bool is_expert_matrix(const Tensor& node, int src_index) {
    return (node.op == Op::MUL_MAT_ID && src_index == 0) || (node.op == Op::MOE_UP_GATE && src_index <= 1);
}

// Tokens an offloadable op processes (what its min_batch compares with).
int64_t op_tokens(const Tensor& node) {
    switch (node.op) {
        case Op::MUL_MAT: return node.src[1]->n_rows();
        case Op::MUL_MAT_ID: return node.src[1]->ne[2];
        case Op::MOE_UP_GATE: return node.src[2]->ne[1];
        default: return 0;
    }
}

constexpr int kMinSlots = 4;  // one node may upload up to four operands (up, gate and their biases)

}  // namespace

struct Scheduler::RunState {
    std::unordered_map<const Tensor*, Side> produced;  // arena storage (inputs and nodes) -> side
    AllocPlan plan;
    uint8_t* base[kSides] = {};
    StableArena<Tensor> subs;                                    // operand stand-ins of this ubatch
    std::map<std::pair<const Tensor*, int>, Tensor*> shadows;    // (tensor, side) -> its copy there
    std::unordered_map<const Tensor*, std::vector<int32_t>> ids_on_host;
    std::vector<const Tensor*> moe_ids;                          // expert ids tensors, for the counts
    std::vector<Tensor*> pending;                                // nodes not yet handed to a backend
    Side pending_side = Side::HOST;
    std::vector<size_t> pending_slots;                           // upload slots the pending nodes read
    std::vector<size_t> node_slots;                              // ... the node being prepared reads
    // Host compute must first wait for queued device copies: until fence host_fence (0: for the whole
    // device, where copies do not mark fences).
    bool host_waits = false;
    uint64_t host_fence = 0;
    std::vector<uint8_t> eager;  // per node (see CachedPlan::eager)
    const CachedPlan* cached = nullptr;  // the plan came from the cache (its counts go to the stats at run)
    // Expert split, measured for learn_split_costs().
    double split_host_seconds = 0.0;
    double split_wait_seconds = 0.0;
    double split_min_wait_seconds = 0.0;  // the shortest wait: the device's own latency, no upload in it
    int split_host_flushes = 0;
    Clock::time_point split_first_start, split_last_end;  // from the first host part's wait to the last's end
    int split_first_layer = 0, split_last_layer = 0;      // ... and their layers
    int split_host_layers = 0;                            // distinct layers among the host parts
    struct Prefetch {
        size_t slot;
        std::vector<uint8_t> uploaded;  // experts already on their way
    };
    std::map<std::pair<const Tensor*, int>, Prefetch> prefetched;  // (node, operand) -> its early upload
    std::set<size_t> reserved_slots;  // slots of early uploads not consumed yet: no other upload may take them
};

namespace {

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

Scheduler::Scheduler(Backend& host, Backend* device, int n_layer, int n_expert, int n_expert_used)
    : host_(host), device_(device), n_layer_(n_layer), n_expert_(n_expert), n_expert_used_(n_expert_used) {
    stats_.expert_counts.assign(static_cast<size_t>(std::max(n_layer, 0)) * static_cast<size_t>(std::max(n_expert, 0)), 0);
}

Scheduler::~Scheduler() {
    // Queued copies may still read or write the arenas and slots.
    if (device_ != nullptr) (void)device_->synchronize();
}

void Scheduler::add_weight(Tensor* weight, const WeightCopies& copies) {
    weights_[weight] = copies;
    // Expert matrices [K, N, n_expert] by layer (of the name: weights carry no layer tag), for the split.
    const int layer = layer_of(weight->name);
    if (weight->ne[2] == n_expert_ && weight->ne[3] == 1 && layer >= 0 && layer < n_layer_) {
        if (expert_matrices_.empty()) expert_matrices_.resize(static_cast<size_t>(n_layer_));
        expert_matrices_[static_cast<size_t>(layer)].push_back(weight);
    }
}

std::optional<WeightCopies> Scheduler::weight_copies(const Tensor* weight) const {
    auto it = weights_.find(weight);
    if (it == weights_.end()) return std::nullopt;
    WeightCopies c = it->second;
    if (c.duplicate && !policy_.bias_dup) {
        if (c.home == Side::HOST) {
            c.device = nullptr;
            c.device_buffer = nullptr;
        } else {
            c.host = nullptr;
            c.host_buffer = nullptr;
        }
    }
    return c;
}

int32_t Scheduler::min_batch(OffloadOp op) const { return resolved_min_batch(policy_, op, n_expert_, n_expert_used_); }

// The slot size: every host-resident weight may be uploaded (biases too, without duplication).
size_t Scheduler::largest_host_weight() const {
    size_t largest = 0;
    for (const auto& [w, c] : weights_) {
        if (c.home == Side::HOST) largest = std::max(largest, w->n_bytes());
    }
    return largest;
}

Status Scheduler::set_policy(const Policy& policy) {
    MOE_RETURN_IF_ERROR(validate_policy(policy));
    const size_t largest = largest_host_weight();
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
        if (device_ != nullptr) MOE_RETURN_IF_ERROR(device_->synchronize());
        slot_buffer_.reset();
        slots_.assign(n_slots, Slot{});
        slot_size_ = largest;
        next_slot_ = 0;
    }
    policy_ = policy;
    plans_.clear();  // sides depend on the policy
    prepared_.reset();
    last_selected_.clear();
    split_trials_.clear();
    return Status::ok();
}

Status Scheduler::ensure_slots() {
    if (slots_.empty()) return internal_error("scheduler: an upload is needed but no upload slots are configured");
    if (slot_buffer_) return Status::ok();
    StatusOr<std::unique_ptr<Buffer>> b = device_->alloc_buffer(slots_.size() * slot_size_);
    if (!b.is_ok()) return b.status().with_context("allocating " + std::to_string(slots_.size()) + " upload slots");
    slot_buffer_ = std::move(b).value();
    allocated_in_run_ = true;
    return Status::ok();
}

void Scheduler::reset_stats() {
    std::vector<uint64_t> counts = std::move(stats_.expert_counts);
    std::fill(counts.begin(), counts.end(), 0);
    stats_ = Stats{};
    stats_.expert_counts = std::move(counts);
}

void Scheduler::set_profiling(bool on) {
    profiling_ = on;
    op_times_ = OpTimes{};
}

Side Scheduler::side_of_storage(const Tensor* storage, const RunState& rs) const {
    auto it = rs.produced.find(storage);
    if (it != rs.produced.end()) return it->second;
    if (storage->is_weight) {
        auto w = weights_.find(storage);
        if (w != weights_.end()) return w->second.home;
    }
    if (storage->buffer != nullptr && !storage->buffer->is_host()) return Side::DEVICE;
    return Side::HOST;
}

Side Scheduler::assign(const Tensor& node, const RunState& rs) {
    if (device_ == nullptr) return Side::HOST;
    switch (node.op) {
        case Op::VIEW: return side_of_storage(storage_of(&node), rs);
        case Op::CPY:  // writes the KV cache: runs where the cache is, as does attention reading it
        case Op::ATTENTION: return side_of_storage(storage_of(node.src[1]), rs);
        default: break;
    }
    if (node.expert_group >= 0) {
        // A part of a split expert block runs where its group's experts are computed, whole.
        const std::optional<OffloadOp> kind = offload_op_of(node.op);
        const bool on_device = node.expert_group == kDeviceExpertGroup && device_->supports_op(node);
        if (kind) ++(on_device ? stats_.n_offloaded : stats_.n_kept_host)[static_cast<size_t>(*kind)];
        return on_device ? Side::DEVICE : Side::HOST;
    }
    const std::optional<OffloadOp> kind = offload_op_of(node.op);
    if (kind && node.src[0] != nullptr && node.src[0]->is_weight) {
        const std::optional<WeightCopies> w = weight_copies(node.src[0]);
        if (w && w->device != nullptr) return Side::DEVICE;
        const OffloadRule& rule = policy_.rule(*kind);
        const int k = static_cast<int>(*kind);
        if (rule.enabled && op_tokens(node) >= min_batch(*kind) && device_->supports_op(node)) {
            ++stats_.n_offloaded[static_cast<size_t>(k)];
            return Side::DEVICE;
        }
        ++stats_.n_kept_host[static_cast<size_t>(k)];
        return Side::HOST;
    }
    // Weights available on one side only pin the op there.
    for (const Tensor* s : node.src) {
        if (s == nullptr || !s->is_weight) continue;
        const std::optional<WeightCopies> w = weight_copies(s);
        if (!w) continue;
        if (w->host == nullptr) return Side::DEVICE;
        if (w->device == nullptr) return Side::HOST;
    }
    // The rest follow their operands, preferring the device.
    const bool host_ok = host_.supports_op(node);
    if (!device_->supports_op(node)) return Side::HOST;
    if (!host_ok) return Side::DEVICE;
    for (const Tensor* s : node.src) {
        if (s != nullptr && !s->is_weight && side_of_storage(storage_of(s), rs) == Side::DEVICE) return Side::DEVICE;
    }
    return Side::HOST;
}

Status Scheduler::ensure_arenas(size_t size) {
    for (int s = 0; s < kSides; ++s) {
        if (s == static_cast<int>(Side::DEVICE) && device_ == nullptr) continue;
        std::unique_ptr<Buffer>& a = arena_[s];
        if (a && a->size() >= size) continue;
        if (a && device_ != nullptr) MOE_RETURN_IF_ERROR(device_->synchronize());  // queued work may use it
        a.reset();
        StatusOr<std::unique_ptr<Buffer>> b = s == static_cast<int>(Side::DEVICE) ? device_->alloc_buffer(size)
                                              : device_ != nullptr                ? device_->alloc_host_buffer(size)
                                                                                  : host_.alloc_buffer(size);
        if (!b.is_ok()) {
            return b.status().with_context("allocating the " + std::string(side_name(static_cast<Side>(s))) +
                                           " activation arena of " + std::to_string(size) + " bytes");
        }
        a = std::move(b).value();
        allocated_in_run_ = true;
    }
    return Status::ok();
}

void Scheduler::bind(Graph& graph, RunState& rs) {
    for (const auto& [t, offset] : rs.plan.offsets) {
        const auto it = rs.produced.find(t);
        const int side = static_cast<int>(it != rs.produced.end() ? it->second : Side::HOST);
        Tensor* mt = const_cast<Tensor*>(t);
        mt->data = rs.base[side] + offset;
        mt->buffer = arena_[side].get();
    }
    bind_views(graph);
}

Tensor* Scheduler::substitute(RunState& rs, const Tensor& like, void* data, Buffer* buffer) {
    Tensor& t = rs.subs.emplace_back();
    t.type = like.type;
    std::copy(std::begin(like.ne), std::end(like.ne), t.ne);
    std::copy(std::begin(like.nb), std::end(like.nb), t.nb);
    t.data = data;
    t.buffer = buffer;
    t.is_weight = like.is_weight;
    t.layer = like.layer;
    t.name = like.name;
    return &t;
}

Status Scheduler::wait_for_device(RunState& rs) {
    const Clock::time_point t0 = Clock::now();
    MOE_RETURN_IF_ERROR(device_->synchronize());
    stats_.seconds_wait += seconds_since(t0);
    rs.host_waits = false;
    return Status::ok();
}

// Waits for the copies the host is about to read or overwrite, not for compute queued after them.
Status Scheduler::wait_host_fence(RunState& rs) {
    if (!rs.host_waits) return Status::ok();
    if (rs.host_fence == 0) return wait_for_device(rs);
    const Clock::time_point t0 = Clock::now();
    MOE_RETURN_IF_ERROR(device_->wait_fence(rs.host_fence));
    stats_.seconds_wait += seconds_since(t0);
    rs.host_waits = false;
    rs.host_fence = 0;
    return Status::ok();
}

// Marks the copies queued so far as what the host must wait for before its next compute.
Status Scheduler::mark_copy(RunState& rs) {
    MOE_ASSIGN_OR_RETURN(rs.host_fence, device_->mark_compute());
    rs.host_waits = true;
    return Status::ok();
}

Status Scheduler::flush(RunState& rs) {
    if (rs.pending.empty()) return Status::ok();
    const std::span<Tensor* const> nodes(rs.pending);
    if (rs.pending_side == Side::HOST) {
        const bool split_part = std::any_of(nodes.begin(), nodes.end(), [](const Tensor* n) {
            return n->expert_group == kHostExpertGroup;
        });
        const Clock::time_point t_wait = Clock::now();
        MOE_RETURN_IF_ERROR(wait_host_fence(rs));
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(host_.compute(nodes));
        const double host_seconds = seconds_since(t0);
        stats_.seconds_host_compute += host_seconds;
        if (split_part) {
            const double wait = std::chrono::duration<double>(t0 - t_wait).count();
            rs.split_min_wait_seconds = rs.split_host_flushes == 0 ? wait : std::min(rs.split_min_wait_seconds, wait);
            const int layer = nodes.front()->layer;
            if (rs.split_host_flushes == 0) {
                rs.split_first_start = t_wait;
                rs.split_first_layer = layer;
            }
            if (rs.split_host_flushes == 0 || layer != rs.split_last_layer) ++rs.split_host_layers;
            rs.split_last_end = Clock::now();
            rs.split_last_layer = layer;
            rs.split_wait_seconds += wait;
            rs.split_host_seconds += host_seconds;
            ++rs.split_host_flushes;
        }
    } else {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(device_->compute(nodes));
        MOE_ASSIGN_OR_RETURN(const uint64_t fence, device_->mark_compute());
        stats_.seconds_device_submit += seconds_since(t0);
        for (size_t s : rs.pending_slots) slots_[s].fence = fence;
    }
    rs.pending.clear();
    rs.pending_slots.clear();
    return Status::ok();
}

StatusOr<Tensor*> Scheduler::activation_operand(Tensor* src, Side side, RunState& rs) {
    const Tensor* st = storage_of(src);
    const Side from = side_of_storage(st, rs);
    if (from == side) return src;
    auto key = std::make_pair(static_cast<const Tensor*>(src), static_cast<int>(side));
    if (auto it = rs.shadows.find(key); it != rs.shadows.end()) return it->second;
    if (!rs.plan.offsets.count(st)) {
        return internal_error("scheduler: '" + src->name + "' lives outside the activation arenas on the " +
                              side_name(from) + " but is needed on the " + side_name(side));
    }
    MOE_RETURN_IF_ERROR(flush(rs));
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
    Tensor* shadow = substitute(rs, *src, dst, arena_[static_cast<int>(side)].get());
    rs.shadows[key] = shadow;
    return shadow;
}

StatusOr<const std::vector<int32_t>*> Scheduler::read_ids(const Tensor* ids, RunState& rs) {
    const Tensor* st = storage_of(ids);
    if (auto it = rs.ids_on_host.find(st); it != rs.ids_on_host.end()) return &it->second;
    if (!ids->is_contiguous() || ids->type != Type::I32) {
        return internal_error("scheduler: expert ids '" + ids->name + "' must be contiguous I32");
    }
    std::vector<int32_t> v(static_cast<size_t>(ids->n_elements()));
    MOE_RETURN_IF_ERROR(flush(rs));
    if (side_of_storage(st, rs) == Side::HOST) {
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

StatusOr<Tensor*> Scheduler::weight_operand(Tensor& node, int src_index, Side side, RunState& rs) {
    Tensor* w = node.src[src_index];
    const std::optional<WeightCopies> c = weight_copies(w);
    if (!c) return internal_error("scheduler: weight '" + w->name + "' was not registered");
    const size_t n = w->n_bytes();
    if (side == Side::HOST) {
        if (c->host != nullptr) return c->host == w->data ? w : substitute(rs, *w, c->host, c->host_buffer);
        // A weight that lives only in device memory, read on the host: fetched for this use (what bias
        // duplication avoids).
        std::unique_ptr<Buffer>& buf = download_buffers_[w];
        if (!buf) {
            MOE_ASSIGN_OR_RETURN(buf, device_->alloc_host_buffer(n));
        }
        MOE_RETURN_IF_ERROR(flush(rs));
        MOE_RETURN_IF_ERROR(device_->copy_to_host(buf->data(), c->device, n));
        MOE_RETURN_IF_ERROR(mark_copy(rs));
        stats_.bytes_weights_full += n;
        ++stats_.n_weight_copies;
        return substitute(rs, *w, buf->data(), buf.get());
    }
    if (c->device != nullptr) return c->device == w->data ? w : substitute(rs, *w, c->device, c->device_buffer);

    // Host-resident weight used on the device: upload it into the next slot of the ring (or the slot
    // its prefetch already took).
    MOE_RETURN_IF_ERROR(ensure_slots());
    MOE_RETURN_IF_ERROR(flush(rs));
    const auto pre = rs.prefetched.find({&node, src_index});
    size_t slot = 0;
    if (pre != rs.prefetched.end()) {
        slot = pre->second.slot;
        rs.reserved_slots.erase(slot);
    } else {
        MOE_ASSIGN_OR_RETURN(slot, take_slot(rs));
    }
    rs.node_slots.push_back(slot);
    uint8_t* dst = static_cast<uint8_t*>(slot_buffer_->data()) + slot * slot_size_;
    const auto* src = static_cast<const uint8_t*>(c->host);
    const uint64_t after = slots_[slot].fence;
    if (splits_experts_of(node, src_index)) {
        // The device part of a split expert block: only the device group's experts (unless the
        // look-ahead already sent them).
        std::vector<uint8_t> on_device = device_experts(node.layer);
        const size_t prefetched = pre != rs.prefetched.end() ? drop_uploaded(on_device, pre->second.uploaded, w->nb[2]) : 0;
        MOE_ASSIGN_OR_RETURN(const size_t sent, upload_experts(dst, src, w->nb[2], on_device, after));
        stats_.bytes_weights_skipped += n - sent - prefetched;
    } else if (uploads_active_experts(node, src_index)) {
        MOE_ASSIGN_OR_RETURN(const std::vector<int32_t>* ids, read_ids(expert_ids_of(node), rs));
        MOE_ASSIGN_OR_RETURN(std::vector<uint8_t> selected, selected_experts(*ids, n_expert_));
        const size_t per_expert = w->nb[2];
        size_t prefetched = 0;  // bytes uploaded before the readback (counted then)
        std::vector<uint8_t> missing = selected;
        if (pre != rs.prefetched.end()) {
            prefetched = drop_uploaded(missing, pre->second.uploaded, per_expert);
            last_selected_[w] = std::move(selected);
        }
        MOE_ASSIGN_OR_RETURN(const size_t sent, upload_experts(dst, src, per_expert, missing, after));
        stats_.bytes_weights_skipped += n - prefetched - sent;
    } else {
        MOE_RETURN_IF_ERROR(device_->upload(dst, src, n, after));
        stats_.bytes_weights_full += n;
        ++stats_.n_weight_copies;
    }
    // Compute from here on waits for the uploads queued so far: this node's (early ones included) and
    // earlier ones. Until now it did not, so the look-ahead's uploads for the next split layer hold up
    // neither this layer's host part's inputs nor its result's way back.
    MOE_RETURN_IF_ERROR(device_->order_after_uploads());
    return substitute(rs, *w, dst, slot_buffer_.get());
}

// Uploads the marked experts of an expert tensor (src) into its slot (dst), one copy per run of
// adjacent experts, at their own offsets; returns the bytes sent (counted in bytes_weights_experts).
StatusOr<size_t> Scheduler::upload_experts(uint8_t* dst, const uint8_t* src, size_t per_expert,
                                           const std::vector<uint8_t>& experts, uint64_t after) {
    size_t sent = 0;
    for (const ExpertRun& r : coalesce_runs(experts)) {
        const size_t offset = static_cast<size_t>(r.first) * per_expert;
        const size_t bytes = static_cast<size_t>(r.count) * per_expert;
        MOE_RETURN_IF_ERROR(device_->upload(dst + offset, src + offset, bytes, after));
        sent += bytes;
        ++stats_.n_weight_copies;
    }
    stats_.bytes_weights_experts += sent;
    return sent;
}

bool Scheduler::uploads_active_experts(const Tensor& node, int src_index) const {
    return policy_.expert_copy != ExpertCopy::FULL && node.expert_group < 0 && is_expert_matrix(node, src_index) &&
           node.src[src_index]->ne[2] == n_expert_;
}

// The next slot of the ring that neither an early upload nor the node being prepared holds.
StatusOr<size_t> Scheduler::take_slot(RunState& rs) {
    for (size_t tries = 0; tries < slots_.size(); ++tries) {
        const size_t s = next_slot_++ % slots_.size();
        if (!rs.reserved_slots.count(s) && std::find(rs.node_slots.begin(), rs.node_slots.end(), s) == rs.node_slots.end()) {
            return s;
        }
    }
    return internal_error("scheduler: every upload slot is held by an early upload");
}

bool Scheduler::splits_experts_of(const Tensor& node, int src_index) const {
    return node.expert_group == kDeviceExpertGroup && is_expert_matrix(node, src_index) && !split_.groups.empty() &&
           node.layer >= 0 && node.layer < n_layer_ && node.src[src_index]->ne[2] == n_expert_;
}

// Before the host blocks in the host part of split layer L: queues the uploads of the device part of
// the next split layer, so the copy engine keeps streaming (and the device computes layer L+1's part
// as soon as the host's result of L arrives) instead of waiting for the host to reach those nodes.
Status Scheduler::look_ahead_split(const std::vector<Tensor*>& nodes, const std::vector<Side>& sides, size_t from,
                                   RunState& rs) {
    int layer = -1;
    // Only with slots to spare: the held slots wait for their nodes, and the nodes in between (biases,
    // offloaded dense weights) must still find kMinSlots free.
    constexpr size_t kHeld = 3;  // up, gate and down of one layer
    if (slots_.size() < rs.reserved_slots.size() + kHeld + kMinSlots) return Status::ok();
    for (size_t j = from; j < nodes.size(); ++j) {
        Tensor& n = *nodes[j];
        if (n.expert_group != kDeviceExpertGroup || (n.op != Op::MOE_UP_GATE && n.op != Op::MUL_MAT_ID) ||
            sides[j] != Side::DEVICE) {
            continue;
        }
        if (n.layer == nodes[from]->layer) continue;  // this layer's part is already on its way
        if (layer >= 0 && n.layer != layer) break;
        layer = n.layer;
        for (int k = 0; k < kMaxSrc; ++k) {
            if (n.src[k] == nullptr || !n.src[k]->is_weight || !splits_experts_of(n, k)) continue;
            if (rs.prefetched.count({&n, k})) continue;
            const std::optional<WeightCopies> c = weight_copies(n.src[k]);
            if (!c || c->device != nullptr) continue;
            if (rs.reserved_slots.size() + kMinSlots >= slots_.size()) return Status::ok();
            MOE_RETURN_IF_ERROR(early_upload(n, k, c->host, device_experts(n.layer), rs));
        }
    }
    return Status::ok();
}

// ACTIVE_PREFETCH: queues the upload of the experts this tensor needed last time, before the router's
// choices are read back, so that it overlaps the compute already queued.
Status Scheduler::prefetch_experts(Tensor& node, int src_index, RunState& rs) {
    const Tensor* w = node.src[src_index];
    const std::optional<WeightCopies> c = weight_copies(w);
    if (!c || c->device != nullptr || !uploads_active_experts(node, src_index)) return Status::ok();
    MOE_RETURN_IF_ERROR(flush(rs));
    std::vector<uint8_t> experts(static_cast<size_t>(n_expert_), 0);
    if (auto it = last_selected_.find(w); it != last_selected_.end()) experts = it->second;
    return early_upload(node, src_index, c->host, std::move(experts), rs);
}

// Uploads the marked experts of operand src_index of node into a slot held until the node takes it
// (weight_operand then sends only what is still missing). REQUIRES: nothing pending.
Status Scheduler::early_upload(Tensor& node, int src_index, const void* host, std::vector<uint8_t> experts,
                               RunState& rs) {
    MOE_RETURN_IF_ERROR(ensure_slots());
    MOE_ASSIGN_OR_RETURN(const size_t slot, take_slot(rs));
    rs.reserved_slots.insert(slot);
    uint8_t* dst = static_cast<uint8_t*>(slot_buffer_->data()) + slot * slot_size_;
    MOE_RETURN_IF_ERROR(upload_experts(dst, static_cast<const uint8_t*>(host), node.src[src_index]->nb[2], experts,
                                       slots_[slot].fence)
                            .status());
    rs.prefetched[{&node, src_index}] = RunState::Prefetch{slot, std::move(experts)};
    return Status::ok();
}

Status Scheduler::prepare_operands(Tensor& node, Side side, RunState& rs) {
    // Expert matrices first: ACTIVE_ONLY reads the node's ids before they are redirected.
    Tensor* original[kMaxSrc];
    std::copy(std::begin(node.src), std::end(node.src), original);
    if (side == Side::DEVICE && policy_.expert_copy == ExpertCopy::ACTIVE_PREFETCH) {
        for (int j = 0; j < kMaxSrc; ++j) {
            if (original[j] != nullptr && original[j]->is_weight) MOE_RETURN_IF_ERROR(prefetch_experts(node, j, rs));
        }
    }
    for (int j = 0; j < kMaxSrc; ++j) {
        Tensor* s = original[j];
        if (s == nullptr) continue;
        if (s->is_weight) {
            MOE_ASSIGN_OR_RETURN(Tensor* w, weight_operand(node, j, side, rs));
            node.src[j] = w;
        }
    }
    for (int j = 0; j < kMaxSrc; ++j) {
        Tensor* s = original[j];
        if (s == nullptr || s->is_weight) continue;
        MOE_ASSIGN_OR_RETURN(Tensor* a, activation_operand(s, side, rs));
        node.src[j] = a;
    }
    return Status::ok();
}

StatusOr<Scheduler::IdSources> Scheduler::fetch_expert_ids(RunState& rs) {
    // Ids still only on the device are gathered into page-locked staging in one transfer (a copy per
    // layer costs a few microseconds of device time each: ~0.2 ms per token on 48 layers).
    IdSources sources;
    std::vector<const Tensor*> fetched;
    std::vector<DeviceRegion> regions;
    size_t fetch_bytes = 0;
    for (const Tensor* ids : rs.moe_ids) {
        if (auto it = rs.ids_on_host.find(ids); it != rs.ids_on_host.end()) {
            sources.emplace_back(ids, it->second.data());
        } else if (side_of_storage(ids, rs) == Side::HOST) {
            sources.emplace_back(ids, ids->as<int32_t>());
        } else if (auto sh = rs.shadows.find({ids, static_cast<int>(Side::HOST)}); sh != rs.shadows.end()) {
            sources.emplace_back(ids, sh->second->as<int32_t>());
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

Status Scheduler::count_experts(const IdSources& sources, int n_tokens) {
    if (device_ != nullptr) {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(device_->synchronize());
        stats_.seconds_wait += seconds_since(t0);
    }
    std::vector<uint32_t> counts(stats_.expert_counts.size(), 0);
    for (const auto& [ids, p] : sources) {
        if (ids->layer < 0 || ids->layer >= n_layer_) continue;
        uint32_t* row = counts.data() + static_cast<size_t>(ids->layer) * static_cast<size_t>(n_expert_);
        for (int64_t i = 0; i < ids->n_elements(); ++i) {
            const int32_t e = p[i];
            if (e >= 0 && e < n_expert_) ++row[e];
        }
    }
    for (size_t i = 0; i < counts.size(); ++i) stats_.expert_counts[i] += counts[i];
    // The expert split predicts the next prompt ubatch's counts from this one (not from decode steps).
    if (n_tokens >= n_expert_) {
        last_counts_ = std::move(counts);
        last_counts_tokens_ = n_tokens;
    }
    return Status::ok();
}

namespace {

// FNV-1a over what the plan depends on: ops, layers, and the shapes of tensors that own memory.
uint64_t graph_signature(const Graph& graph, size_t n_inputs) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        h ^= v;
        h *= 1099511628211ull;
    };
    mix(graph.nodes().size());
    mix(n_inputs);
    for (const Tensor* n : graph.nodes()) {
        mix(static_cast<uint64_t>(n->op));
        mix(static_cast<uint64_t>(n->layer + 1));
        if (n->view_src == nullptr) {
            for (int64_t d : n->ne) mix(static_cast<uint64_t>(d));
            mix(static_cast<uint64_t>(n->type));
        }
        for (const Tensor* s : n->src) {
            if (s != nullptr && s->op == Op::NONE) {
                for (int64_t d : s->ne) mix(static_cast<uint64_t>(d));
            }
        }
    }
    return h;
}

}  // namespace

// Sides for every node and arena offsets: from the cache, or decided now (nodes in order, so each
// node's operands are placed before it) and cached.
bool Scheduler::apply_cached_plan(Graph& graph, std::span<const HostInput> inputs, uint64_t key, RunState& rs,
                                  std::vector<Side>& sides) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    for (const HostInput& in : inputs) rs.produced[in.tensor] = Side::HOST;
    const auto it = plans_.find(key);
    if (it == plans_.end() || it->second.sides.size() != nodes.size()) return false;
    const CachedPlan& c = it->second;
    sides = c.sides;
    rs.eager = c.eager;
    rs.plan.arena_size = c.arena_size;
    rs.produced.reserve(rs.produced.size() + nodes.size());
    rs.plan.offsets.reserve(nodes.size() + inputs.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i]->view_src == nullptr) rs.produced[nodes[i]] = sides[i];
        if (c.node_offset[i] >= 0) rs.plan.offsets[nodes[i]] = static_cast<size_t>(c.node_offset[i]);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (c.input_offset[i] >= 0) rs.plan.offsets[inputs[i].tensor] = static_cast<size_t>(c.input_offset[i]);
    }
    rs.cached = &c;
    return true;
}

Status Scheduler::plan(Graph& graph, std::span<const HostInput> inputs, RunState& rs, std::vector<Side>& sides) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    const uint64_t key = graph_signature(graph, inputs.size());
    if (apply_cached_plan(graph, inputs, key, rs, sides)) return Status::ok();

    std::array<uint64_t, kOffloadOps> offloaded_before, kept_before;
    std::copy(std::begin(stats_.n_offloaded), std::end(stats_.n_offloaded), offloaded_before.begin());
    std::copy(std::begin(stats_.n_kept_host), std::end(stats_.n_kept_host), kept_before.begin());
    sides.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
        sides[i] = assign(*nodes[i], rs);
        if (nodes[i]->view_src == nullptr) rs.produced[nodes[i]] = sides[i];
    }
    rs.plan = plan_allocation(graph);
    rs.eager = eager_downloads(graph, sides);

    CachedPlan c;
    c.sides = sides;
    c.eager = rs.eager;
    c.arena_size = rs.plan.arena_size;
    size_t found = 0;
    c.node_offset.assign(nodes.size(), -1);
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (auto o = rs.plan.offsets.find(nodes[i]); o != rs.plan.offsets.end()) {
            c.node_offset[i] = static_cast<int64_t>(o->second);
            ++found;
        }
    }
    c.input_offset.assign(inputs.size(), -1);
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (auto o = rs.plan.offsets.find(inputs[i].tensor); o != rs.plan.offsets.end()) {
            c.input_offset[i] = static_cast<int64_t>(o->second);
            ++found;
        }
    }
    for (int k = 0; k < kOffloadOps; ++k) {
        c.offloaded[static_cast<size_t>(k)] = stats_.n_offloaded[static_cast<size_t>(k)] - offloaded_before[static_cast<size_t>(k)];
        c.kept_host[static_cast<size_t>(k)] = stats_.n_kept_host[static_cast<size_t>(k)] - kept_before[static_cast<size_t>(k)];
    }
    // Cache only plans that the indices describe completely (no planned leaf other than the inputs).
    if (found == rs.plan.offsets.size()) plans_[key] = std::move(c);
    return Status::ok();
}

void Scheduler::keep_expert_ids(const Graph& graph, RunState& rs) {
    for (const Tensor* n : graph.nodes()) {
        if (const Tensor* ids = expert_ids_of(*n)) {
            Tensor* st = const_cast<Tensor*>(storage_of(ids));
            if (std::find(rs.moe_ids.begin(), rs.moe_ids.end(), st) == rs.moe_ids.end()) {
                st->is_output = true;
                rs.moe_ids.push_back(st);
            }
        }
    }
}

bool Scheduler::arenas_hold(size_t size) const {
    for (int s = 0; s < kSides; ++s) {
        if (s == static_cast<int>(Side::DEVICE) && device_ == nullptr) continue;
        if (!arena_[s] || arena_[s]->size() < size) return false;
    }
    return true;
}

void Scheduler::prepare(Graph& graph, std::span<Tensor* const> input_tensors) {
    prepared_.reset();
    if (profiling_) return;
    auto p = std::make_unique<Prepared>();
    p->graph = graph.serial();
    p->inputs.assign(input_tensors.begin(), input_tensors.end());
    p->rs = std::make_unique<RunState>();
    std::vector<HostInput> inputs;
    for (Tensor* t : input_tensors) inputs.push_back({t, nullptr});
    keep_expert_ids(graph, *p->rs);
    // The arenas may be in use by the device: a plan that would grow them waits for its run().
    if (!apply_cached_plan(graph, inputs, graph_signature(graph, inputs.size()), *p->rs, p->sides) ||
        !arenas_hold(p->rs->plan.arena_size)) {
        return;
    }
    for (int s = 0; s < kSides; ++s) p->rs->base[s] = arena_[s] ? static_cast<uint8_t*>(arena_[s]->data()) : nullptr;
    bind(graph, *p->rs);
    prepared_ = std::move(p);
}

Status Scheduler::run(Graph& graph, int n_tokens, std::span<const HostInput> inputs, std::span<const HostOutput> outputs,
                      const std::function<void()>& while_waiting) {
    const Clock::time_point t_start = Clock::now();
    allocated_in_run_ = false;
    const std::vector<Tensor*>& nodes = graph.nodes();

    // The plan prepare() made for this very graph and inputs, or one made now.
    std::unique_ptr<Prepared> ahead = std::move(prepared_);
    bool planned = ahead != nullptr && ahead->graph == graph.serial() && ahead->inputs.size() == inputs.size();
    for (size_t i = 0; planned && i < inputs.size(); ++i) planned = ahead->inputs[i] == inputs[i].tensor;
    std::unique_ptr<RunState> owned = planned ? std::move(ahead->rs) : std::make_unique<RunState>();
    RunState& rs = *owned;
    std::vector<Side> sides;
    if (planned) {
        sides = std::move(ahead->sides);
        ++stats_.n_planned_ahead;
    } else {
        keep_expert_ids(graph, rs);
        MOE_RETURN_IF_ERROR(plan(graph, inputs, rs, sides));
    }
    ahead.reset();
    if (rs.cached != nullptr) {
        for (int k = 0; k < kOffloadOps; ++k) {
            stats_.n_offloaded[static_cast<size_t>(k)] += rs.cached->offloaded[static_cast<size_t>(k)];
            stats_.n_kept_host[static_cast<size_t>(k)] += rs.cached->kept_host[static_cast<size_t>(k)];
        }
    }
    MOE_RETURN_IF_ERROR(ensure_arenas(rs.plan.arena_size));
    bool rebind = !planned;
    for (int s = 0; s < kSides; ++s) {
        uint8_t* base = arena_[s] ? static_cast<uint8_t*>(arena_[s]->data()) : nullptr;
        rebind = rebind || base != rs.base[s];
        rs.base[s] = base;
    }
    if (rebind) bind(graph, rs);
    for (const HostInput& in : inputs) std::memcpy(in.tensor->data, in.data, in.tensor->n_bytes());

    Status status = [&]() -> Status {
        // Inputs read on the device are copied there up front, so no device span is cut to fetch them.
        for (const HostInput& in : inputs) {
            bool on_device = false;
            for (size_t i = 0; i < nodes.size() && !on_device; ++i) {
                if (sides[i] != Side::DEVICE || nodes[i]->op == Op::VIEW) continue;
                for (const Tensor* s : nodes[i]->src) on_device = on_device || (s != nullptr && storage_of(s) == in.tensor);
            }
            if (on_device) MOE_RETURN_IF_ERROR(activation_operand(in.tensor, Side::DEVICE, rs).status());
        }
        bool first = true;
        for (size_t i = 0; i < nodes.size(); ++i) {
            Tensor& node = *nodes[i];
            if (node.op == Op::VIEW) continue;  // names memory, computes nothing
            const Side side = sides[i];
            if (first || side != rs.pending_side) {
                MOE_RETURN_IF_ERROR(flush(rs));
                rs.pending_side = side;
                ++stats_.n_splits;
                first = false;
                if (node.expert_group == kHostExpertGroup && side == Side::HOST) {
                    MOE_RETURN_IF_ERROR(look_ahead_split(nodes, sides, i, rs));
                }
            }
            MOE_RETURN_IF_ERROR(prepare_operands(node, side, rs));
            if (!backend(side).supports_op(node)) {
                return unimplemented(std::string("the ") + backend(side).name() + " backend cannot compute " +
                                     op_name(node.op) + (node.src[0] ? " of '" + node.src[0]->name + "'" : ""));
            }
            rs.pending.push_back(&node);
            rs.pending_slots.insert(rs.pending_slots.end(), rs.node_slots.begin(), rs.node_slots.end());
            rs.node_slots.clear();
            // Queued right behind its producer, so the host part of a split expert block waits for
            // its inputs only, not for the device part queued next.
            if (rs.eager[i]) MOE_RETURN_IF_ERROR(activation_operand(&node, Side::HOST, rs).status());
            ++(side == Side::HOST ? stats_.n_ops_host : stats_.n_ops_device);
            // A device span goes out in pieces where the backend loses nothing by a cut, so the device
            // computes the first layers while the host prepares the others (all-GPU decode steps: the
            // host's planning of the whole step used to leave the device idle for ~0.1-0.3 ms per token).
            if (side == Side::DEVICE && device_->cut_after(node)) MOE_RETURN_IF_ERROR(flush(rs));
            if (profiling_) {
                const Clock::time_point t0 = Clock::now();
                MOE_RETURN_IF_ERROR(flush(rs));
                if (side == Side::DEVICE) MOE_RETURN_IF_ERROR(device_->synchronize());
                OpTime& slot = op_times_[static_cast<size_t>(side)][static_cast<size_t>(node.op)];
                ++slot.count;
                slot.seconds += seconds_since(t0);
            }
        }
        MOE_RETURN_IF_ERROR(flush(rs));
        MOE_ASSIGN_OR_RETURN(const IdSources id_sources, fetch_expert_ids(rs));
        std::vector<const HostOutput*> on_host;
        for (const HostOutput& out : outputs) {
            if (side_of_storage(storage_of(out.tensor), rs) == Side::DEVICE) {
                MOE_RETURN_IF_ERROR(device_->copy_to_host(out.data, out.tensor->data, out.tensor->n_bytes()));
            } else {
                on_host.push_back(&out);
            }
        }
        retired_.reset();  // the last ubatch's state, freed while the device computes this one
        if (while_waiting) while_waiting();
        MOE_RETURN_IF_ERROR(count_experts(id_sources, n_tokens));  // ends with the ubatch's synchronisation
        for (const HostOutput* out : on_host) std::memcpy(out->data, out->tensor->data, out->tensor->n_bytes());
        return Status::ok();
    }();
    if (!status.is_ok() && device_ != nullptr) (void)device_->synchronize();  // leave nothing in flight
    if (status.is_ok()) {
        learn_split_costs(rs);
        if (split_timed_) {
            // A ubatch that allocated arenas or slots paid one-off costs: not a fair sample (the trial
            // asks for the same side again).
            if (!allocated_in_run_) split_trials_.record(n_tokens, split_timed_on_, seconds_since(t_start));
            ++stats_.n_split_trials;
        }
        // Counted once the split ran (the graph of the plan), not when it was planned.
        stats_.n_split_layers += split_.n_layers;
        stats_.n_split_host_experts += split_.n_host_experts;
        split_.n_layers = split_.n_host_experts = 0;
    }
    ++stats_.n_ubatches;
    stats_.seconds_total += seconds_since(t_start);
    retired_ = std::move(owned);
    return status;
}

// Device nodes whose output a host part of a split expert block reads.
std::vector<uint8_t> Scheduler::eager_downloads(const Graph& graph, const std::vector<Side>& sides) const {
    const std::vector<Tensor*>& nodes = graph.nodes();
    std::vector<uint8_t> eager(nodes.size(), 0);
    std::unordered_map<const Tensor*, size_t> index;
    for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i]->expert_group != kHostExpertGroup || sides[i] != Side::HOST) continue;
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

// Folds this ubatch's host-part measurements into the costs the next split balances.
void Scheduler::learn_split_costs(const RunState& rs) {
    // Per-op synchronisation (profiling) would skew every term.
    if (profiling_ || rs.split_host_flushes == 0 || split_expected_pairs_ <= 0.0) return;
    const double per_pair = rs.split_host_seconds / split_expected_pairs_;
    // What the host's side of a split layer costs besides its expert pairs: the device's latency from
    // the host's result to the next layer's inputs (the shortest wait: the longer ones also wait for
    // uploads, which the balance counts on the other side) and the host's own work between two host
    // parts (queueing the device's nodes and uploads, bookkeeping), which no wait shows.
    // The second term only over consecutive split layers (a layer that does not split in between adds
    // device work that is not the host's); a layer's host part may take several flushes.
    double serial = rs.split_min_wait_seconds;
    const int layers = rs.split_host_layers;
    if (layers >= 2 && rs.split_last_layer - rs.split_first_layer == layers - 1) {
        const double span = std::chrono::duration<double>(rs.split_last_end - rs.split_first_start).count();
        serial += std::max(0.0, span - rs.split_host_seconds - rs.split_wait_seconds) / (layers - 1);
    }
    const bool first = split_host_s_per_pair_ <= 0.0;
    split_host_s_per_pair_ = first ? per_pair : 0.5 * (split_host_s_per_pair_ + per_pair);
    split_host_serial_s_ = first ? serial : 0.5 * (split_host_serial_s_ + serial);
}

}  // namespace moe::sched
