#include "cuda/fusion_plan.h"

#include <algorithm>
#include <array>

#include "core/op_checks.h"

namespace moe::cuda {
namespace {

constexpr int64_t kMaxGroupRows = 8;  // activation rows of a GEMV (matmul.cuh kGemvMaxCols)
constexpr int kMaxUnits = 3;          // MUL_MATs in a kGemvGroup or a kDenseGroup (matmul.cuh kMaxDenseGroup)
constexpr int kMaxRouterK = 32;       // experts chosen per token: one lane each
constexpr int kMaxRouterTokens = 32;  // tokens of a kRouter launch: one warp each, one block
constexpr int64_t kWarpRowMax = 1024; // RMS_NORM rows up to this length run one warp each (ops_norm.cu)

bool is_f32_rows(const Tensor* t) { return t != nullptr && t->type == Type::F32 && t->data != nullptr && t->nb[0] == 4; }

// Row r of t starts at data + r * 4 * ne[0] (F32 rows, densely packed).
bool dense_rows(const Tensor& t) {
    if (t.type != Type::F32 || t.nb[0] != 4) return false;
    size_t expect = 4 * static_cast<size_t>(t.ne[0]);
    for (int d = 1; d < 4; ++d) {
        if (t.ne[d] > 1 && t.nb[d] != expect) return false;
        expect *= static_cast<size_t>(t.ne[d]);
    }
    return true;
}

// Same data, type, shape and strides: the very same tensor as far as a kernel can tell.
bool identical(const Tensor* a, const Tensor* b) {
    if (a == nullptr || b == nullptr) return false;
    if (a->data != b->data || a->type != b->type) return false;
    for (int d = 0; d < 4; ++d) {
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d]) return false;
    }
    return true;
}

// The same rows of floats at the same addresses (shapes may group them differently).
bool same_rows(const Tensor& a, const Tensor& b) {
    return a.data == b.data && a.ne[0] == b.ne[0] && a.n_rows() == b.n_rows() && dense_rows(a) && dense_rows(b);
}

// For launches of several blocks: `out` is disjoint from `other` or is exactly its rows.
bool disjoint_or_same(const Tensor& out, const Tensor& other) {
    return !byte_range(out).overlaps(byte_range(other)) || identical(&out, &other);
}

bool all_disjoint(std::span<const Tensor* const> writes, std::span<const Tensor* const> others) {
    for (size_t i = 0; i < writes.size(); ++i) {
        for (size_t j = 0; j < writes.size(); ++j) {
            if (i != j && byte_range(*writes[i]).overlaps(byte_range(*writes[j]))) return false;
        }
        for (const Tensor* o : others) {
            if (o != nullptr && byte_range(*writes[i]).overlaps(byte_range(*o))) return false;
        }
    }
    return true;
}

// ---- kRouter: TOPK, GATHER(logits, ids), SOFTMAX ----

bool match_router(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    if (i + 2 >= n.size()) return false;
    Tensor* t = n[i];
    Tensor* g = n[i + 1];
    Tensor* s = n[i + 2];
    if (t->op != Op::TOPK || g->op != Op::GATHER || s->op != Op::SOFTMAX) return false;
    const Tensor* x = t->src[0];
    if (!is_f32_rows(x) || x->ne[2] != 1 || x->ne[3] != 1) return false;
    const int32_t k = t->params.i[0];
    const int64_t cols = x->ne[1];
    if (k < 1 || k > kMaxRouterK || k > x->ne[0] || cols < 1 || cols > kMaxRouterTokens) return false;
    if (t->type != Type::I32 || t->data == nullptr || t->nb[0] != 4 || t->ne[0] != k || t->ne[1] != cols ||
        t->ne[2] != 1 || t->ne[3] != 1) {
        return false;
    }
    if (!identical(g->src[0], x) || !identical(g->src[1], t)) return false;
    if (!is_f32_rows(g) || !op_checks::same_shape(*g, *t)) return false;
    if (!identical(s->src[0], g) || !is_f32_rows(s) || !op_checks::same_shape(*s, *g)) return false;
    item.kind = FusedKind::kRouter;
    item.part = {t, g, s};
    item.n_part = 3;
    return true;
}

// ---- kSigmoidRouter: SIGMOID [ADD bias] [GROUP_MASK] TOPK GATHER NORM_SCALE ----

