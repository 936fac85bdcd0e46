// Backend consistency: every non-matmul op computed by the CUDA backend (one node through
// CudaBackend::compute) against the CPU backend's kernel (moe::cpu) on the same random inputs, odd and
// aligned shapes, strided views. Inputs are drawn from a fresh seed per run (Catch's --rng-seed
// replays one; the seed is printed with any failure) and are never all zero; each device output is
// poisoned (0xFF bytes: NaN) before the run, so an unwritten element fails.
//
// Tolerances (per element |gpu - cpu| <= rel * |cpu| + abs, stated again at each test):
//   exact (bitwise): MUL, ADD, GET_ROWS (all types: dequantisation is one exact product), TOPK,
//                    GATHER, CPY (F32 and round-to-nearest-even F16);
//   rel 1e-5:        SILU / SWIGLU / SWIGLU_OAI, RMS_NORM, SOFTMAX, ROPE, WEIGHTED_SUM (float math in
//                    another order, expf vs the CPU's 2-ulp exp, fused multiply-adds on the GPU);
//   rel 1e-4 + 2e-5: ATTENTION on the FP32 kernel (online softmax over other tile and split boundaries);
//   rel 2e-3 + 1e-3: ATTENTION on the tensor cores (Q and P rounded to F16: each moves an output by up
//                    to about u max|v| = 2^-11 with V drawn from [-1, 1], also where the output is near
//                    0; a model of that rounding in numpy used 0.26-0.28 of this tolerance on these cases,
//                    0.8 of rel 2e-3 + abs 3e-4, while one key too many or too few on the diagonal or the
//                    window edge used 6 to 45 times it).
//
// MOEINFER_GPU_PERF=1 adds a throughput table (GB/s over the bytes each op must move; median of 10
// timed runs after 3 warm-ups, timed with CUDA events on the compute stream) on large shapes, and
// prints how much of its tolerance the tensor-core attention used.
//
// Every test case is tagged [gpu] and is skipped with a visible warning where there is no device.
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../cpu/op_test_util.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.cuh"
#include "cuda/mapped_copy.cuh"
#include "cuda_test_util.h"

namespace {

using moe::Op;
using moe::Status;
using moe::Tensor;
using moe::Type;
using moe::test::fresh_rng;
using moe::test::require_ok;
using moe::test::run_seed;
using moe::test::elem;
using moe::test::fill_uniform;
using moe::test::TensorPool;

moe::cuda::CudaBackend& gpu() {
    static std::unique_ptr<moe::Backend> backend = [] {
        auto b = moe::cuda::CudaBackend::create(0);
        require_ok(b.status());
        return std::move(b).value();
    }();
    return static_cast<moe::cuda::CudaBackend&>(*backend);
}

size_t elem_bytes(Type t) { return t == Type::I32 ? 4 : static_cast<size_t>(moe::traits(t).block_bytes); }

// Bytes from t.data to the end of its last element (views included).
size_t extent(const Tensor& t) {
    for (int64_t n : t.ne)
        if (n <= 0) return 0;
    size_t e = t.nb[0] == elem_bytes(t.type) ? moe::test::bytes_per_row(t.type, t.ne[0])
                                             : static_cast<size_t>(t.ne[0] - 1) * t.nb[0] + elem_bytes(t.type);
    for (int d = 1; d < 4; ++d) e += static_cast<size_t>(t.ne[d] - 1) * t.nb[d];
    return e;
}

// Device copies of host tensors: the same shapes, strides and views, in device buffers.
class DeviceMirror {
public:
    // The device twin of `h` and of everything it reads or views. Contents are uploaded, except for
    // a tensor of its own that is `h` itself when poison_dst: that one is filled with 0xFF bytes.
    Tensor* of(Tensor* h, bool poison_dst = false) {
        if (auto it = map_.find(h); it != map_.end()) return it->second;
        Tensor& d = tensors_.emplace_back(*h);
        map_[h] = &d;
        if (h->view_src != nullptr) {
            Tensor* base = of(h->view_src);
            d.view_src = base;
            d.data = static_cast<uint8_t*>(base->data) + h->view_offset;
        } else {
            const size_t n = extent(*h);
            auto buf = gpu().alloc_buffer(std::max<size_t>(n, 1));
            require_ok(buf.status());
            d.data = buf.value()->data();
            d.buffer = buf.value().get();
            buffers_.push_back(std::move(buf).value());
            if (poison_dst) {
                staging_.emplace_back(n, 0xFF);
                require_ok(gpu().copy_to_device(d.data, staging_.back().data(), n));
            } else {
                require_ok(gpu().copy_to_device(d.data, h->data, n));
            }
        }
        for (int i = 0; i < moe::kMaxSrc; ++i) {
            if (h->src[i] != nullptr) d.src[i] = of(h->src[i]);
        }
        return &d;
    }

    // The device contents of the twin of `h`, as a host tensor with h's shape and strides.
    Tensor download(Tensor* h) {
        Tensor* d = of(h);
        const size_t n = extent(*h);
        std::vector<uint8_t>& mem = staging_.emplace_back(n + 1);
        require_ok(gpu().copy_to_host(mem.data(), d->data, n));
        require_ok(gpu().synchronize());
        Tensor t = *h;
        t.data = mem.data();
        return t;
    }

private:
    std::map<const Tensor*, Tensor*> map_;
    std::deque<Tensor> tensors_;
    std::vector<std::unique_ptr<moe::Buffer>> buffers_;
    std::deque<std::vector<uint8_t>> staging_;
};

// Uploads the node's inputs, computes it on the CPU (after the upload: CPY writes its input cache)
// and on the GPU, and returns the GPU result (of the node, or of its view_src for CPY).
template <typename CpuFn>
Tensor run_both(Tensor* node, CpuFn&& cpu_fn, DeviceMirror& dev) {
    Tensor* dnode = dev.of(node, true);
    require_ok(gpu().synchronize());
    require_ok(cpu_fn(*node));
    Tensor* nodes[] = {dnode};
    require_ok(gpu().compute(nodes));
    require_ok(gpu().synchronize());
    return dev.download(node->view_src != nullptr ? node->view_src : node);
}

// Every element of F32 tensors got vs want (same shape): |g - w| <= rel |w| + abs; NaN fails.
// Returns the largest |g - w| / (rel |w| + abs) (1 = at the tolerance).
double compare_f32(const Tensor& got, const Tensor& want, double rel, double abs) {
    int64_t bad = 0;
    double worst = 0.0, used = 0.0;
    for (int64_t i3 = 0; i3 < want.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < want.ne[2]; ++i2)
            for (int64_t i1 = 0; i1 < want.ne[1]; ++i1)
                for (int64_t i0 = 0; i0 < want.ne[0]; ++i0) {
                    const double g = *elem<float>(got, i0, i1, i2, i3);
                    const double w = *elem<float>(want, i0, i1, i2, i3);
                    const double err = std::fabs(g - w);
                    const bool ok = (std::isnan(w) && std::isnan(g)) || err <= rel * std::fabs(w) + abs;
                    if (!std::isnan(err)) {
                        worst = std::max(worst, err);
                        used = std::max(used, err / (rel * std::fabs(w) + abs));
                    }
                    if (!ok && bad++ < 5) {
                        INFO("seed " << run_seed() << " at [" << i0 << ", " << i1 << ", " << i2 << ", " << i3
                                     << "]: gpu " << g << ", cpu " << w);
                        CHECK(false);
                    }
                }
    INFO("seed " << run_seed() << ", worst abs error " << worst << ", " << bad << " bad elements");
    CHECK(bad == 0);
    return used;
}

bool perf_mode() {
    const char* env = std::getenv("MOEINFER_GPU_PERF");
    return env != nullptr && std::string(env) == "1";
}

// Every element bit for bit (F32, F16 or I32).
void compare_exact(const Tensor& got, const Tensor& want) {
    const size_t esz = elem_bytes(want.type);
    int64_t bad = 0;
    for (int64_t i3 = 0; i3 < want.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < want.ne[2]; ++i2)
            for (int64_t i1 = 0; i1 < want.ne[1]; ++i1)
                for (int64_t i0 = 0; i0 < want.ne[0]; ++i0) {
                    const uint8_t* g = got.row(i1, i2, i3) + static_cast<size_t>(i0) * got.nb[0];
                    const uint8_t* w = want.row(i1, i2, i3) + static_cast<size_t>(i0) * want.nb[0];
                    if (std::memcmp(g, w, esz) != 0 && bad++ < 5) {
                        uint32_t gv = 0, wv = 0;
                        std::memcpy(&gv, g, esz);
                        std::memcpy(&wv, w, esz);
                        INFO("seed " << run_seed() << " at [" << i0 << ", " << i1 << ", " << i2 << ", " << i3
                                     << "]: gpu bits 0x" << std::hex << gv << ", cpu bits 0x" << wv);
                        CHECK(false);
                    }
                }
    INFO("seed " << run_seed());
    CHECK(bad == 0);
}

// TensorPool takes shapes as initializer lists; these take a vector (shapes kept in tables).
Tensor* make_ne(TensorPool& pool, Type t, const std::vector<int64_t>& ne) {
    switch (ne.size()) {
        case 1: return pool.make(t, {ne[0]});
        case 2: return pool.make(t, {ne[0], ne[1]});
        case 3: return pool.make(t, {ne[0], ne[1], ne[2]});
        default: return pool.make(t, {ne[0], ne[1], ne[2], ne[3]});
    }
}

Tensor* node_ne(TensorPool& pool, Op op, Type t, const std::vector<int64_t>& ne, std::initializer_list<Tensor*> srcs) {
    Tensor* n = make_ne(pool, t, ne);
    n->op = op;
    int i = 0;
    for (Tensor* s : srcs) n->src[i++] = s;
    return n;
}

void fill_ids(Tensor& t, std::mt19937_64& rng, int32_t lo, int32_t hi) {
    std::uniform_int_distribution<int32_t> u(lo, hi - 1);
    for (int64_t i1 = 0; i1 < t.ne[1]; ++i1)
        for (int64_t i0 = 0; i0 < t.ne[0]; ++i0) *elem<int32_t>(t, i0, i1) = u(rng);
}

}  // namespace

