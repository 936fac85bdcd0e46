#include "runtime/multi_device.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <iterator>
#include <numeric>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator.h"
#include "core/backend_registry.h"
#include "runtime/attention_home.h"
#include "runtime/context_sizes.h"
#include "runtime/copy_progress.h"
#include "runtime/stage_crossing.h"
#include "sched/clock.h"
#include "sched/device_split.h"
#include "sched/graph_cut.h"
#include "sched/placement.h"
#include "sched/transfers.h"

namespace moe {
namespace {

using sched::Side;

constexpr size_t kWeightAlign = 256;

size_t aligned(size_t n) { return (n + kWeightAlign - 1) & ~(kWeightAlign - 1); }

const char* backend_name(int32_t device_kind) { return device_kind == MOE_DEVICE_CUDA ? "cuda" : "emulated"; }

// "CUDA1 (cuda device 3)": how errors name device `index` of the list.
std::string device_label(const moe_context& ctx, size_t index) {
    return "CUDA" + std::to_string(index) + " (" + backend_name(ctx.params.device) + " device " +
           std::to_string(ctx.parts[index].ordinal) + ")";
}

Backend& backend_of(moe_context& ctx, size_t index) { return index == 0 ? *ctx.device : *ctx.parts[index].backend; }

// Per weight of `ws`, the index of its device: its layer's (weight_layers; device 0 for one no node
// reads).
StatusOr<std::vector<int>> weight_devices(const moe_context& ctx, const std::vector<Tensor*>& ws,
                                          const std::vector<sched::OverrideRule>& overrides) {
    const std::vector<int> layers = weight_layers(ctx, ws);
    std::vector<int> device(ws.size(), 0);
    for (size_t i = 0; i < ws.size(); ++i) {
        if (layers[i] >= 0) device[i] = ctx.layer_device[static_cast<size_t>(layers[i])];
        if (const int layer = sched::layer_of(ws[i]->name); layer >= 0 && layer < ctx.model->hparams.n_layer) continue;
        for (const sched::OverrideRule& r : overrides) {
            if (!std::regex_search(ws[i]->name, r.regex)) continue;
            if (r.side == Side::DEVICE && r.device >= 0 && r.device != device[i]) {
                return invalid_argument("tensor override '" + r.pattern + "=CUDA" + std::to_string(r.device) + "': '" +
                                        ws[i]->name + "' is read by ops on CUDA" + std::to_string(device[i]) +
                                        " (a tensor outside the layers goes with the layer next to where it is read)");
            }
            break;
        }
    }
    return device;
}

// One device's weights as placement decided them.
struct DeviceWeights {
    std::vector<Tensor*> ws;
    std::vector<Side> sides;
    std::vector<bool> dup;
    std::vector<HostRange> uploadable;
    std::vector<Side> attention;  // per layer of the model: its attention's side (layers of this device only)
};

}  // namespace

std::vector<int> weight_layers(const moe_context& ctx, const std::vector<Tensor*>& ws) {
    const HParams& hp = ctx.model->hparams;
    std::deque<Tensor> cache;
    const KvCache kv = prototype_kv_cache(ctx, cache);
    Graph g;
    build_model_graph(g, hp, ctx.weights, kv, 1, 0, LogitsMode::LAST, ctx.kv_addressing());
    // node_devices with every layer its own "device" gives each node its layer, the nodes outside the
    // layers the layer next to them.
    std::vector<int> identity(static_cast<size_t>(hp.n_layer));
    std::iota(identity.begin(), identity.end(), 0);
    const std::vector<int> node_layer = sched::node_devices(g, identity);
    std::unordered_map<const Tensor*, int> reader;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
        for (const Tensor* s : g.nodes()[i]->src) {
            if (s != nullptr && s->is_weight) reader.emplace(s, node_layer[i]);
        }
    }
    std::vector<int> layers(ws.size(), -1);
    for (size_t i = 0; i < ws.size(); ++i) {
        const int layer = sched::layer_of(ws[i]->name);
        if (layer >= 0 && layer < hp.n_layer) {
            layers[i] = layer;
        } else if (auto it = reader.find(ws[i]); it != reader.end()) {
            layers[i] = it->second;
        }
    }
    return layers;
}