bool match_sigmoid_router(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    if (n[i]->op != Op::SIGMOID) return false;
    size_t end = i + 1;
    if (end < n.size() && n[end]->op == Op::ADD) ++end;
    if (end < n.size() && n[end]->op == Op::GROUP_MASK) ++end;
    end += 3;  // TOPK, GATHER, NORM_SCALE
    if (end > n.size() || end - i > static_cast<size_t>(kMaxParts)) return false;
    const std::span<Tensor* const> parts = n.subspan(i, end - i);
    SigmoidRouterParts roles;
    if (!sigmoid_router_parts(parts, &roles)) return false;
    item.kind = FusedKind::kSigmoidRouter;
    std::copy(parts.begin(), parts.end(), item.part.begin());
    item.n_part = static_cast<int>(parts.size());
    return true;
}

// ---- kRowChain: [WEIGHTED_SUM] [ADD] RMS_NORM ----

bool chain_norm_ok(const Tensor& norm) {
    return norm.op == Op::RMS_NORM && op_checks::check_rms_norm(norm).is_ok() && norm.ne[0] > 0 &&
           norm.ne[0] <= kMaxChainRow && norm.n_rows() > 0;
}

bool chain_add_ok(const Tensor& a) {
    return a.op == Op::ADD && is_f32_rows(&a) && is_f32_rows(a.src[0]) && is_f32_rows(a.src[1]) &&
           op_checks::same_shape(*a.src[0], a) && op_checks::same_shape(*a.src[1], a);
}

bool chain_wsum_ok(const Tensor& w) {
    if (w.op != Op::WEIGHTED_SUM || w.src[2] != nullptr || !is_f32_rows(&w) || !is_f32_rows(w.src[0]) ||
        !is_f32_rows(w.src[1])) {
        return false;  // with ids (a split expert block's part) it keeps its own kernel
    }
    const Tensor& y = *w.src[0];
    const Tensor& p = *w.src[1];
    return y.ne[1] >= 1 && y.ne[3] == 1 && p.ne[2] == 1 && p.ne[3] == 1 && p.ne[0] == y.ne[1] && p.ne[1] == y.ne[2] &&
           w.ne[0] == y.ne[0] && w.ne[1] == y.ne[2] && w.ne[2] == 1 && w.ne[3] == 1;
}

bool match_chain(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    Tensor* wsum = nullptr;
    Tensor* add = nullptr;
    Tensor* norm = nullptr;
    if (n[i]->op == Op::WEIGHTED_SUM && i + 2 < n.size()) {
        wsum = n[i];
        add = n[i + 1];
        norm = n[i + 2];
        if (!chain_wsum_ok(*wsum) || !chain_add_ok(*add)) return false;
        if (!identical(add->src[0], wsum) && !identical(add->src[1], wsum)) return false;
        if (!op_checks::same_shape(*wsum, *add)) return false;
    } else if (n[i]->op == Op::ADD && i + 1 < n.size()) {
        add = n[i];
        norm = n[i + 1];
        if (!chain_add_ok(*add)) return false;
    } else if (n[i]->op == Op::RMS_NORM) {
        norm = n[i];
    } else {
        return false;
    }
    // Rows of up to kWarpRowMax are one warp's in RMS_NORM's own kernel, with another order of sums:
    // chains take longer rows only, so that a fused norm is bitwise the unfused one.
    if (!chain_norm_ok(*norm) || norm->ne[0] <= kWarpRowMax) return false;
    if (add != nullptr && !identical(norm->src[0], add)) return false;
    // Several blocks: every output disjoint from, or exactly, each other tensor the launch touches.
    if (norm->n_rows() > 1) {
        const Tensor* outs[] = {wsum, add, norm};
        const Tensor* all[] = {wsum, add, norm, wsum ? wsum->src[0] : nullptr, wsum ? wsum->src[1] : nullptr,
                               add ? add->src[0] : nullptr, add ? add->src[1] : nullptr, norm->src[0], norm->src[1]};
        for (const Tensor* o : outs) {
            if (o == nullptr) continue;
            for (const Tensor* t : all) {
                if (t == nullptr || t == o) continue;
                // Chain links (the next part's src is the previous part) are the same tensor by construction.
                if (identical(t, o)) continue;
                if (!disjoint_or_same(*o, *t)) return false;
            }
        }
    }
    item.kind = FusedKind::kRowChain;
    int k = 0;
    for (Tensor* p : {wsum, add, norm}) {
        if (p != nullptr) item.part[static_cast<size_t>(k++)] = p;
    }
    item.n_part = k;
    return true;
}

