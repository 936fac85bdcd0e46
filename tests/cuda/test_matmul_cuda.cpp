// CUDA matrix products (MUL_MAT, MUL_MAT_ID, MOE_UP_GATE) against the CPU backend's kernels
// (moe::cpu::mul_mat etc.) run on the same inputs: every weight type, batches on both sides of the
// GEMV / tensor-core switch, odd row counts, experts that get no tokens, B = 1 and B = n_used.
//
// Tolerances, per output element, with mag = sum_k |w_k x_k| (dequantised weights, F32 activations)
// and qerr = the bound of the CPU's own error from quantising activations to Q8 for quantised weights
// (sum over blocks of sum|w| * amax(x) / 127 / 2, blocks of 32 values, of 256 for the super-block
// types, whose CPU kernels take Q8K activations; 0 for float weights):
// - GEMV path (<= 8 rows / tokens): the GPU quantises activations exactly as the CPU does and sums
//   the same integer block dots, or multiplies F32 activations by exact weights (float types): 2e-5 mag
//   + qerr. The decoded types Q4_1 .. IQ4_XS dot integer groups against activations quantised per 32
//   (the CPU's K-quant kernels quantise per 256): + the bound of that rounding, qerr_gemv.
// - Tensor-core path (BF16 weights and activations, F32 accumulation): 1e-2 mag + qerr.
// - F32 weights of MUL_MAT with more than 8 rows run cuBLAS in FP32: 1e-4 mag (F32 experts take the
//   tensor-core path).
// MOE_UP_GATE propagates the bounds tu, tg of u and g through the activation: |d out/d g| <= 1.1
// (|u| + tu + [1 for SWIGLU_OAI]) and |d out/d u| <= |g| + tg, with 20% margin.
//
// Perf mode (MOEINFER_GPU_PERF=1): the Q30 and G20 expert shapes and one dense shape, median of 10
// event-timed runs after warm-up; GB/s of weights read at T = 1, TFLOP/s at T = 512 and 4096.
#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

// For the event listener that releases the shared GPU state when the run ends.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/quant_decode.h"
#include "core/tensor.h"
#include "core/types.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.cuh"

namespace {

using moe::Activation;
using moe::Op;
using moe::Tensor;
using moe::Type;

#define CUDA_REQUIRE(call)                                   \
    do {                                                     \
        const cudaError_t cuda_err_ = (call);                \
        INFO(#call << ": " << cudaGetErrorString(cuda_err_)); \
        REQUIRE(cuda_err_ == cudaSuccess);                   \
    } while (0)

const Type kAllTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4};
const moe::ExpertGemmDecode kDefaultDecode = moe::BackendConfig{}.expert_gemm_decode;
// The types the CUDA kernels decode with core/quant_decode.h (the [decoded] cases).
const Type kDecodedTypes[] = {Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::Q2_K,
                              Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::IQ4_XS};

// ---- the device side ----

struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
};
using DevMem = std::unique_ptr<void, CudaFree>;

DevMem dev_alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    INFO("cudaMalloc(" << bytes << "): " << cudaGetErrorString(err));
    REQUIRE(err == cudaSuccess);
    return DevMem(p);
}

// One stream, cuBLAS handle, error word and grow-only scratch for all test cases. Released when the
// test run ends (GpuEnvRelease below), not by a static destructor: the CUDA runtime may already be gone
// when those run, and compute-sanitizer's leak check would report a handle never released.
class GpuEnv {
public:
    static GpuEnv& get() {
        if (instance() == nullptr) instance() = new GpuEnv();
        return *instance();
    }
    static void release() {
        delete instance();
        instance() = nullptr;
    }
    ~GpuEnv() {
        if (stream_ != nullptr) cudaStreamSynchronize(stream_);
        scratch_.reset();
        if (cublas_ != nullptr) cublasDestroy(cublas_);
        if (flags_host_ != nullptr) cudaFreeHost(flags_host_);
        if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    GpuEnv(const GpuEnv&) = delete;
    GpuEnv& operator=(const GpuEnv&) = delete;

    moe::cuda::OpContext ctx(size_t scratch_bytes, moe::ExpertGemmDecode decode) {
        if (scratch_bytes > scratch_size_) {
            CUDA_REQUIRE(cudaStreamSynchronize(stream_));
            scratch_.reset();
            scratch_ = dev_alloc(scratch_bytes);
            scratch_size_ = scratch_bytes;
        }
        moe::cuda::OpContext c;
        c.stream = stream_;
        c.cublas = cublas_;
        c.scratch = scratch_.get();
        c.scratch_size = scratch_size_;
        c.error_flags = flags_dev_;
        c.expert_decode = decode;
        c.kquant_gemv = kquant_gemv;
        c.float_gemv = float_gemv;
        c.n_sm = n_sm;
        return c;
    }
    // The decoded types' GEMV kernel and the multiprocessor count (0: unknown, no grid sizing by
    // occupancy) of the contexts ctx() makes; GemvKnobs sets them for a scope.
    moe::KquantGemv kquant_gemv = moe::BackendConfig{}.kquant_gemv;
    int n_sm = 0;
    // The dense float-weight GEMV kernel of the contexts ctx() makes (the perf mode times both).
    moe::FloatGemv float_gemv = moe::BackendConfig{}.float_gemv;
    cudaStream_t stream() const { return stream_; }
    // Synchronises, then returns and clears the error word.
    unsigned int take_flags() {
        CUDA_REQUIRE(cudaStreamSynchronize(stream_));
        const unsigned int v = *reinterpret_cast<volatile unsigned int*>(flags_host_);
        *flags_host_ = 0;
        return v;
    }

private:
    GpuEnv() {
        CUDA_REQUIRE(cudaSetDevice(0));
        CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        REQUIRE(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS);
        void* flags = nullptr;
        CUDA_REQUIRE(cudaHostAlloc(&flags, sizeof(unsigned int), cudaHostAllocMapped));
        flags_host_ = static_cast<unsigned int*>(flags);
        *flags_host_ = 0;
        void* dev = nullptr;
        CUDA_REQUIRE(cudaHostGetDevicePointer(&dev, flags, 0));
        flags_dev_ = static_cast<unsigned int*>(dev);
    }
    static GpuEnv*& instance() {
        static GpuEnv* env = nullptr;
        return env;
    }
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    unsigned int* flags_host_ = nullptr;
    unsigned int* flags_dev_ = nullptr;
    DevMem scratch_;
    size_t scratch_size_ = 0;
};

struct GpuEnvRelease : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    void testRunEnded(const Catch::TestRunStats&) override { GpuEnv::release(); }
};
CATCH_REGISTER_LISTENER(GpuEnvRelease)

// ---- host data ----

std::mt19937& rng() {
    static std::mt19937 g(Catch::rngSeed() + 4242u);
    return g;
}

// Normal values whose magnitude changes from block to block (2^-3 .. 2^3), so block scales differ.
std::vector<float> random_floats(int64_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-3.0f, 3.0f);
    std::vector<float> v(static_cast<size_t>(n));
    float scale = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) scale = std::exp2(expo(rng()));
        v[static_cast<size_t>(i)] = normal(rng()) * scale;
    }
    return v;
}

struct HostTensor {
    Tensor t;
    std::vector<uint8_t> bytes;
};

HostTensor make_tensor(Type type, std::initializer_list<int64_t> shape) {
    HostTensor h;
    moe::set_shape(h.t, type, static_cast<int>(shape.size()), shape.begin());
    h.bytes.resize(h.t.nb[3] * static_cast<size_t>(h.t.ne[3]));
    h.t.data = h.bytes.data();
    return h;
}

// Weights through the reference quantiser, plus edge cases files may hold: Q8_0 values of -128 and
// MXFP4 scales at the ends of the e8m0 range.
HostTensor random_weights(Type type, int64_t k, int64_t n, int64_t e = 1) {
    HostTensor h = e > 1 ? make_tensor(type, {k, n, e}) : make_tensor(type, {k, n});
    const std::vector<float> f = random_floats(k * n * e);
    moe::traits(type).from_float(f.data(), h.bytes.data(), k * n * e);
    std::uniform_int_distribution<int> pick(0, 99);
    const int64_t n_blocks = k * n * e / 32;
    if (type == Type::Q8_0) {
        auto* b = reinterpret_cast<moe::BlockQ8_0*>(h.bytes.data());
        for (int64_t i = 0; i < n_blocks; ++i) {
            if (pick(rng()) < 3) b[i].qs[pick(rng()) % 32] = -128;
        }
    }
    if (type == Type::MXFP4) {
        auto* b = reinterpret_cast<moe::BlockMXFP4*>(h.bytes.data());
        const uint8_t extremes[] = {0, 1, 2, 3, 150};
        for (int64_t i = 0; i < n_blocks; ++i) {
            if (pick(rng()) < 2) b[i].e = extremes[pick(rng()) % 5];
        }
    }
    return h;
}

HostTensor random_acts(std::initializer_list<int64_t> shape) {
    HostTensor h = make_tensor(Type::F32, shape);
    const std::vector<float> f = random_floats(h.t.n_elements());
    std::memcpy(h.bytes.data(), f.data(), f.size() * sizeof(float));
    return h;
}

// ids [n_used, T]: per token n_used distinct experts drawn from `allowed`.
HostTensor random_ids(int64_t n_used, int64_t n_tokens, const std::vector<int32_t>& allowed) {
    HostTensor h = make_tensor(Type::I32, {n_used, n_tokens});
    auto* v = reinterpret_cast<int32_t*>(h.bytes.data());
    std::vector<int32_t> pool = allowed;
    for (int64_t t = 0; t < n_tokens; ++t) {
        std::shuffle(pool.begin(), pool.end(), rng());
        for (int64_t j = 0; j < n_used; ++j) v[t * n_used + j] = pool[static_cast<size_t>(j) % pool.size()];
    }
    return h;
}

