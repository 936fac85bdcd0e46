// The hybrid scheduler: runs a ubatch graph over a host backend and (optionally) a device backend.
// It orchestrates objects with one job each:
// - assignment.h: does this op run on the GPU (the side of every node);
// - transfers.h: which bytes cross PCIe (the upload ring, ACTIVE/PREFETCH expert copies, activation
//   copies, weights fetched back, expert id readback);
// - plan_cache.h: sides and arena offsets of a graph's shape, decided once and reused;
// - expert_splitter.h: which experts of a prompt ubatch the host computes while the device computes
//   the rest, learned from measured costs;
// - weight_table.h: the copies of every weight.
// What stays here: the activation arenas, handing runs of nodes on one side (splits) to their backend,
// planning a decode step ahead (prepare), the expert activation counts and per-op profiling.
//
// Activations live in two arenas of the same layout, one per side: a tensor needed on the other side
// is copied to the same offset there, which is free for the tensor's whole lifetime by construction of
// the allocation plan. Compute on the device is asynchronous; the host waits for the device only before
// a host split that needs device data, to read router choices (ACTIVE_ONLY), and at the end of the
// ubatch. Nothing here knows an architecture.
//
// Several devices in one host (layer split): a Scheduler stays one host and ONE device. A context over N
// devices makes N of them (each with its own arenas, upload ring, expert id readback, bias duplicates
// and stats, over the weights of its layers) and cuts each ubatch graph into stages of consecutive
// nodes on one device (graph_cut.h, device_split.h); the stages run in order, each by its device's
// Scheduler::run, and what one stage hands to the next crosses as an output of the one and an input of
// the other, through host memory or left on the device and copied from there by the other's device
// (HostOutput::on_device, HostInput::peer; runtime/stage_crossing.h). Side HOST / DEVICE keeps meaning "host or
// this scheduler's device"; nothing here knows how many devices there are.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/graph.h"
#include "sched/assignment.h"
#include "sched/expert_plan.h"
#include "sched/expert_split_rewrite.h"
#include "sched/expert_splitter.h"
#include "sched/placement.h"
#include "sched/plan_cache.h"
#include "sched/policy.h"
#include "sched/resident_experts.h"
#include "sched/run_state.h"
#include "sched/stats.h"
#include "sched/timeline.h"
#include "sched/transfers.h"
#include "sched/weight_table.h"

namespace moe::sched {

struct HostInput {
    Tensor* tensor;
    const void* data;  // tensor->n_bytes() bytes
    // Where set, data is in this other device's memory (an earlier stage's result on another device of
    // the context): the scheduler's device copies it from there (Backend::copy_from_peer; REQUIRES:
    // its enable_peer_access(*peer) returned true), and from its own memory to the host arena if host
    // ops read it too.
    Backend* peer = nullptr;
};

struct HostOutput {
    const Tensor* tensor;
    void* data;  // receives tensor->n_bytes() bytes
    // Where set, an output computed on the device stays there: *on_device receives its address in the
    // device's memory, valid (and unchanged) until this scheduler's next run, and data is not written.
    // An output on the host is copied to data as usual, *on_device set to nullptr.
    const void** on_device = nullptr;
};

struct OpTime {
    int64_t count = 0;
    double seconds = 0.0;
};
using OpTimes = std::array<std::array<OpTime, static_cast<size_t>(Op::COUNT)>, kSides>;

class Scheduler {
public:
    // device may be nullptr (CPU-only: every node runs on host). n_expert / n_expert_used size the
    // default expert thresholds and the activation counts.
    Scheduler(Backend& host, Backend* device, int n_layer, int n_expert, int n_expert_used);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Registers a weight leaf and its copies. REQUIRES: before set_policy().
    void add_weight(Tensor* weight, const WeightCopies& copies);
    // The partly resident layers (sched/resident_experts.h), whose expert tensors are registered with
    // their resident slices: each of their expert blocks is split on every ubatch. Uploads the row maps.
    // REQUIRES: once, after add_weight, before the first run.
    Status set_resident_experts(const ExpertResidency& resident);
    // Per layer: 1 for a partly resident layer (empty when there is none), the split_layers a graph
    // is built with when plan_expert_split has nothing else to split.
    const std::vector<uint8_t>& resident_layers() const { return resident_layers_; }
    // The copies ops may use under the current policy; nullopt for an unregistered tensor.
    std::optional<WeightCopies> weight_copies(const Tensor* weight) const;

    // Validates and installs a policy; sizes the upload slots (allocated at first use).
    Status set_policy(const Policy& policy);
    const Policy& policy() const { return policy_; }
    int32_t min_batch(OffloadOp op) const;
    // The offload threshold of `op` and its source; the figures measured at creation it may follow from.
    OffloadThreshold offload_threshold(OffloadOp op) const { return assignment_.threshold(op); }
    void set_offload_calibration(const OffloadCalibration& c);
    const OffloadCalibration& offload_calibration() const { return assignment_.calibration(); }

