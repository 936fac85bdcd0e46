// Host-resident weights of device contexts used in place from the model's bytes (runtime/host_weights.h),
// on the emulated device: page-locked where the device registers them, pageable (uploads staged) where
// it refuses (HostRegistry's test hook). Both paths must give the same logits bit for bit (only the
// copy mechanism differs; expert split off, so nothing depends on timing), and those logits match a
// CPU context as in test_hybrid_context.cpp (|hybrid - cpu| <= 1e-4 * max|cpu| per row). The pinned
// byte counts are checked against the expert tensors' sizes from the tensor table, and the process's
// registrations against what the live contexts hold. Tagged [sched]: ctest runs these once more on the
// asynchronous emulated device, where staged uploads block like CUDA's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "core/host_registry.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"

namespace {

using Model = moe::test::TinyModel;
using moe::test::bitwise_equal;
using moe::test::require_close;

moe::HostRegistry& registry() { return moe::HostRegistry::of("emulated"); }

// Registration refused while alive (as by a driver that cannot lock the pages).
struct RefuseRegistration {
    RefuseRegistration() { registry().set_refuse(true); }
    ~RefuseRegistration() { registry().set_refuse(false); }
};

// n_ctx 128, n_ubatch 16: several ubatches per prompt.
struct Ctx : moe::test::UploadingContext {
    Ctx(moe_model* m, int32_t device, const char* overrides, int32_t expert_copy = MOE_EXPERT_COPY_FULL)
        : UploadingContext(m, device, overrides, 128, 16, expert_copy) {}
};

std::vector<std::vector<int32_t>> token_batches(std::mt19937& rng, int32_t n_vocab) {
    std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
    std::vector<std::vector<int32_t>> batches;
    for (int n : {21, 3, 1}) {  // more than a ubatch, then small ones
        std::vector<int32_t> b(static_cast<size_t>(n));
        for (auto& t : b) t = tok(rng);
        batches.push_back(std::move(b));
    }
    return batches;
}

// Every host-side weight of ctx points at the model's own bytes (used in place, not copied).
void require_in_place(const moe_context& ctx) {
    const moe::GgufFile& file = *ctx.model->file;
    size_t host_weights = 0;
    for (const moe::GgufTensorInfo& info : file.tensors()) {
        const auto it = ctx.weight_by_name.find(info.name);
        REQUIRE(it != ctx.weight_by_name.end());
        const moe::Tensor& t = *it->second;
        if (t.buffer != nullptr && !t.buffer->is_host()) continue;  // device-resident
        INFO(info.name);
        CHECK(t.data == file.tensor_data(info));
        ++host_weights;
    }
    CHECK(host_weights > 0);
}

}  // namespace

TEST_CASE("host weights are used in place, page-locked or staged, with the same logits", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_host_weights", rng());
        const int32_t nv = m.info().n_vocab;
        const auto batches = token_batches(rng, nv);
        Ctx cpu(m.get(), MOE_DEVICE_CPU, nullptr);
        const auto want = cpu.run(batches);
        CHECK(cpu.stats().weights_host_pinned_bytes == 0);  // a CPU context locks nothing

        const uint64_t experts = moe::test::tensor_bytes_containing(m.get(), "_exps.");
        REQUIRE(experts > 0);
        for (int32_t copy : {MOE_EXPERT_COPY_FULL, MOE_EXPERT_COPY_ACTIVE_ONLY}) {
            INFO(arch << " expert copy " << copy);
            REQUIRE(registry().n_ranges() == 0);
            std::vector<std::vector<float>> staged_logits;
            {
                // Alone: a range another context holds would be shared despite the hook.
                RefuseRegistration refuse;
                Ctx staged(m.get(), MOE_DEVICE_EMULATED, "exps=CPU", copy);
                CHECK(registry().n_ranges() == 0);
                CHECK(staged.stats().weights_host_pinned_bytes == 0);
                require_in_place(*staged.get());
                staged_logits = staged.run(batches);
                const moe_sched_stats st = staged.stats();
                CHECK(st.bytes_weights_full + st.bytes_weights_experts > 0);  // the staged path ran
            }
            Ctx pinned(m.get(), MOE_DEVICE_EMULATED, "exps=CPU", copy);
            CHECK(registry().n_ranges() > 0);
            CHECK(pinned.stats().weights_host_pinned_bytes == experts);
            require_in_place(*pinned.get());
            const auto got = pinned.run(batches);
            for (size_t i = 0; i < batches.size(); ++i) {
                require_close(got[i], want[i], nv);
                CHECK(bitwise_equal(staged_logits[i], got[i]));
            }
            const moe_sched_stats st = pinned.stats();
            CHECK(st.bytes_weights_full + st.bytes_weights_experts > 0);
        }
        CHECK(registry().n_ranges() == 0);  // nothing left locked
    }
}