DeviceList devices_with_shares(const DeviceList& list, const std::vector<double>& shares) {
    MOE_ASSERT(shares.size() == list.ordinals.size() && list.budgets.size() == list.ordinals.size());
    DeviceList out;
    for (size_t d = 0; d < shares.size(); ++d) {
        if (shares[d] <= 0.0) continue;
        out.ordinals.push_back(list.ordinals[d]);
        out.budgets.push_back(list.budgets[d]);
        out.proportions.push_back(shares[d]);
    }
    if (out.ordinals.size() == 1) out.proportions.clear();
    return out;
}

StatusOr<DeviceList> device_list(const moe_context_params& p, int32_t device_kind, int device_count, int visible) {
    if (p.split_mode != MOE_SPLIT_NONE && p.split_mode != MOE_SPLIT_LAYER && p.split_mode != MOE_SPLIT_ROW) {
        return invalid_argument("split_mode must be MOE_SPLIT_NONE, MOE_SPLIT_LAYER or MOE_SPLIT_ROW (got " +
                                std::to_string(p.split_mode) + ")");
    }
    if (p.split_mode == MOE_SPLIT_ROW) return unimplemented("split_mode MOE_SPLIT_ROW (rows across devices)");
    if (p.n_devices < 0) return invalid_argument("n_devices must be >= 0 (got " + std::to_string(p.n_devices) + ")");
    if ((p.devices == nullptr) != (p.n_devices == 0)) {
        return invalid_argument("devices and n_devices go together: devices is " +
                                std::string(p.devices ? "set" : "NULL") + " with n_devices = " +
                                std::to_string(p.n_devices));
    }
    DeviceList list;
    const std::string backend = backend_name(device_kind);
    if (p.n_devices > 0) {
        for (int32_t i = 0; i < p.n_devices; ++i) {
            const int32_t o = p.devices[i];
            if (o < 0 || o >= device_count) {
                return invalid_argument("devices[" + std::to_string(i) + "] = " + std::to_string(o) + ": the " + backend +
                                        " backend has " + std::to_string(device_count) + " device(s) here");
            }
            if (std::find(list.ordinals.begin(), list.ordinals.end(), o) != list.ordinals.end()) {
                return invalid_argument("devices[" + std::to_string(i) + "] = " + std::to_string(o) + " is listed twice");
            }
            list.ordinals.push_back(o);
        }
    } else {
        // No list: the devices the backend shows, in ordinal order, so that CUDAn, tensor_split, main_gpu
        // and vram_budgets index them as llama.cpp's flags do (one: the backend's first device).
        const int n_visible = visible < 0 ? device_count : std::clamp(visible, 1, device_count);
        for (int o = 0; o < n_visible; ++o) list.ordinals.push_back(o);
    }
    const size_t n = list.ordinals.size();
    const auto count_check = [n](int32_t count, const void* values, const char* field) -> Status {
        const std::string f(field);
        if (count < 0) return invalid_argument("n_" + f + " must be >= 0 (got " + std::to_string(count) + ")");
        if ((values == nullptr) != (count == 0)) {
            return invalid_argument(f + " and n_" + f + " go together: " + f + " is " + (values ? "set" : "NULL") +
                                    " with n_" + f + " = " + std::to_string(count));
        }
        if (static_cast<size_t>(count) > n) {
            return invalid_argument(f + " has " + std::to_string(count) + " entries, more than the " + std::to_string(n) +
                                    " device(s) of the context");
        }
        return Status::ok();
    };
    MOE_RETURN_IF_ERROR(count_check(p.n_tensor_split, p.tensor_split, "tensor_split"));
    MOE_RETURN_IF_ERROR(count_check(p.n_vram_budgets, p.vram_budgets, "vram_budgets"));
    if (p.n_tensor_split > 0) {
        list.proportions.assign(n, 0.0);
        for (int32_t i = 0; i < p.n_tensor_split; ++i) list.proportions[static_cast<size_t>(i)] = p.tensor_split[i];
        // The same checks as the split itself, so that a bad value is named before anything is created.
        MOE_RETURN_IF_ERROR(sched::split_layers(0, list.proportions, {}).status());
    }
    list.budgets.assign(n, p.vram_budget);
    for (int32_t i = 0; i < p.n_vram_budgets; ++i) list.budgets[static_cast<size_t>(i)] = p.vram_budgets[i];
    if (p.main_gpu < 0 || static_cast<size_t>(p.main_gpu) >= n) {
        return invalid_argument("main_gpu = " + std::to_string(p.main_gpu) + " is not an index of the " +
                                std::to_string(n) + " device(s) of the context");
    }
    // CUDAn in the overrides must name a device of the list (also with one device: CUDA1 is no device).
    MOE_ASSIGN_OR_RETURN(const std::vector<sched::OverrideRule> rules,
                         sched::parse_overrides(p.tensor_overrides ? p.tensor_overrides : ""));
    const size_t in_use = p.split_mode == MOE_SPLIT_NONE ? 1 : n;
    MOE_RETURN_IF_ERROR(sched::pinned_layers({}, rules, 0, static_cast<int>(in_use)).status());
    if (p.split_mode == MOE_SPLIT_NONE) {
        const size_t m = static_cast<size_t>(p.main_gpu);
        list.ordinals = {list.ordinals[m]};
        list.budgets = {list.budgets[m]};
        list.proportions.clear();
    }
    const bool names_device = std::any_of(rules.begin(), rules.end(), [](const sched::OverrideRule& r) {
        return r.side == Side::DEVICE && r.device >= 0;
    });
    // A device the tensor split gives no layers (-ts 1,0) is left out, as llama.cpp does, rather than
    // given a backend, a scheduler and a place in the statistics with nothing to run; unless an override
    // names devices by their index in the list, which leaving one out would shift.
    if (!list.proportions.empty() && !names_device) list = devices_with_shares(list, list.proportions);
    list.fill = p.n_devices == 0 && list.ordinals.size() > 1 && list.proportions.empty() && !names_device;
    return list;
}

