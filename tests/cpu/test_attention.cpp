// ATTENTION against a float64 reference written here (explicit mask, softmax with the sink logit in the
// denominator, weighted sum of V), on seeded random data: head dims 16/20/64/128, GQA groups 4/2/1,
// 1/3/17 query tokens at positions after tokens already in the KV cache, windows 0/8/128, sinks on
// and off, F16 and F32 K/V, strided views, and every tiling path (small key blocks and query tiles,
// forced split-K, automatic split-K at depth). The reference reads the same F16-rounded K/V the kernel
// reads, so the only differences are F32 accumulation and exp: tolerance 2e-5 absolute on outputs
// that are convex combinations of V rows in [-1, 1]. Every kernel family this CPU has (AVX-512, AVX2,
// scalar) is run through the ISA cap.
#include <sys/mman.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/ops_attention.h"
#include "op_test_util.h"

namespace {

using moe::Op;
using moe::Tensor;
using moe::Type;
using moe::cpu::AttentionTuning;
using moe::test::elem;
using moe::test::fill_uniform;
using moe::test::make_rng;
using moe::test::TensorPool;
using moe::test::value;

// out[(t * H + h) * D + i]
std::vector<double> attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* pos,
                                  const float* sinks, double scale, int32_t window, int64_t n_kv) {
    const int64_t D = q.ne[0], H = q.ne[1], T = q.ne[2], group = H / k.ne[1];
    std::vector<double> out(static_cast<size_t>(D * H * T), 0.0);
    std::vector<double> logit(static_cast<size_t>(n_kv));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t p = pos[t];
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / group;
            double mx = sinks != nullptr ? sinks[h] : -std::numeric_limits<double>::infinity();
            std::vector<int64_t> seen;
            for (int64_t j = 0; j < n_kv; ++j) {
                if (j > p || (window != 0 && j <= p - window)) continue;
                double dot = 0.0;
                for (int64_t i = 0; i < D; ++i) dot += value(q, i, h, t) * value(k, i, g, j);
                logit[static_cast<size_t>(j)] = dot * scale;
                mx = std::max(mx, dot * scale);
                seen.push_back(j);
            }
            if (seen.empty() && sinks == nullptr) continue;
            double den = sinks != nullptr ? std::exp(sinks[h] - mx) : 0.0;
            for (int64_t j : seen) den += std::exp(logit[static_cast<size_t>(j)] - mx);
            for (int64_t j : seen) {
                const double w = std::exp(logit[static_cast<size_t>(j)] - mx) / den;
                for (int64_t i = 0; i < D; ++i) out[static_cast<size_t>((t * H + h) * D + i)] += w * value(v, i, g, j);
            }
        }
    }
    return out;
}

using moe::cpu::IsaCap;

// Runs fn once per ISA cap, lifting the cap afterwards even if fn fails.
template <typename Fn>
void for_each_isa(Fn&& fn) {
    struct Lift {
        ~Lift() { moe::cpu::set_cpu_isa_cap_for_testing(IsaCap::kNone); }
    } lift;
    for (const IsaCap cap : {IsaCap::kNone, IsaCap::kAvx2, IsaCap::kScalar}) {
        moe::cpu::set_cpu_isa_cap_for_testing(cap);
        INFO("isa " << moe::cpu::cpu_isa_name());
        fn();
    }
}

struct Setup {
    TensorPool pool;
    Tensor* q = nullptr;
    Tensor* k = nullptr;
    Tensor* v = nullptr;
    Tensor* pos = nullptr;
    Tensor* sinks = nullptr;
    Tensor* dst = nullptr;
};

