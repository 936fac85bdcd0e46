// The CUDA GEMV of dense float weights (F16, BF16, F32) at 1 .. 8 activation rows, both kernels (backend
// option float_gemv: v2, gemv_float_kernel; v1, the first one), run through a CUDA backend against a float64
// reference on the weights as the CPU converts them (moe::traits(type).to_float).
//
// Launches covered: q/k/v-like groups (one launch of three segments of 2,051, 1,030 and 262 rows, bias
// rows added in the epilogue of two of them, every product also an output; rows not a multiple of the
// block's 4) of model weights, whose grids are small enough to load weights before the PDL wait; a
// product of 8,203 rows (a grid over that limit); and weights that are not model weights (never loaded
// early). K of 96 (less than one step of 128 per row), 2,048 (whole steps), 2,080 and 4,160 (a partial
// last step; warps with different step counts; more than one batch of steps per warp).
//
// Tolerance per output: the GPU sums the products w_k x_k (each exact inside an FMA) in F32 along chains
// of at most d roundings, so |err| <= d u mag / (1 - d u) with u = 2^-24 and mag = sum |w_k x_k|; d <=
// 4 ceil(K / 512) + 8 for v2 (a lane's FMAs, 5 lane levels, 3 warp adds) and 32 + K / 1024 + 6 for v1
// (a block's FMAs, the chunk sums, 5 lane levels): d = 48 + K / 128 bounds both. A bias add rounds once
// more: + u |result|. A row or column mixed up, or a step skipped, is off by about mag.
#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/backend_config.h"
#include "core/graph.h"
#include "core/tensor.h"
#include "core/types.h"
#include "cuda/cuda_backend.h"
#include "cuda/fusion_plan.h"
#include "cuda_test_util.h"

namespace {

using moe::FloatGemv;
using moe::Tensor;
using moe::Type;
using moe::test::Device;

struct Weight {
    Tensor* t;
    std::vector<float> f;  // the weights as the CPU converts them, [n][k]
    std::vector<float> bias;  // empty: none
};

Weight make_weight(Device& dev, Type type, int64_t k, int64_t n, bool model_weight, bool with_bias,
                   std::mt19937_64& rng) {
    const std::vector<float> src = moe::test::random_f32(rng, static_cast<size_t>(k * n), -1.0f, 1.0f);
    std::vector<uint8_t> bytes(static_cast<size_t>(moe::row_bytes(type, k) * n));
    moe::traits(type).from_float(src.data(), bytes.data(), k * n);
    Weight w;
    w.t = dev.leaf(type, {k, n}, bytes.data(), model_weight);
    w.f.resize(src.size());
    moe::traits(type).to_float(bytes.data(), w.f.data(), k * n);
    if (with_bias) w.bias = moe::test::random_f32(rng, static_cast<size_t>(n), -2.0f, 2.0f);
    return w;
}

// Activations with magnitudes from 2^-3 to 2^3 changing every 32 values.
std::vector<float> random_acts(size_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> expo(-3.0f, 3.0f);
    std::vector<float> v(n);
    float scale = 1.0f;
    for (size_t i = 0; i < n; ++i) {
        if (i % 32 == 0) scale = std::exp2(expo(rng));
        v[i] = normal(rng) * scale;
    }
    return v;
}

// Checks the products (and bias sums) of `weights` with x [k, cols] computed by one backend: every output
// within the bound of the header comment. Returns the worst error / tolerance.
double check_outputs(const std::string& what, Device& dev, const std::vector<Weight>& weights,
                     const std::vector<Tensor*>& products, const std::vector<Tensor*>& sums, const std::vector<float>& x,
                     int64_t k, int64_t cols) {
    constexpr double kU = 1.0 / 16777216.0;
    const double d = 48.0 + static_cast<double>(k) / 128.0;
    double worst = 0.0;
    int bad = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
        const Weight& w = weights[i];
        const int64_t n = w.t->ne[1];
        const std::vector<uint8_t> pb = dev.download(*products[i]);
        std::vector<uint8_t> sb;
        if (sums[i] != nullptr) sb = dev.download(*sums[i]);
        for (int64_t c = 0; c < cols; ++c) {
            for (int64_t r = 0; r < n; ++r) {
                double ref = 0.0, mag = 0.0;
                for (int64_t j = 0; j < k; ++j) {
                    const double p = static_cast<double>(w.f[static_cast<size_t>(r * k + j)]) * x[static_cast<size_t>(c * k + j)];
                    ref += p;
                    mag += std::fabs(p);
                }
                const double tol = d * kU * mag / (1.0 - d * kU) + 1e-30;
                const size_t o = static_cast<size_t>(c * n + r);
                float got = 0.0f;
                std::memcpy(&got, pb.data() + 4 * o, 4);
                double err = std::fabs(got - ref);
                bool ok = std::isfinite(got) && err <= tol;
                worst = std::max(worst, err / tol);
                if (sums[i] != nullptr) {
                    const double b = w.bias[static_cast<size_t>(r)];
                    const double stol = tol + kU * (std::fabs(ref + b) + tol) + 1e-30;
                    float s = 0.0f;
                    std::memcpy(&s, sb.data() + 4 * o, 4);
                    const double serr = std::fabs(s - (ref + b));
                    ok = ok && std::isfinite(s) && serr <= stol;
                    worst = std::max(worst, serr / stol);
                }
                if (!ok && bad++ < 4) {
                    UNSCOPED_INFO(what << ": weight " << i << " row " << r << " column " << c << ": gpu " << got
                                       << ", float64 " << ref << ", tol " << tol);
                }
            }
        }
    }
    std::printf("  %-60s worst err/tol %.3g%s\n", what.c_str(), worst, bad ? "  FAILED" : "");
    INFO(what << ": " << bad << " outputs outside tolerance, seed " << moe::test::run_seed());
    CHECK(bad == 0);
    return worst;
}

