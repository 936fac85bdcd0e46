// MUL_MAT, MUL_MAT_ID and MOE_UP_GATE on the CPU: argument checks, activation preparation, expert
// grouping, tiling and the parallel decomposition. The arithmetic is in the per-ISA kernel tables
// (cpu/matmul_kernels.h); this file is baseline x86-64 and picks a table at each call.
//
// Design choices:
// - Activations are prepared once per op, in parallel over rows, into scratch memory: quantised to
//   "Q8A" rows (int8 + float scale per block of 32 + a per-block correction for unsigned weight
//   bytes or the block sum, in the element order the weight kind unpacks to; see matmul_kernels.h)
//   for the 32-element block kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4), and to "Q8K" rows
//   (int8 + float scale per 256 + int16 sums of 16, as ggml's Q8_K) for the super-block kinds (Q2_K ..
//   Q6_K, IQ4_XS), so that the kernels use integer dot products (VNNI vpdpbusd, AVX2 pmaddubsw);
//   copied into zero-padded, 64-byte aligned F32 rows for F32 / F16 / BF16 weights, which are widened
//   to F32 and multiplied with FMA (no BF16 rounding of activations).
// - Work is cut into jobs of (expert, block of <= 64 weight rows, block of <= 64 tokens). Rows per
//   job are halved (64 -> 4) until there are >= 8 jobs per thread, so a single token (TG: a GEMV per
//   selected expert, memory-bound, parallel over rows and experts) fills every core, and many tokens
//   (PP) keep 64-row weight blocks hot in L2 while all tokens of the block pass over them. Jobs are
//   ordered expert, row block, token block, so neighbouring jobs (which oneTBB tends to give the same
//   thread) share weights. Each kernel call is told which weights its thread reads next, and
//   prefetches them while it computes, so the weight stream stays ahead of the arithmetic across
//   tiles and jobs (what makes TG reach DRAM bandwidth).
// - MUL_MAT_ID / MOE_UP_GATE compute only the selected experts: (token, slot) pairs are grouped by
//   expert with a stable counting sort; kernels read the activation rows and write the outputs through
//   the pair's index lists, so nothing is gathered or scattered in a separate pass.
// - MOE_UP_GATE reads the prepared activations once for both projections: a job computes the up and
//   the gate tile of the same rows and tokens, adds the biases and applies the activation on the way
//   out. SWIGLU_OAI takes alpha and limit from params.f[0] / f[1], 0 meaning gpt-oss's 1.702 / 7.
// - Where many tokens share each weight row (prefill, large batches) and the CPU has AVX-512 BF16,
//   quantised weights may take the BF16 path instead (cpu/matmul_bf16_path.h): weights decoded once
//   per job to BF16, dot products in F32 (bf16path::wanted decides per op); the super-block kinds
//   (Q2_K .. Q6_K, IQ4_XS) are decoded and requantised to int8 there instead, multiplied with Q8K
//   activations by VNNI (cpu/matmul_i8.h), twice the products per instruction.
// - Ids are validated (0 <= id < E) before anything is computed; a bad one is INVALID_ARGUMENT naming
//   its position and value.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu/cpu_features.h"
#include "cpu/cpu_ops.h"
#include "cpu/matmul_bf16_path.h"
#include "cpu/matmul_kernels.h"
#include "cpu/ops_common.h"

