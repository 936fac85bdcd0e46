// Backend options and the offload thresholds through the public API, on the emulated device:
// - moe_context_params.backend_options: a bad entry refused naming it, the environment as the fallback
//   of a key left out and the string winning over it (emulated_vram decides whether creation fits);
// - the thresholds in moe_sched_stats: the fixed ones, from the default source, on the emulated device
//   unless calibration is asked for; an explicit min_batch reported as an override and used; with
//   offload_calibration=on, the measured figures reported and the thresholds those figures give by the
//   documented formula (computed here in float64 from the reported figures), which the scheduler then
//   offloads by.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"

namespace {

using Model = moe::test::TinyModel;

struct Created {
    moe_context* ctx = nullptr;
    moe_status status = MOE_STATUS_OK;
    std::string error;
    Created(const Model& m, const char* backend_options, const char* overrides = nullptr,
            const moe_sched_policy* policy = nullptr) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 256;
        p.n_ubatch = 256;
        p.n_threads = 2;
        p.device = MOE_DEVICE_EMULATED;
        p.tensor_overrides = overrides;
        p.policy = policy;
        p.backend_options = backend_options;
        status = moe_context_create(m.get(), &p, &ctx);
        if (status != MOE_STATUS_OK) error = moe_last_error();
    }
    ~Created() { moe_context_free(ctx); }
    moe_sched_stats stats() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
        return st;
    }
};

// Sets a variable for the scope of one test.
struct ScopedEnv {
    const char* name;
    ScopedEnv(const char* n, const std::string& v) : name(n) { REQUIRE(setenv(n, v.c_str(), 1) == 0); }
    ~ScopedEnv() { unsetenv(name); }
};

int32_t fixed_threshold(int op, const moe_model_info& info) {
    if (op == MOE_OFFLOAD_MUL_MAT) return 32;
    return 32 * info.n_expert / info.n_expert_used;
}

}  // namespace

TEST_CASE("backend_options: a bad entry fails creation naming it", "[runtime][sched]") {
    Model m("qwen3moe", "backend_opts", 3);
    for (const auto& [spec, expected] : std::vector<std::pair<const char*, const char*>>{
             {"cuda_graphs=off,bogus=1", "unknown key 'bogus'"},
             {"emulated_async=sometimes", "emulated_async takes on|off, got 'sometimes'"},
             {"emulated_vram", "'emulated_vram': expected key=value"}}) {
        const Created c(m, spec);
        INFO(spec);
        CHECK(c.status == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(c.ctx == nullptr);
        CHECK_THAT(c.error, Catch::Contains(expected));
    }
    const Created ok(m, "");  // "" is no options
    CHECK(ok.status == MOE_STATUS_OK);
}

TEST_CASE("backend_options: emulated_vram falls back to the environment and wins over it", "[runtime][sched]") {
    Model m("qwen3moe", "backend_opts_vram", 4);
    const ScopedEnv vram("MOEINFER_EMULATED_VRAM", "4096");  // far too small for any context
    {
        const Created c(m, nullptr);
        CHECK(c.status == MOE_STATUS_RESOURCE_EXHAUSTED);
    }
    {
        const Created c(m, "cuda_graphs=off");  // another key given: this one still falls back
        CHECK(c.status == MOE_STATUS_RESOURCE_EXHAUSTED);
    }
    const Created c(m, "emulated_vram=68719476736");
    INFO(c.error);
    CHECK(c.status == MOE_STATUS_OK);
    CHECK(c.stats().weights_device_bytes > 0);
}

TEST_CASE("offload thresholds: the emulated device keeps the fixed ones, reported as defaults", "[runtime][sched]") {
    Model m("qwen3moe", "thresholds_default", 5);
    const Created c(m, nullptr, "exps=CPU");
    REQUIRE(c.status == MOE_STATUS_OK);
    const moe_sched_stats st = c.stats();
    moe_sched_policy pol;
    moe_sched_policy_init(&pol);
    REQUIRE(moe_context_get_policy(c.ctx, &pol) == MOE_STATUS_OK);
    for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        CHECK(st.offload_min_batch[op] == fixed_threshold(op, m.info()));
        CHECK(st.offload_min_batch_source[op] == MOE_THRESHOLD_DEFAULT);
        CHECK(pol.offload[op].min_batch == st.offload_min_batch[op]);
        CHECK(st.offload_host_gbps[op] == 0.0);
        CHECK(st.offload_device_gbps[op] == 0.0);
    }
    CHECK(st.offload_link_gbps == 0.0);
    CHECK(st.offload_host_prefill_gbps == 0.0);
    CHECK(std::string(moe_threshold_source_name(MOE_THRESHOLD_DEFAULT)) == "default");
    CHECK(moe_threshold_source_name(7) == nullptr);
}