// ---- kGemvGroup: MUL_MAT [ADD bias] x up to 3, one activation ----

// The ADD at n[i] adds a bias row to MUL_MAT m's result: ADD(m, b) or ADD(b, m), b F32 [N].
bool is_bias_add(std::span<Tensor* const> n, size_t i, const Tensor& m) {
    if (i >= n.size()) return false;
    const Tensor& a = *n[i];
    if (a.op != Op::ADD || !dense_rows(a) || a.data == nullptr || !op_checks::same_shape(a, m)) return false;
    const int side = identical(a.src[0], &m) ? 1 : identical(a.src[1], &m) ? 0 : -1;
    if (side < 0) return false;
    const Tensor* b = a.src[side];
    return is_f32_rows(b) && b->ne[0] == m.ne[0] && b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1;
}

bool match_group(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    Tensor* m0 = n[i];
    if (m0->op != Op::MUL_MAT || !mul_mat_takes_gemv(*m0)) return false;
    const Tensor& x = *m0->src[1];
    if (!dense_rows(x) || x.n_rows() > kMaxGroupRows) return false;
    Tensor* mm[kMaxUnits] = {};
    Tensor* bias[kMaxUnits] = {};
    int units = 0;
    size_t j = i;
    while (units < kMaxUnits && j < n.size()) {
        Tensor* m = n[j];
        if (m->op != Op::MUL_MAT || !mul_mat_takes_gemv(*m)) break;
        if (units > 0 && (!same_rows(*m->src[1], x) || m->src[0]->type != m0->src[0]->type ||
                          m->src[0]->ne[0] != m0->src[0]->ne[0])) {
            break;
        }
        mm[units] = m;
        ++j;
        if (is_bias_add(n, j, *m)) bias[units] = n[j++];
        ++units;
    }
    // Shrink to the longest prefix whose writes are disjoint from each other and from the biases (one
    // launch writes them all while the biases are read). The activation is read before (quantised or
    // copied) or, where the launch reads it directly, the launch checks it. A product whose bytes a
    // later part overwrites is not written at all (group_dead_products).
    for (; units > 0; --units) {
        std::array<Tensor*, kMaxParts> parts{};
        size_t np = 0;
        for (int u = 0; u < units; ++u) {
            parts[np++] = mm[u];
            if (bias[u] != nullptr) parts[np++] = bias[u];
        }
        std::array<bool, kMaxParts> dead{};
        group_dead_products(std::span<Tensor* const>(parts.data(), np), dead);
        const Tensor* writes[2 * kMaxUnits];
        const Tensor* reads[kMaxUnits];
        int nw = 0, nr = 0;
        size_t at = 0;
        for (int u = 0; u < units; ++u) {
            if (!dead[at]) writes[nw++] = mm[u];
            at += bias[u] != nullptr ? 2 : 1;
            if (bias[u] != nullptr) {
                writes[nw++] = bias[u];
                reads[nr++] = identical(bias[u]->src[0], mm[u]) ? bias[u]->src[1] : bias[u]->src[0];
            }
        }
        if (all_disjoint(std::span<const Tensor* const>(writes, static_cast<size_t>(nw)),
                         std::span<const Tensor* const>(reads, static_cast<size_t>(nr)))) {
            break;
        }
    }
    if (units == 0 || (units == 1 && bias[0] == nullptr)) return false;
    item.kind = FusedKind::kGemvGroup;
    int k = 0;
    for (int u = 0; u < units; ++u) {
        item.part[static_cast<size_t>(k++)] = mm[u];
        if (bias[u] != nullptr) item.part[static_cast<size_t>(k++)] = bias[u];
    }
    item.n_part = k;
    return true;
}

// ---- kDenseGroup: MUL_MATs of one activation on the dequantise + cuBLAS path ----

