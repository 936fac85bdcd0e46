// Benchmark of the CPU expert kernels on the real MoE shapes (not a test):
//   Q30 (Qwen3-30B-A3B): up/gate [2048, 768, 128], down [768, 2048, 128], top-8, SILU
//   G20 (GPT-OSS-20B):   up/gate [2880, 2880, 32], down [2880, 2880, 32], top-4, SWIGLU_OAI + biases
// For each expert type and token count it times MOE_UP_GATE and MUL_MAT_ID (down, one input row per
// slot) and reports weight bytes touched per second (T = 1: a GEMV, memory-bound) and GFLOP/s
// (T = 512: compute-bound), plus what that means per token for the model's expert layers.
//
// Weights are random bytes with sane block scales (the kernels' speed does not depend on the values),
// in layer copies that are cycled through (by default enough for 3 GiB, well above any last-level
// cache), and the experts of each step are drawn afresh, so that the weights come from DRAM as in real
// decoding. --hot instead reuses one layer and one draw of ids: the weights then come from the caches,
// which measures the kernels' compute speed.
//
// --bf16 always|never forces the BF16 path of quantised weights on or off (where the CPU has AVX-512
// BF16); the default, auto, is the library's own choice. --tiles bf16 makes that path multiply the
// super-block types (Q2_K .. Q6_K, IQ4_XS) with BF16 tiles instead of its default int8 ones (i8). On a CPU
// with AMX that path multiplies every kind's BF16 tiles on AMX; MOEINFER_CPU_ISA=avx512 runs it without.
//
// Usage: moeinfer_bench_matmul [--threads N] [--types q8_0,q4_0,mxfp4,q4_k,q6_k,...,bf16,f16,f32]
//                              [--shapes q30,g20] [--tokens 1,512] [--layers L] [--min-time SECONDS] [--hot]
//                              [--bf16 auto|always|never] [--tiles i8|bf16]
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "core/types.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_ops.h"

namespace {

using moe::Activation;
using moe::Op;
using moe::Tensor;
using moe::Type;

struct Shape {
    const char* name;
    int64_t n_embd, n_ff, n_expert, n_used;
    Activation act;
    bool biases;
    int layers_in_model;  // expert layers, for the per-token projection
};
const Shape kShapes[] = {
    {"q30", 2048, 768, 128, 8, Activation::SILU, false, 48},
    {"g20", 2880, 2880, 32, 4, Activation::SWIGLU_OAI, true, 24},
};

constexpr double kColdBytes = 3.0 * (1ull << 30);  // default weight bytes across layer copies

struct Options {
    int threads = 0;
    std::vector<std::string> types = {"q8_0", "q4_0", "mxfp4", "bf16", "f16"};
    std::vector<std::string> shapes = {"q30", "g20"};
    std::vector<int64_t> tokens = {1, 512};
    int layers = 0;  // 0: enough copies for kColdBytes
    double min_time = 1.0;
    bool hot = false;
    moe::cpu::Bf16Path bf16 = moe::cpu::Bf16Path::kAuto;
    moe::cpu::DecodedTiles tiles = moe::cpu::DecodedTiles::kInt8;
};

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

bool parse_args(int argc, char** argv, Options& o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--threads" && has_value) {
            o.threads = std::atoi(argv[++i]);
        } else if (a == "--types" && has_value) {
            o.types = split(argv[++i]);
        } else if (a == "--shapes" && has_value) {
            o.shapes = split(argv[++i]);
        } else if (a == "--tokens" && has_value) {
            o.tokens.clear();
            for (const std::string& t : split(argv[++i])) o.tokens.push_back(std::atoll(t.c_str()));
        } else if (a == "--layers" && has_value) {
            o.layers = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--min-time" && has_value) {
            o.min_time = std::atof(argv[++i]);
        } else if (a == "--hot") {
            o.hot = true;
        } else if (a == "--bf16" && has_value && (std::strcmp(argv[i + 1], "auto") == 0 ||
                                                  std::strcmp(argv[i + 1], "always") == 0 ||
                                                  std::strcmp(argv[i + 1], "never") == 0)) {
            const std::string v = argv[++i];
            o.bf16 = v == "always" ? moe::cpu::Bf16Path::kAlways
                     : v == "never" ? moe::cpu::Bf16Path::kNever
                                    : moe::cpu::Bf16Path::kAuto;
        } else if (a == "--tiles" && has_value &&
                   (std::strcmp(argv[i + 1], "i8") == 0 || std::strcmp(argv[i + 1], "bf16") == 0)) {
            o.tiles = std::strcmp(argv[++i], "bf16") == 0 ? moe::cpu::DecodedTiles::kBf16 : moe::cpu::DecodedTiles::kInt8;
        } else {
            std::fprintf(stderr,
                         "usage: %s [--threads N] [--types q8_0,q4_0,mxfp4,bf16,f16,f32] [--shapes q30,g20] "
                         "[--tokens 1,512] [--layers L] [--min-time S] [--hot] [--bf16 auto|always|never] "
                         "[--tiles i8|bf16]\n",
                         argv[0]);
            return false;
        }
    }
    return true;
}

