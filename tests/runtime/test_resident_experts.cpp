// Partly resident layers through the public API, on the emulated device: a profile saved by one context
// and set on the model makes a context under a VRAM budget keep some experts of a layer on the device
// and the rest in RAM; its logits match the all-host and all-device contexts' (every side computes
// with the CPU kernels: only the order of the two parts' sum differs, |d| <= 1e-4 * max|cpu| per row),
// decode steps upload no weights, the counts map slice rows back to experts, and the budget holds
// (device bytes summed here from the tensor table and the per-layer residency).
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/api_context.h"
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"

namespace {

using Model = moe::test::TinyModel;
using moe::test::require_close;

constexpr uint64_t kAlign = 256;
uint64_t pad(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A context of device `device` (CPU or emulated) under vram_budget (0: none), with the given policy.
struct Ctx : moe::test::ApiContext {
    Ctx(const Model& m, int32_t device, uint64_t vram_budget, const moe_sched_policy* policy)
        : ApiContext(m.get(), params(device, vram_budget, policy)) {}
    static moe_context_params params(int32_t device, uint64_t vram_budget, const moe_sched_policy* policy) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 128;
        p.n_ubatch = 16;
        p.n_threads = 2;
        p.device = device;
        p.vram_budget = vram_budget;
        p.policy = policy;
        return p;
    }
};

struct Tensor {
    std::string name;
    uint64_t bytes;
    int layer;
    bool expert;
};

// The tensors of the model that contexts use (a file may hold more, such as glm4moe's MTP layer).
std::vector<Tensor> tensors(const Model& m, const moe_context* ctx) {
    const int32_t n = m.info().n_tensors;
    std::vector<Tensor> out;
    for (int32_t i = 0; i < n; ++i) {
        moe_tensor_info ti;
        moe_tensor_info_init(&ti);
        REQUIRE(moe_model_get_tensor(m.get(), i, &ti) == MOE_STATUS_OK);
        const std::string name = ti.name;
        int32_t loc = -1;
        const moe_status s = moe_context_tensor_location(ctx, name.c_str(), &loc, nullptr);
        if (s == MOE_STATUS_NOT_FOUND) continue;
        REQUIRE(s == MOE_STATUS_OK);
        const int layer = name.rfind("blk.", 0) == 0 ? std::stoi(name.substr(4)) : -1;
        out.push_back({name, ti.n_bytes, layer, name.find("_exps.") != std::string::npos});
    }
    return out;
}

using moe::test::random_tokens;

std::string temp_path(const std::string& tag) {
    return (std::filesystem::temp_directory_path() / (tag + "_" + std::to_string(getpid()) + ".txt")).string();
}

}  // namespace