bool match_dense_group(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    Tensor* m0 = n[i];
    if (m0->op != Op::MUL_MAT || !mul_mat_takes_dequant_gemm(*m0)) return false;
    const Tensor& x = *m0->src[1];
    int units = 0;
    for (size_t j = i; j < n.size() && units < kMaxUnits; ++j, ++units) {
        const Tensor& m = *n[j];
        if (m.op != Op::MUL_MAT || !mul_mat_takes_dequant_gemm(m)) break;
        if (units > 0 && (!same_rows(*m.src[1], x) || m.src[0]->type != m0->src[0]->type ||
                          m.src[0]->ne[0] != m0->src[0]->ne[0])) {
            break;
        }
        // The launch converts x once, before any product is written: no product may overwrite it.
        if (byte_range(m).overlaps(byte_range(x))) break;
    }
    if (units < 2) return false;
    item.kind = FusedKind::kDenseGroup;
    for (int u = 0; u < units; ++u) item.part[static_cast<size_t>(u)] = n[i + static_cast<size_t>(u)];
    item.n_part = units;
    return true;
}

// ---- kMoeBias: MUL_MAT_ID, GET_ROWS(bias, ids), ADD ----

bool match_moe_bias(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    if (i + 2 >= n.size()) return false;
    Tensor* m = n[i];
    Tensor* gr = n[i + 1];
    Tensor* a = n[i + 2];
    if (m->op != Op::MUL_MAT_ID || gr->op != Op::GET_ROWS || a->op != Op::ADD) return false;
    if (!mul_mat_id_takes_gemv(*m) || !dense_rows(*m)) return false;
    // The GET_ROWS reads the MUL_MAT_ID's ids, flattened: entry t * n_used + j is pair (t, j).
    const Tensor& ids = *m->src[2];
    const Tensor* gids = gr->src[1];
    const int64_t pairs = m->ne[1] * m->ne[2];
    if (gids == nullptr || gids->type != Type::I32 || gids->data != ids.data || gids->nb[0] != 4 || ids.nb[0] != 4 ||
        ids.nb[1] != 4 * static_cast<size_t>(ids.ne[0]) || ids.ne[0] * ids.ne[1] != pairs || gids->ne[0] != pairs ||
        gids->ne[1] != 1 || gids->ne[2] != 1 || gids->ne[3] != 1) {
        return false;
    }
    // F32 bias rows, one per expert, as long as the product's rows; the picked rows [E, pairs].
    const Tensor* bias = gr->src[0];
    if (!is_f32_rows(bias) || bias->ne[0] != m->ne[0] || bias->ne[1] != m->src[0]->ne[2] || bias->ne[2] != 1 ||
        bias->ne[3] != 1 || bias->nb[1] % 4 != 0) {
        return false;
    }
    if (!dense_rows(*gr) || gr->data == nullptr || gr->ne[0] != m->ne[0] || gr->ne[1] != pairs || gr->ne[2] != 1 ||
        gr->ne[3] != 1) {
        return false;
    }
    // ADD(product, picked rows) in either order, the rows viewed as the product's shape.
    if (!dense_rows(*a) || a->data == nullptr || !op_checks::same_shape(*a, *m)) return false;
    const int side = identical(a->src[0], m) ? 1 : identical(a->src[1], m) ? 0 : -1;
    if (side < 0) return false;
    const Tensor* b = a->src[side];
    if (b == nullptr || b->data != gr->data || !dense_rows(*b) || b->n_elements() != gr->n_elements() ||
        !op_checks::same_shape(*b, *a)) {
        return false;  // the ADD's own check: both operands have its shape
    }
    // One launch writes all three while it reads the ids and the bias (the activation is read before,
    // by the quantisation or copy into scratch).
    const Tensor* writes[] = {m, gr, a};
    const Tensor* reads[] = {&ids, bias};
    if (!all_disjoint(writes, reads)) return false;
    item.kind = FusedKind::kMoeBias;
    item.part = {m, gr, a};
    item.n_part = 3;
    return true;
}

// ---- kRouterGemv: MUL_MAT [ADD bias] TOPK GATHER SOFTMAX ----

bool match_router_gemv(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    Tensor* m = n[i];
    if (m->op != Op::MUL_MAT || !mul_mat_takes_row_kernel(*m)) return false;
    size_t j = i + 1;
    Tensor* bias = nullptr;
    if (is_bias_add(n, j, *m)) bias = n[j++];
    LaunchItem r;
    if (!match_router(n, j, r)) return false;
    const Tensor* logits = bias != nullptr ? bias : m;
    if (r.part[0]->src[0] != logits || logits->ne[1] != 1) return false;  // the node itself (mul_mat_router)
    if (bias != nullptr) {  // as in a kGemvGroup: the bias is read while the product and the sum are written
        const Tensor* writes[] = {m, bias};
        const Tensor* reads[] = {identical(bias->src[0], m) ? bias->src[1] : bias->src[0]};
        if (!all_disjoint(writes, reads)) return false;
    }
    // The selection runs after every block of the product is done (the last block), as the unfused
    // launches would: its own parts' checks (match_router) are all it needs.
    item.kind = FusedKind::kRouterGemv;
    int k = 0;
    item.part[static_cast<size_t>(k++)] = m;
    if (bias != nullptr) item.part[static_cast<size_t>(k++)] = bias;
    for (int p = 0; p < r.n_part; ++p) item.part[static_cast<size_t>(k++)] = r.part[static_cast<size_t>(p)];
    item.n_part = k;
    return true;
}

