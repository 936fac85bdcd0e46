// Device out-of-memory at the three moments it happens: placing the weights, creating a context (the
// KV cache) and running a ubatch larger than any before (activation arena, upload slots, kernel
// scratch). The device memory meter's test hook (core/device_memory.h) refuses allocations: a byte
// limit ("the device has N bytes") or "the k-th allocation from now fails". Run on the emulated device
// (CI) and, tagged [gpu], on the CUDA backend, through the public API.
//
// Each failure must be RESOURCE_EXHAUSTED whose message names what was being allocated, the bytes
// asked and the bytes free; the meter's live bytes must come back to where they were (nothing leaked);
// the model must still make contexts and other live contexts still decode with unchanged logits. A
// placement the default budget falls back to must give the logits of the same placement asked for
// explicitly (tensor overrides), bit for bit: the same ops on the same sides with the split off.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/api_context.h"
#include "common/tiny_model.h"
#include "core/device_memory.h"
#include "moeinfer/moeinfer.h"
#if MOEINFER_HAS_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

using moe::DeviceMemoryMeter;
using moe::StatusOr;
using Model = moe::test::TinyModel;

// Clears the hooks however the test case ends.
struct HookGuard {
    DeviceMemoryMeter& meter;
    ~HookGuard() { meter.clear_hooks(); }
};

struct Device {
    int32_t kind;
    const char* meter;
};
constexpr Device kEmulated{MOE_DEVICE_EMULATED, "emulated"};
constexpr Device kCuda{MOE_DEVICE_CUDA, "cuda"};

moe::test::TinyModelOptions options() {
    moe::test::TinyModelOptions o;
    o.head_dim = 64;  // the CUDA attention kernels cover 32..256
    return o;
}

moe_sched_policy policy(const char* offload = nullptr) {
    moe_sched_policy p;
    moe_sched_policy_init(&p);
    p.expert_split = 0;  // bitwise comparisons between placements: no timing-dependent split
    if (offload != nullptr) REQUIRE(moe_sched_policy_parse_offload(&p, offload) == MOE_STATUS_OK);
    return p;
}

moe_context_params params(const Device& d, const moe_sched_policy* pol, const char* overrides = nullptr) {
    moe_context_params p;
    moe_context_params_init(&p);
    p.n_ctx = 256;
    p.n_ubatch = 128;
    p.n_threads = 2;
    p.device = d.kind;
    p.policy = pol;
    p.tensor_overrides = overrides;
    // Device 0 named: the ballast and limits below are about one device, and without a list a machine
    // of several GPUs gives a context the one with the most free memory.
    static const int32_t kFirst[1] = {0};
    p.devices = kFirst;
    p.n_devices = 1;
    return p;
}

class Ctx {
public:
    Ctx() = default;
    ~Ctx() { moe_context_free(ctx_); }
    Ctx(const Ctx&) = delete;
    Ctx& operator=(const Ctx&) = delete;

    moe_status create(const Model& m, const moe_context_params& p) {
        moe_context_free(ctx_);
        ctx_ = nullptr;
        status_ = moe_context_create(m.get(), &p, &ctx_);
        message_ = status_ == MOE_STATUS_OK ? "" : moe_last_error();
        return status_;
    }
    void require(const Model& m, const moe_context_params& p) {
        create(m, p);
        INFO(message_);
        REQUIRE(status_ == MOE_STATUS_OK);
    }
    moe_status try_decode(const std::vector<int32_t>& tokens) {
        status_ = moe_decode(ctx_, tokens.data(), nullptr, static_cast<int32_t>(tokens.size()), 1);
        message_ = status_ == MOE_STATUS_OK ? "" : moe_last_error();
        return status_;
    }
    std::vector<float> decode(const std::vector<int32_t>& tokens) {
        try_decode(tokens);
        INFO(message_);
        REQUIRE(status_ == MOE_STATUS_OK);
        const float* logits = nullptr;
        int32_t rows = 0, nv = 0;
        REQUIRE(moe_get_logits(ctx_, &logits, &rows, &nv) == MOE_STATUS_OK);
        return std::vector<float>(logits, logits + static_cast<size_t>(rows) * static_cast<size_t>(nv));
    }
    int32_t n_past() const {
        int32_t n = -1;
        REQUIRE(moe_context_n_past(ctx_, &n) == MOE_STATUS_OK);
        return n;
    }
    moe_sched_stats stats() const {
        moe_sched_stats st;
        st.struct_size = sizeof st;
        REQUIRE(moe_context_get_stats(ctx_, &st) == MOE_STATUS_OK);
        return st;
    }
    int32_t location(const char* name) const {
        int32_t loc = -1;
        REQUIRE(moe_context_tensor_location(ctx_, name, &loc, nullptr) == MOE_STATUS_OK);
        return loc;
    }
    void free() {
        moe_context_free(ctx_);
        ctx_ = nullptr;
    }
    moe_context* get() const { return ctx_; }
    const std::string& message() const { return message_; }

private:
    moe_context* ctx_ = nullptr;
    moe_status status_ = MOE_STATUS_OK;
    std::string message_;
};