TEST_CASE("CUDA MUL and ADD match the CPU bit for bit, with broadcasting and views", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(1);
    struct Case {
        std::vector<int64_t> a, b;
    };
    // Aligned (vectorised) rows, odd rows, scalar and repeated src1 rows, broadcasting in dims 1..3.
    const Case cases[] = {
        {{4096, 33}, {4096, 33}}, {{2048, 5}, {2048}},           {{37, 5, 3}, {37, 1, 3}},
        {{64, 8, 2, 3}, {1, 8, 1, 3}}, {{128, 7}, {32, 1}},       {{129, 3, 2}, {129, 3, 1}},
        {{1, 70000}, {1, 70000}},
    };
    for (const Op op : {Op::MUL, Op::ADD}) {
        for (const Case& c : cases) {
            TensorPool pool;
            Tensor* a = make_ne(pool, Type::F32, c.a);
            Tensor* b = make_ne(pool, Type::F32, c.b);
            fill_uniform(*a, rng, -3.0f, 3.0f);
            fill_uniform(*b, rng, -3.0f, 3.0f);
            Tensor* dst = node_ne(pool, op, Type::F32, c.a, {a, b});
            INFO(moe::op_name(op) << " a " << a->ne[0] << "x" << a->ne[1] << "x" << a->ne[2] << " b " << b->ne[0]);
            DeviceMirror dev;
            const Tensor got = run_both(dst, [](Tensor& n) { return moe::cpu::binary(n); }, dev);
            compare_exact(got, *dst);  // exact: one IEEE operation per element
        }
        // A strided view as src0 (rows of 100 inside rows of 104) into a contiguous dst.
        TensorPool pool;
        Tensor* base = pool.make(Type::F32, {104, 9, 2});
        fill_uniform(*base, rng, -1.0f, 1.0f);
        Tensor* a = pool.view(base, {100, 9, 2}, {base->nb[1], base->nb[2], base->nb[3]}, 4 * sizeof(float));
        Tensor* b = pool.make(Type::F32, {100, 9, 1});
        fill_uniform(*b, rng, -1.0f, 1.0f);
        Tensor* dst = pool.node(op, Type::F32, {100, 9, 2}, {a, b});
        DeviceMirror dev;
        compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::binary(n); }, dev), *dst);
    }
}

TEST_CASE("CUDA SILU, SWIGLU and SWIGLU_OAI match the CPU", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(2);
    // rel 1e-5, abs 1e-6: expf on the GPU vs the CPU's 2-ulp exp, and FMA contraction.
    for (const auto& shape : {std::vector<int64_t>{768, 13}, {2880, 5}, {33, 3, 2}, {4096, 2}}) {
        for (const Op op : {Op::SILU, Op::SWIGLU, Op::SWIGLU_OAI}) {
            TensorPool pool;
            Tensor* g = make_ne(pool, Type::F32, shape);
            Tensor* u = make_ne(pool, Type::F32, shape);
            fill_uniform(*g, rng, -10.0f, 10.0f);  // beyond the OAI limit of 7 on both sides
            fill_uniform(*u, rng, -10.0f, 10.0f);
            Tensor* dst =
                op == Op::SILU ? node_ne(pool, op, Type::F32, shape, {g}) : node_ne(pool, op, Type::F32, shape, {g, u});
            dst->params.f[0] = 1.702f;
            dst->params.f[1] = 7.0f;
            INFO(moe::op_name(op) << " " << shape[0] << "x" << shape[1]);
            DeviceMirror dev;
            const Tensor got = run_both(
                dst, [op](Tensor& n) { return op == Op::SILU ? moe::cpu::unary(n) : moe::cpu::glu(n); }, dev);
            compare_f32(got, *dst, 1e-5, 1e-6);
        }
    }
}

TEST_CASE("CUDA SIGMOID and NORM_SCALE match the CPU (the sigmoid routers' ops)", "[gpu][routing]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(41);
    // rel 1e-5: expf vs the CPU's 2-ulp exp; NORM_SCALE's sum in another order (k <= 1500 positive
    // terms: within 1500 u = 9e-5 in the worst case, within 1e-5 for these random rows by far).
    for (const auto& shape : {std::vector<int64_t>{128, 13}, {160, 5}, {8, 512}, {33, 3, 2}, {1500, 2}}) {
        TensorPool pool;
        Tensor* x = make_ne(pool, Type::F32, shape);
        fill_uniform(*x, rng, -30.0f, 30.0f);
        Tensor* sig = node_ne(pool, Op::SIGMOID, Type::F32, shape, {x});
        INFO("SIGMOID " << shape[0] << "x" << shape[1]);
        DeviceMirror dev;
        compare_f32(run_both(sig, [](Tensor& n) { return moe::cpu::unary(n); }, dev), *sig, 1e-5, 1e-30);
        for (const bool normalize : {true, false}) {
            TensorPool p2;
            Tensor* w = make_ne(p2, Type::F32, shape);
            fill_uniform(*w, rng, 1e-3f, 1.0f);
            Tensor* ns = node_ne(p2, Op::NORM_SCALE, Type::F32, shape, {w});
            ns->params.i[0] = normalize ? 1 : 0;
            ns->params.f[0] = 2.5f;
            INFO("NORM_SCALE normalize=" << normalize);
            DeviceMirror dev2;
            compare_f32(run_both(ns, [](Tensor& n) { return moe::cpu::norm_scale(n); }, dev2), *ns, 1e-5, 0.0);
        }
    }
}

TEST_CASE("CUDA RMS_NORM and SOFTMAX match the CPU (warp rows and block rows)", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(3);
    // rel 1e-5 (+1e-6 / 1e-7 abs): float reductions in another order; softmax's exp differs by <= 2 ulp.
    for (const auto& shape : {std::vector<int64_t>{2048, 7, 1}, {128, 32, 5}, {2880, 3, 1}, {17, 9, 2}, {1500, 2, 2}}) {
        for (const bool weighted : {false, true}) {
            TensorPool pool;
            Tensor* x = pool.make(Type::F32, {shape[0], shape[1], shape[2]});
            fill_uniform(*x, rng, -4.0f, 4.0f);
            Tensor* w = nullptr;
            if (weighted) {
                w = pool.make(Type::F32, {shape[0]});
                fill_uniform(*w, rng, 0.5f, 1.5f);
            }
            Tensor* dst = pool.node(Op::RMS_NORM, Type::F32, {shape[0], shape[1], shape[2]}, {x, w});
            dst->params.f[0] = 1e-6f;
            INFO("RMS_NORM " << shape[0] << "x" << shape[1] << "x" << shape[2] << " weighted " << weighted);
            DeviceMirror dev;
            compare_f32(run_both(dst, [](Tensor& n) { return moe::cpu::rms_norm(n); }, dev), *dst, 1e-5, 1e-6);
        }
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {shape[0], shape[1], shape[2]});
        fill_uniform(*x, rng, -8.0f, 8.0f);
        // One fully masked row must come out as zeros on both backends.
        for (int64_t i = 0; i < shape[0]; ++i) *elem<float>(*x, i, 1, 0) = -std::numeric_limits<float>::infinity();
        Tensor* dst = pool.node(Op::SOFTMAX, Type::F32, {shape[0], shape[1], shape[2]}, {x});
        INFO("SOFTMAX " << shape[0] << "x" << shape[1] << "x" << shape[2]);
        DeviceMirror dev;
        compare_f32(run_both(dst, [](Tensor& n) { return moe::cpu::softmax(n); }, dev), *dst, 1e-5, 1e-7);
    }
}

