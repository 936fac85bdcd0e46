// Contexts over one or several devices (emulated or CUDA) for the layer-split tests
// (tests/runtime/test_multi_device*.cpp): the params of a setup, and the context made from them.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/api_context.h"
#include "moeinfer/moeinfer.h"

namespace moe::test {

struct DeviceSetup {
    int32_t device = MOE_DEVICE_EMULATED;
    std::vector<int32_t> devices;  // empty: one device, the backend's first
    std::vector<float> split;
    std::vector<uint64_t> budgets;
    uint64_t vram_budget = 0;  // every device's, where budgets has no entry (0: the default)
    const char* overrides = nullptr;
    int32_t split_mode = MOE_SPLIT_LAYER;
    int32_t main_gpu = 0;
    int32_t expert_copy = MOE_EXPERT_COPY_AUTO;
    const char* offload = nullptr;
    int32_t n_ubatch = 16;
    int32_t expert_split = 0;  // the same nodes on the same sides in the contexts compared
    int64_t expert_cache = MOE_EXPERT_CACHE_AUTO;
    std::string backend_options;
};

// The params of a context for `s`; its policy is filled into `pol`, which they point to. REQUIRES: s
// outlives the params.
inline moe_context_params device_params(const DeviceSetup& s, moe_sched_policy& pol) {
    moe_sched_policy_init(&pol);
    pol.expert_copy = s.expert_copy;
    pol.expert_split = s.expert_split;
    pol.expert_cache = s.expert_cache;
    if (s.offload != nullptr) REQUIRE(moe_sched_policy_parse_offload(&pol, s.offload) == MOE_STATUS_OK);
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 128;
    p.n_ubatch = s.n_ubatch;
    p.n_threads = 2;
    p.device = s.device;
    p.tensor_overrides = s.overrides;
    p.policy = &pol;
    p.devices = s.devices.empty() ? nullptr : s.devices.data();
    p.n_devices = static_cast<int32_t>(s.devices.size());
    p.tensor_split = s.split.empty() ? nullptr : s.split.data();
    p.n_tensor_split = static_cast<int32_t>(s.split.size());
    p.vram_budget = s.vram_budget;
    p.vram_budgets = s.budgets.empty() ? nullptr : s.budgets.data();
    p.n_vram_budgets = static_cast<int32_t>(s.budgets.size());
    p.split_mode = s.split_mode;
    p.main_gpu = s.main_gpu;
    p.backend_options = s.backend_options.empty() ? nullptr : s.backend_options.c_str();
    return p;
}

// Creates a context for `s` that must be refused: checks that none was made and returns the status
// (moe_last_error() says why).
inline moe_status create_refused(moe_model* m, const DeviceSetup& s) {
    moe_sched_policy pol;
    const moe_context_params p = device_params(s, pol);
    moe_context* ctx = nullptr;
    const moe_status st = moe_context_create(m, &p, &ctx);
    CHECK(ctx == nullptr);
    moe_context_free(ctx);
    return st;
}

struct DeviceContext : ApiContext {
    DeviceContext(moe_model* m, const DeviceSetup& s) : DeviceContext(m, s, moe_sched_policy{}) {}

private:
    // The policy argument outlives the creation: it lives until the delegating call returns.
    DeviceContext(moe_model* m, const DeviceSetup& s, moe_sched_policy&& pol) : ApiContext(m, device_params(s, pol)) {}
};

// The ordinals of a context's devices, in its order (moe_context_get_device_info).
inline std::vector<int32_t> device_ordinals(const moe_context* ctx) {
    int32_t n = 0;
    REQUIRE(moe_context_get_n_devices(ctx, &n) == MOE_STATUS_OK);
    std::vector<int32_t> out;
    for (int32_t d = 0; d < n; ++d) {
        moe_device_info info;
        info.struct_size = sizeof info;
        REQUIRE(moe_context_get_device_info(ctx, d, &info) == MOE_STATUS_OK);
        out.push_back(info.ordinal);
    }
    return out;
}

}  // namespace moe::test
