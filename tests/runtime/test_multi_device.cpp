// Contexts over several devices (layer split) on the emulated backend playing two devices: the layer
// split against an independent computation, every weight and KV tensor in the memory of its layer's
// device, logits equal to the one-device context's bit for bit (the same CPU kernels run on the same
// data; the residual stream only crosses through host memory), and the bytes that cross between
// devices as predicted (the residual stream, once out and once in, per stage boundary).
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/logits_check.h"
#include "common/multi_device_context.h"
#include "common/tiny_model.h"
#include "core/models/model_graph.h"
#include "core/upload_share.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "runtime/multi_device.h"
#include "runtime/stage_crossing.h"
#include "sched/device_split.h"
#include "sched/placement.h"

namespace {

using Model = moe::test::TinyModel;

using Setup = moe::test::DeviceSetup;  // emulated devices unless set otherwise
using moe::test::device_params;

struct Ctx : moe::test::DeviceContext {
    Ctx(const Model& m, const Setup& s) : DeviceContext(m.get(), s) {}
};

using moe::test::random_tokens;

// The device of each layer by exact integer arithmetic: the j-th of m unpinned layers goes to the first
// device d with j * total < m * (p_0 + ... + p_d).
std::vector<int> reference_split(int n_layer, const std::vector<int>& weights, const std::vector<int>& pinned) {
    const int total = std::accumulate(weights.begin(), weights.end(), 0);
    int m = 0;
    for (int il = 0; il < n_layer; ++il) m += pinned.empty() || pinned[static_cast<size_t>(il)] < 0 ? 1 : 0;
    std::vector<int> out;
    int j = 0;
    for (int il = 0; il < n_layer; ++il) {
        if (!pinned.empty() && pinned[static_cast<size_t>(il)] >= 0) {
            out.push_back(pinned[static_cast<size_t>(il)]);
            continue;
        }
        int d = 0, cum = weights[0];
        while (d + 1 < static_cast<int>(weights.size()) && !(j * total < m * cum)) cum += weights[static_cast<size_t>(++d)];
        out.push_back(d);
        ++j;
    }
    return out;
}

}  // namespace

