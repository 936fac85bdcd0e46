// Host-resident weights of device contexts used in place from the model's bytes (runtime/host_weights.h),
// on the emulated device: page-locked where the device registers them, pageable (uploads staged) where
// it refuses (HostRegistry's test hook). Both paths must give the same logits bit for bit (only the
// copy mechanism differs; expert split off, so nothing depends on timing), and those logits match a
// CPU context as in test_hybrid_context.cpp (|hybrid - cpu| <= 1e-4 * max|cpu| per row). The pinned
// byte counts are checked against the expert tensors' sizes from the tensor table, and the process's
// registrations against what the live contexts hold. HostWeights::register_ranges is also driven
// directly on a file whose one run spans more than a progress step: the same bytes, locks and progress
// reports on 1, 3 and 8 reading threads. Tagged [sched]: ctest runs these once more on the
// asynchronous emulated device, where staged uploads block like CUDA's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/logits_check.h"
#include "common/tiny_model.h"
#include "core/backend_registry.h"
#include "core/gguf_writer.h"
#include "core/host_registry.h"
#include "moeinfer/moeinfer.h"
#include "runtime/context.h"
#include "runtime/host_weights.h"

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

namespace {

// HostWeights::register_ranges over every tensor of a freshly mapped file on the emulated device, each
// progress report recorded; members in the order they must outlive each other.
struct Registered {
    std::unique_ptr<moe::Backend> device;
    std::unique_ptr<moe::GgufFile> file;
    moe::HostWeights weights;
    std::vector<uint64_t> steps;
    size_t cancel_at = SIZE_MAX;  // the report that cancels (1-based)

    moe::Status run(const std::string& path, int n_threads) {
        auto opened = moe::GgufFile::open(path, /*use_mmap=*/true);
        REQUIRE(opened.is_ok());
        file = std::move(opened).value();
        const moe::BackendFactory* factory = moe::find_backend_factory("emulated");
        REQUIRE(factory != nullptr);
        auto created = factory->create(moe::BackendOptions{});
        REQUIRE(created.is_ok());
        device = std::move(created).value();
        std::vector<moe::HostRange> ranges;
        for (const moe::GgufTensorInfo& t : file->tensors()) ranges.push_back({file->tensor_data(t), t.n_bytes});
        auto w = moe::HostWeights::register_ranges(*device, ranges, *file, n_threads, [this](uint64_t n) {
            steps.push_back(n);
            return steps.size() >= cancel_at ? moe::cancelled("cancelled by the test") : moe::Status::ok();
        });
        if (!w.is_ok()) return w.status();
        weights = std::move(w).value();
        uint64_t total = 0, tensor_bytes = 0;
        for (uint64_t s : steps) total += s;
        for (const moe::HostRange& r : ranges) tensor_bytes += r.n;
        CHECK(total == moe::HostWeights::run_bytes(ranges));
        CHECK(weights.locked_bytes() == tensor_bytes);
        return moe::Status::ok();
    }
};

}  // namespace

TEST_CASE("page-locking reads a large run on threads, reports progress inside it the same whatever the threads",
          "[sched][anonymous]") {
    std::mt19937_64 rng(Catch::rngSeed());
    // One tensor of ~70 MB (more than one 64 MiB progress step) between two small ones: the runs merge
    // into one, read by every thread.
    const std::string path = std::string(MOE_TEST_TMP_DIR) + "/host_weights_progress.gguf";
    moe::GgufWriter writer;
    const std::vector<std::vector<int64_t>> shapes = {{1024, 3}, {4096, 4300 + static_cast<int64_t>(rng() % 100)},
                                                      {1024, 5}};
    std::vector<std::vector<uint8_t>> data;
    for (size_t t = 0; t < shapes.size(); ++t) {
        writer.add_tensor(std::string("t").append(std::to_string(t)), moe::Type::F32, shapes[t]);  // (GCC 12 -Wrestrict)
        data.emplace_back(static_cast<size_t>(shapes[t][0] * shapes[t][1] * 4));
        for (size_t i = 0; i + 8 <= data.back().size(); i += 8) {
            const uint64_t v = rng();
            std::memcpy(data.back().data() + i, &v, 8);
        }
    }
    REQUIRE(writer.begin(path).is_ok());
    for (const auto& d : data) REQUIRE(writer.append(d.data(), d.size()).is_ok());
    REQUIRE(writer.finish().is_ok());

    std::vector<uint64_t> first;
    for (int n_threads : {1, 3, 8}) {
        INFO(n_threads << " threads");
        Registered r;
        REQUIRE(r.run(path, n_threads).is_ok());
        CHECK(r.steps.size() >= 2);  // a step of the read inside the run, then its end when locked
        if (first.empty()) first = r.steps;
        CHECK(r.steps == first);
        for (size_t t = 0; t < data.size(); ++t) {
            INFO("tensor " << t);
            const uint8_t* p = r.file->tensor_data(r.file->tensors()[t]);
            CHECK(std::memcmp(p, data[t].data(), data[t].size()) == 0);
            CHECK(r.weights.buffer_of(p, data[t].size()) != nullptr);
        }
    }
    // An error from the progress callback during the read or at the run's end stops: nothing stays locked.
    for (size_t at : {size_t{1}, first.size()}) {
        INFO("cancelled at report " << at);
        Registered r;
        r.cancel_at = at;
        CHECK(r.run(path, 4).code() == MOE_STATUS_CANCELLED);
        CHECK(registry().n_ranges() == 0);
    }
    std::remove(path.c_str());
}
