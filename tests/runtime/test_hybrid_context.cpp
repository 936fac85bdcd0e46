// The hybrid scheduler through the public API, on tiny synthetic models of both architectures: the
// emulated device (a host-memory backend with its own buffers and copies) plays the GPU, so every
// placement and policy runs in CI. Both sides compute with the CPU kernels, so hybrid logits must equal
// CPU-only logits up to float reassociation: |hybrid - cpu| <= 1e-4 * max|cpu| per row. Byte counts are
// checked against what the router actually selected (from the activation counts).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/api_context.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using Model = moe::test::TinyModel;
using moe::test::require_close;

// A tiny Q8_0 model; skew is the synthetic router's routing skew, n_layer 0 the preset's.
moe::test::TinyModelOptions model_options(float skew = 0.0f, int32_t n_layer = 0) {
    moe::test::TinyModelOptions o;
    o.routing_skew = skew;
    o.n_layer = n_layer;
    return o;
}

// A context of device `device` (CPU or emulated), overrides and policy as given.
struct Ctx : moe::test::ApiContext {
    Ctx(const Model& m, int32_t device, const char* overrides, const moe_sched_policy* policy, int32_t n_ubatch = 16)
        : ApiContext(m.get(), params(device, overrides, policy, n_ubatch)) {}
    static moe_context_params params(int32_t device, const char* overrides, const moe_sched_policy* policy,
                                     int32_t n_ubatch) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 128;
        p.n_ubatch = n_ubatch;
        p.n_threads = 2;
        p.device = device;
        p.tensor_overrides = overrides;
        p.policy = policy;
        return p;
    }
};

using moe::test::random_tokens;

moe_sched_policy make_policy(const char* offload, int32_t expert_copy, int32_t bias_dup) {
    moe_sched_policy p;
    moe_sched_policy_init(&p);
    if (offload != nullptr) REQUIRE(moe_sched_policy_parse_offload(&p, offload) == MOE_STATUS_OK);
    p.expert_copy = expert_copy;
    p.bias_dup = bias_dup;
    p.expert_split = 0;  // exact op and byte counts below; the split has its own test
    p.expert_cache = 0;  // the upload slots alone (tests/python/test_sched_cache.py tests the cache)
    return p;
}

}  // namespace

