#include "runtime/context.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/backend_registry.h"
#include "runtime/attention_home.h"
#include "runtime/context_sizes.h"
#include "runtime/copy_progress.h"
#include "runtime/default_devices.h"
#include "runtime/device.h"
#include "runtime/host_weights.h"
#include "runtime/multi_device.h"
#include "runtime/offload_calibration.h"
#include "runtime/policy_convert.h"
#include "sched/placement.h"
#include "sched/resident_experts.h"

namespace moe {
namespace {

using sched::Side;

constexpr size_t kWeightAlign = 256;
constexpr uint64_t kVramReserve = uint64_t{1} << 30;  // CUDA context, cuBLAS, kernel scratch

size_t aligned(size_t n) { return (n + kWeightAlign - 1) & ~(kWeightAlign - 1); }

Status check_params(const moe_context_params& p) {
    if (p.n_ctx <= 0) return invalid_argument("n_ctx must be > 0 (got " + std::to_string(p.n_ctx) + ")");
    if (p.n_ubatch <= 0) return invalid_argument("n_ubatch must be > 0 (got " + std::to_string(p.n_ubatch) + ")");
    if (p.n_threads < 0 || p.n_threads > MOE_MAX_THREADS) {
        return invalid_argument("n_threads must be in [0, " + std::to_string(MOE_MAX_THREADS) +
                                "] (0 = all cores; got " + std::to_string(p.n_threads) + ")");
    }
    if (p.device != MOE_DEVICE_CPU && p.device != MOE_DEVICE_CUDA && p.device != MOE_DEVICE_EMULATED &&
        p.device != MOE_DEVICE_AUTO) {
        return invalid_argument(
            "device must be MOE_DEVICE_CPU, MOE_DEVICE_CUDA, MOE_DEVICE_EMULATED or MOE_DEVICE_AUTO (got " +
            std::to_string(p.device) + ")");
    }
    if (p.n_cpu_moe < 0) return invalid_argument("n_cpu_moe must be >= 0 (got " + std::to_string(p.n_cpu_moe) + ")");
    if (p.n_gpu_layers < -1) {
        return invalid_argument("n_gpu_layers must be >= 0, or -1 for all (got " + std::to_string(p.n_gpu_layers) + ")");
    }
    return Status::ok();
}

StatusOr<std::unique_ptr<Backend>> create_backend(const char* name, int n_threads, const BackendConfig& config,
                                                  int ordinal = 0) {
    const BackendFactory* factory = find_backend_factory(name);
    if (factory == nullptr) return unimplemented(std::string("this build of moeinfer has no ") + name + " backend");
    if (factory->device_count() == 0) return failed_precondition(std::string("no ") + name + " device found");
    BackendOptions opts;
    opts.n_threads = n_threads;
    opts.device = ordinal;
    opts.config = config;
    return factory->create(opts);
}

// Leaf tensors over the model file's data, one per GGUF tensor; the architecture's weights bound.
Status bind_model_weights(moe_context& ctx) {
    const GgufFile& file = *ctx.model->file;
    for (const GgufTensorInfo& info : file.tensors()) {
        Tensor& t = ctx.weight_tensors.emplace_back();
        set_shape(t, info.type, std::max(info.n_dims, 1), info.ne);
        // Weights are only ever read; the mapping is read-only.
        t.data = const_cast<uint8_t*>(file.tensor_data(info));
        t.name = info.name;
        ctx.weight_by_name[info.name] = &t;
    }
    // deepseek2's up-projections in the form the file lacks (mla_split.h), made once per model.
    MOE_ASSIGN_OR_RETURN(const std::vector<DerivedWeight>* derived, derived_weights(*ctx.model));
    for (const DerivedWeight& d : *derived) {
        Tensor& t = ctx.weight_tensors.emplace_back();
        set_shape(t, d.type, 3, d.ne);
        t.data = const_cast<uint8_t*>(d.data.data());  // shared by the model's contexts: only ever read
        t.name = d.name;
        ctx.weight_by_name[d.name] = &t;
    }
    StatusOr<ModelWeights> w = bind_weights(ctx.model->hparams, [&](const std::string& name) -> Tensor* {
        auto it = ctx.weight_by_name.find(name);
        return it == ctx.weight_by_name.end() ? nullptr : it->second;
    });
    if (!w.is_ok()) return w.status();
    ctx.weights = std::move(w).value();
    return Status::ok();
}

// Every weight is a matrix-product operand or an F32 vector; ask the backend that will read it.
Status check_weight_types(const moe_context& ctx, const std::vector<Side>& sides, const std::vector<Tensor*>& ws) {
    for (size_t i = 0; i < ws.size(); ++i) {
        const Tensor& t = *ws[i];
        if (t.type == Type::F32) continue;
        Tensor probe;
        probe.op = Op::MUL_MAT;
        probe.src[0] = const_cast<Tensor*>(&t);
        const Backend& be = sides[i] == Side::DEVICE ? *ctx.device : *ctx.host;
        if (!be.supports_op(probe)) {
            return unimplemented("tensor '" + t.name + "': type " + type_name(t.type) + " is not supported by the " +
                                 be.name() + " backend");
        }
    }
    return Status::ok();
}

// The side of layer il's attention (its KV cache lives there).
// REQUIRES: the weights are registered with the scheduler.
Side attention_side(const moe_context& ctx, int il) {
    return ctx.sched->weight_copies(attention_anchor(ctx.weights.layers[static_cast<size_t>(il)]))->home;
}

// The KV cache's buffers, for the attention of each layer on `attention_sides[il]`.
Status allocate_kv_buffers(moe_context& ctx, const std::vector<Side>& attention_sides) {
    const size_t per_tensor = kv_prototype(ctx).n_bytes();  // V, where there is one, is as large as K
    size_t count[sched::kSides] = {};
    for (Side side : attention_sides) count[static_cast<int>(side)] += static_cast<size_t>(kv_tensors_per_layer(ctx));
    for (int s = 0; s < sched::kSides; ++s) {
        if (count[s] == 0) continue;
        Backend& be = s == static_cast<int>(Side::DEVICE) ? *ctx.device : *ctx.host;
        StatusOr<std::unique_ptr<Buffer>> b = be.alloc_buffer(per_tensor * count[s]);
        if (!b.is_ok()) return b.status().with_context("allocating the KV cache");
        ctx.kv_buffer[s] = std::move(b).value();
    }
    return Status::ok();
}

// The KV tensors over the buffers of allocate_kv_buffers.
// REQUIRES: the weights are registered with the scheduler, on the sides the buffers were sized for.
void bind_kv_cache(moe_context& ctx) {
    const HParams& hp = ctx.model->hparams;
    const size_t per_tensor = kv_prototype(ctx).n_bytes();
    size_t used[sched::kSides] = {};
    ctx.kv.n_ctx = ctx.params.n_ctx;
    for (int il = 0; il < hp.n_layer; ++il) {
        const int s = static_cast<int>(attention_side(ctx, il));
        for (int kv = 0; kv < kv_tensors_per_layer(ctx); ++kv) {
            MOE_ASSERT(ctx.kv_buffer[s] && (used[s] + 1) * per_tensor <= ctx.kv_buffer[s]->size());
            Tensor& t = ctx.kv_tensors.emplace_back(kv_prototype(ctx, kv == 1));
            t.data = static_cast<uint8_t*>(ctx.kv_buffer[s]->data()) + used[s]++ * per_tensor;
            t.buffer = ctx.kv_buffer[s].get();
            t.name = std::string(kv == 0 ? "cache_k." : "cache_v.") + std::to_string(il);
            (kv == 0 ? ctx.kv.k : ctx.kv.v).push_back(&t);
        }
    }
}

// place_experts with the model's profile (empty: uniform); per_expert false: whole tensors only
// (sched::place_weights).
StatusOr<sched::ExpertPlacement> place_experts(const moe_context& ctx, const std::vector<sched::WeightDesc>& desc,
                                               const sched::PlacementParams& pp, bool per_expert = true) {
    if (!per_expert) {
        std::vector<sched::WeightDesc> padded = desc;
        for (sched::WeightDesc& d : padded) d.bytes = aligned(d.bytes);
        MOE_ASSIGN_OR_RETURN(std::vector<Side> sides, sched::place_weights(padded, pp));
        return sched::ExpertPlacement{std::move(sides), {}};
    }
    sched::ExpertPlacementParams ep;
    ep.base = pp;
    ep.n_expert = ctx.model->hparams.n_expert;
    ep.align = kWeightAlign;
    ep.counts = ctx.model->expert_profile;
    return sched::place_experts(desc, ep);
}

// Where each weight lives: all on the host for CPU contexts, else per the placement parameters (with
// a default VRAM budget of what the device has free, less what the context will also need there,
// and at most `cap`: a retry after the device refused what an earlier placement asked for).
// Under the budget, experts are placed one by one, the hottest of the model's expert profile resident
// (sched/expert_placement.h).
StatusOr<sched::ExpertPlacement> decide_sides(const moe_context& ctx, const std::vector<Tensor*>& ws,
                                              const sched::Policy& policy, uint64_t cap) {
    if (!ctx.device) return sched::ExpertPlacement{std::vector<Side>(ws.size(), Side::HOST), {}};
    const HParams& hp = ctx.model->hparams;
    MOE_ASSIGN_OR_RETURN(sched::PlacementParams pp, placement_rules(ctx));
    std::vector<sched::WeightDesc> desc;
    uint64_t total = 0, largest_expert = 0;
    for (const Tensor* t : ws) {
        desc.push_back({t->name, t->n_bytes()});  // padded by place_experts
        total += aligned(t->n_bytes());
        if (sched::is_expert_tensor(t->name)) largest_expert = std::max<uint64_t>(largest_expert, t->n_bytes());
    }
    if (ctx.params.vram_budget > 0) {
        pp.vram_budget = ctx.params.vram_budget;
    } else {
        // What the device has free, less the KV cache (all of it, to be safe), the activations and a
        // reserve; if the weights do not all fit, also less the slots offloaded experts go through and,
        // where the policy may split expert blocks, the split graph's larger activations (a model that
        // fits whole never splits, so it does not pay for them).
        const uint64_t kv = kv_layer_bytes(ctx) * static_cast<uint64_t>(hp.n_layer);
        const uint64_t arena = estimate_arena_bytes(ctx, false);
        const uint64_t need = kv + arena + kVramReserve;
        const uint64_t free = ctx.device->free_memory();
        uint64_t budget = free > need ? free - need : 0, spill = 0;
        if (total > budget) {
            spill = static_cast<uint64_t>(sched::auto_upload_slots(policy)) * largest_expert;
            if (policy.expert_split != 0) spill += std::max<uint64_t>(estimate_arena_bytes(ctx, true), arena) - arena;
            budget = budget > spill ? budget - spill : 0;
        }
        pp.vram_budget = std::min(budget, cap);
        if (cap == UINT64_MAX) {
            StatusOr<sched::ExpertPlacement> sides = place_experts(ctx, desc, pp);
            if (sides.is_ok()) return sides;
            return sides.status().with_context(
                "default VRAM budget: " + std::to_string(free) + " bytes free on the " + ctx.device->name() +
                " device, less " + std::to_string(kv) + " for the KV cache (n_ctx " + std::to_string(ctx.params.n_ctx) +
                "), " + std::to_string(arena) + " for activations (n_ubatch " + std::to_string(ctx.params.n_ubatch) +
                "), " + std::to_string(spill) + " for offload slots and the expert split, and a reserve of " +
                std::to_string(kVramReserve));
        }
    }
    // A retry after the device refused what a placement asked for moves whole expert tensors: what it
    // falls back to is then a placement tensor overrides can name.
    return place_experts(ctx, desc, pp, cap == UINT64_MAX);
}

// Bias duplication (sched::duplicated_biases) in device contexts.
std::vector<bool> duplicated_biases(const moe_context& ctx, const std::vector<Tensor*>& ws,
                                    const std::vector<Side>& sides) {
    if (!ctx.device) return std::vector<bool>(ws.size(), false);
    return sched::duplicated_biases(ws, sides);
}

// Bytes of device memory the weights take on `sides`: the device-side ones and the duplicates.
uint64_t device_weight_bytes(const moe_context& ctx, const std::vector<Tensor*>& ws, const std::vector<Side>& sides) {
    const std::vector<bool> dup = duplicated_biases(ctx, ws, sides);
    uint64_t n = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        if (sides[i] == Side::DEVICE || dup[i]) n += aligned(ws[i]->n_bytes());
    }
    return n + sched::resident_bytes(ws, ctx.resident, kWeightAlign);
}

// The side of each layer's attention (that of its attention_anchor) with the weights on `sides`.
std::vector<Side> attention_sides(const moe_context& ctx, const std::vector<Tensor*>& ws, const std::vector<Side>& sides) {
    std::unordered_map<const Tensor*, Side> side_of;
    for (size_t i = 0; i < ws.size(); ++i) side_of[ws[i]] = sides[i];
    std::vector<Side> out;
    for (const LayerWeights& l : ctx.weights.layers) {
        const auto it = side_of.find(attention_anchor(l));
        MOE_ASSERT(it != side_of.end());
        out.push_back(it->second);
    }
    return out;
}

// The weights' device buffer and the KV cache for the weights on `sides`; on failure none is kept.
Status allocate_context_memory(moe_context& ctx, const std::vector<Tensor*>& ws, const std::vector<Side>& sides) {
    Status s;
    if (const uint64_t n = device_weight_bytes(ctx, ws, sides); n > 0) {
        StatusOr<std::unique_ptr<Buffer>> b = ctx.device->alloc_buffer(n);
        if (b.is_ok()) ctx.device_weights = std::move(b).value();
        s = b.status().with_context("allocating device memory for the weights");
    }
    if (s.is_ok()) s = allocate_kv_buffers(ctx, attention_sides(ctx, ws, sides));
    if (!s.is_ok()) {
        ctx.device_weights.reset();
        for (auto& b : ctx.kv_buffer) b.reset();
    }
    return s;
}

// Places the weights and allocates the context's memory for them and the KV cache, before anything
// is copied. Under the default budget, when the device refuses what a placement asks for (its free
// memory shrank meanwhile, or is less usable than it reports), the placement is redone with a budget
// of that placement's device bytes less the shortfall (at least one byte, so at least one more expert
// tensor moves to host RAM), until it fits or no expert tensor is left to move: RESOURCE_EXHAUSTED
// with the last refusal then. An explicit vram_budget is not second-guessed: its refusal names it.
StatusOr<std::vector<Side>> place_and_allocate(moe_context& ctx, const std::vector<Tensor*>& ws,
                                               const sched::Policy& policy) {
    uint64_t cap = UINT64_MAX;
    Status refused;
    for (;;) {
        StatusOr<sched::ExpertPlacement> placed = decide_sides(ctx, ws, policy, cap);
        if (!placed.is_ok()) {
            if (refused.is_ok()) return placed.status();
            return Status(refused.code(), refused.message() + "; no expert tensor is left to move to host RAM (" +
                                              placed.status().message() + ")");
        }
        ctx.resident = std::move(placed->resident);
        StatusOr<std::vector<Side>> sides = std::move(placed->sides);
        MOE_RETURN_IF_ERROR(check_weight_types(ctx, *sides, ws));
        const Status s = allocate_context_memory(ctx, ws, *sides);
        if (s.is_ok()) return sides;
        if (s.code() != MOE_STATUS_RESOURCE_EXHAUSTED || !ctx.device) return s;
        if (ctx.params.vram_budget > 0) {
            return s.with_context("vram_budget of " + std::to_string(ctx.params.vram_budget) +
                                  " bytes does not fit the device (0 sizes it from the free memory)");
        }
        refused = s;
        // What the attempt needed on the device against what is free now that it is released.
        uint64_t placed_bytes = 0, needed = device_weight_bytes(ctx, ws, *sides);
        for (size_t i = 0; i < ws.size(); ++i) {
            placed_bytes += (*sides)[i] == Side::DEVICE ? aligned(ws[i]->n_bytes()) : 0;
        }
        placed_bytes += sched::resident_bytes(ws, ctx.resident, kWeightAlign);
        for (Side side : attention_sides(ctx, ws, *sides)) needed += side == Side::DEVICE ? kv_layer_bytes(ctx) : 0;
        const uint64_t free = ctx.device->free_memory();
        const uint64_t shortfall = needed > free ? needed - free : 1;
        cap = placed_bytes > shortfall ? placed_bytes - shortfall : 0;
    }
}

// Places the weights (device contexts), copies them to their sides and registers them with the scheduler.
Status place_weights(moe_context& ctx, const sched::Policy& policy) {
    const HParams& hp = ctx.model->hparams;
    std::vector<Tensor*> ws;
    for (Tensor& t : ctx.weight_tensors) {
        if (t.is_weight) ws.push_back(&t);
    }
    MOE_ASSIGN_OR_RETURN(const std::vector<Side> sides, place_and_allocate(ctx, ws, policy));

    const std::vector<bool> dup = duplicated_biases(ctx, ws, sides);

    // Device memory for device-side weights and duplicates. Host-side weights of a device context may
    // be uploaded: they are used in place, page-locked where the device can lock them (host_weights.h).
    uint64_t device_bytes = 0, host_bytes = 0;
    std::vector<HostRange> uploadable;
    for (size_t i = 0; i < ws.size(); ++i) {
        const size_t n = aligned(ws[i]->n_bytes());
        if (sides[i] == Side::DEVICE || dup[i]) device_bytes += n;
        if (sides[i] == Side::HOST) {
            host_bytes += n;
            if (ctx.device) uploadable.push_back({ws[i]->data, ws[i]->n_bytes()});
        }
    }
    const uint64_t slices_at = device_bytes;  // the resident experts' slices follow the whole tensors
    device_bytes += sched::resident_bytes(ws, ctx.resident, kWeightAlign);
    MOE_ASSERT(device_bytes == (ctx.device_weights ? ctx.device_weights->size() : 0));  // by place_and_allocate
    ctx.weights_device_bytes = device_bytes;
    ctx.weights_host_bytes = host_bytes;

    // Progress: the pages registration locks (it faults them in: from disk when the file is cold), then
    // the bytes uploaded.
    CopyProgress progress(ctx.params, HostWeights::run_bytes(uploadable) + device_bytes);
    if (!uploadable.empty()) {
        MOE_ASSIGN_OR_RETURN(ctx.host_weights,
                             HostWeights::register_ranges(*ctx.device, uploadable, *ctx.model->file,
                                                          ctx.params.n_threads,
                                                          [&](uint64_t n) { return progress.advance(n); }));
        ctx.weights_host_locked_bytes = ctx.host_weights.locked_bytes();
    }

    sched::WeightUpload up;
    up.device = ctx.device.get();
    up.device_weights = ctx.device_weights.get();
    up.align = kWeightAlign;
    up.host_buffer_of = [&ctx](const void* p, size_t n) { return ctx.host_weights.buffer_of(p, n); };
    up.progress = [&progress](uint64_t n) { return progress.advance(n); };
    MOE_ASSIGN_OR_RETURN(std::vector<sched::WeightCopies> copies, sched::upload_weights(ws, sides, dup, up));
    if (ctx.resident.any()) {
        MOE_ASSIGN_OR_RETURN(const std::vector<sched::ResidentSlice> slices,
                             sched::upload_resident_experts(ws, ctx.resident, *ctx.device, *ctx.device_weights,
                                                            slices_at, kWeightAlign, up.progress));
        for (size_t i = 0; i < ws.size(); ++i) copies[i].resident = slices[i];
    }
    ctx.residency = sched::residency_by_layer(ws, sides, ctx.resident, hp.n_layer, kWeightAlign);
    ctx.sched = std::make_unique<sched::Scheduler>(*ctx.host, ctx.device.get(), hp.n_layer, hp.n_expert, hp.n_expert_used);
    for (size_t i = 0; i < ws.size(); ++i) ctx.sched->add_weight(ws[i], copies[i]);
    if (ctx.device) MOE_RETURN_IF_ERROR(ctx.device->synchronize().with_context("uploading the weights"));
    MOE_RETURN_IF_ERROR(ctx.sched->set_resident_experts(ctx.resident));

    bind_kv_cache(ctx);
    if (wants_offload_calibration(ctx)) {
        // Without room on the device for the probes, the fixed thresholds do (the stats say so).
        StatusOr<sched::OffloadCalibration> c = measure_offload_calibration(ctx);
        if (c.is_ok()) ctx.sched->set_offload_calibration(*c);
        if (!c.is_ok() && c.status().code() != MOE_STATUS_RESOURCE_EXHAUSTED) {
            return c.status().with_context("measuring the offload thresholds (backend option offload_calibration)");
        }
    }
    return ctx.sched->set_policy(policy);
}

Status validate_batch(const moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens,
                      int* first_pos) {
    const int n_vocab = ctx.model->hparams.n_vocab;
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return out_of_range("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                                " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        }
    }
    int p0 = ctx.n_past;
    if (positions != nullptr) {
        p0 = positions[0];
        if (p0 < 0 || p0 > ctx.n_past) {
            return invalid_argument("positions[0] = " + std::to_string(p0) + " must be in [0, n_past = " +
                                    std::to_string(ctx.n_past) + "]");
        }
        for (int32_t i = 1; i < n_tokens; ++i) {
            if (positions[i] != p0 + i) {
                return invalid_argument("positions must be consecutive: positions[" + std::to_string(i) + "] = " +
                                        std::to_string(positions[i]) + ", expected " + std::to_string(p0 + i));
            }
        }
    }
    if (static_cast<int64_t>(p0) + n_tokens > ctx.params.n_ctx) {
        return out_of_range("context overflow: " + std::to_string(p0) + " tokens in the cache + " +
                            std::to_string(n_tokens) + " new > n_ctx = " + std::to_string(ctx.params.n_ctx));
    }
    *first_pos = p0;
    return Status::ok();
}