TEST_CASE("split_layers deals the layers out as llama.cpp's layer split", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    const uint32_t seed = rng();
    INFO("seed " << seed);
    rng.seed(seed);
    for (int trial = 0; trial < 200; ++trial) {
        const int n_layer = std::uniform_int_distribution<int>(1, 64)(rng);
        const int n_dev = std::uniform_int_distribution<int>(1, 4)(rng);
        std::vector<int> w(static_cast<size_t>(n_dev));
        for (int& x : w) x = std::uniform_int_distribution<int>(0, 5)(rng);
        if (std::accumulate(w.begin(), w.end(), 0) == 0) w[0] = 1;
        std::vector<int> pinned;
        if (trial % 2 == 1) {
            pinned.assign(static_cast<size_t>(n_layer), -1);
            for (int& p : pinned) p = std::uniform_int_distribution<int>(0, 5)(rng) == 0 ? std::uniform_int_distribution<int>(0, n_dev - 1)(rng) : -1;
        }
        const std::vector<double> props(w.begin(), w.end());
        const moe::StatusOr<std::vector<int>> got = moe::sched::split_layers(n_layer, props, pinned);
        REQUIRE(got.is_ok());
        INFO("n_layer " << n_layer << " devices " << n_dev);
        REQUIRE(*got == reference_split(n_layer, w, pinned));
    }
    // Bad proportions are named.
    const std::vector<double> negative = {1.0, -1.0}, zero = {0.0, 0.0};
    const moe::Status neg = moe::sched::split_layers(4, negative, {}).status();
    CHECK(neg.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(neg.message().find("tensor_split[1]") != std::string::npos);
    CHECK(moe::sched::split_layers(4, zero, {}).status().code() == MOE_STATUS_INVALID_ARGUMENT);
}

TEST_CASE("tensor overrides naming a device pin layers; bad ones are named", "[sched][multi_device]") {
    const std::vector<std::string> names = {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight",
                                            "blk.1.ffn_up_exps.weight", "blk.2.attn_q.weight", "output.weight"};
    auto pins = [&](const char* spec, int n_dev) {
        auto rules = moe::sched::parse_overrides(spec);
        REQUIRE(rules.is_ok());
        return moe::sched::pinned_layers(names, *rules, 3, n_dev);
    };
    const auto p = pins("blk\\.1\\.=CUDA1,exps=CPU", 2);
    REQUIRE(p.is_ok());
    CHECK(*p == std::vector<int>{-1, 1, -1});
    // The first matching rule decides: blk.1's experts go to host RAM, its attention pins it to CUDA0.
    const auto q = pins("blk\\.1\\.ffn=CPU,blk\\.1\\.=CUDA0", 2);
    REQUIRE(q.is_ok());
    CHECK(*q == std::vector<int>{-1, 0, -1});
    const auto out_of_range = pins("blk\\.2\\.=CUDA3", 2);
    CHECK(out_of_range.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(out_of_range.status().message().find("CUDA3") != std::string::npos);
    const auto twice = pins("attn_q=CUDA0,exps=CUDA1", 2);
    CHECK(twice.status().code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(twice.status().message().find("layer 1") != std::string::npos);
    CHECK(!moe::sched::parse_overrides("exps=CUDAX").is_ok());
}

TEST_CASE("emulated:2 places each layer, its weights and its KV cache on its device", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_multi_place", rng(), [] {
        moe::test::TinyModelOptions o;
        o.n_layer = 5;
        return o;
    }());
    for (const std::vector<float>& split : {std::vector<float>{1, 1}, std::vector<float>{3, 1}, std::vector<float>{1, 4}}) {
        for (const char* ot : {static_cast<const char*>(nullptr), "exps=CPU", "blk\\.0\\.=CUDA1"}) {
            INFO("split " << split[0] << ":" << split[1] << " -ot " << (ot ? ot : "(none)"));
            Setup s;
            s.devices = {0, 1};
            s.split = split;
            s.overrides = ot;
            Ctx c(m, s);
            const moe_context& ctx = *c.ctx;
            std::vector<int> pinned(5, -1);
            if (ot != nullptr && std::string(ot).find("CUDA1") != std::string::npos) pinned[0] = 1;
            const std::vector<int> want = reference_split(5, {static_cast<int>(split[0]), static_cast<int>(split[1])}, pinned);
            REQUIRE(ctx.layer_device == want);
            const moe::Backend* backends[2] = {ctx.device.get(), ctx.parts[1].backend.get()};
            for (const moe::Tensor& t : ctx.weight_tensors) {
                if (!t.is_weight) continue;
                const int layer = moe::sched::layer_of(t.name);
                // Outside the layers: the embeddings go with the first layer, the output head with the last.
                const int dev = layer >= 0 ? want[static_cast<size_t>(layer)] : t.name == "token_embd.weight" ? want[0] : want[4];
                const std::optional<moe::sched::WeightCopies> copies = moe::weight_copies(ctx, &t);
                REQUIRE(copies);
                const bool in_ram = ot != nullptr && std::string(ot) == "exps=CPU" && moe::sched::is_expert_tensor(t.name);
                INFO(t.name);
                CHECK((copies->home == moe::sched::Side::HOST) == in_ram);
                if (!in_ram) CHECK(copies->device_buffer->backend() == backends[dev]);
                CHECK(moe::scheduler_of(ctx, static_cast<size_t>(dev)).weight_copies(&t).has_value());
            }
            for (int il = 0; il < 5; ++il) {
                CHECK(ctx.kv.k[static_cast<size_t>(il)]->buffer->backend() == backends[want[static_cast<size_t>(il)]]);
            }
        }
    }
}

TEST_CASE("emulated:2 logits equal the one-device context's bit for bit", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        moe::test::TinyModelOptions o;
        o.n_layer = 4;  // 1:1 and 3:1 both leave layers on each device
        Model m(arch, "moe_multi_logits", rng(), o);
        const int32_t nv = m.info().n_vocab;
        const int64_t n_embd = m.info().n_embd;
        const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 37, nv), random_tokens(rng, 1, nv),
                                                            random_tokens(rng, 20, nv)};
        struct Case {
            std::vector<float> split;
            const char* ot;
            int32_t copy;
            const char* offload;
        };
        const Case cases[] = {
            {{1, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr},
            {{3, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr},
            {{1, 1}, "exps=CPU", MOE_EXPERT_COPY_FULL, "all=4"},
            {{1, 1}, "exps=CPU", MOE_EXPERT_COPY_ACTIVE_ONLY, "all=4"},
            {{3, 1}, "exps=CPU", MOE_EXPERT_COPY_ACTIVE_ONLY, nullptr},
            // Layer 0 pinned to the second device: stages on devices 1, 0, 1 (two boundaries).
            {{1, 1}, "exps=CPU,blk\\.0\\.=CUDA1", MOE_EXPERT_COPY_ACTIVE_ONLY, "all=4"},
        };
        for (const Case& k : cases) {
            INFO(arch << " split " << k.split[0] << ":" << k.split[1] << " -ot " << (k.ot ? k.ot : "(none)") << " copy "
                      << k.copy << " offload " << (k.offload ? k.offload : "(default)"));
            const bool pinned = k.ot != nullptr && std::string(k.ot).find("CUDA1") != std::string::npos;
            Setup one;
            one.overrides = pinned ? "exps=CPU" : k.ot;  // the same placement on one device
            one.expert_copy = k.copy;
            one.offload = k.offload;
            Setup two = one;
            two.overrides = k.ot;
            two.devices = {0, 1};
            two.split = k.split;
            Ctx a(m, one), b(m, two);
            int64_t tokens = 0;
            for (const auto& batch : batches) {
                REQUIRE(moe::test::bitwise_equal(b.decode(batch, nv), a.decode(batch, nv)));
                tokens += static_cast<int64_t>(batch.size());
            }
            // Each boundary between consecutive layers on different devices: the residual stream
            // [n_embd, tokens] F32 out of one and into the other.
            REQUIRE(b.ctx->parts[0].n_layers > 0);
            REQUIRE(b.ctx->parts[1].n_layers > 0);
            int64_t boundaries = 0;
            for (size_t il = 1; il < b.ctx->layer_device.size(); ++il) {
                boundaries += b.ctx->layer_device[il] != b.ctx->layer_device[il - 1] ? 1 : 0;
            }
            CHECK(boundaries == (pinned ? 2 : 1));
            const moe_sched_stats sa = a.stats(), sb = b.stats();
            CHECK(sb.bytes_between_devices == static_cast<uint64_t>(boundaries * 2 * 4 * n_embd * tokens));
            CHECK(sa.bytes_between_devices == 0);
            CHECK(sb.n_ubatches == sa.n_ubatches);
            CHECK(sb.weights_device_bytes == sa.weights_device_bytes);
            CHECK(sb.weights_host_bytes == sa.weights_host_bytes);
            CHECK(sb.bytes_weights_full + sb.bytes_weights_experts == sa.bytes_weights_full + sa.bytes_weights_experts);
        }
    }
}