TEST_CASE("offload thresholds: an explicit min_batch is reported as an override", "[runtime][sched]") {
    Model m("qwen3moe", "thresholds_override", 6);
    moe_sched_policy pol;
    moe_sched_policy_init(&pol);
    pol.offload[MOE_OFFLOAD_MUL_MAT_ID].min_batch = 3;
    for (const char* options : {"", "offload_calibration=on"}) {
        const Created c(m, options, "exps=CPU", &pol);
        INFO(options << " " << c.error);
        REQUIRE(c.status == MOE_STATUS_OK);
        moe_sched_stats st = c.stats();
        CHECK(st.offload_min_batch[MOE_OFFLOAD_MUL_MAT_ID] == 3);
        CHECK(st.offload_min_batch_source[MOE_OFFLOAD_MUL_MAT_ID] == MOE_THRESHOLD_OVERRIDE);
        // Set later, it replaces what creation found; -1 gives it back.
        moe_sched_policy later = pol;
        later.offload[MOE_OFFLOAD_MOE_UP_GATE].min_batch = 9;
        later.offload[MOE_OFFLOAD_MUL_MAT_ID].min_batch = -1;
        REQUIRE(moe_context_set_policy(c.ctx, &later) == MOE_STATUS_OK);
        st = c.stats();
        CHECK(st.offload_min_batch[MOE_OFFLOAD_MOE_UP_GATE] == 9);
        CHECK(st.offload_min_batch_source[MOE_OFFLOAD_MOE_UP_GATE] == MOE_THRESHOLD_OVERRIDE);
        CHECK(st.offload_min_batch_source[MOE_OFFLOAD_MUL_MAT_ID] != MOE_THRESHOLD_OVERRIDE);
    }
}

TEST_CASE("offload thresholds: calibration on the emulated device reports its figures and the formula's thresholds",
          "[runtime][sched]") {
    Model m("qwen3moe", "thresholds_measured", 7);
    const Created c(m, "offload_calibration=on,emulated_pcie_gbps=2", "exps=CPU");
    INFO(c.error);
    REQUIRE(c.status == MOE_STATUS_OK);
    const moe_sched_stats st = c.stats();
    // The link: uploads of the emulated device take at least the time of a 2 GB/s link.
    CHECK(st.offload_link_gbps > 0.0);
    CHECK(st.offload_link_gbps <= 2.0 * 1.0001);
    // The expert weights' prompt-size rate, the expert split's first guess: measured, a plain positive rate.
    CHECK(std::isfinite(st.offload_host_prefill_gbps));
    CHECK(st.offload_host_prefill_gbps > 0.0);
    const double E = m.info().n_expert, k = m.info().n_expert_used;
    for (int op = 0; op < MOE_OFFLOAD_OP_COUNT; ++op) {
        INFO("op " << moe_offload_op_name(op));
        if (op == MOE_OFFLOAD_MUL_MAT) {
            // exps=CPU: no dense weight in host RAM, nothing to measure.
            CHECK(st.offload_min_batch_source[op] == MOE_THRESHOLD_DEFAULT);
            CHECK(st.offload_min_batch[op] == 32);
            CHECK(st.offload_host_gbps[op] == 0.0);
            continue;
        }
        REQUIRE(st.offload_min_batch_source[op] == MOE_THRESHOLD_MEASURED);
        const double H = st.offload_host_gbps[op], D = st.offload_device_gbps[op], L = st.offload_link_gbps;
        REQUIRE(H > 0.0);
        REQUIRE(D > 0.0);
        // Tokens each expert must see: (1/L) / (1/H - 1/D); a ubatch gives each expert k/E of its tokens.
        const double saved = 1.0 / H - 1.0 / D;
        const double cap = double(1 << 24);
        const double x = saved <= 0.0 ? cap : (1.0 / L) / saved * E / k;
        const double want = std::clamp(std::ceil(x), 1.0, cap);
        const double got = st.offload_min_batch[op];
        if (std::abs(x - std::round(x)) > 1e-9 * x) {
            CHECK(got == want);
        } else {
            CHECK(std::abs(got - x) <= 1.0);  // a whole number within float rounding may round either way
        }
    }
    // The scheduler offloads by them: a ubatch below the expert thresholds keeps the expert ops on the
    // host.
    const int32_t below = std::min(st.offload_min_batch[MOE_OFFLOAD_MUL_MAT_ID], st.offload_min_batch[MOE_OFFLOAD_MOE_UP_GATE]) - 1;
    if (below >= 1) {
        std::mt19937 rng(static_cast<uint32_t>(Catch::rngSeed()));
        std::vector<int32_t> tokens(static_cast<size_t>(std::min(below, 255)));
        for (int32_t& t : tokens) t = std::uniform_int_distribution<int32_t>(0, m.info().n_vocab - 1)(rng);
        REQUIRE(moe_decode(c.ctx, tokens.data(), nullptr, static_cast<int32_t>(tokens.size()), 0) == MOE_STATUS_OK);
        const moe_sched_stats after = c.stats();
        CHECK(after.n_offloaded[MOE_OFFLOAD_MUL_MAT_ID] == 0);
        CHECK(after.n_offloaded[MOE_OFFLOAD_MOE_UP_GATE] == 0);
        CHECK(after.n_kept_host[MOE_OFFLOAD_MUL_MAT_ID] > 0);
    }
}