// ---- kAttnPrep: [RMS_NORM q, k] ROPE q, k [CPY k, v] ----

bool same_rope(const Tensor& a, const Tensor& b) {
    for (int i = 0; i < 3; ++i) {
        if (a.params.i[i] != b.params.i[i]) return false;
    }
    for (int i = 0; i < 6; ++i) {
        if (a.params.f[i] != b.params.f[i]) return false;
    }
    return identical(a.src[1], b.src[1]);
}

bool match_attn_prep(std::span<Tensor* const> n, size_t i, LaunchItem& item) {
    size_t j = i;
    Tensor* norms[2] = {};
    Tensor* ropes[2] = {};
    Tensor* cpys[2] = {};
    int nn = 0, nr = 0, nc = 0;
    while (j < n.size() && nn < 2 && n[j]->op == Op::RMS_NORM) norms[nn++] = n[j++];
    while (j < n.size() && nr < 2 && n[j]->op == Op::ROPE) ropes[nr++] = n[j++];
    while (j < n.size() && nc < 2 && n[j]->op == Op::CPY) cpys[nc++] = n[j++];
    if (nr == 0 || (nn != 0 && nn != nr) || nn + nr + nc < 2) return false;
    const Tensor& x0 = *ropes[0]->src[0];
    const int64_t d = x0.ne[0], t = x0.ne[2];
    if ((d != 64 && d != 128) || t < 1) return false;
    int64_t rows = 0, floats = t * d;  // the cos / sin tables
    for (int k = 0; k < nr; ++k) {
        const Tensor& r = *ropes[k];
        // The fused kernel rotates NeoX halves only.
        if (!op_checks::check_rope(r).is_ok() || r.rope_params().n_dims != d || r.rope_params().interleaved ||
            r.src[0]->ne[0] != d || r.src[0]->ne[2] != t || !same_rope(r, *ropes[0])) {
            return false;
        }
        if (nn > 0) {
            const Tensor& m = *norms[k];
            if (!op_checks::check_rms_norm(m).is_ok() || !identical(r.src[0], &m)) return false;
        }
        rows += r.ne[1] * t;
        floats += r.ne[1] * t * d * (nn > 0 ? 2 : 1);
    }
    for (int k = 0; k < nc; ++k) {
        const Tensor& c = *cpys[k];
        const Tensor* s = c.src[0];
        const size_t es = c.type == Type::F16 ? 2 : c.type == Type::F32 ? 4 : 0;
        if (es == 0 || c.data == nullptr || c.nb[0] != es || !is_f32_rows(s) || !cache_write_fits(c) ||
            s->ne[0] != d || s->ne[2] != t || s->ne[3] != 1) {
            return false;
        }
        bool from_rope = false;
        for (int r = 0; r < nr; ++r) from_rope = from_rope || identical(s, ropes[r]);
        if (!from_rope) {  // rows of its own, read before any write of the launch
            const ByteRange sr = byte_range(*s);
            for (Tensor* o : {norms[0], norms[1], ropes[0], ropes[1], cpys[0]}) {
                if (o != nullptr && o != &c && sr.overlaps(byte_range(*o))) return false;  // another part's result
            }
            rows += s->ne[1] * t;
            floats += s->ne[1] * t * d;
        }
    }
    std::array<Tensor*, kMaxParts> parts{};
    int k = 0;
    for (int m = 0; m < nn; ++m) parts[static_cast<size_t>(k++)] = norms[m];
    for (int m = 0; m < nr; ++m) parts[static_cast<size_t>(k++)] = ropes[m];
    for (int m = 0; m < nc; ++m) parts[static_cast<size_t>(k++)] = cpys[m];
    // A prefill's rows (more than one block's shared memory holds) only as a warp per row.
    const bool one_block = t <= kMaxPrepTokens && rows <= kMaxPrepRows && floats <= kMaxPrepFloats;
    if (!one_block && !attn_prep_rows_apart(std::span<Tensor* const>(parts.data(), static_cast<size_t>(k)))) return false;
    item.kind = FusedKind::kAttnPrep;
    item.part = parts;
    item.n_part = k;
    return true;
}