namespace moe::cpu {
namespace {

using mm::GemmArgs;
using mm::KernelTable;
using mm::WeightKind;

constexpr int64_t kMaxRowsPerJob = 64;
constexpr int64_t kMinRowsPerJob = 4;
constexpr int64_t kMaxColsPerJob = 64;
constexpr int64_t kJobsPerThread = 8;

const KernelTable& active_kernels() {
    const CpuFeatures& f = cpu_features();
    if (f.avx512 && f.avx512_vnni) return mm::kAvx512Kernels;
    if (f.avx2) return mm::kAvx2Kernels;
    return mm::kScalarKernels;
}

// -1 for types the kernels do not handle.
int weight_kind(Type t) {
    switch (t) {
        case Type::F32: return mm::kF32;
        case Type::F16: return mm::kF16;
        case Type::BF16: return mm::kBF16;
        case Type::Q8_0: return mm::kQ8_0;
        case Type::Q4_0: return mm::kQ4_0;
        case Type::MXFP4: return mm::kMXFP4;
        case Type::Q4_1: return mm::kQ4_1;
        case Type::Q5_0: return mm::kQ5_0;
        case Type::Q5_1: return mm::kQ5_1;
        case Type::IQ4_NL: return mm::kIQ4_NL;
        case Type::Q2_K: return mm::kQ2_K;
        case Type::Q3_K: return mm::kQ3_K;
        case Type::Q4_K: return mm::kQ4_K;
        case Type::Q5_K: return mm::kQ5_K;
        case Type::Q6_K: return mm::kQ6_K;
        case Type::IQ4_XS: return mm::kIQ4_XS;
        default: return -1;
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// The busy-wait hint of a thread waiting for another's job (run_fused).
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

// ---- argument checks ----

Status check_weights(const char* op, const char* role, const Tensor* w, int max_dims) {
    if (w == nullptr) return invalid_argument(std::string(op) + ": " + role + " is missing");
    if (w->data == nullptr) return invalid_argument(std::string(op) + ": " + role + " has no data");
    if (weight_kind(w->type) < 0) {
        return unimplemented(std::string(op) + ": " + role + " type " + ops::type_str(w->type) +
                             " is not supported by the CPU matmul kernels");
    }
    if (w->nb[0] != static_cast<size_t>(traits(w->type).block_bytes)) {
        return unimplemented(std::string(op) + ": " + role + " rows must be contiguous (nb[0] = " +
                             std::to_string(w->nb[0]) + ")");
    }
    for (int d = max_dims; d < 4; ++d) {
        if (w->ne[d] != 1) {
            return invalid_argument(std::string(op) + ": " + role + " must have at most " + std::to_string(max_dims) +
                                    " dimensions, got shape " + ops::shape_str(*w));
        }
    }
    return Status::ok();
}

Status check_contiguous_f32(const char* op, const char* role, const Tensor& t) {
    size_t expect = 4;
    for (int d = 0; d < 4; ++d) {
        if (t.ne[d] > 1 && t.nb[d] != expect) {
            return unimplemented(std::string(op) + ": " + role + " must be contiguous (nb[" + std::to_string(d) +
                                 "] = " + std::to_string(t.nb[d]) + ", expected " + std::to_string(expect) + ")");
        }
        expect *= static_cast<size_t>(t.ne[d]);
    }
    return Status::ok();
}

Status check_dst_shape(const char* op, const Tensor& dst, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    if (dst.ne[0] != n0 || dst.ne[1] != n1 || dst.ne[2] != n2 || dst.ne[3] != n3) {
        return invalid_argument(std::string(op) + ": dst has shape " + ops::shape_str(dst) + ", expected [" +
                                std::to_string(n0) + ", " + std::to_string(n1) + ", " + std::to_string(n2) + ", " +
                                std::to_string(n3) + "]");
    }
    return Status::ok();
}

// ids I32 [n_used, T]: every entry must name an expert in [0, n_expert) or be kNoExpert.
Status check_ids(const char* op, const char* role, const Tensor* ids, int64_t n_tokens, int64_t n_expert) {
    MOE_RETURN_IF_ERROR(ops::check_operand(op, role, ids, Type::I32));
    if (ids->ne[1] != n_tokens || ids->ne[2] != 1 || ids->ne[3] != 1 || ids->ne[0] < 1) {
        return invalid_argument(std::string(op) + ": " + role + " has shape " + ops::shape_str(*ids) +
                                ", expected [n_used, " + std::to_string(n_tokens) + "]");
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto* row = reinterpret_cast<const int32_t*>(ids->row(t));
        for (int64_t j = 0; j < ids->ne[0]; ++j) {
            if ((row[j] < 0 || row[j] >= n_expert) && row[j] != kNoExpert) {
                return invalid_argument(std::string(op) + ": " + role + "[" + std::to_string(j) + ", " +
                                        std::to_string(t) + "] = " + std::to_string(row[j]) +
                                        " is not an expert id (0 <= id < " + std::to_string(n_expert) + ", or -1 for none)");
            }
        }
    }
    return Status::ok();
}

// Optional bias [F, E] F32 with contiguous rows.
Status check_bias(const char* op, const char* role, const Tensor* b, int64_t f, int64_t e) {
    if (b == nullptr) return Status::ok();
    MOE_RETURN_IF_ERROR(ops::check_operand(op, role, b, Type::F32));
    if (b->ne[0] != f || b->ne[1] != e || b->ne[2] != 1 || b->ne[3] != 1) {
        return invalid_argument(std::string(op) + ": " + role + " has shape " + ops::shape_str(*b) + ", expected [" +
                                std::to_string(f) + ", " + std::to_string(e) + "]");
    }
    return Status::ok();
}

// ---- scratch layout ----

// Hands out 64-byte aligned pieces of one scratch allocation: offsets first, then one get().
class ScratchPlan {
public:
    size_t add(size_t bytes) {
        const size_t off = size_;
        size_ = align64(size_ + bytes);
        return off;
    }
    uint8_t* commit(Scratch& scratch) { return static_cast<uint8_t*>(scratch.get(size_ > 0 ? size_ : 64)); }

private:
    size_t size_ = 0;
};

// ---- activation preparation ----

enum class ActFormat { kF32, kQ8A, kQ8K };

struct ActLayout {
    ActFormat format;
    WeightKind kind;  // Q8A rows are prepared for this weight kind (corr factor)
    size_t stride;    // bytes per prepared row
};

ActLayout act_layout(int kind, int64_t k) {
    const auto wk = static_cast<WeightKind>(kind);
    if (mm::is_superblock_kind(wk)) return {ActFormat::kQ8K, wk, mm::q8k_row_bytes(k)};
    if (mm::is_quantized_kind(wk)) return {ActFormat::kQ8A, wk, mm::q8a_row_bytes(k)};
    return {ActFormat::kF32, wk, mm::f32a_row_bytes(k)};
}

// Two weight kinds can share prepared activations when they want the same bytes.
bool same_layout(const ActLayout& a, const ActLayout& b) {
    if (a.format != b.format) return false;
    return a.format != ActFormat::kQ8A || mm::q8a_corr_factor(a.kind) == mm::q8a_corr_factor(b.kind);
}

// Prepares one row of k floats at x into d.
void prepare_act_row(const KernelTable& kt, const ActLayout& layout, int64_t k, const float* x, uint8_t* d) {
    switch (layout.format) {
        case ActFormat::kQ8A: kt.quantize_q8a(x, k, layout.kind, d); break;
        case ActFormat::kQ8K: kt.quantize_q8k(x, k, d); break;
        case ActFormat::kF32: {
            const size_t bytes = static_cast<size_t>(k) * 4;
            std::memcpy(d, x, bytes);
            std::memset(d + bytes, 0, layout.stride - bytes);
            break;
        }
    }
}

// Prepares n rows of k floats; row i is read from src_row(i).
template <typename RowFn>
void prepare_acts(const KernelTable& kt, const ActLayout& layout, int64_t k, int64_t n, uint8_t* dst,
                  RowFn&& src_row) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, ops::row_grain(k)), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t i = r.begin(); i < r.end(); ++i) {
            prepare_act_row(kt, layout, k, src_row(i), dst + static_cast<size_t>(i) * layout.stride);
        }
    });
}

