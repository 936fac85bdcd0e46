// CPU matrix products (MUL_MAT, MUL_MAT_ID, MOE_UP_GATE) on every weight type and every kernel
// family this machine can run (scalar, AVX2, AVX-512 VNNI), against a float64 reference computed from
// the dequantised weights (the type table's to_float) and the F32 activations.
//
// Tolerances, per output element of weight row w and activation row x:
// - F32 / F16 / BF16 weights: the kernels multiply exact weights by exact F32 activations, so only
//   float summation errs: 1e-5 * sum|w||x|.
// - The 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): activations are
//   quantised to int8 per block of 32 with scale d = amax / 127, so each x_j moves by at most d / 2:
//   the bound is sum over blocks of (sum |w_j|) * d_b / 2, plus the float summation term above.
// - The super-block types (Q2_K .. Q6_K, IQ4_XS): the same with blocks of 256 (Q8K activations).
// - Different kernel families agree within the float summation term alone (their integer block dots
//   are exact, and the quantised activations are bit-identical, which is tested directly).
// - The BF16 path (quantised weights, AVX-512 BF16; forced on as its own family "avx512_bf16"):
//   weights and activations are rounded to BF16 (nearest even, subnormals flushed), their products
//   are exact in F32, and the k F32 additions of each dot product round. So it is compared with a
//   second reference: the float64 sum of the BF16-rounded products, within (k + 2) * 2^-24 * sum of
//   their magnitudes (the F32 summation bound), plus k * 2^-110 for flushed subnormal products.
// - The int8 tiles of that path (the super-block types; family "avx512_i8"): the weights are requantised
//   to int8 per row and super-block (q = nearest-even(v * (127 / amax)), scale amax / 127) and the
//   activations quantised as Q8K, the integer dot products are exact, and each super-block's sum is
//   rounded twice in F32 on its way into the total. Reference: the float64 dot product of the two
//   requantised rows, within (k + 2) * 2^-24 * the sum of the magnitudes of its products.
#include <catch2/catch.hpp>

#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/types.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_ops.h"
#include "cpu/matmul_kernels.h"

