// deepseek2's ops on the CUDA backend (one node through CudaBackend::compute) against the CPU kernels on
// the same random inputs (fresh seed per run, printed with a failure), strided views as the graph builds
// them, device outputs poisoned with NaN bytes first:
//   CONCAT, GROUP_MASK: bit for bit (copies and F32 <-> F16 conversions, round to nearest even; group scores
//     summed in the same order).
//   ROPE interleaved with DeepSeek's YaRN: rel 1e-5 + 2e-6, as the NeoX ROPE test (angles in double).
//   MUL_MAT_HEADS: |gpu - cpu| <= 2^-6 sum_k |w x| + max|x| sum_k |w| / 127 per output: both backends may
//     quantise the activations to 8 bits per block (half a step, max|x| / 254, per element each) and the
//     GPU's tensor-core path rounds operands to BF16 (2^-8 relative each).
//   ATTENTION with V the K cache itself (the absorbed latent attention, D = 576 and 96, one KV head):
//     the FP32 kernel's rel 1e-4 + 2e-5 (test_backend_ops.cpp).
#include <catch2/catch.hpp>

#include "moeinfer/moeinfer_version.h"

#if MOEINFER_HAS_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../cpu/op_test_util.h"
#include "core/types.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace {

using moe::Op;
using moe::Tensor;
using moe::Type;
using moe::test::elem;
using moe::test::fill_uniform;
using moe::test::fresh_rng;
using moe::test::require_ok;
using moe::test::run_seed;
using moe::test::TensorPool;

// Device twins of host tensors (views keep their offsets into their base's twin).
class Twins {
public:
    Tensor* of(Tensor* h) {
        if (auto it = map_.find(h); it != map_.end()) return it->second;
        Tensor& d = twins_.emplace_back(*h);
        map_[h] = &d;
        if (h->view_src != nullptr) {
            d.view_src = of(h->view_src);
            d.data = static_cast<uint8_t*>(d.view_src->data) + h->view_offset;
        } else {
            const size_t n = h->nb[3] * static_cast<size_t>(h->ne[3]);
            d.data = dev_.alloc(n);
            dev_.upload(d.data, h->data, n);
        }
        for (int i = 0; i < moe::kMaxSrc; ++i) {
            if (h->src[i] != nullptr) d.src[i] = of(h->src[i]);
        }
        return &d;
    }
    // Runs `node` on the GPU (output poisoned first) and returns its bytes in a host tensor of its shape.
    Tensor run(Tensor* node, std::vector<uint8_t>& mem) {
        Tensor* d = of(node);
        dev_.poison(*d);
        Tensor* nodes[] = {d};
        require_ok(dev_.be().compute(nodes));
        require_ok(dev_.be().synchronize());
        mem = dev_.download(*d);
        Tensor t = *node;
        t.data = mem.data();
        return t;
    }
    moe::cuda::CudaBackend& be() { return dev_.be(); }

private:
    moe::test::Device dev_;
    std::map<const Tensor*, Tensor*> map_;
    std::deque<Tensor> twins_;
};

int64_t count_bad(const Tensor& got, const Tensor& want, double rel, double abs) {
    int64_t bad = 0;
    for (int64_t i2 = 0; i2 < want.ne[2]; ++i2)
        for (int64_t i1 = 0; i1 < want.ne[1]; ++i1)
            for (int64_t i0 = 0; i0 < want.ne[0]; ++i0) {
                const float g = *elem<float>(got, i0, i1, i2), w = *elem<float>(want, i0, i1, i2);
                const bool same = g == w || (std::isnan(g) && std::isnan(w));
                if (!same && !(std::fabs(g - w) <= rel * std::fabs(w) + abs) && bad++ < 3) {
                    UNSCOPED_INFO("seed " << run_seed() << " at [" << i0 << ", " << i1 << ", " << i2 << "]: gpu " << g
                                          << ", cpu " << w);
                }
            }
    return bad;
}

}  // namespace