TEST_CASE("hybrid contexts match the cpu path for every policy", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_hybrid", rng());
        const int32_t nv = m.info().n_vocab;
        // The same token stream for every configuration: prefill above and below the thresholds, then
        // single tokens (TG), over several ubatches (n_ubatch 16).
        const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 37, nv), random_tokens(rng, 3, nv),
                                                            random_tokens(rng, 1, nv), random_tokens(rng, 20, nv)};
        Ctx cpu(m, MOE_DEVICE_CPU, nullptr, nullptr);
        std::vector<std::vector<float>> want;
        for (const auto& b : batches) want.push_back(cpu.decode(b, nv));

        const char* overrides[] = {nullptr, "exps=CPU", "ffn_(up|gate|down)_exps\\.weight=CPU", "blk\\.0\\.=CPU"};
        const char* offloads[] = {nullptr, "all=4", "all=off", "mul_mat_id=0,moe_up_gate=8,mul_mat=64"};
        for (const char* ot : overrides) {
            for (const char* off : offloads) {
                for (int32_t copy : {MOE_EXPERT_COPY_FULL, MOE_EXPERT_COPY_ACTIVE_ONLY, MOE_EXPERT_COPY_ACTIVE_PREFETCH}) {
                    for (int32_t dup : {1, 0}) {
                        INFO(arch << " -ot " << (ot ? ot : "(none)") << " offload " << (off ? off : "(default)")
                                  << " copy " << copy << " bias_dup " << dup);
                        const moe_sched_policy pol = make_policy(off, copy, dup);
                        Ctx hy(m, MOE_DEVICE_EMULATED, ot, &pol);
                        for (size_t i = 0; i < batches.size(); ++i) require_close(hy.decode(batches[i], nv), want[i], nv);
                        const moe_sched_stats st = hy.stats();
                        CHECK(st.n_ubatches == 3 + 1 + 1 + 2);
                        if (ot == nullptr) {  // everything fits: nothing crosses but inputs and logits
                            CHECK(st.bytes_weights_full + st.bytes_weights_experts == 0);
                            CHECK(st.n_ops_host == 0);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("ACTIVE_ONLY uploads exactly the selected experts, coalesced", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        // Skewed routing: some experts are rarely selected.
        Model m(arch, "moe_hybrid", rng(), model_options(0.9f));
        const int32_t nv = m.info().n_vocab, n_layer = m.info().n_layer, n_expert = m.info().n_expert;
        const moe_sched_policy active = make_policy("all=0", MOE_EXPERT_COPY_ACTIVE_ONLY, 1);
        const moe_sched_policy full = make_policy("all=0", MOE_EXPERT_COPY_FULL, 1);
        const moe_sched_policy prefetch = make_policy("all=0", MOE_EXPERT_COPY_ACTIVE_PREFETCH, 1);
        Ctx a(m, MOE_DEVICE_EMULATED, "exps=CPU", &active, 64);
        Ctx f(m, MOE_DEVICE_EMULATED, "exps=CPU", &full, 64);
        Ctx pf(m, MOE_DEVICE_EMULATED, "exps=CPU", &prefetch, 64);
        std::vector<uint8_t> previous(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert), 0);
        for (int n : {1, 2, 5, 40, 3}) {
            INFO(arch << " n_tokens " << n);
            const auto tokens = random_tokens(rng, n, nv);
            REQUIRE(moe_context_reset_stats(a.ctx) == MOE_STATUS_OK);
            REQUIRE(moe_context_reset_stats(f.ctx) == MOE_STATUS_OK);
            const std::vector<float> la = a.decode(tokens, nv);
            require_close(la, f.decode(tokens, nv), nv);
            REQUIRE(moe_context_reset_stats(pf.ctx) == MOE_STATUS_OK);
            require_close(pf.decode(tokens, nv), la, nv);
            const std::vector<uint64_t> counts = a.counts();
            REQUIRE(counts.size() == static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert));
            CHECK(counts == f.counts());

            // Expected: per layer, the selected experts of up, gate and down; one copy per run.
            uint64_t expect_bytes = 0, expect_total = 0, expect_copies = 0, selections = 0, expect_prefetch = 0;
            for (int il = 0; il < n_layer; ++il) {
                uint64_t selected = 0, runs = 0;
                bool prev = false;
                for (int e = 0; e < n_expert; ++e) {
                    const bool on = counts[static_cast<size_t>(il * n_expert + e)] > 0;
                    selections += counts[static_cast<size_t>(il * n_expert + e)];
                    selected += on;
                    runs += on && !prev;
                    prev = on;
                }
                // PREFETCH uploads the previous batch's experts early, then the missing ones: the union.
                uint64_t in_union = 0;
                for (int e = 0; e < n_expert; ++e) {
                    const size_t k = static_cast<size_t>(il * n_expert + e);
                    const bool on = counts[k] > 0;
                    in_union += on || previous[k];
                    previous[k] = on;
                }
                for (const char* part : {"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"}) {
                    const uint64_t bytes = m.tensor_bytes("blk." + std::to_string(il) + "." + part);
                    expect_bytes += bytes / static_cast<uint64_t>(n_expert) * selected;
                    expect_prefetch += bytes / static_cast<uint64_t>(n_expert) * in_union;
                    expect_total += bytes;
                    expect_copies += runs;
                }
            }
            CHECK(selections == static_cast<uint64_t>(n) * static_cast<uint64_t>(m.info().n_expert_used) *
                                    static_cast<uint64_t>(n_layer));
            const moe_sched_stats sa = a.stats(), sf = f.stats();
            CHECK(sa.bytes_weights_experts == expect_bytes);
            CHECK(sa.bytes_weights_experts + sa.bytes_weights_skipped == expect_total);
            CHECK(sa.n_id_readbacks == static_cast<uint64_t>(n_layer));  // gate, up and down share one
            CHECK(sf.bytes_weights_full == expect_total);                // biases are duplicated: no bias uploads
            CHECK(sa.bytes_weights_full == 0);
            CHECK(sa.n_weight_copies == expect_copies);
            CHECK(sa.n_offloaded[MOE_OFFLOAD_MOE_UP_GATE] == static_cast<uint64_t>(n_layer));
            CHECK(sa.n_offloaded[MOE_OFFLOAD_MUL_MAT_ID] == static_cast<uint64_t>(n_layer));
            const moe_sched_stats sp = pf.stats();
            CHECK(sp.bytes_weights_experts == expect_prefetch);
            CHECK(sp.bytes_weights_experts + sp.bytes_weights_skipped == expect_total);
            CHECK(sp.n_id_readbacks == static_cast<uint64_t>(n_layer));
            CHECK(pf.counts() == counts);
        }
    }
}

TEST_CASE("bias duplication keeps expert biases on both sides", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    Model m("gpt-oss", "moe_hybrid", rng());
    const int32_t nv = m.info().n_vocab;
    // Expert weights on the host, biases on the device (seed PR 829's second command line).
    const char* ot = "ffn_(up|gate|down)_exps\\.weight=CPU";
    const moe_sched_policy dup = make_policy("all=off", MOE_EXPERT_COPY_FULL, 1);
    const moe_sched_policy nodup = make_policy("all=off", MOE_EXPERT_COPY_FULL, 0);
    Ctx with(m, MOE_DEVICE_EMULATED, ot, &dup);
    Ctx without(m, MOE_DEVICE_EMULATED, ot, &nodup);
    int32_t loc = -1, dupd = -1;
    REQUIRE(moe_context_tensor_location(with.ctx, "blk.0.ffn_up_exps.bias", &loc, &dupd) == MOE_STATUS_OK);
    CHECK(loc == MOE_LOCATION_DEVICE);
    CHECK(dupd == 1);
    REQUIRE(moe_context_tensor_location(without.ctx, "blk.0.ffn_up_exps.bias", &loc, &dupd) == MOE_STATUS_OK);
    CHECK(dupd == 0);
    REQUIRE(moe_context_tensor_location(with.ctx, "blk.0.ffn_up_exps.weight", &loc, &dupd) == MOE_STATUS_OK);
    CHECK(loc == MOE_LOCATION_HOST);
    CHECK(moe_context_tensor_location(with.ctx, "no.such.tensor", &loc, nullptr) == MOE_STATUS_NOT_FOUND);

    // TG with the experts on the host: the up/gate biases are read on the host. Without duplication
    // they cross PCIe every token (down's bias is gathered on the device, where it lives).
    const auto tokens = random_tokens(rng, 1, nv);
    require_close(with.decode(tokens, nv), without.decode(tokens, nv), nv);
    uint64_t bias_bytes = 0;
    for (int il = 0; il < m.info().n_layer; ++il) {
        for (const char* b : {"ffn_up_exps.bias", "ffn_gate_exps.bias"}) bias_bytes += m.tensor_bytes("blk." + std::to_string(il) + "." + b);
    }
    CHECK(with.stats().bytes_weights_full == 0);
    CHECK(without.stats().bytes_weights_full == bias_bytes);

    // PP with everything offloaded and biases on the host (-ot exps=CPU): duplicates avoid the uploads.
    const moe_sched_policy dup_pp = make_policy("all=0", MOE_EXPERT_COPY_FULL, 1);
    const moe_sched_policy nodup_pp = make_policy("all=0", MOE_EXPERT_COPY_FULL, 0);
    Ctx pw(m, MOE_DEVICE_EMULATED, "exps=CPU", &dup_pp);
    Ctx pwo(m, MOE_DEVICE_EMULATED, "exps=CPU", &nodup_pp);
    const auto prompt = random_tokens(rng, 12, nv);
    require_close(pw.decode(prompt, nv), pwo.decode(prompt, nv), nv);
    CHECK(pwo.stats().bytes_weights_full - pw.stats().bytes_weights_full == bias_bytes);
}

TEST_CASE("bad placement and policy values are rejected with clear errors", "[sched]") {
    Model m("qwen3moe", "moe_hybrid", 7);
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.device = MOE_DEVICE_EMULATED;
    moe_context* ctx = nullptr;

    p.tensor_overrides = "exps=TPU";
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("unknown backend 'TPU'") != std::string::npos);
    p.tensor_overrides = "ffn_(=CPU";
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("invalid regex") != std::string::npos);
    p.tensor_overrides = nullptr;
    p.n_cpu_moe = -1;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    p.n_cpu_moe = 0;
    p.n_gpu_layers = -2;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    p.n_gpu_layers = -1;
    p.vram_budget = 1000;  // not even the embeddings fit
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_RESOURCE_EXHAUSTED);
    CHECK(std::string(moe_last_error()).find("VRAM budget") != std::string::npos);
    p.vram_budget = 0;

    moe_sched_policy pol;
    moe_sched_policy_init(&pol);
    pol.offload[MOE_OFFLOAD_MUL_MAT].min_batch = -5;
    p.policy = &pol;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("mul_mat min_batch") != std::string::npos);
    moe_sched_policy_init(&pol);
    pol.expert_copy = 9;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    moe_sched_policy_init(&pol);
    CHECK(pol.expert_split == MOE_EXPERT_SPLIT_AUTO);
    pol.expert_split = -2;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("expert_split"));
    moe_sched_policy_init(&pol);
    CHECK(pol.expert_copy == MOE_EXPERT_COPY_AUTO);
    CHECK(pol.expert_cache == MOE_EXPERT_CACHE_AUTO);
    pol.expert_cache = -2;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("expert_cache"));
    moe_sched_policy_init(&pol);
    pol.offload_vram_budget = 100;  // far below four slots of an expert tensor
    p.tensor_overrides = "exps=CPU";
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("upload slots") != std::string::npos);
    moe_sched_policy_init(&pol);
    pol.expert_cache = 100;  // below one expert matrix
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK_THAT(moe_last_error(), Catch::Contains("expert_cache of 100 bytes"));
    CHECK(ctx == nullptr);

    CHECK(moe_sched_policy_parse_offload(&pol, "moe_up_gate=-3") == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe_sched_policy_parse_offload(&pol, "bogus=3") == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("unknown op 'bogus'") != std::string::npos);

    // A valid context: get_policy resolves the default thresholds; set_policy validates.
    moe_sched_policy_init(&pol);
    p.policy = &pol;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    moe_sched_policy got;
    moe_sched_policy_init(&got);
    REQUIRE(moe_context_get_policy(ctx, &got) == MOE_STATUS_OK);
    CHECK(got.offload[MOE_OFFLOAD_MUL_MAT].min_batch == 32);
    CHECK(got.offload[MOE_OFFLOAD_MUL_MAT_ID].min_batch == 32 * m.info().n_expert / m.info().n_expert_used);
    pol.offload[MOE_OFFLOAD_MOE_UP_GATE].min_batch = -7;
    CHECK(moe_context_set_policy(ctx, &pol) == MOE_STATUS_INVALID_ARGUMENT);
    moe_context_free(ctx);
}