// Whether contexts on d can be made here (the CUDA backend needs a CUDA build and a GPU).
bool available(const Device& d, const Model& m) {
    const moe_sched_policy pol = policy();
    Ctx probe;
    const moe_status s = probe.create(m, params(d, &pol));
    if (s == MOE_STATUS_UNIMPLEMENTED || s == MOE_STATUS_FAILED_PRECONDITION) {
        WARN("skipped: no CUDA device");
        return false;
    }
    INFO(probe.message());
    REQUIRE(s == MOE_STATUS_OK);
    return true;
}

using moe::test::random_tokens;

// The bytes a RESOURCE_EXHAUSTED message says were asked and free ("cannot allocate N bytes of device
// memory (F bytes free)"), after checking that it says so and what they were for.
struct Refusal {
    uint64_t asked = 0;
    uint64_t free = 0;
};
Refusal parse_refusal(const std::string& message, const std::string& what) {
    INFO(message);
    static const std::regex re(R"(cannot allocate (\d+) bytes of device memory \((\d+) bytes free\))");
    std::smatch m;
    REQUIRE(std::regex_search(message, m, re));
    CHECK(message.find(what) != std::string::npos);
    return Refusal{std::stoull(m[1].str()), std::stoull(m[2].str())};
}

uint64_t padded(uint64_t n) { return (n + 255) / 256 * 256; }

// Bytes of all the weights as placed (each padded to 256), and the names of the expert tensors.
uint64_t weight_bytes(const Model& m, std::vector<std::string>* experts) {
    uint64_t total = 0;
    for (int32_t i = 0; i < m.info().n_tensors; ++i) {
        moe_tensor_info ti;
        moe_tensor_info_init(&ti);
        REQUIRE(moe_model_get_tensor(m.get(), i, &ti) == MOE_STATUS_OK);
        total += padded(ti.n_bytes);
        if (experts != nullptr && std::string(ti.name).find("_exps.") != std::string::npos) experts->push_back(ti.name);
    }
    return total;
}

// The KV cache's bytes with every layer's attention on the device (F16 K and V).
uint64_t kv_bytes(const Model& m, int32_t n_ctx) {
    const moe_model_info& i = m.info();
    return uint64_t{2} * 2 * static_cast<uint64_t>(i.n_layer) * static_cast<uint64_t>(n_ctx) *
           static_cast<uint64_t>(i.n_head_kv) * static_cast<uint64_t>(i.head_dim);
}

// "^name$=CPU,..." for the expert tensors `ctx` keeps in host RAM.
std::string host_expert_overrides(const Ctx& ctx, const std::vector<std::string>& experts) {
    std::string spec;
    for (const std::string& name : experts) {
        if (ctx.location(name.c_str()) != MOE_LOCATION_HOST) continue;
        const std::string escaped = std::regex_replace(name, std::regex(R"(\.)"), R"(\.)");
        spec += (spec.empty() ? "^" : ",^") + escaped + "$=CPU";
    }
    return spec;
}