struct Case {
    Type type;
    int64_t k;
    std::vector<int64_t> rows;  // one weight per entry: a launch of that many segments
    std::vector<int64_t> cols;
    bool model_weights;
};

// Runs the case's products of one activation on dev, a backend with float_gemv = g; checks every output.
void run_case(const Case& c, Device& dev, FloatGemv g, std::mt19937_64& rng) {
    std::vector<Weight> weights;
    for (size_t i = 0; i < c.rows.size(); ++i) {
        // Groups: bias rows on the first and the last weight, as q and v of a model with q/k/v biases.
        const bool bias = c.rows.size() > 1 && (i == 0 || i + 1 == c.rows.size());
        weights.push_back(make_weight(dev, c.type, c.k, c.rows[i], c.model_weights, bias, rng));
    }
    for (int64_t cols : c.cols) {
        moe::Graph graph;
        Tensor* x = graph.input(Type::F32, {c.k, cols}, "x");
        std::vector<Tensor*> products, sums;
        std::vector<Tensor*> bias_leaves;
        for (const Weight& w : weights) {
            Tensor* y = graph.mul_mat(w.t, x);
            graph.set_output(y);
            products.push_back(y);
            Tensor* s = nullptr;
            if (!w.bias.empty()) {
                s = graph.add(y, dev.leaf(Type::F32, {w.t->ne[1]}, w.bias.data()));
                graph.set_output(s);
            }
            sums.push_back(s);
        }
        const moe::AllocPlan plan = moe::plan_allocation(graph);
        moe::bind_allocation(graph, plan, dev.alloc(plan.arena_size));
        for (Tensor* o : graph.outputs()) dev.poison(*o);
        const std::vector<float> xv = random_acts(static_cast<size_t>(c.k * cols), rng);
        dev.upload(x->data, xv.data(), x->n_bytes());
        moe::test::require_ok(dev.be().compute(graph.nodes()));
        moe::test::require_ok(dev.be().synchronize());
        if (c.rows.size() > 1) {  // one launch of every product and bias add: the segments are what is tested
            const auto& items = dev.be().last_plan().items;
            REQUIRE(items.size() == 1);
            CHECK(items[0].kind == moe::cuda::FusedKind::kGemvGroup);
            CHECK(items[0].n_part == static_cast<int>(c.rows.size()) + 2);
        }
        std::string what = g == FloatGemv::V2 ? "v2 " : "v1 ";
        what += moe::type_name(c.type);
        what += " k ";
        what += std::to_string(c.k);
        what += " rows";
        for (int64_t r : c.rows) {
            what += ' ';
            what += std::to_string(r);
        }
        what += " cols ";
        what += std::to_string(cols);
        if (!c.model_weights) what += " (not model weights)";
        check_outputs(what, dev, weights, products, sums, xv, c.k, cols);
    }
}

}  // namespace

TEST_CASE("cuda dense GEMV of F16 / BF16 / F32 weights matches float64, float_gemv=v2 and v1, with segments "
          "and bias rows",
          "[gpu][cuda][matmul][gemv]") {
    MOE_GPU_OR_SKIP();
    std::mt19937_64 rng = moe::test::fresh_rng(0xF16);
    moe::BackendConfig v2, v1;
    v2.float_gemv = FloatGemv::V2;
    v1.float_gemv = FloatGemv::V1;
    Device dev_v2(v2), dev_v1(v1);
    const std::vector<int64_t> qkv = {2051, 1030, 262};
    for (Type type : {Type::F16, Type::BF16, Type::F32}) {
        const Case cases[] = {
            {type, 2048, qkv, {1, 2, 3, 5, 8}, true},
            {type, 2080, qkv, {1, 4}, true},
            {type, 96, qkv, {2, 7}, true},
            {type, 4160, qkv, {1, 8}, true},
            {type, 64, {8203}, {1, 6}, true},  // 2,051 blocks: over the early-load limit
            {type, 2080, {1030, 1027}, {1, 3}, false},
        };
        for (const Case& c : cases) {
            run_case(c, dev_v2, FloatGemv::V2, rng);
            run_case(c, dev_v1, FloatGemv::V1, rng);
        }
    }
}

#endif  // MOEINFER_HAS_CUDA