// Builds the graph of a ubatch of n_tokens at n_past, with the expert blocks of split_layers split.
std::unique_ptr<moe_context::Step> build_step(const moe_context& ctx, int n_tokens, int n_past, LogitsMode mode,
                                              const std::vector<uint8_t>& split_layers) {
    auto step = std::make_unique<moe_context::Step>();
    step->n_tokens = n_tokens;
    step->n_past = n_past;
    step->mode = mode;
    step->ub = build_model_graph(step->graph, ctx.model->hparams, ctx.weights, ctx.kv, n_tokens, n_past, mode,
                                 ctx.kv_addressing());
    step->parts = sched::split_expert_blocks(step->graph, split_layers, ctx.model->hparams.n_expert);
    return step;
}

// Evaluates one ubatch; logits_dst receives the logits `mode` asks for (nullptr for NONE). With
// build_ahead, the host builds and plans a one-token step right after this one while the device computes
// this one (~0.15-0.45 ms per token of host work, during which the device used to sit idle, on the H100
// machine's host: docs/PERF.md, 2026-11-26); the next call uses it if it asks for exactly that.
Status decode_ubatch(moe_context& ctx, const int32_t* tokens, int n_tokens, int n_past, LogitsMode mode,
                     float* logits_dst, bool build_ahead) {
    MOE_ASSIGN_OR_RETURN(const sched::ExpertSplitPlan split, ctx.parts.empty()
                                                                 ? ctx.sched->plan_expert_split(n_tokens)
                                                                 : plan_expert_split_multi(ctx, n_tokens));
    std::unique_ptr<moe_context::Step> step = std::move(ctx.ahead);
    if (step == nullptr || step->n_tokens != n_tokens || step->n_past != n_past || step->mode != mode ||
        split.n_layers != 0) {
        step = build_step(ctx, n_tokens, n_past, mode, split.layers);
    }
    const UbatchGraph& ub = step->ub;
    std::vector<int32_t> positions(static_cast<size_t>(n_tokens));
    for (int i = 0; i < n_tokens; ++i) positions[static_cast<size_t>(i)] = n_past + i;
    std::vector<sched::HostInput> inputs = {{ub.tokens, tokens}, {ub.positions, positions.data()}};
    if (step->parts.groups != nullptr) inputs.push_back({step->parts.groups, split.groups.data()});
    std::vector<sched::HostOutput> outputs;
    if (ub.logits != nullptr) outputs.push_back({ub.logits, logits_dst});
    const int next_past = n_past + n_tokens;
    const bool several = !ctx.parts.empty();
    if (several && step->stages.empty()) {
        MOE_ASSIGN_OR_RETURN(step->stages, cut_stages(ctx, step->graph));
    }
    const auto while_waiting = [&]() -> double {
        ctx.retired.reset();
        if (!build_ahead || next_past >= ctx.params.n_ctx) return 0.0;
        // A one-token step splits the partly resident layers only (the expert split's own layers need
        // more tokens); over several devices none (a step whose call splits layers is built again).
        ctx.ahead = build_step(ctx, 1, next_past, LogitsMode::LAST,
                               several ? std::vector<uint8_t>{} : ctx.sched->resident_layers());
        if (several) {
            StatusOr<std::vector<sched::Stage>> stages = cut_stages(ctx, ctx.ahead->graph);
            if (!stages.is_ok()) {
                ctx.ahead.reset();  // cut again, with its error, when the step comes
                return 0.0;
            }
            ctx.ahead->stages = std::move(stages).value();
            prepare_stages(ctx, ctx.ahead->stages);
            return 0.0;
        }
        std::vector<Tensor*> ahead_inputs = {ctx.ahead->ub.tokens, ctx.ahead->ub.positions};
        if (ctx.ahead->parts.groups != nullptr) ahead_inputs.push_back(ctx.ahead->parts.groups);
        ctx.sched->prepare(ctx.ahead->graph, ahead_inputs);
        return 0.0;
    };
    // Several devices: stage by stage (runtime/multi_device.h), the next step built ahead as on one.
    const Status s = several ? run_stages(ctx, step->stages, step->parts, n_tokens, inputs, outputs, while_waiting)
                             : ctx.sched->run(step->graph, step->parts, n_tokens, inputs, outputs, while_waiting);
    if (!s.is_ok()) ctx.ahead.reset();
    ctx.retired = std::move(step);  // freed while the device computes the next step
    return s;
}

}  // namespace