TEST_CASE("the default placement spills experts to host RAM when VRAM is short", "[sched]") {
    Model m("qwen3moe", "moe_hybrid", 11);
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.device = MOE_DEVICE_EMULATED;
    p.vram_budget = 0;
    // Everything fits in an explicit budget of all the weights; a smaller one spills expert tensors.
    uint64_t total = 0, experts = 0;
    for (int32_t i = 0; i < m.info().n_tensors; ++i) {
        moe_tensor_info ti;
        moe_tensor_info_init(&ti);
        REQUIRE(moe_model_get_tensor(m.get(), i, &ti) == MOE_STATUS_OK);
        const uint64_t n = (ti.n_bytes + 255) / 256 * 256;
        total += n;
        if (std::string(ti.name).find("_exps.") != std::string::npos) experts += n;
    }
    p.vram_budget = total;
    moe_context* ctx = nullptr;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    moe_sched_stats st;
    st.struct_size = sizeof st;
    REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
    CHECK(st.weights_host_bytes == 0);
    moe_context_free(ctx);
    p.vram_budget = total - experts / 2;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
    CHECK(st.weights_host_bytes >= experts / 2);
    CHECK(st.weights_device_bytes <= p.vram_budget);
    int32_t loc = -1;
    REQUIRE(moe_context_tensor_location(ctx, "blk.0.attn_q.weight", &loc, nullptr) == MOE_STATUS_OK);
    CHECK(loc == MOE_LOCATION_DEVICE);
    moe_context_free(ctx);
}