TEST_CASE("CUDA ROPE matches the CPU: NeoX, YaRN with and without truncation, partial dims", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(4);
    struct Case {
        int64_t D, H, T;
        moe::RopeParams p;
        bool strided;
    };
    moe::RopeParams qwen;
    qwen.n_dims = 128;
    qwen.freq_base = 1000000.0f;
    moe::RopeParams oss;  // gpt-oss: YaRN factor 32 over 4096, HF's truncate=false
    oss.n_dims = 64;
    oss.n_ctx_orig = 4096;
    oss.freq_base = 150000.0f;
    oss.freq_scale = 1.0f / 32.0f;
    oss.ext_factor = 1.0f;
    moe::RopeParams oss_trunc = oss;
    oss_trunc.yarn_truncate = true;
    moe::RopeParams partial;
    partial.n_dims = 64;
    partial.freq_base = 10000.0f;
    partial.freq_scale = 0.5f;
    const Case cases[] = {
        {128, 32, 9, qwen, false}, {64, 64, 5, oss, false}, {64, 12, 7, oss_trunc, true},
        {96, 5, 3, partial, true}, {128, 4, 1, qwen, false},
    };
    // rel 1e-5, abs 2e-6: angles in double on both sides; cos/sin may differ by an ulp of double.
    for (const Case& c : cases) {
        TensorPool pool;
        Tensor* x = nullptr;
        if (c.strided) {  // rows of D inside rows of D + 8
            Tensor* base = pool.make(Type::F32, {c.D + 8, c.H, c.T});
            fill_uniform(*base, rng, -1.0f, 1.0f);
            x = pool.view(base, {c.D, c.H, c.T}, {base->nb[1], base->nb[2], base->nb[3]}, 0);
        } else {
            x = pool.make(Type::F32, {c.D, c.H, c.T});
            fill_uniform(*x, rng, -1.0f, 1.0f);
        }
        Tensor* pos = pool.make(Type::I32, {c.T});
        fill_ids(*pos, rng, 0, 131072);  // deep positions, out of order
        Tensor* dst = pool.node(Op::ROPE, Type::F32, {c.D, c.H, c.T}, {x, pos});
        dst->set_rope_params(c.p);
        INFO("ROPE D " << c.D << " H " << c.H << " T " << c.T << " n_dims " << c.p.n_dims << " ext " << c.p.ext_factor
                       << " truncate " << c.p.yarn_truncate);
        DeviceMirror dev;
        compare_f32(run_both(dst, [](Tensor& n) { return moe::cpu::rope(n); }, dev), *dst, 1e-5, 2e-6);
    }
}

TEST_CASE("CUDA GET_ROWS matches the CPU bit for bit for every weight type", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(5);
    for (const Type type : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::Q4_1, Type::Q5_0,
                            Type::Q5_1, Type::IQ4_NL, Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K,
                            Type::IQ4_XS}) {
        for (const int64_t K : {64, 2880, 4096}) {
            if (K % moe::traits(type).block_size != 0) continue;  // the super-block types: K = 4096
            const int64_t R = 50, T = 13;
            TensorPool pool;
            Tensor* w = pool.make(type, {K, R});
            std::vector<float> row(static_cast<size_t>(K));
            std::uniform_real_distribution<float> u(-2.0f, 2.0f);
            for (int64_t r = 0; r < R; ++r) {
                for (float& v : row) v = u(rng);
                moe::traits(type).from_float(row.data(), w->row(r), K);
            }
            Tensor* ids = pool.make(Type::I32, {T});
            fill_ids(*ids, rng, 0, static_cast<int32_t>(R));
            *elem<int32_t>(*ids, 3) = *elem<int32_t>(*ids, 4);  // a repeated id
            Tensor* dst = pool.node(Op::GET_ROWS, Type::F32, {K, T}, {w, ids});
            INFO("GET_ROWS " << moe::type_name(type) << " K " << K);
            DeviceMirror dev;
            compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::get_rows(n); }, dev), *dst);
        }
    }
}

TEST_CASE("CUDA MASK_IDS and GET_ROWS with kNoExpert ids match the CPU bit for bit", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(8);
    for (const auto& [E, k, T] : {std::tuple<int64_t, int64_t, int64_t>{128, 8, 37}, {32, 4, 300}, {5, 1, 1}}) {
        TensorPool pool;
        Tensor* ids = pool.make(Type::I32, {k, T});
        fill_ids(*ids, rng, -1, static_cast<int32_t>(E));  // some already kNoExpert
        Tensor* groups = pool.make(Type::I32, {E});
        fill_ids(*groups, rng, 0, 2);
        for (int32_t keep : {0, 1}) {
            Tensor* dst = pool.node(Op::MASK_IDS, Type::I32, {k, T}, {ids, groups});
            dst->params.i[0] = keep;
            INFO("MASK_IDS E " << E << " k " << k << " T " << T << " keep " << keep);
            DeviceMirror dev;
            compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::mask_ids(n); }, dev), *dst);
        }
        {
            // Remap mode: the slice rows of a partly resident layer's experts (-1: not resident).
            Tensor* rows = pool.make(Type::I32, {E});
            fill_ids(*rows, rng, -1, static_cast<int32_t>(E));
            Tensor* dst = pool.node(Op::MASK_IDS, Type::I32, {k, T}, {ids, rows});
            dst->params.i[1] = 1;
            INFO("MASK_IDS remap E " << E << " k " << k << " T " << T);
            DeviceMirror dev;
            compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::mask_ids(n); }, dev), *dst);
        }
        // The masked ids pick expert-bias rows: kNoExpert gives a zero row.
        Tensor* w = pool.make(Type::F32, {64, E});
        fill_uniform(*w, rng, -1.0f, 1.0f);
        Tensor* flat = pool.make(Type::I32, {k * T});
        fill_ids(*flat, rng, -1, static_cast<int32_t>(E));
        Tensor* rows = pool.node(Op::GET_ROWS, Type::F32, {64, k * T}, {w, flat});
        DeviceMirror dev;
        compare_exact(run_both(rows, [](Tensor& n) { return moe::cpu::get_rows(n); }, dev), *rows);
    }
}

TEST_CASE("CUDA GET_ROWS and GATHER report an out-of-range id at synchronize", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(6);
    TensorPool pool;
    Tensor* w = pool.make(Type::F32, {64, 10});
    fill_uniform(*w, rng, -1.0f, 1.0f);
    Tensor* ids = pool.make(Type::I32, {3});
    *elem<int32_t>(*ids, 0) = 1;
    *elem<int32_t>(*ids, 1) = 10;  // one past the last row
    *elem<int32_t>(*ids, 2) = 2;
    Tensor* dst = pool.node(Op::GET_ROWS, Type::F32, {64, 3}, {w, ids});
    DeviceMirror dev;
    Tensor* nodes[] = {dev.of(dst, true)};
    require_ok(gpu().synchronize());
    require_ok(gpu().compute(nodes));
    const Status s = gpu().synchronize();
    CHECK(s.code() == MOE_STATUS_OUT_OF_RANGE);
    require_ok(gpu().synchronize());  // reported once, then cleared
    const Tensor got = dev.download(dst);
    CHECK(std::isnan(*elem<float>(got, 0, 1)));
    CHECK(*elem<float>(got, 5, 2) == *elem<float>(*w, 5, 2));  // the valid rows are still right
}