// Each device allocation of context creation refused in turn (the k-th from the start of the call):
// creation either falls back to a placement with more experts in host RAM, whose logits equal those
// of that placement asked for explicitly, or (an allocation no placement can avoid, e.g. the CUDA
// backend's own) fails cleanly. Past the last allocation nothing is refused and creation succeeds.
void check_placement_fallback(const Device& d) {
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "oom_place", rng(), options());
        if (!available(d, m)) return;
        DeviceMemoryMeter& meter = DeviceMemoryMeter::of(d.meter);
        HookGuard guard{meter};
        std::vector<std::string> experts;
        weight_bytes(m, &experts);
        const std::vector<int32_t> tokens = random_tokens(rng, 20, m.info().n_vocab);
        const moe_sched_policy pol = policy();
        int fell_back = 0, failed = 0;
        bool done = false;
        for (uint64_t k = 1; k <= 32 && !done; ++k) {
            INFO(arch << ": allocation " << k << " refused");
            const uint64_t live0 = meter.live_bytes(), refused0 = meter.n_refused();
            Ctx ctx;
            meter.fail_nth(k);
            const moe_status s = ctx.create(m, params(d, &pol));
            meter.clear_hooks();
            if (meter.n_refused() == refused0) {  // past the creation's last allocation
                INFO(ctx.message());
                REQUIRE(s == MOE_STATUS_OK);
                CHECK(ctx.stats().weights_host_bytes == 0);
                done = true;
                continue;
            }
            if (s != MOE_STATUS_OK) {
                REQUIRE(s == MOE_STATUS_RESOURCE_EXHAUSTED);
                parse_refusal(ctx.message(), "allocating");
                CHECK(meter.live_bytes() == live0);
                ++failed;
                continue;
            }
            // Fell back: fewer bytes on the device than the whole model, the same logits as that
            // placement asked for explicitly.
            const moe_sched_stats st = ctx.stats();
            REQUIRE(st.weights_host_bytes > 0);
            ++fell_back;
            const std::string overrides = host_expert_overrides(ctx, experts);
            REQUIRE(!overrides.empty());
            Ctx explicit_ctx;
            explicit_ctx.require(m, params(d, &pol, overrides.c_str()));
            for (const std::string& name : experts) CHECK(ctx.location(name.c_str()) == explicit_ctx.location(name.c_str()));
            CHECK(explicit_ctx.stats().weights_device_bytes == st.weights_device_bytes);
            CHECK(ctx.decode(tokens) == explicit_ctx.decode(tokens));
            ctx.free();
            explicit_ctx.free();
            CHECK(meter.live_bytes() == live0);
        }
        CHECK(done);
        CHECK(fell_back >= 2);  // the weights' buffer and the KV cache each refused once
        INFO(failed << " allocations no placement avoids");
    }
}

// An explicit vram_budget the device cannot hold, and a KV cache it cannot hold: RESOURCE_EXHAUSTED
// naming the budget, what was allocated, the bytes asked and free; nothing leaked, another context
// decodes as before, the model makes a context again.
void check_creation_refusals(const Device& d) {
    std::mt19937 rng(std::random_device{}());
    Model m("gpt-oss", "oom_create", rng(), options());
    if (!available(d, m)) return;
    DeviceMemoryMeter& meter = DeviceMemoryMeter::of(d.meter);
    HookGuard guard{meter};
    const std::vector<int32_t> tokens = random_tokens(rng, 9, m.info().n_vocab);
    const moe_sched_policy pol = policy();
    Ctx other;
    other.require(m, params(d, &pol));
    const std::vector<float> want = other.decode(tokens);
    const uint64_t total = weight_bytes(m, nullptr);
    moe_context_params p = params(d, &pol);
    p.vram_budget = total;  // every weight on the device
    const uint64_t live0 = meter.live_bytes();
    // What creation allocates before a given allocation (a device backend's own buffers, e.g. the CUDA
    // backend's cuBLAS workspace, come first): the limits below leave exactly half of that one.
    meter.start_recording();
    {
        Ctx probe;
        probe.require(m, p);
    }
    const std::vector<size_t> asked = meter.stop_recording();
    const uint64_t kv = kv_bytes(m, p.n_ctx);
    const auto allocated_before = [&](uint64_t n) {
        const auto it = std::find(asked.begin(), asked.end(), n);
        REQUIRE(it != asked.end());
        return std::accumulate(asked.begin(), it, uint64_t{0});
    };

    SECTION("the weights") {
        meter.set_limit(live0 + allocated_before(total) + total / 2);
        Ctx ctx;
        REQUIRE(ctx.create(m, p) == MOE_STATUS_RESOURCE_EXHAUSTED);
        const Refusal r = parse_refusal(ctx.message(), "allocating device memory for the weights");
        CHECK(ctx.message().find("vram_budget of " + std::to_string(total) + " bytes") != std::string::npos);
        CHECK(r.asked == total);
        CHECK(r.free == total / 2);
    }
    SECTION("the KV cache") {
        const uint64_t own = allocated_before(kv) - total;  // the backend's own, without the weights
        meter.set_limit(live0 + own + total + kv / 2);
        Ctx ctx;
        REQUIRE(ctx.create(m, p) == MOE_STATUS_RESOURCE_EXHAUSTED);
        const Refusal r = parse_refusal(ctx.message(), "allocating the KV cache");
        CHECK(r.asked == kv);
        CHECK(r.free == kv / 2);
        // The default budget sees the same free memory and says what it was made of.
        p.vram_budget = 0;
        REQUIRE(ctx.create(m, p) == MOE_STATUS_RESOURCE_EXHAUSTED);
        INFO(ctx.message());
        CHECK(ctx.message().find("default VRAM budget: " + std::to_string(total + kv / 2) + " bytes free") !=
              std::string::npos);
        CHECK(ctx.message().find(std::to_string(kv) + " for the KV cache") != std::string::npos);
    }
    meter.clear_hooks();
    CHECK(meter.live_bytes() == live0);
    REQUIRE(moe_kv_clear(other.get()) == MOE_STATUS_OK);
    CHECK(other.decode(tokens) == want);
    Ctx again;
    again.require(m, p);
    CHECK(again.decode(tokens) == want);
}

