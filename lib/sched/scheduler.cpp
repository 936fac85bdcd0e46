#include "sched/scheduler.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "sched/clock.h"
#include "sched/graph_ops.h"

namespace moe::sched {

Scheduler::Scheduler(Backend& host, Backend* device, int n_layer, int n_expert, int n_expert_used)
    : host_(host),
      device_(device),
      n_layer_(n_layer),
      n_expert_(n_expert),
      n_expert_used_(n_expert_used),
      weights_(n_layer, n_expert),
      assignment_(host, device, weights_, policy_, n_expert, n_expert_used),
      splitter_(device != nullptr, weights_, policy_, assignment_, n_layer, n_expert, n_expert_used),
      transfers_(device, weights_, policy_, splitter_.current(), stats_, n_layer, n_expert,
                 [this](RunState& rs) { return flush(rs); }) {
    stats_.expert_counts.assign(static_cast<size_t>(std::max(n_layer, 0)) * static_cast<size_t>(std::max(n_expert, 0)), 0);
    assignment_.set_cached_whole([this](const Tensor* w) { return transfers_.cached_whole(w); });
}

Scheduler::~Scheduler() {
    // Queued copies may still read or write the arenas and slots.
    if (device_ != nullptr) (void)device_->synchronize();
}

void Scheduler::add_weight(Tensor* weight, const WeightCopies& copies) { weights_.add(weight, copies); }

std::optional<WeightCopies> Scheduler::weight_copies(const Tensor* weight) const {
    return weights_.usable(weight, policy_.bias_dup);
}

int32_t Scheduler::min_batch(OffloadOp op) const { return assignment_.min_batch(op); }

void Scheduler::set_offload_calibration(const OffloadCalibration& c) {
    assignment_.set_calibration(c);
    plans_.clear();  // sides depend on the thresholds
    prepared_.reset();
}

StatusOr<ExpertSplitPlan> Scheduler::plan_expert_split(int n_tokens) {
    MOE_ASSIGN_OR_RETURN(ExpertSplitPlan p, splitter_.plan(n_tokens, profiling_, transfers_));
    if (resident_layers_.empty()) return p;
    // Partly resident layers split on every ubatch: the resident experts are the device's group.
    const size_t n_expert = static_cast<size_t>(n_expert_);
    if (p.layers.empty()) {
        p.layers.assign(static_cast<size_t>(n_layer_), 0);
        p.groups.assign(static_cast<size_t>(n_layer_) * n_expert, kDeviceExpertGroup);
    }
    for (int il = 0; il < n_layer_; ++il) {
        if (!resident_.partial(il)) continue;
        p.layers[static_cast<size_t>(il)] = 1;
        const std::vector<int32_t> rows = slice_rows(resident_.residency(), il);
        for (size_t e = 0; e < n_expert; ++e) {
            p.groups[static_cast<size_t>(il) * n_expert + e] = rows[e] >= 0 ? kDeviceExpertGroup : kHostExpertGroup;
        }
    }
    return p;
}

Status Scheduler::set_resident_experts(const ExpertResidency& resident) {
    MOE_RETURN_IF_ERROR(resident_.init(resident, device_));
    resident_layers_.clear();
    if (resident.any()) {
        resident_layers_.assign(static_cast<size_t>(n_layer_), 0);
        for (int il = 0; il < n_layer_; ++il) resident_layers_[static_cast<size_t>(il)] = resident.partial(il) ? 1 : 0;
    }
    return Status::ok();
}

Status Scheduler::set_policy(const Policy& policy) {
    MOE_RETURN_IF_ERROR(validate_policy(policy));
    MOE_RETURN_IF_ERROR(transfers_.set_policy(policy));
    policy_ = policy;
    plans_.clear();  // sides depend on the policy
    prepared_.reset();
    splitter_.clear_trials();
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


Status Scheduler::flush(RunState& rs) {
    if (rs.pending.empty()) return Status::ok();
    const std::span<Tensor* const> nodes(rs.pending);
    if (rs.pending_side == Side::HOST) {
        const bool split_part = std::any_of(nodes.begin(), nodes.end(), [&rs](const Tensor* n) {
            return rs.group_of(*n) == kHostExpertGroup;
        });
        const Clock::time_point t_wait = Clock::now();
        MOE_RETURN_IF_ERROR(transfers_.wait_host_fence(rs));
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(host_.compute(nodes));
        const double host_seconds = seconds_since(t0);
        stats_.seconds_host_compute += host_seconds;
        if (split_part) rs.split_timing.record(t_wait, t0, host_seconds, nodes.front()->layer);
    } else {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(transfers_.mark_queued_copies(rs));
        MOE_RETURN_IF_ERROR(device_->compute(nodes));
        // Upload slots read by this span are reused after its fence; a span that read none (hybrid
        // decoding: the experts compute on the host) needs no fence.
        if (!rs.pending_slots.empty()) {
            MOE_ASSIGN_OR_RETURN(const uint64_t fence, device_->mark_compute());
            transfers_.fence_slots(rs.pending_slots, fence);
        }
        stats_.seconds_device_submit += seconds_since(t0);
    }
    rs.pending.clear();
    rs.pending_slots.clear();
    return Status::ok();
}


Status Scheduler::prepare_operands(Tensor& node, Side side, RunState& rs) {
    // The device part of a partly resident layer reads its experts from slices: its ids are remapped
    // to slice rows (MASK_IDS in remap mode, over the layer's row map).
    if (node.op == Op::MASK_IDS && side == Side::DEVICE && rs.group_of(node) == kDeviceExpertGroup) {
        if (Tensor* rows = resident_.row_map(node.layer)) {
            node.src[1] = rows;
            node.params.i[1] = 1;
        }
    }
    // Expert matrices first: ACTIVE_ONLY reads the node's ids before they are redirected.
    Tensor* original[kMaxSrc];
    std::copy(std::begin(node.src), std::end(node.src), original);
    if (side == Side::DEVICE && policy_.expert_copy == ExpertCopy::ACTIVE_PREFETCH) {
        for (int j = 0; j < kMaxSrc; ++j) {
            if (original[j] != nullptr && original[j]->is_weight) MOE_RETURN_IF_ERROR(transfers_.prefetch_experts(node, j, rs));
        }
    }
    for (int j = 0; j < kMaxSrc; ++j) {
        Tensor* s = original[j];
        if (s == nullptr) continue;
        if (s->is_weight) {
            MOE_ASSIGN_OR_RETURN(Tensor* w, transfers_.weight_operand(node, j, side, rs));
            node.src[j] = w;
        }
    }
    for (int j = 0; j < kMaxSrc; ++j) {
        Tensor* s = original[j];
        if (s == nullptr || s->is_weight) continue;
        MOE_ASSIGN_OR_RETURN(Tensor* a, transfers_.activation_operand(s, side, rs));
        node.src[j] = a;
    }
    return Status::ok();
}


Status Scheduler::count_experts(const Transfers::IdSources& sources, int n_tokens) {
    if (device_ != nullptr) {
        const Clock::time_point t0 = Clock::now();
        MOE_RETURN_IF_ERROR(device_->synchronize());
        stats_.seconds_wait += seconds_since(t0);
    }
    std::vector<uint32_t> counts(stats_.expert_counts.size(), 0);
    for (const auto& [ids, p] : sources) {
        if (ids->layer < 0 || ids->layer >= n_layer_) continue;
        uint32_t* row = counts.data() + static_cast<size_t>(ids->layer) * static_cast<size_t>(n_expert_);
        // Remapped ids (a partly resident layer's device part) are slice rows: counted as their experts.
        const bool rows = ids->op == Op::MASK_IDS && ids->params.i[1] != 0;
        const int32_t n_valid =
            rows ? static_cast<int32_t>(resident_.residency().experts[static_cast<size_t>(ids->layer)].size()) : n_expert_;
        for (int64_t i = 0; i < ids->n_elements(); ++i) {
            const int32_t e = p[i];
            if (e < 0 || e >= n_valid) continue;
            ++row[rows ? resident_.expert_of_row(ids->layer, e) : e];
        }
    }
    for (size_t i = 0; i < counts.size(); ++i) stats_.expert_counts[i] += counts[i];
    splitter_.observe_counts(std::move(counts), n_tokens);
    return Status::ok();
}

// Sides for every node and arena offsets: from the cache, or decided now (nodes in order, so each
// node's operands are placed before it) and cached.
bool Scheduler::apply_cached_plan(Graph& graph, std::span<const HostInput> inputs, uint64_t key, RunState& rs,
                                  std::vector<Side>& sides) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    for (const HostInput& in : inputs) rs.produced[in.tensor] = Side::HOST;
    // Sides depend on which expert matrices the expert cache holds whole (Assignment): a change there
    // makes every plan stale.
    if (transfers_.cache_generation() != plans_generation_) {
        plans_.clear();
        plans_generation_ = transfers_.cache_generation();
    }
    const CachedPlan* cached = plans_.find(key, nodes.size());
    if (cached == nullptr) return false;
    const CachedPlan& c = *cached;
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
    const uint64_t key = PlanCache::signature(graph, inputs.size());
    if (apply_cached_plan(graph, inputs, key, rs, sides)) return Status::ok();

    std::array<uint64_t, kOffloadOps> offloaded_before, kept_before;
    std::copy(std::begin(stats_.n_offloaded), std::end(stats_.n_offloaded), offloaded_before.begin());
    std::copy(std::begin(stats_.n_kept_host), std::end(stats_.n_kept_host), kept_before.begin());
    // A graph built ahead may be bound to a plan prepare() made and that was dropped since (a new policy,
    // other matrices whole in the expert cache): plan_allocation places only unbound inputs.
    for (const HostInput& in : inputs) in.tensor->data = nullptr;
    sides.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
        sides[i] = assignment_.side_of(*nodes[i], rs, stats_);
        if (nodes[i]->view_src == nullptr) rs.produced[nodes[i]] = sides[i];
    }
    rs.plan = plan_allocation(graph);
    rs.eager = transfers_.eager_downloads(graph, sides, rs);

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
    if (found == rs.plan.offsets.size()) plans_.store(key, std::move(c));
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

std::unique_ptr<RunState> Scheduler::take_run_state() {
    return spare_ != nullptr ? std::move(spare_) : std::make_unique<RunState>();
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
    p->rs = take_run_state();
    std::vector<HostInput> inputs;
    for (Tensor* t : input_tensors) inputs.push_back({t, nullptr});
    keep_expert_ids(graph, *p->rs);
    // The arenas may be in use by the device: a plan that would grow them waits for its run().
    if (!apply_cached_plan(graph, inputs, PlanCache::signature(graph, inputs.size()), *p->rs, p->sides) ||
        !arenas_hold(p->rs->plan.arena_size)) {
        return;
    }
    for (int s = 0; s < kSides; ++s) {
        p->rs->arena[s] = arena_[s].get();
        p->rs->base[s] = arena_[s] ? static_cast<uint8_t*>(arena_[s]->data()) : nullptr;
    }
    bind(graph, *p->rs);
    prepared_ = std::move(p);
}

Status Scheduler::run(Graph& graph, const ExpertParts& parts, int n_tokens, std::span<const HostInput> inputs,
                      std::span<const HostOutput> outputs, const std::function<double()>& while_waiting) {
    const Clock::time_point t_start = Clock::now();
    if (timeline_.on()) timeline_.begin(stats_, t_start);
    allocated_in_run_ = false;
    (void)transfers_.take_allocated();  // the split's planning timed an upload: not this run's
    transfers_.begin_ubatch();
    const std::vector<Tensor*>& nodes = graph.nodes();

    // The plan prepare() made for this very graph and inputs, or one made now.
    std::unique_ptr<Prepared> ahead = std::move(prepared_);
    bool planned = ahead != nullptr && ahead->graph == graph.serial() && ahead->inputs.size() == inputs.size();
    for (size_t i = 0; planned && i < inputs.size(); ++i) planned = ahead->inputs[i] == inputs[i].tensor;
    std::unique_ptr<RunState> owned = planned ? std::move(ahead->rs) : take_run_state();
    RunState& rs = *owned;
    rs.parts = &parts;
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
        rs.arena[s] = arena_[s].get();
    }
    if (rebind) bind(graph, rs);
    for (const HostInput& in : inputs) {
        if (in.peer == nullptr) std::memcpy(in.tensor->data, in.data, in.tensor->n_bytes());
    }

