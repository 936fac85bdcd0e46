// The several-device default on the emulated backend showing two devices (backend option
// emulated_devices=2, as a machine shows its GPUs): with no device list, tensor split or override naming
// a device, the devices are filled one after the other in order of the memory they offer. Checked
// against the layer sizes counted here from the weights (the greedy fill done independently), the
// one-device context (the same placement and statistics where the model fits one device; the same
// logits bit for bit everywhere: the same CPU kernels run on the same data), and the memory each
// device offers (a device holding another context's weights comes second).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/logits_check.h"
#include "common/multi_device_context.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "sched/device_split.h"
#include "sched/placement.h"

namespace {

using moe::test::DeviceContext;
using moe::test::DeviceSetup;
using moe::test::device_ordinals;
using moe::test::random_tokens;

// Device bytes of each layer's weights (padded to 256 as placement pads them), the token embeddings
// counted with the first layer and the output norm and head with the last: what a device holding the
// layer holds with every weight on it.
std::vector<uint64_t> layer_bytes(const moe_context& ctx) {
    const int n_layer = ctx.model->hparams.n_layer;
    std::vector<uint64_t> out(static_cast<size_t>(n_layer), 0);
    for (const moe::Tensor& t : ctx.weight_tensors) {
        if (!t.is_weight) continue;
        const int layer = moe::sched::layer_of(t.name);
        const size_t at = static_cast<size_t>(layer >= 0 ? layer : t.name == "token_embd.weight" ? 0 : n_layer - 1);
        out[at] += (t.n_bytes() + 255) / 256 * 256;
    }
    return out;
}

// The fill by hand: each layer to the current device while its layers' bytes stay within `budget`.
std::optional<std::vector<int>> reference_fill(const std::vector<uint64_t>& bytes, const std::vector<uint64_t>& budgets) {
    std::vector<int> out;
    size_t d = 0;
    uint64_t used = 0;
    for (uint64_t b : bytes) {
        while (d < budgets.size() && used + b > budgets[d]) {
            ++d;
            used = 0;
        }
        if (d == budgets.size()) return std::nullopt;
        out.push_back(static_cast<int>(d));
        used += b;
    }
    return out;
}

// The statistics that must not depend on the default: placement and every counter but the times.
void check_same_stats(const moe_sched_stats& a, const moe_sched_stats& b) {
    CHECK(a.weights_device_bytes == b.weights_device_bytes);
    CHECK(a.weights_host_bytes == b.weights_host_bytes);
    CHECK(a.n_ubatches == b.n_ubatches);
    CHECK(a.n_splits == b.n_splits);
    CHECK(a.n_ops_host == b.n_ops_host);
    CHECK(a.n_ops_device == b.n_ops_device);
    CHECK(a.bytes_activations == b.bytes_activations);
    CHECK(a.bytes_weights_full == b.bytes_weights_full);
    CHECK(a.bytes_between_devices == b.bytes_between_devices);
}

}  // namespace

TEST_CASE("fill_layers fills the devices one after the other", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    const uint32_t seed = rng();
    INFO("seed " << seed);
    rng.seed(seed);
    for (int trial = 0; trial < 300; ++trial) {
        const int n_layer = std::uniform_int_distribution<int>(1, 48)(rng);
        const int n_dev = std::uniform_int_distribution<int>(1, 4)(rng);
        std::vector<uint64_t> bytes(static_cast<size_t>(n_layer)), budgets(static_cast<size_t>(n_dev));
        for (uint64_t& b : bytes) b = std::uniform_int_distribution<uint64_t>(1, 9)(rng);
        for (uint64_t& b : budgets) b = std::uniform_int_distribution<uint64_t>(0, 5 * static_cast<uint64_t>(n_layer))(rng);
        const auto fits = [&](int d, int first, int count) {
            const uint64_t sum = std::accumulate(bytes.begin() + first, bytes.begin() + first + count, uint64_t{0});
            return sum <= budgets[static_cast<size_t>(d)];
        };
        INFO("n_layer " << n_layer << " devices " << n_dev);
        CHECK(moe::sched::fill_layers(n_layer, n_dev, fits) == reference_fill(bytes, budgets));
    }
}