// A model that fits the device whole never splits, so the automatic split must not make the default
// placement reserve its larger activations: at the smallest emulated VRAM where the split-off policy
// keeps every weight on the device, the default (automatic split) does too. Below it, where experts
// spill, the automatic split reserves at least as much as off (two more upload slots, the split's
// activations): never fewer weight bytes in RAM, and more at some VRAM.
TEST_CASE("the default placement reserves the split's activations only when experts spill", "[sched]") {
    // 16 layers: expert bytes well above the slots' reserve.
    Model m("qwen3moe", "moe_hybrid", 12, model_options(0.0f, 16));
    constexpr uint64_t kFailed = UINT64_MAX;
    auto host_bytes = [&](uint64_t vram, int32_t split) {
        const std::string v = std::to_string(vram);
        REQUIRE(setenv("MOEINFER_EMULATED_VRAM", v.c_str(), 1) == 0);
        moe_sched_policy pol;
        moe_sched_policy_init(&pol);
        pol.expert_split = split;
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 64;
        p.device = MOE_DEVICE_EMULATED;
        p.policy = &pol;
        moe_context* ctx = nullptr;
        const moe_status s = moe_context_create(m.get(), &p, &ctx);
        unsetenv("MOEINFER_EMULATED_VRAM");
        if (s != MOE_STATUS_OK) return kFailed;  // too small for the dense weights, KV cache and reserve
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
        moe_context_free(ctx);
        return st.weights_host_bytes;
    };
    uint64_t lo = 0, hi = uint64_t{2} << 30;  // the 1 GiB reserve plus a tiny model's needs
    REQUIRE(host_bytes(hi, 0) == 0);
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        (host_bytes(mid, 0) == 0 ? hi : lo) = mid;
    }
    CHECK(host_bytes(hi, MOE_EXPERT_SPLIT_AUTO) == 0);
    int spilled = 0, auto_more = 0;
    const uint64_t step = 4096;
    for (uint64_t below = step; below <= 64 * step; below += step) {
        const uint64_t off = host_bytes(hi - below, 0);
        const uint64_t automatic = host_bytes(hi - below, MOE_EXPERT_SPLIT_AUTO);
        INFO("VRAM " << hi - below << ": in RAM with the split off " << off << ", automatic " << automatic);
        CHECK(off > 0);
        CHECK(automatic >= off);
        spilled += off != kFailed;
        auto_more += automatic != kFailed && automatic > off;  // a real spill, not a failed context
    }
    CHECK(spilled > 0);
    CHECK(auto_more > 0);
}