Status place_weights_multi(moe_context& ctx, const DeviceList& list, const sched::Policy& policy) {
    const HParams& hp = ctx.model->hparams;
    const size_t n_dev = list.ordinals.size();
    MOE_ASSERT(n_dev >= 2 && ctx.device);
    ctx.parts.resize(n_dev);
    for (size_t d = 0; d < n_dev; ++d) {
        ctx.parts[d].ordinal = list.ordinals[d];
        if (d == 0) continue;
        const BackendFactory* factory = find_backend_factory(backend_name(ctx.params.device));
        MOE_ASSERT(factory != nullptr);  // device 0 was made by it
        BackendOptions opts;
        opts.n_threads = ctx.params.n_threads;
        opts.device = list.ordinals[d];
        opts.config = ctx.backend_config;
        MOE_ASSIGN_OR_RETURN(ctx.parts[d].backend, factory->create(opts));
    }

    std::vector<Tensor*> ws;
    std::vector<std::string> names;
    for (Tensor& t : ctx.weight_tensors) {
        if (!t.is_weight) continue;
        ws.push_back(&t);
        names.push_back(t.name);
    }
    MOE_ASSIGN_OR_RETURN(const std::vector<sched::OverrideRule> overrides,
                         sched::parse_overrides(ctx.params.tensor_overrides ? ctx.params.tensor_overrides : ""));
    MOE_ASSIGN_OR_RETURN(const std::vector<int> pinned,
                         sched::pinned_layers(names, overrides, hp.n_layer, static_cast<int>(n_dev)));
    std::vector<double> proportions = list.proportions;
    if (proportions.empty()) {
        // Budgets where given, else what each device has free: llama.cpp's default split.
        for (size_t d = 0; d < n_dev; ++d) {
            proportions.push_back(list.budgets[d] > 0 ? static_cast<double>(list.budgets[d])
                                                      : static_cast<double>(backend_of(ctx, d).free_memory()));
        }
    }
    MOE_ASSIGN_OR_RETURN(ctx.layer_device, sched::split_layers(hp.n_layer, proportions, pinned));
    for (int dev : ctx.layer_device) ++ctx.parts[static_cast<size_t>(dev)].n_layers;
    MOE_ASSIGN_OR_RETURN(const std::vector<int> weight_device, weight_devices(ctx, ws, overrides));

    // Placement per device: the one-device rule over its weights, under its budget.
    std::vector<DeviceWeights> per(n_dev);
    std::unordered_map<const Tensor*, Side> side_of;
    for (size_t d = 0; d < n_dev; ++d) {
        DeviceWeights& dw = per[d];
        std::vector<sched::WeightDesc> desc;
        uint64_t total = 0, largest_expert = 0;
        for (size_t i = 0; i < ws.size(); ++i) {
            if (weight_device[i] != static_cast<int>(d)) continue;
            dw.ws.push_back(ws[i]);
            desc.push_back({ws[i]->name, aligned(ws[i]->n_bytes())});
            total += aligned(ws[i]->n_bytes());
            if (sched::is_expert_tensor(ws[i]->name)) largest_expert = std::max<uint64_t>(largest_expert, ws[i]->n_bytes());
        }
        sched::PlacementParams pp;
        pp.overrides = overrides;
        pp.n_layer = hp.n_layer;
        pp.n_cpu_moe = ctx.params.n_cpu_moe;
        pp.n_gpu_layers = ctx.params.n_gpu_layers;
        Backend& be = backend_of(ctx, d);
        // Attention the device has no kernel for stays on the host (runtime/attention_home.h).
        const std::vector<sched::OverrideRule> host_attention = host_attention_overrides(hp, ctx.weights, be);
        pp.overrides.insert(pp.overrides.begin(), host_attention.begin(), host_attention.end());
        // As for one device: free memory less this device's KV cache, the activations, a reserve and,
        // when the weights do not all fit, the upload slots.
        pp.vram_budget = list.budgets[d] > 0 ? list.budgets[d]
                                             : default_weight_budget(ctx, be.free_memory(), ctx.parts[d].n_layers, total,
                                                                     largest_expert, policy, false);
        StatusOr<std::vector<Side>> sides = sched::place_weights(desc, pp);
        if (!sides.is_ok()) return sides.status().with_context("placing the weights of " + device_label(ctx, d));
        dw.sides = std::move(sides).value();
        for (size_t i = 0; i < dw.ws.size(); ++i) {
            side_of[dw.ws[i]] = dw.sides[i];
            const Tensor& t = *dw.ws[i];
            if (t.type == Type::F32) continue;
            Tensor probe;
            probe.op = Op::MUL_MAT;
            probe.src[0] = const_cast<Tensor*>(&t);
            const Backend& reader = dw.sides[i] == Side::DEVICE ? be : *ctx.host;
            if (!reader.supports_op(probe)) {
                return unimplemented("tensor '" + t.name + "': type " + type_name(t.type) + " is not supported by the " +
                                     reader.name() + " backend");
            }
        }
        dw.dup = sched::duplicated_biases(dw.ws, dw.sides);
    }

    // Memory: each device's weights and KV cache; the KV cache of layers whose attention stays in host RAM.
    const size_t per_tensor = kv_prototype(ctx).n_bytes();  // V, where there is one, is as large as K
    const size_t kv_per_layer = static_cast<size_t>(kv_tensors_per_layer(ctx));
    std::vector<Side> attention(static_cast<size_t>(hp.n_layer));
    size_t host_kv = 0;
    std::vector<size_t> device_kv(n_dev, 0);
    for (int il = 0; il < hp.n_layer; ++il) {
        attention[static_cast<size_t>(il)] = side_of.at(attention_anchor(ctx.weights.layers[static_cast<size_t>(il)]));
        if (attention[static_cast<size_t>(il)] == Side::DEVICE) {
            device_kv[static_cast<size_t>(ctx.layer_device[static_cast<size_t>(il)])] += kv_per_layer;
        } else {
            host_kv += kv_per_layer;
        }
    }
    uint64_t progress_total = 0;
    for (size_t d = 0; d < n_dev; ++d) {
        DeviceWeights& dw = per[d];
        DevicePart& part = ctx.parts[d];
        Backend& be = backend_of(ctx, d);
        uint64_t device_bytes = 0;
        for (size_t i = 0; i < dw.ws.size(); ++i) {
            const size_t n = aligned(dw.ws[i]->n_bytes());
            if (dw.sides[i] == Side::DEVICE || dw.dup[i]) device_bytes += n;
            if (dw.sides[i] == Side::HOST) {
                part.weights_host_bytes += n;
                dw.uploadable.push_back({dw.ws[i]->data, dw.ws[i]->n_bytes()});
            }
        }
        part.weights_device_bytes = device_bytes;
        progress_total += HostWeights::run_bytes(dw.uploadable) + device_bytes;
        std::unique_ptr<Buffer>& weights = d == 0 ? ctx.device_weights : part.weights;
        if (device_bytes > 0) {
            StatusOr<std::unique_ptr<Buffer>> b = be.alloc_buffer(device_bytes);
            if (!b.is_ok()) return b.status().with_context("allocating memory for the weights of " + device_label(ctx, d));
            weights = std::move(b).value();
        }
        std::unique_ptr<Buffer>& kv = d == 0 ? ctx.kv_buffer[static_cast<int>(Side::DEVICE)] : part.kv;
        if (device_kv[d] > 0) {
            StatusOr<std::unique_ptr<Buffer>> b = be.alloc_buffer(device_kv[d] * per_tensor);
            if (!b.is_ok()) return b.status().with_context("allocating the KV cache of " + device_label(ctx, d));
            kv = std::move(b).value();
        }
    }
    if (host_kv > 0) {
        StatusOr<std::unique_ptr<Buffer>> b = ctx.host->alloc_buffer(host_kv * per_tensor);
        if (!b.is_ok()) return b.status().with_context("allocating the KV cache");
        ctx.kv_buffer[static_cast<int>(Side::HOST)] = std::move(b).value();
    }

    // Page-locking and uploads, then a scheduler per device.
    CopyProgress progress(ctx.params, progress_total);
    ctx.weights_device_bytes = ctx.weights_host_bytes = ctx.weights_host_locked_bytes = 0;
    for (size_t d = 0; d < n_dev; ++d) {
        DeviceWeights& dw = per[d];
        DevicePart& part = ctx.parts[d];
        Backend& be = backend_of(ctx, d);
        HostWeights& host_weights = d == 0 ? ctx.host_weights : part.host_weights;
        if (!dw.uploadable.empty()) {
            MOE_ASSIGN_OR_RETURN(host_weights,
                                 HostWeights::register_ranges(be, dw.uploadable, *ctx.model->file,
                                                              ctx.params.n_threads,
                                                              [&](uint64_t n) { return progress.advance(n); }));
            part.weights_host_locked_bytes = host_weights.locked_bytes();
        }
        sched::WeightUpload up;
        up.device = &be;
        up.device_weights = d == 0 ? ctx.device_weights.get() : part.weights.get();
        up.align = kWeightAlign;
        up.host_buffer_of = [&host_weights](const void* p, size_t n) { return host_weights.buffer_of(p, n); };
        up.progress = [&progress](uint64_t n) { return progress.advance(n); };
        MOE_ASSIGN_OR_RETURN(const std::vector<sched::WeightCopies> copies,
                             sched::upload_weights(dw.ws, dw.sides, dw.dup, up));
        std::unique_ptr<sched::Scheduler>& sched = d == 0 ? ctx.sched : part.sched;
        sched = std::make_unique<sched::Scheduler>(*ctx.host, &be, hp.n_layer, hp.n_expert, hp.n_expert_used);
        for (size_t i = 0; i < dw.ws.size(); ++i) sched->add_weight(dw.ws[i], copies[i]);
        MOE_RETURN_IF_ERROR(be.synchronize().with_context("uploading the weights of " + device_label(ctx, d)));
        MOE_RETURN_IF_ERROR(sched->set_policy(policy));
        ctx.weights_device_bytes += part.weights_device_bytes;
        ctx.weights_host_bytes += part.weights_host_bytes;
        ctx.weights_host_locked_bytes += part.weights_host_locked_bytes;
    }
    // Peer access where the devices of consecutive stages can reach each other (unless peer_copies=staged,
    // for machines whose peer-to-peer is broken: it is then never enabled).
    for (DevicePart& part : ctx.parts) part.peer.assign(n_dev, 0);
    if (ctx.backend_config.peer_copies == PeerCopies::AUTO) {
        for (const auto& [from, to] : adjacent_devices(ctx.layer_device)) {
            const size_t f = static_cast<size_t>(from), t = static_cast<size_t>(to);
            StatusOr<bool> on = backend_of(ctx, t).enable_peer_access(backend_of(ctx, f));
            if (!on.is_ok()) {
                return on.status().with_context("enabling peer access of " + device_label(ctx, t) + " to the memory of " +
                                                device_label(ctx, f) + " (backend option peer_copies=staged avoids it)");
            }
            ctx.parts[t].peer[f] = *on ? 1 : 0;
        }
    }
    // Upload relays: a device with weights in host RAM sends part of each upload through the other devices'
    // host links and the peer link, where that pays (upload_relay=auto measures it). Peer access is needed,
    // so peer_copies=staged has none. A partner without memory for the relay's slots is left out.
    for (DevicePart& part : ctx.parts) part.relay.assign(n_dev, 0);
    const UploadRelayMode relay = ctx.backend_config.upload_relay;
    if (relay != UploadRelayMode::OFF && ctx.backend_config.peer_copies == PeerCopies::AUTO) {
        for (size_t t = 0; t < n_dev; ++t) {
            if (ctx.parts[t].weights_host_bytes == 0) continue;
            for (size_t f = 0; f < n_dev; ++f) {
                if (f == t) continue;
                StatusOr<bool> on = backend_of(ctx, t).add_upload_relay(backend_of(ctx, f), relay == UploadRelayMode::AUTO);
                if (!on.is_ok() && on.status().code() == MOE_STATUS_RESOURCE_EXHAUSTED) continue;
                if (!on.is_ok()) {
                    return on.status().with_context("relaying the uploads of " + device_label(ctx, t) + " through " +
                                                    device_label(ctx, f) + " (backend option upload_relay=off avoids it)");
                }
                ctx.parts[t].relay[f] = *on ? 1 : 0;
            }
        }
    }
    // The KV cache over the buffers, layer by layer.
    std::vector<size_t> used(n_dev, 0);
    size_t host_used = 0;
    ctx.kv.n_ctx = ctx.params.n_ctx;
    for (int il = 0; il < hp.n_layer; ++il) {
        const size_t d = static_cast<size_t>(ctx.layer_device[static_cast<size_t>(il)]);
        const bool on_device = attention[static_cast<size_t>(il)] == Side::DEVICE;
        Buffer* buf = on_device ? (d == 0 ? ctx.kv_buffer[static_cast<int>(Side::DEVICE)].get() : ctx.parts[d].kv.get())
                                : ctx.kv_buffer[static_cast<int>(Side::HOST)].get();
        size_t& at = on_device ? used[d] : host_used;
        for (size_t k = 0; k < kv_per_layer; ++k) {
            MOE_ASSERT(buf != nullptr && (at + 1) * per_tensor <= buf->size());
            Tensor& t = ctx.kv_tensors.emplace_back(kv_prototype(ctx, k == 1));
            t.data = static_cast<uint8_t*>(buf->data()) + at++ * per_tensor;
            t.buffer = buf;
            t.name = std::string(k == 0 ? "cache_k." : "cache_v.") + std::to_string(il);
            (k == 0 ? ctx.kv.k : ctx.kv.v).push_back(&t);
        }
    }
    return Status::ok();
}