StatusOr<sched::PlacementParams> placement_rules(const moe_context& ctx) {
    MOE_ASSERT(ctx.device != nullptr);
    const HParams& hp = ctx.model->hparams;
    sched::PlacementParams pp;
    MOE_ASSIGN_OR_RETURN(pp.overrides,
                         sched::parse_overrides(ctx.params.tensor_overrides ? ctx.params.tensor_overrides : ""));
    // Attention the device has no kernel for stays on the host (runtime/attention_home.h).
    const std::vector<sched::OverrideRule> host_attention = host_attention_overrides(hp, ctx.weights, *ctx.device);
    pp.overrides.insert(pp.overrides.begin(), host_attention.begin(), host_attention.end());
    pp.n_layer = hp.n_layer;
    pp.n_cpu_moe = ctx.params.n_cpu_moe;
    pp.n_gpu_layers = ctx.params.n_gpu_layers;
    return pp;
}

StatusOr<std::unique_ptr<moe_context>> create_context(moe_model* model, const moe_context_params& params) {
    MOE_RETURN_IF_ERROR(check_params(params));
    sched::Policy policy;
    if (params.policy != nullptr) {
        MOE_ASSIGN_OR_RETURN(policy, policy_from_c(*params.policy));
    }
    auto ctx = std::make_unique<moe_context>();
    MOE_ASSIGN_OR_RETURN(ctx->backend_config,
                         parse_backend_config(params.backend_options ? params.backend_options : ""));
    ctx->model = model;
    ctx->params = params;
    ctx->params.tensor_overrides = nullptr;  // borrowed during the call only
    ctx->params.policy = nullptr;
    ctx->params.progress = nullptr;
    ctx->params.backend_options = nullptr;
    ctx->params.device = resolve_device(params.device);  // the rest of the context sees CPU, CUDA or EMULATED
    ctx->params.devices = nullptr;
    ctx->params.tensor_split = nullptr;
    ctx->params.vram_budgets = nullptr;
    MOE_ASSIGN_OR_RETURN(ctx->host, create_backend("cpu", params.n_threads, ctx->backend_config));
    DeviceList devices;
    std::vector<uint64_t> free;  // the several-device default's: each device's free memory, in fill order
    if (ctx->params.device == MOE_DEVICE_CUDA || ctx->params.device == MOE_DEVICE_EMULATED) {
        const char* name = ctx->params.device == MOE_DEVICE_CUDA ? "cuda" : "emulated";
        const BackendFactory* factory = find_backend_factory(name);
        const int count = factory != nullptr ? factory->device_count() : 0;
        if (count == 0) return create_backend(name, params.n_threads, ctx->backend_config).status();  // says why
        // Without a device list a context sees every GPU, or the emulated devices its options show.
        const int visible = ctx->params.device == MOE_DEVICE_CUDA ? count : ctx->backend_config.emulated_devices;
        MOE_ASSIGN_OR_RETURN(devices, device_list(params, ctx->params.device, count, visible));
        if (devices.fill) {
            BackendOptions opts;
            opts.n_threads = params.n_threads;
            opts.config = ctx->backend_config;
            MOE_ASSIGN_OR_RETURN(devices, fill_order(devices, *factory, opts, &free));
        }
        MOE_ASSIGN_OR_RETURN(ctx->device,
                             create_backend(name, params.n_threads, ctx->backend_config, devices.ordinals[0]));
        ctx->device_ordinal = devices.ordinals[0];
    }
    MOE_RETURN_IF_ERROR(bind_model_weights(*ctx));
    moe_context_params during = params;  // the borrowed fields are valid during creation
    during.device = ctx->params.device;
    std::swap(ctx->params, during);
    Status placed = Status::ok();
    if (devices.fill) {
        // The several-device default picks the devices (their first is ctx->device's) and their layers.
        StatusOr<DeviceList> filled = fill_devices(*ctx, devices, free, policy);
        placed = filled.status();
        if (filled.is_ok()) devices = std::move(filled).value();
    }
    if (placed.is_ok()) {
        if (devices.ordinals.size() == 1) ctx->params.vram_budget = devices.budgets[0];
        placed = devices.ordinals.size() > 1 ? place_weights_multi(*ctx, devices, policy) : place_weights(*ctx, policy);
    }
    std::swap(ctx->params, during);
    MOE_RETURN_IF_ERROR(placed);
    return ctx;
}

