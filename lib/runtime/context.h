// The context behind moe_context: weights placed and bound to tensors, the KV cache, the scheduler
// and the ubatch loop.
#pragma once

#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/backend_config.h"
#include "core/models/model_graph.h"
#include "runtime/device_part.h"
#include "runtime/host_weights.h"
#include "runtime/model.h"
#include "sched/graph_cut.h"
#include "sched/placement.h"
#include "sched/scheduler.h"

struct moe_context {
    moe_model* model = nullptr;
    moe_context_params params{};
    moe::BackendConfig backend_config;  // params.backend_options parsed, the environment filled in
    // How every graph of the context addresses the KV cache (backend option stable_kv).
    moe::KvAddressing kv_addressing() const {
        return backend_config.stable_kv ? moe::KvAddressing::STABLE : moe::KvAddressing::EXACT;
    }

    std::unique_ptr<moe::Backend> host;    // the CPU
    std::unique_ptr<moe::Backend> device;  // CUDA or the emulated device; nullptr for CPU contexts
    int device_ordinal = 0;                // `device`'s ordinal in its backend (the first of the list)
    std::deque<moe::Tensor> weight_tensors;  // leaves over the weights' home copies
    std::unordered_map<std::string, moe::Tensor*> weight_by_name;
    std::unique_ptr<moe::Buffer> device_weights;  // weights placed on (or duplicated to) the device
    // Host-resident weights of a device context, page-locked in place (destroyed before the backends).
    moe::HostWeights host_weights;
    moe::ModelWeights weights;
    uint64_t weights_host_bytes = 0;
    uint64_t weights_device_bytes = 0;
    uint64_t weights_host_locked_bytes = 0;  // of weights_host_bytes, page-locked (before padding)
    // The partly resident layers' resident experts (sched/expert_placement.h), and per layer the experts
    // in device memory and their bytes (moe_context_get_resident_experts).
    moe::sched::ExpertResidency resident;
    moe::sched::LayerResidency residency;

    std::unique_ptr<moe::Buffer> kv_buffer[moe::sched::kSides];
    std::deque<moe::Tensor> kv_tensors;
    moe::KvCache kv;
    int n_past = 0;
    // The ids behind the cache rows: kv_tokens[0, n_past) are valid (rows past n_past are stale), so a
    // generation whose prompt extends them decodes only the rest.
    std::vector<int32_t> kv_tokens;

    std::unique_ptr<moe::sched::Scheduler> sched;
    // Several devices (runtime/multi_device.h; empty for one): per device of the list its share, and per
    // layer the index of its device. Device 0's backend, weights, KV buffer and scheduler are `device`,
    // `device_weights`, `kv_buffer`, `host_weights` and `sched` above (its part keeps its figures, peer
    // flags and staging only).
    // Declared after them and so destroyed first: the parts' schedulers use `host`.
    std::vector<moe::DevicePart> parts;
    std::vector<int> layer_device;

    // Decode steps built one ahead (context.cpp): while the device computes a step, the host builds and
    // plans the graph of a one-token step right after it, and frees the step before.
    struct Step {
        moe::Graph graph;
        moe::UbatchGraph ub;
        moe::sched::ExpertParts parts;  // its split expert blocks (the expert split's rewrite)
        // Several devices: the graph cut into stages (runtime/multi_device.h: cut_stages), which then hold
        // its nodes.
        std::vector<moe::sched::Stage> stages;
        int n_tokens = 0;
        int n_past = 0;
        moe::LogitsMode mode = moe::LogitsMode::NONE;
    };
    std::unique_ptr<Step> ahead;    // the next step as guessed; used only if the call matches it
    std::unique_ptr<Step> retired;  // the last step's graph, freed during the next one

    // The last decode's logits: page-locked with a device (a download into pageable memory is staged by
    // the driver and returns only once done; for one decode token's ~0.6-0.8 MB that is tens of us).
    std::unique_ptr<moe::Buffer> logits;
    bool logits_pinned = false;
    int32_t logits_rows = 0;
    float* logits_data() const { return static_cast<float*>(logits->data()); }
};

namespace moe {

StatusOr<std::unique_ptr<moe_context>> create_context(moe_model* model, const moe_context_params& params);

// The placement rules of a device context's params (sched/placement.h): its tensor overrides, after the
// rules that keep attention the device has no kernel for on the host (runtime/attention_home.h), and its
// n_layer, n_cpu_moe and n_gpu_layers; vram_budget is left for the caller. REQUIRES: ctx.device.
StatusOr<sched::PlacementParams> placement_rules(const moe_context& ctx);

// Evaluates tokens; see moe_decode in moeinfer.h for the contract.
Status decode(moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens, bool logits_all);

}  // namespace moe