StatusOr<sched::ExpertSplitPlan> plan_expert_split_multi(moe_context& ctx, int n_tokens) {
    sched::ExpertSplitPlan merged;
    for (sched::Scheduler* s : schedulers(ctx)) {
        MOE_ASSIGN_OR_RETURN(sched::ExpertSplitPlan p, s->plan_expert_split(n_tokens));
        if (p.layers.empty()) continue;
        if (merged.layers.empty()) {
            merged.layers.assign(p.layers.size(), 0);
            merged.groups.assign(p.groups.size(), 0);
        }
        const size_t per_layer = p.layers.empty() ? 0 : p.groups.size() / p.layers.size();
        for (size_t il = 0; il < p.layers.size(); ++il) {
            if (!p.layers[il]) continue;
            merged.layers[il] = 1;
            std::copy_n(p.groups.begin() + static_cast<std::ptrdiff_t>(il * per_layer), per_layer,
                        merged.groups.begin() + static_cast<std::ptrdiff_t>(il * per_layer));
        }
        merged.n_layers += p.n_layers;
        merged.n_host_experts += p.n_host_experts;
    }
    return merged;
}

StatusOr<std::vector<sched::Stage>> cut_stages(const moe_context& ctx, Graph& graph) {
    return sched::cut_graph(graph, sched::node_devices(graph, ctx.layer_device));
}