TEST_CASE("CUDA CPY with rows reports a row outside the cache at synchronize and writes the others", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(61);
    TensorPool pool;
    Tensor* cache = pool.make(Type::F16, {64, 2, 8});
    fill_uniform(*cache, rng, -1.0f, 1.0f);
    Tensor* src = pool.make(Type::F32, {64, 2, 3});
    fill_uniform(*src, rng, -1.0f, 1.0f);
    Tensor* rows = pool.make(Type::I32, {3});
    *elem<int32_t>(*rows, 0) = 5;
    *elem<int32_t>(*rows, 1) = 8;  // one past the last row
    *elem<int32_t>(*rows, 2) = 0;
    Tensor* node = pool.node(Op::CPY, Type::F16, {64, 2, 8}, {src, cache, rows});
    for (int i = 0; i < 4; ++i) node->nb[i] = cache->nb[i];
    node->data = cache->data;
    node->view_src = cache;
    DeviceMirror dev;
    Tensor* nodes[] = {dev.of(node)};
    require_ok(gpu().synchronize());
    require_ok(gpu().compute(nodes));
    CHECK(gpu().synchronize().code() == MOE_STATUS_OUT_OF_RANGE);
    require_ok(gpu().synchronize());  // reported once, then cleared
    const Tensor got = dev.download(cache);
    for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < 64; ++i) {
            CHECK(*elem<uint16_t>(got, i, h, 5) == moe::fp32_to_fp16(*elem<float>(*src, i, h, 0)));
            CHECK(*elem<uint16_t>(got, i, h, 0) == moe::fp32_to_fp16(*elem<float>(*src, i, h, 2)));
            CHECK(*elem<uint16_t>(got, i, h, 7) == *elem<uint16_t>(*cache, i, h, 7));  // untouched
        }
    }
}

TEST_CASE("CUDA TOPK, GATHER and WEIGHTED_SUM match the CPU", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(7);
    // TOPK: exact indices, ties to the lower index (the second pass draws from 4 distinct values).
    for (const bool ties : {false, true}) {
        for (const auto& [E, T, k] : {std::tuple<int64_t, int64_t, int32_t>{128, 37, 8}, {32, 19, 4}, {7, 5, 7},
                                      {300, 3, 16}}) {
            TensorPool pool;
            Tensor* x = pool.make(Type::F32, {E, T});
            fill_uniform(*x, rng, -5.0f, 5.0f);
            if (ties) {
                const float levels[] = {-1.0f, 0.0f, 0.5f, 2.0f};
                std::uniform_int_distribution<int> pick(0, 3);
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t e = 0; e < E; ++e) *elem<float>(*x, e, t) = levels[pick(rng)];
            }
            Tensor* dst = pool.node(Op::TOPK, Type::I32, {k, T}, {x});
            dst->params.i[0] = k;
            INFO("TOPK E " << E << " T " << T << " k " << k << " ties " << ties);
            DeviceMirror dev;
            compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::topk(n); }, dev), *dst);
        }
    }
    // GATHER: exact.
    for (const auto& [E, T, k] : {std::tuple<int64_t, int64_t, int64_t>{128, 21, 8}, {32, 1, 4}, {5, 300, 3}}) {
        TensorPool pool;
        Tensor* x = pool.make(Type::F32, {E, T});
        fill_uniform(*x, rng, -5.0f, 5.0f);
        Tensor* ids = pool.make(Type::I32, {k, T});
        fill_ids(*ids, rng, 0, static_cast<int32_t>(E));
        Tensor* dst = pool.node(Op::GATHER, Type::F32, {k, T}, {x, ids});
        INFO("GATHER E " << E << " T " << T << " k " << k);
        DeviceMirror dev;
        compare_exact(run_both(dst, [](Tensor& n) { return moe::cpu::gather(n); }, dev), *dst);
    }
    // WEIGHTED_SUM: rel 1e-5, abs 2e-6 (fused multiply-adds on the GPU; sums of 8 terms of up to 2).
    for (const auto& [N, k, T] : {std::tuple<int64_t, int64_t, int64_t>{2048, 8, 13}, {2880, 4, 3}, {5, 1, 2},
                                  {777, 3, 300}}) {
        TensorPool pool;
        Tensor* y = pool.make(Type::F32, {N, k, T});
        fill_uniform(*y, rng, -2.0f, 2.0f);
        Tensor* w = pool.make(Type::F32, {k, T});
        fill_uniform(*w, rng, 0.0f, 1.0f);
        Tensor* dst = pool.node(Op::WEIGHTED_SUM, Type::F32, {N, T}, {y, w});
        INFO("WEIGHTED_SUM N " << N << " k " << k << " T " << T);
        DeviceMirror dev;
        compare_f32(run_both(dst, [](Tensor& n) { return moe::cpu::weighted_sum(n); }, dev), *dst, 1e-5, 2e-6);
        // With ids: kNoExpert slots are skipped, NaN rows there included (unwritten expert outputs).
        Tensor* ids = pool.make(Type::I32, {k, T});
        fill_ids(*ids, rng, -1, 3);
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t j = 0; j < k; ++j) {
                if (*elem<int32_t>(*ids, j, t) != moe::kNoExpert) continue;
                for (int64_t i = 0; i < N; ++i) *elem<float>(*y, i, j, t) = std::numeric_limits<float>::quiet_NaN();
            }
        }
        Tensor* part = pool.node(Op::WEIGHTED_SUM, Type::F32, {N, T}, {y, w, ids});
        DeviceMirror dev2;
        compare_f32(run_both(part, [](Tensor& n) { return moe::cpu::weighted_sum(n); }, dev2), *part, 1e-5, 2e-6);
    }
}

TEST_CASE("CUDA CPY writes F32 into F16 / F32 cache views like the CPU", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(8);
    // Exact: every byte of the whole cache (the slot written and everything around it).
    for (const Type ct : {Type::F16, Type::F32}) {
        const size_t es = elem_bytes(ct);
        const int64_t D = 128, Hkv = 4, n_ctx = 64, T = 7, slot = 10;
        {  // same shape: src [D, Hkv, T] into cache[:, :, slot : slot + T]
            TensorPool pool;
            Tensor* cache = pool.make(ct, {D, Hkv, n_ctx});
            fill_uniform(*cache, rng, -1.0f, 1.0f);
            Tensor* src = pool.make(Type::F32, {D, Hkv, T});
            fill_uniform(*src, rng, -70000.0f, 70000.0f);  // beyond F16's range too: inf both sides
            Tensor* view = pool.view(cache, {D, Hkv, T}, {cache->nb[1], cache->nb[2], cache->nb[3]},
                                     static_cast<size_t>(slot) * cache->nb[2]);
            view->op = Op::CPY;
            view->src[0] = src;
            view->src[1] = cache;
            INFO("CPY same shape into " << moe::type_name(ct));
            DeviceMirror dev;
            compare_exact(run_both(view, [](Tensor& n) { return moe::cpu::cpy(n); }, dev), *cache);
        }
        {  // reshape: src [D * Hkv, T] contiguous into the same view
            TensorPool pool;
            Tensor* cache = pool.make(ct, {D, Hkv, n_ctx});
            fill_uniform(*cache, rng, -1.0f, 1.0f);
            Tensor* src = pool.make(Type::F32, {D * Hkv, T});
            fill_uniform(*src, rng, -3.0f, 3.0f);
            Tensor* view = pool.view(cache, {D, Hkv, T}, {cache->nb[1], cache->nb[2], cache->nb[3]},
                                     static_cast<size_t>(slot) * cache->nb[2]);
            view->op = Op::CPY;
            view->src[0] = src;
            view->src[1] = cache;
            INFO("CPY reshaped into " << moe::type_name(ct));
            DeviceMirror dev;
            compare_exact(run_both(view, [](Tensor& n) { return moe::cpu::cpy(n); }, dev), *cache);
        }
        {  // transposed slot: cache [n_ctx, 96] (positions fastest); the view's element stride is a row
            TensorPool pool;
            const int64_t Dv = 96;
            Tensor* cache = pool.make(ct, {n_ctx, Dv});
            fill_uniform(*cache, rng, -1.0f, 1.0f);
            Tensor* src = pool.make(Type::F32, {Dv, T});
            fill_uniform(*src, rng, -3.0f, 3.0f);
            Tensor& v = *pool.view(cache, {Dv, T}, {es}, static_cast<size_t>(slot) * es);
            v.nb[0] = cache->nb[1];
            v.nb[2] = v.nb[1] * static_cast<size_t>(T);
            v.nb[3] = v.nb[2];
            v.op = Op::CPY;
            v.src[0] = src;
            v.src[1] = cache;
            INFO("CPY transposed into " << moe::type_name(ct));
            DeviceMirror dev;
            compare_exact(run_both(&v, [](Tensor& n) { return moe::cpu::cpy(n); }, dev), *cache);
        }
        {  // rows (the stable KV addressing): a strided src [D, Hkv, T] into the rows a shuffled index names
            TensorPool pool;
            Tensor* cache = pool.make(ct, {D, Hkv, n_ctx});
            fill_uniform(*cache, rng, -1.0f, 1.0f);
            Tensor* wide = pool.make(Type::F32, {D, Hkv + 2, T});
            fill_uniform(*wide, rng, -70000.0f, 70000.0f);
            Tensor* src = pool.view(wide, {D, Hkv, T}, {wide->nb[1], wide->nb[2], wide->nb[3]}, wide->nb[1]);
            std::vector<int32_t> order(static_cast<size_t>(n_ctx));
            std::iota(order.begin(), order.end(), 0);
            std::shuffle(order.begin(), order.end(), rng);
            Tensor* rows = pool.make(Type::I32, {T});
            for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*rows, t) = order[static_cast<size_t>(t)];
            Tensor* node = pool.node(Op::CPY, ct, {D, Hkv, n_ctx}, {src, cache, rows});
            for (int i = 0; i < 4; ++i) node->nb[i] = cache->nb[i];
            node->data = cache->data;
            node->view_src = cache;
            INFO("CPY with rows into " << moe::type_name(ct));
            DeviceMirror dev;
            compare_exact(run_both(node, [](Tensor& n) { return moe::cpu::cpy(n); }, dev), *cache);
        }
    }
}