HostTensor random_bias(int64_t f, int64_t e) {
    HostTensor h = make_tensor(Type::F32, {f, e});
    std::normal_distribution<float> normal(0.0f, 0.5f);
    for (int64_t i = 0; i < f * e; ++i) reinterpret_cast<float*>(h.bytes.data())[i] = normal(rng());
    return h;
}

// Dequantised weight rows [E][N][K].
std::vector<float> dequant_all(const HostTensor& w) {
    const int64_t k = w.t.ne[0];
    const int64_t rows = w.t.ne[1] * w.t.ne[2];
    std::vector<float> out(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r) {
        moe::traits(w.t.type).to_float(w.t.row(r % w.t.ne[1], r / w.t.ne[1]), out.data() + r * k, k);
    }
    return out;
}

// ---- reference bounds ----

struct DotRef {
    double value;     // float64 dot
    double mag;       // sum |w x|
    double qerr;      // the CPU's activation-quantisation bound (quantised weights only)
    double qerr_gemv; // the GPU GEMV's own, where it quantises otherwise: per 32 for the decoded types
};

// sum over blocks of qb values of sum|w| * amax(x) / 127 / 2: the error of a dot with x rounded to Q8
// blocks of qb values (|x - dx xq| <= dx / 2, dx = amax / 127).
double q8_bound(const float* w, const float* x, int64_t k, int64_t qb) {
    double bound = 0.0;
    for (int64_t b = 0; b < k / qb; ++b) {
        double wsum = 0.0, amax = 0.0;
        for (int64_t j = 0; j < qb; ++j) {
            wsum += std::fabs(static_cast<double>(w[b * qb + j]));
            amax = std::max(amax, std::fabs(static_cast<double>(x[b * qb + j])));
        }
        bound += wsum * amax / 127.0 * 0.5 * (1.0 + 1e-4);
    }
    return bound;
}

DotRef dot_ref(Type type, const float* w, const float* x, int64_t k) {
    DotRef r{0.0, 0.0, 0.0, 0.0};
    for (int64_t i = 0; i < k; ++i) {
        const double p = static_cast<double>(w[i]) * x[i];
        r.value += p;
        r.mag += std::fabs(p);
    }
    if (moe::is_quantized(type)) {
        // The CPU quantises activations per 32 values, per 256 (Q8K) for the super-block types.
        r.qerr = q8_bound(w, x, k, moe::traits(type).block_size == 256 ? 256 : 32);
    }
    // The GPU's GEMV dots the decoded types' integer groups against activations quantised per 32
    // (core/quant_decode_dot.h): its own rounding, on top of the CPU's.
    if (moe::qd::decodes(type)) r.qerr_gemv = q8_bound(w, x, k, 32);
    return r;
}

enum class Path { kGemv, kTensorCore, kFp32Blas };

// Expert products (dense == false) of F32 weights use the tensor-core kernel like every other type.
Path path_of(Type type, int64_t cols, bool dense) {
    if (cols <= 8) return Path::kGemv;
    return dense && type == Type::F32 ? Path::kFp32Blas : Path::kTensorCore;
}

double dot_tol(const DotRef& r, Path path) {
    switch (path) {
        case Path::kGemv: return 2e-5 * r.mag + r.qerr + r.qerr_gemv + 1e-30;
        case Path::kTensorCore: return 1e-2 * r.mag + r.qerr + 1e-30;
        case Path::kFp32Blas: return 1e-4 * r.mag + 1e-30;
    }
    return 0.0;
}

// ---- running a node on both backends ----

struct Outputs {
    std::vector<float> cpu;
    std::vector<float> gpu;
    unsigned int flags = 0;
};

moe::Status run_cpu_node(Tensor& node) {
    static moe::cpu::Scratch scratch;
    switch (node.op) {
        case Op::MUL_MAT: return moe::cpu::mul_mat(node, scratch);
        case Op::MUL_MAT_ID: return moe::cpu::mul_mat_id(node, scratch);
        default: return moe::cpu::moe_up_gate(node, scratch);
    }
}

moe::Status run_gpu_node(Tensor& node, const moe::cuda::OpContext& ctx) {
    switch (node.op) {
        case Op::MUL_MAT: return moe::cuda::mul_mat(node, ctx);
        case Op::MUL_MAT_ID: return moe::cuda::mul_mat_id(node, ctx);
        default: return moe::cuda::moe_up_gate(node, ctx);
    }
}