// ---- job planning ----

// Rows per job: the largest of 64, 32, 16, 8, 4 that still gives every thread kJobsPerThread jobs.
int64_t rows_per_job(int64_t n_rows, int64_t col_blocks) {
    const int64_t want = kJobsPerThread * std::max(1, tbb::this_task_arena::max_concurrency());
    int64_t rb = kMaxRowsPerJob;
    while (rb > kMinRowsPerJob && ceil_div(n_rows, rb) * col_blocks < want) rb /= 2;
    return rb;
}

// Token blocks of a group of n tokens: as few as fit kMaxColsPerJob, of balanced size.
struct ColBlocks {
    int64_t count;
    int64_t size;
};
ColBlocks col_blocks(int64_t n) {
    const int64_t count = ceil_div(n, kMaxColsPerJob);
    return {count, count > 0 ? ceil_div(n, count) : 0};
}

struct Job {
    int32_t expert;
    int32_t r0;
    int32_t c0;  // first pair of the expert's group
    int32_t nc;
};

// (token, slot) pairs grouped by expert: the pairs of expert e are [offsets[e], offsets[e + 1]).
struct ExpertGroups {
    int32_t* offsets;  // n_expert + 1
    int32_t* act_idx;  // prepared activation row of each pair
    int32_t* out_idx;  // dst row (slot + n_used * token) of each pair
};

// Stable counting sort of the ids (already validated) by expert; `cursor` is n_expert ints of room.
// Pairs with kNoExpert are left out (their dst rows are not written).
void group_by_expert(const Tensor& ids, int64_t n_expert, bool shared_input, ExpertGroups g, int32_t* cursor) {
    const int64_t n_used = ids.ne[0];
    const int64_t n_tokens = ids.ne[1];
    std::fill(g.offsets, g.offsets + n_expert + 1, 0);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto* row = reinterpret_cast<const int32_t*>(ids.row(t));
        for (int64_t j = 0; j < n_used; ++j) {
            if (row[j] != kNoExpert) ++g.offsets[row[j] + 1];
        }
    }
    for (int64_t e = 0; e < n_expert; ++e) g.offsets[e + 1] += g.offsets[e];
    std::copy(g.offsets, g.offsets + n_expert, cursor);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto* row = reinterpret_cast<const int32_t*>(ids.row(t));
        for (int64_t j = 0; j < n_used; ++j) {
            if (row[j] == kNoExpert) continue;
            const int32_t pos = cursor[row[j]]++;
            g.act_idx[pos] = static_cast<int32_t>(shared_input ? t : j + n_used * t);
            g.out_idx[pos] = static_cast<int32_t>(j + n_used * t);
        }
    }
}

// Writes the jobs of the experts that have pairs (expert, row block, token block order) and returns
// how many there are.
int64_t plan_expert_jobs(const ExpertGroups& g, int64_t n_expert, int64_t n_rows, int64_t rb, Job* jobs) {
    int64_t n = 0;
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t cnt = g.offsets[e + 1] - g.offsets[e];
        if (cnt == 0) continue;
        const ColBlocks cb = col_blocks(cnt);
        for (int64_t r0 = 0; r0 < n_rows; r0 += rb) {
            for (int64_t c0 = 0; c0 < cnt; c0 += cb.size) {
                jobs[n++] = {static_cast<int32_t>(e), static_cast<int32_t>(r0), static_cast<int32_t>(c0),
                             static_cast<int32_t>(std::min(cb.size, cnt - c0))};
            }
        }
    }
    return n;
}

// The most jobs plan_expert_jobs can make (with the smallest row block), to size the job list: at
// most min(E, pairs) experts have pairs, and they need at most that many + pairs / 64 token blocks.
int64_t max_expert_jobs(int64_t n_rows, int64_t n_expert, int64_t n_pairs) {
    return ceil_div(n_rows, kMinRowsPerJob) * (std::min(n_expert, n_pairs) + ceil_div(n_pairs, kMaxColsPerJob));
}

int64_t total_col_blocks(const ExpertGroups& g, int64_t n_expert) {
    int64_t n = 0;
    for (int64_t e = 0; e < n_expert; ++e) n += col_blocks(g.offsets[e + 1] - g.offsets[e]).count;
    return n;
}

// body(j, next): next is the job this thread runs after j (its weights can be prefetched), or -1.
template <typename Body>
void for_each_job(int64_t n_jobs, Body&& body) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_jobs, 1), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t j = r.begin(); j < r.end(); ++j) body(j, j + 1 < r.end() ? j + 1 : -1);
    });
}