TEST_CASE("the several-device default: one device while the model fits it, then the next, then experts in RAM",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 6;
    moe::test::TinyModel m("qwen3moe", "moe_default_devices", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 19, nv), random_tokens(rng, 1, nv),
                                                        random_tokens(rng, 6, nv)};
    DeviceSetup base;
    base.overrides = nullptr;
    DeviceContext reference(m.get(), base);  // one device, all on it
    const std::vector<uint64_t> bytes = layer_bytes(*reference.ctx);
    const uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
    REQUIRE(reference.stats().weights_device_bytes == total);
    std::vector<std::vector<float>> want;
    for (const auto& b : batches) want.push_back(reference.decode(b, nv));

    // Budgets: the whole model (one device), 60% of it (two, nothing in RAM), 30% (two, experts in RAM).
    for (const double share : {1.0, 0.6, 0.3}) {
        const uint64_t budget = static_cast<uint64_t>(static_cast<double>(total) * share);
        INFO("budget " << budget << " of " << total);
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.vram_budget = budget;
        DeviceContext c(m.get(), s);
        const std::optional<std::vector<int>> fill = reference_fill(bytes, {budget, budget});
        if (share == 1.0) {
            REQUIRE(fill);
            REQUIRE(*fill == std::vector<int>(6, 0));
            CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0});
            CHECK(c.ctx->parts.empty());
        } else if (fill) {
            CHECK(share == 0.6);
            CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0, 1});
            CHECK(c.ctx->layer_device == *fill);
            CHECK(c.stats().weights_host_bytes == 0);
        } else {
            CHECK(share == 0.3);
            // Both full: the layers split by the (equal) budgets, each device's experts spilling under it.
            CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0, 1});
            CHECK(c.ctx->layer_device == std::vector<int>{0, 0, 0, 1, 1, 1});
            for (int32_t d = 0; d < 2; ++d) {
                moe_sched_stats ds;
                ds.struct_size = sizeof ds;
                REQUIRE(moe_context_get_device_stats(c.ctx, d, &ds) == MOE_STATUS_OK);
                CHECK(ds.weights_host_bytes > 0);
                CHECK(ds.weights_device_bytes <= budget);
            }
        }
        for (size_t i = 0; i < batches.size(); ++i) REQUIRE(moe::test::bitwise_equal(c.decode(batches[i], nv), want[i]));
        if (share == 1.0) {
            // The one-device context it is: the same placement and counters as without the default.
            DeviceSetup one;
            one.vram_budget = budget;
            DeviceContext single(m.get(), one);
            for (const auto& b : batches) single.decode(b, nv);
            check_same_stats(c.stats(), single.stats());
        }
    }
}