// Runs op(srcs) on the CPU (unless run_cpu is false) and on the GPU (sources uploaded, dst poisoned
// with NaN first so that unwritten outputs fail), the GPU's decoded expert products as `decode` says.
Outputs run_both(Op op, const std::vector<const HostTensor*>& srcs, std::initializer_list<int64_t> dst_shape,
                 const moe::OpParams& params, bool run_cpu = true, moe::ExpertGemmDecode decode = kDefaultDecode) {
    Outputs out;
    HostTensor dst = make_tensor(Type::F32, dst_shape);
    Tensor node = dst.t;
    node.op = op;
    node.params = params;
    for (size_t i = 0; i < srcs.size(); ++i) node.src[i] = srcs[i] != nullptr ? const_cast<Tensor*>(&srcs[i]->t) : nullptr;
    const size_t n_out = static_cast<size_t>(dst.t.n_elements());
    if (run_cpu) {
        std::fill(reinterpret_cast<float*>(dst.bytes.data()), reinterpret_cast<float*>(dst.bytes.data()) + n_out,
                  std::numeric_limits<float>::quiet_NaN());
        const moe::Status s = run_cpu_node(node);
        INFO("cpu: " << s.message());
        REQUIRE(s.is_ok());
        out.cpu.assign(reinterpret_cast<const float*>(dst.bytes.data()),
                       reinterpret_cast<const float*>(dst.bytes.data()) + n_out);
    }

    GpuEnv& env = GpuEnv::get();
    std::vector<DevMem> mems;
    std::vector<Tensor> dev_srcs(srcs.size());
    Tensor gnode = node;
    for (size_t i = 0; i < srcs.size(); ++i) {
        if (srcs[i] == nullptr) continue;
        mems.push_back(dev_alloc(srcs[i]->bytes.size()));
        CUDA_REQUIRE(cudaMemcpy(mems.back().get(), srcs[i]->bytes.data(), srcs[i]->bytes.size(), cudaMemcpyHostToDevice));
        dev_srcs[i] = srcs[i]->t;
        dev_srcs[i].data = mems.back().get();
        gnode.src[i] = &dev_srcs[i];
    }
    DevMem ddst = dev_alloc(dst.bytes.size());
    CUDA_REQUIRE(cudaMemset(ddst.get(), 0xFF, dst.bytes.size()));  // NaN
    gnode.data = ddst.get();
    const moe::cuda::OpContext ctx = env.ctx(moe::cuda::matmul_scratch_bytes(gnode, decode), decode);
    const moe::Status s = run_gpu_node(gnode, ctx);
    INFO("gpu: " << s.message());
    REQUIRE(s.is_ok());
    out.flags = env.take_flags();
    out.gpu.resize(n_out);
    CUDA_REQUIRE(cudaMemcpy(out.gpu.data(), ddst.get(), n_out * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

// Counts outputs outside their tolerance (NaN included), reports the first few and the worst ratio.
void compare(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& cpu,
             const std::vector<double>& tol) {
    REQUIRE(gpu.size() == cpu.size());
    REQUIRE(tol.size() == cpu.size());
    int bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < gpu.size(); ++i) {
        const double err = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
        const bool ok = std::isfinite(gpu[i]) && err <= tol[i];
        if (std::isfinite(gpu[i])) worst = std::max(worst, err / tol[i]);
        if (!ok) {
            if (bad < 4) {
                UNSCOPED_INFO(what << ": element " << i << ": gpu " << gpu[i] << ", cpu " << cpu[i] << ", |diff| "
                                   << err << " > tol " << tol[i]);
            }
            ++bad;
        }
    }
    std::printf("  %-58s worst err/tol %.3g%s\n", what.c_str(), worst, bad ? "  FAILED" : "");
    INFO(what << ": " << bad << " of " << gpu.size() << " outputs outside tolerance; worst err/tol " << worst);
    CHECK(bad == 0);
}

std::string case_name(const char* op, Type type, std::initializer_list<int64_t> dims) {
    std::string s = std::string(op) + " " + moe::type_name(type);
    for (int64_t d : dims) {
        s += ' ';
        s += std::to_string(d);
    }
    return s;
}

// ---- MUL_MAT ----

// pad > 0: x is a view of rows of k + pad values (rows not 16-byte aligned for odd pad).
void check_mul_mat(Type type, int64_t k, int64_t n, int64_t rows, int64_t ne2 = 1, int64_t pad = 0) {
    const HostTensor w = random_weights(type, k, n);
    HostTensor x = ne2 > 1 ? random_acts({k + pad, rows / ne2, ne2}) : random_acts({k + pad, rows});
    x.t.ne[0] = k;
    const int64_t x_stride = k + pad;
    const Outputs o = run_both(Op::MUL_MAT, {&w, &x}, {n, x.t.ne[1], x.t.ne[2]}, moe::OpParams{});
    const std::vector<float> wf = dequant_all(w);
    const auto* xf = reinterpret_cast<const float*>(x.bytes.data());
    std::vector<double> tol(static_cast<size_t>(n * rows));
    const Path path = path_of(type, rows, true);
    for (int64_t c = 0; c < rows; ++c) {
        for (int64_t r = 0; r < n; ++r) {
            tol[c * n + r] = dot_tol(dot_ref(type, wf.data() + r * k, xf + c * x_stride, k), path);
        }
    }
    compare(case_name(pad > 0 ? "MUL_MAT padded rows" : "MUL_MAT", type, {k, n, rows}), o.gpu, o.cpu, tol);
    CHECK(o.flags == 0);
}

// ---- MUL_MAT_ID ----

struct MoeShape {
    int64_t n_expert, n, k, n_used;
    std::vector<int32_t> allowed;  // experts that may be chosen; the others get no tokens
};

// The GPU runs of an expert product: the decoded types' tensor-core path both ways (the GEMM decoding
// their tiles, and through BF16 scratch rows), each against the one CPU result; anything else once.
std::vector<moe::ExpertGemmDecode> decode_modes(Type type, int64_t n_tokens) {
    if (moe::qd::decodes(type) && n_tokens > 8) return {moe::ExpertGemmDecode::FUSED, moe::ExpertGemmDecode::SCRATCH};
    return {kDefaultDecode};
}

std::string mode_suffix(Type type, int64_t n_tokens, moe::ExpertGemmDecode m) {
    if (decode_modes(type, n_tokens).size() == 1) return "";
    return m == moe::ExpertGemmDecode::FUSED ? " fused" : " scratch";
}

// The two ways of reading decoded weights give the same bits: the same BF16 weight values (the one decoder,
// core/quant_decode.h, rounded once) reach the same tensor-core products in the same k order.
void check_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
    INFO(differ << " of " << a.size() << " outputs differ in their bits between expert_gemm_decode=fused and scratch");
    CHECK(differ == 0);
}

// ids [n_used, T] with T = sum(counts) / n_used that give expert e exactly counts[e] pairs, in random order.
HostTensor ids_with_counts(int64_t n_used, const std::vector<int64_t>& counts) {
    std::vector<int32_t> pairs;
    for (size_t e = 0; e < counts.size(); ++e) pairs.insert(pairs.end(), static_cast<size_t>(counts[e]), static_cast<int32_t>(e));
    REQUIRE(pairs.size() % static_cast<size_t>(n_used) == 0);
    std::shuffle(pairs.begin(), pairs.end(), rng());
    HostTensor h = make_tensor(Type::I32, {n_used, static_cast<int64_t>(pairs.size()) / n_used});
    std::memcpy(h.bytes.data(), pairs.data(), pairs.size() * sizeof(int32_t));
    return h;
}

void check_mul_mat_id(Type type, const MoeShape& s, int64_t n_tokens, bool shared_input,
                      const HostTensor* fixed_ids = nullptr) {
    const HostTensor w = random_weights(type, s.k, s.n, s.n_expert);
    const int64_t b = shared_input ? 1 : s.n_used;
    const HostTensor x = random_acts({s.k, b, n_tokens});
    HostTensor ids = fixed_ids != nullptr ? *fixed_ids : random_ids(s.n_used, n_tokens, s.allowed);
    ids.t.data = ids.bytes.data();  // a copy's own bytes
    REQUIRE(ids.t.ne[0] == s.n_used);
    REQUIRE(ids.t.ne[1] == n_tokens);
    const std::vector<moe::ExpertGemmDecode> modes = decode_modes(type, n_tokens);
    const Outputs o = run_both(Op::MUL_MAT_ID, {&w, &x, &ids}, {s.n, s.n_used, n_tokens}, moe::OpParams{}, true, modes[0]);
    const std::vector<float> wf = dequant_all(w);
    const auto* xf = reinterpret_cast<const float*>(x.bytes.data());
    const auto* id = reinterpret_cast<const int32_t*>(ids.bytes.data());
    const Path path = path_of(type, n_tokens, false);
    std::vector<double> tol(static_cast<size_t>(s.n * s.n_used * n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t j = 0; j < s.n_used; ++j) {
            const float* xr = xf + (t * b + (shared_input ? 0 : j)) * s.k;
            const int64_t e = id[t * s.n_used + j];
            for (int64_t r = 0; r < s.n; ++r) {
                tol[(t * s.n_used + j) * s.n + r] = dot_tol(dot_ref(type, wf.data() + (e * s.n + r) * s.k, xr, s.k), path);
            }
        }
    }
    for (moe::ExpertGemmDecode m : modes) {
        const Outputs other = m == modes[0] ? Outputs{} : run_both(Op::MUL_MAT_ID, {&w, &x, &ids}, {s.n, s.n_used, n_tokens},
                                                                    moe::OpParams{}, false, m);
        const Outputs& g = m == modes[0] ? o : other;
        compare(case_name(shared_input ? "MUL_MAT_ID B=1" : "MUL_MAT_ID B=n_used", type,
                          {s.k, s.n, s.n_expert, s.n_used, n_tokens}) +
                    mode_suffix(type, n_tokens, m),
                g.gpu, o.cpu, tol);
        CHECK(g.flags == 0);
        if (m != modes[0]) check_same_bits(g.gpu, o.gpu);
    }
}

// ---- MOE_UP_GATE ----

void check_moe_up_gate(Type type, const MoeShape& s, int64_t n_tokens, Activation act, bool bias,
                       const HostTensor* fixed_ids = nullptr) {
    const HostTensor up = random_weights(type, s.k, s.n, s.n_expert);
    const HostTensor gate = random_weights(type, s.k, s.n, s.n_expert);
    const HostTensor x = random_acts({s.k, n_tokens});
    HostTensor ids = fixed_ids != nullptr ? *fixed_ids : random_ids(s.n_used, n_tokens, s.allowed);
    ids.t.data = ids.bytes.data();  // a copy's own bytes
    REQUIRE(ids.t.ne[0] == s.n_used);
    REQUIRE(ids.t.ne[1] == n_tokens);
    const HostTensor bu = random_bias(s.n, s.n_expert);
    const HostTensor bg = random_bias(s.n, s.n_expert);
    moe::OpParams params;
    params.i[0] = static_cast<int32_t>(act);
    const std::vector<const HostTensor*> srcs = {&up, &gate, &x, &ids, bias ? &bu : nullptr, bias ? &bg : nullptr};
    const std::vector<moe::ExpertGemmDecode> modes = decode_modes(type, n_tokens);
    const Outputs o = run_both(Op::MOE_UP_GATE, srcs, {s.n, s.n_used, n_tokens}, params, true, modes[0]);
    const std::vector<float> uf = dequant_all(up);
    const std::vector<float> gf = dequant_all(gate);
    const auto* xf = reinterpret_cast<const float*>(x.bytes.data());
    const auto* id = reinterpret_cast<const int32_t*>(ids.bytes.data());
    const auto* buf = reinterpret_cast<const float*>(bu.bytes.data());
    const auto* bgf = reinterpret_cast<const float*>(bg.bytes.data());
    const Path path = path_of(type, n_tokens, false);
    const double oai = act == Activation::SWIGLU_OAI ? 1.0 : 0.0;
    std::vector<double> tol(static_cast<size_t>(s.n * s.n_used * n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t j = 0; j < s.n_used; ++j) {
            const int64_t e = id[t * s.n_used + j];
            for (int64_t r = 0; r < s.n; ++r) {
                const DotRef u = dot_ref(type, uf.data() + (e * s.n + r) * s.k, xf + t * s.k, s.k);
                const DotRef g = dot_ref(type, gf.data() + (e * s.n + r) * s.k, xf + t * s.k, s.k);
                const double uv = u.value + (bias ? buf[e * s.n + r] : 0.0);
                const double gv = g.value + (bias ? bgf[e * s.n + r] : 0.0);
                const double tu = dot_tol(u, path);
                const double tg = dot_tol(g, path);
                tol[(t * s.n_used + j) * s.n + r] =
                    1.2 * (1.1 * (std::fabs(uv) + tu + oai) * tg + (std::fabs(gv) + tg) * tu) + 1e-30;
            }
        }
    }
    for (moe::ExpertGemmDecode m : modes) {
        const Outputs other = m == modes[0] ? Outputs{} : run_both(Op::MOE_UP_GATE, srcs, {s.n, s.n_used, n_tokens}, params, false, m);
        const Outputs& g = m == modes[0] ? o : other;
        compare(case_name(act == Activation::SILU ? "MOE_UP_GATE silu" : "MOE_UP_GATE swiglu_oai+bias", type,
                          {s.k, s.n, s.n_expert, s.n_used, n_tokens}) +
                    mode_suffix(type, n_tokens, m),
                g.gpu, o.cpu, tol);
        CHECK(g.flags == 0);
        if (m != modes[0]) check_same_bits(g.gpu, o.gpu);
    }
}

// Batch sizes: GEMV (1, 2, 7), and each tensor-core tile width (32 / 64 / 128 columns): dense rows 33 ->
// 32, 64 -> 64, 100+ -> 128; routed tiles are 1.5x the mean expert group (mma_route_tile_cols), e.g.
// MUL_MAT_ID shape 1 at 64 / 100 tokens -> 64, MOE_UP_GATE at 160 -> 64 (fused), 512 -> 128.
const int64_t kTokenCounts[] = {1, 2, 7, 33, 64, 100, 160, 512};

}  // namespace

