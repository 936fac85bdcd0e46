// Per-device statistics (moe_context_get_n_devices / _get_device_info / _get_device_stats) on the
// emulated backend playing two devices: each device's counters are its own scheduler's (the uploads of
// its layers' host-resident experts, the bytes that crossed into or out of it), their sum over the
// devices is moe_context_get_stats' field by field (n_ubatches: the most any device ran), the placement
// figures split by device, a reset zeroes every device's, and a bad index is named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/multi_device_context.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using moe::test::DeviceSetup;
using moe::test::random_tokens;

moe_sched_stats device_stats(const moe_context* ctx, int32_t index) {
    moe_sched_stats s;
    s.struct_size = sizeof s;
    const moe_status st = moe_context_get_device_stats(ctx, index, &s);
    INFO(moe_last_error());
    REQUIRE(st == MOE_STATUS_OK);
    return s;
}

moe_device_info device_info(const moe_context* ctx, int32_t index) {
    moe_device_info d;
    d.struct_size = sizeof d;
    REQUIRE(moe_context_get_device_info(ctx, index, &d) == MOE_STATUS_OK);
    return d;
}

int32_t n_devices(const moe_context* ctx) {
    int32_t n = 0;
    REQUIRE(moe_context_get_n_devices(ctx, &n) == MOE_STATUS_OK);
    return n;
}

template <class T>
void add_to(T& acc, const T& v) {
    if constexpr (std::is_array_v<T>) {
        for (size_t i = 0; i < std::extent_v<T>; ++i) acc[i] += v[i];
    } else {
        acc += v;
    }
}

