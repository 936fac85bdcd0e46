// core/quant_decode_dot.h, the integer group dots the CUDA decode GEMV runs with dp4a, on the host:
// - the integer sums bit for bit against a scalar reference written here from the block layouts
//   (element by element: its value, its sub-block's scale and minimum), on random block bytes and random
//   int8 activations (-128 included);
// - the float value against float64 sums of lib/core's dequantised weights (traits().to_float, checked
//   against gguf-py elsewhere) times the quantised activations, within the rounding of both sides'
//   float operations, and against the unquantised activations within the Q8 rounding (|x - dx xq| <=
//   dx / 2 per element).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/quant_decode_dot.h"
#include "core/types.h"
#include "common/decoded_types.h"

namespace {

using moe::Type;

using moe::test::fp16_fields;
constexpr auto& kDecoded = moe::test::kDecodedTypes;

// Group g of a block as the layouts define it, one element at a time: value q[j], and the integer scale
// and minimum of its 16-element half (1 and 0 where the format has none).
struct RefGroup {
    int q[32];
    int sc[2] = {1, 1};
    int mn[2] = {0, 0};
};

RefGroup ref_group(Type t, const uint8_t* blk, int g) {
    RefGroup r{};
    r.sc[0] = r.sc[1] = 1;
    auto nib32 = [](const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4; };
    switch (t) {
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::IQ4_NL: {
            const int qs_off = t == Type::Q4_1 ? 4 : t == Type::Q5_1 ? 8 : t == Type::Q5_0 ? 6 : 2;
            uint32_t qh = 0;
            if (t == Type::Q5_0) std::memcpy(&qh, blk + 2, 4);
            if (t == Type::Q5_1) std::memcpy(&qh, blk + 4, 4);
            for (int j = 0; j < 32; ++j) {
                const int n = nib32(blk + qs_off, j) | static_cast<int>((qh >> j) & 1u) << 4;
                r.q[j] = t == Type::IQ4_NL ? moe::kIq4nlValues[n] : t == Type::Q5_0 ? n - 16 : n;
            }
            if (t == Type::Q4_1 || t == Type::Q5_1) r.mn[0] = r.mn[1] = 1;
            break;
        }
        case Type::IQ4_XS: {
            const auto& b = *reinterpret_cast<const moe::BlockIQ4_XS*>(blk);
            for (int j = 0; j < 32; ++j) r.q[j] = moe::kIq4nlValues[nib32(b.qs + 16 * g, j)];
            break;
        }
        case Type::Q2_K: {
            const auto& b = *reinterpret_cast<const moe::BlockQ2_K*>(blk);
            for (int j = 0; j < 32; ++j) r.q[j] = moe::kq::two_bits(b.qs, 32 * g + j);
            for (int h = 0; h < 2; ++h) {
                r.sc[h] = b.scales[2 * g + h] & 0x0F;
                r.mn[h] = b.scales[2 * g + h] >> 4;
            }
            break;
        }
        case Type::Q3_K: {
            const auto& b = *reinterpret_cast<const moe::BlockQ3_K*>(blk);
            for (int j = 0; j < 32; ++j) r.q[j] = moe::kq::q3_k_value(b, 32 * g + j);
            for (int h = 0; h < 2; ++h) r.sc[h] = moe::kq::q3_k_scale(b.scales, 2 * g + h);
            break;
        }
        case Type::Q4_K:
        case Type::Q5_K: {
            const uint8_t* scales = blk + 4;
            const uint8_t* qh = blk + 4 + moe::kKScaleBytes;
            const uint8_t* qs = t == Type::Q4_K ? qh : qh + moe::kQK_K / 8;
            for (int j = 0; j < 32; ++j) {
                const int e = 32 * g + j;
                r.q[j] = moe::kq::nibble_k(qs, e) | (t == Type::Q5_K ? moe::kq::high_bit(qh, e) << 4 : 0);
            }
            int sc, m;
            moe::kq::scale_min_k4(scales, g, sc, m);
            r.sc[0] = r.sc[1] = sc;
            r.mn[0] = r.mn[1] = m;
            break;
        }
        default: {  // Q6_K
            const auto& b = *reinterpret_cast<const moe::BlockQ6_K*>(blk);
            for (int j = 0; j < 32; ++j) r.q[j] = moe::kq::q6_k_value(b, 32 * g + j);
            for (int h = 0; h < 2; ++h) r.sc[h] = b.scales[2 * g + h];
            break;
        }
    }
    return r;
}

struct Tested {
    moe::qd::GroupQ q;
    moe::qd::GroupSums s;
    float value;
};

template <Type W>
Tested run_group(const uint8_t* blk, int g, const int (&xq)[8], float dx) {
    Tested r;
    r.q = moe::qd::load_group<W>(blk, g);
    r.s = moe::qd::group_sums<W>(r.q, xq);
    r.value = moe::qd::group_value<W>(r.q, r.s, dx);
    return r;
}

Tested run_group(Type t, const uint8_t* blk, int g, const int (&xq)[8], float dx) {
    switch (t) {
        case Type::Q4_1: return run_group<Type::Q4_1>(blk, g, xq, dx);
        case Type::Q5_0: return run_group<Type::Q5_0>(blk, g, xq, dx);
        case Type::Q5_1: return run_group<Type::Q5_1>(blk, g, xq, dx);
        case Type::IQ4_NL: return run_group<Type::IQ4_NL>(blk, g, xq, dx);
        case Type::Q2_K: return run_group<Type::Q2_K>(blk, g, xq, dx);
        case Type::Q3_K: return run_group<Type::Q3_K>(blk, g, xq, dx);
        case Type::Q4_K: return run_group<Type::Q4_K>(blk, g, xq, dx);
        case Type::Q5_K: return run_group<Type::Q5_K>(blk, g, xq, dx);
        case Type::Q6_K: return run_group<Type::Q6_K>(blk, g, xq, dx);
        default: return run_group<Type::IQ4_XS>(blk, g, xq, dx);
    }
}

void pack(const int (&v)[32], int (&w)[8]) {
    for (int i = 0; i < 8; ++i) {
        uint32_t u = 0;
        for (int b = 0; b < 4; ++b) u |= static_cast<uint32_t>(static_cast<uint8_t>(v[4 * i + b])) << (8 * b);
        w[i] = static_cast<int>(u);
    }
}

}  // namespace

