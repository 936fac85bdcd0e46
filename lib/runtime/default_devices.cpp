#include "runtime/default_devices.h"

#include <algorithm>
#include <regex>

#include "runtime/context.h"
#include "runtime/context_sizes.h"
#include "sched/device_split.h"
#include "sched/placement.h"

namespace moe {
namespace {

constexpr size_t kWeightAlign = 256;  // as placement pads each weight

uint64_t aligned(uint64_t n) { return (n + kWeightAlign - 1) & ~uint64_t{kWeightAlign - 1}; }

StatusOr<uint64_t> free_memory_of(const BackendFactory& factory, BackendOptions options, int ordinal) {
    options.device = ordinal;
    if (factory.free_memory) return factory.free_memory(options);
    MOE_ASSIGN_OR_RETURN(const std::unique_ptr<Backend> backend, factory.create(options));
    return uint64_t{backend->free_memory()};
}

// Per layer, what its weights need of a device: those the placement rules leave to the device (budget
// aside), of those the ones no budget moves to host RAM (all but the expert tensors no override pins),
// all of them, and its largest expert tensor; the weights outside the layers counted with the layer
// next to where they are read.
struct LayerBytes {
    uint64_t device = 0;
    uint64_t fixed = 0;
    uint64_t total = 0;
    uint64_t largest_expert = 0;
};

StatusOr<std::vector<LayerBytes>> layer_bytes(const moe_context& ctx) {
    const HParams& hp = ctx.model->hparams;
    std::vector<Tensor*> ws;
    std::vector<sched::WeightDesc> desc;
    for (const Tensor& t : ctx.weight_tensors) {
        if (!t.is_weight) continue;
        ws.push_back(const_cast<Tensor*>(&t));  // weight_layers reads them only
        desc.push_back({t.name, aligned(t.n_bytes())});
    }
    MOE_ASSIGN_OR_RETURN(sched::PlacementParams pp, placement_rules(ctx));
    pp.vram_budget = UINT64_MAX;
    MOE_ASSIGN_OR_RETURN(const std::vector<sched::Side> sides, sched::place_weights(desc, pp));
    const std::vector<int> layers = weight_layers(ctx, ws);
    std::vector<LayerBytes> out(static_cast<size_t>(hp.n_layer));
    for (size_t i = 0; i < ws.size(); ++i) {
        LayerBytes& l = out[static_cast<size_t>(std::max(layers[i], 0))];
        l.total += desc[i].bytes;
        if (sides[i] == sched::Side::DEVICE) {
            l.device += desc[i].bytes;
            const bool pinned = std::any_of(pp.overrides.begin(), pp.overrides.end(), [&](const sched::OverrideRule& r) {
                return std::regex_search(ws[i]->name, r.regex);
            });
            if (pinned || !sched::is_expert_tensor(ws[i]->name)) l.fixed += desc[i].bytes;
        }
        if (sched::is_expert_tensor(ws[i]->name)) l.largest_expert = std::max<uint64_t>(l.largest_expert, ws[i]->n_bytes());
    }
    return out;
}

}  // namespace

StatusOr<DeviceList> fill_order(const DeviceList& list, const BackendFactory& factory, const BackendOptions& options,
                                std::vector<uint64_t>* free) {
    MOE_ASSERT(list.fill);
    const size_t n = list.ordinals.size();
    std::vector<uint64_t> free_of(n), offers(n);
    std::vector<size_t> order;  // the devices that answer, then in fill order
    Status first_refusal = Status::ok();
    for (size_t d = 0; d < n; ++d) {
        StatusOr<uint64_t> f = free_memory_of(factory, options, list.ordinals[d]);
        if (!f.is_ok()) {
            // A GPU that cannot be opened (another process holds it in exclusive-process mode, or it has
            // failed) is no device of the default: it was not asked for by name. Only where none answers
            // is that an error.
            if (first_refusal.is_ok()) {
                first_refusal = f.status().with_context("the free memory of " + factory.name + " device " +
                                                        std::to_string(list.ordinals[d]));
            }
            continue;
        }
        free_of[d] = *f;
        offers[d] = list.budgets[d] > 0 ? list.budgets[d] : *f;
        order.push_back(d);
    }
    if (order.empty()) return first_refusal;
    std::stable_sort(order.begin(), order.end(), [&offers](size_t a, size_t b) { return offers[a] > offers[b]; });
    DeviceList out = list;
    out.ordinals.clear();
    out.budgets.clear();
    free->clear();
    for (size_t d : order) {
        out.ordinals.push_back(list.ordinals[d]);
        out.budgets.push_back(list.budgets[d]);
        free->push_back(free_of[d]);
    }
    out.fill = out.ordinals.size() > 1;  // one left: a one-device context
    return out;
}

StatusOr<DeviceList> fill_devices(const moe_context& ctx, const DeviceList& ordered, const std::vector<uint64_t>& free,
                                  const sched::Policy& policy) {
    const int n_layer = ctx.model->hparams.n_layer;
    const int n_dev = static_cast<int>(ordered.ordinals.size());
    MOE_ASSIGN_OR_RETURN(const std::vector<LayerBytes> layers, layer_bytes(ctx));
    // Whether layers [first, first + count) fit device d: with every weight the rules leave to the
    // device on it (all_on_device), or with the experts the budget may move moved to host RAM.
    const auto fits = [&](bool all_on_device, int d, int first, int count) {
        LayerBytes sum;
        for (int il = first; il < first + count; ++il) {
            const LayerBytes& l = layers[static_cast<size_t>(il)];
            sum.device += all_on_device ? l.device : l.fixed;
            sum.total += l.total;
            sum.largest_expert = std::max(sum.largest_expert, l.largest_expert);
        }
        const uint64_t given = ordered.budgets[static_cast<size_t>(d)];
        // The whole model on the first device is a one-device context, whose default budget also keeps
        // the expert split's activations free.
        const uint64_t budget = given > 0 ? given
                                          : default_weight_budget(ctx, free[static_cast<size_t>(d)], count, sum.total,
                                                                  sum.largest_expert, policy, count == n_layer);
        return sum.device <= budget;
    };
    const std::optional<std::vector<int>> filled = sched::fill_layers(
        n_layer, n_dev, [&fits](int d, int first, int count) { return fits(true, d, first, count); });
    DeviceList out = ordered;
    out.fill = false;
    // The devices that got layers, each with its run of layers as its proportion (runs of the layer
    // counts deal the layers out as they were filled: sched::split_layers).
    const auto as_filled = [&](const std::vector<int>& layer_device) {
        std::vector<double> counts(static_cast<size_t>(n_dev), 0.0);
        for (int d : layer_device) counts[static_cast<size_t>(d)] += 1.0;
        return devices_with_shares(ordered, counts);
    };
    if (filled && !filled->empty() && filled->front() == 0) return as_filled(*filled);
    // Layers left over: the weights that cannot move must fit the devices in order (as greedy runs are the
    // best in-order packing, no split in this order fits where this does not); otherwise no split helps:
    // the first device alone, whose refusal says what its budget was made of.
    const std::optional<std::vector<int>> fixed = sched::fill_layers(
        n_layer, n_dev, [&fits](int d, int first, int count) { return fits(false, d, first, count); });
    if (!fixed || fixed->empty() || fixed->front() != 0) {
        out.ordinals.resize(1);
        out.budgets.resize(1);
        return out;
    }
    // Every device, the layers split by their budgets (else free memory) as without the default, where
    // each device's run holds those weights; where it does not (the split by proportions can give a full
    // device a layer more than it holds), the layers as those weights fill the devices.
    std::vector<double> shares;
    for (int d = 0; d < n_dev; ++d) {
        const uint64_t budget = ordered.budgets[static_cast<size_t>(d)];
        shares.push_back(static_cast<double>(budget > 0 ? budget : free[static_cast<size_t>(d)]));
    }
    const StatusOr<std::vector<int>> split = sched::split_layers(n_layer, shares, {});
    if (!split.is_ok()) return as_filled(*fixed);
    for (int il = 0; il < n_layer;) {
        const int d = (*split)[static_cast<size_t>(il)];
        int count = 0;
        while (il + count < n_layer && (*split)[static_cast<size_t>(il + count)] == d) ++count;
        if (!fits(false, d, il, count)) return as_filled(*fixed);
        il += count;
    }
    out.proportions = shares;
    return out;
}

}  // namespace moe