TEST_CASE("cuda MUL_MAT matches the CPU backend on every weight type and batch size", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    for (Type type : kAllTypes) {
        for (int64_t rows : kTokenCounts) {
            check_mul_mat(type, 256, 203, rows);   // one partial chunk per row; partial row tiles
            check_mul_mat(type, 1184, 77, rows);   // 37 blocks: two chunks, odd block count
        }
        // GEMV rows of 5 and 3 chunks of 32 blocks (the prefetch loop past two chunks), odd row counts.
        for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{8}}) check_mul_mat(type, 4128, 45, rows);
        for (int64_t rows : {int64_t{1}, int64_t{5}}) check_mul_mat(type, 2080, 45, rows);
        check_mul_mat(type, 1184, 77, 64);         // tiles of 64 columns, odd block count (2-block steps)
        check_mul_mat(type, 32, 130, 64);          // one block per row: the pipeline's shortest tail
        check_mul_mat(type, 96, 130, 64);          // three blocks: fewer than the pipeline's stages
        check_mul_mat(type, 320, 129, 6, 2);       // 3-D activations [K, 3, 2]
        check_mul_mat(type, 256, 1100, 3);         // float weights: many rows take warp rows again
        check_mul_mat(type, 320, 129, 300, 3);     // [K, 100, 3]: the dequantise + cuBLAS path
        check_mul_mat(type, 320, 129, 300, 1, 1);  // rows of 321 values: BF16 conversion of unaligned rows
        check_mul_mat(type, 320, 129, 64, 1, 4);   // rows of 324 values, 16-byte aligned: tensor-core kernel
    }
}

TEST_CASE("cuda MUL_MAT_ID matches the CPU backend, B = 1 and B = n_used, idle experts", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    std::vector<int32_t> most(16);
    std::iota(most.begin(), most.end(), 0);
    most.erase(most.begin() + 7);  // expert 7 gets no tokens
    const MoeShape shapes[] = {
        {6, 77, 320, 3, {0, 2, 3, 5}},  // experts 1 and 4 idle; ~380 pairs per expert at T = 512
        {16, 130, 1184, 2, most},       // ~68 pairs per expert at T = 512, ~4 at T = 33
        {4, 70, 96, 2, {0, 1, 2, 3}},   // K of three blocks (under the pipeline's depth)
    };
    for (Type type : kAllTypes) {
        for (const MoeShape& s : shapes) {
            for (int64_t t : kTokenCounts) {
                check_mul_mat_id(type, s, t, true);
                check_mul_mat_id(type, s, t, false);
            }
        }
        check_mul_mat_id(type, shapes[1], 256, true);  // ~34 pairs per expert: tiles of 64 columns
        // GEMV rows of 3 and 5 chunks of 32 blocks, odd row counts.
        for (const MoeShape& sk : {MoeShape{4, 45, 2080, 2, {0, 1, 3}}, MoeShape{3, 21, 4128, 2, {0, 1, 2}}}) {
            for (int64_t t : {int64_t{1}, int64_t{5}}) {
                check_mul_mat_id(type, sk, t, true);
                check_mul_mat_id(type, sk, t, false);
            }
        }
        // Short quantised rows (4 rows per warp, 8 lanes per row): 24 blocks (3 per lane, the Qwen3 down
        // product's K = 768), 25 (4 per lane but the last lanes: 1 and none) and 32; row counts that
        // leave part of a block's last warp without a row.
        for (const MoeShape& sk : {MoeShape{5, 37, 768, 2, {0, 1, 2, 4}}, MoeShape{3, 50, 800, 3, {0, 1, 2}},
                                   MoeShape{4, 21, 1024, 2, {0, 2, 3}}}) {
            for (int64_t t : {int64_t{1}, int64_t{6}}) {
                check_mul_mat_id(type, sk, t, true);
                check_mul_mat_id(type, sk, t, false);
            }
        }
    }
}

TEST_CASE("cuda MOE_UP_GATE matches the CPU backend (SILU, SWIGLU_OAI with biases)", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const MoeShape s{8, 93, 256, 2, {0, 1, 3, 4, 6}};  // experts 2, 5, 7 idle
    const MoeShape short_k{4, 70, 96, 2, {0, 1, 2, 3}};  // K of three blocks (under the pipeline's depth)
    const MoeShape odd{8, 93, 288, 2, {0, 1, 3, 4, 6}};  // 9 blocks
    for (Type type : kAllTypes) {
        for (int64_t t : kTokenCounts) {
            check_moe_up_gate(type, s, t, Activation::SILU, false);
            check_moe_up_gate(type, s, t, Activation::SWIGLU_OAI, true);
        }
        // Tiles of 64 columns (~32 pairs per expert), and an odd block count (K = 288: the last 2-block
        // step has one block) at 64 and 128.
        check_moe_up_gate(type, s, 128, Activation::SILU, false);
        check_moe_up_gate(type, odd, 128, Activation::SWIGLU_OAI, true);
        check_moe_up_gate(type, odd, 512, Activation::SILU, false);
        for (int64_t t : {1, 64, 160}) check_moe_up_gate(type, short_k, t, Activation::SILU, false);
        // GEMV rows of 3 and 5 chunks of 32 blocks, odd row counts.
        for (const MoeShape& sk : {MoeShape{4, 45, 2080, 2, {0, 1, 3}}, MoeShape{3, 21, 4128, 2, {0, 1, 2}}}) {
            for (int64_t t : {int64_t{1}, int64_t{5}}) {
                check_moe_up_gate(type, sk, t, Activation::SILU, false);
                check_moe_up_gate(type, sk, t, Activation::SWIGLU_OAI, true);
            }
        }
    }
    // A Qwen3-sized decode product (771 rows, 8 of 16 experts, K = 2048): more blocks than one wave with a
    // warp per row, one wave with two (on an H100), so quantised weights take two rows per warp; 771 rows
    // leave the last block's warps two rows, one row and none.
    std::vector<int32_t> all16(16);
    std::iota(all16.begin(), all16.end(), 0);
    for (Type type : {Type::Q8_0, Type::Q4_0, Type::MXFP4}) {
        check_moe_up_gate(type, MoeShape{16, 771, 2048, 8, all16}, 1, Activation::SILU, false);
        check_moe_up_gate(type, MoeShape{16, 771, 2048, 8, all16}, 1, Activation::SWIGLU_OAI, true);
    }
}

// The decoded types (core/quant_decode.h and quant_decode_dot.h, tested on the host by
// tests/core/test_quant_decode.cpp and test_quant_decode_dot.cpp): GEMV at 1, 2, 5, 8 rows / tokens (integer
// groups of 32 per lane against Q8 activations, kernels of 1 and of up to 8 columns; rows of 9 super-blocks =
// 72 groups leave the last lane pass partial), dequantisation to BF16 at 33 and 300+ (cuBLAS dense; the
// tensor-core kernel for experts, after the routed experts' rows are dequantised, a chunk of at most 32
// experts at a time: the 40-expert shapes take two chunks).
namespace {

const int64_t kDecodedTokenCounts[] = {1, 2, 5, 8, 33, 300};

// A K that is whole blocks of t and not of the next larger block size where t allows it (25 groups of 32).
int64_t odd_k(Type t) { return moe::traits(t).block_size == 256 ? 2304 : 800; }

}  // namespace

TEST_CASE("cuda MUL_MAT matches the CPU backend on the decoded weight types", "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    for (Type type : kDecodedTypes) {
        for (int64_t rows : kDecodedTokenCounts) {
            check_mul_mat(type, 256, 203, rows);
            check_mul_mat(type, odd_k(type), 77, rows);
        }
        check_mul_mat(type, 512, 45, 3, 1, 5);  // activation rows of 517 values: copied for the GEMV
        check_mul_mat(type, 512, 45, 6, 2);     // x [K, 3, 2]
    }
}

TEST_CASE("cuda MUL_MAT_ID matches the CPU backend on the decoded weight types (idle and repeated experts)",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    for (Type type : kDecodedTypes) {
        const MoeShape shapes[] = {
            {6, 77, 512, 3, {0, 2, 3, 5}},     // experts 1 and 4 idle
            {8, 40, odd_k(type), 2, {1, 4, 6}},  // 5 of 8 idle
            {4, 45, 256, 3, {1, 2}},           // n_used 3 of 2 allowed: a token names one expert twice
        };
        for (const MoeShape& s : shapes) {
            for (int64_t t : kDecodedTokenCounts) {
                check_mul_mat_id(type, s, t, true);
                check_mul_mat_id(type, s, t, false);
            }
        }
    }
}

TEST_CASE("cuda expert products of decoded types dequantise a chunk of experts at a time",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    // 40 experts: two chunks of 20 (at most 32 per chunk, evened out). Routed experts in both chunks with
    // idle ones between; in the second chunk only (the first chunk's GEMM finds no tiles); two experts of
    // 40 for 300 tokens (a long prefill with few routed experts: groups of 300 pairs, several tiles each).
    const MoeShape both{40, 45, 256, 3, {0, 7, 19, 20, 21, 33, 39}};
    const MoeShape second{40, 37, 512, 2, {22, 31, 38}};
    const MoeShape few{40, 45, 256, 2, {3, 37}};
    for (Type type : kDecodedTypes) {
        for (int64_t t : {int64_t{33}, int64_t{300}}) {
            check_mul_mat_id(type, both, t, true);
            check_mul_mat_id(type, second, t, false);
            check_moe_up_gate(type, both, t, Activation::SILU, false);
            check_moe_up_gate(type, second, t, Activation::SWIGLU_OAI, true);
        }
        check_mul_mat_id(type, few, 300, true);
        check_moe_up_gate(type, few, 300, Activation::SILU, false);
    }
}

TEST_CASE("cuda MOE_UP_GATE matches the CPU backend on the decoded weight types (idle and repeated experts)",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    for (Type type : kDecodedTypes) {
        const MoeShape shapes[] = {
            {8, 93, 256, 2, {0, 1, 3, 4, 6}},  // experts 2, 5, 7 idle
            {4, 40, odd_k(type), 3, {2, 3}},   // repeated experts
        };
        for (const MoeShape& s : shapes) {
            for (int64_t t : kDecodedTokenCounts) {
                check_moe_up_gate(type, s, t, Activation::SILU, false);
                check_moe_up_gate(type, s, t, Activation::SWIGLU_OAI, true);
            }
        }
    }
}

