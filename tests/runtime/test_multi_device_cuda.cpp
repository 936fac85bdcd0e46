// CUDA contexts on any GPU of the machine and over several (layer split; docs/MULTI_GPU.md).
// CI (no GPU): the device list of a CUDA context as the runtime validates it, for machines of one and of
// two GPUs. [gpu] (one GPU is enough): an ordinal the machine lacks is INVALID_ARGUMENT naming it, and a
// backend makes its GPU current for its own calls only. [gpu][multi] (skipped visibly, "skipped: needs 2
// CUDA devices", with fewer): a context on GPU 1 gives GPU 0's logits bit for bit with its memory on GPU
// 1, and a 2-GPU layer split gives the one-GPU logits, with each layer's weights and KV cache on its GPU
// and the bytes crossing between the GPUs as predicted, its stages' results crossing by peer copy where
// the GPUs have peer access (peer_copies=auto) and through the host (peer_copies=staged).
//
// Bit for bit: both sides run the same kernels on the same shapes (the stage boundary changes no op's
// shape, and the residual stream crosses in F32 unchanged) with fusion off, as the one fused launch
// that would differ (a layer's last residual add with the next layer's RMS norm: one launch on one GPU,
// two across a boundary) sums the norm in another order; offload calibration off, as measured
// thresholds (one-device contexts only) would move offloaded ops. With fusion on, the tolerance of the
// other GPU tests (common/logits_check.h: rows_off).
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/logits_check.h"
#include "common/multi_device_context.h"
#include "common/tiny_model.h"
#include "moeinfer/moeinfer.h"
#include "runtime/multi_device.h"
#if MOEINFER_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"
#include "runtime/context.h"
#include "sched/placement.h"
#endif