// q [D, H, T] F32; K/V caches [D, Hkv, n_ctx] of kv_type holding n_kv valid rows (the rest NaN, so
// reading past n_kv shows); queries at positions n_kv - T .. n_kv - 1. `padded`: q, K and V are views
// of wider tensors (strided rows).
void build(Setup& s, std::mt19937_64& rng, int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t n_kv, Type kv_type,
           bool with_sinks, bool padded, int32_t window) {
    const int64_t n_ctx = n_kv + 13, pad = padded ? 8 : 0;
    Tensor* qb = s.pool.make(Type::F32, {D + pad, H, T});
    fill_uniform(*qb, rng, -2.0f, 2.0f);
    s.q = s.pool.view(qb, {D, H, T}, {qb->nb[1], qb->nb[2], qb->nb[3]}, 0);
    Tensor* kv[2];
    for (Tensor*& c : kv) {
        Tensor* cache = s.pool.make(kv_type, {D + pad, Hkv, n_ctx});
        fill_uniform(*cache, rng, -1.0f, 1.0f);
        for (int64_t j = n_kv; j < n_ctx; ++j)
            for (int64_t g = 0; g < Hkv; ++g)
                for (int64_t i = 0; i < D + pad; ++i) {
                    if (kv_type == Type::F16) {
                        *elem<uint16_t>(*cache, i, g, j) = 0x7E00;  // NaN
                    } else {
                        *elem<float>(*cache, i, g, j) = std::numeric_limits<float>::quiet_NaN();
                    }
                }
        c = s.pool.view(cache, {D, Hkv, n_ctx}, {cache->nb[1], cache->nb[2], cache->nb[3]}, 0);
    }
    s.k = kv[0];
    s.v = kv[1];
    s.pos = s.pool.make(Type::I32, {T});
    for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*s.pos, t) = static_cast<int32_t>(n_kv - T + t);
    if (with_sinks) {
        s.sinks = s.pool.make(Type::F32, {H});
        fill_uniform(*s.sinks, rng, -2.0f, 3.0f);
    }
    s.dst = s.pool.node(Op::ATTENTION, Type::F32, {D, H, T}, {s.q, s.k, s.v, s.pos, s.sinks});
    s.dst->params.f[0] = 1.0f / std::sqrt(static_cast<float>(D));
    s.dst->params.i[0] = window;
    s.dst->params.i[1] = static_cast<int32_t>(n_kv);
}

void check_against_ref(const Setup& s) {
    const std::vector<double> want =
        attention_ref(*s.q, *s.k, *s.v, s.pos->as<int32_t>(), s.sinks != nullptr ? s.sinks->as<float>() : nullptr,
                      s.dst->params.f[0], s.dst->params.i[0], s.dst->params.i[1]);
    const int64_t D = s.q->ne[0], H = s.q->ne[1], T = s.q->ne[2];
    double worst = 0.0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < D; ++i) {
                const double got = value(*s.dst, i, h, t);
                const double err = std::fabs(got - want[static_cast<size_t>((t * H + h) * D + i)]);
                worst = std::isnan(got) ? 1e30 : std::max(worst, err);
            }
    CHECK(worst < 2e-5);
}

}  // namespace