TEST_CASE("contexts on one model share the page-locked ranges", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    Model m("gpt-oss", "moe_host_share", rng());
    const int32_t nv = m.info().n_vocab;
    const auto batches = token_batches(rng, nv);
    Ctx cpu(m.get(), MOE_DEVICE_CPU, nullptr);
    const auto want = cpu.run(batches);
    const uint64_t experts = moe::test::tensor_bytes_containing(m.get(), "_exps.");

    auto first = std::make_unique<Ctx>(m.get(), MOE_DEVICE_EMULATED, "exps=CPU");
    const size_t ranges = registry().n_ranges();
    REQUIRE(ranges > 0);
    Ctx second(m.get(), MOE_DEVICE_EMULATED, "exps=CPU");
    CHECK(registry().n_ranges() == ranges);  // the same runs, locked once
    CHECK(second.stats().weights_host_pinned_bytes == experts);
    {
        // Another placement: runs that overlap the held ones differently stay pageable; still correct.
        Ctx other(m.get(), MOE_DEVICE_EMULATED, "blk\\.0\\.ffn_(up|gate)_exps=CPU");
        CHECK(other.stats().weights_host_pinned_bytes <= experts);
        const auto got = other.run(batches);
        for (size_t i = 0; i < batches.size(); ++i) require_close(got[i], want[i], nv);
    }
    CHECK(registry().n_ranges() == ranges);
    first.reset();  // the second context's ranges stay locked
    CHECK(registry().n_ranges() == ranges);
    const auto got = second.run(batches);
    for (size_t i = 0; i < batches.size(); ++i) require_close(got[i], want[i], nv);
}

TEST_CASE("a model read into memory (use_mmap = 0) is used in place too", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    Model mapped("qwen3moe", "moe_host_nommap", rng());
    moe_model_params mp;
    moe_model_params_init(&mp);
    mp.use_mmap = 0;
    std::vector<float> fractions;
    mp.progress = [](float f, void* user) {
        static_cast<std::vector<float>*>(user)->push_back(f);
        return 1;
    };
    mp.progress_user_data = &fractions;
    moe_model* raw = nullptr;
    REQUIRE(moe_model_load(mapped.path().c_str(), &mp, &raw) == MOE_STATUS_OK);
    std::unique_ptr<moe_model, void (*)(moe_model*)> read_in(raw, moe_model_free);
    REQUIRE(fractions.size() >= 2);
    CHECK(fractions.front() == 0.0f);
    CHECK(fractions.back() == 1.0f);
    CHECK(std::is_sorted(fractions.begin(), fractions.end()));
    CHECK_FALSE(read_in->file->is_mapped());

    const auto batches = token_batches(rng, mapped.info().n_vocab);
    Ctx a(mapped.get(), MOE_DEVICE_EMULATED, "exps=CPU");
    Ctx b(read_in.get(), MOE_DEVICE_EMULATED, "exps=CPU");
    CHECK(b.stats().weights_host_pinned_bytes == moe::test::tensor_bytes_containing(read_in.get(), "_exps."));
    require_in_place(*b.get());
    const auto want = a.run(batches);
    const auto got = b.run(batches);
    for (size_t i = 0; i < batches.size(); ++i) CHECK(bitwise_equal(got[i], want[i]));
}

TEST_CASE("context creation reports the locking and uploads, and a cancel leaves nothing locked", "[sched]") {
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_host_progress", rng());
    struct Seen {
        std::vector<float> fractions;
        size_t cancel_at = SIZE_MAX;
    };
    const auto on_progress = [](float f, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->fractions.push_back(f);
        return s->fractions.size() >= s->cancel_at ? 0 : 1;
    };
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 64;
    p.device = MOE_DEVICE_EMULATED;
    p.tensor_overrides = "exps=CPU";
    p.progress = on_progress;
    Seen all;
    p.progress_user_data = &all;
    moe_context* ctx = nullptr;
    REQUIRE(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_OK);
    moe_context_free(ctx);
    // A run per group of adjacent host tensors, then a step per device tensor.
    REQUIRE(all.fractions.size() > static_cast<size_t>(m.info().n_layer));
    CHECK(std::is_sorted(all.fractions.begin(), all.fractions.end()));
    CHECK(all.fractions.front() > 0.0f);
    CHECK(all.fractions.back() == Approx(1.0f).epsilon(1e-6));

    for (size_t at : {size_t{1}, all.fractions.size() / 2, all.fractions.size()}) {
        INFO("cancelled at report " << at);
        Seen s;
        s.cancel_at = at;
        p.progress_user_data = &s;
        ctx = nullptr;
        CHECK(moe_context_create(m.get(), &p, &ctx) == MOE_STATUS_CANCELLED);
        CHECK(ctx == nullptr);
        CHECK(registry().n_ranges() == 0);
    }
}