namespace {

// q [D, H, T]; K/V caches [D, Hkv, n_ctx] holding n_kv valid rows (NaN after them, so a read past
// n_kv shows); queries at positions n_kv - T .. n_kv - 1. pad > 0: q, K and V are views of rows
// D + pad long (pad 4 with F16 leaves K/V rows 8-byte aligned: the element-wise load path).
Tensor* attention_node(TensorPool& pool, std::mt19937_64& rng, int64_t D, int64_t H, int64_t Hkv, int64_t T,
                       int64_t n_kv, Type kv, bool sinks, int32_t window, int64_t pad) {
    const int64_t n_ctx = n_kv + 11;
    Tensor* qb = pool.make(Type::F32, {D + pad, H, T});
    fill_uniform(*qb, rng, -2.0f, 2.0f);
    Tensor* q = pool.view(qb, {D, H, T}, {qb->nb[1], qb->nb[2], qb->nb[3]}, 0);
    Tensor* kvt[2];
    for (Tensor*& c : kvt) {
        Tensor* cache = pool.make(kv, {D + pad, Hkv, n_ctx});
        fill_uniform(*cache, rng, -1.0f, 1.0f);
        for (int64_t j = n_kv; j < n_ctx; ++j)
            for (int64_t g = 0; g < Hkv; ++g)
                for (int64_t i = 0; i < D + pad; ++i) {
                    if (kv == Type::F16) {
                        *elem<uint16_t>(*cache, i, g, j) = 0x7E00;
                    } else {
                        *elem<float>(*cache, i, g, j) = std::numeric_limits<float>::quiet_NaN();
                    }
                }
        c = pool.view(cache, {D, Hkv, n_ctx}, {cache->nb[1], cache->nb[2], cache->nb[3]}, 0);
    }
    Tensor* pos = pool.make(Type::I32, {T});
    for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*pos, t) = static_cast<int32_t>(n_kv - T + t);
    Tensor* sk = nullptr;
    if (sinks) {
        sk = pool.make(Type::F32, {H});
        fill_uniform(*sk, rng, -2.0f, 3.0f);
    }
    Tensor* dst = pool.node(Op::ATTENTION, Type::F32, {D, H, T}, {q, kvt[0], kvt[1], pos, sk});
    dst->params.f[0] = 1.0f / std::sqrt(static_cast<float>(D));
    dst->params.i[0] = window;
    dst->params.i[1] = static_cast<int32_t>(n_kv);
    return dst;
}

struct AttnTolerance {
    double rel, abs;
};

// The tolerance of the kernel that computes `node` (device pointers); see the top of this file.
AttnTolerance attention_tolerance(const Tensor& node) {
    if (moe::cuda::attention_uses_tensor_cores(node)) return {2e-3, 1e-3};
    return {1e-4, 2e-5};
}

}  // namespace

TEST_CASE("CUDA ATTENTION matches the CPU: prefill, decode split-K, GQA, windows, sinks", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(9);
    struct Case {
        int64_t D, H, Hkv, T, n_kv;
        Type kv;
        bool sinks;
        int32_t window;
        int64_t pad;
    };
    const Case cases[] = {
        {128, 8, 2, 37, 57, Type::F16, false, 0, 0},      // qwen-like prefill after a cached prefix
        {64, 16, 2, 45, 45, Type::F16, true, 16, 0},      // gpt-oss-like: window + sinks
        {128, 32, 4, 1, 3000, Type::F16, false, 0, 0},    // decode at depth: split-K
        {64, 64, 8, 1, 5000, Type::F16, true, 128, 0},    // decode, window + sinks
        {64, 64, 8, 1, 5000, Type::F16, true, 0, 8},      // decode, sinks, strided views
        {64, 16, 4, 9, 700, Type::F16, true, 0, 4},       // unaligned views: element-wise loads
        {96, 6, 3, 19, 203, Type::F32, false, 0, 8},      // F32 cache, odd sizes, strided views
        {32, 4, 1, 5, 77, Type::F32, true, 8, 0},         // MQA, tiny window
        {256, 4, 2, 3, 1000, Type::F16, false, 0, 0},     // wide heads, multi-token decode
        {256, 2, 1, 4, 300, Type::F32, true, 0, 0},       // wide heads, F32 cache: element-wise loads
        {128, 4, 4, 130, 130, Type::F16, false, 0, 0},    // no grouping, several row tiles
        {128, 8, 2, 40, 600, Type::F32, false, 0, 0},     // F32 cache in batched 16-byte chunks
        {64, 8, 1, 16, 2048, Type::F32, true, 1000, 0},   // split-K with a window
        // Decoding at short contexts: one row per warp, split-K down to one key tile per split, the
        // last split of each tile merging in the kernel.
        {128, 32, 4, 1, 1, Type::F16, false, 0, 0},       // the first token
        {128, 32, 4, 1, 35, Type::F16, false, 0, 0},      // one split
        {128, 32, 4, 1, 100, Type::F16, false, 0, 0},     // 3 splits, the last one short
        {128, 32, 4, 3, 129, Type::F16, false, 0, 0},     // 3 tokens
        {64, 64, 8, 1, 200, Type::F16, true, 128, 0},     // window + sinks, splits past the window
        {64, 64, 8, 2, 77, Type::F32, true, 0, 4},        // F32 cache, strided views
        {128, 32, 4, 1, 40000, Type::F16, false, 0, 0},   // deep: the most splits
    };
    moe::cpu::Scratch scratch;
    for (const Case& c : cases) {
        TensorPool pool;
        Tensor* dst = attention_node(pool, rng, c.D, c.H, c.Hkv, c.T, c.n_kv, c.kv, c.sinks, c.window, c.pad);
        INFO("ATTENTION D " << c.D << " H " << c.H << " Hkv " << c.Hkv << " T " << c.T << " n_kv " << c.n_kv << " kv "
                            << moe::type_name(c.kv) << " sinks " << c.sinks << " window " << c.window << " pad "
                            << c.pad);
        REQUIRE(gpu().supports_op(*dst));
        DeviceMirror dev;
        Tensor got = run_both(dst, [&](Tensor& n) { return moe::cpu::attention(n, scratch); }, dev);
        const AttnTolerance tol = attention_tolerance(*dev.of(dst));
        compare_f32(got, *dst, tol.rel, tol.abs);
    }
}

