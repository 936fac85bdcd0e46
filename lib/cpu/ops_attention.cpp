// ATTENTION, flash-style: causal, GQA, optional sliding window and sinks, K/V from the (F16 or F32)
// KV cache.
//
// A task takes one KV head g, a tile of consecutive query tokens and all H/Hkv query heads that share g,
// so each K/V row is converted from F16 once and used by every query row of the tile. It walks the key
// range the tile can see in blocks, keeping an online softmax (running max m, sum l, accumulator acc)
// per query row in F32; blocks no row of the tile can see are never touched, so a sliding window
// costs O(window) at any depth. When there are too few tasks to fill the cores (decode: T = 1), each
// task's key range is also split (split-K); the splits leave (m, l, acc) partials that a second pass
// merges, together with the sink logit, into the output.
//
// This file plans and drives the tasks; the inner kernels (F16 -> F32 rows, the softmax update of a
// token's G query rows by a run of keys) come from a per-ISA table (ops_attention_kernels.h: the
// scalar one below, AVX2 and AVX-512 in their own files), chosen at each call.
//
// Memory: one Scratch block holds a working slot per arena thread (indexed by the TBB thread index;
// a task never waits inside, so two tasks never share a thread's slot at once) and the partials.
#include "cpu/ops_attention.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "cpu/cpu_features.h"
#include "cpu/ops_attention_kernels.h"
#include "cpu/ops_common.h"

namespace moe::cpu {
namespace attn {
namespace {

void f16_rows_scalar(const uint8_t* src, size_t stride, int64_t n_rows, int64_t d, float* dst) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const auto* h = reinterpret_cast<const uint16_t*>(src + static_cast<size_t>(r) * stride);
        float* f = dst + r * d;
        for (int64_t i = 0; i < d; ++i) f[i] = ops::half_to_float(h[i]);  // vectorised by the compiler
    }
}

void rows_update_scalar(const float* q, int64_t nr, const float* const* krow, const float* const* vrow, int64_t n,
                        int64_t d, float* s, float* m, float* l, float* acc) {
    for (int64_t r = 0; r < nr; ++r) {
        const float* qr = q + r * d;
        float* ar = acc + r * d;
        float mb = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
            s[j] = ops::dot_f32(qr, krow[j], d);
            mb = std::max(mb, s[j]);
        }
        const float m_new = std::max(m[r], mb);
        const float corr = ops::exp_approx(m[r] - m_new);  // 0 when m[r] is -inf
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            s[j] = ops::exp_approx(s[j] - m_new);
            sum += s[j];
        }
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
        if (corr != 1.0f) {
            for (int64_t e = 0; e < d; ++e) ar[e] *= corr;
        }
        for (int64_t j = 0; j < n; ++j) {
            const float p = s[j];
            const float* vr = vrow[j];
            for (int64_t e = 0; e < d; ++e) ar[e] += p * vr[e];
        }
    }
}

}  // namespace

const KernelTable kScalarKernels = {"scalar", f16_rows_scalar, rows_update_scalar};

}  // namespace attn

namespace {

constexpr int64_t kDefaultKeyBlock = 64;
constexpr int64_t kRowsPerTask = 64;    // query rows (heads x tokens) per task by default
constexpr int64_t kMinSplitKeys = 256;  // a split-K chunk smaller than this costs more than it saves
constexpr int64_t kTasksPerThread = 4;  // split-K aims at this many tasks per arena thread
constexpr int64_t kMaxSplit = 64;       // the merge keeps one (m, l) per split on the stack
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Shape {
    int64_t d, n_head, n_head_kv, group, n_tok, n_kv;
    int32_t window;
    float scale;
    int64_t tile, n_tiles, rows, block, n_split;
};

struct Operands {
    const Tensor* q;
    const Tensor* k;
    const Tensor* v;
    const int32_t* pos;
    const float* sinks;  // nullptr: none
    Tensor* dst;
};

// Keys [lo, hi) visible to a query at position p.
inline void key_range(const Shape& s, int32_t p, int64_t& lo, int64_t& hi) {
    hi = std::min<int64_t>(p, s.n_kv - 1) + 1;
    lo = s.window > 0 ? std::max<int64_t>(0, static_cast<int64_t>(p) - s.window + 1) : 0;
    if (hi < lo) hi = lo;
}

// The union of the key ranges of the tokens of one tile.
inline void tile_key_range(const Shape& s, const int32_t* pos, int64_t tile, int64_t& lo, int64_t& hi) {
    const int64_t t0 = tile * s.tile, t1 = std::min(s.n_tok, t0 + s.tile);
    lo = s.n_kv;
    hi = 0;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t a, b;
        key_range(s, pos[t], a, b);
        if (a < b) {
            lo = std::min(lo, a);
            hi = std::max(hi, b);
        }
    }
    if (hi < lo) hi = lo;
}