void prepare_stages(moe_context& ctx, std::vector<sched::Stage>& stages) {
    std::vector<int> seen(ctx.parts.size(), 0);
    for (const sched::Stage& stage : stages) {
        // One plan per scheduler: a device's first stage (a second, of layers pinned away, plans when it runs).
        if (seen[static_cast<size_t>(stage.device)]++ > 0) continue;
        std::vector<Tensor*> leaves;
        for (const auto& [leaf, from] : stage.inputs) leaves.push_back(leaf);
        scheduler_of(ctx, static_cast<size_t>(stage.device)).prepare(*stage.graph, leaves);
    }
}

Status run_stages(moe_context& ctx, std::vector<sched::Stage>& stages, const sched::ExpertParts& parts, int n_tokens,
                  std::span<const sched::HostInput> inputs, std::span<const sched::HostOutput> outputs,
                  const std::function<void()>& while_waiting) {
    const std::vector<std::vector<uint8_t>> by_peer = peer_crossings(stages, [&ctx](int to, int from) {
        return ctx.parts[static_cast<size_t>(to)].peer[static_cast<size_t>(from)] != 0;
    });
    std::unordered_map<const Tensor*, const void*> input_data;
    for (const sched::HostInput& in : inputs) input_data[in.tensor] = in.data;
    // Where each export crosses: its place in its device's page-locked staging (also for one meant to
    // cross by peer copy, in case host ops computed it), laid out for the whole ubatch before any stage
    // runs, so that growing a staging buffer frees nothing still to be read.
    struct Crossing {
        int device = 0;
        size_t offset = 0;
        const void* on_device = nullptr;  // set by its stage's run where it stayed on the device
    };
    std::unordered_map<const Tensor*, Crossing> crossing;
    std::unordered_map<const Tensor*, size_t> producer;  // export -> its stage
    std::vector<size_t> staging_bytes(ctx.parts.size(), 0);
    for (size_t si = 0; si < stages.size(); ++si) {
        const sched::Stage& stage = stages[si];
        for (const Tensor* e : stage.exports) {
            producer[e] = si;
            size_t& at = staging_bytes[static_cast<size_t>(stage.device)];
            crossing[e] = {stage.device, at, nullptr};
            at += (e->n_bytes() + 255) & ~size_t{255};
        }
    }
    for (size_t d = 0; d < ctx.parts.size(); ++d) {
        std::unique_ptr<Buffer>& staging = ctx.parts[d].staging;
        if (staging_bytes[d] == 0 || (staging && staging->size() >= staging_bytes[d])) continue;
        staging.reset();
        StatusOr<std::unique_ptr<Buffer>> b = backend_of(ctx, d).alloc_host_buffer(staging_bytes[d]);
        if (!b.is_ok()) return b.status().with_context("allocating the staging of " + device_label(ctx, d));
        staging = std::move(b).value();
    }
    const auto staged = [&ctx](const Crossing& c) {
        return static_cast<uint8_t*>(ctx.parts[static_cast<size_t>(c.device)].staging->data()) + c.offset;
    };
    std::vector<int> runs(ctx.parts.size(), 0);  // stages each device ran in this ubatch
    std::vector<uint8_t> done(stages.size(), 0);     // stages whose run has returned
    std::vector<uint8_t> busy(ctx.parts.size(), 0);  // devices inside a run (chained runs nest)
    size_t next = 0;                                 // the next stage to start
    // Whether stage si can start inside the run of an earlier one, while that one's device computes: its
    // device is in no run, and what it takes from stages still running is left on their devices (a peer
    // copy ordered after their queued compute; an export through the host is there only once its
    // producer's device is synchronised).
    const auto can_chain = [&](size_t si) {
        if (busy[static_cast<size_t>(stages[si].device)]) return false;
        for (const auto& [leaf, from] : stages[si].inputs) {
            if (from->op == Op::NONE) continue;
            const Crossing& c = crossing.at(from);
            if (c.on_device == nullptr && !done[producer.at(from)]) return false;
        }
        return true;
    };
    std::function<Status()> run_next = [&]() -> Status {
        const size_t si = next++;
        sched::Stage& stage = stages[si];
        std::vector<sched::HostInput> ins;
        uint64_t crossed = 0;
        for (const auto& [leaf, from] : stage.inputs) {
            if (from->op == Op::NONE) {
                const auto it = input_data.find(from);
                if (it == input_data.end()) return internal_error("graph cut: input '" + from->name + "' has no data");
                ins.push_back({leaf, it->second});
                continue;
            }
            const Crossing& c = crossing.at(from);
            if (c.on_device != nullptr) {
                ins.push_back({leaf, c.on_device, &backend_of(ctx, static_cast<size_t>(c.device))});
            } else {
                ins.push_back({leaf, staged(c)});
            }
            crossed += leaf->n_bytes();
        }
        std::vector<sched::HostOutput> outs;
        for (size_t k = 0; k < stage.exports.size(); ++k) {
            Crossing& c = crossing.at(stage.exports[k]);
            outs.push_back({stage.exports[k], staged(c), by_peer[si][k] ? &c.on_device : nullptr});
        }
        const std::unordered_set<const Tensor*> here(stage.graph->nodes().begin(), stage.graph->nodes().end());
        for (const sched::HostOutput& out : outputs) {
            if (here.count(out.tensor)) outs.push_back(out);
        }
        sched::Scheduler& s = scheduler_of(ctx, static_cast<size_t>(stage.device));
        // Once this stage is queued, the next starts while this one's device computes (its host work, the
        // peer copy of its input ordered after this stage's compute by events), instead of after this
        // device's synchronisation: the devices' work follows without a gap. Its time is its own
        // scheduler's, left out of this one's (Scheduler::run). After the last stage is queued: the
        // caller's host work for the next ubatch.
        Status chained = Status::ok();
        const auto chain = [&]() -> double {
            if (next >= stages.size()) {
                if (while_waiting) while_waiting();
                return 0.0;
            }
            if (!can_chain(next)) return 0.0;
            const sched::Clock::time_point t0 = sched::Clock::now();
            chained = run_next();
            return sched::seconds_since(t0);
        };
        busy[static_cast<size_t>(stage.device)] = 1;
        // A stage adopts the full graph's nodes as they are: the parts' nodes keep their groups.
        const Status st = s.run(*stage.graph, parts, n_tokens, ins, outs, chain);
        busy[static_cast<size_t>(stage.device)] = 0;
        done[si] = 1;
        MOE_RETURN_IF_ERROR(st);
        MOE_RETURN_IF_ERROR(chained);
        // An export through the host crosses twice (out here, into each reader); by peer copy once.
        for (const Tensor* e : stage.exports) {
            if (crossing.at(e).on_device == nullptr) crossed += e->n_bytes();
        }
        s.stats().bytes_between_devices += crossed;
        // A device that runs two stages of one ubatch (layers pinned away from its run) counts the
        // ubatch once, so that n_ubatches stays the context's.
        if (runs[static_cast<size_t>(stage.device)]++ > 0) --s.stats().n_ubatches;
        return Status::ok();
    };
    while (next < stages.size()) MOE_RETURN_IF_ERROR(run_next());
    return Status::ok();
}