namespace {

using moe::Activation;
using moe::Op;
using moe::Tensor;
using moe::Type;
namespace cpu = moe::cpu;

// ---- kernel families ----

struct Isa {
    const char* name;
    cpu::IsaCap cap;
    const moe::cpu::mm::KernelTable* table;
    bool bf16 = false;  // the BF16 path forced on (quantised weights); off for the other families
    bool i8 = false;    // and its int8 tiles for the super-block types
};

std::vector<Isa> available_isas() {
    cpu::set_cpu_isa_cap_for_testing(cpu::IsaCap::kNone);
    const cpu::CpuFeatures& f = cpu::cpu_features();
    std::vector<Isa> isas = {{"scalar", cpu::IsaCap::kScalar, &moe::cpu::mm::kScalarKernels}};
    if (f.avx2) isas.push_back({"avx2", cpu::IsaCap::kAvx2, &moe::cpu::mm::kAvx2Kernels});
    // AVX-512 without AMX (the cap), so that a CPU with AMX still runs the AVX-512 tile kernels here.
    if (f.avx512 && f.avx512_vnni) isas.push_back({"avx512", cpu::IsaCap::kAvx512, &moe::cpu::mm::kAvx512Kernels});
    if (f.avx512 && f.avx512_vnni && f.avx512_bf16) {
        isas.push_back({"avx512_bf16", cpu::IsaCap::kAvx512, &moe::cpu::mm::kAvx512Kernels, true});
        isas.push_back({"avx512_i8", cpu::IsaCap::kAvx512, &moe::cpu::mm::kAvx512Kernels, true, true});
    } else {
        WARN("skipped: the BF16 path (this CPU has no AVX-512 BF16)");
    }
    // With AMX the BF16 path multiplies its BF16 tiles on it; the super-block kinds keep their int8 tiles
    // unless the BF16 ones are asked for (amx_bf16 asks, so every kind runs on AMX here).
    if (f.amx) {
        isas.push_back({"amx_bf16", cpu::IsaCap::kNone, &moe::cpu::mm::kAvx512Kernels, true});
        isas.push_back({"amx_i8", cpu::IsaCap::kNone, &moe::cpu::mm::kAvx512Kernels, true, true});
    } else {
        WARN("skipped: the BF16 path on AMX tiles (this CPU has no AMX, or the OS does not grant it)");
    }
    return isas;
}

// Selects a kernel family for the scope.
class IsaScope {
public:
    explicit IsaScope(const Isa& isa) {
        cpu::set_cpu_isa_cap_for_testing(isa.cap);
        cpu::set_bf16_path_for_testing(isa.bf16 ? cpu::Bf16Path::kAlways : cpu::Bf16Path::kNever);
        cpu::set_decoded_tiles_for_testing(isa.i8 ? cpu::DecodedTiles::kInt8 : cpu::DecodedTiles::kBf16);
    }
    ~IsaScope() {
        cpu::set_cpu_isa_cap_for_testing(cpu::IsaCap::kNone);
        cpu::set_bf16_path_for_testing(cpu::Bf16Path::kAuto);
        cpu::set_decoded_tiles_for_testing(cpu::DecodedTiles::kInt8);
    }
    IsaScope(const IsaScope&) = delete;
    IsaScope& operator=(const IsaScope&) = delete;
};

const Type kAllTypes[] = {Type::F32,  Type::F16,  Type::BF16, Type::Q8_0,   Type::Q4_0, Type::MXFP4,
                          Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::Q2_K, Type::Q3_K,
                          Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::IQ4_XS};

// Elements per block of the activation quantisation a weight type's kernels use (0: none).
int64_t act_block(Type t) {
    if (!moe::is_quantized(t)) return 0;
    return moe::traits(t).block_size == 256 ? 256 : 32;
}

// A row length for `type` near k: k itself for types with blocks of 32 (or none), whole super-blocks
// (at least one) for the others.
int64_t row_len(Type type, int64_t k) {
    if (moe::traits(type).block_size != 256) return k;
    return std::max<int64_t>(256, k / 256 * 256);
}

// ---- data ----

std::mt19937& rng() {
    static std::mt19937 g(Catch::rngSeed() + 12345u);
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

// A host tensor that owns its bytes.
struct HostTensor {
    Tensor t;
    std::vector<uint8_t> bytes;
};

HostTensor make_tensor(Type type, std::initializer_list<int64_t> shape) {
    HostTensor h;
    moe::set_shape(h.t, type, static_cast<int>(shape.size()), shape.begin());
    h.bytes.resize(h.t.n_bytes());
    h.t.data = h.bytes.data();
    return h;
}

// The fp16 scale fields (byte offsets) of the types whose other bytes randomize_fields overwrites.
struct ScaleFields {
    Type type;
    int offsets[2];  // -1: none
};
constexpr ScaleFields kScaleFields[] = {
    {Type::Q4_1, {0, 2}}, {Type::Q5_0, {0, -1}},  {Type::Q5_1, {0, 2}}, {Type::IQ4_NL, {0, -1}},
    {Type::Q2_K, {80, 82}}, {Type::Q3_K, {108, -1}}, {Type::Q4_K, {0, 2}}, {Type::Q5_K, {0, 2}},
    {Type::Q6_K, {208, -1}}, {Type::IQ4_XS, {0, -1}},
};

// Our quantisers never produce some bit patterns real files hold (6-bit scales with their top bits
// set, Q6_K scales of -128, Q3_K values of -4 under every scale, ...): in one block of 8, every byte
// but the fp16 scales (kept finite) is replaced by a random one.
void randomize_fields(Type type, std::vector<uint8_t>& bytes) {
    const ScaleFields* f = nullptr;
    for (const ScaleFields& s : kScaleFields) {
        if (s.type == type) f = &s;
    }
    if (f == nullptr) return;
    const auto size = static_cast<size_t>(moe::traits(type).block_bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> pick(0, 7);
    for (size_t b = 0; b + size <= bytes.size(); b += size) {
        if (pick(rng()) != 0) continue;
        for (size_t i = 0; i < size; ++i) {
            const int field = static_cast<int>(i) & ~1;  // the fp16 field byte i is part of
            if (field != f->offsets[0] && field != f->offsets[1]) bytes[b + i] = static_cast<uint8_t>(byte(rng()));
        }
    }
}

// Weights of `type` from random floats through the reference quantiser, then extra edge cases the
// quantiser never produces but files may hold: Q8_0 values of -128, MXFP4 scales at the ends of the
// e8m0 range, random bytes in the other fields of the newer types (randomize_fields).
HostTensor random_weights(Type type, int64_t k, int64_t n, int64_t e = 1) {
    HostTensor h = make_tensor(type, {k, n, e});
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
    randomize_fields(type, h.bytes);
    return h;
}

// Row r of expert e of a weight tensor, dequantised.
std::vector<float> dequant_row(const Tensor& w, int64_t r, int64_t e = 0) {
    std::vector<float> out(static_cast<size_t>(w.ne[0]));
    moe::traits(w.type).to_float(w.row(r, e), out.data(), w.ne[0]);
    return out;
}

HostTensor random_acts(std::initializer_list<int64_t> shape) {
    HostTensor h = make_tensor(Type::F32, shape);
    const std::vector<float> f = random_floats(h.t.n_elements());
    std::memcpy(h.bytes.data(), f.data(), f.size() * sizeof(float));
    return h;
}

// ids I32 [n_used, T] (built by hand: I32 has no entry in the type table).
struct Ids {
    std::vector<int32_t> v;
    Tensor t;
};
Ids make_ids(int64_t n_used, int64_t n_tokens, const std::vector<int32_t>& allowed) {
    Ids ids;
    ids.v.resize(static_cast<size_t>(n_used * n_tokens));
    std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
    for (auto& x : ids.v) x = allowed[pick(rng())];
    ids.t.type = Type::I32;
    ids.t.ne[0] = n_used;
    ids.t.ne[1] = n_tokens;
    ids.t.nb[0] = 4;
    ids.t.nb[1] = static_cast<size_t>(4 * n_used);
    ids.t.nb[2] = ids.t.nb[3] = ids.t.nb[1] * static_cast<size_t>(n_tokens);
    ids.t.data = ids.v.data();
    return ids;
}

// ---- reference ----

struct Ref {
    double value;
    double tol;        // against the reference
    double sum_tol;    // float-summation part only (for comparing kernel families)
    double bf16_value = 0.0;  // the BF16 path's reference (quantised weights)
    double bf16_tol = 0.0;
    double i8_value = 0.0;  // the int8 tiles' reference (super-block types)
    double i8_tol = 0.0;
};

// v rounded to BF16 as the AVX-512 BF16 conversions do: subnormals flushed, then nearest even.
double bf16_round(float v) {
    if (std::fabs(v) < std::numeric_limits<float>::min()) return 0.0;
    return moe::bf16_to_fp32(moe::fp32_to_bf16(v));
}

// v quantised per super-block of 256 as the Q8K quantiser and the int8 tiles' requantisation do (the
// same float operations): q = nearest-even(v * (127 / amax)), returned as q * (amax / 127).
std::vector<double> q8_superblocks(const float* v, int64_t k) {
    std::vector<double> out(static_cast<size_t>(k), 0.0);
    for (int64_t b = 0; b < k / 256; ++b) {
        float amax = 0.0f;
        for (int64_t j = 0; j < 256; ++j) amax = std::fmax(amax, std::fabs(v[b * 256 + j]));
        if (amax == 0.0f) continue;
        const float id = 127.0f / amax;
        const float d = amax / 127.0f;
        for (int64_t j = 0; j < 256; ++j) {
            out[static_cast<size_t>(b * 256 + j)] = static_cast<double>(std::nearbyint(v[b * 256 + j] * id)) * d;
        }
    }
    return out;
}

Ref ref_dot(Type type, const std::vector<float>& w, const float* x) {
    double dot = 0.0, mag = 0.0, qerr = 0.0, bdot = 0.0, bmag = 0.0;
    const int64_t k = static_cast<int64_t>(w.size());
    for (int64_t i = 0; i < k; ++i) {
        dot += static_cast<double>(w[i]) * x[i];
        mag += std::fabs(static_cast<double>(w[i]) * x[i]);
        const double bp = bf16_round(w[i]) * bf16_round(x[i]);
        bdot += bp;
        bmag += std::fabs(bp);
    }
    if (const int64_t bs = act_block(type); bs > 0) {
        for (int64_t b = 0; b < k / bs; ++b) {
            double wsum = 0.0, amax = 0.0;
            for (int64_t j = 0; j < bs; ++j) {
                wsum += std::fabs(static_cast<double>(w[b * bs + j]));
                amax = std::max(amax, std::fabs(static_cast<double>(x[b * bs + j])));
            }
            qerr += wsum * amax / 127.0 * 0.5 * (1.0 + 1e-4);
        }
    }
    const double sum_tol = 1e-5 * mag + 1e-30;
    const double bf16_tol = static_cast<double>(k + 2) * (std::ldexp(bmag, -24) + std::ldexp(1.0, -110));
    double idot = 0.0, imag = 0.0;
    if (act_block(type) == 256) {
        const std::vector<double> wq = q8_superblocks(w.data(), k);
        const std::vector<double> xq = q8_superblocks(x, k);
        for (int64_t i = 0; i < k; ++i) {
            idot += wq[static_cast<size_t>(i)] * xq[static_cast<size_t>(i)];
            imag += std::fabs(wq[static_cast<size_t>(i)] * xq[static_cast<size_t>(i)]);
        }
    }
    const double i8_tol = static_cast<double>(k + 2) * std::ldexp(imag, -24) + 1e-30;
    return {dot, qerr + sum_tol, sum_tol, bdot, bf16_tol, idot, i8_tol};
}

// The reference of a kernel family: the BF16 one where the BF16 path computes (quantised weights), the
// int8 one where its int8 tiles do (every operand of a super-block type).
std::vector<Ref> for_family(const std::vector<Ref>& ref, const Isa& isa, Type type, Type other) {
    const bool quantized = moe::is_quantized(type) && moe::is_quantized(other);
    if (!isa.bf16 || !quantized) return ref;
    const bool i8 = isa.i8 && act_block(type) == 256 && act_block(other) == 256;
    std::vector<Ref> out(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
        out[i] = i8 ? Ref{ref[i].i8_value, ref[i].i8_tol, ref[i].i8_tol}
                    : Ref{ref[i].bf16_value, ref[i].bf16_tol, ref[i].bf16_tol};
    }
    return out;
}
std::vector<Ref> for_family(const std::vector<Ref>& ref, const Isa& isa, Type type) {
    return for_family(ref, isa, type, type);
}

void fill_nan(HostTensor& h) {
    std::fill(reinterpret_cast<float*>(h.bytes.data()),
              reinterpret_cast<float*>(h.bytes.data() + h.bytes.size()), std::numeric_limits<float>::quiet_NaN());
}

// Checks got against the reference; returns how many elements failed (reports the first few).
int check_close(const std::string& what, const std::vector<float>& got, const std::vector<Ref>& ref,
                bool sum_tol_only = false) {
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double tol = sum_tol_only ? ref[i].sum_tol : ref[i].tol;
        const double err = std::fabs(static_cast<double>(got[i]) - ref[i].value);
        if (!(err <= tol)) {
            if (bad < 3) UNSCOPED_INFO(what << ": element " << i << " got " << got[i] << " want " << ref[i].value
                                            << " |err| " << err << " > tol " << tol);
            ++bad;
        }
    }
    return bad;
}

std::vector<float> as_vector(const HostTensor& h) {
    const auto* p = reinterpret_cast<const float*>(h.bytes.data());
    return std::vector<float>(p, p + h.t.n_elements());
}

// ---- MUL_MAT ----

struct MatShape {
    int64_t k, n, m;
};

// Every byte of every block of a super-block type but the fp16 scales set to `fill`: the values and
// group scales at the ends of their ranges (0xFF: Q4_K 15 with scale and min 63, Q6_K 31 with scale -1;
// 0x80: Q6_K scales -128; 0x00: IQ4_XS -127 with scale -32), where the kernels' int16 pair products
// and int32 group sums are largest.
void fill_fields(Type type, std::vector<uint8_t>& bytes, uint8_t fill) {
    const ScaleFields* f = nullptr;
    for (const ScaleFields& sf : kScaleFields) {
        if (sf.type == type) f = &sf;
    }
    REQUIRE(f != nullptr);
    const auto size = static_cast<size_t>(moe::traits(type).block_bytes);
    for (size_t b = 0; b + size <= bytes.size(); b += size) {
        for (size_t i = 0; i < size; ++i) {
            const int field = static_cast<int>(i) & ~1;
            if (field != f->offsets[0] && field != f->offsets[1]) bytes[b + i] = fill;
        }
    }
}

// fill >= 0: the weights' fields all `fill` (fill_fields) and activation row 0 all ones, the others
// +-1 at random, so that every activation quantises to +-127.
void run_mul_mat_case(Type type, MatShape s, const std::vector<Isa>& isas, int fill = -1) {
    HostTensor w = random_weights(type, s.k, s.n);
    HostTensor x = random_acts({s.k, s.m});
    if (fill >= 0) {
        fill_fields(type, w.bytes, static_cast<uint8_t>(fill));
        auto* xf = reinterpret_cast<float*>(x.bytes.data());
        for (int64_t i = 0; i < s.k * s.m; ++i) xf[i] = i < s.k || xf[i] >= 0.0f ? 1.0f : -1.0f;
    } else if (s.k >= 64 && s.m >= 2) {
        // one all-zero activation block exercises the amax = 0 path of the quantiser
        std::fill_n(reinterpret_cast<float*>(x.bytes.data()) + s.k + 32, 32, 0.0f);
    }
    std::vector<Ref> ref(static_cast<size_t>(s.n * s.m));
    for (int64_t r = 0; r < s.n; ++r) {
        const std::vector<float> wr = dequant_row(w.t, r);
        for (int64_t c = 0; c < s.m; ++c) {
            ref[static_cast<size_t>(c * s.n + r)] = ref_dot(type, wr, reinterpret_cast<const float*>(x.t.row(c)));
        }
    }
    std::vector<std::vector<float>> outs;
    for (const Isa& isa : isas) {
        IsaScope scope(isa);
        HostTensor dst = make_tensor(Type::F32, {s.n, s.m});
        fill_nan(dst);
        dst.t.op = Op::MUL_MAT;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        cpu::Scratch scratch;
        const moe::Status st = cpu::mul_mat(dst.t, scratch);
        INFO("mul_mat " << moe::type_name(type) << " " << isa.name << " K=" << s.k << " N=" << s.n << " M=" << s.m);
        REQUIRE(st.is_ok());
        outs.push_back(as_vector(dst));
        CHECK(check_close(isa.name, outs.back(), for_family(ref, isa, type)) == 0);
    }
    // Kernel families agree within float summation error around each other: compare with the first.
    for (size_t i = 1; i < outs.size(); ++i) {
        if (isas[i].bf16) continue;  // rounds differently: checked against its own reference above
        std::vector<Ref> around(ref.size());
        for (size_t j = 0; j < ref.size(); ++j) around[j] = {outs[0][j], ref[j].sum_tol, ref[j].sum_tol};
        INFO("mul_mat " << moe::type_name(type) << " " << isas[i].name << " vs " << isas[0].name << " K=" << s.k
                        << " N=" << s.n << " M=" << s.m);
        CHECK(check_close("cross-isa", outs[i], around, true) == 0);
    }
}

}  // namespace

TEST_CASE("matmul: supported weight types", "[matmul]") {
    for (Type t : kAllTypes) CHECK(cpu::supports_matmul_type(t));
    CHECK_FALSE(cpu::supports_matmul_type(Type::I32));
    CHECK_FALSE(cpu::supports_matmul_type(Type::Q8_K));  // an activation type
    CHECK_FALSE(cpu::supports_matmul_type(Type::IQ2_XXS));
}

TEST_CASE("matmul: Q8A activation rows are bit-identical on every ISA", "[matmul]") {
    namespace mm = moe::cpu::mm;
    const std::vector<Isa> isas = available_isas();
    for (mm::WeightKind kind : {mm::kQ8_0, mm::kQ4_0, mm::kMXFP4, mm::kQ4_1, mm::kQ5_0, mm::kQ5_1, mm::kIQ4_NL}) {
        for (int64_t k : {32, 64, 96, 160, 2880}) {
            std::vector<float> x = random_floats(k);
            if (k >= 96) {
                std::fill_n(x.begin() + 32, 32, 0.0f);  // amax = 0
                x[70] = std::numeric_limits<float>::infinity();
                if (k > 96) x[100] = std::numeric_limits<float>::quiet_NaN();
            }
            const size_t bytes = mm::q8a_row_bytes(k);
            std::vector<std::vector<uint8_t>> rows;
            for (const Isa& isa : isas) {
                std::vector<uint8_t> row(bytes, 0xAB);
                isa.table->quantize_q8a(x.data(), k, kind, row.data());
                rows.push_back(row);
            }
            for (size_t i = 1; i < rows.size(); ++i) {
                INFO("kind " << kind << " K=" << k << " " << isas[i].name << " vs scalar");
                // NaN scales compare by bits: every ISA writes the same quiet NaN.
                CHECK(std::equal(rows[i].begin(), rows[i].begin() + static_cast<int64_t>(mm::q8a_blocks(k) * 40),
                                 rows[0].begin()));
            }
            // The scalar row is a correct quantisation: |x - q d| <= d / 2, corr = -offset * sum(q), and
            // every block's halves sit where q8a_half says.
            const int64_t nbp = mm::q8a_blocks(k);
            const auto* qs = reinterpret_cast<const int8_t*>(rows[0].data());
            const auto* d = reinterpret_cast<const float*>(rows[0].data() + nbp * 32);
            const auto* corr = reinterpret_cast<const int32_t*>(rows[0].data() + nbp * 36);
            INFO("kind " << kind << " K=" << k);
            for (int64_t b = 0; b < nbp; ++b) {
                auto q = [&](int j) { return qs[mm::q8a_half(b, j / 16) + j % 16]; };
                if (b >= k / 32) {  // padding
                    for (int j = 0; j < 32; ++j) CHECK(q(j) == 0);
                    CHECK(d[b] == 0.0f);
                    CHECK(corr[b] == 0);
                    continue;
                }
                bool finite = true;
                int32_t sum = 0;
                for (int j = 0; j < 32; ++j) finite = finite && std::isfinite(x[b * 32 + j]);
                if (!finite) {
                    CHECK(std::isnan(d[b]));
                    continue;
                }
                for (int j = 0; j < 32; ++j) {
                    CHECK(std::fabs(x[b * 32 + j] - q(j) * d[b]) <= d[b] * 0.5001f);
                    sum += q(j);
                }
                CHECK(corr[b] == mm::q8a_corr_factor(kind) * sum);
            }
        }
    }
}

TEST_CASE("matmul: Q8K activation rows are bit-identical on every ISA", "[matmul]") {
    namespace mm = moe::cpu::mm;
    const std::vector<Isa> isas = available_isas();
    for (int64_t k : {256, 512, 768, 2048}) {
        std::vector<float> x = random_floats(k);
        if (k >= 768) {
            std::fill_n(x.begin() + 256, 256, 0.0f);  // amax = 0
            x[600] = std::numeric_limits<float>::infinity();
            if (k > 768) x[1000] = std::numeric_limits<float>::quiet_NaN();
        }
        const size_t bytes = mm::q8k_row_bytes(k);
        const int64_t nb = k / 256;
        std::vector<std::vector<uint8_t>> rows;
        for (const Isa& isa : isas) {
            std::vector<uint8_t> row(bytes, 0xAB);
            isa.table->quantize_q8k(x.data(), k, row.data());
            rows.push_back(row);
        }
        for (size_t i = 1; i < rows.size(); ++i) {
            INFO("K=" << k << " " << isas[i].name << " vs scalar");
            CHECK(std::equal(rows[i].begin(), rows[i].begin() + nb * 292, rows[0].begin()));
        }
        // The scalar row is a correct quantisation: |x - q d| <= d / 2 with d = amax / 127 over 256
        // values, and bsums are the sums of 16.
        const auto* qs = reinterpret_cast<const int8_t*>(rows[0].data());
        const auto* d = reinterpret_cast<const float*>(rows[0].data() + nb * 256);
        const auto* bsums = reinterpret_cast<const int16_t*>(rows[0].data() + nb * 260);
        INFO("K=" << k);
        for (int64_t b = 0; b < nb; ++b) {
            bool finite = true;
            float amax = 0.0f;
            for (int j = 0; j < 256; ++j) {
                finite = finite && std::isfinite(x[b * 256 + j]);
                amax = std::max(amax, std::fabs(x[b * 256 + j]));
            }
            if (!finite) {
                CHECK(std::isnan(d[b]));
                continue;
            }
            CHECK(d[b] == amax / 127.0f);
            for (int g = 0; g < 16; ++g) {
                int32_t sum = 0;
                for (int j = 16 * g; j < 16 * g + 16; ++j) {
                    CHECK(std::fabs(x[b * 256 + j] - qs[b * 256 + j] * d[b]) <= d[b] * 0.5001f);
                    sum += qs[b * 256 + j];
                }
                CHECK(bsums[b * 16 + g] == sum);
            }
        }
    }
}

TEST_CASE("matmul: MUL_MAT matches the float64 reference for every type, ISA and shape", "[matmul]") {
    const std::vector<Isa> isas = available_isas();
    const MatShape shapes[] = {{32, 5, 1},   {32, 77, 130}, {96, 5, 33},   {64, 77, 2},    {160, 5, 3},
                               {2880, 77, 1}, {2880, 5, 7},  {2880, 77, 33}, {2880, 5, 130}};
    for (Type type : kAllTypes) {
        for (const MatShape& s : shapes) run_mul_mat_case(type, {row_len(type, s.k), s.n, s.m}, isas);
    }
    // Float weights have no block size: odd row lengths exercise the kernels' tails.
    const MatShape odd[] = {{1, 5, 3}, {19, 77, 7}, {45, 5, 130}, {100, 6, 2}};
    for (Type type : {Type::F32, Type::F16, Type::BF16}) {
        for (const MatShape& s : odd) run_mul_mat_case(type, s, isas);
    }
}

// The super-block kernels' micro-kernels take up to 4 rows x 4 tokens (AVX-512) or 4 x 2 (AVX2): every
// corner of 1..8 tokens against row counts below, at and past a multiple of 4, over 1 and 3
// super-blocks, and blocks with every field at the end of its range.
TEST_CASE("matmul: the super-block kinds at 1..8 tokens, odd row counts and saturated blocks", "[matmul]") {
    const std::vector<Isa> isas = available_isas();
    const Type kinds[] = {Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::IQ4_XS};
    for (Type type : kinds) {
        for (int64_t m = 1; m <= 8; ++m) {
            for (int64_t n : {1, 3, 4, 6, 9}) run_mul_mat_case(type, {m % 2 ? 256 : 768, n, m}, isas);
        }
        for (int fill : {0x00, 0x80, 0xFF, 0x55}) run_mul_mat_case(type, {512, 5, 3}, isas, fill);
    }
}

TEST_CASE("matmul: MUL_MAT with batched, strided activations", "[matmul]") {
    const std::vector<Isa> isas = available_isas();
    const int64_t k = 96, n = 13;
    for (Type type : {Type::Q4_0, Type::F16}) {
        HostTensor w = random_weights(type, k, n);
        // src1 [K, 3, 2, 2] as a view whose rows are 128 floats apart.
        const int64_t pitch = 128;
        std::vector<float> storage = random_floats(pitch * 3 * 2 * 2);
        Tensor x;
        x.type = Type::F32;
        x.ne[0] = k;
        x.ne[1] = 3;
        x.ne[2] = 2;
        x.ne[3] = 2;
        x.nb[0] = 4;
        x.nb[1] = pitch * 4;
        x.nb[2] = x.nb[1] * 3;
        x.nb[3] = x.nb[2] * 2;
        x.data = storage.data();
        for (const Isa& isa : isas) {
            IsaScope scope(isa);
            HostTensor dst = make_tensor(Type::F32, {n, 3, 2, 2});
            fill_nan(dst);
            dst.t.op = Op::MUL_MAT;
            dst.t.src[0] = &w.t;
            dst.t.src[1] = &x;
            cpu::Scratch scratch;
            REQUIRE(cpu::mul_mat(dst.t, scratch).is_ok());
            const std::vector<float> got = as_vector(dst);
            std::vector<Ref> ref(got.size());
            for (int64_t i = 0; i < 12; ++i) {
                const float* xr = storage.data() + i * pitch;
                for (int64_t r = 0; r < n; ++r) {
                    ref[static_cast<size_t>(i * n + r)] = ref_dot(type, dequant_row(w.t, r), xr);
                }
            }
            INFO(moe::type_name(type) << " " << isa.name);
            CHECK(check_close(isa.name, got, for_family(ref, isa, type)) == 0);
        }
    }
}

namespace {

// MUL_MAT_ID over E experts, of which only `allowed` are ever selected (the others get no tokens).
void run_mul_mat_id_case(Type type, int64_t k, int64_t n, int64_t n_tokens, bool per_slot_input,
                         const std::vector<Isa>& isas) {
    const int64_t n_expert = 7, n_used = 4;
    const std::vector<int32_t> allowed = {0, 2, 3, 5};
    HostTensor w = random_weights(type, k, n, n_expert);
    const int64_t b = per_slot_input ? n_used : 1;
    HostTensor x = random_acts({k, b, n_tokens});
    Ids ids = make_ids(n_used, n_tokens, allowed);
    std::vector<Ref> ref(static_cast<size_t>(n * n_used * n_tokens));
    std::vector<std::vector<float>> rows(static_cast<size_t>(n * n_expert));
    for (int64_t e = 0; e < n_expert; ++e) {
        for (int64_t r = 0; r < n; ++r) rows[static_cast<size_t>(e * n + r)] = dequant_row(w.t, r, e);
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t j = 0; j < n_used; ++j) {
            const int32_t e = ids.v[static_cast<size_t>(t * n_used + j)];
            const auto* xr = reinterpret_cast<const float*>(x.t.row(per_slot_input ? j : 0, t));
            for (int64_t r = 0; r < n; ++r) {
                const std::vector<float>& wr = rows[static_cast<size_t>(e * n + r)];
                ref[static_cast<size_t>((t * n_used + j) * n + r)] = ref_dot(type, wr, xr);
            }
        }
    }
    for (const Isa& isa : isas) {
        IsaScope scope(isa);
        HostTensor dst = make_tensor(Type::F32, {n, n_used, n_tokens});
        fill_nan(dst);
        dst.t.op = Op::MUL_MAT_ID;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        dst.t.src[2] = &ids.t;
        cpu::Scratch scratch;
        const moe::Status st = cpu::mul_mat_id(dst.t, scratch);
        INFO("mul_mat_id " << moe::type_name(type) << " " << isa.name << " K=" << k << " N=" << n << " T=" << n_tokens
                           << " B=" << b << ": " << st.message());
        REQUIRE(st.is_ok());
        CHECK(check_close(isa.name, as_vector(dst), for_family(ref, isa, type)) == 0);
    }
}

}  // namespace