inline size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// One thread's working memory, carved from its Scratch slot.
struct Slot {
    float* q;            // [rows, d] query rows, pre-scaled
    float* acc;          // [rows, d]
    float* m;            // [rows]
    float* l;            // [rows]
    float* s;            // [group, block] scores of one token's rows
    float* kf;           // [block, d] K rows converted to F32
    float* vf;           // [block, d]
    const float** krow;  // [block] K row j0 + i (converted or in place)
    const float** vrow;
    int64_t* lo;  // [tile] per token, clipped to the split's range
    int64_t* hi;

    static size_t bytes(const Shape& s) {
        const auto rd = static_cast<size_t>(s.rows * s.d), bd = static_cast<size_t>(s.block * s.d);
        const auto r = static_cast<size_t>(s.rows), b = static_cast<size_t>(s.block), t = static_cast<size_t>(s.tile);
        const auto gb = static_cast<size_t>(s.group * s.block);
        return 2 * align64(rd * 4) + 2 * align64(r * 4) + align64(gb * 4) + 2 * align64(bd * 4) +
               2 * align64(b * sizeof(float*)) + 2 * align64(t * 8);
    }
    static Slot carve(const Shape& s, uint8_t* p) {
        const auto rd = static_cast<size_t>(s.rows * s.d), bd = static_cast<size_t>(s.block * s.d);
        const auto r = static_cast<size_t>(s.rows), b = static_cast<size_t>(s.block), t = static_cast<size_t>(s.tile);
        Slot sl{};
        auto take = [&p](size_t n) {
            uint8_t* at = p;
            p += align64(n);
            return at;
        };
        sl.q = reinterpret_cast<float*>(take(rd * 4));
        sl.acc = reinterpret_cast<float*>(take(rd * 4));
        sl.m = reinterpret_cast<float*>(take(r * 4));
        sl.l = reinterpret_cast<float*>(take(r * 4));
        sl.s = reinterpret_cast<float*>(take(static_cast<size_t>(s.group) * b * 4));
        sl.kf = reinterpret_cast<float*>(take(bd * 4));
        sl.vf = reinterpret_cast<float*>(take(bd * 4));
        sl.krow = reinterpret_cast<const float**>(take(b * sizeof(float*)));
        sl.vrow = reinterpret_cast<const float**>(take(b * sizeof(float*)));
        sl.lo = reinterpret_cast<int64_t*>(take(t * 8));
        sl.hi = reinterpret_cast<int64_t*>(take(t * 8));
        return sl;
    }
};

// Rows [a, b) of K or V for head g as F32 row pointers (index j - j0): F32 rows are used in place,
// F16 rows are converted into `buf`.
void load_rows(const attn::KernelTable& kern, const Tensor& kv, int64_t g, int64_t j0, int64_t a, int64_t b, int64_t d,
               float* buf, const float** rows) {
    if (kv.type == Type::F16) {
        float* f = buf + (a - j0) * d;
        kern.f16_rows(kv.row(g, a), kv.nb[2], b - a, d, f);
        for (int64_t j = a; j < b; ++j) rows[j - j0] = buf + (j - j0) * d;
    } else {
        for (int64_t j = a; j < b; ++j) rows[j - j0] = reinterpret_cast<const float*>(kv.row(g, j));
    }
}