TEST_CASE("CUDA ATTENTION on the tensor cores matches the CPU: D 64, 128 and 192, GQA 8 and 4, windows, sinks",
          "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(11);
    struct Tokens {
        int64_t T, n_past;
    };
    // T < kAttnMmaMinTokens (32) keeps the FP32 kernel; the rest run on the tensor cores, after a
    // cached prefix or from position 0, with row tiles that end inside a token's heads (T 200).
    const Tokens tokens[] = {{1, 300}, {17, 50}, {64, 0}, {64, 100}, {200, 37}, {1024, 0}, {1024, 300}};
    moe::cpu::Scratch scratch;
    double used = 0.0;
    int n_mma = 0;
    for (const int64_t D : {64, 128, 192}) {
        for (const int64_t group : {8, 4}) {
            for (const Tokens& tk : tokens) {
                for (const int variant : {0, 1, 2, 3}) {
                    const bool sinks = variant % 2 == 1;
                    const int32_t window = variant >= 2 ? 128 : 0;
                    const int64_t Hkv = 2, H = group * Hkv, n_kv = tk.n_past + tk.T;
                    TensorPool pool;
                    Tensor* dst = attention_node(pool, rng, D, H, Hkv, tk.T, n_kv, Type::F16, sinks, window, 0);
                    INFO("ATTENTION D " << D << " H " << H << " Hkv " << Hkv << " T " << tk.T << " n_kv " << n_kv
                                        << " sinks " << sinks << " window " << window);
                    DeviceMirror dev;
                    Tensor got = run_both(dst, [&](Tensor& n) { return moe::cpu::attention(n, scratch); }, dev);
                    const bool mma = moe::cuda::attention_uses_tensor_cores(*dev.of(dst));
                    CHECK(mma == (tk.T >= 32));  // the path this case is meant to exercise
                    const AttnTolerance tol = attention_tolerance(*dev.of(dst));
                    const double u = compare_f32(got, *dst, tol.rel, tol.abs);
                    if (mma) {
                        used = std::max(used, u);
                        ++n_mma;
                    }
                }
            }
        }
    }
    // A case that must take the tensor-core kernel, against the CPU.
    const auto check_on_tensor_cores = [&](Tensor* dst) {
        DeviceMirror dev;
        Tensor got = run_both(dst, [&](Tensor& n) { return moe::cpu::attention(n, scratch); }, dev);
        CHECK(moe::cuda::attention_uses_tensor_cores(*dev.of(dst)));
        const AttnTolerance tol = attention_tolerance(*dev.of(dst));
        used = std::max(used, compare_f32(got, *dst, tol.rel, tol.abs));
        ++n_mma;
    };
    // 8 KV heads of 1024 tokens: more blocks than SMs (the cases above fill the device at most once).
    for (const int64_t D : {64, 128, 192}) {
        for (const int variant : {0, 3}) {
            const bool sinks = variant % 2 == 1;
            const int32_t window = variant >= 2 ? 128 : 0;
            const int64_t Hkv = 8, H = 8 * Hkv, T = 1024, n_kv = 1024 + 77;
            TensorPool pool;
            Tensor* dst = attention_node(pool, rng, D, H, Hkv, T, n_kv, Type::F16, sinks, window, 0);
            INFO("ATTENTION (many blocks) D " << D << " H " << H << " Hkv " << Hkv << " T " << T << " n_kv " << n_kv
                                                << " sinks " << sinks << " window " << window);
            check_on_tensor_cores(dst);
        }
    }
    // deepseek2's prefill form: one key head per query head (group 1), head size 192.
    {
        const int64_t H = 16, T = 300, n_kv = 300 + 45;
        TensorPool pool;
        Tensor* dst = attention_node(pool, rng, 192, H, H, T, n_kv, Type::F16, false, 0, 0);
        INFO("ATTENTION (group 1) D 192 H " << H << " T " << T << " n_kv " << n_kv);
        check_on_tensor_cores(dst);
    }
    if (perf_mode()) {
        std::printf("tensor-core ATTENTION: %d cases, worst error at %.3f of the tolerance (rel 2e-3 + abs 1e-3)\n",
                    n_mma, used);
    }
}

TEST_CASE("CUDA backend answers supports_op and refuses what it cannot compute", "[gpu]") {
    MOE_GPU_OR_SKIP();
    TensorPool pool;
    Tensor* q = pool.make(Type::F32, {80, 4, 2});
    Tensor* k = pool.make(Type::F16, {80, 2, 8});
    Tensor* v = pool.make(Type::F16, {80, 2, 8});
    Tensor* pos = pool.make(Type::I32, {2});
    Tensor* att = pool.node(Op::ATTENTION, Type::F32, {80, 4, 2}, {q, k, v, pos});
    CHECK_FALSE(gpu().supports_op(*att));  // D = 80: no kernel
    Tensor* x = pool.make(Type::F32, {16, 2});
    Tensor* silu = pool.node(Op::SILU, Type::F32, {16, 2}, {x});
    CHECK(gpu().supports_op(*silu));
    Tensor* cpy16 = pool.make(Type::F16, {16, 2});
    cpy16->op = Op::CPY;
    cpy16->src[0] = x;
    CHECK(gpu().supports_op(*cpy16));
    Tensor* bad = pool.node(Op::SOFTMAX, Type::F32, {16, 3}, {x});  // shape mismatch: a Status, not a crash
    DeviceMirror dev;
    Tensor* nodes[] = {dev.of(bad, true)};
    const Status s = gpu().compute(nodes);
    CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(s.message().find("SOFTMAX") != std::string::npos);
    require_ok(gpu().synchronize());
}

TEST_CASE("CUDA copy helpers round-trip through pageable and pinned memory", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(10);
    const size_t n = (size_t{3} << 20) + 7;
    std::vector<uint8_t> src(n);
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng() | 1);
    auto dbuf = gpu().alloc_buffer(n);
    require_ok(dbuf.status());
    auto pinned = gpu().alloc_pinned_host_buffer(n);
    require_ok(pinned.status());
    std::memcpy(pinned.value()->data(), src.data(), n);
    std::vector<uint8_t> back(n, 0);
    require_ok(gpu().copy_to_device(dbuf.value()->data(), pinned.value()->data(), n));
    require_ok(gpu().copy_to_host(back.data(), dbuf.value()->data(), n));
    require_ok(gpu().synchronize());
    CHECK(back == src);
    std::vector<uint8_t> src2(n);
    for (uint8_t& b : src2) b = static_cast<uint8_t>(rng() | 2);
    require_ok(gpu().copy_to_device(dbuf.value()->data(), src2.data(), n));
    require_ok(gpu().copy_to_host(pinned.value()->data(), dbuf.value()->data(), n));
    require_ok(gpu().synchronize());
    CHECK(std::memcmp(pinned.value()->data(), src2.data(), n) == 0);
    CHECK(gpu().copy_to_device(nullptr, src.data(), 4).code() == MOE_STATUS_INVALID_ARGUMENT);
}

// gather_to_host: a kernel gathers many small regions (any sizes and alignments, zero-size ones
// included, more than one launch's worth) into device staging, then one copy; the bytes land back to
// back, in order, and the staging grows when a larger gather comes.
TEST_CASE("CUDA gather_to_host copies many device regions back to back", "[gpu]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(11);
    const size_t n = size_t{1} << 20;
    std::vector<uint8_t> src(n);
    for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
    auto dbuf = gpu().alloc_buffer(n);
    require_ok(dbuf.status());
    require_ok(gpu().copy_to_device(dbuf.value()->data(), src.data(), n));
    const auto* base = static_cast<const uint8_t*>(dbuf.value()->data());
    for (const size_t count : {size_t{1}, size_t{2}, size_t{16}, size_t{64}, size_t{65}, size_t{150}}) {
        for (const size_t max_len : {size_t{9}, size_t{400}, size_t{20000}}) {
            INFO(count << " regions of up to " << max_len << " bytes");
            std::vector<moe::DeviceRegion> regions;
            std::vector<uint8_t> want;
            for (size_t i = 0; i < count; ++i) {
                const size_t len = i % 7 == 3 ? 0 : rng() % (max_len + 1);
                const size_t at = rng() % (n - len);
                regions.push_back(moe::DeviceRegion{base + at, len});
                want.insert(want.end(), src.begin() + static_cast<std::ptrdiff_t>(at),
                            src.begin() + static_cast<std::ptrdiff_t>(at + len));
            }
            auto pinned = gpu().alloc_pinned_host_buffer(want.size() + 64);
            require_ok(pinned.status());
            auto* out = static_cast<uint8_t*>(pinned.value()->data());
            std::memset(out, 0xA5, want.size() + 64);
            require_ok(gpu().gather_to_host(out, regions));
            require_ok(gpu().synchronize());
            CHECK(std::memcmp(out, want.data(), want.size()) == 0);
            bool tail_untouched = true;
            for (size_t i = want.size(); i < want.size() + 64; ++i) tail_untouched = tail_untouched && out[i] == 0xA5;
            CHECK(tail_untouched);
        }
    }
    const moe::DeviceRegion bad[] = {{base, 4}, {nullptr, 4}};
    std::vector<uint8_t> sink(8);
    CHECK(gpu().gather_to_host(sink.data(), bad).code() == MOE_STATUS_INVALID_ARGUMENT);
}