// The tensor-core kernel decoding the decoded types' tiles (ExpertGemmDecode::FUSED, against the CPU and
// next to the scratch path, as every decoded case above past 8 tokens): routings that give experts 1, 17
// and more than 64 pairs (one column; a partial tile; two or three tiles, one of 64 + 1) in each tile width
// (32, 64 and 128 columns: mma_route_tile_cols of 1.5x the mean group), idle experts; K of one and of
// three units of 256 (K-quants: one super-block, three, so both raw slots and their reuse), and for the
// 32-element types K = 96 and 800 (3 and 25 groups: a partial unit, and an odd group count whose last
// k-step has one group); 77 rows (a partial row tile, and for MOE_UP_GATE a second tile of 13 up / gate rows).
TEST_CASE("cuda expert products of decoded types decode their tiles in the GEMM (experts of 1, 17, > 64 pairs)",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const std::vector<int64_t> routings[] = {
        {1, 17, 70, 2, 3, 0, 5, 6},        // 104 pairs over 8 experts: tiles of 32
        {1, 17, 0, 100, 64, 65, 33, 0},  // 280 over 8: tiles of 64
        {1, 17, 300, 130},               // 448 over 4: tiles of 128
    };
    for (Type type : kDecodedTypes) {
        const bool super = moe::traits(type).block_size == 256;
        for (int64_t k : super ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{96, 800}) {
            for (const std::vector<int64_t>& counts : routings) {
                const int64_t n_expert = static_cast<int64_t>(counts.size());
                const MoeShape s{n_expert, 77, k, 2, {}};
                const HostTensor ids = ids_with_counts(s.n_used, counts);
                const int64_t n_tokens = ids.t.ne[1];
                check_mul_mat_id(type, s, n_tokens, true, &ids);
                check_mul_mat_id(type, s, n_tokens, false, &ids);
                check_moe_up_gate(type, s, n_tokens, Activation::SILU, false, &ids);
                check_moe_up_gate(type, s, n_tokens, Activation::SWIGLU_OAI, true, &ids);
            }
        }
    }
}