Status decode(moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens, bool logits_all) {
    int p0 = 0;
    MOE_RETURN_IF_ERROR(validate_batch(ctx, tokens, positions, n_tokens, &p0));
    const int n_vocab = ctx.model->hparams.n_vocab;
    ctx.n_past = p0;  // rewinding: later cache rows are simply overwritten
    const size_t rows = static_cast<size_t>(logits_all ? n_tokens : 1);
    const size_t logits_bytes = rows * static_cast<size_t>(n_vocab) * sizeof(float);
    ctx.logits_rows = 0;
    // Page-locked for decode-sized outputs only: pinning the logits of a long all-rows prefill (hundreds
    // of MB) would cost more than its download saves. A small decode after a large one gets a page-locked
    // buffer again.
    constexpr size_t kPinnedLogitsMax = size_t{16} << 20;
    const bool pinned = ctx.device && logits_bytes <= kPinnedLogitsMax;
    if (!ctx.logits || ctx.logits->size() < logits_bytes || (pinned && !ctx.logits_pinned)) {
        ctx.logits.reset();
        StatusOr<std::unique_ptr<Buffer>> b =
            pinned ? ctx.device->alloc_host_buffer(logits_bytes) : ctx.host->alloc_buffer(logits_bytes);
        if (!b.is_ok()) {
            return b.status().with_context("allocating the logits buffer of " + std::to_string(logits_bytes) + " bytes");
        }
        ctx.logits = std::move(b).value();
        ctx.logits_pinned = pinned;
    }

    Status status;
    for (int done = 0; done < n_tokens;) {
        const int n = std::min(ctx.params.n_ubatch, n_tokens - done);
        const bool last = done + n == n_tokens;
        if (logits_all || last) {
            float* dst = ctx.logits_data() + static_cast<size_t>(logits_all ? done : 0) * static_cast<size_t>(n_vocab);
            // Built ahead: the step a generation loop asks for next (one token, its logits).
            status = decode_ubatch(ctx, tokens + done, n, ctx.n_past, logits_all ? LogitsMode::ALL : LogitsMode::LAST,
                                   dst, last && ctx.device != nullptr);
        } else {
            status = decode_ubatch(ctx, tokens + done, n, ctx.n_past, LogitsMode::NONE, nullptr, false);
        }
        if (!status.is_ok()) {
            // The sequence ends where it was before this call; cache rows past it are never read.
            ctx.n_past = p0;
            return status;
        }
        ctx.n_past += n;
        done += n;
    }
    ctx.logits_rows = logits_all ? n_tokens : 1;
    ctx.kv_tokens.resize(static_cast<size_t>(p0));
    ctx.kv_tokens.insert(ctx.kv_tokens.end(), tokens, tokens + n_tokens);
    return Status::ok();
}

}  // namespace moe