TEST_CASE("stage crossings: the adjacent devices, and which exports go by peer copy", "[sched][multi_device]") {
    using Pairs = std::vector<std::pair<int, int>>;
    CHECK(moe::adjacent_devices(std::vector<int>{0, 0, 1, 1}) == Pairs{{0, 1}});
    CHECK(moe::adjacent_devices(std::vector<int>{1, 0, 0, 1, 1}) == Pairs{{1, 0}, {0, 1}});
    CHECK(moe::adjacent_devices(std::vector<int>{0, 1, 0, 1, 2}) == Pairs{{0, 1}, {1, 0}, {1, 2}});
    CHECK(moe::adjacent_devices(std::vector<int>{2, 2, 2}).empty());
    // Stages on `devices`, stage i exporting x[i] and reading the exports listed in reads[i].
    moe::Tensor x[5];
    auto stages_of = [&x](const std::vector<int>& devices, const std::vector<std::vector<int>>& reads) {
        std::vector<moe::sched::Stage> st(devices.size());
        for (size_t i = 0; i < devices.size(); ++i) {
            st[i].device = devices[i];
            st[i].exports = {&x[i]};
            for (int r : reads[i]) st[i].inputs.emplace_back(nullptr, &x[r]);
        }
        return st;
    };
    const auto all = [](int, int) { return true; };
    const auto none = [](int, int) { return false; };
    using Plan = std::vector<std::vector<uint8_t>>;
    // Two devices: by peer copy only where the reader has peer access to the producer; the last
    // stage's export (the logits' input) is read by no stage.
    const auto two = stages_of({0, 1}, {{}, {0}});
    CHECK(moe::peer_crossings(two, all) == Plan{{1}, {0}});
    CHECK(moe::peer_crossings(two, none) == Plan{{0}, {0}});
    CHECK(moe::peer_crossings(two, [](int to, int from) { return to == 0 && from == 1; }) == Plan{{0}, {0}});
    // A layer pinned away: devices 1, 0, 1, each stage reading the one before.
    CHECK(moe::peer_crossings(stages_of({1, 0, 1}, {{}, {0}, {1}}), all) == Plan{{1}, {1}, {0}});
    // Read again after its device ran another stage (whose run reuses the memory holding it): staged.
    CHECK(moe::peer_crossings(stages_of({0, 1, 0, 1}, {{}, {0}, {1}, {0, 2}}), all) == Plan{{0}, {1}, {1}, {0}});
    // Read by a later stage on its own device: staged.
    CHECK(moe::peer_crossings(stages_of({0, 1, 0}, {{}, {0}, {0, 1}}), all) == Plan{{0}, {1}, {0}});
    // Several readers: by peer copy only where each of them has peer access.
    const auto three = stages_of({0, 1, 2}, {{}, {0}, {0, 1}});
    CHECK(moe::peer_crossings(three, all) == Plan{{1}, {1}, {0}});
    CHECK(moe::peer_crossings(three, [](int to, int from) { return !(to == 2 && from == 0); }) == Plan{{0}, {1}, {0}});
}

