#include "runtime/offload_calibration.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "core/backend_registry.h"
#include "sched/clock.h"

namespace moe {
namespace {

using sched::kOffloadOps;

constexpr int kRepetitions = 3;  // timed runs after one untimed warm-up; the median counts
constexpr size_t kLinkProbeBytes = size_t{64} << 20;

// The first weight of each offload kind, in graph order, that lives in host RAM only (nullptr: none).
std::array<const Tensor*, kOffloadOps> probe_weights(const moe_context& ctx) {
    std::array<const Tensor*, kOffloadOps> out{};
    Graph g;
    build_model_graph(g, ctx.model->hparams, ctx.weights, ctx.kv, 1, 0, LogitsMode::LAST, ctx.kv_addressing());
    for (const Tensor* node : g.nodes()) {
        const std::optional<sched::OffloadOp> kind = sched::offload_op_of(node->op);
        const Tensor* w = node->src[0];
        if (!kind || w == nullptr || !w->is_weight || out[static_cast<size_t>(*kind)] != nullptr) continue;
        const std::optional<sched::WeightCopies> c = ctx.sched->weight_copies(w);
        if (c && c->host != nullptr && c->device == nullptr) out[static_cast<size_t>(*kind)] = w;
    }
    return out;
}

// The first rows of w's first matrix, up to kProbeBytes, over w's host copy.
Tensor weight_slice(const Tensor& w) {
    const int64_t rows = std::clamp<int64_t>(static_cast<int64_t>(kProbeBytes / std::max<size_t>(w.nb[1], 1)), 1, w.ne[1]);
    const int64_t ne[2] = {w.ne[0], rows};
    Tensor s;
    set_shape(s, w.type, 2, ne);
    s.data = w.data;
    s.name = w.name + " (offload calibration)";
    return s;
}

// Median seconds of `be` computing `node` (after one untimed run).
StatusOr<double> time_compute(Backend& be, Tensor& node) {
    Tensor* nodes[] = {&node};
    std::vector<double> seconds;
    for (int r = 0; r <= kRepetitions; ++r) {
        const sched::Clock::time_point t0 = sched::Clock::now();
        MOE_RETURN_IF_ERROR(be.compute(nodes));
        MOE_RETURN_IF_ERROR(be.synchronize());
        if (r > 0) seconds.push_back(sched::seconds_since(t0));
    }
    return std::max(median(seconds), 1e-9);
}

// The product's operands and result over host memory or device buffers.
struct Product {
    Tensor w, x, y;
    std::vector<std::unique_ptr<Buffer>> buffers;