TEST_CASE("matmul: MUL_MAT_ID matches the reference (B = 1 and B = n_used, idle experts)", "[matmul]") {
    const std::vector<Isa> isas = available_isas();
    for (Type type : kAllTypes) {
        for (bool per_slot : {false, true}) {
            run_mul_mat_id_case(type, row_len(type, 64), 77, 1, per_slot, isas);
            run_mul_mat_id_case(type, row_len(type, 96), 5, 3, per_slot, isas);
            run_mul_mat_id_case(type, row_len(type, 2880), 5, 7, per_slot, isas);
            run_mul_mat_id_case(type, row_len(type, 32), 77, 130, per_slot, isas);
        }
    }
    // More threads than this machine has cores change the job plan (smaller row blocks).
    tbb::task_arena arena(8);
    arena.execute([&] { run_mul_mat_id_case(Type::Q8_0, 96, 77, 33, true, isas); });
}

namespace {

// d/dg and d/du bounds of the activations, for propagating the input errors of up and gate.
double act_ref(Activation act, double g, double u) {
    if (act == Activation::SILU) return g / (1.0 + std::exp(-g)) * u;
    const double x = std::min(g, 7.0);
    const double y = std::clamp(u, -7.0, 7.0);
    return x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
}

void run_up_gate_case(Type up_type, Type gate_type, Activation act, bool biases, int64_t k, int64_t f,
                      int64_t n_tokens, const std::vector<Isa>& isas) {
    const int64_t n_expert = 6, n_used = 3;
    HostTensor up = random_weights(up_type, k, f, n_expert);
    HostTensor gate = random_weights(gate_type, k, f, n_expert);
    HostTensor x = random_acts({k, n_tokens});
    Ids ids = make_ids(n_used, n_tokens, {1, 2, 4, 5});
    HostTensor up_bias = random_acts({f, n_expert});
    HostTensor gate_bias = random_acts({f, n_expert});
    std::vector<Ref> ref(static_cast<size_t>(f * n_used * n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto* xr = reinterpret_cast<const float*>(x.t.row(t));
        for (int64_t j = 0; j < n_used; ++j) {
            const int32_t e = ids.v[static_cast<size_t>(t * n_used + j)];
            for (int64_t r = 0; r < f; ++r) {
                Ref u = ref_dot(up_type, dequant_row(up.t, r, e), xr);
                Ref g = ref_dot(gate_type, dequant_row(gate.t, r, e), xr);
                if (biases) {
                    u.value += reinterpret_cast<const float*>(up_bias.t.row(e))[r];
                    g.value += reinterpret_cast<const float*>(gate_bias.t.row(e))[r];
                }
                if (biases) {
                    u.bf16_value += reinterpret_cast<const float*>(up_bias.t.row(e))[r];
                    g.bf16_value += reinterpret_cast<const float*>(gate_bias.t.row(e))[r];
                    u.i8_value += reinterpret_cast<const float*>(up_bias.t.row(e))[r];
                    g.i8_value += reinterpret_cast<const float*>(gate_bias.t.row(e))[r];
                }
                // |d out/d u| <= |g| (SILU: |silu(g)| <= |g|; OAI: |x sigmoid| <= |x|); |d out/d g| <= 1.1 |u (+1)|.
                auto propagate = [&](double uv, double ut, double gv, double gt, double& out, double& tol) {
                    out = act_ref(act, gv, uv);
                    const double du = std::fabs(gv) + gt;
                    const double dg = 1.1 * (std::fabs(uv) + ut + (act == Activation::SWIGLU_OAI ? 1.0 : 0.0));
                    tol = du * ut + dg * gt + 1e-5 * std::fabs(out) + 1e-6;
                };
                Ref& o = ref[static_cast<size_t>((t * n_used + j) * f + r)];
                propagate(u.value, u.tol, g.value, g.tol, o.value, o.tol);
                o.sum_tol = o.tol;
                propagate(u.bf16_value, u.bf16_tol, g.bf16_value, g.bf16_tol, o.bf16_value, o.bf16_tol);
                propagate(u.i8_value, u.i8_tol, g.i8_value, g.i8_tol, o.i8_value, o.i8_tol);
            }
        }
    }
    for (const Isa& isa : isas) {
        IsaScope scope(isa);
        HostTensor dst = make_tensor(Type::F32, {f, n_used, n_tokens});
        fill_nan(dst);
        dst.t.op = Op::MOE_UP_GATE;
        dst.t.src[0] = &up.t;
        dst.t.src[1] = &gate.t;
        dst.t.src[2] = &x.t;
        dst.t.src[3] = &ids.t;
        if (biases) {
            dst.t.src[4] = &up_bias.t;
            dst.t.src[5] = &gate_bias.t;
        }
        dst.t.params.i[0] = static_cast<int32_t>(act);
        if (act == Activation::SWIGLU_OAI) {
            dst.t.params.f[0] = 1.702f;
            dst.t.params.f[1] = 7.0f;
        }
        cpu::Scratch scratch;
        const moe::Status st = cpu::moe_up_gate(dst.t, scratch);
        INFO("moe_up_gate up " << moe::type_name(up_type) << " gate " << moe::type_name(gate_type) << " act "
                               << static_cast<int>(act) << " biases " << biases << " " << isa.name << " K=" << k
                               << " F=" << f << " T=" << n_tokens << ": " << st.message());
        REQUIRE(st.is_ok());
        CHECK(check_close(isa.name, as_vector(dst), for_family(ref, isa, up_type, gate_type)) == 0);
    }
}

}  // namespace

TEST_CASE("matmul: MOE_UP_GATE matches the reference (SILU, SWIGLU_OAI, biases)", "[matmul]") {
    const std::vector<Isa> isas = available_isas();
    for (Type type : kAllTypes) {
        run_up_gate_case(type, type, Activation::SILU, false, row_len(type, 64), 77, 1, isas);
        run_up_gate_case(type, type, Activation::SWIGLU_OAI, true, row_len(type, 96), 5, 7, isas);
        run_up_gate_case(type, type, Activation::SILU, true, row_len(type, 2880), 5, 3, isas);
        run_up_gate_case(type, type, Activation::SWIGLU_OAI, false, row_len(type, 32), 77, 33, isas);
    }
    // Up and gate of different types need differently prepared activations (or share them: Q4_K and
    // Q6_K both take Q8K rows; Q4_0 and Q5_0 differ in their Q8A correction, Q4_1 takes block sums).
    run_up_gate_case(Type::Q8_0, Type::MXFP4, Activation::SWIGLU_OAI, true, 64, 9, 5, isas);
    run_up_gate_case(Type::BF16, Type::Q4_0, Activation::SILU, false, 64, 9, 5, isas);
    run_up_gate_case(Type::Q4_K, Type::Q6_K, Activation::SILU, false, 512, 9, 5, isas);
    run_up_gate_case(Type::Q4_1, Type::Q4_0, Activation::SILU, true, 256, 9, 5, isas);
    run_up_gate_case(Type::Q5_0, Type::IQ4_XS, Activation::SWIGLU_OAI, false, 256, 9, 5, isas);
}

TEST_CASE("matmul: bad expert ids are INVALID_ARGUMENT and leave dst alone", "[matmul]") {
    const int64_t k = 64, n = 8, n_expert = 4, n_used = 2, n_tokens = 3;
    HostTensor w = random_weights(Type::Q8_0, k, n, n_expert);
    HostTensor x = random_acts({k, 1, n_tokens});
    for (int32_t bad : {-2, 4, 1000}) {  // -1 is kNoExpert (a zero row), not an error
        Ids ids = make_ids(n_used, n_tokens, {0, 1, 2, 3});
        ids.v[3] = bad;  // slot 1 of token 1
        HostTensor dst = make_tensor(Type::F32, {n, n_used, n_tokens});
        fill_nan(dst);
        dst.t.op = Op::MUL_MAT_ID;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        dst.t.src[2] = &ids.t;
        cpu::Scratch scratch;
        const moe::Status st = cpu::mul_mat_id(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("[1, 1] = " + std::to_string(bad)));
        for (float v : as_vector(dst)) CHECK(std::isnan(v));

        HostTensor gate = random_weights(Type::Q8_0, k, n, n_expert);
        HostTensor x2 = random_acts({k, n_tokens});
        HostTensor dst2 = make_tensor(Type::F32, {n, n_used, n_tokens});
        dst2.t.op = Op::MOE_UP_GATE;
        dst2.t.src[0] = &w.t;
        dst2.t.src[1] = &gate.t;
        dst2.t.src[2] = &x2.t;
        dst2.t.src[3] = &ids.t;
        const moe::Status st2 = cpu::moe_up_gate(dst2.t, scratch);
        CHECK(st2.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st2.message(), Catch::Contains(std::to_string(bad)));
    }
}

namespace {

// Forces the BF16 path on or off for the scope.
class PathScope {
public:
    explicit PathScope(cpu::Bf16Path path) { cpu::set_bf16_path_for_testing(path); }
    ~PathScope() { cpu::set_bf16_path_for_testing(cpu::Bf16Path::kAuto); }
    PathScope(const PathScope&) = delete;
    PathScope& operator=(const PathScope&) = delete;
};

}  // namespace

TEST_CASE("matmul: kNoExpert ids leave their rows unwritten and the other rows as they were", "[matmul]") {
    // The parts of a split expert block: every row of the masked op is either the unmasked op's row
    // (bit for bit: the same kernel on the same pairs) or untouched (still the NaN poison).
    const int64_t k = 64, n = 24, f = 96, n_expert = 6, n_used = 3, n_tokens = 37;
    cpu::Scratch scratch;
    // Both paths (the BF16 one where the CPU has it; elsewhere kAlways changes nothing).
    for (auto [type, path] : {std::pair{Type::Q8_0, cpu::Bf16Path::kNever}, std::pair{Type::MXFP4, cpu::Bf16Path::kNever},
                              std::pair{Type::F32, cpu::Bf16Path::kNever}, std::pair{Type::Q8_0, cpu::Bf16Path::kAlways},
                              std::pair{Type::MXFP4, cpu::Bf16Path::kAlways}}) {
        const PathScope path_scope(path);
        INFO("type " << type_name(type) << " bf16 path " << (path == cpu::Bf16Path::kAlways));
        HostTensor down = random_weights(type, f, n, n_expert);
        HostTensor up = random_weights(type, k, f, n_expert);
        HostTensor gate = random_weights(type, k, f, n_expert);
        HostTensor h = random_acts({f, n_used, n_tokens});
        HostTensor x = random_acts({k, n_tokens});
        Ids ids = make_ids(n_used, n_tokens, {0, 1, 2, 3, 4, 5});
        Ids masked = ids;
        masked.t.data = masked.v.data();
        std::bernoulli_distribution drop(0.4);
        for (auto& e : masked.v) {
            if (drop(rng())) e = moe::kNoExpert;
        }
        auto run = [&](Op op, Ids& i, int64_t rows) {
            HostTensor dst = make_tensor(Type::F32, {rows, n_used, n_tokens});
            fill_nan(dst);
            dst.t.op = op;
            if (op == Op::MUL_MAT_ID) {
                dst.t.src[0] = &down.t;
                dst.t.src[1] = &h.t;
                dst.t.src[2] = &i.t;
                REQUIRE(cpu::mul_mat_id(dst.t, scratch).is_ok());
            } else {
                dst.t.src[0] = &up.t;
                dst.t.src[1] = &gate.t;
                dst.t.src[2] = &x.t;
                dst.t.src[3] = &i.t;
                REQUIRE(cpu::moe_up_gate(dst.t, scratch).is_ok());
            }
            return as_vector(dst);
        };
        for (auto [op, rows] : {std::pair{Op::MUL_MAT_ID, n}, std::pair{Op::MOE_UP_GATE, f}}) {
            const std::vector<float> all = run(op, ids, rows), part = run(op, masked, rows);
            for (size_t pair = 0; pair < masked.v.size(); ++pair) {
                for (int64_t r = 0; r < rows; ++r) {
                    const size_t i = pair * static_cast<size_t>(rows) + static_cast<size_t>(r);
                    if (masked.v[pair] == moe::kNoExpert) {
                        REQUIRE(std::isnan(part[i]));
                    } else {
                        REQUIRE(part[i] == all[i]);
                    }
                }
            }
        }
    }
}

TEST_CASE("matmul: by default the BF16 path takes Q4_K, Q5_K from 16 pairs per expert, Q3_K, Q6_K, IQ4_XS from 32, the rest from 64",
          "[matmul]") {
    cpu::set_cpu_isa_cap_for_testing(cpu::IsaCap::kNone);
    if (!cpu::cpu_features().avx512_bf16) {
        WARN("skipped: the BF16 path (this CPU has no AVX-512 BF16)");
        return;
    }
    // The default must equal one of the forced paths bit for bit (the two round differently).
    const int64_t k = 256, n = 16;
    for (Type type : {Type::Q8_0, Type::Q4_0, Type::MXFP4, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::IQ4_NL, Type::Q2_K,
                      Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::IQ4_XS}) {
        HostTensor w = random_weights(type, k, n);
        for (int64_t m : {8, 16, 32, 64}) {
            HostTensor x = random_acts({k, m});
            auto run = [&](cpu::Bf16Path path) {
                const PathScope scope(path);
                HostTensor dst = make_tensor(Type::F32, {n, m});
                dst.t.op = Op::MUL_MAT;
                dst.t.src[0] = &w.t;
                dst.t.src[1] = &x.t;
                cpu::Scratch scratch;
                REQUIRE(cpu::mul_mat(dst.t, scratch).is_ok());
                return as_vector(dst);
            };
            const std::vector<float> deflt = run(cpu::Bf16Path::kAuto);
            const std::vector<float> bf16 = run(cpu::Bf16Path::kAlways);
            const std::vector<float> integer = run(cpu::Bf16Path::kNever);
            const int64_t from = type == Type::Q4_K || type == Type::Q5_K    ? 16
                                 : type == Type::Q3_K || type == Type::Q6_K || type == Type::IQ4_XS ? 32
                                                                              : 64;
            const bool want_bf16 = m >= from;
            INFO(moe::type_name(type) << " M=" << m);
            REQUIRE(bf16 != integer);
            CHECK(deflt == (want_bf16 ? bf16 : integer));
        }
    }
}

TEST_CASE("matmul: shape and type errors name the operand", "[matmul]") {
    cpu::Scratch scratch;
    HostTensor w = random_weights(Type::Q4_0, 64, 8);
    SECTION("row length mismatch") {
        HostTensor x = random_acts({32, 2});
        HostTensor dst = make_tensor(Type::F32, {8, 2});
        dst.t.op = Op::MUL_MAT;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        const moe::Status st = cpu::mul_mat(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("src1"));
    }
    SECTION("wrong dst shape") {
        HostTensor x = random_acts({64, 2});
        HostTensor dst = make_tensor(Type::F32, {7, 2});
        dst.t.op = Op::MUL_MAT;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        const moe::Status st = cpu::mul_mat(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("dst"));
    }
    SECTION("non-F32 activations") {
        HostTensor x = make_tensor(Type::F16, {64, 2});
        HostTensor dst = make_tensor(Type::F32, {8, 2});
        dst.t.op = Op::MUL_MAT;
        dst.t.src[0] = &w.t;
        dst.t.src[1] = &x.t;
        const moe::Status st = cpu::mul_mat(dst.t, scratch);
        CHECK_FALSE(st.is_ok());
        CHECK_THAT(st.message(), Catch::Contains("src1"));
    }
    SECTION("MUL_MAT_ID with B neither 1 nor n_used") {
        HostTensor we = random_weights(Type::Q4_0, 64, 8, 3);
        HostTensor x = random_acts({64, 2, 5});
        Ids ids = make_ids(3, 5, {0, 1, 2});
        HostTensor dst = make_tensor(Type::F32, {8, 3, 5});
        dst.t.op = Op::MUL_MAT_ID;
        dst.t.src[0] = &we.t;
        dst.t.src[1] = &x.t;
        dst.t.src[2] = &ids.t;
        const moe::Status st = cpu::mul_mat_id(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("n_used"));
    }
    SECTION("MOE_UP_GATE with an unknown activation or a bias of the wrong shape") {
        HostTensor up = random_weights(Type::Q4_0, 64, 8, 3);
        HostTensor gate = random_weights(Type::Q4_0, 64, 8, 3);
        HostTensor x = random_acts({64, 5});
        Ids ids = make_ids(2, 5, {0, 1, 2});
        HostTensor dst = make_tensor(Type::F32, {8, 2, 5});
        dst.t.op = Op::MOE_UP_GATE;
        dst.t.src[0] = &up.t;
        dst.t.src[1] = &gate.t;
        dst.t.src[2] = &x.t;
        dst.t.src[3] = &ids.t;
        dst.t.params.i[0] = 7;
        moe::Status st = cpu::moe_up_gate(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("params.i[0]"));
        dst.t.params.i[0] = 0;
        HostTensor bias = random_acts({8, 2});
        dst.t.src[4] = &bias.t;
        st = cpu::moe_up_gate(dst.t, scratch);
        CHECK(st.code() == MOE_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(st.message(), Catch::Contains("src4"));
    }
}

namespace {

// One expert FFN (up/gate then down, the down reading the up/gate output with the same ids), computed by
// moe_ffn (one pass) and by the two products one after the other, in an arena of n_threads: the
// outputs must be the same bits (the same kernels on the same rows; only the order of the jobs differs).
// only_expert >= 0: every slot picks that expert, so its down jobs are taken right behind its up/gate
// jobs (the case where a down job must wait: tried without the wait, it fails).
void run_ffn_case(Type up_type, Type down_type, Activation act, bool biases, int64_t k, int64_t f, int64_t n_expert,
                  int64_t n_used, int64_t n_tokens, int n_threads, int32_t only_expert = -1) {
    INFO("up " << moe::type_name(up_type) << " down " << moe::type_name(down_type) << " K=" << k << " F=" << f
               << " E=" << n_expert << " k=" << n_used << " T=" << n_tokens << " threads " << n_threads);
    HostTensor up = random_weights(up_type, k, f, n_expert);
    HostTensor gate = random_weights(up_type, k, f, n_expert);
    HostTensor down = random_weights(down_type, f, k, n_expert);
    HostTensor up_bias = random_acts({f, n_expert});
    HostTensor gate_bias = random_acts({f, n_expert});
    HostTensor x = random_acts({k, n_tokens});
    std::vector<int32_t> allowed(static_cast<size_t>(n_expert));
    for (int32_t e = 0; e < n_expert; ++e) allowed[static_cast<size_t>(e)] = e;
    allowed.push_back(moe::kNoExpert);  // a slot with no expert: its rows are left alone by both
    if (only_expert >= 0) allowed = {only_expert};
    Ids ids = make_ids(n_used, n_tokens, allowed);
    struct Out {
        HostTensor mid, out;
    };
    auto build = [&](Out& o) {
        o.mid = make_tensor(Type::F32, {f, n_used, n_tokens});
        o.out = make_tensor(Type::F32, {k, n_used, n_tokens});
        std::fill(o.mid.bytes.begin(), o.mid.bytes.end(), uint8_t{0});
        std::fill(o.out.bytes.begin(), o.out.bytes.end(), uint8_t{0});
        Tensor& m = o.mid.t;
        m.op = Op::MOE_UP_GATE;
        m.src[0] = &up.t;
        m.src[1] = &gate.t;
        m.src[2] = &x.t;
        m.src[3] = &ids.t;
        if (biases) {
            m.src[4] = &up_bias.t;
            m.src[5] = &gate_bias.t;
        }
        m.params.i[0] = static_cast<int32_t>(act);
        Tensor& d = o.out.t;
        d.op = Op::MUL_MAT_ID;
        d.src[0] = &down.t;
        d.src[1] = &m;
        d.src[2] = &ids.t;
    };
    Out fused, apart;
    build(fused);
    build(apart);
    REQUIRE(cpu::moe_ffn_fusable(fused.mid.t, fused.out.t));
    tbb::task_arena arena(n_threads);
    arena.execute([&] {
        cpu::Scratch s1, s2, s3;
        const moe::Status a = cpu::moe_ffn(fused.mid.t, fused.out.t, s1, s2);
        INFO(a.message());
        REQUIRE(a.is_ok());
        REQUIRE(cpu::moe_up_gate(apart.mid.t, s3).is_ok());
        REQUIRE(cpu::mul_mat_id(apart.out.t, s3).is_ok());
    });
    CHECK(std::memcmp(fused.mid.bytes.data(), apart.mid.bytes.data(), fused.mid.bytes.size()) == 0);
    CHECK(std::memcmp(fused.out.bytes.data(), apart.out.bytes.data(), fused.out.bytes.size()) == 0);
    // And the result is the product's, not zeros: some row of a selected expert is non-zero.
    const std::vector<float> o = as_vector(fused.out);
    CHECK(std::any_of(o.begin(), o.end(), [](float v) { return v != 0.0f; }));
}

}  // namespace

TEST_CASE("matmul: an expert FFN in one pass (moe_ffn) gives the bits of its two products apart", "[matmul]") {
    for (int threads : {1, 3, 4}) {
        // Decode-sized: one to a few tokens, every kind of row the integer paths prepare (Q8A, Q8K, F32).
        run_ffn_case(Type::Q8_0, Type::Q8_0, Activation::SILU, false, 256, 96, 16, 4, 1, threads);
        run_ffn_case(Type::Q4_K, Type::Q6_K, Activation::SILU, false, 512, 256, 16, 4, 3, threads);
        run_ffn_case(Type::IQ4_XS, Type::Q5_K, Activation::SILU, false, 256, 512, 8, 2, 2, threads);
        run_ffn_case(Type::MXFP4, Type::MXFP4, Activation::SWIGLU_OAI, true, 192, 64, 8, 4, 5, threads);
        run_ffn_case(Type::Q4_0, Type::Q4_1, Activation::SILU, true, 128, 64, 4, 2, 1, threads);
        run_ffn_case(Type::F16, Type::F32, Activation::SILU, false, 64, 32, 4, 2, 2, threads);
        run_ffn_case(Type::Q8_0, Type::Q4_0, Activation::SILU, false, 1024, 1024, 8, 1, 1, threads, 3);
        run_ffn_case(Type::Q4_K, Type::Q6_K, Activation::SILU, false, 2048, 768, 8, 2, 2, threads, 5);
        // Enough tokens per expert that the products take their BF16 paths: moe_ffn runs them one after
        // the other.
        run_ffn_case(Type::Q8_0, Type::Q4_K, Activation::SILU, false, 256, 256, 4, 2, 96, threads);
    }
}