TEST_CASE("the several-device default: the device offering the most first; the ways to keep to one device",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 4;
    moe::test::TinyModel m("qwen3moe", "moe_default_order", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> tokens = random_tokens(rng, 9, nv);
    DeviceSetup base;
    DeviceContext reference(m.get(), base);
    const std::vector<float> want = reference.decode(tokens, nv);
    const uint64_t total = reference.stats().weights_device_bytes;

    // Budgets per device: the second offers more, and the model fits it: the second alone.
    {
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.budgets = {total / 2, total};
        DeviceContext c(m.get(), s);
        CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{1});
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
    // Free memory (no budgets; 4 GiB cards): another context's weights on card 0 leave card 1 the freer.
    {
        DeviceSetup blocker;
        blocker.backend_options = "emulated_vram=4294967296";
        DeviceContext held(m.get(), blocker);
        REQUIRE(device_ordinals(held.ctx) == std::vector<int32_t>{0});
        DeviceSetup s;
        s.backend_options = "emulated_vram=4294967296,emulated_devices=2";
        DeviceContext c(m.get(), s);
        CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{1});
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
    // What turns the default off, on a budget the model does not fit: a device list naming one device,
    // split_mode none (GPU 0, or main_gpu), a tensor split, an override naming a device.
    const uint64_t small = total * 3 / 5;
    struct Case {
        const char* what;
        std::vector<int32_t> devices;
        int32_t split_mode;
        int32_t main_gpu;
        std::vector<float> split;
        const char* overrides;
        std::vector<int32_t> want_ordinals;
    };
    const Case cases[] = {
        {"-dev CUDA0", {0}, MOE_SPLIT_LAYER, 0, {}, nullptr, {0}},
        {"-sm none", {}, MOE_SPLIT_NONE, 0, {}, nullptr, {0}},
        {"-sm none -mg 1", {}, MOE_SPLIT_NONE, 1, {}, nullptr, {1}},
        {"-ts 1,1", {}, MOE_SPLIT_LAYER, 0, {1, 1}, nullptr, {0, 1}},
        {"-ot blk.3=CUDA1", {}, MOE_SPLIT_LAYER, 0, {}, "blk\\.3\\.=CUDA1", {0, 1}},
        // A device the split gives nothing is left out (llama.cpp's -ts 1,0): one device, not two.
        {"-ts 1,0", {}, MOE_SPLIT_LAYER, 0, {1, 0}, nullptr, {0}},
        {"-ts 0,1", {}, MOE_SPLIT_LAYER, 0, {0, 1}, nullptr, {1}},
    };
    for (const Case& k : cases) {
        INFO(k.what);
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.devices = k.devices;
        s.split_mode = k.split_mode;
        s.main_gpu = k.main_gpu;
        s.split = k.split;
        s.overrides = k.overrides;
        s.vram_budget = small;
        DeviceContext c(m.get(), s);
        CHECK(device_ordinals(c.ctx) == k.want_ordinals);
        if (k.want_ordinals.size() == 1) {
            CHECK(c.stats().weights_host_bytes > 0);  // one device: its experts spill, the other stays unused
        } else {
            // By the (equal) budgets; the pinned layer 3 on device 1 either way.
            CHECK(c.ctx->layer_device == std::vector<int>{0, 0, 1, 1});
        }
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
    // -ts 1,0 with an override naming CUDA1: the list keeps both devices (the override indexes it), the split
    // gives device 1 nothing but the pinned layer.
    {
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.split = {1, 0};
        s.overrides = "blk\\.3\\.=CUDA1";
        s.vram_budget = small;
        DeviceContext c(m.get(), s);
        CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0, 1});
        CHECK(c.ctx->layer_device == std::vector<int>{0, 0, 0, 1});
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
    // A budget even the weights other than experts do not fit on both devices: no split helps, and the
    // refusal is the one-device context's, naming the budget.
    {
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.vram_budget = total / 50;
        CHECK(moe::test::create_refused(m.get(), s) == MOE_STATUS_RESOURCE_EXHAUSTED);
        CHECK_THAT(moe_last_error(), Catch::Contains("over the VRAM budget of " + std::to_string(total / 50)) &&
                                         !Catch::Contains("placing the weights of CUDA"));
    }
    // A device that refuses to open (emulated_busy: a GPU another process holds in exclusive-process mode) is
    // left out of the default: of three, the other two share the layers; of two, the other alone. Named in a
    // device list, it is refused with the backend's reason.
    for (const auto& [devices, busy, want_ordinals] :
         {std::tuple<int, int, std::vector<int32_t>>{3, 1, {0, 2}}, {2, 0, {1}}, {3, 0, {1, 2}}}) {
        INFO(devices << " devices, device " << busy << " busy");
        DeviceSetup s;
        s.backend_options = "emulated_devices=" + std::to_string(devices) + ",emulated_busy=" + std::to_string(busy);
        s.vram_budget = small;
        DeviceContext c(m.get(), s);
        CHECK(device_ordinals(c.ctx) == want_ordinals);
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
    {
        DeviceSetup s;
        s.backend_options = "emulated_devices=2,emulated_busy=1";
        s.devices = {0, 1};
        CHECK(moe::test::create_refused(m.get(), s) == MOE_STATUS_FAILED_PRECONDITION);
        CHECK_THAT(moe_last_error(), Catch::Contains("emulated device 1 is busy"));
    }
    // One device shown (the emulated backend's default, a one-GPU machine): as ever, device 0.
    DeviceSetup one;
    DeviceContext c(m.get(), one);
    CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0});
    // A bad count is named.
    DeviceSetup bad;
    bad.backend_options = "emulated_devices=9";
    CHECK(moe::test::create_refused(m.get(), bad) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("emulated_devices"));
}