// ---- Q8 slots ----

bool item_writes(const LaunchItem& it, const ByteRange& r) {
    for (int p = 0; p < it.n_part; ++p) {
        if (byte_range(*it.part[static_cast<size_t>(p)]).overlaps(r)) return true;
    }
    return false;
}

// The tensor whose Q8 rows item `it` can write, and their length, or nullptr: a row chain's norm
// (rows of its own length) or an FP32-kernel attention (a row of n_head * D values per token).
const Tensor* q8_result(const LaunchItem& it, int64_t& row_len) {
    if (it.kind == FusedKind::kRowChain) {
        const Tensor* norm = it.part[static_cast<size_t>(it.n_part - 1)];
        row_len = norm->ne[0];
        return norm;
    }
    if (it.kind == FusedKind::kNone && it.node->op == Op::ATTENTION && attention_writes_q8(*it.node)) {
        row_len = it.node->ne[0] * it.node->ne[1];
        return it.node;
    }
    return nullptr;
}

// Whether GEMV activation `act` reads exactly the Q8 rows of length row_len that `res` would write.
bool reads_q8_rows(const Tensor& act, const Tensor& res, int64_t row_len) {
    return act.data == res.data && act.ne[0] == row_len && act.n_rows() * row_len == res.n_elements() &&
           dense_rows(act) && dense_rows(res);
}

void assign_slots(FusionPlan& plan) {
    std::array<size_t, kMaxQ8Slots> busy_until{};  // item index of a slot's last consumer (+1; 0 = free)
    std::vector<size_t> consumers;
    for (size_t p = 0; p < plan.items.size(); ++p) {
        LaunchItem& prod = plan.items[p];
        int64_t row_len = 0;
        const Tensor* res = q8_result(prod, row_len);
        if (res == nullptr || row_len <= 0) continue;
        const int64_t n_rows = res->n_elements() / row_len;
        if (row_len % 32 != 0 || n_rows > kMaxGroupRows || !dense_rows(*res)) continue;
        const ByteRange r = byte_range(*res);
        consumers.clear();
        for (size_t q = p + 1; q < plan.items.size(); ++q) {
            const LaunchItem& c = plan.items[q];
            if ((c.kind == FusedKind::kNone || c.kind == FusedKind::kGemvGroup) && c.q8_in < 0) {
                const Tensor* act = gemv_q8_activation(*c.node);
                if (act != nullptr && reads_q8_rows(*act, *res, row_len)) consumers.push_back(q);
            }
            if (item_writes(c, r)) break;  // the result changes: later readers quantise themselves
        }
        if (consumers.empty()) continue;
        int slot = -1;
        for (int s = 0; s < kMaxQ8Slots; ++s) {
            if (busy_until[static_cast<size_t>(s)] <= p) {
                slot = s;
                break;
            }
        }
        if (slot < 0) continue;
        busy_until[static_cast<size_t>(slot)] = consumers.back() + 1;
        prod.q8_out = slot;
        for (size_t q : consumers) plan.items[q].q8_in = slot;
        plan.n_slots = std::max(plan.n_slots, slot + 1);
        plan.slot_bytes = std::max(plan.slot_bytes, static_cast<size_t>(n_rows) * q8_row_bytes(row_len));
    }
}

}  // namespace