TEST_CASE("emulated:2 crossings: staged by default, by peer copy where a device reads the other's memory",
          "[sched][multi_device]") {
    // Emulated devices have no peer access, so both peer_copies=auto and =staged stage every crossing
    // through host memory (2 * n_embd * 4 bytes per token and boundary). With the peer flags set by hand
    // (what enable_peer_access gives on GPUs that reach each other), the residual stream goes from device
    // to device (Backend::copy_from_peer), counted once: bit-equal logits either way, also with the
    // asynchronous streams, where a copy made before its producer or after its reader has run gives
    // other logits.
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 4;
    Model m("qwen3moe", "moe_multi_peer", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const int64_t n_embd = m.info().n_embd;
    const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 23, nv), random_tokens(rng, 1, nv),
                                                        random_tokens(rng, 6, nv)};
    int64_t tokens = 0;
    for (const auto& b : batches) tokens += static_cast<int64_t>(b.size());
    for (const char* ot : {static_cast<const char*>(nullptr), "exps=CPU", "exps=CPU,blk\\.0\\.=CUDA1"}) {
        for (const char* async : {"emulated_async=off", "emulated_async=on"}) {
            INFO("-ot " << (ot ? ot : "(none)") << " " << async);
            const bool pinned = ot != nullptr && std::string(ot).find("CUDA1") != std::string::npos;
            const std::string staged_opts = std::string(async) + ",peer_copies=staged";
            Setup one;
            one.overrides = pinned ? "exps=CPU" : ot;
            one.offload = ot != nullptr ? "all=4" : nullptr;
            one.expert_copy = MOE_EXPERT_COPY_ACTIVE_ONLY;
            one.backend_options = async;
            Setup two = one;
            two.overrides = ot;
            two.devices = {0, 1};
            two.split = {1, 1};
            Setup staged = two;
            staged.backend_options = staged_opts;
            Ctx a(m, one), automatic(m, two), forced(m, two), st(m, staged);
            moe_context& f = *forced.ctx;
            for (const Ctx* c : {&automatic, &forced, &st}) {
                for (const moe::DevicePart& part : c->ctx->parts) {
                    CHECK(part.peer == std::vector<uint8_t>{0, 0});
                    CHECK(part.relay == std::vector<uint8_t>{0, 0});  // upload relays need peer access
                }
            }
            const auto pairs = moe::adjacent_devices(f.layer_device);
            REQUIRE(pairs.size() == (pinned ? 2u : 1u));
            for (const auto& [from, to] : pairs) f.parts[static_cast<size_t>(to)].peer[static_cast<size_t>(from)] = 1;
            for (const auto& batch : batches) {
                const std::vector<float> want = a.decode(batch, nv);
                REQUIRE(moe::test::bitwise_equal(automatic.decode(batch, nv), want));
                REQUIRE(moe::test::bitwise_equal(st.decode(batch, nv), want));
                REQUIRE(moe::test::bitwise_equal(forced.decode(batch, nv), want));
            }
            const uint64_t once = static_cast<uint64_t>(static_cast<int64_t>(pairs.size()) * 4 * n_embd * tokens);
            CHECK(automatic.stats().bytes_between_devices == 2 * once);
            CHECK(st.stats().bytes_between_devices == 2 * once);
            // All on the devices, each crossing is a peer copy; with the experts in host RAM a stage may
            // end on the host (a small batch's experts), and its result then crosses through the host.
            const uint64_t peer = forced.stats().bytes_between_devices;
            if (ot == nullptr) {
                CHECK(peer == once);
            } else {
                CHECK(peer >= once);
                CHECK(peer <= 2 * once);
            }
        }
    }
    // A bad value is named.
    Setup bad;
    bad.devices = {0, 1};
    bad.backend_options = "peer_copies=on";
    CHECK(moe::test::create_refused(m.get(), bad) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("peer_copies takes auto|staged, got 'on'"));
    bad.backend_options = "upload_relay=maybe";
    CHECK(moe::test::create_refused(m.get(), bad) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("upload_relay takes auto|on|off, got 'maybe'"));
}