TEST_CASE("the several-device default: unequal budgets go with their devices in fill order",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 6;
    moe::test::TinyModel m("qwen3moe", "moe_default_budgets", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> tokens = random_tokens(rng, 11, nv);
    DeviceSetup base;
    DeviceContext reference(m.get(), base);
    const std::vector<float> want = reference.decode(tokens, nv);
    const std::vector<uint64_t> bytes = layer_bytes(*reference.ctx);
    const uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
    // Ordinal 1 offers more: it is filled first, then ordinal 0 under its own (smaller) budget; where
    // they do not fit, both by their budgets, each under its own.
    for (const auto& [small, large] : {std::pair{0.45, 0.7}, std::pair{0.2, 0.35}}) {
        const std::vector<uint64_t> budgets = {static_cast<uint64_t>(static_cast<double>(total) * small),
                                               static_cast<uint64_t>(static_cast<double>(total) * large)};
        INFO("budgets " << budgets[0] << ", " << budgets[1] << " of " << total);
        DeviceSetup s;
        s.backend_options = "emulated_devices=2";
        s.budgets = budgets;
        DeviceContext c(m.get(), s);
        REQUIRE(device_ordinals(c.ctx) == std::vector<int32_t>{1, 0});
        const std::optional<std::vector<int>> fill = reference_fill(bytes, {budgets[1], budgets[0]});
        REQUIRE(fill.has_value() == (small > 0.3));  // 115% of the model fits both, 55% does not
        if (fill) {
            REQUIRE(fill->front() == 0);
            REQUIRE(fill->back() == 1);
            CHECK(c.ctx->layer_device == *fill);
            CHECK(c.stats().weights_host_bytes == 0);
        }
        for (int32_t d = 0; d < 2; ++d) {
            moe_sched_stats ds;
            ds.struct_size = sizeof ds;
            REQUIRE(moe_context_get_device_stats(c.ctx, d, &ds) == MOE_STATUS_OK);
            CHECK(ds.weights_device_bytes <= budgets[d == 0 ? 1 : 0]);
            if (!fill) CHECK(ds.weights_host_bytes > 0);
        }
        REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
    }
}

TEST_CASE("the several-device default: full devices whose budget split cannot hold the weights other than experts "
          "take them as they fill the devices",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 6;
    moe::test::TinyModel m("qwen3moe", "moe_default_fixed", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> tokens = random_tokens(rng, 9, nv);
    DeviceSetup base;
    DeviceContext reference(m.get(), base);
    const std::vector<float> want = reference.decode(tokens, nv);
    // The weights no budget moves to host RAM (all but the expert tensors), per layer as layer_bytes.
    const int n_layer = 6;
    std::vector<uint64_t> fixed(n_layer, 0);
    for (const moe::Tensor& t : reference.ctx->weight_tensors) {
        if (!t.is_weight || t.name.find("_exps.") != std::string::npos) continue;
        const int layer = moe::sched::layer_of(t.name);
        fixed[static_cast<size_t>(layer >= 0 ? layer : t.name == "token_embd.weight" ? 0 : n_layer - 1)] +=
            (t.n_bytes() + 255) / 256 * 256;
    }
    // Budgets that hold the first k layers' and the rest's when filled in order (the rest's exactly, the
    // first device's just above it, as two like GPUs' free memory), while the layers dealt out by the
    // budgets' proportions (llama.cpp's rule, as with a device list) give the first device one layer more
    // than it holds.
    int k = 0;
    uint64_t first = 0, rest = 0, budget_first = 0;
    for (int c = 1; c < n_layer && k == 0; ++c) {
        first = std::accumulate(fixed.begin(), fixed.begin() + c, uint64_t{0});
        rest = std::accumulate(fixed.begin() + c, fixed.end(), uint64_t{0});
        budget_first = std::max(first, rest + 256);
        std::vector<int> in_order(static_cast<size_t>(n_layer), 1);
        std::fill(in_order.begin(), in_order.begin() + c, 0);
        if (reference_fill(fixed, {budget_first, rest}) != in_order) continue;
        const double share = static_cast<double>(budget_first) / static_cast<double>(budget_first + rest);
        int by_share = 0;
        while (by_share < n_layer && static_cast<double>(by_share) / n_layer < share) ++by_share;
        const uint64_t held = std::accumulate(fixed.begin(), fixed.begin() + by_share, uint64_t{0});
        if (held > budget_first || held < first) k = c;
    }
    REQUIRE(k > 0);
    INFO("first " << k << " layers: " << first << " bytes, the rest " << rest);
    DeviceSetup s;
    s.backend_options = "emulated_devices=2";
    s.budgets = {rest, budget_first};  // ordinal 1 offers more: filled first
    DeviceContext c(m.get(), s);
    REQUIRE(device_ordinals(c.ctx) == std::vector<int32_t>{1, 0});
    std::vector<int> want_layers(n_layer, 1);
    std::fill(want_layers.begin(), want_layers.begin() + k, 0);
    CHECK(c.ctx->layer_device == want_layers);
    for (int32_t d = 0; d < 2; ++d) {
        moe_sched_stats ds;
        ds.struct_size = sizeof ds;
        REQUIRE(moe_context_get_device_stats(c.ctx, d, &ds) == MOE_STATUS_OK);
        CHECK(ds.weights_device_bytes == (d == 0 ? first : rest));
    }
    REQUIRE(moe::test::bitwise_equal(c.decode(tokens, nv), want));
}