TEST_CASE("a CUDA context's device list: any GPU of the machine, a missing one named", "[runtime][multi_device]") {
    moe_context_params p;
    moe_context_params_init(&p);
    std::vector<int32_t> devices = {1};
    p.devices = devices.data();
    p.n_devices = 1;
    // GPU 1 alone, then both in either order, on a machine of two.
    moe::StatusOr<moe::DeviceList> one = moe::device_list(p, MOE_DEVICE_CUDA, 2);
    INFO(one.status().message());
    REQUIRE(one.is_ok());
    CHECK(one->ordinals == std::vector<int>{1});
    devices = {1, 0};
    p.devices = devices.data();
    p.n_devices = 2;
    moe::StatusOr<moe::DeviceList> both = moe::device_list(p, MOE_DEVICE_CUDA, 2);
    INFO(both.status().message());
    REQUIRE(both.is_ok());
    CHECK(both->ordinals == std::vector<int>{1, 0});
    // -sm none -mg 1: the second of the list.
    devices = {0, 1};
    p.devices = devices.data();
    p.split_mode = MOE_SPLIT_NONE;
    p.main_gpu = 1;
    moe::StatusOr<moe::DeviceList> main = moe::device_list(p, MOE_DEVICE_CUDA, 2);
    REQUIRE(main.is_ok());
    CHECK(main->ordinals == std::vector<int>{1});
    // The same on a machine of one: GPU 1 is named, whichever field asks for it.
    const moe::Status missing = moe::device_list(p, MOE_DEVICE_CUDA, 1).status();
    CHECK(missing.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(missing.message().find("devices[1] = 1") != std::string::npos);
    CHECK(missing.message().find("cuda backend has 1 device(s)") != std::string::npos);
    p.split_mode = MOE_SPLIT_LAYER;
    p.main_gpu = 0;
    p.devices = nullptr;
    p.n_devices = 0;
    p.tensor_overrides = "blk\\.0\\.=CUDA1";
    const moe::Status pinned = moe::device_list(p, MOE_DEVICE_CUDA, 1).status();
    CHECK(pinned.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(pinned.message().find("CUDA1") != std::string::npos);
}

#if MOEINFER_HAS_CUDA
namespace {

using Model = moe::test::TinyModel;

// Whether the machine has `n` CUDA devices; prints the visible skip line when not.
bool have_gpus(int n) {
    const int found = moe::cuda::device_count();
    if (found >= n) return true;
    if (found == 0) {
        WARN("skipped: no CUDA device");
    } else {
        WARN("skipped: needs " << n << " CUDA devices (" << found << " found)");
    }
    return false;
}

int current_device() {
    int d = -1;
    REQUIRE(cudaGetDevice(&d) == cudaSuccess);
    return d;
}

// The GPU that device memory at p belongs to.
int device_of(const void* p) {
    cudaPointerAttributes a{};
    REQUIRE(cudaPointerGetAttributes(&a, p) == cudaSuccess);
    REQUIRE(a.type == cudaMemoryTypeDevice);
    return a.device;
}

using Setup = moe::test::DeviceSetup;
using moe::test::device_ordinals;

// A CUDA context's setup: ubatches of 32; offload calibration off (measured thresholds, of one-device
// contexts only, would move offloaded ops); CUDA fusion as asked; `more` backend options.
Setup cuda_setup(bool fusion, const std::string& more = "") {
    Setup s;
    s.device = MOE_DEVICE_CUDA;
    s.n_ubatch = 32;
    s.backend_options = std::string("offload_calibration=off") + (fusion ? "" : ",cuda_fusion=off") +
                        (more.empty() ? "" : "," + more);
    return s;
}

struct Ctx : moe::test::DeviceContext {
    Ctx(const Model& m, const Setup& s) : DeviceContext(m.get(), s), n_vocab(m.info().n_vocab) {}
    std::vector<float> decode(const std::vector<int32_t>& tokens) { return ApiContext::decode(tokens, n_vocab); }
    int32_t n_vocab;
};

moe::test::TinyModelOptions gpu_model(int32_t n_layer) {
    moe::test::TinyModelOptions o;
    o.head_dim = 64;  // the CUDA attention kernels cover 32..256
    o.n_layer = n_layer;
    return o;
}

// A prompt over two ubatches, decode steps, a batch on the tensor cores (17) and one on the GEMVs (5).
std::vector<std::vector<int32_t>> token_batches(std::mt19937& rng, int32_t n_vocab) {
    std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
    std::vector<std::vector<int32_t>> out;
    for (int n : {40, 1, 1, 17, 1, 5}) {
        std::vector<int32_t> t(static_cast<size_t>(n));
        for (auto& x : t) x = tok(rng);
        out.push_back(t);
    }
    return out;
}

}  // namespace
#endif

TEST_CASE("a CUDA device the machine lacks is INVALID_ARGUMENT naming it", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
#else
    if (!have_gpus(1)) return;
    const int n = moe::cuda::device_count();
    const moe::Status created = moe::cuda::CudaBackend::create(n).status();
    CHECK(created.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(created.message().find("CUDA device " + std::to_string(n)) != std::string::npos);
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_cuda_missing", rng(), gpu_model(2));
    for (const std::vector<int32_t>& devices : {std::vector<int32_t>{n}, std::vector<int32_t>{0, n}}) {
        moe_context_params p;
        moe_context_params_init(&p);
        p.n_ctx = 64;
        p.device = MOE_DEVICE_CUDA;
        p.devices = devices.data();
        p.n_devices = static_cast<int32_t>(devices.size());
        moe_context* ctx = nullptr;
        const moe_status st = moe_context_create(m.get(), &p, &ctx);
        const std::string err = moe_last_error();
        INFO(err);
        CHECK(st == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(ctx == nullptr);
        const std::string field = "devices[" + std::to_string(devices.size() - 1) + "] = " + std::to_string(n);
        CHECK(err.find(field) != std::string::npos);
    }
#endif
}

TEST_CASE("a CUDA backend makes its GPU current for its own calls only", "[gpu]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
#else
    if (!have_gpus(1)) return;
    // The last GPU's backend driven while the caller has GPU 0 current (on one GPU both are GPU 0), from
    // this thread and from a fresh one: its memory and copies are on its GPU, the caller's device stays.
    const int last = moe::cuda::device_count() - 1;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    auto created = moe::cuda::CudaBackend::create(last);
    INFO(created.status().message());
    REQUIRE(created.is_ok());
    std::unique_ptr<moe::Backend> be = std::move(created).value();
    CHECK(current_device() == 0);
    // Catch's assertions are for the main thread only: the round trip reports what went wrong in words.
    auto round_trip = [&be, last](uint32_t salt) -> std::string {
        constexpr size_t kN = 2048;
        std::vector<float> in(2 * kN), out(kN, 0.0f);
        std::mt19937 rng(salt);
        for (float& x : in) x = std::uniform_real_distribution<float>(-1, 1)(rng);
        auto buf = be->alloc_buffer(3 * kN * sizeof(float));
        if (!buf.is_ok()) return buf.status().message();
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, (*buf)->data()) != cudaSuccess || attr.device != last) {
            return "the buffer is not on GPU " + std::to_string(last);
        }
        // An ADD on the device: the kernel runs on the backend's GPU whatever the caller's current one is.
        moe::Tensor a, b, sum;
        const int64_t ne[1] = {static_cast<int64_t>(kN)};
        for (moe::Tensor* t : {&a, &b, &sum}) moe::set_shape(*t, moe::Type::F32, 1, ne);
        float* base = static_cast<float*>((*buf)->data());
        a.data = base;
        b.data = base + kN;
        sum.data = base + 2 * kN;
        sum.op = moe::Op::ADD;
        sum.src[0] = &a;
        sum.src[1] = &b;
        moe::Tensor* nodes[] = {&sum};
        moe::Status st = be->copy_to_device(a.data, in.data(), in.size() * sizeof(float));
        if (st.is_ok()) st = be->compute(nodes);
        if (st.is_ok()) st = be->copy_to_host(out.data(), sum.data, kN * sizeof(float));
        if (st.is_ok()) st = be->synchronize();
        if (!st.is_ok()) return st.message();
        for (size_t i = 0; i < kN; ++i) {
            if (out[i] != in[i] + in[kN + i]) return "sum " + std::to_string(i) + " is wrong";  // one F32 add: exact
        }
        return be->free_memory() > 0 ? "" : "no free memory reported";
    };
    CHECK(round_trip(1).empty());
    CHECK(current_device() == 0);
    int thread_device = -1;
    std::string thread_error;
    std::thread t([&] {
        thread_error = round_trip(2);
        (void)cudaGetDevice(&thread_device);
    });
    t.join();
    CHECK(thread_error.empty());
    CHECK(thread_device == 0);  // a fresh thread starts on GPU 0 and is left there
    be.reset();  // the destructor too
    CHECK(current_device() == 0);
#endif
}

TEST_CASE("a CUDA context on GPU 1 gives GPU 0's logits bit for bit", "[gpu][multi]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: needs 2 CUDA devices (this build has no CUDA backend)");
#else
    if (!have_gpus(2)) return;
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_cuda_gpu1", rng(), gpu_model(4));
        const auto batches = token_batches(rng, m.info().n_vocab);
        for (const char* ot : {static_cast<const char*>(nullptr), "exps=CPU"}) {
            INFO(arch << " -ot " << (ot ? ot : "(none)"));
            Setup s0 = cuda_setup(true);  // one device each: the same launches on both
            s0.devices = {0};  // named: without a list the default takes the GPU with the most free memory
            s0.overrides = ot;
            s0.offload = ot != nullptr ? "all=4" : nullptr;
            Setup s1 = s0;
            s1.devices = {1};
            Setup mg = s0;  // -dev CUDA0,CUDA1 -sm none -mg 1
            mg.devices = {0, 1};
            mg.split_mode = MOE_SPLIT_NONE;
            mg.main_gpu = 1;
            Ctx c0(m, s0), c1(m, s1), cm(m, mg);
            for (const Ctx* c : {&c1, &cm}) {
                REQUIRE(c->ctx->parts.empty());
                CHECK(device_of(c->ctx->device_weights->data()) == 1);
                CHECK(device_of(c->ctx->kv.k[0]->data) == 1);
            }
            CHECK(device_of(c0.ctx->device_weights->data()) == 0);
            for (const auto& b : batches) {
                const std::vector<float> want = c0.decode(b);
                REQUIRE(moe::test::bitwise_equal(c1.decode(b), want));
                REQUIRE(moe::test::bitwise_equal(cm.decode(b), want));
            }
            const moe_sched_stats a = c0.stats(), b = c1.stats();
            CHECK(b.weights_device_bytes == a.weights_device_bytes);
            CHECK(b.bytes_weights_full + b.bytes_weights_experts == a.bytes_weights_full + a.bytes_weights_experts);
        }
    }
#endif
}