TEST_CASE("emulated:2 with the expert split: each device's plan for its own layers", "[sched][multi_device]") {
    // expert_split = 2: in offloaded prompt ubatches the host computes 2 experts of every layer whose
    // experts are in host RAM, each device the rest of its layers' experts. The groups follow the
    // previous ubatch's counts, which both contexts see alike: the same logits bit for bit.
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 4;
    Model m("qwen3moe", "moe_multi_split", rng(), o);
    const int32_t nv = m.info().n_vocab;
    Setup one;
    one.overrides = "exps=CPU";
    one.offload = "all=4";
    one.expert_split = 2;
    Setup two = one;
    two.devices = {0, 1};
    two.split = {1, 1};
    Ctx a(m, one), b(m, two);
    int64_t tokens_in = 0;
    for (int n : {16, 16, 1, 9}) {
        const std::vector<int32_t> tokens = random_tokens(rng, n, nv);
        REQUIRE(moe::test::bitwise_equal(b.decode(tokens, nv), a.decode(tokens, nv)));
        tokens_in += n;
    }
    // Upload bytes are not compared: the split's look-ahead (which queues the next split layer's device
    // group early) does not cross a device boundary, and the byte counts differ with it.
    const moe_sched_stats sa = a.stats(), sb = b.stats();
    CHECK(sa.n_split_layers > 0);
    CHECK(sb.n_split_layers == sa.n_split_layers);
    CHECK(sb.n_split_host_experts == sa.n_split_host_experts);
    CHECK(sb.bytes_between_devices == static_cast<uint64_t>(2 * 4 * m.info().n_embd * tokens_in));
}

TEST_CASE("emulated:2: one ubatch and token by token agree", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_multi_tbt", rng());
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> prompt = random_tokens(rng, 12, nv);
    Setup s;
    s.devices = {0, 1};
    s.split = {1, 1};
    s.overrides = "exps=CPU";
    s.offload = "all=4";
    Ctx whole(m, s), single(m, s);
    const std::vector<float> all = whole.decode(prompt, nv);
    std::vector<float> step;
    for (size_t i = 0; i < prompt.size(); ++i) {
        const std::vector<float> row = single.decode({prompt[i]}, nv);
        step.insert(step.end(), row.begin(), row.end());
    }
    // A batch of 12 and 12 batches of one run different kernels (and offload decisions): close, not equal.
    moe::test::require_close(step, all, nv);
}