// A ubatch larger than any before, with no device memory to spare: the arena (or, once the arena is
// large enough, the upload slots of offloaded experts) cannot grow. The sequence stays where it was, the
// context decodes a smaller ubatch under the same limit, and the large one once memory is back, with
// the logits of a context that never failed; another context decodes as before.
void check_run_refusals(const Device& d) {
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "oom_run", rng(), options());
    if (!available(d, m)) return;
    DeviceMemoryMeter& meter = DeviceMemoryMeter::of(d.meter);
    HookGuard guard{meter};
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> small = random_tokens(rng, 4, nv), small2 = random_tokens(rng, 3, nv),
                               big = random_tokens(rng, 100, nv);
    const moe_sched_policy keep_host = policy("all=off"), offload = policy("all=16");
    // Experts in host RAM: with offload on, a large ubatch uploads them through the slot ring.
    const moe_context_params p = params(d, &offload, "exps=CPU");

    Ctx reference;  // never fails: small, small2, big
    reference.require(m, p);
    const std::vector<float> want_small = reference.decode(small);
    const std::vector<float> want_small2 = reference.decode(small2);
    const std::vector<float> want_big = reference.decode(big);
    Ctx other;
    other.require(m, p);
    CHECK(other.decode(small) == want_small);

    Ctx ctx;
    ctx.require(m, p);
    std::string what;
    SECTION("the activation arena") {
        what = "activation arena";
        CHECK(ctx.decode(small) == want_small);
    }
    SECTION("the upload slots") {
        what = "upload slots";
        // The large arena first, with nothing offloaded; then the same ubatch offloaded needs slots.
        REQUIRE(moe_context_set_policy(ctx.get(), &keep_host) == MOE_STATUS_OK);
        ctx.decode(big);
        REQUIRE(moe_context_set_policy(ctx.get(), &offload) == MOE_STATUS_OK);
        REQUIRE(moe_kv_clear(ctx.get()) == MOE_STATUS_OK);
        CHECK(ctx.decode(small) == want_small);
    }
    const uint64_t live0 = meter.live_bytes();
    meter.set_limit(live0);
    REQUIRE(ctx.try_decode(big) == MOE_STATUS_RESOURCE_EXHAUSTED);
    const Refusal r = parse_refusal(ctx.message(), d.kind == MOE_DEVICE_CUDA ? "allocating" : what);
    CHECK(r.asked > r.free);
    CHECK(ctx.n_past() == static_cast<int32_t>(small.size()));
    CHECK(meter.live_bytes() <= live0);  // what the failed run replaced is freed, nothing more held

    // Under the same limit: another context, and this one with a smaller ubatch.
    REQUIRE(moe_kv_clear(other.get()) == MOE_STATUS_OK);
    CHECK(other.decode(small) == want_small);
    CHECK(ctx.decode(small2) == want_small2);
    meter.clear_hooks();
    CHECK(ctx.decode(big) == want_big);
}

}  // namespace