// A host tensor with its own storage.
struct HostTensor {
    Tensor t;
    std::vector<uint8_t> bytes;
    HostTensor() = default;
    HostTensor(const HostTensor&) = delete;
    HostTensor& operator=(const HostTensor&) = delete;
};

void shape_tensor(HostTensor& h, Type type, std::initializer_list<int64_t> ne) {
    moe::set_shape(h.t, type, static_cast<int>(ne.size()), ne.begin());
    h.bytes.resize(h.t.n_bytes());
    h.t.data = h.bytes.data();
}

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a fast, seekable stream of random words
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Random weights of `type` (finite, normal values; sane scales), filled in parallel.
void fill_weights(HostTensor& h, uint64_t seed) {
    const Type type = h.t.type;
    const size_t block = static_cast<size_t>(moe::traits(type).block_bytes);
    const size_t n_blocks = h.bytes.size() / block;
    uint8_t* base = h.bytes.data();
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n_blocks, 1 << 14), [&](const tbb::blocked_range<size_t>& r) {
        for (size_t b = r.begin(); b < r.end(); ++b) {
            uint8_t* p = base + b * block;
            uint64_t words[4];
            for (int i = 0; i < 4; ++i) words[i] = mix(seed + b * 4 + static_cast<uint64_t>(i));
            std::memcpy(p, words, std::min(block, sizeof words));
            uint16_t h16;
            switch (type) {
                case Type::Q8_0:
                case Type::Q4_0:
                case Type::Q5_0:
                case Type::IQ4_NL:
                case Type::IQ4_XS:  // d first
                    h16 = moe::fp32_to_fp16(0.01f);
                    std::memcpy(p, &h16, 2);
                    break;
                case Type::Q4_1:
                case Type::Q5_1:  // d, m first
                    h16 = moe::fp32_to_fp16(0.01f);
                    std::memcpy(p, &h16, 2);
                    std::memcpy(p + 2, &h16, 2);
                    break;
                case Type::Q2_K:  // d, dmin last
                    h16 = moe::fp32_to_fp16(0.01f);
                    std::memcpy(p + block - 4, &h16, 2);
                    std::memcpy(p + block - 2, &h16, 2);
                    break;
                case Type::MXFP4: p[0] = static_cast<uint8_t>(118 + (words[0] & 7)); break;
                case Type::Q4_K:
                case Type::Q5_K:  // d, dmin first
                    h16 = moe::fp32_to_fp16(0.01f);
                    std::memcpy(p, &h16, 2);
                    std::memcpy(p + 2, &h16, 2);
                    break;
                case Type::Q3_K:
                case Type::Q6_K:  // d last
                    h16 = moe::fp32_to_fp16(0.01f);
                    std::memcpy(p + block - 2, &h16, 2);
                    break;
                case Type::F16:
                    h16 = static_cast<uint16_t>((words[0] & 0x83FF) | 0x2000);  // |v| in [2^-7, 2^-6)
                    std::memcpy(p, &h16, 2);
                    break;
                case Type::BF16:
                    h16 = static_cast<uint16_t>((words[0] & 0x807F) | 0x3C00);
                    std::memcpy(p, &h16, 2);
                    break;
                case Type::F32: {
                    const uint32_t f = static_cast<uint32_t>((words[0] & 0x807FFFFF) | 0x3C000000);
                    std::memcpy(p, &f, 4);
                    break;
                }
                default: break;
            }
        }
    });
}

void fill_floats(HostTensor& h, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto* f = reinterpret_cast<float*>(h.bytes.data());
    for (int64_t i = 0; i < h.t.n_elements(); ++i) f[i] = nd(rng);
}

// Top-k distinct experts per token, uniformly drawn.
void draw_ids(std::vector<int32_t>& ids, int64_t n_used, int64_t n_tokens, int64_t n_expert, std::mt19937& rng) {
    std::vector<int32_t> perm(static_cast<size_t>(n_expert));
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t j = 0; j < n_used; ++j) {
            std::uniform_int_distribution<int64_t> pick(j, n_expert - 1);
            std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick(rng))]);
            ids[static_cast<size_t>(t * n_used + j)] = perm[static_cast<size_t>(j)];
        }
    }
}