// Weights end where their tensor-core tiles end: a row count that is a multiple of the row tile (128,
// 64 for the fused up / gate halves) and an odd block count (the last 2-block k-step has one block), so
// the CTA of the last rows must fall back to guarded loads: its unguarded copy of the last step's words
// would run past the tensor. Each tensor is a cudaMalloc of its own size: run this case under
// `compute-sanitizer --tool memcheck` to see that no load leaves it (results are checked as usual).
// The decoded types' GEMV kernels (backend option kquant_gemv): v2 stages 16-byte weight loads in shared
// memory, v1 reads each lane's group straight from global memory; each lane sums the same groups in the same
// order, so the outputs are the same bits. v3 is v2 but for routed rows of at most 32 groups, computed 4 rows
// per warp and summed in v2's order, so the same bits again. The [decoded] cases above hold v2 (the default) to the CPU; these
// hold it to v1 where those do not reach: dense products of model weights (the first chunk loaded before
// the PDL wait), 1 .. 8 columns, rows of 1, 3 and 4 full chunks (K-quants: 4 super-blocks per chunk) and of
// a partial one, odd row counts, and MOE_UP_GATE at two rows per warp, which a launch takes where that fits
// its grid into one wave of the device's multiprocessors (n_sm set).
namespace {

struct GemvKnobs {
    GemvKnobs(moe::KquantGemv g, int n_sm) {
        GpuEnv::get().kquant_gemv = g;
        GpuEnv::get().n_sm = n_sm;
    }
    ~GemvKnobs() {
        GpuEnv::get().kquant_gemv = moe::BackendConfig{}.kquant_gemv;
        GpuEnv::get().n_sm = 0;
    }
    GemvKnobs(const GemvKnobs&) = delete;
    GemvKnobs& operator=(const GemvKnobs&) = delete;
};

int device_sms() {
    int n = 0;
    CUDA_REQUIRE(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

// op on the GPU with kquant_gemv=v1 and =g (v2 or v3): every output written (finite) and the same bits.
void check_gemv_v1_v2(const std::string& what, Op op, const std::vector<const HostTensor*>& srcs,
                      std::initializer_list<int64_t> dst_shape, const moe::OpParams& params, int n_sm,
                      moe::KquantGemv g = moe::KquantGemv::V2) {
    Outputs o1, o2;
    {
        const GemvKnobs k(moe::KquantGemv::V1, n_sm);
        o1 = run_both(op, srcs, dst_shape, params, false);
    }
    {
        const GemvKnobs k(g, n_sm);
        o2 = run_both(op, srcs, dst_shape, params, false);
    }
    const char* gname = g == moe::KquantGemv::V3 ? "v3" : "v2";
    REQUIRE(o1.gpu.size() == o2.gpu.size());
    size_t differ = 0, not_finite = 0;
    for (size_t i = 0; i < o2.gpu.size(); ++i) {
        differ += std::memcmp(&o1.gpu[i], &o2.gpu[i], sizeof(float)) != 0 ? 1 : 0;
        not_finite += std::isfinite(o2.gpu[i]) ? 0 : 1;
    }
    std::printf("  %-58s %s: %zu of %zu differ\n", what.c_str(), gname, differ, o2.gpu.size());
    INFO(what << ": " << differ << " of " << o2.gpu.size() << " outputs differ in their bits between kquant_gemv=v1 and "
              << gname << ", " << not_finite << " not finite");
    CHECK(differ == 0);
    CHECK(not_finite == 0);
    CHECK(o1.flags == 0);
    CHECK(o2.flags == 0);
}

// MUL_MAT_ID of w ([k, 77, 8]) for 1 and 5 tokens, 3 of the 8 experts each, with one activation row per token
// (B = 1) and one per pair (B = n_used): check_gemv_v1_v2 with g.
void check_routed_v1(Type type, const HostTensor& w, int64_t k, int n_sm, moe::KquantGemv g) {
    for (int64_t t : {int64_t{1}, int64_t{5}}) {
        const HostTensor ids = random_ids(3, t, {0, 1, 2, 3, 4, 5, 6, 7});
        const HostTensor x1 = random_acts({k, 1, t});
        const HostTensor x3 = random_acts({k, 3, t});
        check_gemv_v1_v2(case_name("MUL_MAT_ID B=1", type, {k, 77, 8, 3, t}), Op::MUL_MAT_ID, {&w, &x1, &ids},
                         {77, 3, t}, moe::OpParams{}, n_sm, g);
        check_gemv_v1_v2(case_name("MUL_MAT_ID B=n_used", type, {k, 77, 8, 3, t}), Op::MUL_MAT_ID, {&w, &x3, &ids},
                         {77, 3, t}, moe::OpParams{}, n_sm, g);
    }
}

}  // namespace

TEST_CASE("cuda decoded-type GEMV: kquant_gemv=v2 gives v1's bits (early dense loads, two rows per warp)",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const int n_sm = device_sms();
    for (Type type : kDecodedTypes) {
        // Dense, model weights: K of 1 (32-element types: 25 groups) or 3 partial chunks (K-quants: 72 groups),
        // and of 4 whole chunks.
        struct Dense {
            int64_t k, n;
            std::vector<int64_t> cols;
        };
        const Dense dense[] = {{odd_k(type), 203, {1, 2, 3, 4, 5, 8}}, {4096, 67, {1, 6}}, {1024, 45, {7}}};
        for (const Dense& d : dense) {
            HostTensor w = random_weights(type, d.k, d.n);
            w.t.is_weight = true;
            for (int64_t cols : d.cols) {
                const HostTensor x = random_acts({d.k, cols});
                check_gemv_v1_v2(case_name("MUL_MAT weight", type, {d.k, d.n, cols}), Op::MUL_MAT, {&w, &x},
                                 {d.n, cols}, moe::OpParams{}, n_sm);
            }
        }
        // Routed: MUL_MAT_ID with one activation row per token and per pair (v3: 25 groups of the 32-element
        // types take its short-row kernel, 72 of the K-quants v2's).
        {
            const HostTensor w = random_weights(type, odd_k(type), 77, 8);
            for (moe::KquantGemv g : {moe::KquantGemv::V2, moe::KquantGemv::V3}) {
                check_routed_v1(type, w, odd_k(type), n_sm, g);
            }
        }
        // MOE_UP_GATE, 64 pairs (8 tokens x 8 of 8 experts): a launch of ceil(n / 4) x 64 blocks takes two rows
        // per warp where that grid exceeds one wave of p blocks per multiprocessor and ceil(n / 8) x 64 fits
        // one; these n do so for p from 3 to 46 on 132 multiprocessors (H100, H200), whatever p the kernel
        // gets. 385 rows: the last warp of two rows has one.
        for (int64_t n : {int64_t{49}, int64_t{97}, int64_t{193}, int64_t{385}}) {
            const HostTensor up = random_weights(type, 256, n, 8);
            const HostTensor gate = random_weights(type, 256, n, 8);
            const HostTensor x = random_acts({256, 8});
            const HostTensor ids = random_ids(8, 8, {0, 1, 2, 3, 4, 5, 6, 7});
            const HostTensor bu = random_bias(n, 8);
            const HostTensor bg = random_bias(n, 8);
            moe::OpParams silu;
            silu.i[0] = static_cast<int32_t>(Activation::SILU);
            moe::OpParams oai;
            oai.i[0] = static_cast<int32_t>(Activation::SWIGLU_OAI);
            check_gemv_v1_v2(case_name("MOE_UP_GATE silu", type, {256, n, 8, 8, 8}), Op::MOE_UP_GATE,
                             {&up, &gate, &x, &ids}, {n, 8, 8}, silu, n_sm);
            check_gemv_v1_v2(case_name("MOE_UP_GATE swiglu_oai+bias", type, {256, n, 8, 8, 8}), Op::MOE_UP_GATE,
                             {&up, &gate, &x, &ids, &bu, &bg}, {n, 8, 8}, oai, n_sm);
        }
    }
}

// kquant_gemv=v3's short-row kernel (routed rows of at most 32 groups: 4 rows per warp, 8 lanes per row, up to
// 4 groups per lane): rows of 1 .. 4 groups per lane (K-quants: 1 .. 4 super-blocks; K = 768 is Qwen3-30B-A3B's
// expert down product), and one group past the limit (v2's kernel); rows of 210-byte Q6_K or 110-byte Q3_K
// blocks at 2-byte aligned addresses; 77 rows (the last warp has one row of its four). Against v1's bits, and
// against the CPU with check_mul_mat_id's tolerance.
TEST_CASE("cuda decoded-type GEMV: kquant_gemv=v3 gives v1's bits and matches the CPU on short routed rows",
          "[gpu][cuda][matmul][decoded]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const int n_sm = device_sms();
    for (Type type : kDecodedTypes) {
        const std::vector<int64_t> ks = moe::traits(type).block_size == 256
                                            ? std::vector<int64_t>{256, 512, 768, 1024, 1280}
                                            : std::vector<int64_t>{32, 64, 416, 768, 1024, 1056};
        for (int64_t k : ks) {
            const HostTensor w = random_weights(type, k, 77, 8);
            check_routed_v1(type, w, k, n_sm, moe::KquantGemv::V3);
            const GemvKnobs knobs(moe::KquantGemv::V3, n_sm);
            const MoeShape s{8, 77, k, 3, {0, 2, 3, 5, 6}};  // experts 1, 4 and 7 idle
            check_mul_mat_id(type, s, 1, true);
            check_mul_mat_id(type, s, 5, false);
        }
    }
}

TEST_CASE("cuda tensor-core GEMM reads nothing past its weights (run under compute-sanitizer)", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const MoeShape edge{4, 128, 288, 2, {0, 1, 2, 3}};  // expert 3's last rows end the tensor
    for (Type type : {Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::F16}) {
        check_mul_mat(type, 288, 128, 64);
        check_mul_mat_id(type, edge, 96, false);
        check_moe_up_gate(type, edge, 96, Activation::SILU, false);
    }
    // Decoded types copy units of 256 elements: K = 288 of 32-element blocks ends a unit and a group into the
    // next (whose copy runs past the tensor), and the super-block types' last unit ends the tensor itself
    // (Q6_K's rows of 630 bytes start at every even address mod 16).
    for (Type type : {Type::Q4_1, Type::IQ4_NL, Type::Q4_K, Type::Q6_K, Type::IQ4_XS}) {
        const MoeShape dec_edge{4, 128, moe::traits(type).block_size == 256 ? 768 : 288, 2, {0, 1, 2, 3}};
        check_mul_mat_id(type, dec_edge, 96, false);
        check_moe_up_gate(type, dec_edge, 96, Activation::SILU, false);
    }
}

TEST_CASE("cuda MUL_MAT_ID: out-of-range ids give NaN columns and raise kErrorBadIndex", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const int64_t n = 45, n_expert = 4, n_used = 2;
    // K = 2080: GEMV rows of 3 chunks of 32 blocks; Q4_0 at K = 256: the short-row GEMV (4 rows per warp).
    for (const auto& [type, k, n_tokens] :
         {std::tuple<Type, int64_t, int64_t>{Type::Q8_0, 256, 1}, {Type::Q8_0, 256, 33}, {Type::Q8_0, 2080, 1},
          {Type::Q8_0, 2080, 3}, {Type::Q4_0, 256, 1}, {Type::Q4_0, 256, 3}, {Type::Q4_K, 256, 1},
          {Type::Q4_K, 512, 33}, {Type::IQ4_NL, 256, 3}}) {
        const HostTensor w = random_weights(type, k, n, n_expert);
        const HostTensor x = random_acts({k, 1, n_tokens});
        HostTensor ids = random_ids(n_used, n_tokens, {0, 1, 2, 3});
        const Outputs good = run_both(Op::MUL_MAT_ID, {&w, &x, &ids}, {n, n_used, n_tokens}, moe::OpParams{});
        auto* id = reinterpret_cast<int32_t*>(ids.bytes.data());
        const int64_t bad0 = 0;                       // (slot 0, token 0)
        const int64_t bad1 = n_used * n_tokens - 1;   // the last pair
        id[bad0] = static_cast<int32_t>(n_expert);
        id[bad1] = -2;  // -1 is kNoExpert (a zero row, see below)
        const Outputs o = run_both(Op::MUL_MAT_ID, {&w, &x, &ids}, {n, n_used, n_tokens}, moe::OpParams{}, false);
        CHECK(o.flags == moe::cuda::kErrorBadIndex);
        int wrong = 0;
        for (int64_t p = 0; p < n_used * n_tokens; ++p) {
            for (int64_t r = 0; r < n; ++r) {
                const float g = o.gpu[p * n + r];
                if (p == bad0 || p == bad1) {
                    wrong += std::isnan(g) ? 0 : 1;
                } else {
                    wrong += g == good.gpu[p * n + r] ? 0 : 1;  // the same kernels on the same data
                }
            }
        }
        INFO(moe::type_name(type) << " K = " << k << ", T = " << n_tokens);
        CHECK(wrong == 0);
    }
}

TEST_CASE("cuda expert products leave the rows of kNoExpert ids unwritten, without an error", "[gpu][cuda][matmul]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    // The parts of a split expert block: a masked pair's rows keep the NaN poison, the others are what
    // the unmasked op gives (the same kernels on the same pairs), on the GEMV (T = 1) and tensor-core paths.
    const int64_t k = 256, n = 96, n_expert = 6, n_used = 3;
    for (Type type : {Type::Q8_0, Type::MXFP4, Type::Q4_1, Type::Q4_K, Type::IQ4_XS}) {
        const int64_t f = moe::traits(type).block_size == 256 ? 256 : 64;  // the down product's K
        for (int64_t n_tokens : {int64_t{1}, int64_t{33}, int64_t{300}}) {
            const HostTensor down = random_weights(type, f, n, n_expert);
            const HostTensor up = random_weights(type, k, f, n_expert);
            const HostTensor gate = random_weights(type, k, f, n_expert);
            const HostTensor h = random_acts({f, n_used, n_tokens});
            const HostTensor x = random_acts({k, n_tokens});
            const HostTensor ids = random_ids(n_used, n_tokens, {0, 1, 2, 3, 4, 5});
            HostTensor masked = ids;
            masked.t.data = masked.bytes.data();
            auto* id = reinterpret_cast<int32_t*>(masked.bytes.data());
            std::bernoulli_distribution drop(0.4);
            for (int64_t p = 0; p < n_used * n_tokens; ++p) {
                if (drop(rng()) || p == 0) id[p] = moe::kNoExpert;
            }
            moe::OpParams silu{};
            silu.i[0] = static_cast<int32_t>(Activation::SILU);
            for (Op op : {Op::MUL_MAT_ID, Op::MOE_UP_GATE}) {
                const int64_t rows = op == Op::MUL_MAT_ID ? n : f;
                const std::vector<const HostTensor*> all_srcs =
                    op == Op::MUL_MAT_ID ? std::vector<const HostTensor*>{&down, &h, &ids}
                                         : std::vector<const HostTensor*>{&up, &gate, &x, &ids};
                std::vector<const HostTensor*> part_srcs = all_srcs;
                part_srcs.back() = &masked;
                const Outputs all = run_both(op, all_srcs, {rows, n_used, n_tokens}, silu, false);
                const Outputs part = run_both(op, part_srcs, {rows, n_used, n_tokens}, silu);
                INFO(moe::op_name(op) << " " << moe::type_name(type) << " T = " << n_tokens);
                CHECK(part.flags == 0);
                int wrong = 0;
                for (int64_t p = 0; p < n_used * n_tokens; ++p) {
                    for (int64_t r = 0; r < rows; ++r) {
                        const float g = part.gpu[p * rows + r];
                        if (id[p] == moe::kNoExpert) {
                            wrong += std::isnan(g) && std::isnan(part.cpu[p * rows + r]) ? 0 : 1;
                        } else {
                            wrong += g == all.gpu[p * rows + r] ? 0 : 1;
                        }
                    }
                }
                CHECK(wrong == 0);
            }
        }
    }
}

TEST_CASE("cuda matmul argument checks fail on the host, before any launch", "[cuda][matmul]") {
    // No device needed: every case fails validation, which reads only shapes, types and strides.
    HostTensor w = random_weights(Type::Q8_0, 64, 8);
    HostTensor x = random_acts({64, 3});
    HostTensor dst = make_tensor(Type::F32, {8, 3});
    moe::cuda::OpContext ctx;
    Tensor node = dst.t;
    node.op = Op::MUL_MAT;
    node.src[0] = &w.t;
    node.src[1] = &x.t;
    SECTION("wrong dst shape") {
        node.ne[0] = 9;
        CHECK(moe::cuda::mul_mat(node, ctx).code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK(moe::cuda::matmul_scratch_bytes(node, kDefaultDecode) == 0);
    }
    SECTION("activation row length differs from the weight's") {
        HostTensor x2 = random_acts({96, 3});
        node.src[1] = &x2.t;
        CHECK(moe::cuda::mul_mat(node, ctx).code() == MOE_STATUS_INVALID_ARGUMENT);
    }
    SECTION("rows that are not a multiple of 32") {
        HostTensor wf = make_tensor(Type::F32, {40, 8});
        HostTensor x2 = random_acts({40, 3});
        node.src[0] = &wf.t;
        node.src[1] = &x2.t;
        CHECK(moe::cuda::mul_mat(node, ctx).code() == MOE_STATUS_UNIMPLEMENTED);
    }
    SECTION("missing scratch") {
        CHECK(moe::cuda::matmul_scratch_bytes(node, kDefaultDecode) > 0);
        CHECK(moe::cuda::mul_mat(node, ctx).code() == MOE_STATUS_INVALID_ARGUMENT);
    }
    SECTION("up and gate of different types") {
        HostTensor up = random_weights(Type::Q8_0, 64, 8, 2);
        HostTensor gate = random_weights(Type::Q4_0, 64, 8, 2);
        HostTensor xt = random_acts({64, 3});
        HostTensor ids = random_ids(1, 3, {0, 1});
        HostTensor out = make_tensor(Type::F32, {8, 1, 3});
        Tensor ug = out.t;
        ug.op = Op::MOE_UP_GATE;
        ug.src[0] = &up.t;
        ug.src[1] = &gate.t;
        ug.src[2] = &xt.t;
        ug.src[3] = &ids.t;
        CHECK(moe::cuda::moe_up_gate(ug, ctx).code() == MOE_STATUS_UNIMPLEMENTED);
    }
    SECTION("decoded weights at an odd address") {
        HostTensor wq = random_weights(Type::Q4_K, 256, 8);
        HostTensor x2 = random_acts({256, 3});
        std::vector<uint8_t> shifted(wq.bytes.size() + 1);
        std::memcpy(shifted.data() + 1, wq.bytes.data(), wq.bytes.size());
        wq.t.data = shifted.data() + 1;
        node.src[0] = &wq.t;
        node.src[1] = &x2.t;
        const moe::Status s = moe::cuda::mul_mat(node, ctx);
        INFO(s.message());
        CHECK(s.code() == MOE_STATUS_UNIMPLEMENTED);
        CHECK(s.message().find("2-byte aligned") != std::string::npos);
    }
    CHECK(moe::cuda::supports_matmul_type(Type::MXFP4));
    for (Type t : kDecodedTypes) CHECK(moe::cuda::supports_matmul_type(t));
    CHECK_FALSE(moe::cuda::supports_matmul_type(Type::I32));
    CHECK_FALSE(moe::cuda::supports_matmul_type(Type::IQ2_XXS));
}

TEST_CASE("cuda expert scratch of decoded types holds a chunk of experts, not every expert", "[cuda][matmul][decoded]") {
    // Host only: sizes from shapes, no weight byte is read. The Qwen3-30B-A3B up/gate shape at 512 tokens:
    // every expert as BF16 rows would take 2 x 128 x 768 x 2048 x 2 bytes = 805 MB of scratch; a chunk of
    // 32 experts 201 MB, plus the route and the BF16 activations (2 MB). Decoding in the GEMM needs only
    // the route and the activations.
    using moe::ExpertGemmDecode;
    const int64_t k = 2048, n = 768, n_expert = 128, n_used = 8, n_tokens = 512;
    alignas(16) static uint8_t no_bytes[16];
    for (Type type : {Type::Q4_K, Type::IQ4_XS}) {
        INFO(moe::type_name(type));
        Tensor up;
        const int64_t wdims[] = {k, n, n_expert};
        moe::set_shape(up, type, 3, wdims);
        up.data = no_bytes;
        Tensor gate = up;
        HostTensor x = make_tensor(Type::F32, {k, n_tokens});
        HostTensor ids = random_ids(n_used, n_tokens, {0, 1, 2, 3, 4, 5, 6, 7});
        HostTensor out = make_tensor(Type::F32, {n, n_used, n_tokens});
        Tensor ug = out.t;
        ug.op = Op::MOE_UP_GATE;
        ug.src[0] = &up;
        ug.src[1] = &gate;
        ug.src[2] = &x.t;
        ug.src[3] = &ids.t;
        const size_t chunk = size_t{2} * 32 * n * k * 2;
        const size_t need = moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::SCRATCH);
        CHECK(need >= chunk);
        CHECK(need <= chunk + (size_t{8} << 20));
        const size_t acts = size_t{n_tokens} * k * 2;
        CHECK(moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::FUSED) >= acts);
        CHECK(moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::FUSED) <= acts + (size_t{1} << 20));
        // The down product (K = 768, N = 2048): 32 experts of 3 MB.
        Tensor down;
        const int64_t ddims[] = {n, k, n_expert};
        moe::set_shape(down, type, 3, ddims);
        down.data = no_bytes;
        HostTensor y = make_tensor(Type::F32, {n, n_used, n_tokens});
        HostTensor dout = make_tensor(Type::F32, {k, n_used, n_tokens});
        Tensor id_node = dout.t;
        id_node.op = Op::MUL_MAT_ID;
        id_node.src[0] = &down;
        id_node.src[1] = &y.t;
        id_node.src[2] = &ids.t;
        const size_t dchunk = size_t{32} * n * k * 2;
        const size_t dneed = moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::SCRATCH);
        CHECK(dneed >= dchunk);
        CHECK(dneed <= dchunk + (size_t{16} << 20));
        const size_t dacts = size_t{n_used} * n_tokens * n * 2;  // a BF16 row per pair
        CHECK(moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::FUSED) >= dacts);
        CHECK(moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::FUSED) <= dacts + (size_t{1} << 20));
    }
}