TEST_CASE("quant_decode_dot's integer sums are the layouts' element by element", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> pct(0, 99);
    const uint16_t extremes[] = {0x0000, 0x8000, 0x0001, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00};
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        constexpr int kBlocks = 300;
        const int bb = moe::qd::block_bytes(t);
        const int groups = moe::qd::block_elems(t) / 32;
        // An odd start: blocks only 2-byte aligned, as rows of 210-byte Q6_K blocks are.
        std::vector<uint8_t> buf(static_cast<size_t>(kBlocks * bb + 2));
        uint8_t* bytes = buf.data() + 2;
        for (int i = 0; i < kBlocks * bb; ++i) bytes[i] = static_cast<uint8_t>(byte(rng));
        for (int i = 0; i < kBlocks; ++i) {  // scales the integers must not depend on
            for (int off : fp16_fields(t)) {
                if (pct(rng) >= 25) continue;
                const uint16_t h = extremes[static_cast<size_t>(byte(rng)) % std::size(extremes)];
                std::memcpy(bytes + i * bb + off, &h, 2);
            }
        }
        int bad = 0;
        for (int i = 0; i < kBlocks; ++i) {
            for (int g = 0; g < groups; ++g) {
                int x[32];
                for (int& v : x) v = byte(rng) - 128;  // the whole int8 range
                int xq[8];
                pack(x, xq);
                const uint8_t* blk = bytes + i * bb;
                const RefGroup r = ref_group(t, blk, g);
                int64_t isum = 0, msum = 0;
                for (int j = 0; j < 32; ++j) {
                    isum += static_cast<int64_t>(r.sc[j / 16]) * r.q[j] * x[j];
                    msum += static_cast<int64_t>(r.mn[j / 16]) * x[j];
                }
                const Tested got = run_group(t, blk, g, xq, 1.0f);
                if ((got.s.isum != isum || got.s.msum != msum) && bad++ < 4) {
                    UNSCOPED_INFO("block " << i << " group " << g << ": isum " << got.s.isum << " (want " << isum
                                           << "), msum " << got.s.msum << " (want " << msum << ")");
                }
            }
        }
        CHECK(bad == 0);
    }
}