int64_t distinct_experts(const std::vector<int32_t>& ids, int64_t n_expert) {
    std::vector<char> seen(static_cast<size_t>(n_expert), 0);
    int64_t n = 0;
    for (int32_t e : ids) {
        if (!seen[static_cast<size_t>(e)]) {
            seen[static_cast<size_t>(e)] = 1;
            ++n;
        }
    }
    return n;
}

struct Layer {
    HostTensor up, gate, down, up_bias, gate_bias;
};

struct Timing {
    double up_gate_s = 0, down_s = 0;
    double up_gate_cpu_s = 0, down_cpu_s = 0;  // CPU time of the process (all threads)
    double up_gate_bytes = 0, down_bytes = 0;  // weight bytes of the distinct experts touched, per step
    int reps = 0;
};

// On a shared machine the wall time depends on the other load; with --threads 1 the process's CPU
// time measures the kernels' own work.
double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool run_case(const Shape& s, Type type, int64_t n_tokens, const Options& o, std::vector<Layer>& layers,
              std::mt19937& rng) {
    const int64_t k = s.n_embd, f = s.n_ff;
    HostTensor x, mid, out;
    shape_tensor(x, Type::F32, {k, n_tokens});
    fill_floats(x, rng);
    shape_tensor(mid, Type::F32, {f, s.n_used, n_tokens});
    shape_tensor(out, Type::F32, {k, s.n_used, n_tokens});
    std::vector<int32_t> ids(static_cast<size_t>(s.n_used * n_tokens));
    Tensor ids_t;
    ids_t.type = Type::I32;
    ids_t.ne[0] = s.n_used;
    ids_t.ne[1] = n_tokens;
    ids_t.nb[0] = 4;
    ids_t.nb[1] = static_cast<size_t>(4 * s.n_used);
    ids_t.nb[2] = ids_t.nb[3] = ids_t.nb[1] * static_cast<size_t>(n_tokens);
    ids_t.data = ids.data();

    moe::cpu::Scratch scratch;
    Timing tm;
    const auto expert_bytes_ug = static_cast<double>(layers[0].up.t.nb[2] + layers[0].gate.t.nb[2]);
    const auto expert_bytes_down = static_cast<double>(layers[0].down.t.nb[2]);
    const auto start = std::chrono::steady_clock::now();
    for (int rep = 0;; ++rep) {
        Layer& L = layers[o.hot ? 0 : static_cast<size_t>(rep) % layers.size()];
        if (rep == 0 || !o.hot) draw_ids(ids, s.n_used, n_tokens, s.n_expert, rng);
        const auto n_distinct = static_cast<double>(distinct_experts(ids, s.n_expert));

        Tensor& ug = mid.t;
        ug.op = Op::MOE_UP_GATE;
        ug.src[0] = &L.up.t;
        ug.src[1] = &L.gate.t;
        ug.src[2] = &x.t;
        ug.src[3] = &ids_t;
        ug.src[4] = s.biases ? &L.up_bias.t : nullptr;
        ug.src[5] = s.biases ? &L.gate_bias.t : nullptr;
        ug.params.i[0] = static_cast<int32_t>(s.act);
        Tensor& dn = out.t;
        dn.op = Op::MUL_MAT_ID;
        dn.src[0] = &L.down.t;
        dn.src[1] = &mid.t;
        dn.src[2] = &ids_t;

        const double c0 = process_cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        const moe::Status st1 = moe::cpu::moe_up_gate(ug, scratch);
        const auto t1 = std::chrono::steady_clock::now();
        const double c1 = process_cpu_seconds();
        const moe::Status st2 = moe::cpu::mul_mat_id(dn, scratch);
        const auto t2 = std::chrono::steady_clock::now();
        const double c2 = process_cpu_seconds();
        if (!st1.is_ok() || !st2.is_ok()) {
            std::fprintf(stderr, "error: %s%s\n", st1.message().c_str(), st2.message().c_str());
            return false;
        }
        if (rep < 2) continue;  // warm-up: first touch of scratch and of every layer copy
        tm.up_gate_s += std::chrono::duration<double>(t1 - t0).count();
        tm.down_s += std::chrono::duration<double>(t2 - t1).count();
        tm.up_gate_cpu_s += c1 - c0;
        tm.down_cpu_s += c2 - c1;
        tm.up_gate_bytes += n_distinct * expert_bytes_ug;
        tm.down_bytes += n_distinct * expert_bytes_down;
        ++tm.reps;
        if (tm.reps >= 3 && seconds_since(start) >= o.min_time) break;
    }

    const double ug_s = tm.up_gate_s / tm.reps, dn_s = tm.down_s / tm.reps;
    const double pairs = static_cast<double>(s.n_used * n_tokens);
    const double ug_flop = 2.0 * 2.0 * static_cast<double>(k * f) * pairs;
    const double dn_flop = 2.0 * static_cast<double>(k * f) * pairs;
    const double ug_gbs = tm.up_gate_bytes / tm.up_gate_s * 1e-9;
    const double dn_gbs = tm.down_bytes / tm.down_s * 1e-9;
    const double layer_s = ug_s + dn_s;
    const double per_s_16 = static_cast<double>(n_tokens) / (layer_s * 16);
    const double per_s_model = static_cast<double>(n_tokens) / (layer_s * s.layers_in_model);
    std::printf("%-4s %-6s %5lld | up_gate %8.3f ms %7.1f GB/s %7.1f GFLOP/s | down %8.3f ms %7.1f GB/s %7.1f GFLOP/s"
                " | %8.1f t/s per 16 layers, %8.1f t/s per %d layers | cpu up_gate %8.3f ms down %8.3f ms  (%d reps)\n",
                s.name, moe::type_name(type), static_cast<long long>(n_tokens), ug_s * 1e3, ug_gbs,
                ug_flop / ug_s * 1e-9, dn_s * 1e3, dn_gbs, dn_flop / dn_s * 1e-9, per_s_16, per_s_model,
                s.layers_in_model, tm.up_gate_cpu_s / tm.reps * 1e3, tm.down_cpu_s / tm.reps * 1e3, tm.reps);
    std::fflush(stdout);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    if (!parse_args(argc, argv, o)) return 2;
    if (o.threads <= 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    moe::cpu::set_bf16_path_for_testing(o.bf16);
    moe::cpu::set_decoded_tiles_for_testing(o.tiles);
    const char* bf16_names[] = {"auto", "always", "never"};
    std::printf("moeinfer_bench_matmul: %d threads, kernels: %s, BF16 path: %s (super-block tiles %s), weights %s\n",
                o.threads, moe::cpu::cpu_isa_name(), bf16_names[static_cast<int>(o.bf16)],
                o.tiles == moe::cpu::DecodedTiles::kBf16 ? "bf16" : "i8",
                o.hot ? "hot (one layer, fixed ids: from the caches)" : "cold (layer copies cycled: from DRAM)");
    std::printf("GB/s = weight bytes of the distinct experts touched / time; t/s = tokens / (up_gate + down) "
                "time of that many expert layers (experts only)\n");
    tbb::task_arena arena(o.threads);
    int rc = 0;
    arena.execute([&] {
        std::mt19937 rng(1234);
        for (const Shape& s : kShapes) {
            if (std::find(o.shapes.begin(), o.shapes.end(), s.name) == o.shapes.end()) continue;
            for (const std::string& tn : o.types) {
                const moe::TypeTraits* tt = moe::type_traits_by_name(tn);
                if (tt == nullptr || !moe::cpu::supports_matmul_type(tt->type)) {
                    std::fprintf(stderr, "unknown or unsupported type '%s'\n", tn.c_str());
                    rc = 2;
                    return;
                }
                const double layer_bytes = 3.0 * static_cast<double>(moe::row_bytes(tt->type, s.n_embd)) *
                                           static_cast<double>(s.n_ff * s.n_expert);
                const int auto_layers = std::max(2, static_cast<int>(std::ceil(kColdBytes / layer_bytes)));
                const int n_layers = o.hot ? 1 : o.layers > 0 ? o.layers : auto_layers;
                std::vector<Layer> layers(static_cast<size_t>(n_layers));
                uint64_t seed = 1;
                for (Layer& L : layers) {
                    shape_tensor(L.up, tt->type, {s.n_embd, s.n_ff, s.n_expert});
                    shape_tensor(L.gate, tt->type, {s.n_embd, s.n_ff, s.n_expert});
                    shape_tensor(L.down, tt->type, {s.n_ff, s.n_embd, s.n_expert});
                    fill_weights(L.up, seed += 1ull << 40);
                    fill_weights(L.gate, seed += 1ull << 40);
                    fill_weights(L.down, seed += 1ull << 40);
                    if (s.biases) {
                        shape_tensor(L.up_bias, Type::F32, {s.n_ff, s.n_expert});
                        shape_tensor(L.gate_bias, Type::F32, {s.n_ff, s.n_expert});
                        fill_floats(L.up_bias, rng);
                        fill_floats(L.gate_bias, rng);
                    }
                }
                for (int64_t t : o.tokens) {
                    if (!run_case(s, tt->type, t, o, layers, rng)) {
                        rc = 1;
                        return;
                    }
                }
            }
        }
    });
    return rc;
}