sched::Stats context_stats(const moe_context& ctx) {
    sched::Stats sum = ctx.sched->stats();
    for (size_t d = 1; d < ctx.parts.size(); ++d) {
        const sched::Stats& s = ctx.parts[d].sched->stats();
        // Each device's scheduler runs a stage of every ubatch (or several): the context's ubatches are
        // the most any of them ran.
        const uint64_t ubatches = std::max(sum.n_ubatches, s.n_ubatches);
#define MOE_ADD_COUNTER(type, name, dims) add(sum.name, s.name);
        const auto add = [](auto& a, const auto& b) {
            if constexpr (std::is_array_v<std::remove_reference_t<decltype(a)>>) {
                for (size_t i = 0; i < std::size(a); ++i) a[i] += b[i];
            } else {
                a += b;
            }
        };
        MOE_SCHED_STATS_COUNTERS(MOE_ADD_COUNTER)
#undef MOE_ADD_COUNTER
        sum.n_ubatches = ubatches;
        for (size_t i = 0; i < sum.expert_counts.size() && i < s.expert_counts.size(); ++i) {
            sum.expert_counts[i] += s.expert_counts[i];
        }
    }
    return sum;
}

std::optional<sched::WeightCopies> weight_copies(const moe_context& ctx, const Tensor* weight) {
    for (sched::Scheduler* s : schedulers(ctx)) {
        if (std::optional<sched::WeightCopies> c = s->weight_copies(weight)) return c;
    }
    return std::nullopt;
}

std::vector<sched::Scheduler*> schedulers(const moe_context& ctx) {
    std::vector<sched::Scheduler*> out = {ctx.sched.get()};
    for (size_t d = 1; d < ctx.parts.size(); ++d) out.push_back(ctx.parts[d].sched.get());
    return out;
}

sched::Scheduler& scheduler_of(const moe_context& ctx, size_t index) {
    return index == 0 ? *ctx.sched : *ctx.parts[index].sched;
}

size_t n_devices(const moe_context& ctx) { return std::max<size_t>(ctx.parts.size(), 1); }

}  // namespace moe