TEST_CASE("a 2-GPU layer split gives the one-GPU logits", "[gpu][multi]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: needs 2 CUDA devices (this build has no CUDA backend)");
#else
    if (!have_gpus(2)) return;
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        Model m(arch, "moe_cuda_split", rng(), gpu_model(4));  // 1:1 and 3:1 both leave layers on each GPU
        const int64_t n_embd = m.info().n_embd;
        const auto batches = token_batches(rng, m.info().n_vocab);
        struct Case {
            std::vector<int32_t> devices;
            std::vector<float> split;
            const char* ot;
            int32_t copy;
            const char* offload;
            bool fusion;
        };
        const Case cases[] = {
            {{0, 1}, {1, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr, false},
            {{0, 1}, {3, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr, false},
            {{1, 0}, {1, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr, false},  // CUDA0 of the list is GPU 1
            {{0, 1}, {1, 1}, "exps=CPU", MOE_EXPERT_COPY_FULL, "all=4", false},
            {{0, 1}, {1, 1}, "exps=CPU", MOE_EXPERT_COPY_ACTIVE_ONLY, "all=4", false},
            {{0, 1}, {3, 1}, "exps=CPU", MOE_EXPERT_COPY_ACTIVE_ONLY, nullptr, false},
            // Layer 0 pinned to the second GPU: stages on GPUs 1, 0, 1 (two boundaries).
            {{0, 1}, {1, 1}, "exps=CPU,blk\\.0\\.=CUDA1", MOE_EXPERT_COPY_ACTIVE_ONLY, "all=4", false},
            {{0, 1}, {1, 1}, nullptr, MOE_EXPERT_COPY_AUTO, nullptr, true},
            {{0, 1}, {1, 1}, "exps=CPU", MOE_EXPERT_COPY_ACTIVE_ONLY, "all=4", true},
        };
        for (const Case& k : cases) {
            INFO(arch << " devices " << k.devices[0] << "," << k.devices[1] << " split " << k.split[0] << ":" << k.split[1]
                      << " -ot " << (k.ot ? k.ot : "(none)") << " copy " << k.copy << " offload "
                      << (k.offload ? k.offload : "(default)") << " fusion " << k.fusion);
            const bool pinned = k.ot != nullptr && std::string(k.ot).find("CUDA1") != std::string::npos;
            Setup one = cuda_setup(k.fusion);
            one.overrides = pinned ? "exps=CPU" : k.ot;  // the same placement on one GPU
            one.expert_copy = k.copy;
            one.offload = k.offload;
            // Each split crossing by peer copies where the GPUs have peer access (auto), and through the
            // host (staged).
            Setup two = cuda_setup(k.fusion), staged = cuda_setup(k.fusion, "peer_copies=staged");
            for (Setup* t : {&two, &staged}) {
                t->overrides = k.ot;
                t->expert_copy = k.copy;
                t->offload = k.offload;
                t->devices = k.devices;
                t->split = k.split;
            }
            Ctx a(m, one), b(m, two), st(m, staged);
            for (const Ctx* split_ctx : {&b, &st}) {
                const moe_context& ctx = *split_ctx->ctx;
                REQUIRE(ctx.parts.size() == 2);
                REQUIRE(ctx.parts[0].n_layers > 0);
                REQUIRE(ctx.parts[1].n_layers > 0);
                // Each layer's weights in device memory and its KV cache on its GPU.
                for (const moe::Tensor& t : ctx.weight_tensors) {
                    const int layer = moe::sched::layer_of(t.name);
                    if (!t.is_weight || layer < 0) continue;
                    const std::optional<moe::sched::WeightCopies> c = moe::weight_copies(ctx, &t);
                    REQUIRE(c);
                    if (c->device == nullptr) continue;  // in host RAM (exps=CPU)
                    INFO(t.name);
                    CHECK(device_of(c->device) == k.devices[static_cast<size_t>(ctx.layer_device[static_cast<size_t>(layer)])]);
                }
                for (size_t il = 0; il < ctx.layer_device.size(); ++il) {
                    CHECK(device_of(ctx.kv.k[il]->data) == k.devices[static_cast<size_t>(ctx.layer_device[il])]);
                }
            }
            // Peer access as the driver reports it, for the GPUs of consecutive stages only; none when staged.
            const std::vector<int>& layer_device = b.ctx->layer_device;
            const auto gpu = [&k](int index) { return k.devices[static_cast<size_t>(index)]; };
            int64_t boundaries = 0, peer_boundaries = 0;
            for (size_t il = 1; il < layer_device.size(); ++il) {
                const int from = layer_device[il - 1], to = layer_device[il];
                if (from == to) continue;
                int can = 0;
                REQUIRE(cudaDeviceCanAccessPeer(&can, gpu(to), gpu(from)) == cudaSuccess);
                CHECK(b.ctx->parts[static_cast<size_t>(to)].peer[static_cast<size_t>(from)] == (can != 0 ? 1 : 0));
                CHECK(st.ctx->parts[static_cast<size_t>(to)].peer[static_cast<size_t>(from)] == 0);
                ++boundaries;
                peer_boundaries += can != 0 ? 1 : 0;
            }
            CHECK(boundaries == (pinned ? 2 : 1));
            WARN(peer_boundaries << " of " << boundaries << " boundaries with peer access");
            int64_t tokens = 0;
            size_t off = 0, rows = 0;
            for (const auto& batch : batches) {
                const std::vector<float> want = a.decode(batch);
                for (Ctx* c : {&b, &st}) {
                    const std::vector<float> got = c->decode(batch);
                    if (k.fusion) {
                        off += moe::test::rows_off(got, want, m.info().n_vocab);
                        rows += batch.size();
                    } else {
                        REQUIRE(moe::test::bitwise_equal(got, want));
                    }
                }
                tokens += static_cast<int64_t>(batch.size());
            }
            INFO(off << " of " << rows << " rows outside the bound");
            CHECK(off * 10 <= rows);
            // Each boundary between consecutive layers on different GPUs: the residual stream
            // [n_embd, tokens] F32 out of one and into the other through the host, or once by peer copy
            // (through the host still where a stage ended on the host: experts in RAM at a small batch).
            const uint64_t once = static_cast<uint64_t>(4 * n_embd * tokens);
            const moe_sched_stats sa = a.stats(), sb = b.stats(), ss = st.stats();
            CHECK(ss.bytes_between_devices == static_cast<uint64_t>(boundaries) * 2 * once);
            const uint64_t least = static_cast<uint64_t>(2 * boundaries - peer_boundaries) * once;
            if (k.ot == nullptr) {
                CHECK(sb.bytes_between_devices == least);
            } else {
                CHECK(sb.bytes_between_devices >= least);
                CHECK(sb.bytes_between_devices <= static_cast<uint64_t>(boundaries) * 2 * once);
            }
            CHECK(sa.bytes_between_devices == 0);
            for (const moe_sched_stats& sx : {sb, ss}) {
                CHECK(sx.n_ubatches == sa.n_ubatches);
                CHECK(sx.weights_device_bytes == sa.weights_device_bytes);
                CHECK(sx.weights_host_bytes == sa.weights_host_bytes);
                CHECK(sx.bytes_weights_full + sx.bytes_weights_experts == sa.bytes_weights_full + sa.bytes_weights_experts);
            }
        }
    }
#endif
}

TEST_CASE("upload relays: a 2-GPU hybrid context gives the same logits with part of its uploads through the other GPU",
          "[gpu][multi]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: needs 2 CUDA devices (this build has no CUDA backend)");
#else
    if (!have_gpus(2)) return;
    int can = 0;
    REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
    if (!can) {
        WARN("skipped: GPUs 0 and 1 have no peer access");
        return;
    }
    std::mt19937 rng(std::random_device{}());
    for (const char* arch : {"qwen3moe", "gpt-oss"}) {
        // Expert matrices of 4.5 MB (8 experts of 1024 x 512 at Q8_0): above the share's 1 MiB, so every
        // whole-matrix upload is split between the links.
        moe::test::TinyModelOptions o = gpu_model(4);
        o.n_embd = 1024;
        o.n_ff_expert = 512;
        Model m(arch, "moe_cuda_relay", rng(), o);
        const auto batches = token_batches(rng, m.info().n_vocab);
        Setup off = cuda_setup(false, "upload_relay=off"), on = cuda_setup(false, "upload_relay=on");
        for (Setup* t : {&off, &on}) {
            t->overrides = "exps=CPU";
            t->expert_copy = MOE_EXPERT_COPY_FULL;
            t->offload = "all=4";
            t->devices = {0, 1};
            t->split = {1, 1};
        }
        INFO(arch);
        Ctx a(m, off), b(m, on);
        REQUIRE(b.ctx->parts.size() == 2);
        CHECK(b.ctx->parts[0].relay == std::vector<uint8_t>{0, 1});
        CHECK(b.ctx->parts[1].relay == std::vector<uint8_t>{1, 0});
        CHECK(a.ctx->parts[0].relay == std::vector<uint8_t>{0, 0});
        for (const auto& batch : batches) REQUIRE(moe::test::bitwise_equal(b.decode(batch), a.decode(batch)));
        for (int32_t d = 0; d < 2; ++d) {
            moe_sched_stats sa{}, sb{};
            sa.struct_size = sb.struct_size = sizeof sa;
            REQUIRE(moe_context_get_device_stats(a.ctx, d, &sa) == MOE_STATUS_OK);
            REQUIRE(moe_context_get_device_stats(b.ctx, d, &sb) == MOE_STATUS_OK);
            const uint64_t uploaded = sb.bytes_weights_full + sb.bytes_weights_experts;
            INFO("GPU " << d << ": " << sb.bytes_weights_relayed << " of " << uploaded << " bytes relayed");
            CHECK(uploaded == sa.bytes_weights_full + sa.bytes_weights_experts);
            CHECK(sa.bytes_weights_relayed == 0);
            // About half of the expert matrices' bytes; the small uploads (norms, biases) stay on the own link.
            CHECK(sb.bytes_weights_relayed * 10 >= uploaded * 3);
            CHECK(sb.bytes_weights_relayed * 10 <= uploaded * 6);
        }
    }
#endif
}