template <class T>
bool equal(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

// Every counter of `whole` against the devices' summed in device order (as the context sums them, so
// that the seconds agree exactly), n_ubatches against their most; the placement figures summed too.
void check_sum(const moe_sched_stats& whole, const std::vector<moe_sched_stats>& per) {
    moe_sched_stats sum = per[0];
    for (size_t d = 1; d < per.size(); ++d) {
#define MOE_SUM_FIELD(type, name, dims) add_to(sum.name, per[d].name);
        MOE_SCHED_STATS_COUNTERS(MOE_SUM_FIELD)
#undef MOE_SUM_FIELD
        sum.n_ubatches = std::max(sum.n_ubatches - per[d].n_ubatches, per[d].n_ubatches);
        sum.weights_host_bytes += per[d].weights_host_bytes;
        sum.weights_device_bytes += per[d].weights_device_bytes;
        sum.weights_host_pinned_bytes += per[d].weights_host_pinned_bytes;
    }
#define MOE_CHECK_FIELD(type, name, dims) \
    INFO(#name);                          \
    CHECK(equal(sum.name, whole.name));
    MOE_SCHED_STATS_COUNTERS(MOE_CHECK_FIELD)
#undef MOE_CHECK_FIELD
    CHECK(sum.weights_host_bytes == whole.weights_host_bytes);
    CHECK(sum.weights_device_bytes == whole.weights_device_bytes);
    CHECK(sum.weights_host_pinned_bytes == whole.weights_host_pinned_bytes);
    for (const moe_sched_stats& s : per) {
        CHECK(s.n_layer == whole.n_layer);
        CHECK(s.n_expert == whole.n_expert);
    }
}

}  // namespace

TEST_CASE("device stats: each device counts its own layers' uploads and crossings; the sum is the context's",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 4;
    moe::test::TinyModel m("qwen3moe", "moe_device_stats", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const uint64_t n_embd = static_cast<uint64_t>(m.info().n_embd);
    for (const std::vector<int32_t>& devices : {std::vector<int32_t>{0, 1}, std::vector<int32_t>{1, 0}}) {
        for (const std::vector<float>& split : {std::vector<float>{1, 1}, std::vector<float>{3, 1}}) {
            INFO("devices " << devices[0] << "," << devices[1] << " split " << split[0] << ":" << split[1]);
            // Experts in host RAM, uploaded whole by every offloaded op (4+ tokens), no expert cache: a
            // ubatch uploads each layer's three expert tensors once, to the device of the layer.
            DeviceSetup s;
            s.devices = devices;
            s.split = split;
            s.overrides = "exps=CPU";
            s.expert_copy = MOE_EXPERT_COPY_FULL;
            s.offload = "all=4";
            moe_sched_policy pol;
            const moe_context_params p = moe::test::device_params(s, pol);
            pol.expert_cache = 0;
            moe::test::ApiContext c(m.get(), p);
            REQUIRE(n_devices(c.ctx) == 2);
            const std::vector<int>& layer_device = c.ctx->layer_device;
            std::vector<uint64_t> want_upload(2, 0);
            std::vector<int32_t> want_layers(2, 0);
            for (int il = 0; il < 4; ++il) {
                const size_t d = static_cast<size_t>(layer_device[static_cast<size_t>(il)]);
                ++want_layers[d];
                for (const char* t : {"ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"}) {
                    want_upload[d] += m.tensor_bytes("blk." + std::to_string(il) + "." + t + ".weight");
                }
            }
            const int32_t want_d0 = split[0] == 1 ? 2 : 3;
            REQUIRE(want_layers[0] == want_d0);
            for (int32_t d = 0; d < 2; ++d) {
                const moe_device_info info = device_info(c.ctx, d);
                CHECK(info.kind == MOE_DEVICE_EMULATED);
                CHECK(info.ordinal == devices[static_cast<size_t>(d)]);
                CHECK(info.n_layers == want_layers[static_cast<size_t>(d)]);
            }

            const int n_tokens = 9;  // one ubatch (n_ubatch 16), over the offload threshold of 4
            c.decode(random_tokens(rng, n_tokens, nv), nv);
            const moe_sched_stats whole = c.stats();
            const std::vector<moe_sched_stats> per = {device_stats(c.ctx, 0), device_stats(c.ctx, 1)};
            for (size_t d = 0; d < 2; ++d) {
                INFO("device " << d);
                CHECK(per[d].n_ubatches == 1);
                CHECK(per[d].bytes_weights_full == want_upload[d]);
                CHECK(per[d].bytes_weights_experts == 0);
                // One boundary, staged: device 0 sends the residual stream out, device 1 receives it.
                CHECK(per[d].bytes_between_devices == 4 * n_embd * n_tokens);
                CHECK(per[d].weights_host_bytes > 0);
                CHECK(per[d].weights_device_bytes > 0);
                CHECK(per[d].n_ops_device > 0);
            }
            check_sum(whole, per);

            // A second prompt, then a reset: every device's counters are zeroed, placement stays.
            c.decode(random_tokens(rng, 3, nv), nv);
            check_sum(c.stats(), {device_stats(c.ctx, 0), device_stats(c.ctx, 1)});
            REQUIRE(moe_context_reset_stats(c.ctx) == MOE_STATUS_OK);
            for (int32_t d = 0; d < 2; ++d) {
                const moe_sched_stats z = device_stats(c.ctx, d);
                CHECK(z.n_ubatches == 0);
                CHECK(z.bytes_weights_full == 0);
                CHECK(z.bytes_between_devices == 0);
                CHECK(z.n_ops_device == 0);
                CHECK(z.seconds_total == 0.0);
                CHECK(z.weights_host_bytes == per[static_cast<size_t>(d)].weights_host_bytes);
                CHECK(z.weights_device_bytes == per[static_cast<size_t>(d)].weights_device_bytes);
            }
        }
    }
}

TEST_CASE("device stats: one device and CPU contexts have one device, the whole; bad indices are named",
          "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModel m("qwen3moe", "moe_device_stats_one", rng());
    const int32_t nv = m.info().n_vocab;
    for (int32_t kind : {MOE_DEVICE_EMULATED, MOE_DEVICE_CPU}) {
        INFO("device kind " << kind);
        DeviceSetup s;
        s.device = kind;
        s.overrides = "exps=CPU";
        s.offload = "all=4";
        s.devices = kind == MOE_DEVICE_EMULATED ? std::vector<int32_t>{1} : std::vector<int32_t>{};
        moe::test::DeviceContext c(m.get(), s);
        REQUIRE(n_devices(c.ctx) == 1);
        c.decode(random_tokens(rng, 7, nv), nv);
        const moe_sched_stats whole = c.stats(), d0 = device_stats(c.ctx, 0);
        CHECK(std::memcmp(&whole, &d0, sizeof whole) == 0);
        const moe_device_info info = device_info(c.ctx, 0);
        CHECK(info.kind == kind);
        CHECK(info.ordinal == (kind == MOE_DEVICE_EMULATED ? 1 : 0));
        CHECK(info.n_layers == m.info().n_layer);
        for (int32_t bad : {-1, 1}) {
            moe_sched_stats st;
            st.struct_size = sizeof st;
            CHECK(moe_context_get_device_stats(c.ctx, bad, &st) == MOE_STATUS_INVALID_ARGUMENT);
            CHECK_THAT(moe_last_error(), Catch::Contains("device_index " + std::to_string(bad)) &&
                                             Catch::Contains("1 device(s)"));
            moe_device_info di;
            di.struct_size = sizeof di;
            CHECK(moe_context_get_device_info(c.ctx, bad, &di) == MOE_STATUS_INVALID_ARGUMENT);
            CHECK_THAT(moe_last_error(), Catch::Contains("device_index " + std::to_string(bad)));
        }
        // A caller built before n_layers: the field past its struct_size is left alone.
        moe_device_info older;
        std::memset(&older, 0xab, sizeof older);
        older.struct_size = offsetof(moe_device_info, n_layers);
        REQUIRE(moe_context_get_device_info(c.ctx, 0, &older) == MOE_STATUS_OK);
        CHECK(older.struct_size == offsetof(moe_device_info, n_layers));
        CHECK(older.kind == kind);
        int32_t untouched;
        std::memset(&untouched, 0xab, sizeof untouched);
        CHECK(older.n_layers == untouched);
    }
}