TEST_CASE("cuda matmul scratch holds the BF16 rows of decoded weights past the GEMV", "[cuda][matmul][decoded]") {
    // Host only: sizes from shapes. K = 512, N = 40, E = 6, 33 tokens (past the GEMV's 8). Expert products
    // hold their weights' BF16 rows only where they dequantise to scratch.
    using moe::ExpertGemmDecode;
    const int64_t k = 512, n = 40, n_expert = 6, n_tokens = 33;
    const size_t bf16_experts = static_cast<size_t>(n_expert * n * k) * 2;
    for (Type type : kDecodedTypes) {
        INFO(moe::type_name(type));
        HostTensor w = random_weights(type, k, n, n_expert);
        HostTensor gate = random_weights(type, k, n, n_expert);
        HostTensor x = random_acts({k, n_tokens});
        HostTensor x3 = random_acts({k, 1, n_tokens});
        HostTensor ids = random_ids(2, n_tokens, {0, 1, 2, 3, 4, 5});
        HostTensor out = make_tensor(Type::F32, {n, 2, n_tokens});
        Tensor id_node = out.t;
        id_node.op = Op::MUL_MAT_ID;
        id_node.src[0] = &w.t;
        id_node.src[1] = &x3.t;
        id_node.src[2] = &ids.t;
        const size_t acts = static_cast<size_t>(n_tokens * k) * 2;
        CHECK(moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::SCRATCH) >= bf16_experts + acts);
        CHECK(moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::FUSED) < bf16_experts);
        CHECK(moe::cuda::matmul_scratch_bytes(id_node, ExpertGemmDecode::FUSED) >= acts);
        Tensor ug = out.t;
        ug.op = Op::MOE_UP_GATE;
        ug.src[0] = &w.t;
        ug.src[1] = &gate.t;
        ug.src[2] = &x.t;
        ug.src[3] = &ids.t;
        CHECK(moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::SCRATCH) >= 2 * bf16_experts + acts);
        CHECK(moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::FUSED) < bf16_experts);
        CHECK(moe::cuda::matmul_scratch_bytes(ug, ExpertGemmDecode::FUSED) >= acts);
        HostTensor w2 = random_weights(type, k, n);
        HostTensor dst = make_tensor(Type::F32, {n, n_tokens});
        Tensor mm = dst.t;
        mm.op = Op::MUL_MAT;
        mm.src[0] = &w2.t;
        mm.src[1] = &x.t;
        for (ExpertGemmDecode d : {ExpertGemmDecode::FUSED, ExpertGemmDecode::SCRATCH}) {
            CHECK(moe::cuda::matmul_scratch_bytes(mm, d) >= static_cast<size_t>((n + n_tokens) * k) * 2);
        }
        // At 8 tokens the GEMV reads the weights as they are and Q8 activation rows (int8 qs[K], float
        // d[K / 32], 16-byte multiples: 576 bytes for K = 512).
        HostTensor x8 = random_acts({k, 8});
        HostTensor dst8 = make_tensor(Type::F32, {n, 8});
        Tensor mm8 = dst8.t;
        mm8.op = Op::MUL_MAT;
        mm8.src[0] = &w2.t;
        mm8.src[1] = &x8.t;
        CHECK(moe::cuda::matmul_scratch_bytes(mm8, kDefaultDecode) == size_t{8} * 576);
    }
}

// ---- perf mode ----