// copy_to_device from page-locked memory of up to kPullCopyMaxBytes is a kernel pulling the bytes (its
// head and tail bytewise, the middle in 16-byte words) when the backend's PullCopies mode says so;
// above that, or with the two addresses aligned differently, or from pageable memory, it is
// cudaMemcpyAsync. Exact: every byte equals its source, the bytes around the destination range stay
// untouched. Run with every copy pulled (ALWAYS), with none (NEVER), in the default mode with a large
// upload queued first on the copy stream (pulled while it is in flight), and with the kernel called
// directly (pull_from_host at every size, so a fallback to DMA cannot hide a kernel bug).
TEST_CASE("CUDA copy_to_device pulls page-locked bytes exactly at every size and alignment", "[gpu]") {
    MOE_GPU_OR_SKIP();
    using Mode = moe::cuda::CudaBackend::PullCopies;
    const int variant = GENERATE(0, 1, 2, 3);  // the three modes, then the kernel directly
    const Mode modes[] = {Mode::ALWAYS, Mode::NEVER, Mode::WHILE_UPLOADING, Mode::WHILE_UPLOADING};
    const Mode mode = modes[variant];
    const bool direct = variant == 3;
    struct RestoreMode {  // the backend is shared by every test case
        Mode before = gpu().pull_copies();
        ~RestoreMode() { gpu().set_pull_copies(before); }
    } restore;
    gpu().set_pull_copies(mode);
    auto rng = fresh_rng(11);
    const size_t upload_bytes = size_t{256} << 20;
    auto upload_src = gpu().alloc_pinned_host_buffer(upload_bytes);
    require_ok(upload_src.status());
    auto upload_dst = gpu().alloc_buffer(upload_bytes);
    require_ok(upload_dst.status());
    const size_t big = moe::cuda::kPullCopyMaxBytes + 4099;  // the DMA path
    auto pinned = gpu().alloc_pinned_host_buffer(big + 64);
    require_ok(pinned.status());
    auto dbuf = gpu().alloc_buffer(big + 64);
    require_ok(dbuf.status());
    auto* host = static_cast<uint8_t*>(pinned.value()->data());
    auto* dev = static_cast<uint8_t*>(dbuf.value()->data());
    std::vector<uint8_t> back(big + 64);
    REQUIRE(moe::cuda::mapped_device_pointer(host) != nullptr);
    REQUIRE(moe::cuda::mapped_device_pointer(back.data()) == nullptr);  // pageable
    uint64_t x = rng() | 1;  // xorshift: a Mersenne twister would take seconds over 64 MiB
    for (size_t i = 0; i < big + 64; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        host[i] = static_cast<uint8_t>(x >> 24);
    }
    const size_t sizes[] = {1, 5, 15, 16, 17, 31, 4096 * 3 + 5, (size_t{1} << 20) + 13, (size_t{5} << 20) + 3,
                            moe::cuda::kPullCopyMaxBytes, big};
    const std::pair<size_t, size_t> offsets[] = {{0, 0}, {3, 3}, {16, 0}, {7, 23}, {1, 2}};
    for (size_t n : sizes) {
        for (auto [src_off, dst_off] : offsets) {
            for (size_t i = 0; i < 16 && i < n; ++i) host[src_off + n - 1 - i] = static_cast<uint8_t>(rng() | 1);
            require_ok(gpu().synchronize());
            REQUIRE(cudaMemset(dev, 0xA5, big + 64) == cudaSuccess);
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the backend's streams do not wait for stream 0
            if (mode == Mode::WHILE_UPLOADING) {
                require_ok(gpu().upload(upload_dst.value()->data(), upload_src.value()->data(), upload_bytes, 0));
            }
            if (direct) {
                const auto* src = static_cast<const uint8_t*>(moe::cuda::mapped_device_pointer(host)) + src_off;
                const Status s = moe::cuda::pull_from_host(dev + dst_off, src, n, nullptr);
                if (src_off % 16 != dst_off % 16) {
                    CHECK(s.code() == MOE_STATUS_INVALID_ARGUMENT);
                    continue;
                }
                require_ok(s);
            } else {
                require_ok(gpu().copy_to_device(dev + dst_off, host + src_off, n));
            }
            require_ok(gpu().synchronize());
            REQUIRE(cudaMemcpy(back.data(), dev, big + 64, cudaMemcpyDeviceToHost) == cudaSuccess);
            INFO("n " << n << ", src offset " << src_off << ", dst offset " << dst_off);
            CHECK(std::memcmp(back.data() + dst_off, host + src_off, n) == 0);
            const bool before_ok = std::all_of(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(dst_off),
                                               [](uint8_t b) { return b == 0xA5; });
            const bool after_ok = std::all_of(back.begin() + static_cast<std::ptrdiff_t>(dst_off + n),
                                              back.begin() + static_cast<std::ptrdiff_t>(dst_off + n + 16),
                                              [](uint8_t b) { return b == 0xA5; });
            CHECK(before_ok);
            CHECK(after_ok);
        }
    }
    // In stream order with the compute stream's download: the pulled bytes are what comes back.
    const size_t n = (size_t{2} << 20) + 9;
    for (size_t i = 0; i < n; i += 3) host[i] = static_cast<uint8_t>(rng() | 1);
    require_ok(gpu().copy_to_device(dev, host, n));
    require_ok(gpu().copy_to_host(back.data(), dev, n));
    require_ok(gpu().synchronize());
    CHECK(std::memcmp(back.data(), host, n) == 0);
    CHECK(moe::cuda::pull_from_host(dev + 1, host, 64, nullptr).code() == MOE_STATUS_INVALID_ARGUMENT);
}

// ---- perf mode ----

namespace {

// Fast non-zero fill for the large perf inputs (a Mersenne twister would dominate the run).
void fill_fast(Tensor& t, uint64_t seed, float scale) {
    uint64_t s = seed | 1;
    const size_t n = extent(t);
    auto* p = static_cast<uint8_t*>(t.data);
    if (t.type == Type::F32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            const float v = (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 2.0f * scale;
            std::memcpy(p + i, &v, 4);
        }
    } else if (t.type == Type::F16) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            const uint16_t h = moe::fp32_to_fp16((static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * scale);
            std::memcpy(p + i, &h, 2);
        }
    } else {  // quantised weights: random bytes with a sane fp16 scale per block
        for (size_t i = 0; i < n; ++i) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            p[i] = static_cast<uint8_t>(s >> 32);
        }
        if (t.type == Type::Q8_0) {
            for (size_t b = 0; b + sizeof(moe::BlockQ8_0) <= n; b += sizeof(moe::BlockQ8_0)) {
                const uint16_t d = moe::fp32_to_fp16(0.01f);
                std::memcpy(p + b, &d, 2);
            }
        }
    }
}

size_t bytes_of(const Tensor& t) { return extent(t); }

struct PerfCase {
    std::string name;
    Tensor* node;
    double bytes;  // the fewest bytes the op must move: inputs read once, output written once
    double flops;  // 0 where bandwidth is the measure
};

void time_case(const PerfCase& c) {
    DeviceMirror dev;
    Tensor* nodes[] = {dev.of(c.node, true)};
    require_ok(gpu().synchronize());
    for (int i = 0; i < 3; ++i) require_ok(gpu().compute(nodes));
    require_ok(gpu().synchronize());
    cudaEvent_t ev[11];
    for (cudaEvent_t& e : ev) REQUIRE(cudaEventCreate(&e) == cudaSuccess);
    REQUIRE(cudaEventRecord(ev[0], gpu().compute_stream()) == cudaSuccess);
    for (int i = 0; i < 10; ++i) {
        require_ok(gpu().compute(nodes));
        REQUIRE(cudaEventRecord(ev[i + 1], gpu().compute_stream()) == cudaSuccess);
    }
    require_ok(gpu().synchronize());
    std::vector<float> ms(10);
    for (int i = 0; i < 10; ++i) REQUIRE(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], ev[i], ev[i + 1]) == cudaSuccess);
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    const double med = 0.5 * (ms[4] + ms[5]) * 1e-3;
    if (c.flops > 0) {
        std::printf("  %-44s %9.3f ms %9.1f GB/s %9.1f TFLOP/s\n", c.name.c_str(), med * 1e3, c.bytes / med * 1e-9,
                    c.flops / med * 1e-12);
    } else {
        std::printf("  %-44s %9.3f ms %9.1f GB/s\n", c.name.c_str(), med * 1e3, c.bytes / med * 1e-9);
    }
    std::fflush(stdout);
}

}  // namespace