// An expert product's integer-path jobs, prepared (its activations and job list in scratch): the
// callers below run them with for_each_job, moe_ffn runs two of them in one pass. Valid only inside the
// executor the product calls (its state lives in the product's frame).
struct JobSet {
    int64_t n_jobs = 0;
    const Job* jobs = nullptr;  // plan_expert_jobs order: by expert
    std::function<void(int64_t, int64_t)> run;  // run(j, next), as for_each_job's body
    // Where the activations are prepared per expert (MUL_MAT_ID fused behind MOE_UP_GATE, whose output
    // they are): prepares expert e's rows; they must be written by then. Empty: prepared up front.
    std::function<void(int64_t)> prepare_expert;
};
using JobExecutor = std::function<void(const JobSet&)>;

void run_jobs(const JobSet& js) { for_each_job(js.n_jobs, js.run); }

// ---- activations of MOE_UP_GATE ----

struct Glu {
    Activation act;
    float alpha;  // SWIGLU_OAI
    float limit;  // SWIGLU_OAI
    // out[i] = act(g[i], u[i]) for i < n, the activation chosen once so that each loop vectorises
    // (ops::sigmoid is branch-free).
    void row(float* out, const float* g, const float* u, int64_t n) const {
        if (act == Activation::SILU) {
            for (int64_t i = 0; i < n; ++i) out[i] = silu(g[i], u[i]);
        } else {
            for (int64_t i = 0; i < n; ++i) out[i] = oai(g[i], u[i]);
        }
    }
    static float silu(float g, float u) { return g * ops::sigmoid(g) * u; }
    float oai(float g, float u) const {
        const float x = std::min(g, limit);
        const float y = std::clamp(u, -limit, limit);
        return x * ops::sigmoid(alpha * x) * (y + 1.0f);
    }
};

// Writes a BF16-path tile of a plain product: pair i goes to out row out_idx[i] (or i).
void store_tile(const bf16path::Tile& t, const int32_t* out_idx, float* out, int64_t n) {
    for (int64_t c = 0; c < t.nc; ++c) {
        const int64_t pair = t.first + c;
        float* o = out + (out_idx ? out_idx[pair] : pair) * n + t.r0;
        for (int64_t r = 0; r < t.nr; ++r) o[r] = t.acc[0][r * t.stride + c];
    }
}

}  // namespace

bool supports_matmul_type(Type weight_type) { return weight_kind(weight_type) >= 0; }

Status mul_mat(Tensor& dst, Scratch& scratch) {
    constexpr const char* kOp = "MUL_MAT";
    if (dst.op != Op::MUL_MAT) return invalid_argument(std::string("mul_mat: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (weight)", dst.src[0], 2));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src1", dst.src[1], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "dst", &dst, Type::F32));
    const Tensor& w = *dst.src[0];
    const Tensor& x = *dst.src[1];
    const int64_t k = w.ne[0];
    const int64_t n = w.ne[1];
    if (x.ne[0] != k) {
        return invalid_argument(std::string(kOp) + ": src1 has " + std::to_string(x.ne[0]) +
                                " elements per row, src0 (weight) has " + std::to_string(k));
    }
    MOE_RETURN_IF_ERROR(check_dst_shape(kOp, dst, n, x.ne[1], x.ne[2], x.ne[3]));
    MOE_RETURN_IF_ERROR(check_contiguous_f32(kOp, "dst", dst));
    const int64_t m = x.n_rows();
    if (m == 0 || n == 0) return Status::ok();

    const int kind = weight_kind(w.type);
    auto* out = dst.as<float>();
    if (bf16path::wanted(kind, m, 1)) {
        ScratchPlan plan;
        const size_t offsets_off = plan.add(2 * sizeof(int32_t));
        const size_t bf16_off = plan.add(bf16path::scratch_bytes(k, n, 1, m));
        uint8_t* base = plan.commit(scratch);
        auto* offsets = reinterpret_cast<int32_t*>(base + offsets_off);
        offsets[0] = 0;
        offsets[1] = static_cast<int32_t>(m);
        bf16path::Problem p{};
        p.w[0] = {static_cast<const uint8_t*>(w.data), w.nb[1], 0, kind};
        p.n_w = 1;
        p.k = k;
        p.n_rows = n;
        p.n_expert = 1;
        p.offsets = offsets;
        p.act_row = [&](int64_t i) { return reinterpret_cast<const float*>(ops::row_ptr(x, i)); };
        p.store = [&](const bf16path::Tile& t) { store_tile(t, nullptr, out, n); };
        bf16path::run(p, base + bf16_off);
        return Status::ok();
    }

    const KernelTable& kt = active_kernels();
    const ActLayout layout = act_layout(kind, k);
    ScratchPlan plan;
    const size_t acts_off = plan.add(layout.stride * static_cast<size_t>(m));
    uint8_t* base = plan.commit(scratch);
    uint8_t* acts = base + acts_off;
    prepare_acts(kt, layout, k, m, acts, [&](int64_t i) { return reinterpret_cast<const float*>(ops::row_ptr(x, i)); });

    const ColBlocks cb = col_blocks(m);
    const int64_t rb = rows_per_job(n, cb.count);
    const int64_t n_rb = ceil_div(n, rb);
    const mm::GemmFn gemm = kt.gemm[kind];
    const auto* w_data = static_cast<const uint8_t*>(w.data);
    auto job_w = [&](int64_t j) { return w_data + (j / cb.count) * rb * w.nb[1]; };
    for_each_job(n_rb * cb.count, [&](int64_t j, int64_t next) {
        const int64_t r0 = (j / cb.count) * rb;
        const int64_t c0 = (j % cb.count) * cb.size;
        GemmArgs a{};
        a.w = job_w(j);
        a.next_w = next >= 0 ? job_w(next) : nullptr;
        a.w_stride = w.nb[1];
        a.n_rows = std::min(rb, n - r0);
        a.k = k;
        a.act = acts + static_cast<size_t>(c0) * layout.stride;
        a.act_stride = layout.stride;
        a.n_cols = std::min(cb.size, m - c0);
        a.out = out + c0 * n + r0;
        a.out_stride = n;
        gemm(a);
    });
    return Status::ok();
}