TEST_CASE("several devices: every bad value is INVALID_ARGUMENT naming it", "[sched][multi_device]") {
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_multi_bad", rng());
    auto refused = [&](Setup s, int32_t devices_n_override, const char* field) {
        moe_sched_policy pol;
        moe_context_params p = device_params(s, pol);
        if (devices_n_override >= 0) p.n_devices = devices_n_override;
        moe_context* ctx = nullptr;
        const moe_status st = moe_context_create(m.get(), &p, &ctx);
        INFO(field << ": " << moe_last_error());
        CHECK(st == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(std::string(moe_last_error()).find(field) != std::string::npos);
        CHECK(ctx == nullptr);
    };
    Setup s;
    s.devices = {0, 1};
    s.overrides = "blk\\.0\\.=CUDA3";
    refused(s, -1, "CUDA3");
    s = Setup{};
    s.devices = {0, 1};
    s.split = {1, -2};
    refused(s, -1, "tensor_split[1]");
    s.split = {1, 1, 1};
    refused(s, -1, "tensor_split");
    s = Setup{};
    s.devices = {0, 1};
    s.budgets = {1u << 30, 1u << 30, 1u << 30};
    refused(s, -1, "vram_budgets");
    s = Setup{};
    s.devices = {0, 0};
    refused(s, -1, "devices[1]");
    s.devices = {0, 99};
    refused(s, -1, "devices[1]");
    s.devices = {0, 1};
    refused(s, 0, "n_devices");
    s = Setup{};  // one device: CUDA1 does not exist
    s.overrides = "exps=CUDA1";
    refused(s, -1, "CUDA1");
}

TEST_CASE("emulated:2 decode steps: the next stage starts inside the last one's run, the next step built ahead",
          "[sched][multi_device]") {
    // A generation loop's one-token steps over two devices: each step's second stage is queued while the
    // first device computes (chained inside its run), and the next step is built, cut and planned on both
    // devices while the last stage computes (Scheduler::prepare). With the asynchronous emulated streams a
    // stage started before its input was in place, or a plan bound to memory still in use, gives other
    // logits: they must equal a one-device context's bit for bit, with peer copies forced (chaining needs
    // the crossing left on the device) and staged through the host (no chaining).
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 4;
    Model m("qwen3moe", "moe_multi_ahead", rng(), o);
    const int32_t nv = m.info().n_vocab;
    for (const char* ot : {static_cast<const char*>(nullptr), "exps=CPU"}) {
        INFO("-ot " << (ot ? ot : "(none)"));
        Setup one;
        one.overrides = ot;
        one.backend_options = "emulated_async=on";
        Setup two = one;
        two.devices = {0, 1};
        two.split = {1, 1};
        Ctx a(m, one), staged(m, two), peer(m, two);
        moe_context& f = *peer.ctx;
        for (const auto& [from, to] : moe::adjacent_devices(f.layer_device)) {
            f.parts[static_cast<size_t>(to)].peer[static_cast<size_t>(from)] = 1;
        }
        std::vector<int32_t> batch = random_tokens(rng, 21, nv);
        for (int step = 0; step < 12; ++step) {
            const std::vector<float> want = a.decode(batch, nv, false);  // the last row: a generation loop's
            REQUIRE(moe::test::bitwise_equal(staged.decode(batch, nv, false), want));
            REQUIRE(moe::test::bitwise_equal(peer.decode(batch, nv, false), want));
            batch = random_tokens(rng, 1, nv);
        }
        // The one-token steps ran plans made ahead on both devices, all but the first (plans come from the
        // cache of graph shapes, and no one-token step had run before it).
        for (const Ctx* c : {&staged, &peer}) {
            for (size_t d = 0; d < 2; ++d) CHECK(moe::scheduler_of(*c->ctx, d).stats().n_planned_ahead == 10);
        }
    }
}

TEST_CASE("emulated:2 upload relays: the one-device logits, each upload shared with the other device's link",
          "[sched][multi_device]") {
    // upload_relay=on over emulated devices (auto sets none up: they have no peer link to measure): each
    // device's expert uploads (whole matrices of 4.5 MB: FULL copies, no expert cache) go partly over the
    // other device's copy stream, as LinkShares says: the relayed bytes are its replay over the same
    // uploads, exactly. With the asynchronous streams a relayed piece copied before the compute that last
    // read its slot, or read before it arrived, gives other logits: they must be the staged context's and
    // the one-device context's bit for bit.
    std::mt19937 rng(std::random_device{}());
    moe::test::TinyModelOptions o;
    o.n_layer = 8;  // 12 uploads per device and ubatch through a ring of 6 slots: slots reused within one
    o.n_embd = 1024;
    o.n_ff_expert = 512;
    Model m("qwen3moe", "moe_multi_relay", rng(), o);
    const int32_t nv = m.info().n_vocab;
    const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 23, nv), random_tokens(rng, 1, nv),
                                                        random_tokens(rng, 6, nv)};
    for (const char* async : {"emulated_async=off", "emulated_async=on"}) {
        INFO(async);
        Setup one;
        one.overrides = "exps=CPU";
        one.offload = "all=4";
        one.expert_copy = MOE_EXPERT_COPY_FULL;
        one.expert_cache = 0;
        one.backend_options = async;
        Setup off = one, on = one, automatic = one;
        for (Setup* t : {&off, &on, &automatic}) {
            t->devices = {0, 1};
            t->split = {1, 1};
        }
        off.backend_options = std::string(async) + ",upload_relay=off";
        on.backend_options = std::string(async) + ",upload_relay=on";
        Ctx a(m, one), b(m, off), c(m, on), d(m, automatic);
        CHECK(c.ctx->parts[0].relay == std::vector<uint8_t>{0, 1});
        CHECK(c.ctx->parts[1].relay == std::vector<uint8_t>{1, 0});
        for (const Ctx* x : {&b, &d}) {
            for (const moe::DevicePart& part : x->ctx->parts) CHECK(part.relay == std::vector<uint8_t>{0, 0});
        }
        for (const auto& batch : batches) {
            const std::vector<float> want = a.decode(batch, nv);
            REQUIRE(moe::test::bitwise_equal(b.decode(batch, nv), want));
            REQUIRE(moe::test::bitwise_equal(c.decode(batch, nv), want));
        }
        // One expert matrix's bytes: every upload here is one whole (up, gate and down are the same size).
        const uint64_t matrix = moe::test::tensor_bytes_containing(m.get(), "blk.0.ffn_up_exps");
        REQUIRE(matrix > (uint64_t{1} << 20));
        for (int32_t dev = 0; dev < 2; ++dev) {
            moe_sched_stats sb{}, sc{};
            sb.struct_size = sc.struct_size = sizeof sb;
            REQUIRE(moe_context_get_device_stats(b.ctx, dev, &sb) == MOE_STATUS_OK);
            REQUIRE(moe_context_get_device_stats(c.ctx, dev, &sc) == MOE_STATUS_OK);
            const uint64_t uploaded = sc.bytes_weights_full + sc.bytes_weights_experts;
            CHECK(uploaded == sb.bytes_weights_full + sb.bytes_weights_experts);
            CHECK(sb.bytes_weights_relayed == 0);
            REQUIRE(uploaded % matrix == 0);
            moe::LinkShares shares(2);
            uint64_t predicted = 0;
            for (uint64_t k = 0; k < uploaded / matrix; ++k) {
                for (const moe::UploadPiece& p : shares.share(static_cast<size_t>(matrix))) {
                    if (p.link > 0) predicted += p.bytes;
                }
            }
            INFO("device " << dev << ": " << uploaded / matrix << " uploads");
            CHECK(predicted > 0);
            CHECK(sc.bytes_weights_relayed == predicted);
        }
    }
}