    // The expert split for the next ubatch of n_tokens tokens (policy expert_split): layers whose expert
    // weights are all host-resident, at batch sizes where their expert ops are offloaded. The next
    // run() must get a graph rewritten by split_expert_blocks(graph, plan.layers, n_expert) (its
    // parts), with plan.groups as the parts' groups input.
    StatusOr<ExpertSplitPlan> plan_expert_split(int n_tokens);

    // Evaluates one ubatch graph of n_tokens tokens: inputs are written before compute, outputs read
    // after. parts: the graph's split expert blocks (sched/expert_split_rewrite.h; borrowed for the
    // call). The graph is consumed (operands are rewritten to their copies on the side that uses them).
    // while_waiting, when given, runs once all of the ubatch's work is queued, before the host waits for
    // the device: host work for the next ubatch (building and prepare()-ing its graph, freeing the last
    // one) then overlaps the device's computing instead of leaving it idle between two ubatches. It
    // returns the seconds of it that were other schedulers' runs (a context's next stage, started inside
    // this one: runtime/multi_device.h), which this run's time (its stats, the expert split's timings)
    // leaves out.
    Status run(Graph& graph, const ExpertParts& parts, int n_tokens, std::span<const HostInput> inputs,
               std::span<const HostOutput> outputs, const std::function<double()>& while_waiting = {});
    // Plans and binds `graph`, whose run() is expected next with these input tensors (a decode step built
    // ahead), while the device may still compute the current ubatch: host work only, and only from a plan
    // cached for a graph of the same shape that fits the arenas as they are (else nothing: run() plans as
    // usual). The next run() of this graph takes the plan; a run() of another graph, set_policy() or the
    // next prepare() drops it.
    void prepare(Graph& graph, std::span<Tensor* const> input_tensors);

    Stats& stats() { return stats_; }
    const Stats& stats() const { return stats_; }
    void reset_stats();

    // Per-op timing (synchronises after every node while on).
    void set_profiling(bool on);
    const OpTimes& op_times() const { return op_times_; }

    // Per-ubatch timing for plots (off until enabled; not cleared by reset_stats).
    Timeline& timeline() { return timeline_; }
    const Timeline& timeline() const { return timeline_; }

    Backend& backend(Side s) { return s == Side::HOST ? host_ : *device_; }
    bool has_device() const { return device_ != nullptr; }

private:
    // A graph planned ahead (prepare()).
    struct Prepared {
        uint64_t graph = 0;  // Graph::serial()
        std::vector<Tensor*> inputs;
        std::unique_ptr<RunState> rs;
        std::vector<Side> sides;
    };
    Status plan(Graph& graph, std::span<const HostInput> inputs, RunState& rs, std::vector<Side>& sides);
    // The cached part of plan(), for the graph_signature `key`: false (and nothing changed but rs.produced)
    // when no plan is cached.
    bool apply_cached_plan(Graph& graph, std::span<const HostInput> inputs, uint64_t key, RunState& rs,
                           std::vector<Side>& sides);
    // Expert ids stay alive to the end of the ubatch, so the activation counts can read them then.
    void keep_expert_ids(const Graph& graph, RunState& rs);
    bool arenas_hold(size_t size) const;

    Status ensure_arenas(size_t size);
    void bind(Graph& graph, RunState& rs);
    Status prepare_operands(Tensor& node, Side side, RunState& rs);
    Status flush(RunState& rs);
    // Waits for the device and tallies the ubatch's expert ids (Transfers::fetch_expert_ids).
    Status count_experts(const Transfers::IdSources& sources, int n_tokens);

    Backend& host_;
    Backend* device_;
    int n_layer_;
    int n_expert_;
    int n_expert_used_;
    Policy policy_;
    Stats stats_;
    // The parts, in this order: each holds references to those above it.
    WeightTable weights_;
    Assignment assignment_;
    ExpertSplitter splitter_;
    Transfers transfers_;
    PlanCache plans_;  // cleared by set_policy and when the expert cache's whole matrices change
    uint64_t plans_generation_ = 0;  // Transfers::cache_generation() of the plans in plans_
    ResidentExperts resident_;
    std::vector<uint8_t> resident_layers_;

    std::unique_ptr<Buffer> arena_[kSides];
    bool allocated_in_run_ = false;  // the running ubatch allocated arenas or upload slots
    std::unique_ptr<Prepared> prepared_;  // prepare()'s graph, for the next run()
    // The last run's state (maps and operand stand-ins), cleared while the device computes the next ubatch:
    // freed at the end of a run, it and the step's graph took 0.02-0.14 ms per token with the device idle.
    std::unique_ptr<RunState> retired_;
    // ... then cleared and kept here for the next run: its tables keep their memory (RunState::clear).
    std::unique_ptr<RunState> spare_;
    std::unique_ptr<RunState> take_run_state();

    bool profiling_ = false;
    OpTimes op_times_{};
    Timeline timeline_;
};

}  // namespace moe::sched