TEST_CASE("a refused device allocation at creation falls back to more experts in host RAM", "[sched][oom]") {
    check_placement_fallback(kEmulated);
}

TEST_CASE("creation reports a refused budget or KV cache with the bytes asked and free", "[sched][oom]") {
    check_creation_refusals(kEmulated);
}

TEST_CASE("a ubatch the device cannot hold fails cleanly and smaller ones still run", "[sched][oom]") {
    check_run_refusals(kEmulated);
}

TEST_CASE("cuda: a refused device allocation at creation falls back to more experts in host RAM", "[gpu][oom]") {
    check_placement_fallback(kCuda);
}

TEST_CASE("cuda: creation reports a refused budget or KV cache with the bytes asked and free", "[gpu][oom]") {
    check_creation_refusals(kCuda);
}

TEST_CASE("cuda: a ubatch the device cannot hold fails cleanly and smaller ones still run", "[gpu][oom]") {
    check_run_refusals(kCuda);
}

#if MOEINFER_HAS_CUDA
// The driver's own refusal, no hook: a ballast buffer takes all but ~1 MiB of what the GPU has free, so
// cudaMalloc itself fails for the KV cache of a new context and for the arena of a larger ubatch in a
// live one. The messages are printed (the record of a real run); the live context decodes the large
// ubatch once the ballast is gone, with the logits of a context that never failed.
TEST_CASE("cuda: the driver's own out-of-memory at creation and at run", "[gpu][oom]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "oom_real", rng(), options());
    DeviceMemoryMeter& meter = DeviceMemoryMeter::of("cuda");
    const int32_t nv = m.info().n_vocab;
    const std::vector<int32_t> small = random_tokens(rng, 4, nv), big = random_tokens(rng, 1000, nv);
    const moe_sched_policy pol = policy();
    moe_context_params p = params(kCuda, &pol);
    p.n_ctx = 1024;
    p.n_ubatch = 1024;
    Ctx reference, ctx;
    reference.require(m, p);
    const std::vector<float> want_small = reference.decode(small), want_big = reference.decode(big);
    reference.free();
    ctx.require(m, p);
    CHECK(ctx.decode(small) == want_small);

    StatusOr<std::unique_ptr<moe::Backend>> dev = moe::cuda::CudaBackend::create(0);
    REQUIRE(dev.is_ok());
    std::unique_ptr<moe::Buffer> ballast;
    for (size_t spare = size_t{1} << 20; !ballast && spare < (size_t{1} << 30); spare *= 2) {
        const size_t free = (*dev)->free_memory();
        if (free <= spare) break;
        StatusOr<std::unique_ptr<moe::Buffer>> b = (*dev)->alloc_buffer(free - spare);
        if (b.is_ok()) ballast = std::move(b).value();
    }
    REQUIRE(ballast != nullptr);
    const uint64_t live0 = meter.live_bytes();

    moe_context_params large_kv = p;
    large_kv.n_ctx = 1 << 20;  // a KV cache of hundreds of MiB
    large_kv.vram_budget = weight_bytes(m, nullptr);
    Ctx refused;
    REQUIRE(refused.create(m, large_kv) == MOE_STATUS_RESOURCE_EXHAUSTED);
    WARN("creation: " << refused.message());
    if (refused.message().find("cannot allocate") != std::string::npos) {
        parse_refusal(refused.message(), "allocating");
    } else {
        // The driver's own memory for a new backend (its streams, events, cuBLAS's handle) may run out
        // first, how soon depending on the GPU and the driver: still RESOURCE_EXHAUSTED, saying so.
        INFO(refused.message());
        CHECK(refused.message().find("out of") != std::string::npos);
        CHECK(refused.message().find("memory") != std::string::npos);
    }
    CHECK(meter.live_bytes() == live0);

    REQUIRE(ctx.try_decode(big) == MOE_STATUS_RESOURCE_EXHAUSTED);
    WARN("run: " << ctx.message());
    const Refusal r = parse_refusal(ctx.message(), "allocating");
    CHECK(r.asked > r.free);
    CHECK(ctx.n_past() == static_cast<int32_t>(small.size()));
    CHECK(meter.live_bytes() <= live0);
    ballast.reset();
    CHECK(ctx.decode(big) == want_big);
}
#endif