TEST_CASE("CUDA op throughput (MOEINFER_GPU_PERF=1)", "[gpu][perf]") {
    MOE_GPU_OR_SKIP();
    if (!perf_mode()) return;
    std::printf("CUDA op throughput, device 0 (%d SMs): median of 10 after 3 warm-ups\n", gpu().n_sm());
    uint64_t seed = run_seed();
    auto F = [&](TensorPool& pool, Type t, std::initializer_list<int64_t> ne, float scale = 1.0f) {
        Tensor* x = pool.make(t, ne);
        fill_fast(*x, ++seed * 0x9E3779B97F4A7C15ull, scale);
        return x;
    };
    std::vector<PerfCase> cases;
    TensorPool pool;
    {
        Tensor* a = F(pool, Type::F32, {2048, 8192});
        Tensor* b = F(pool, Type::F32, {2048, 8192});
        Tensor* n = pool.node(Op::ADD, Type::F32, {2048, 8192}, {a, b});
        cases.push_back({"ADD [2048, 8192]", n, 3.0 * bytes_of(*a), 0});
        Tensor* w = F(pool, Type::F32, {2048});
        Tensor* m = pool.node(Op::MUL, Type::F32, {2048, 8192}, {a, w});
        cases.push_back({"MUL [2048, 8192] x [2048]", m, 2.0 * bytes_of(*a), 0});
        Tensor* r = pool.node(Op::RMS_NORM, Type::F32, {2048, 8192}, {a, w});
        r->params.f[0] = 1e-6f;
        cases.push_back({"RMS_NORM [2048, 8192] weighted", r, 2.0 * bytes_of(*a), 0});
        Tensor* s = pool.node(Op::SILU, Type::F32, {2048, 8192}, {a});
        cases.push_back({"SILU [2048, 8192]", s, 2.0 * bytes_of(*a), 0});
    }
    {
        Tensor* g = F(pool, Type::F32, {768, 8, 4096}, 8.0f);
        Tensor* u = F(pool, Type::F32, {768, 8, 4096}, 8.0f);
        Tensor* n = pool.node(Op::SWIGLU_OAI, Type::F32, {768, 8, 4096}, {g, u});
        n->params.f[0] = 1.702f;
        n->params.f[1] = 7.0f;
        cases.push_back({"SWIGLU_OAI [768, 8, 4096]", n, 3.0 * bytes_of(*g), 0});
    }
    {
        Tensor* x = F(pool, Type::F32, {128, 32768}, 4.0f);
        Tensor* sm = pool.node(Op::SOFTMAX, Type::F32, {128, 32768}, {x});
        cases.push_back({"SOFTMAX [128, 32768]", sm, 2.0 * bytes_of(*x), 0});
        Tensor* tk = pool.node(Op::TOPK, Type::I32, {8, 32768}, {x});
        tk->params.i[0] = 8;
        cases.push_back({"TOPK [128, 32768] k 8", tk, bytes_of(*x) + 8.0 * 32768 * 4, 0});
        Tensor* ids = pool.make(Type::I32, {8, 32768});
        for (int64_t i = 0; i < 8 * 32768; ++i) ids->as<int32_t>()[i] = static_cast<int32_t>((i * 37) % 128);
        Tensor* ga = pool.node(Op::GATHER, Type::F32, {8, 32768}, {x, ids});
        cases.push_back({"GATHER [128, 32768] k 8", ga, 3.0 * 8 * 32768 * 4, 0});
    }
    {
        Tensor* y = F(pool, Type::F32, {2048, 8, 4096});
        Tensor* w = F(pool, Type::F32, {8, 4096});
        Tensor* n = pool.node(Op::WEIGHTED_SUM, Type::F32, {2048, 4096}, {y, w});
        cases.push_back({"WEIGHTED_SUM [2048, 8, 4096]", n, bytes_of(*y) * 9.0 / 8.0, 0});
    }
    {
        Tensor* x = F(pool, Type::F32, {128, 32, 4096});
        Tensor* pos = pool.make(Type::I32, {4096});
        for (int32_t t = 0; t < 4096; ++t) pos->as<int32_t>()[t] = t + 1000;
        Tensor* n = pool.node(Op::ROPE, Type::F32, {128, 32, 4096}, {x, pos});
        moe::RopeParams p;
        p.n_dims = 128;
        p.freq_base = 1000000.0f;
        n->set_rope_params(p);
        cases.push_back({"ROPE [128, 32, 4096]", n, 2.0 * bytes_of(*x), 0});
    }
    {
        Tensor* w = F(pool, Type::Q8_0, {2048, 151936});
        Tensor* ids = pool.make(Type::I32, {4096});
        for (int32_t t = 0; t < 4096; ++t) ids->as<int32_t>()[t] = (t * 7919) % 151936;
        Tensor* n = pool.node(Op::GET_ROWS, Type::F32, {2048, 4096}, {w, ids});
        cases.push_back({"GET_ROWS q8_0 [2048, 151936] x 4096", n, 4096.0 * (2176 + 2048 * 4), 0});
    }
    {
        Tensor* cache = F(pool, Type::F16, {128, 8, 8192});
        Tensor* src = F(pool, Type::F32, {128, 8, 4096});
        Tensor* view = pool.view(cache, {128, 8, 4096}, {cache->nb[1], cache->nb[2], cache->nb[3]}, 100 * cache->nb[2]);
        view->op = Op::CPY;
        view->src[0] = src;
        view->src[1] = cache;
        cases.push_back({"CPY f32 -> f16 cache [128, 8, 4096]", view, 6.0 * 128 * 8 * 4096, 0});
    }
    auto attn = [&](const char* name, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv, bool sinks,
                    int32_t window) {
        Tensor* q = F(pool, Type::F32, {D, H, T});
        Tensor* k = F(pool, Type::F16, {D, Hkv, n_kv});
        Tensor* v = F(pool, Type::F16, {D, Hkv, n_kv});
        Tensor* pos = pool.make(Type::I32, {T});
        for (int64_t t = 0; t < T; ++t) pos->as<int32_t>()[t] = static_cast<int32_t>(n_kv - T + t);
        Tensor* sk = sinks ? F(pool, Type::F32, {H}) : nullptr;
        Tensor* n = pool.node(Op::ATTENTION, Type::F32, {D, H, T}, {q, k, v, pos, sk});
        n->params.f[0] = 1.0f / std::sqrt(static_cast<float>(D));
        n->params.i[0] = window;
        n->params.i[1] = static_cast<int32_t>(n_kv);
        double keys = 0;  // visible (query, key) pairs
        for (int64_t t = 0; t < T; ++t) {
            const int64_t p = n_kv - T + t;
            keys += static_cast<double>(window > 0 ? std::min<int64_t>(p + 1, window) : p + 1);
        }
        const double kv_bytes = 2.0 * static_cast<double>(Hkv * D) * 2.0 *
                                (window > 0 ? std::min<double>(static_cast<double>(n_kv), window + T) : n_kv);
        cases.push_back({name, n, kv_bytes + 2.0 * static_cast<double>(D * H * T) * 4.0,
                         4.0 * static_cast<double>(D * H) * keys});
    };
    // Prefill (the tensor-core kernel): flops count 4 D per visible (query head, key) pair.
    attn("ATTENTION prefill D128 H32/4 T2048 causal", 128, 32, 4, 2048, 2048, false, 0);
    attn("ATTENTION prefill D128 H32/4 T4096 causal", 128, 32, 4, 4096, 4096, false, 0);
    attn("ATTENTION prefill D64 H64/8 T2048 sinks", 64, 64, 8, 2048, 2048, true, 0);
    attn("ATTENTION prefill D64 H64/8 T4096 sinks", 64, 64, 8, 4096, 4096, true, 0);
    attn("ATTENTION prefill D64 H64/8 T4096 window 128 sinks", 64, 64, 8, 4096, 4096, true, 128);
    attn("ATTENTION prefill D128 H32/4 T512 causal", 128, 32, 4, 512, 512, false, 0);
    attn("ATTENTION prefill D128 H32/4 T32 n_kv 8192", 128, 32, 4, 32, 8192, false, 0);
    attn("ATTENTION prefill D128 H32/4 T16 n_kv 8192 (FP32)", 128, 32, 4, 16, 8192, false, 0);
    attn("ATTENTION decode D128 H32/4 n_kv 32768", 128, 32, 4, 1, 32768, false, 0);
    attn("ATTENTION decode D64 H64/8 n_kv 32768 sinks", 64, 64, 8, 1, 32768, true, 0);
    attn("ATTENTION decode D64 H64/8 window 128 sinks", 64, 64, 8, 1, 32768, true, 128);
    for (const PerfCase& c : cases) time_case(c);
}

#else  // no CUDA backend in this build

TEST_CASE("CUDA backend ops match the CPU kernels", "[gpu]") {
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
}

#endif