TEST_CASE("CUDA CONCAT and GROUP_MASK match the CPU bit for bit", "[gpu][mla]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(51);
    for (const bool shared : {true, false}) {
        TensorPool pool;
        const int64_t A = 512, B = 64, H = 16, T = 5;
        Tensor* qa = pool.make(Type::F32, {A + 32, H, T});
        fill_uniform(*qa, rng, -1.0f, 1.0f);
        Tensor* a = pool.view(qa, {A, H, T}, {qa->nb[1], qa->nb[2]}, 0);
        const int64_t bh = shared ? 1 : H;
        Tensor* qb = pool.make(Type::F32, {B + 8, bh, T});
        fill_uniform(*qb, rng, -1.0f, 1.0f);
        Tensor* b = pool.view(qb, {B, bh, T}, {qb->nb[1], qb->nb[2]}, 8 * sizeof(float));
        Tensor* d = pool.node(Op::CONCAT, Type::F32, {A + B, H, T}, {a, b});
        REQUIRE(moe::cpu::concat(*d).is_ok());
        Twins tw;
        std::vector<uint8_t> mem;
        INFO("CONCAT shared " << shared);
        CHECK(count_bad(tw.run(d, mem), *d, 0.0, 0.0) == 0);
    }
    // Conversions (the prefill form's F16 keys and values, the F32 copy of the cached latents): the same bytes.
    for (const Type ta : {Type::F32, Type::F16}) {
        for (const int tb : {-1, 0, 1}) {  // none, F32, F16
            for (const Type td : {Type::F32, Type::F16}) {
                TensorPool pool;
                const int64_t A = 128, B = 64, H = 8, T = 6;
                Tensor* qa = pool.make(ta, {A + 64, H, T});
                fill_uniform(*qa, rng, -70000.0f, 70000.0f);  // past F16's largest: those round to inf
                moe::test::set_float_edge_values(*qa);    // NaN, zeros, subnormals, a tie
                Tensor* a = pool.view(qa, {A, H, T}, {qa->nb[1], qa->nb[2]}, 0);
                Tensor* b = nullptr;
                if (tb >= 0) {
                    const int64_t bh = ta == Type::F16 ? H : 1;  // a row per head, or one for all of them
                    Tensor* qb = pool.make(tb == 0 ? Type::F32 : Type::F16, {B + 8, bh, T});
                    fill_uniform(*qb, rng, -2.0f, 2.0f);
                    moe::test::set_float_edge_values(*qb);
                    b = pool.view(qb, {B, bh, T}, {qb->nb[1], qb->nb[2]}, 0);
                }
                Tensor* d = pool.node(Op::CONCAT, td, {A + (b != nullptr ? B : 0), H, T}, {a, b});
                REQUIRE(moe::cpu::concat(*d).is_ok());
                Twins tw;
                std::vector<uint8_t> mem;
                const Tensor got = tw.run(d, mem);
                INFO("CONCAT src0 " << moe::type_name(ta) << " src1 " << tb << " dst " << moe::type_name(td));
                CHECK(std::memcmp(got.data, d->data, d->nb[2] * static_cast<size_t>(T)) == 0);
            }
        }
    }
    struct Case {
        int64_t e;
        int n_group, n_used, top_n;
    };
    for (const Case c : {Case{256, 8, 4, 2}, Case{160, 8, 3, 1}, Case{16, 4, 2, 2}, Case{384, 1, 1, 2}}) {
        if (c.n_group == 1) continue;  // the graph never builds a mask without a limit
        TensorPool pool;
        const int64_t T = 37;
        Tensor* x = pool.make(Type::F32, {c.e, T});
        fill_uniform(*x, rng, -0.5f, 1.5f);
        for (int64_t i = 0; i < c.e; ++i) *elem<float>(*x, i, 3) = 0.5f;  // tied groups go to the lower one
        Tensor* d = pool.node(Op::GROUP_MASK, Type::F32, {c.e, T}, {x});
        d->params.i[0] = c.n_group;
        d->params.i[1] = c.n_used;
        d->params.i[2] = c.top_n;
        REQUIRE(moe::cpu::group_mask(*d).is_ok());
        Twins tw;
        REQUIRE(tw.be().supports_op(*d));
        std::vector<uint8_t> mem;
        INFO("GROUP_MASK experts " << c.e << " groups " << c.n_group << " used " << c.n_used);
        CHECK(count_bad(tw.run(d, mem), *d, 0.0, 0.0) == 0);
    }
}