namespace {

// load_group's word-load path (A4) against its 2-byte path on the same 4-byte aligned block: every field
// equal, bit for bit (the 2-byte path is checked against the layouts above).
template <Type W>
bool a4_matches(const uint8_t* blk, int g) {
    if constexpr (!moe::qd::word_blocks(W)) {
        return true;
    } else {
        const moe::qd::GroupQ a = moe::qd::load_group<W, true>(blk, g);
        const moe::qd::GroupQ b = moe::qd::load_group<W, false>(blk, g);
        bool same = std::memcmp(a.w, b.w, sizeof a.w) == 0 && std::memcmp(a.sc, b.sc, sizeof a.sc) == 0 &&
                    std::memcmp(a.mn, b.mn, sizeof a.mn) == 0;
        same = same && std::memcmp(&a.dw, &b.dw, 4) == 0 && std::memcmp(&a.mw, &b.mw, 4) == 0;
        return same;
    }
}

bool a4_matches(Type t, const uint8_t* blk, int g) {
    switch (t) {
        case Type::Q4_1: return a4_matches<Type::Q4_1>(blk, g);
        case Type::Q5_1: return a4_matches<Type::Q5_1>(blk, g);
        case Type::Q2_K: return a4_matches<Type::Q2_K>(blk, g);
        case Type::Q4_K: return a4_matches<Type::Q4_K>(blk, g);
        case Type::Q5_K: return a4_matches<Type::Q5_K>(blk, g);
        case Type::IQ4_XS: return a4_matches<Type::IQ4_XS>(blk, g);
        default: return true;  // blocks of 18, 22, 110, 210 bytes: never word-aligned in a row
    }
}

}  // namespace

TEST_CASE("quant_decode_dot's word-load path equals its 2-byte path on aligned blocks", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    int tested_types = 0;
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        if (!moe::qd::word_blocks(t)) continue;
        ++tested_types;
        constexpr int kBlocks = 300;
        const int bb = moe::qd::block_bytes(t);
        std::vector<uint32_t> words(static_cast<size_t>(kBlocks * bb / 4));  // 4-byte aligned storage
        auto* bytes = reinterpret_cast<uint8_t*>(words.data());
        for (int i = 0; i < kBlocks * bb; ++i) bytes[i] = static_cast<uint8_t>(byte(rng));
        int bad = 0;
        for (int i = 0; i < kBlocks; ++i) {
            for (int g = 0; g < moe::qd::block_elems(t) / 32; ++g) {
                if (!a4_matches(t, bytes + i * bb, g) && bad++ < 4) UNSCOPED_INFO("block " << i << " group " << g);
            }
        }
        CHECK(bad == 0);
    }
    CHECK(tested_types == 6);  // Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, IQ4_XS
}