namespace {

// MUL_MAT_ID; its integer-path jobs go to `exec`. defer_acts: the activations are prepared per expert by
// JobSet::prepare_expert instead of up front (REQUIRES: no BF16 path, which the caller checks).
Status mul_mat_id_with(Tensor& dst, Scratch& scratch, const JobExecutor& exec, bool defer_acts) {
    constexpr const char* kOp = "MUL_MAT_ID";
    if (dst.op != Op::MUL_MAT_ID) return invalid_argument(std::string("mul_mat_id: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (experts)", dst.src[0], 3));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src1", dst.src[1], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "dst", &dst, Type::F32));
    const Tensor& w = *dst.src[0];
    const Tensor& x = *dst.src[1];
    const int64_t k = w.ne[0];
    const int64_t n = w.ne[1];
    const int64_t n_expert = w.ne[2];
    const int64_t n_tokens = x.ne[2];
    if (x.ne[0] != k || x.ne[3] != 1) {
        return invalid_argument(std::string(kOp) + ": src1 has shape " + ops::shape_str(x) + ", expected [" +
                                std::to_string(k) + ", B, T]");
    }
    MOE_RETURN_IF_ERROR(check_ids(kOp, "src2 (ids)", dst.src[2], n_tokens, n_expert));
    const Tensor& ids = *dst.src[2];
    const int64_t n_used = ids.ne[0];
    if (x.ne[1] != 1 && x.ne[1] != n_used) {
        return invalid_argument(std::string(kOp) + ": src1 has " + std::to_string(x.ne[1]) +
                                " rows per token; expected 1 or n_used = " + std::to_string(n_used));
    }
    MOE_RETURN_IF_ERROR(check_dst_shape(kOp, dst, n, n_used, n_tokens, 1));
    MOE_RETURN_IF_ERROR(check_contiguous_f32(kOp, "dst", dst));
    if (n_tokens == 0 || n == 0) return Status::ok();

    const KernelTable& kt = active_kernels();
    const int kind = weight_kind(w.type);
    const ActLayout layout = act_layout(kind, k);
    const int64_t n_act = x.ne[1] * n_tokens;
    const int64_t n_pairs = n_used * n_tokens;
    const bool bf16 = bf16path::wanted(kind, n_pairs, n_expert);
    if (bf16 && defer_acts) return internal_error(std::string(kOp) + ": deferred activations on the BF16 path");
    ScratchPlan plan;
    const size_t acts_off = plan.add(bf16 ? bf16path::scratch_bytes(k, n, n_expert, n_pairs)
                                          : layout.stride * static_cast<size_t>(n_act));
    const size_t offsets_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_expert + 1));
    const size_t cursor_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_expert));
    const size_t act_idx_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_pairs));
    const size_t out_idx_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_pairs));
    const size_t jobs_off = plan.add(sizeof(Job) * static_cast<size_t>(max_expert_jobs(n, n_expert, n_pairs)));
    uint8_t* base = plan.commit(scratch);

    ExpertGroups g{reinterpret_cast<int32_t*>(base + offsets_off), reinterpret_cast<int32_t*>(base + act_idx_off),
                   reinterpret_cast<int32_t*>(base + out_idx_off)};
    group_by_expert(ids, n_expert, x.ne[1] == 1, g, reinterpret_cast<int32_t*>(base + cursor_off));
    uint8_t* acts = base + acts_off;
    auto act_row = [&](int64_t i) { return reinterpret_cast<const float*>(x.row(i % x.ne[1], i / x.ne[1])); };
    auto* out = dst.as<float>();
    if (bf16) {
        bf16path::Problem p{};
        p.w[0] = {static_cast<const uint8_t*>(w.data), w.nb[1], w.nb[2], kind};
        p.n_w = 1;
        p.k = k;
        p.n_rows = n;
        p.n_expert = n_expert;
        p.offsets = g.offsets;
        p.act_idx = g.act_idx;
        p.act_row = act_row;
        p.store = [&](const bf16path::Tile& t) { store_tile(t, g.out_idx, out, n); };
        bf16path::run(p, acts);
        return Status::ok();
    }
    if (!defer_acts) prepare_acts(kt, layout, k, n_act, acts, act_row);

    const int64_t rb = rows_per_job(n, total_col_blocks(g, n_expert));
    auto* jobs = reinterpret_cast<Job*>(base + jobs_off);
    const int64_t n_jobs = plan_expert_jobs(g, n_expert, n, rb, jobs);
    const mm::GemmFn gemm = kt.gemm[kind];
    const auto* w_data = static_cast<const uint8_t*>(w.data);
    auto job_w = [&](int64_t j) { return w_data + jobs[j].expert * w.nb[2] + jobs[j].r0 * w.nb[1]; };
    JobSet js;
    js.n_jobs = n_jobs;
    js.jobs = jobs;
    if (defer_acts) {
        js.prepare_expert = [&](int64_t e) {
            for (int32_t pos = g.offsets[e]; pos < g.offsets[e + 1]; ++pos) {
                const int64_t i = g.act_idx[pos];
                prepare_act_row(kt, layout, k, act_row(i), acts + static_cast<size_t>(i) * layout.stride);
            }
        };
    }
    js.run = [&](int64_t j, int64_t next) {
        const Job& job = jobs[j];
        const int64_t first = g.offsets[job.expert] + job.c0;
        GemmArgs a{};
        a.w = job_w(j);
        a.next_w = next >= 0 ? job_w(next) : nullptr;
        a.w_stride = w.nb[1];
        a.n_rows = std::min<int64_t>(rb, n - job.r0);
        a.k = k;
        a.act = acts;
        a.act_stride = layout.stride;
        a.act_idx = g.act_idx + first;
        a.n_cols = job.nc;
        a.out = out + job.r0;
        a.out_stride = n;
        a.out_idx = g.out_idx + first;
        gemm(a);
    };
    exec(js);
    return Status::ok();
}