void group_dead_products(std::span<Tensor* const> parts, std::array<bool, kMaxParts>& dead) {
    dead.fill(false);
    for (size_t p = 0; p + 1 < parts.size() && p < static_cast<size_t>(kMaxParts); ++p) {
        const Tensor* m = parts[p];
        const Tensor* add = parts[p + 1];
        if (m->op != Op::MUL_MAT || add->op != Op::ADD || m->is_output) continue;
        if (!identical(add->src[0], m) && !identical(add->src[1], m)) continue;
        bool read_elsewhere = false, overwritten = false;
        const ByteRange r = byte_range(*m);
        for (size_t q = 0; q < parts.size(); ++q) {
            if (q == p || q == p + 1) {
                if (q == p + 1) overwritten = overwritten || r.overlaps(byte_range(*parts[q]));
                continue;
            }
            // Another part reading the tensor itself, or reading its bytes from memory: a weight or a
            // bias row. (Products read the activation, prepared before the launch or not written over
            // by anything but live results; an add takes its own product from registers.)
            const Tensor& o = *parts[q];
            for (const Tensor* s : o.src) read_elsewhere = read_elsewhere || s == m;
            const Tensor* mem = nullptr;  // the weight of a product, the bias row of an add
            if (o.op == Op::MUL_MAT) mem = o.src[0];
            if (o.op == Op::ADD && q > 0) mem = identical(o.src[0], parts[q - 1]) ? o.src[1] : o.src[0];
            read_elsewhere = read_elsewhere || (mem != nullptr && r.overlaps(byte_range(*mem)));
            if (q > p + 1) overwritten = overwritten || r.overlaps(byte_range(*parts[q]));
        }
        dead[p] = overwritten && !read_elsewhere;
    }
}

bool cache_write_fits(const Tensor& cpy) {
    if (cpy.src[2] == nullptr) return op_checks::same_shape(*cpy.src[0], cpy);
    return op_checks::check_cpy(cpy).is_ok();  // the rows' shapes, as the backends take them
}

bool attn_prep_rows_apart(std::span<Tensor* const> parts) {
    // Runs at every prologue launch (decode steps launch it eagerly): fixed arrays, no allocation.
    std::array<const Tensor*, 2> norms{}, ropes{}, cpys{};
    int nn = 0, nr = 0, nc = 0;
    for (const Tensor* p : parts) {
        if (p->op == Op::RMS_NORM && nn < 2) norms[static_cast<size_t>(nn++)] = p;
        if (p->op == Op::ROPE && nr < 2) ropes[static_cast<size_t>(nr++)] = p;
        if (p->op == Op::CPY && nc < 2) cpys[static_cast<size_t>(nc++)] = p;
    }
    // Every tensor the launch touches with the stream whose warps touch it (-1: read by all, or a weight).
    struct Use {
        const Tensor* t;
        int stream;
        bool out;
    };
    std::array<Use, 18> uses{};  // per rope stream 3 (+ 3 with a norm), per copy 2 (+ 1 with rows)
    size_t n = 0;
    for (int k = 0; k < nr; ++k) {
        const Tensor* r = ropes[static_cast<size_t>(k)];
        uses[n++] = {r, k, true};
        uses[n++] = {r->src[0], k, false};
        uses[n++] = {r->src[1], -1, false};  // positions
        if (k < nn) {
            const Tensor* m = norms[static_cast<size_t>(k)];
            uses[n++] = {m, k, true};
            uses[n++] = {m->src[0], k, false};
            if (m->src[1] != nullptr) uses[n++] = {m->src[1], -1, false};
        }
    }
    for (int m = 0; m < nc; ++m) {
        const Tensor* c = cpys[static_cast<size_t>(m)];
        int stream = nr + m;  // rows of its own, unless it copies a rope's result
        for (int k = 0; k < nr; ++k) {
            if (identical(c->src[0], ropes[static_cast<size_t>(k)])) stream = k;
        }
        uses[n++] = {c, stream, true};
        uses[n++] = {c->src[0], stream, false};
        if (c->src[2] != nullptr) uses[n++] = {c->src[2], -1, false};  // row indices
    }
    for (size_t i = 0; i < n; ++i) {
        if (!uses[i].out) continue;
        const ByteRange r = byte_range(*uses[i].t);
        for (size_t j = 0; j < n; ++j) {
            if (j == i || uses[j].t == nullptr || !r.overlaps(byte_range(*uses[j].t))) continue;
            if (uses[j].stream != uses[i].stream || uses[i].stream < 0 || !identical(uses[i].t, uses[j].t)) return false;
        }
    }
    return true;
}