    explicit Product(const Tensor& slice, int tokens = kProbeTokens) : w(slice) {
        const int64_t x_ne[2] = {w.ne[0], tokens};
        set_shape(x, Type::F32, 2, x_ne);
        const int64_t y_ne[2] = {w.ne[1], tokens};
        set_shape(y, Type::F32, 2, y_ne);
        y.op = Op::MUL_MAT;
        y.src[0] = &w;
        y.src[1] = &x;
        y.name = "offload calibration product";
    }
    double weight_gb() const { return static_cast<double>(w.n_bytes()) / 1e9; }
};

// Activations of magnitude ~1, not all alike (a kernel may shortcut zeros).
std::vector<float> probe_activations(const Tensor& x) {
    std::vector<float> v(static_cast<size_t>(x.n_elements()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000.0f;
    return v;
}

// GB/s of weight bytes x tokens of the host multiplying `slice` by `tokens` tokens.
StatusOr<double> host_rate(Backend& host, const Tensor& slice, int tokens = kProbeTokens) {
    Product p(slice, tokens);
    std::vector<float> x = probe_activations(p.x);
    std::vector<float> y(static_cast<size_t>(p.y.n_elements()));
    p.x.data = x.data();
    p.y.data = y.data();
    MOE_ASSIGN_OR_RETURN(const double s, time_compute(host, p.y));
    return p.weight_gb() * tokens / s;
}

// A device buffer of t's bytes bound to t; `src`, when given, copied into it.
Status bind_device(Backend& device, Tensor& t, const void* src, std::vector<std::unique_ptr<Buffer>>& keep) {
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, device.alloc_buffer(t.n_bytes()));
    t.data = b->data();
    t.buffer = b.get();
    if (src != nullptr) MOE_RETURN_IF_ERROR(device.copy_to_device(t.data, src, t.n_bytes()));
    keep.push_back(std::move(b));
    return Status::ok();
}

// The device's rate on the same product (0 when the device does not compute it), and, when `link_gbps`
// is not known yet, the rate of uploading the slice from its host copy (a backend without a link probe).
StatusOr<double> device_rate(Backend& device, const Tensor& slice, double* link_gbps) {
    Product p(slice);
    const std::vector<float> x = probe_activations(p.x);
    MOE_RETURN_IF_ERROR(bind_device(device, p.w, nullptr, p.buffers));
    MOE_RETURN_IF_ERROR(bind_device(device, p.x, x.data(), p.buffers));
    MOE_RETURN_IF_ERROR(bind_device(device, p.y, nullptr, p.buffers));
    std::vector<double> seconds;
    for (int r = 0; r <= kRepetitions; ++r) {
        const sched::Clock::time_point t0 = sched::Clock::now();
        MOE_RETURN_IF_ERROR(device.upload(p.w.data, slice.data, p.w.n_bytes(), 0));
        MOE_RETURN_IF_ERROR(device.synchronize());
        if (r > 0) seconds.push_back(sched::seconds_since(t0));
    }
    if (*link_gbps <= 0.0) *link_gbps = p.weight_gb() / std::max(median(seconds), 1e-9);
    if (!device.supports_op(p.y)) return 0.0;
    MOE_ASSIGN_OR_RETURN(const double s, time_compute(device, p.y));
    return p.weight_gb() * kProbeTokens / s;
}

// The device factory's link probe (moe_measure_bandwidth's), once per process and device: it allocates
// and copies kLinkProbeBytes several times over, which every context need not repeat.
StatusOr<LinkBandwidth> cached_link(const BackendFactory& factory, int device) {
    static std::mutex mutex;
    static std::map<std::pair<std::string, int>, LinkBandwidth> cache;
    const std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_pair(factory.name, device);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
    BandwidthOptions o;
    o.device = device;
    o.bytes = kLinkProbeBytes;
    o.repetitions = kRepetitions;
    MOE_ASSIGN_OR_RETURN(const LinkBandwidth link, factory.measure_link(o));
    cache[key] = link;
    return link;
}

}  // namespace

bool wants_offload_calibration(const moe_context& ctx) {
    if (!ctx.device) return false;
    return ctx.backend_config.offload_calibration.value_or(ctx.params.device == MOE_DEVICE_CUDA);
}

StatusOr<sched::OffloadCalibration> measure_offload_calibration(moe_context& ctx) {
    sched::OffloadCalibration c;
    const std::array<const Tensor*, kOffloadOps> weights = probe_weights(ctx);
    if (std::all_of(weights.begin(), weights.end(), [](const Tensor* w) { return w == nullptr; })) return c;
    const BackendFactory* factory = find_backend_factory(ctx.device->name());
    if (factory != nullptr && factory->measure_link) {
        MOE_ASSIGN_OR_RETURN(const LinkBandwidth link, cached_link(*factory, ctx.device_ordinal));
        // Uploads run at the page-locked rate where the weights are locked in place (most of them, or none).
        const bool locked = 2 * ctx.weights_host_locked_bytes >= ctx.weights_host_bytes;
        c.link_gbps = locked ? link.h2d_pinned : link.h2d_pageable;
    }
    for (int i = 0; i < kOffloadOps; ++i) {
        if (weights[static_cast<size_t>(i)] == nullptr) continue;
        const Tensor slice = weight_slice(*weights[static_cast<size_t>(i)]);
        MOE_ASSIGN_OR_RETURN(c.host_gbps[i], host_rate(*ctx.host, slice));
        MOE_ASSIGN_OR_RETURN(c.device_gbps[i], device_rate(*ctx.device, slice, &c.link_gbps));
    }
    // The expert split's host cost at prompt sizes: on the up/gate weight where the model fuses them.
    for (const sched::OffloadOp op : {sched::OffloadOp::MOE_UP_GATE, sched::OffloadOp::MUL_MAT_ID}) {
        const Tensor* w = weights[static_cast<size_t>(op)];
        if (w == nullptr) continue;
        MOE_ASSIGN_OR_RETURN(c.host_prefill_gbps, host_rate(*ctx.host, weight_slice(*w), kPrefillProbeTokens));
        break;
    }
    return c;
}

}  // namespace moe