// The automatic split end to end (the default policy): uploads over an emulated 0.5 MB/s link make
// every layer worth splitting for the cost model by far (also on the asynchronous emulation, whose
// random task delays make its serial cost ~3 ms per layer, and on a CPU busy with other tests, which
// inflates the learned host costs: at 5 MB/s the model stopped proposing the split in 1 of 8 runs next
// to 3 busy loops, and the sequence below broke), so each ubatch size is timed unsplit, split,
// split, unsplit (n_split_trials and n_split_layers show which ran), then keeps one verdict, which other
// sizes of its power-of-two range borrow; a size in another range starts its own trial. Logits equal the
// CPU path's throughout.
TEST_CASE("the automatic split times each ubatch size both ways, then keeps one", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_hybrid", rng());
        const int32_t nv = m.info().n_vocab;
        const uint64_t n_layer = static_cast<uint64_t>(m.info().n_layer);
        moe_sched_policy pol;
        moe_sched_policy_init(&pol);
        REQUIRE(pol.expert_split == MOE_EXPERT_SPLIT_AUTO);
        REQUIRE(moe_sched_policy_parse_offload(&pol, "all=4") == MOE_STATUS_OK);
        REQUIRE(setenv("MOEINFER_EMULATED_PCIE_GBPS", "0.0005", 1) == 0);
        Ctx hy(m, MOE_DEVICE_EMULATED, "exps=CPU", &pol, 32);
        unsetenv("MOEINFER_EMULATED_PCIE_GBPS");
        Ctx cpu(m, MOE_DEVICE_CPU, nullptr, nullptr, 32);
        moe_sched_stats last = hy.stats();
        // Decodes n tokens from an empty cache on both contexts; returns the layers split and the trial
        // ubatches it added.
        auto step = [&](int n) {
            REQUIRE(moe_kv_clear(hy.ctx) == MOE_STATUS_OK);
            REQUIRE(moe_kv_clear(cpu.ctx) == MOE_STATUS_OK);
            const std::vector<int32_t> tokens = random_tokens(rng, n, nv);
            require_close(hy.decode(tokens, nv), cpu.decode(tokens, nv), nv);
            const moe_sched_stats st = hy.stats();
            const std::pair<uint64_t, uint64_t> added{st.n_split_layers - last.n_split_layers,
                                                      st.n_split_trials - last.n_split_trials};
            last = st;
            UNSCOPED_INFO(n << " tokens: " << added.first << " layers split, " << added.second << " trial ubatches");
            return added;
        };
        INFO(arch);
        using Added = std::pair<uint64_t, uint64_t>;
        // The trial: timed ubatches (unsplit, split, split, unsplit; a ubatch that allocated arenas is
        // timed again), until none is timed.
        std::vector<Added> trial;
        Added after{0, 1};
        while (trial.size() < 12 && (after = step(24)).second == 1) trial.push_back(after);
        REQUIRE(trial.size() >= 4);
        CHECK(trial.size() <= 8);
        CHECK(trial.front() == Added{0, 1});
        const auto unsplit = std::count(trial.begin(), trial.end(), Added{0, 1});
        const auto split = std::count(trial.begin(), trial.end(), Added{n_layer, 1});
        CHECK(unsplit >= 2);
        CHECK(split >= 2);
        CHECK(unsplit + split == static_cast<std::ptrdiff_t>(trial.size()));
        const Added verdict = after;  // decided: no more trials
        CHECK(verdict.second == 0);
        CHECK((verdict.first == 0 || verdict.first == n_layer));
        CHECK(step(24) == verdict);
        CHECK(step(20) == verdict);  // borrowed from 24 (same range 16..31), not timed
        CHECK(step(9) == Added{0, 1});  // range 8..15: a trial of its own, unsplit first
    }
}

