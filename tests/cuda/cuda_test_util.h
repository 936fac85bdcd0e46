// Helpers shared by the CUDA test files: the visible skip without a GPU, status checks, the run's
// seed, and a CUDA backend with device memory for hand-built graphs. Include only in CUDA builds.
#pragma once

#include <catch2/catch.hpp>

#include <deque>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "cuda/cuda_backend.h"

#define MOE_GPU_OR_SKIP()                          \
    do {                                           \
        if (moe::cuda::device_count() == 0) {      \
            WARN("skipped: no CUDA device");       \
            return;                                \
        }                                          \
    } while (0)

namespace moe::test {

inline void require_ok(const Status& s) {
    INFO(s.message());
    REQUIRE(s.is_ok());
}

// A fresh seed per process unless --rng-seed gives one; printed with every failure.
inline uint64_t run_seed() {
    static const uint64_t seed = Catch::rngSeed() != 0 ? Catch::rngSeed() : std::random_device{}();
    return seed;
}

inline std::mt19937_64 fresh_rng(uint64_t salt) { return std::mt19937_64(run_seed() * 0x9E3779B97F4A7C15ull + salt); }

inline std::vector<float> random_f32(std::mt19937_64& rng, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

// A CUDA backend of its own (so a test can toggle graphs or fusion) and the device memory it hands out.
class Device {
public:
    Device() {
        auto b = cuda::CudaBackend::create(0);
        require_ok(b.status());
        backend_ = std::move(b).value();
    }
    // A backend with the switches of `config` (backend options), not the environment's.
    explicit Device(const BackendConfig& config) {
        auto b = cuda::CudaBackend::create(0, config);
        require_ok(b.status());
        backend_ = std::move(b).value();
    }
    cuda::CudaBackend& be() { return static_cast<cuda::CudaBackend&>(*backend_); }

    void* alloc(size_t n) {
        auto buf = backend_->alloc_buffer(n);
        require_ok(buf.status());
        buffers_.push_back(std::move(buf).value());
        return buffers_.back()->data();
    }
    void upload(void* dst, const void* src, size_t n) {
        require_ok(backend_->copy_to_device(dst, src, n));
        require_ok(backend_->synchronize());
    }
    std::vector<uint8_t> download(const Tensor& t) {
        std::vector<uint8_t> out(t.n_bytes());
        require_ok(backend_->copy_to_host(out.data(), t.data, out.size()));
        require_ok(backend_->synchronize());
        return out;
    }
    // Fills t with NaN bytes, so that an output a run fails to write is caught.
    void poison(const Tensor& t) {
        const std::vector<uint8_t> nan(t.n_bytes(), 0xFF);
        upload(t.data, nan.data(), nan.size());
    }
    // A leaf with device data (a weight when `weight`), filled from `host` bytes when given.
    Tensor* leaf(Type type, std::initializer_list<int64_t> ne, const void* host, bool weight = true) {
        Tensor& t = leaves_.emplace_back();
        const std::vector<int64_t> v(ne);
        set_shape(t, type, static_cast<int>(v.size()), v.data());
        t.data = alloc(t.n_bytes());
        t.is_weight = weight;
        if (host != nullptr) upload(t.data, host, t.n_bytes());
        return &t;
    }

private:
    std::unique_ptr<Backend> backend_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    std::deque<Tensor> leaves_;
};

}  // namespace moe::test