TEST_CASE("quant_decode_dot's group values match float64 sums of the dequantised weights", "[types][quant_decode]") {
    const uint32_t seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> expo(-6.0, 6.0);
    constexpr double kU = 0x1p-24;  // float's unit roundoff
    for (Type t : kDecoded) {
        INFO(moe::type_name(t));
        constexpr int kBlocks = 300;
        const int bb = moe::qd::block_bytes(t);
        const int elems = moe::qd::block_elems(t);
        std::vector<uint8_t> bytes(static_cast<size_t>(kBlocks * bb));
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
        std::vector<float> wf(static_cast<size_t>(kBlocks * elems));
        moe::traits(t).to_float(bytes.data(), wf.data(), kBlocks * elems);
        int bad = 0, checked = 0;
        for (int i = 0; i < kBlocks; ++i) {
            for (int g = 0; g < elems / 32; ++g) {
                // Activations of a random magnitude, quantised as the GPU does: dx = amax / 127, xq = round(x / dx).
                double x[32];
                const double scale = std::exp2(expo(rng));
                double amax = 0.0;
                for (double& v : x) {
                    v = normal(rng) * scale;
                    amax = std::max(amax, std::fabs(v));
                }
                const float dx = static_cast<float>(amax / 127.0);
                int xi[32];
                for (int j = 0; j < 32; ++j) xi[j] = static_cast<int>(std::clamp(std::nearbyint(x[j] / dx), -127.0, 127.0));
                int xq[8];
                pack(xi, xq);
                const uint8_t* blk = bytes.data() + static_cast<size_t>(i) * bb;
                const Tested got = run_group(t, blk, g, xq, dx);
                if (!std::isfinite(got.q.dw) || !std::isfinite(got.q.mw)) continue;  // inf / NaN scales
                const RefGroup r = ref_group(t, blk, g);
                const float* w = wf.data() + static_cast<size_t>(i * elems + 32 * g);
                double ref_q = 0.0, ref_x = 0.0, terms = 0.0, wabs = 0.0;
                for (int j = 0; j < 32; ++j) {
                    const double xh = static_cast<double>(dx) * xi[j];
                    ref_q += static_cast<double>(w[j]) * xh;
                    ref_x += static_cast<double>(w[j]) * x[j];
                    wabs += std::fabs(static_cast<double>(w[j]));
                    terms += (std::fabs(static_cast<double>(got.q.dw) * r.sc[j / 16] * r.q[j]) +
                              std::fabs(static_cast<double>(got.q.mw) * r.mn[j / 16])) *
                             std::fabs(xh);
                }
                // Four roundings here (dw * isum, mw * msum, their sum, * dx), at most three in each
                // dequantised weight (the scale product, the value product, the minimum subtraction).
                const double tol_q = 8.0 * kU * terms + 1e-30;
                const double tol_x = tol_q + wabs * static_cast<double>(dx) * 0.5 * (1.0 + 1e-6);
                ++checked;
                const double eq = std::fabs(got.value - ref_q);
                const double ex = std::fabs(got.value - ref_x);
                if (!(eq <= tol_q && ex <= tol_x) && bad++ < 4) {
                    UNSCOPED_INFO("block " << i << " group " << g << ": " << got.value << " vs " << ref_q << " (tol "
                                           << tol_q << "), unquantised " << ref_x << " (tol " << tol_x << ")");
                }
            }
        }
        INFO(checked << " groups with finite scales");
        CHECK(checked > kBlocks * elems / 32 / 2);
        CHECK(bad == 0);
    }
}

TEST_CASE("quant_decode_dot's IQ4 table words are the grid", "[types][quant_decode]") {
    for (uint32_t n = 0; n < 0x10000u; ++n) {  // every 4 nibbles
        const uint32_t nib4 = (n & 0xFu) | (n >> 4 & 0xFu) << 8 | (n >> 8 & 0xFu) << 16 | (n >> 12 & 0xFu) << 24;
        const uint32_t got = moe::qd::iq4nl_lut4(nib4);
        for (int b = 0; b < 4; ++b) {
            const int want = moe::kIq4nlValues[(nib4 >> (8 * b)) & 0xFu];
            if (static_cast<int8_t>(got >> (8 * b)) != want) {
                FAIL("nibbles " << n << " byte " << b << ": " << static_cast<int>(static_cast<int8_t>(got >> (8 * b)))
                                << " != " << want);
            }
        }
    }
}