namespace {
struct ProgressLog {
    int calls = 0;
    float last = -1.0f;
    bool monotonic = true;
    int cancel_at = -1;  // call index that returns 0
};
int log_progress(float f, void* user) {
    auto* log = static_cast<ProgressLog*>(user);
    if (f < log->last) log->monotonic = false;
    log->last = f;
    return log->calls++ == log->cancel_at ? 0 : 1;
}
}  // namespace

TEST_CASE("context creation reports progress and can be cancelled", "[sched]") {
    Model m("gpt-oss", "moe_hybrid", 5);
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.device = MOE_DEVICE_EMULATED;
    p.tensor_overrides = "exps=CPU";
    ProgressLog log;
    p.progress = log_progress;
    p.progress_user_data = &log;
    moe_context* ctx = nullptr;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    CHECK(log.calls > 1);
    CHECK(log.monotonic);
    CHECK(log.last == Approx(1.0f));
    moe_context_free(ctx);
    ctx = nullptr;

    ProgressLog cancel;
    cancel.cancel_at = 2;
    p.progress_user_data = &cancel;
    CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_CANCELLED);
    CHECK(ctx == nullptr);
    CHECK(cancel.calls == 3);
}

TEST_CASE("expert split: the host and device parts add up to the cpu path", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_hybrid", rng());
        const int32_t nv = m.info().n_vocab, n_layer = m.info().n_layer, n_expert = m.info().n_expert;
        const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 37, nv), random_tokens(rng, 3, nv),
                                                            random_tokens(rng, 1, nv), random_tokens(rng, 20, nv)};
        Ctx cpu(m, MOE_DEVICE_CPU, nullptr, nullptr);
        std::vector<std::vector<float>> want;
        for (const auto& b : batches) want.push_back(cpu.decode(b, nv));
        // Per layer, bytes of one expert of up, gate and down.
        uint64_t per_expert = 0;
        for (const char* part : {"ffn_up_exps.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight"}) {
            per_expert += m.tensor_bytes(std::string("blk.0.") + part) / static_cast<uint64_t>(n_expert);
        }
        // "blk\.": every weight of every layer in RAM, so offloaded dense products and (without bias
        // duplication) biases take upload slots between the split's look-ahead uploads and their nodes.
        for (const char* ot : {"exps=CPU", "ffn_(up|gate|down)_exps\\.weight=CPU", "blk\\.=CPU"}) {
            for (int32_t copy : {MOE_EXPERT_COPY_FULL, MOE_EXPERT_COPY_ACTIVE_ONLY, MOE_EXPERT_COPY_ACTIVE_PREFETCH}) {
                for (int32_t dup : {1, 0}) {
                    for (int32_t split : {1, n_expert / 2, n_expert - 1, n_expert + 5, MOE_EXPERT_SPLIT_AUTO}) {
                        INFO(arch << " -ot " << ot << " copy " << copy << " bias_dup " << dup << " split " << split);
                        moe_sched_policy pol = make_policy("all=4", copy, dup);
                        pol.expert_split = split;
                        Ctx hy(m, MOE_DEVICE_EMULATED, ot, &pol);
                        for (size_t i = 0; i < batches.size(); ++i) require_close(hy.decode(batches[i], nv), want[i], nv);
                        CHECK(hy.counts() == cpu.counts());
                        const moe_sched_stats st = hy.stats();
                        if (split == MOE_EXPERT_SPLIT_AUTO) {
                            // Whatever the measured costs pick: all layers of a ubatch or none (every
                            // layer's experts are in RAM here), each split layer with 1 .. n_expert-1 on
                            // the host.
                            CHECK(st.n_split_layers % static_cast<uint64_t>(n_layer) == 0);
                            CHECK(st.n_split_host_experts >= st.n_split_layers);
                            CHECK(st.n_split_host_experts <= st.n_split_layers * static_cast<uint64_t>(n_expert - 1));
                            continue;
                        }
                        // Ubatches of >= 4 tokens offload (16, 16, 5 and 16, 4 of the 37 + 20 tokens): all split.
                        const uint64_t layers = 5 * static_cast<uint64_t>(n_layer);
                        const uint64_t on_host = static_cast<uint64_t>(std::min(split, n_expert - 1));
                        CHECK(st.n_split_layers == layers);
                        CHECK(st.n_split_host_experts == layers * on_host);
                        CHECK(st.n_offloaded[MOE_OFFLOAD_MUL_MAT_ID] == layers);
                        const uint64_t group = layers * (static_cast<uint64_t>(n_expert) - on_host) * per_expert;
                        CHECK(st.bytes_weights_experts + st.bytes_weights_skipped == layers * n_expert * per_expert);
                        if (copy == MOE_EXPERT_COPY_FULL) {
                            // The device part uploads its whole group; nothing waits for the router.
                            CHECK(st.bytes_weights_experts == group);
                            CHECK(st.n_id_readbacks == 0);
                        } else {
                            // ACTIVE copies: only the group's selected experts (exactly: test_sched_cache.py),
                            // after one readback of the part's ids per split layer.
                            CHECK(st.bytes_weights_experts <= group);
                            CHECK(st.n_id_readbacks == layers);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("decode steps built ahead give bitwise the logits of steps built on the call", "[sched]") {
    // While the device computes a step, the host builds and plans the one-token step after it
    // (runtime/context.cpp); a call asking for anything else builds its own. Pass 1 decodes one token
    // at a time (each step after the first was built ahead), pass 2 the same tokens asking for all rows'
    // logits, a step never built ahead; a rewind and a prompt in between must not take the stale step.
    std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
    const Model m("qwen3moe", "moe_build_ahead", rng(), model_options());
    const int32_t n_vocab = m.info().n_vocab;
    Ctx c(m, MOE_DEVICE_EMULATED, nullptr, nullptr);
    const std::vector<int32_t> prompt = random_tokens(rng, 5, n_vocab);
    const std::vector<int32_t> gen = random_tokens(rng, 8, n_vocab);
    const auto logits_row = [&] {
        const float* l = nullptr;
        int32_t rows = 0, nv = 0;
        REQUIRE(moe_get_logits(c.ctx, &l, &rows, &nv) == MOE_STATUS_OK);
        return std::vector<float>(l + static_cast<size_t>(rows - 1) * nv, l + static_cast<size_t>(rows) * nv);
    };
    const auto run_pass = [&](int32_t logits_all) {
        REQUIRE(moe_kv_clear(c.ctx) == MOE_STATUS_OK);
        REQUIRE(moe_decode(c.ctx, prompt.data(), nullptr, static_cast<int32_t>(prompt.size()), 0) == MOE_STATUS_OK);
        std::vector<std::vector<float>> out;
        for (int32_t t : gen) {
            INFO(moe_last_error());
            REQUIRE(moe_decode(c.ctx, &t, nullptr, 1, logits_all) == MOE_STATUS_OK);
            out.push_back(logits_row());
        }
        return out;
    };
    const moe::sched::Stats& st = c.ctx->sched->stats();
    const uint64_t before = st.n_planned_ahead;
    const auto ahead = run_pass(0);
    const uint64_t planned = st.n_planned_ahead - before;
    const auto fresh = run_pass(1);
    // Every step after the prompt was built ahead; the first could not be planned ahead (plans come from
    // the cache of graph shapes, and no one-token step had run yet).
    CHECK(planned == gen.size() - 1);
    CHECK(st.n_planned_ahead - before == planned);
    for (size_t i = 0; i < gen.size(); ++i) {
        INFO("step " << i);
        CHECK(ahead[i] == fresh[i]);
    }
    // A rewind to an earlier position while a step is built ahead for the end: the call's own step.
    const int32_t pos = 2;
    REQUIRE(moe_decode(c.ctx, gen.data(), &pos, 1, 0) == MOE_STATUS_OK);
    const auto rewound = logits_row();
    REQUIRE(moe_kv_clear(c.ctx) == MOE_STATUS_OK);
    REQUIRE(moe_decode(c.ctx, prompt.data(), nullptr, 2, 0) == MOE_STATUS_OK);
    REQUIRE(moe_decode(c.ctx, gen.data(), nullptr, 1, 1) == MOE_STATUS_OK);
    CHECK(logits_row() == rewound);
}

// The automatic split's first guess of its host cost comes from the host's measured rate at prompt sizes
// (offload_host_prefill_gbps, backend option offload_calibration=on), not the fixed 1 TFLOP/s guess. Over
// an emulated link set between what the two guesses make worth splitting (g = how much slower the
// measured host is than the fixed guess: ~20 with one thread on the 2-core build machine; the test skips
// visibly below 4), the calibrated context proposes no split (no trial ubatch), while the same link without calibration
// proposes one (trials run). With the fixed guess alone the first two checks fail.
TEST_CASE("the automatic split's first host cost is the measured prompt-size rate", "[sched]") {
    // Its contexts run the synchronous emulation whatever MOEINFER_EMULATED_ASYNC says (below), so the
    // asynchronous rerun of [sched] (ctest sched.async_emulated) would only run it again, beside
    // python.pytest: its timing failed there twice under that load on a 2-core machine.
    if (const char* a = std::getenv("MOEINFER_EMULATED_ASYNC"); a != nullptr && std::string(a) != "0") {
        WARN("skipped: the plain [sched] run covers this case (it always runs the synchronous emulation)");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    // Wide experts (2 MiB per matrix): the link is timed by uploading one, and the emulated link's sleep
    // has ~0.1 ms of slack, which would make the tiny preset's 34 KiB uploads look 5x slower than asked.
    moe::test::TinyModelOptions wide;
    wide.n_ff_expert = 4096;
    Model m("qwen3moe", "split_first_guess", rng(), wide);
    const moe_model_info info = m.info();
    const double E = info.n_expert, k = info.n_expert_used;
    const double expert_bytes = static_cast<double>(info.n_expert_bytes) / (info.n_layer * E);
    const double pair_flops = 2.0 * 3.0 * info.n_embd * info.n_ff_expert;  // up, gate, down
    // Many tokens per expert, so that the link between the two guesses is slow enough for the emulated
    // device to keep (a slower measured link than asked would make the split look better than it is), and
    // the synchronous emulation whatever MOEINFER_EMULATED_ASYNC says: the asynchronous one's random task
    // delays slow its measured link by more than the margin.
    const int32_t n = 1024;
    moe_sched_policy pol;
    moe_sched_policy_init(&pol);
    REQUIRE(pol.expert_split == MOE_EXPERT_SPLIT_AUTO);
    REQUIRE(moe_sched_policy_parse_offload(&pol, "all=4") == MOE_STATUS_OK);  // both contexts offload alike
    auto params = [&](const char* options) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 2 * n;
        p.n_ubatch = n;
        p.n_threads = 1;  // a slow host: the two guesses far apart (g ~ 20 on the build machine)
        p.device = MOE_DEVICE_EMULATED;
        p.tensor_overrides = "exps=CPU";
        p.policy = &pol;
        p.backend_options = options;
        return p;
    };
    auto run = [&](const std::string& options) {  // two prompts; the context's stats
        moe::test::ApiContext c(m.get(), params(options.c_str()));
        for (int i = 0; i < 2; ++i) {
            REQUIRE(moe_kv_clear(c.ctx) == MOE_STATUS_OK);
            c.decode(random_tokens(rng, n, info.n_vocab), info.n_vocab, false);
        }
        return c.stats();
    };
    // The calibrated context measures the host again at its creation: the link is set from a probe's
    // figure, so an attempt counts only where the two agree within 2x (a machine whose load changed in
    // between is asked again).
    for (int attempt = 0; attempt < 3; ++attempt) {
        double host_gbps = 0.0;
        {
            const moe::test::ApiContext probe(m.get(), params("emulated_async=off,offload_calibration=on"));
            host_gbps = probe.stats().offload_host_prefill_gbps;
        }
        REQUIRE(host_gbps > 0.0);
        const double measured_s = expert_bytes / (host_gbps * 1e9), fixed_s = pair_flops / 1e12;  // per pair
        const double g = measured_s / fixed_s;
        if (g < 4.0) {
            WARN("skipped: this host's measured rate (" << host_gbps << " GB/s x tokens) is too close to the "
                 "fixed 1 TFLOP/s guess to tell the two apart");
            return;
        }
        // No split iff one expert's pairs on the host already take 95% of the whole layer's upload:
        // (n k / E) * per_pair >= 0.95 * E * bytes / L, i.e. from L = 0.95 E^2 bytes / (n k per_pair).
        const double link_measured = 0.95 * E * E * expert_bytes / (n * k * measured_s);
        // Closer to the fixed guess's bound (a factor g^0.3 below it) than to the measured one (g^0.7
        // above): on a busy machine the emulated copies run slower than asked, which only the calibrated
        // side minds.
        const double link = link_measured * std::pow(g, 0.7);
        const std::string gbps = std::to_string(link / 1e9);
        const moe_sched_stats calibrated = run("emulated_async=off,offload_calibration=on,emulated_pcie_gbps=" + gbps);
        INFO("host " << host_gbps << " GB/s x tokens (" << g << "x slower than the fixed guess), then "
                     << calibrated.offload_host_prefill_gbps << "; link " << gbps << " GB/s (the context's calibration "
                     << "measured " << calibrated.offload_link_gbps << ")");
        if (calibrated.offload_host_prefill_gbps > 2.0 * host_gbps) continue;
        CHECK(calibrated.n_split_trials == 0);
        CHECK(calibrated.n_split_layers == 0);
        const moe_sched_stats fixed = run("emulated_async=off,offload_calibration=off,emulated_pcie_gbps=" + gbps);
        CHECK(fixed.n_split_trials > 0);
        return;
    }
    WARN("skipped: the host's measured rate moved by more than 2x in each of 3 attempts");
}