// MOE_UP_GATE; its integer-path jobs go to `exec`.
Status moe_up_gate_with(Tensor& dst, Scratch& scratch, const JobExecutor& exec) {
    constexpr const char* kOp = "MOE_UP_GATE";
    if (dst.op != Op::MOE_UP_GATE) return invalid_argument(std::string("moe_up_gate: dst.op is ") + op_name(dst.op));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src0 (up)", dst.src[0], 3));
    MOE_RETURN_IF_ERROR(check_weights(kOp, "src1 (gate)", dst.src[1], 3));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "src2 (x)", dst.src[2], Type::F32));
    MOE_RETURN_IF_ERROR(ops::check_operand(kOp, "dst", &dst, Type::F32));
    const Tensor& up = *dst.src[0];
    const Tensor& gate = *dst.src[1];
    const Tensor& x = *dst.src[2];
    if (!ops::same_shape(up, gate)) {
        return invalid_argument(std::string(kOp) + ": src1 (gate) has shape " + ops::shape_str(gate) +
                                ", src0 (up) has " + ops::shape_str(up));
    }
    const int64_t k = up.ne[0];
    const int64_t f = up.ne[1];
    const int64_t n_expert = up.ne[2];
    const int64_t n_tokens = x.ne[1];
    if (x.ne[0] != k || x.ne[2] != 1 || x.ne[3] != 1) {
        return invalid_argument(std::string(kOp) + ": src2 (x) has shape " + ops::shape_str(x) + ", expected [" +
                                std::to_string(k) + ", T]");
    }
    MOE_RETURN_IF_ERROR(check_ids(kOp, "src3 (ids)", dst.src[3], n_tokens, n_expert));
    const Tensor& ids = *dst.src[3];
    const int64_t n_used = ids.ne[0];
    MOE_RETURN_IF_ERROR(check_bias(kOp, "src4 (up bias)", dst.src[4], f, n_expert));
    MOE_RETURN_IF_ERROR(check_bias(kOp, "src5 (gate bias)", dst.src[5], f, n_expert));
    MOE_RETURN_IF_ERROR(check_dst_shape(kOp, dst, f, n_used, n_tokens, 1));
    MOE_RETURN_IF_ERROR(check_contiguous_f32(kOp, "dst", dst));
    const auto act = static_cast<Activation>(dst.params.i[0]);
    if (act != Activation::SILU && act != Activation::SWIGLU_OAI) {
        return invalid_argument(std::string(kOp) + ": params.i[0] = " + std::to_string(dst.params.i[0]) +
                                " is not an Activation (0 = SILU, 1 = SWIGLU_OAI)");
    }
    const Glu glu{act, dst.params.f[0] != 0.0f ? dst.params.f[0] : 1.702f,
                  dst.params.f[1] != 0.0f ? dst.params.f[1] : 7.0f};
    if (act == Activation::SWIGLU_OAI && !(glu.limit > 0.0f)) {
        return invalid_argument(std::string(kOp) + ": params.f[1] (limit) must be > 0, got " +
                                std::to_string(glu.limit));
    }
    if (n_tokens == 0 || f == 0) return Status::ok();

    const KernelTable& kt = active_kernels();
    const int up_kind = weight_kind(up.type);
    const int gate_kind = weight_kind(gate.type);
    const ActLayout up_layout = act_layout(up_kind, k);
    const ActLayout gate_layout = act_layout(gate_kind, k);
    const int64_t n_pairs = n_used * n_tokens;
    const bool bf16 = bf16path::wanted(up_kind, n_pairs, n_expert) && bf16path::wanted(gate_kind, n_pairs, n_expert);
    const bool shared_acts = bf16 || same_layout(up_layout, gate_layout);
    ScratchPlan plan;
    const size_t up_acts_off = plan.add(bf16 ? bf16path::scratch_bytes(k, f, n_expert, n_pairs)
                                             : up_layout.stride * static_cast<size_t>(n_tokens));
    const size_t gate_acts_off =
        shared_acts ? up_acts_off : plan.add(gate_layout.stride * static_cast<size_t>(n_tokens));
    const size_t offsets_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_expert + 1));
    const size_t cursor_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_expert));
    const size_t act_idx_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_pairs));
    const size_t out_idx_off = plan.add(sizeof(int32_t) * static_cast<size_t>(n_pairs));
    const size_t jobs_off = plan.add(sizeof(Job) * static_cast<size_t>(max_expert_jobs(f, n_expert, n_pairs)));
    uint8_t* base = plan.commit(scratch);

    ExpertGroups g{reinterpret_cast<int32_t*>(base + offsets_off), reinterpret_cast<int32_t*>(base + act_idx_off),
                   reinterpret_cast<int32_t*>(base + out_idx_off)};
    group_by_expert(ids, n_expert, true, g, reinterpret_cast<int32_t*>(base + cursor_off));
    auto x_row = [&](int64_t t) { return reinterpret_cast<const float*>(x.row(t)); };
    uint8_t* up_acts = base + up_acts_off;
    uint8_t* gate_acts = base + gate_acts_off;
    auto* out = dst.as<float>();
    const Tensor* up_bias = dst.src[4];
    const Tensor* gate_bias = dst.src[5];
    if (bf16) {
        bf16path::Problem p{};
        p.w[0] = {static_cast<const uint8_t*>(up.data), up.nb[1], up.nb[2], up_kind};
        p.w[1] = {static_cast<const uint8_t*>(gate.data), gate.nb[1], gate.nb[2], gate_kind};
        p.n_w = 2;
        p.k = k;
        p.n_rows = f;
        p.n_expert = n_expert;
        p.offsets = g.offsets;
        p.act_idx = g.act_idx;
        p.act_row = x_row;
        p.store = [&](const bf16path::Tile& t) {
            const float* bu = up_bias ? reinterpret_cast<const float*>(up_bias->row(t.expert)) + t.r0 : nullptr;
            const float* bg = gate_bias ? reinterpret_cast<const float*>(gate_bias->row(t.expert)) + t.r0 : nullptr;
            // Each pair's column of the tiles gathered into rows first, then the activation over the
            // row in one vectorised pass.
            float uv[bf16path::kMaxTileRows], gv[bf16path::kMaxTileRows];
            for (int64_t c = 0; c < t.nc; ++c) {
                for (int64_t r = 0; r < t.nr; ++r) {
                    uv[r] = t.acc[0][r * t.stride + c] + (bu ? bu[r] : 0.0f);
                    gv[r] = t.acc[1][r * t.stride + c] + (bg ? bg[r] : 0.0f);
                }
                glu.row(out + static_cast<int64_t>(g.out_idx[t.first + c]) * f + t.r0, gv, uv, t.nr);
            }
        };
        bf16path::run(p, up_acts);
        return Status::ok();
    }
    prepare_acts(kt, up_layout, k, n_tokens, up_acts, x_row);
    if (!shared_acts) prepare_acts(kt, gate_layout, k, n_tokens, gate_acts, x_row);

    const int64_t rb = rows_per_job(f, total_col_blocks(g, n_expert));
    auto* jobs = reinterpret_cast<Job*>(base + jobs_off);
    const int64_t n_jobs = plan_expert_jobs(g, n_expert, f, rb, jobs);
    const auto* up_data = static_cast<const uint8_t*>(up.data);
    const auto* gate_data = static_cast<const uint8_t*>(gate.data);
    auto up_w = [&](int64_t j) { return up_data + jobs[j].expert * up.nb[2] + jobs[j].r0 * up.nb[1]; };
    auto gate_w = [&](int64_t j) { return gate_data + jobs[j].expert * gate.nb[2] + jobs[j].r0 * gate.nb[1]; };
    JobSet js;
    js.n_jobs = n_jobs;
    js.jobs = jobs;
    js.run = [&](int64_t j, int64_t next) {
        const Job& job = jobs[j];
        const int64_t first = g.offsets[job.expert] + job.c0;
        const int64_t nr = std::min<int64_t>(rb, f - job.r0);
        // Both tiles stay in this task's stack: [token][row], at most 64 x 64 floats each.
        float tile_u[kMaxRowsPerJob * kMaxColsPerJob];
        float tile_g[kMaxRowsPerJob * kMaxColsPerJob];
        GemmArgs a{};
        a.w_stride = up.nb[1];
        a.n_rows = nr;
        a.k = k;
        a.act_idx = g.act_idx + first;
        a.n_cols = job.nc;
        a.out_stride = nr;

        a.w = up_w(j);
        a.next_w = gate_w(j);
        a.act = up_acts;
        a.act_stride = up_layout.stride;
        a.out = tile_u;
        kt.gemm[up_kind](a);

        a.w = gate_w(j);
        a.next_w = next >= 0 ? up_w(next) : nullptr;
        a.w_stride = gate.nb[1];
        a.act = gate_acts;
        a.act_stride = gate_layout.stride;
        a.out = tile_g;
        kt.gemm[gate_kind](a);

        const float* bu = up_bias ? reinterpret_cast<const float*>(up_bias->row(job.expert)) + job.r0 : nullptr;
        const float* bg = gate_bias ? reinterpret_cast<const float*>(gate_bias->row(job.expert)) + job.r0 : nullptr;
        for (int64_t c = 0; c < job.nc; ++c) {
            float* tu = tile_u + c * nr;
            float* tg = tile_g + c * nr;
            for (int64_t r = 0; r < nr; ++r) {
                tu[r] += bu ? bu[r] : 0.0f;
                tg[r] += bg ? bg[r] : 0.0f;
            }
            glu.row(out + static_cast<int64_t>(g.out_idx[first + c]) * f + job.r0, tg, tu, nr);
        }
    };
    exec(js);
    return Status::ok();
}