namespace {

// Valid random weights for one expert, replicated to all experts on the device (timings only).
DevMem perf_weights(Type type, int64_t k, int64_t n, int64_t n_expert) {
    const HostTensor one = random_weights(type, k, n);
    DevMem d = dev_alloc(one.bytes.size() * static_cast<size_t>(n_expert));
    for (int64_t e = 0; e < n_expert; ++e) {
        CUDA_REQUIRE(cudaMemcpy(static_cast<uint8_t*>(d.get()) + e * one.bytes.size(), one.bytes.data(),
                                one.bytes.size(), cudaMemcpyHostToDevice));
    }
    return d;
}

struct PerfOp {
    const char* name;
    Op op;
    int64_t k, n, n_expert, n_used;
    Activation act;
    bool bias;
};

// Median of 10 event-timed runs after 3 warm-ups, in seconds.
double time_node(Tensor& node, moe::ExpertGemmDecode decode) {
    GpuEnv& env = GpuEnv::get();
    const moe::cuda::OpContext ctx = env.ctx(moe::cuda::matmul_scratch_bytes(node, decode), decode);
    cudaEvent_t a, b;
    CUDA_REQUIRE(cudaEventCreate(&a));
    CUDA_REQUIRE(cudaEventCreate(&b));
    std::vector<double> ms;
    for (int i = 0; i < 13; ++i) {
        CUDA_REQUIRE(cudaEventRecord(a, ctx.stream));
        const moe::Status s = run_gpu_node(node, ctx);
        INFO(s.message());
        REQUIRE(s.is_ok());
        CUDA_REQUIRE(cudaEventRecord(b, ctx.stream));
        CUDA_REQUIRE(cudaEventSynchronize(b));
        float t = 0.0f;
        CUDA_REQUIRE(cudaEventElapsedTime(&t, a, b));
        if (i >= 3) ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    REQUIRE(env.take_flags() == 0);
    return 0.5 * (ms[4] + ms[5]) * 1e-3;
}

void perf_case(const PerfOp& p, Type type, int64_t n_tokens, moe::ExpertGemmDecode decode = kDefaultDecode) {
    const bool fused = p.op == Op::MOE_UP_GATE;
    const bool dense = p.op == Op::MUL_MAT;
    const int64_t n_expert = dense ? 1 : p.n_expert;
    DevMem w0 = perf_weights(type, p.k, p.n, n_expert);
    DevMem w1 = fused ? perf_weights(type, p.k, p.n, n_expert) : nullptr;
    Tensor wt;
    if (dense) {
        const int64_t ne[2] = {p.k, p.n};
        moe::set_shape(wt, type, 2, ne);
    } else {
        const int64_t ne[3] = {p.k, p.n, n_expert};
        moe::set_shape(wt, type, 3, ne);
    }
    wt.data = w0.get();
    Tensor gt = wt;
    gt.data = w1.get();

    const int64_t b_rows = p.op == Op::MUL_MAT_ID ? p.n_used : 1;
    const HostTensor xh = dense ? random_acts({p.k, n_tokens}) : random_acts({p.k, b_rows * n_tokens});
    DevMem xd = dev_alloc(xh.bytes.size());
    CUDA_REQUIRE(cudaMemcpy(xd.get(), xh.bytes.data(), xh.bytes.size(), cudaMemcpyHostToDevice));
    Tensor xt;
    if (p.op == Op::MUL_MAT_ID) {
        const int64_t ne[3] = {p.k, b_rows, n_tokens};
        moe::set_shape(xt, Type::F32, 3, ne);
    } else {
        const int64_t ne[2] = {p.k, n_tokens};
        moe::set_shape(xt, Type::F32, 2, ne);
    }
    xt.data = xd.get();

    std::vector<int32_t> all(static_cast<size_t>(p.n_expert));
    std::iota(all.begin(), all.end(), 0);
    const HostTensor idh = random_ids(p.n_used, n_tokens, all);
    DevMem idd = dev_alloc(idh.bytes.size());
    CUDA_REQUIRE(cudaMemcpy(idd.get(), idh.bytes.data(), idh.bytes.size(), cudaMemcpyHostToDevice));
    Tensor idt = idh.t;
    idt.data = idd.get();

    const HostTensor bh = random_bias(p.n, n_expert);
    DevMem bd = dev_alloc(bh.bytes.size());
    CUDA_REQUIRE(cudaMemcpy(bd.get(), bh.bytes.data(), bh.bytes.size(), cudaMemcpyHostToDevice));
    Tensor bt = bh.t;
    bt.data = bd.get();

    const int64_t cols = dense ? n_tokens : p.n_used * n_tokens;
    DevMem dd = dev_alloc(static_cast<size_t>(p.n * cols) * 4);
    Tensor node;
    if (dense) {
        const int64_t ne[2] = {p.n, n_tokens};
        moe::set_shape(node, Type::F32, 2, ne);
    } else {
        const int64_t ne[3] = {p.n, p.n_used, n_tokens};
        moe::set_shape(node, Type::F32, 3, ne);
    }
    node.data = dd.get();
    node.op = p.op;
    if (fused) {
        node.src[0] = &wt;
        node.src[1] = &gt;
        node.src[2] = &xt;
        node.src[3] = &idt;
        node.src[4] = p.bias ? &bt : nullptr;
        node.src[5] = p.bias ? &bt : nullptr;
        node.params.i[0] = static_cast<int32_t>(p.act);
    } else {
        node.src[0] = &wt;
        node.src[1] = &xt;
        node.src[2] = dense ? nullptr : &idt;
    }
    const double sec = time_node(node, decode);
    const double mats = fused ? 2.0 : 1.0;
    const double flops = 2.0 * static_cast<double>(cols) * static_cast<double>(p.n) * static_cast<double>(p.k) * mats;
    if (n_tokens == 1) {
        const double bytes = static_cast<double>(moe::row_bytes(type, p.k)) * static_cast<double>(p.n) * mats *
                             static_cast<double>(dense ? 1 : p.n_used);
        std::printf("%-14s %-6s T=%-5lld %9.1f us  %7.1f GB/s of weights\n", p.name, moe::type_name(type),
                    static_cast<long long>(n_tokens), sec * 1e6, bytes / sec * 1e-9);
    } else {
        const char* how = !moe::qd::decodes(type) || dense ? ""
                          : decode == moe::ExpertGemmDecode::FUSED ? "  (fused)"
                                                                   : "  (scratch)";
        std::printf("%-14s %-6s T=%-5lld %9.1f us  %7.1f TFLOP/s%s\n", p.name, moe::type_name(type),
                    static_cast<long long>(n_tokens), sec * 1e6, flops / sec * 1e-12, how);
    }
    std::fflush(stdout);
}

}  // namespace

TEST_CASE("cuda matmul perf (set MOEINFER_GPU_PERF=1)", "[gpu][cuda][matmul][perf]") {
    if (moe::cuda::device_count() == 0) {
        WARN("skipped: no CUDA device");
        return;
    }
    const char* env = std::getenv("MOEINFER_GPU_PERF");
    if (env == nullptr || std::string(env) != "1") return;
    const PerfOp q30_up{"q30 up_gate", Op::MOE_UP_GATE, 2048, 768, 128, 8, Activation::SILU, false};
    const PerfOp q30_down{"q30 down", Op::MUL_MAT_ID, 768, 2048, 128, 8, Activation::SILU, false};
    const PerfOp g20_up{"g20 up_gate", Op::MOE_UP_GATE, 2880, 2880, 32, 4, Activation::SWIGLU_OAI, true};
    const PerfOp g20_down{"g20 down", Op::MUL_MAT_ID, 2880, 2880, 32, 4, Activation::SILU, false};
    const PerfOp dense{"dense 2048x4096", Op::MUL_MAT, 2048, 4096, 1, 1, Activation::SILU, false};
    // MOEINFER_GPU_PERF_T: the batch sizes to time (comma-separated; default 1,512,4096).
    std::vector<int64_t> batches = {1, 512, 4096};
    if (const char* ts = std::getenv("MOEINFER_GPU_PERF_T")) {
        batches.clear();
        for (const char* c = ts; *c != '\0';) {
            char* end = nullptr;
            const long long v = std::strtoll(c, &end, 10);
            REQUIRE(end != c);
            REQUIRE(v > 0);
            batches.push_back(v);
            c = *end == ',' ? end + 1 : end;
            REQUIRE((*c == '\0' || *end == ','));
        }
    }
    std::printf("\ncuda matmul perf (median of 10 event-timed runs)\n");
    for (int64_t t : batches) {
        for (Type type : {Type::Q8_0, Type::Q4_0, Type::BF16}) {
            perf_case(q30_up, type, t);
            perf_case(q30_down, type, t);
        }
        for (Type type : {Type::MXFP4, Type::Q8_0}) {
            perf_case(g20_up, type, t);
            perf_case(g20_down, type, t);
        }
        for (Type type : {Type::Q8_0, Type::BF16}) perf_case(dense, type, t);
        // The decoded types of llama.cpp's Q4_K_M and IQ4_XS files (core/quant_decode.h's first kernels),
        // expert products both ways (backend option expert_gemm_decode).
        for (Type type : {Type::Q4_K, Type::Q6_K, Type::IQ4_XS}) {
            for (moe::ExpertGemmDecode d : {moe::ExpertGemmDecode::FUSED, moe::ExpertGemmDecode::SCRATCH}) {
                perf_case(q30_up, type, t, d);
                perf_case(q30_down, type, t, d);
                if (t == 1) break;  // the GEMV either way
            }
            perf_case(dense, type, t);
        }
        // The F16 dense GEMVs of a Qwen3-30B-A3B layer (q/k/v as one weight of 5120 rows, o) and its output
        // head, with both kernels (backend option float_gemv).
        if (t <= 8) {
            const PerfOp f16_ops[] = {{"f16 qkv", Op::MUL_MAT, 2048, 5120, 1, 1, Activation::SILU, false},
                                      {"f16 o", Op::MUL_MAT, 4096, 2048, 1, 1, Activation::SILU, false},
                                      {"f16 head", Op::MUL_MAT, 2048, 151936, 1, 1, Activation::SILU, false}};
            for (moe::FloatGemv g : {moe::FloatGemv::V2, moe::FloatGemv::V1}) {
                GpuEnv::get().float_gemv = g;
                std::printf("float_gemv=%s\n", g == moe::FloatGemv::V2 ? "v2" : "v1");
                for (const PerfOp& op : f16_ops) perf_case(op, Type::F16, t);
            }
            GpuEnv::get().float_gemv = moe::BackendConfig{}.float_gemv;
        }
    }
    if (std::getenv("MOEINFER_GPU_PERF_T") == nullptr) perf_case(dense, Type::Q8_0, 128);  // the kernel's dense mode
}

#endif  // MOEINFER_HAS_CUDA