TEST_CASE("CUDA ROPE interleaved (DeepSeek's YaRN) matches the CPU on strided rope parts", "[gpu][mla]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(52);
    for (const int64_t T : {1, 9}) {
        TensorPool pool;
        const int64_t R = 64, Dk = 192, H = 16;
        Tensor* q = pool.make(Type::F32, {Dk, H, T});
        fill_uniform(*q, rng, -1.0f, 1.0f);
        Tensor* x = pool.view(q, {R, H, T}, {q->nb[1], q->nb[2]}, (Dk - R) * sizeof(float));  // q_rope
        Tensor* pos = pool.make(Type::I32, {T});
        std::uniform_int_distribution<int32_t> pick(0, 160000);
        for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*pos, t) = pick(rng);
        moe::RopeParams p;
        p.n_dims = static_cast<int32_t>(R);
        p.freq_base = 10000.0f;
        p.freq_scale = 1.0f / 40.0f;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = 4096;
        p.attn_factor = 1.0f / (1.0f + 0.1f * std::log(40.0f));
        p.yarn_truncate = true;
        p.interleaved = true;
        Tensor* d = pool.node(Op::ROPE, Type::F32, {R, H, T}, {x, pos});
        d->set_rope_params(p);
        REQUIRE(moe::cpu::rope(*d).is_ok());
        Twins tw;
        std::vector<uint8_t> mem;
        INFO("ROPE interleaved T " << T);
        CHECK(count_bad(tw.run(d, mem), *d, 1e-5, 2e-6) == 0);
    }
}

TEST_CASE("CUDA MUL_MAT_HEADS matches the CPU (W_UK and W_UV shapes, decode and prefill)", "[gpu][mla]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(53);
    struct Case {
        Type type;
        int64_t k, n, h, t, row;  // row: the length of the rows x is a view into
    };
    const Case cases[] = {
        {Type::F16, 128, 512, 16, 1, 192},  // W_UK at decode: q_nope inside q
        {Type::Q8_0, 128, 512, 16, 33, 192},
        {Type::BF16, 512, 128, 16, 7, 576},  // W_UV: the latent part of the attention output
        {Type::Q4_K, 512, 128, 8, 64, 576},
        {Type::F32, 64, 32, 4, 5, 96},
    };
    for (const Case& c : cases) {
        INFO("MUL_MAT_HEADS " << moe::type_name(c.type) << " k " << c.k << " n " << c.n << " heads " << c.h << " T "
                              << c.t);
        TensorPool pool;
        Tensor* wf = pool.make(Type::F32, {c.k, c.n, c.h});
        fill_uniform(*wf, rng, -1.0f, 1.0f);
        Tensor* w = pool.make(c.type, {c.k, c.n, c.h});
        std::vector<float> wv(static_cast<size_t>(c.k * c.n * c.h));
        for (int64_t r = 0; r < c.n * c.h; ++r) {
            moe::traits(c.type).from_float(reinterpret_cast<const float*>(wf->row(r % c.n, r / c.n)),
                                           w->row(r % c.n, r / c.n), c.k);
            moe::traits(c.type).to_float(w->row(r % c.n, r / c.n), wv.data() + r * c.k, c.k);
        }
        Tensor* xb = pool.make(Type::F32, {c.row, c.h, c.t});
        fill_uniform(*xb, rng, -1.0f, 1.0f);
        Tensor* x = pool.view(xb, {c.k, c.h, c.t}, {xb->nb[1], xb->nb[2]}, 0);
        Tensor* d = pool.node(Op::MUL_MAT_HEADS, Type::F32, {c.n, c.h, c.t}, {w, x});
        moe::cpu::Scratch scratch;
        REQUIRE(moe::cpu::mul_mat_heads(*d, scratch).is_ok());
        Twins tw;
        REQUIRE(tw.be().supports_op(*d));
        std::vector<uint8_t> mem;
        const Tensor got = tw.run(d, mem);
        int64_t bad = 0;
        for (int64_t t = 0; t < c.t; ++t)
            for (int64_t h = 0; h < c.h; ++h) {
                double max_x = 0.0;
                for (int64_t i = 0; i < c.k; ++i) max_x = std::max(max_x, std::fabs(double{*elem<float>(*x, i, h, t)}));
                for (int64_t n = 0; n < c.n; ++n) {
                    double abs_wx = 0.0, abs_w = 0.0;
                    for (int64_t i = 0; i < c.k; ++i) {
                        const double wi = wv[static_cast<size_t>((h * c.n + n) * c.k + i)];
                        abs_wx += std::fabs(wi * *elem<float>(*x, i, h, t));
                        abs_w += std::fabs(wi);
                    }
                    const double tol = abs_wx / 64.0 + max_x * abs_w / 127.0;
                    const double g = *elem<float>(got, n, h, t), want = *elem<float>(*d, n, h, t);
                    if (!(std::fabs(g - want) <= tol) && bad++ < 3) {
                        UNSCOPED_INFO("seed " << run_seed() << " n " << n << " h " << h << " t " << t << ": gpu " << g
                                              << ", cpu " << want << ", tol " << tol);
                    }
                }
            }
        CHECK(bad == 0);
    }
}