// Jobs taken from a shared counter this many at a time: a thread's consecutive jobs prefetch each
// other's weights as for_each_job's ranges do.
constexpr int64_t kFusedChunk = 4;

// Runs MOE_UP_GATE's jobs, then MUL_MAT_ID's, in one parallel pass (moe_ffn). Threads take jobs in that
// order from one counter, so every job a down job waits for (its expert's up/gate jobs) was taken
// before it by a running thread: the waits always end. The first down job of an expert prepares the
// expert's activation rows once its up/gate jobs are done; its other down jobs wait for that.
void run_fused(const JobSet& ug, const JobSet& dn, int64_t n_expert) {
    std::vector<std::atomic<int32_t>> pending(static_cast<size_t>(n_expert));
    std::vector<std::atomic<int32_t>> state(static_cast<size_t>(n_expert));  // 0, 1 preparing, 2 ready
    for (auto& p : pending) p.store(0, std::memory_order_relaxed);
    for (auto& st : state) st.store(0, std::memory_order_relaxed);
    for (int64_t j = 0; j < ug.n_jobs; ++j) pending[static_cast<size_t>(ug.jobs[j].expert)].fetch_add(1, std::memory_order_relaxed);
    auto ready = [&](int64_t e) {
        std::atomic<int32_t>& st = state[static_cast<size_t>(e)];
        if (st.load(std::memory_order_acquire) == 2) return;
        while (pending[static_cast<size_t>(e)].load(std::memory_order_acquire) > 0) spin_pause();
        int32_t idle = 0;
        if (st.compare_exchange_strong(idle, 1, std::memory_order_acq_rel)) {
            dn.prepare_expert(e);
            st.store(2, std::memory_order_release);
            return;
        }
        while (st.load(std::memory_order_acquire) != 2) spin_pause();
    };
    const int64_t n1 = ug.n_jobs;
    const int64_t n_all = n1 + dn.n_jobs;
    std::atomic<int64_t> next_job{0};
    const int workers = std::max(1, tbb::this_task_arena::max_concurrency());
    tbb::parallel_for(0, workers, 1, [&](int) {
        for (;;) {
            const int64_t j0 = next_job.fetch_add(kFusedChunk, std::memory_order_relaxed);
            if (j0 >= n_all) return;
            const int64_t j1 = std::min(j0 + kFusedChunk, n_all);
            for (int64_t j = j0; j < j1; ++j) {
                if (j < n1) {
                    ug.run(j, j + 1 < std::min(j1, n1) ? j + 1 : -1);
                    pending[static_cast<size_t>(ug.jobs[j].expert)].fetch_sub(1, std::memory_order_release);
                } else {
                    const int64_t d = j - n1;
                    ready(dn.jobs[d].expert);
                    dn.run(d, j + 1 < j1 ? d + 1 : -1);
                }
            }
        }
    });
}

}  // namespace