TEST_CASE("the several-device default on two GPUs: one while the model fits, the freest first, both when needed",
          "[gpu][multi]") {
#if !MOEINFER_HAS_CUDA
    WARN("skipped: needs 2 CUDA devices (this build has no CUDA backend)");
#else
    if (!have_gpus(2)) return;
    std::mt19937 rng(std::random_device{}());
    Model m("qwen3moe", "moe_cuda_default", rng(), gpu_model(4));
    const auto batches = token_batches(rng, m.info().n_vocab);
    Setup gpu0 = cuda_setup(false);  // fusion off: a layer boundary between GPUs changes no sums
    gpu0.devices = {0};
    Ctx reference(m, gpu0);
    std::vector<std::vector<float>> want;
    for (const auto& b : batches) want.push_back(reference.decode(b));
    const moe_sched_stats ref = reference.stats();
    const uint64_t total = ref.weights_device_bytes;
    // Equal budgets: GPU 0 first; the whole model fits it (a one-device context), 60% of it needs both.
    for (const uint64_t budget : {total, total * 3 / 5}) {
        INFO("budget " << budget << " of " << total);
        Setup s = cuda_setup(false);
        s.vram_budget = budget;
        Ctx c(m, s);
        if (budget == total) {
            CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0});
        } else {
            CHECK(device_ordinals(c.ctx) == std::vector<int32_t>{0, 1});
            CHECK(c.stats().weights_host_bytes == 0);
        }
        for (size_t i = 0; i < batches.size(); ++i) {
            REQUIRE(moe::test::bitwise_equal(c.decode(batches[i]), want[i]));
        }
        CHECK(c.stats().weights_device_bytes == ref.weights_device_bytes);
    }
    // The default budget: 2 GiB held on GPU 0 leave GPU 1 the freer, which takes the model alone.
    auto created = moe::cuda::CudaBackend::create(0);
    REQUIRE(created.is_ok());
    std::unique_ptr<moe::Backend> holder = std::move(created).value();
    moe::StatusOr<std::unique_ptr<moe::Buffer>> ballast = holder->alloc_buffer(size_t{2} << 30);
    REQUIRE(ballast.is_ok());
    Ctx freest(m, cuda_setup(false));
    CHECK(device_ordinals(freest.ctx) == std::vector<int32_t>{1});
    CHECK(device_of(freest.ctx->device_weights->data()) == 1);
    for (size_t i = 0; i < batches.size(); ++i) REQUIRE(moe::test::bitwise_equal(freest.decode(batches[i]), want[i]));
#endif
}