// Merges n parts (m_i, l_i, acc_i) and the optional sink logit into out = sum_i w_i acc_i / L.
// The sink is one more logit in the denominator only. A row that sees no key and has no sink is 0.
// A NaN score (the kernels' exp keeps it, so it reaches l_i) or a NaN sink makes the row NaN: the
// maximum below would drop it, and a corrupt weight must not come out as plausible numbers.
void finish_row(int64_t n, const float* m, const float* l, const float* const* acc, int64_t d, const float* sink,
                float* out) {
    float mx = sink != nullptr ? *sink : kNegInf;
    bool nan = std::isnan(mx);
    for (int64_t i = 0; i < n; ++i) {
        mx = std::max(mx, m[i]);
        nan = nan || std::isnan(m[i]) || std::isnan(l[i]);
    }
    if (nan) {
        std::fill(out, out + d, std::numeric_limits<float>::quiet_NaN());
        return;
    }
    if (mx == kNegInf) {
        std::fill(out, out + d, 0.0f);
        return;
    }
    float total = sink != nullptr ? ops::exp_approx(*sink - mx) : 0.0f;
    std::fill(out, out + d, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
        if (m[i] == kNegInf) continue;
        const float w = ops::exp_approx(m[i] - mx);
        total += w * l[i];
        const float* a = acc[i];
        for (int64_t e = 0; e < d; ++e) out[e] += w * a[e];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int64_t e = 0; e < d; ++e) out[e] *= inv;
}

// One task: KV head g, query tile `tile`, keys [k_begin, k_end). Results go straight to dst, or, with
// split-K, to the task's partials: part_ml [row][2] = (m, l) and part_acc [row][d].
void run_task(const attn::KernelTable& kern, const Shape& s, const Operands& op, int64_t tile, int64_t g,
              int64_t k_begin, int64_t k_end, const Slot& w, float* part_ml, float* part_acc) {
    const int64_t d = s.d, G = s.group;
    const int64_t t0 = tile * s.tile, nt = std::min(s.tile, s.n_tok - t0), rows = nt * G;
    for (int64_t tt = 0; tt < nt; ++tt) {
        key_range(s, op.pos[t0 + tt], w.lo[tt], w.hi[tt]);
        w.lo[tt] = std::max(w.lo[tt], k_begin);
        w.hi[tt] = std::max(w.lo[tt], std::min(w.hi[tt], k_end));
    }
    for (int64_t tt = 0; tt < nt; ++tt) {
        for (int64_t gh = 0; gh < G; ++gh) {
            const int64_t r = tt * G + gh;
            const auto* qr = reinterpret_cast<const float*>(op.q->row(g * G + gh, t0 + tt));
            float* qd = w.q + r * d;
            for (int64_t e = 0; e < d; ++e) qd[e] = qr[e] * s.scale;
            w.m[r] = kNegInf;
            w.l[r] = 0.0f;
            std::fill(w.acc + r * d, w.acc + (r + 1) * d, 0.0f);
        }
    }
    for (int64_t j0 = k_begin; j0 < k_end; j0 += s.block) {
        const int64_t j1 = std::min(j0 + s.block, k_end);
        int64_t ua = j1, ub = j0;  // keys of this block some row of the tile can see
        for (int64_t tt = 0; tt < nt; ++tt) {
            const int64_t a = std::max(w.lo[tt], j0), b = std::min(w.hi[tt], j1);
            if (a < b) {
                ua = std::min(ua, a);
                ub = std::max(ub, b);
            }
        }
        if (ua >= ub) continue;
        load_rows(kern, *op.k, g, j0, ua, ub, d, w.kf, w.krow);
        load_rows(kern, *op.v, g, j0, ua, ub, d, w.vf, w.vrow);
        for (int64_t tt = 0; tt < nt; ++tt) {
            const int64_t a = std::max(w.lo[tt], j0), b = std::min(w.hi[tt], j1);
            if (a >= b) continue;
            const int64_t r = tt * G;  // the G heads of token tt see the same keys
            kern.rows_update(w.q + r * d, G, w.krow + (a - j0), w.vrow + (a - j0), b - a, d, w.s, w.m + r, w.l + r,
                             w.acc + r * d);
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float* acc = w.acc + r * d;
        if (part_ml == nullptr) {
            const int64_t h = g * G + r % G, t = t0 + r / G;
            const float* sink = op.sinks != nullptr ? op.sinks + h : nullptr;
            finish_row(1, &w.m[r], &w.l[r], &acc, d, sink, reinterpret_cast<float*>(op.dst->row(h, t)));
        } else {
            part_ml[2 * r] = w.m[r];
            part_ml[2 * r + 1] = w.l[r];
            std::memcpy(part_acc + r * d, acc, static_cast<size_t>(d) * sizeof(float));
        }
    }
}

Status check_inputs(const Tensor& dst, Operands& op, Shape& s) {
    MOE_RETURN_IF_ERROR(moe::op_checks::check_attention(dst));  // shared with the other backend
    const Tensor& q = *dst.src[0];
    const Tensor& k = *dst.src[1];
    const Tensor& v = *dst.src[2];
    const Tensor& pos = *dst.src[3];
    const Tensor* sinks = dst.src[4];
    const int32_t n_kv = dst.params.i[1];
    op = Operands{&q, &k, &v, pos.as<int32_t>(), sinks != nullptr ? sinks->as<float>() : nullptr, nullptr};
    s = Shape{};
    s.d = q.ne[0];
    s.n_head = q.ne[1];
    s.n_head_kv = k.ne[1];
    s.group = s.n_head / s.n_head_kv;
    s.n_tok = q.ne[2];
    s.n_kv = n_kv;
    s.window = dst.params.i[0];
    s.scale = dst.params.f[0];
    return Status::ok();
}

// The widest kernel family this CPU runs (and the test cap allows).
const attn::KernelTable& pick_kernels() {
    const CpuFeatures& f = cpu_features();
    if (f.avx512) return attn::kAvx512Kernels;
    if (f.avx2) return attn::kAvx2Kernels;
    return attn::kScalarKernels;
}

}  // namespace