TEST_CASE("CUDA ATTENTION over the latent cache (V = K, one KV head) matches the CPU", "[gpu][mla]") {
    MOE_GPU_OR_SKIP();
    auto rng = fresh_rng(54);
    struct Case {
        int64_t D, H, T, n_kv;
    };
    // DeepSeek-V3's 512 + 64 (decode at depth: split-K; a prefill) and the tiny presets' 64 + 32.
    for (const Case c : {Case{576, 128, 1, 3000}, Case{576, 16, 12, 40}, Case{96, 4, 29, 29}, Case{96, 4, 1, 61}}) {
        INFO("latent ATTENTION D " << c.D << " H " << c.H << " T " << c.T << " n_kv " << c.n_kv);
        TensorPool pool;
        const int64_t n_ctx = c.n_kv + 5;
        Tensor* q = pool.make(Type::F32, {c.D, c.H, c.T});
        fill_uniform(*q, rng, -0.5f, 0.5f);
        Tensor* cache = pool.make(Type::F16, {c.D, 1, n_ctx});
        fill_uniform(*cache, rng, -1.0f, 1.0f);
        Tensor* rows = pool.view(cache, {c.D, 1, c.n_kv}, {cache->nb[1], cache->nb[2]}, 0);
        Tensor* pos = pool.make(Type::I32, {c.T});
        for (int64_t t = 0; t < c.T; ++t) *elem<int32_t>(*pos, t) = static_cast<int32_t>(c.n_kv - c.T + t);
        Tensor* d = pool.node(Op::ATTENTION, Type::F32, {c.D, c.H, c.T}, {q, rows, rows, pos, nullptr});
        d->params.f[0] = 1.0f / std::sqrt(192.0f);
        d->params.i[1] = static_cast<int32_t>(c.n_kv);
        moe::cpu::Scratch scratch;
        REQUIRE(moe::cpu::attention(*d, scratch).is_ok());
        Twins tw;
        REQUIRE(tw.be().supports_op(*d));
        std::vector<uint8_t> mem;
        CHECK(count_bad(tw.run(d, mem), *d, 1e-4, 2e-5) == 0);
    }
}

#else

TEST_CASE("CUDA deepseek2 ops match the CPU kernels", "[gpu][mla]") {
    WARN("skipped: no CUDA device (this build has no CUDA backend)");
}

#endif