    double others = 0.0;  // seconds of while_waiting that were other schedulers' runs
    Status status = [&]() -> Status {
        // Inputs read on the device are copied there up front, so no device span is cut to fetch them.
        for (const HostInput& in : inputs) {
            bool read_on[kSides] = {false, false};
            bool via_view = false;
            for (size_t i = 0; i < nodes.size(); ++i) {
                if (nodes[i]->op == Op::VIEW) continue;
                for (const Tensor* s : nodes[i]->src) {
                    if (s == nullptr || storage_of(s) != in.tensor) continue;
                    read_on[static_cast<int>(sides[i])] = true;
                    via_view = via_view || s != in.tensor;
                }
            }
            const bool on_device = read_on[static_cast<int>(Side::DEVICE)];
            const bool on_host = read_on[static_cast<int>(Side::HOST)];
            if (in.peer != nullptr) {
                if (device_ == nullptr) {
                    return internal_error("scheduler: input '" + in.tensor->name + "' is in another device's memory "
                                          "but this scheduler has no device");
                }
                // A view of it is copied to the device from the host arena (Transfers::activation_operand),
                // which must then hold it too.
                if (on_device || on_host) {
                    MOE_RETURN_IF_ERROR(transfers_.peer_input(in.tensor, *in.peer, in.data, on_host || via_view, rs));
                }
            } else if (on_device) {
                MOE_RETURN_IF_ERROR(transfers_.activation_operand(in.tensor, Side::DEVICE, rs).status());
            }
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
                if (rs.group_of(node) == kHostExpertGroup && side == Side::HOST) {
                    MOE_RETURN_IF_ERROR(transfers_.look_ahead_split(nodes, sides, i, rs));
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
            if (rs.eager[i]) MOE_RETURN_IF_ERROR(transfers_.activation_operand(&node, Side::HOST, rs).status());
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
        MOE_ASSIGN_OR_RETURN(const Transfers::IdSources id_sources, transfers_.fetch_expert_ids(rs));
        std::vector<const HostOutput*> on_host;
        for (const HostOutput& out : outputs) {
            if (rs.side_of_storage(storage_of(out.tensor), weights_) == Side::DEVICE) {
                if (out.on_device != nullptr) {
                    *out.on_device = out.tensor->data;
                    continue;
                }
                MOE_RETURN_IF_ERROR(transfers_.download_output(out.data, *out.tensor));
            } else {
                if (out.on_device != nullptr) *out.on_device = nullptr;
                on_host.push_back(&out);
            }
        }
        // The last ubatch's state, cleared while the device computes this one.
        if (retired_ != nullptr) {
            retired_->clear();
            spare_ = std::move(retired_);
        }
        if (while_waiting) others = while_waiting();
        MOE_RETURN_IF_ERROR(count_experts(id_sources, n_tokens));  // ends with the ubatch's synchronisation
        for (const HostOutput* out : on_host) std::memcpy(out->data, out->tensor->data, out->tensor->n_bytes());
        return Status::ok();
    }();
    if (!status.is_ok() && device_ != nullptr) (void)device_->synchronize();  // leave nothing in flight
    if (status.is_ok()) {
        allocated_in_run_ = transfers_.take_allocated() || allocated_in_run_;
        splitter_.finish(rs.split_timing, n_tokens, seconds_since(t_start) - others, !allocated_in_run_, profiling_,
                         stats_);
    }
    ++stats_.n_ubatches;
    stats_.seconds_total += seconds_since(t_start) - others;
    if (timeline_.on()) timeline_.end(stats_, n_tokens, status.is_ok());
    retired_ = std::move(owned);
    return status;
}

}  // namespace moe::sched