Status attention_tuned(Tensor& dst, Scratch& scratch, const AttentionTuning& tuning) {
    if (dst.op != Op::ATTENTION) return invalid_argument(std::string("attention: dst.op is ") + op_name(dst.op));
    Operands op{};
    Shape s{};
    MOE_RETURN_IF_ERROR(check_inputs(dst, op, s));
    op.dst = &dst;
    if (s.d == 0 || s.n_head == 0 || s.n_tok == 0) return Status::ok();  // an empty output
    if (tuning.key_block < 0 || tuning.query_tile < 0 || tuning.n_split < 0 || tuning.n_split > kMaxSplit) {
        return invalid_argument("ATTENTION: tuning values must be >= 0 (0 = default), n_split <= " +
                                std::to_string(kMaxSplit));
    }
    s.block = tuning.key_block > 0 ? tuning.key_block : kDefaultKeyBlock;
    s.tile = tuning.query_tile > 0 ? tuning.query_tile : std::max<int64_t>(1, kRowsPerTask / s.group);
    s.tile = std::min(s.tile, s.n_tok);
    s.n_tiles = (s.n_tok + s.tile - 1) / s.tile;
    s.rows = s.tile * s.group;
    const int64_t n_tasks = s.n_tiles * s.n_head_kv;
    const int n_threads = tbb::this_task_arena::max_concurrency();
    const attn::KernelTable& kern = pick_kernels();

    s.n_split = 1;
    if (tuning.n_split > 0) {
        s.n_split = tuning.n_split;
    } else if (n_tasks < kTasksPerThread * n_threads) {
        int64_t longest = 0;
        for (int64_t t = 0; t < s.n_tiles; ++t) {
            int64_t lo, hi;
            tile_key_range(s, op.pos, t, lo, hi);
            longest = std::max(longest, hi - lo);
        }
        const int64_t want = (kTasksPerThread * n_threads + n_tasks - 1) / n_tasks;
        s.n_split = std::clamp<int64_t>(std::min(want, longest / kMinSplitKeys), 1, kMaxSplit);
    }

    // One Scratch block: a slot per arena thread, then the split-K partials.
    const size_t slot_bytes = align64(Slot::bytes(s));
    const size_t slots_bytes = slot_bytes * static_cast<size_t>(n_threads);
    const size_t n_part_rows = s.n_split > 1 ? static_cast<size_t>(n_tasks * s.n_split * s.rows) : 0;
    const size_t ml_bytes = align64(n_part_rows * 2 * sizeof(float));
    const size_t acc_bytes = n_part_rows * static_cast<size_t>(s.d) * sizeof(float);
    auto* base = static_cast<uint8_t*>(scratch.get(slots_bytes + ml_bytes + acc_bytes));
    auto* part_ml = reinterpret_cast<float*>(base + slots_bytes);
    auto* part_acc = reinterpret_cast<float*>(base + slots_bytes + ml_bytes);

    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n_tasks * s.n_split, 1), [&](const tbb::blocked_range<int64_t>& r) {
            const int slot_index = tbb::this_task_arena::current_thread_index();
            MOE_ASSERT(slot_index >= 0 && slot_index < n_threads);
            const Slot w = Slot::carve(s, base + slot_bytes * static_cast<size_t>(slot_index));
            for (int64_t idx = r.begin(); idx < r.end(); ++idx) {
                const int64_t split = idx % s.n_split, task = idx / s.n_split;
                const int64_t g = task % s.n_head_kv;
                const int64_t tile = s.n_tiles - 1 - task / s.n_head_kv;  // longest (latest) tiles first
                int64_t lo, hi;
                tile_key_range(s, op.pos, tile, lo, hi);
                int64_t k_begin = lo, k_end = hi;
                if (s.n_split > 1) {
                    int64_t chunk = (hi - lo + s.n_split - 1) / s.n_split;
                    chunk = (chunk + s.block - 1) / s.block * s.block;
                    k_begin = std::min(hi, lo + split * chunk);
                    k_end = std::min(hi, k_begin + chunk);
                }
                const size_t prow = static_cast<size_t>(idx * s.rows);
                run_task(kern, s, op, tile, g, k_begin, k_end, w, s.n_split > 1 ? part_ml + 2 * prow : nullptr,
                         s.n_split > 1 ? part_acc + prow * static_cast<size_t>(s.d) : nullptr);
            }
        });
    if (s.n_split == 1) return Status::ok();

    // Merge the splits of every (task, row).
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_tasks * s.rows, ops::row_grain(s.d * s.n_split, 4096)),
                      [&](const tbb::blocked_range<int64_t>& r) {
                          float m[kMaxSplit], l[kMaxSplit];
                          const float* acc[kMaxSplit];
                          for (int64_t i = r.begin(); i < r.end(); ++i) {
                              const int64_t task = i / s.rows, row = i % s.rows;
                              const int64_t g = task % s.n_head_kv, tile = s.n_tiles - 1 - task / s.n_head_kv;
                              const int64_t t = tile * s.tile + row / s.group, h = g * s.group + row % s.group;
                              if (t >= s.n_tok) continue;  // rows past the end of a short last tile
                              for (int64_t sp = 0; sp < s.n_split; ++sp) {
                                  const size_t prow = static_cast<size_t>((task * s.n_split + sp) * s.rows + row);
                                  m[sp] = part_ml[2 * prow];
                                  l[sp] = part_ml[2 * prow + 1];
                                  acc[sp] = part_acc + prow * static_cast<size_t>(s.d);
                              }
                              const float* sink = op.sinks != nullptr ? op.sinks + h : nullptr;
                              finish_row(s.n_split, m, l, acc, s.d, sink, reinterpret_cast<float*>(dst.row(h, t)));
                          }
                      });
    return Status::ok();
}

Status attention(Tensor& dst, Scratch& scratch) { return attention_tuned(dst, scratch, {}); }

}  // namespace moe::cpu