TEST_CASE("partly resident layers match the all-host and all-device contexts", "[sched]") {
    const uint64_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (const char* arch : {"qwen3moe", "gpt-oss", "glm4moe"}) {
        INFO(arch);
        moe::test::TinyModelOptions o;
        o.routing_skew = 0.6f;
        Model m(arch, "moe_resident", rng(), o);
        const int32_t nv = m.info().n_vocab, n_layer = m.info().n_layer, n_expert = m.info().n_expert;
        const int32_t k = m.info().n_expert_used;
        // Prefill over two ubatches, then single tokens.
        const std::vector<std::vector<int32_t>> batches = {random_tokens(rng, 20, nv), random_tokens(rng, 1, nv),
                                                            random_tokens(rng, 1, nv), random_tokens(rng, 5, nv)};
        std::vector<std::vector<float>> want_cpu, want_dev;
        std::vector<Tensor> ts;
        const std::string profile = temp_path(std::string("moe_resident_") + arch);
        {
            Ctx cpu(m, MOE_DEVICE_CPU, 0, nullptr);
            for (const auto& b : batches) want_cpu.push_back(cpu.decode(b, nv));
            REQUIRE(moe_context_save_expert_profile(cpu.ctx, profile.c_str()) == MOE_STATUS_OK);
            Ctx dev(m, MOE_DEVICE_EMULATED, 0, nullptr);
            for (const auto& b : batches) want_dev.push_back(dev.decode(b, nv));
            ts = tensors(m, dev.ctx);
        }
        REQUIRE(moe_model_set_expert_profile(m.get(), profile.c_str()) == MOE_STATUS_OK);
        std::filesystem::remove(profile);

        // A budget of the dense weights and about half of the experts.
        uint64_t dense = 0, experts = 0;
        for (const Tensor& t : ts) (t.expert ? experts : dense) += pad(t.bytes);
        const uint64_t budget = dense + experts * (30 + rng() % 40) / 100;
        INFO("budget " << budget << " of " << dense + experts);

        for (const char* offload : {"all=off", "all=4"}) {
            INFO("offload " << offload);
            moe_sched_policy pol;
            moe_sched_policy_init(&pol);
            REQUIRE(moe_sched_policy_parse_offload(&pol, offload) == MOE_STATUS_OK);
            pol.expert_split = 0;
            // Residency alone: an expert cache filled by the offloaded batches would take whole layers to
            // the device for decode too (test_sched_cache.py).
            pol.expert_cache = 0;
            Ctx hy(m, MOE_DEVICE_EMULATED, budget, &pol);
            for (size_t i = 0; i < batches.size(); ++i) {
                const std::vector<float> got = hy.decode(batches[i], nv);
                require_close(got, want_cpu[i], nv);
                require_close(got, want_dev[i], nv);
            }

            // The residency: some layer partly resident, the budget held.
            std::vector<int32_t> n_res(static_cast<size_t>(n_layer));
            std::vector<uint64_t> res_bytes(static_cast<size_t>(n_layer));
            int32_t n_out = 0;
            REQUIRE(moe_context_get_resident_experts(hy.ctx, n_res.data(), res_bytes.data(), n_layer, &n_out) ==
                    MOE_STATUS_OK);
            REQUIRE(n_out == n_layer);
            bool partial = false;
            uint64_t used = 0;
            for (const Tensor& t : ts) {
                int32_t loc = -1, dup = 0;
                REQUIRE(moe_context_tensor_location(hy.ctx, t.name.c_str(), &loc, &dup) == MOE_STATUS_OK);
                if (loc == MOE_LOCATION_DEVICE) used += pad(t.bytes);
                if (t.expert && t.layer >= 0) {
                    const int32_t r = n_res[static_cast<size_t>(t.layer)];
                    if (loc == MOE_LOCATION_HOST && r > 0) used += pad(t.bytes / static_cast<uint64_t>(n_expert) * r);
                }
            }
            for (int32_t il = 0; il < n_layer; ++il) partial = partial || (n_res[il] > 0 && n_res[il] < n_expert);
            CHECK(partial);
            CHECK(used <= budget);

            // Counts: every (token, expert) pair once per MoE layer, slice rows mapped back to experts.
            const std::vector<uint64_t> counts = hy.counts();
            uint64_t n_tokens = 0;
            for (const auto& b : batches) n_tokens += b.size();
            for (int32_t il = 0; il < n_layer; ++il) {
                if (n_res[il] == 0 && res_bytes[il] == 0 && std::string(arch) == "glm4moe" && il == 0) continue;  // dense
                uint64_t sum = 0;
                for (int32_t e = 0; e < n_expert; ++e) sum += counts[static_cast<size_t>(il * n_expert + e)];
                if (sum != 0) CHECK(sum == n_tokens * static_cast<uint64_t>(k));
            }

            // A decode step computes the resident experts on the device and the others on the host,
            // uploading no weight.
            REQUIRE(moe_context_reset_stats(hy.ctx) == MOE_STATUS_OK);
            (void)hy.decode(random_tokens(rng, 1, nv), nv);
            const moe_sched_stats st = hy.stats();
            CHECK(st.bytes_weights_full + st.bytes_weights_experts == 0);
            CHECK(st.n_ops_host > 0);
            CHECK(st.n_ops_device > 0);
        }
        REQUIRE(moe_model_set_expert_profile(m.get(), nullptr) == MOE_STATUS_OK);
    }
}

TEST_CASE("a foreign or missing expert profile is refused by name", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    Model q("qwen3moe", "moe_resident_foreign", rng());
    Model g("gpt-oss", "moe_resident_foreign", rng());
    const std::string profile = temp_path("moe_resident_foreign");
    {
        Ctx c(g, MOE_DEVICE_CPU, 0, nullptr);
        REQUIRE(moe_context_save_expert_profile(c.ctx, profile.c_str()) == MOE_STATUS_OK);
    }
    CHECK(moe_model_set_expert_profile(q.get(), profile.c_str()) == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(moe_last_error()).find("arch") != std::string::npos);
    std::filesystem::remove(profile);
    CHECK(moe_model_set_expert_profile(q.get(), profile.c_str()) == MOE_STATUS_NOT_FOUND);
    CHECK(moe_model_set_expert_profile(nullptr, profile.c_str()) == MOE_STATUS_INVALID_ARGUMENT);
    Ctx c(q, MOE_DEVICE_CPU, 0, nullptr);
    CHECK(moe_context_save_expert_profile(c.ctx, "/nonexistent-dir/p.txt") == MOE_STATUS_IO_ERROR);
}