Status mul_mat_id(Tensor& dst, Scratch& scratch) { return mul_mat_id_with(dst, scratch, run_jobs, false); }

Status moe_up_gate(Tensor& dst, Scratch& scratch) { return moe_up_gate_with(dst, scratch, run_jobs); }

bool moe_ffn_fusable(const Tensor& up_gate, const Tensor& down) {
    return up_gate.op == Op::MOE_UP_GATE && down.op == Op::MUL_MAT_ID && down.src[1] == &up_gate &&
           down.src[2] != nullptr && down.src[2] == up_gate.src[3] && up_gate.view_src == nullptr;
}

Status moe_ffn(Tensor& up_gate, Tensor& down, Scratch& scratch, Scratch& down_scratch) {
    if (!moe_ffn_fusable(up_gate, down)) return invalid_argument("moe_ffn: the nodes are not an up/gate product and its down product");
    // The down product runs behind the up/gate jobs only on its integer path, whose activations can be
    // prepared per expert (mul_mat_id_with makes the same choice); else the two run one after the other.
    const Tensor* ids = down.src[2];
    const Tensor* w_down = down.src[0];
    const int down_kind = w_down != nullptr ? weight_kind(w_down->type) : -1;
    if (down_kind < 0 || bf16path::wanted(down_kind, ids->n_elements(), w_down->ne[2])) {
        MOE_RETURN_IF_ERROR(moe_up_gate(up_gate, scratch));
        return mul_mat_id(down, down_scratch);
    }
    Status down_status = Status::ok();
    bool down_ran = false;
    const Status up_status = moe_up_gate_with(up_gate, scratch, [&](const JobSet& ug) {
        down_ran = true;
        down_status = mul_mat_id_with(down, down_scratch, [&](const JobSet& dn) { run_fused(ug, dn, w_down->ne[2]); }, true);
    });
    MOE_RETURN_IF_ERROR(up_status);
    // The up/gate product handed no jobs over (its BF16 path, or nothing to compute): it is done, the down
    // product runs now.
    if (!down_ran) return mul_mat_id(down, down_scratch);
    return down_status;
}

}  // namespace moe::cpu