TEST_CASE("ATTENTION matches float64 over shapes, windows, sinks and tilings", "[attention]") {
    auto rng = make_rng(101);
    const AttentionTuning tunings[] = {
        {},                                                // defaults: auto split
        {.key_block = 16, .query_tile = 2, .n_split = 1},  // many blocks, single pass
        {.key_block = 32, .query_tile = 0, .n_split = 3},  // split-K
        {.key_block = 16, .query_tile = 5, .n_split = 7},  // split-K with empty splits on short ranges
    };
    moe::cpu::Scratch scratch;
    int combo = 0;
    for (const int64_t D : {16, 20, 64, 128}) {  // 20: vector tails on every ISA
        for (const int64_t Hkv : {1, 2, 4}) {
            for (const int64_t T : {1, 3, 17}) {
                for (const int32_t window : {0, 8, 128}) {
                    for (const bool with_sinks : {false, true}) {
                        for (const Type kv_type : {Type::F16, Type::F32}) {
                            ++combo;
                            std::uniform_int_distribution<int64_t> pick_kv(T, 300);
                            const int64_t n_kv = pick_kv(rng);
                            Setup s;
                            build(s, rng, D, 4, Hkv, T, n_kv, kv_type, with_sinks, combo % 3 == 0, window);
                            for_each_isa([&] {
                                for (const AttentionTuning& tu : tunings) {
                                    INFO("D " << D << " H 4 Hkv " << Hkv << " T " << T << " n_kv " << n_kv << " window "
                                              << window << " sinks " << with_sinks << " kv " << moe::type_name(kv_type)
                                              << " block " << tu.key_block << " tile " << tu.query_tile << " split "
                                              << tu.n_split);
                                    REQUIRE(moe::cpu::attention_tuned(*s.dst, scratch, tu).is_ok());
                                    check_against_ref(s);
                                }
                            });
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("ATTENTION decode at depth splits the keys across threads", "[attention]") {
    auto rng = make_rng(102);
    moe::cpu::Scratch scratch;
    // More threads than this machine may have cores: the thread-indexed scratch slots must hold.
    tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 7);
    tbb::task_arena arena(7);
    for (const int32_t window : {0, 128}) {
        for (const bool with_sinks : {false, true}) {
            Setup s;
            build(s, rng, 64, 8, 2, 1, 5000, Type::F16, with_sinks, false, window);
            for_each_isa([&] {
                arena.execute([&] { REQUIRE(moe::cpu::attention(*s.dst, scratch).is_ok()); });
                check_against_ref(s);
                // The same result through the single-pass path.
                std::vector<float> split(s.dst->as<float>(), s.dst->as<float>() + 64 * 8);
                arena.execute([&] { REQUIRE(moe::cpu::attention_tuned(*s.dst, scratch, {.n_split = 1}).is_ok()); });
                double worst = 0.0;
                for (size_t i = 0; i < split.size(); ++i) {
                    worst = std::max(worst, static_cast<double>(std::fabs(split[i] - s.dst->as<float>()[i])));
                }
                CHECK(worst < 1e-5);
            });
        }
    }
}

TEST_CASE("ATTENTION with a window never reads keys outside it", "[attention]") {
    // K/V of 32k tokens in pages that are unreadable below the window: touching a masked block faults.
    auto rng = make_rng(103);
    const int64_t D = 64, H = 4, n_ctx = 32768, T = 3;
    const int32_t window = 128;
    const size_t row = static_cast<size_t>(D) * 2;  // one F16 row per token (Hkv = 1)
    const size_t bytes = row * n_ctx;
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* mem[2];
    for (void*& m : mem) {
        m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(m != MAP_FAILED);
    }
    Setup s;
    build(s, rng, D, H, 1, T, 300, Type::F16, true, false, window);  // for q, positions, sinks
    Tensor* kv[2];
    for (int c = 0; c < 2; ++c) {
        kv[c] = s.pool.make(Type::F16, {D, 1, n_ctx});
        kv[c]->data = mem[c];
        fill_uniform(*kv[c], rng, -1.0f, 1.0f);
    }
    for (int64_t t = 0; t < T; ++t) *elem<int32_t>(*s.pos, t) = static_cast<int32_t>(n_ctx - T + t);
    const size_t first_visible = static_cast<size_t>(n_ctx - T - window + 1) * row;
    const size_t protect = first_visible / page * page;
    for (void* m : mem) REQUIRE(mprotect(m, protect, PROT_NONE) == 0);
    s.dst->src[1] = s.k = kv[0];
    s.dst->src[2] = s.v = kv[1];
    s.dst->params.i[1] = static_cast<int32_t>(n_ctx);
    moe::cpu::Scratch scratch;
    for_each_isa([&] {
        for (const AttentionTuning tu : {AttentionTuning{}, AttentionTuning{.key_block = 64, .n_split = 4}}) {
            REQUIRE(moe::cpu::attention_tuned(*s.dst, scratch, tu).is_ok());
            check_against_ref(s);  // the reference, too, reads only visible keys
        }
    });
    for (void* m : mem) munmap(m, bytes);
}

TEST_CASE("ATTENTION rejects inconsistent operands", "[attention]") {
    auto rng = make_rng(104);
    moe::cpu::Scratch scratch;
    Setup s;
    build(s, rng, 16, 4, 2, 3, 20, Type::F16, false, false, 0);
    s.dst->params.i[1] = 40;  // more keys than the cache holds
    moe::Status st = moe::cpu::attention(*s.dst, scratch);
    CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(st.message().find("n_kv") != std::string::npos);
    s.dst->params.i[1] = 20;
    s.dst->params.i[0] = -1;
    CHECK(moe::cpu::attention(*s.dst, scratch).code() == MOE_STATUS_INVALID_ARGUMENT);
    s.dst->params.i[0] = 0;
    s.dst->src[3] = nullptr;
    st = moe::cpu::attention(*s.dst, scratch);
    CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(st.message().find("positions") != std::string::npos);
    s.dst->src[3] = s.pos;
    Tensor* k3 = s.pool.make(Type::F16, {16, 3, 33});  // 4 heads are not a multiple of 3
    s.dst->src[1] = k3;
    CHECK(moe::cpu::attention(*s.dst, scratch).code() == MOE_STATUS_INVALID_ARGUMENT);
    s.dst->src[1] = s.k;
    CHECK(moe::cpu::attention_tuned(*s.dst, scratch, {.n_split = 65}).code() == MOE_STATUS_INVALID_ARGUMENT);
    CHECK(moe::cpu::attention(*s.dst, scratch).is_ok());
}

TEST_CASE("ATTENTION propagates a NaN in q, K, V or a sink as the float64 reference does", "[attention][nan]") {
    // A corrupt weight upstream must come out as NaN, not as plausible numbers: a NaN score has to
    // survive the running maximum, the clamped exp and the split-K merge. The reference propagates
    // NaN by plain arithmetic: a NaN in q (or a sink) makes its whole output row NaN, a NaN in K every
    // row that sees that key, a NaN in V that element of every row that sees that key. Outputs the
    // NaN cannot reach keep the 2e-5 tolerance.
    auto rng = make_rng(105);
    const AttentionTuning tunings[] = {{}, {.key_block = 16, .query_tile = 2, .n_split = 1}, {.key_block = 16, .n_split = 3}};
    moe::cpu::Scratch scratch;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const int64_t D : {16, 20, 64}) {
        for (const int where : {0, 1, 2, 3}) {  // q, K, V, sink
            for (const Type kv_type : {Type::F16, Type::F32}) {
                for (const int32_t window : {0, 8}) {
                    const int64_t H = 4, Hkv = 2, T = 3;
                    const int64_t n_kv = std::uniform_int_distribution<int64_t>(T + 1, 120)(rng);
                    Setup s;
                    build(s, rng, D, H, Hkv, T, n_kv, kv_type, where == 3, false, window);
                    const int64_t i = std::uniform_int_distribution<int64_t>(0, D - 1)(rng);
                    // A key the last query sees (window 8 included) and the earlier ones may not.
                    const int64_t j = std::uniform_int_distribution<int64_t>(std::max<int64_t>(0, n_kv - 6), n_kv - 1)(rng);
                    const int64_t h = std::uniform_int_distribution<int64_t>(0, H - 1)(rng);
                    if (where == 0) *elem<float>(*s.q, i, h, T - 1) = nan;
                    if (where == 1 || where == 2) {
                        Tensor& c = where == 1 ? *s.k : *s.v;
                        if (kv_type == Type::F16) {
                            *elem<uint16_t>(c, i, h / (H / Hkv), j) = 0x7E00;
                        } else {
                            *elem<float>(c, i, h / (H / Hkv), j) = nan;
                        }
                    }
                    if (where == 3) *elem<float>(*s.sinks, h) = nan;
                    const std::vector<double> want =
                        attention_ref(*s.q, *s.k, *s.v, s.pos->as<int32_t>(),
                                      s.sinks != nullptr ? s.sinks->as<float>() : nullptr, s.dst->params.f[0], window, n_kv);
                    size_t n_nan = 0;
                    for (const double w : want) n_nan += std::isnan(w) ? 1 : 0;
                    REQUIRE(n_nan > 0);  // the planted NaN reaches some output
                    for_each_isa([&] {
                        for (const AttentionTuning& tu : tunings) {
                            INFO("D " << D << " NaN in " << "qKVs"[where] << " i " << i << " j " << j << " h " << h
                                      << " n_kv " << n_kv << " window " << window << " kv " << moe::type_name(kv_type)
                                      << " block " << tu.key_block << " split " << tu.n_split);
                            REQUIRE(moe::cpu::attention_tuned(*s.dst, scratch, tu).is_ok());
                            size_t nan_mismatch = 0;
                            double worst = 0.0;
                            for (int64_t t = 0; t < T; ++t)
                                for (int64_t hh = 0; hh < H; ++hh)
                                    for (int64_t e = 0; e < D; ++e) {
                                        const double got = value(*s.dst, e, hh, t);
                                        const double w = want[static_cast<size_t>((t * H + hh) * D + e)];
                                        if (std::isnan(got) != std::isnan(w)) {
                                            ++nan_mismatch;
                                        } else if (!std::isnan(w)) {
                                            worst = std::max(worst, std::fabs(got - w));
                                        }
                                    }
                            CHECK(nan_mismatch == 0);
                            CHECK(worst < 2e-5);
                        }
                    });
                }
            }
        }
    }
}
