// Host-resident weights of CUDA contexts used in place (runtime/host_weights.h): the expert tensors of a
// hybrid context (-ot exps=CPU) are registered with cudaHostRegister (read-only: the file mapping is
// PROT_READ), every byte of them; with registration refused (HostRegistry's test hook) the uploads come
// from pageable memory and must give the same logits bit for bit (two CUDA contexts of one model compute
// identically: tests/cuda/context_pair.h); a model read into memory (use_mmap = 0) registers writable
// memory. Expert bytes are checked against the public tensor table.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "core/host_registry.h"
#include "cuda/cuda_backend.h"
#include "runtime/context.h"
#endif

#if MOEINFER_HAS_CUDA
namespace {

// n_ctx 256, n_ubatch 32: prefills past the GEMM threshold, then GEMV sizes.
struct Ctx : moe::test::UploadingContext {
    Ctx(moe_model* m, const char* overrides) : UploadingContext(m, MOE_DEVICE_CUDA, overrides, 256, 32) {}
    uint64_t pinned_bytes() const { return stats().weights_host_pinned_bytes; }
};

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
        const uint64_t experts = moe::test::tensor_bytes_containing(m.get(), "_exps.");
        std::vector<std::vector<float>> staged_logits;
        {
            registry.set_refuse(true);
            Ctx staged(m.get(), "exps=CPU");
            registry.set_refuse(false);
            CHECK(staged.pinned_bytes() == 0);
            staged_logits = staged.run(batches);
        }
        REQUIRE(registry.n_ranges() == 0);
        Ctx pinned(m.get(), "exps=CPU");
        INFO("first refusal: " << pinned.get()->host_weights.first_refusal());
        CHECK(pinned.pinned_bytes() == experts);
        CHECK(registry.n_ranges() > 0);
        const auto got = pinned.run(batches);
        for (size_t i = 0; i < batches.size(); ++i) {
            CHECK(moe::test::bitwise_equal(got[i], staged_logits[i]));
        }

        // A second context shares the registrations; a model read into memory registers its own.
        const size_t ranges = registry.n_ranges();
        Ctx second(m.get(), "exps=CPU");
        CHECK(registry.n_ranges() == ranges);
        CHECK(second.pinned_bytes() == experts);
        {
            // Other placements, whose runs overlap the held ones differently (part of a held run, and a
            // run reaching past one): those stay pageable, the copies cross from locked into pageable
            // pages, and the logits equal those of the same placement with nothing registered.
            for (const char* other : {"blk\\.0\\.ffn_(up|gate)_exps=CPU", "blk\\.[01]\\..*=CPU"}) {
                INFO(other);
                registry.set_refuse(true);
                std::vector<std::vector<float>> want;
                {
                    Ctx staged_other(m.get(), other);
                    want = staged_other.run(batches);
                }
                registry.set_refuse(false);
                Ctx overlapping(m.get(), other);
                CHECK(registry.n_ranges() >= ranges);
                const auto got_other = overlapping.run(batches);
                for (size_t i = 0; i < batches.size(); ++i) CHECK(moe::test::bitwise_equal(got_other[i], want[i]));
            }
        }
        CHECK(registry.n_ranges() == ranges);
        moe_model_params mp;
        moe_model_params_init(&mp);
        mp.use_mmap = 0;
        moe_model* read_in = nullptr;
        REQUIRE(moe_model_load(m.path().c_str(), &mp, &read_in) == MOE_STATUS_OK);
        {
            Ctx in_memory(read_in, "exps=CPU");
            INFO("first refusal: " << in_memory.get()->host_weights.first_refusal());
            CHECK(in_memory.pinned_bytes() == experts);
            const auto again = in_memory.run(batches);
            for (size_t i = 0; i < batches.size(); ++i) {
                CHECK(moe::test::bitwise_equal(again[i], got[i]));
            }
        }
        moe_model_free(read_in);
    }
    CHECK(registry.n_ranges() == 0);
#endif
}