bool sigmoid_router_parts(std::span<Tensor* const> parts, SigmoidRouterParts* out) {
    if (parts.size() < 4 || parts.size() > 6) return false;
    SigmoidRouterParts r;
    size_t j = 0;
    r.sigmoid = parts[j++];
    if (parts[j]->op == Op::ADD) r.add = parts[j++];
    if (parts[j]->op == Op::GROUP_MASK) r.mask = parts[j++];
    if (parts.size() - j != 3) return false;
    r.topk = parts[j];
    r.gather = parts[j + 1];
    r.norm = parts[j + 2];

    const Tensor* x = r.sigmoid->src[0];
    if (r.sigmoid->op != Op::SIGMOID || !is_f32_rows(x) || !is_f32_rows(r.sigmoid) ||
        !op_checks::same_shape(*x, *r.sigmoid) || x->ne[2] != 1 || x->ne[3] != 1) {
        return false;
    }
    const int64_t E = x->ne[0], T = x->ne[1];
    if (E < 1 || E > kMaxSigmoidRouterExperts || T < 1 || T > kMaxSigmoidRouterTokens) return false;
    Tensor* choice = r.sigmoid;
    if (r.add != nullptr) {
        const Tensor* b = r.add->src[1];
        if (!identical(r.add->src[0], r.sigmoid) || !is_f32_rows(r.add) || !op_checks::same_shape(*r.add, *x) ||
            !is_f32_rows(b) || b->ne[0] != E || b->ne[1] != 1 || b->ne[2] != 1 || b->ne[3] != 1) {
            return false;
        }
        choice = r.add;
    }
    if (r.mask != nullptr) {
        if (!identical(r.mask->src[0], choice) || !op_checks::check_group_mask(*r.mask).is_ok() ||
            !is_f32_rows(r.mask) || r.mask->params.i[0] > kMaxSigmoidRouterGroups) {
            return false;
        }
        choice = r.mask;
    }
    const Tensor* t = r.topk;
    const int32_t k = t->params.i[0];
    if (t->op != Op::TOPK || !identical(t->src[0], choice) || k < 1 || k > kMaxRouterK || k > E ||
        t->type != Type::I32 || t->data == nullptr || t->nb[0] != 4 || t->ne[0] != k || t->ne[1] != T ||
        t->ne[2] != 1 || t->ne[3] != 1) {
        return false;
    }
    const Tensor* g = r.gather;
    if (g->op != Op::GATHER || !identical(g->src[0], r.sigmoid) || !identical(g->src[1], t) || !is_f32_rows(g) ||
        !op_checks::same_shape(*g, *t)) {
        return false;
    }
    if (!op_checks::check_norm_scale(*r.norm).is_ok() || !identical(r.norm->src[0], g) || !is_f32_rows(r.norm)) {
        return false;
    }
    *out = r;
    return true;
}

ByteRange byte_range(const Tensor& t) {
    ByteRange r;
    r.lo = reinterpret_cast<uintptr_t>(t.data);
    r.hi = r.lo;
    for (int64_t n : t.ne) {
        if (n <= 0) return r;
    }
    size_t e;
    const size_t es = op_checks::elem_size(t.type);
    if (es == 0) {  // block types: rows of whole blocks
        e = static_cast<size_t>(row_bytes(t.type, t.ne[0]));
    } else {
        e = t.nb[0] == es ? static_cast<size_t>(t.ne[0]) * es : static_cast<size_t>(t.ne[0] - 1) * t.nb[0] + es;
    }
    for (int d = 1; d < 4; ++d) e += static_cast<size_t>(t.ne[d] - 1) * t.nb[d];
    r.hi = r.lo + e;
    return r;
}

void plan_fusions(std::span<Tensor* const> nodes, bool enabled, FusionPlan& out) {
    out.items.clear();
    out.slot_bytes = 0;
    out.n_slots = 0;
    for (size_t i = 0; i < nodes.size();) {
        LaunchItem item;
        item.node = nodes[i];
        item.part[0] = nodes[i];
        if (enabled && (match_router_gemv(nodes, i, item) || match_router(nodes, i, item) ||
                        match_sigmoid_router(nodes, i, item) ||
                        match_chain(nodes, i, item) || match_group(nodes, i, item) || match_dense_group(nodes, i, item) ||
                        match_attn_prep(nodes, i, item) || match_moe_bias(nodes, i, item))) {
            item.node = item.part[0];
        } else {
            item.kind = FusedKind::kNone;
            item.part = {nodes[i]};
            item.n_part = 1;
        }
        i += static_cast<size_t>(item.n_part);
        if (enabled && item.kind == FusedKind::kNone && !out.items.empty() && out.items.back().kind == FusedKind::kNone) {
            item.route_from_prev = expert_route_carries(*out.items.back().node, *item.node);
        }
        out.items.push_back(item);
    }
    if (enabled) assign_slots(out);
}

}  // namespace moe::cuda
