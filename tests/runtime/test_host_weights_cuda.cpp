// Host-resident weights of CUDA contexts used in place (runtime/host_weights.h): the expert tensors of a
// hybrid context (-ot exps=CPU) are registered with cudaHostRegister (read-only: the file mapping is
// PROT_READ), every byte of them; with registration refused (HostRegistry's test hook) the uploads come
// from pageable memory and must give the same logits bit for bit (two CUDA contexts of one model compute
// identically: tests/cuda/context_pair.h); a model read into memory (use_mmap = 0) registers writable
// memory. Expert bytes are checked against the public tensor table.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "common/tiny_model.h"
#include "core/host_registry.h"
#include "cuda/cuda_backend.h"
#include "runtime/context.h"
#endif

#if MOEINFER_HAS_CUDA
namespace {

struct Ctx {
    moe_context* ctx = nullptr;
    Ctx(moe_model* m, const char* overrides) {
        moe_sched_policy pol;
        moe_sched_policy_init(&pol);
        REQUIRE(moe_sched_policy_parse_offload(&pol, "all=1") == MOE_STATUS_OK);  // every ubatch uploads
        pol.expert_split = 0;  // bitwise comparison: nothing may depend on timing
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 256;
        p.n_ubatch = 32;
        p.device = MOE_DEVICE_CUDA;
        p.tensor_overrides = overrides;
        p.policy = &pol;
        const moe_status s = moe_context_create(m, &p, &ctx);
        INFO(moe_last_error());
        REQUIRE(s == MOE_STATUS_OK);
    }
    ~Ctx() { moe_context_free(ctx); }
    Ctx(const Ctx&) = delete;
    Ctx& operator=(const Ctx&) = delete;
    std::vector<float> decode(const std::vector<int32_t>& tokens) {
        REQUIRE(moe_decode(ctx, tokens.data(), nullptr, static_cast<int32_t>(tokens.size()), 1) == MOE_STATUS_OK);
        const float* logits = nullptr;
        int32_t rows = 0, nv = 0;
        REQUIRE(moe_get_logits(ctx, &logits, &rows, &nv) == MOE_STATUS_OK);
        return std::vector<float>(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
    }
    uint64_t pinned_bytes() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx, &st) == MOE_STATUS_OK);
        return st.weights_host_pinned_bytes;
    }
};

uint64_t expert_bytes(moe_model* m) {
    moe_model_info info;
    moe_model_info_init(&info);
    REQUIRE(moe_model_get_info(m, &info) == MOE_STATUS_OK);
    uint64_t total = 0;
    for (int32_t i = 0; i < info.n_tensors; ++i) {
        moe_tensor_info t;
        moe_tensor_info_init(&t);
        REQUIRE(moe_model_get_tensor(m, i, &t) == MOE_STATUS_OK);
        if (std::strstr(t.name, "_exps.") != nullptr) total += t.n_bytes;
    }
    return total;
}

std::vector<std::vector<float>> run(Ctx& c, const std::vector<std::vector<int32_t>>& batches) {
    std::vector<std::vector<float>> out;
    for (const auto& b : batches) out.push_back(c.decode(b));
    return out;
}

}  // namespace
#endif

TEST_CASE("cuda contexts use host weights in place, registered or staged, with the same logits", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
    return;
#else
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    moe::HostRegistry& registry = moe::HostRegistry::of("cuda");
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        INFO(arch);
        moe::test::TinyModelOptions o;
        o.head_dim = 64;  // the CUDA attention kernels cover 32..256
        o.n_layer = 4;
        const moe::test::TinyModel m(arch, "moe_cuda_host_weights", rng(), o);
        std::uniform_int_distribution<int32_t> tok(0, m.info().n_vocab - 1);
        std::vector<std::vector<int32_t>> batches;
        for (int n : {40, 5, 1}) {
            std::vector<int32_t> b(static_cast<size_t>(n));
            for (auto& t : b) t = tok(rng);
            batches.push_back(std::move(b));
        }
        const uint64_t experts = expert_bytes(m.get());
        std::vector<std::vector<float>> staged_logits;
        {
            registry.set_refuse(true);
            Ctx staged(m.get(), "exps=CPU");
            registry.set_refuse(false);
            CHECK(staged.pinned_bytes() == 0);
            staged_logits = run(staged, batches);
        }
        REQUIRE(registry.n_ranges() == 0);
        Ctx pinned(m.get(), "exps=CPU");
        INFO("first refusal: " << pinned.ctx->host_weights.first_refusal());
        CHECK(pinned.pinned_bytes() == experts);
        CHECK(registry.n_ranges() > 0);
        const auto got = run(pinned, batches);
        for (size_t i = 0; i < batches.size(); ++i) {
            REQUIRE(got[i].size() == staged_logits[i].size());
            CHECK(std::memcmp(got[i].data(), staged_logits[i].data(), got[i].size() * sizeof(float)) == 0);
        }

        // A second context shares the registrations; a model read into memory registers its own.
        const size_t ranges = registry.n_ranges();
        Ctx second(m.get(), "exps=CPU");
        CHECK(registry.n_ranges() == ranges);
        CHECK(second.pinned_bytes() == experts);
        moe_model_params mp;
        moe_model_params_init(&mp);
        mp.use_mmap = 0;
        moe_model* read_in = nullptr;
        REQUIRE(moe_model_load(m.path().c_str(), &mp, &read_in) == MOE_STATUS_OK);
        {
            Ctx in_memory(read_in, "exps=CPU");
            INFO("first refusal: " << in_memory.ctx->host_weights.first_refusal());
            CHECK(in_memory.pinned_bytes() == experts);
            const auto again = run(in_memory, batches);
            for (size_t i = 0; i < batches.size(); ++i) {
                CHECK(std::memcmp(again[i].data(), got[i].data(), got[i].size() * sizeof(float)) == 0);
            }
        }
        moe_model_free(read_in);
    }
    CHECK(registry.n_ranges() == 0);
#endif
}
