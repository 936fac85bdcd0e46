#include "core/graph.h"

#include <atomic>

namespace moe {

Graph::Graph() {
    static std::atomic<uint64_t> next{1};
    serial_ = next.fetch_add(1, std::memory_order_relaxed);
}

Tensor* Graph::new_tensor(Type type, std::initializer_list<int64_t> ne, std::string name) {
    Tensor& t = arena_.emplace_back();
    // From the list's own array: graphs are built every ubatch (a decode step of a 48-layer model makes
    // ~1,500 tensors), and a vector per tensor was a heap allocation each.
    set_shape(t, type, static_cast<int>(ne.size()), ne.begin());
    t.name = std::move(name);
    t.layer = layer_;
    return &t;
}

Tensor* Graph::input(Type type, std::initializer_list<int64_t> ne, std::string name) {
    Tensor* t = new_tensor(type, ne, std::move(name));
    t->is_input = true;
    return t;
}

Tensor* Graph::input_like(const Tensor& t) {
    Tensor& leaf = arena_.emplace_back();
    set_shape(leaf, t.type, 4, t.ne);
    leaf.name = t.name;
    leaf.layer = t.layer;
    leaf.is_input = true;
    return &leaf;
}

Tensor* Graph::new_node(Op op, Type type, std::initializer_list<int64_t> ne, std::initializer_list<Tensor*> srcs) {
    Tensor* t = new_tensor(type, ne);
    t->op = op;
    int i = 0;
    for (Tensor* s : srcs) {
        MOE_ASSERT(i < kMaxSrc);
        t->src[i++] = s;
    }
    nodes_.push_back(t);
    return t;
}

Tensor* Graph::copy_node(const Tensor& node, const std::array<Tensor*, kMaxSrc>& src) {
    MOE_ASSERT(node.op != Op::NONE);
    Tensor& t = arena_.emplace_back();
    set_shape(t, node.type, 4, node.ne);
    for (int d = 0; d < 4; ++d) t.nb[d] = node.nb[d];
    t.op = node.op;
    t.params = node.params;
    t.layer = node.layer;
    t.name = node.name;
    t.view_offset = node.view_offset;
    for (int i = 0; i < kMaxSrc; ++i) {
        t.src[i] = src[static_cast<size_t>(i)];
        if (node.view_src != nullptr && node.view_src == node.src[i]) t.view_src = t.src[i];
    }
    MOE_ASSERT((node.view_src == nullptr) == (t.view_src == nullptr));
    nodes_.push_back(&t);
    return &t;
}

Tensor* Graph::reshape(Tensor* a, std::initializer_list<int64_t> ne) {
    MOE_ASSERT(a->is_contiguous());
    Tensor* t = new_node(Op::VIEW, a->type, ne, {a});
    MOE_ASSERT(t->n_elements() == a->n_elements());
    t->view_src = a;
    t->view_offset = 0;
    return t;
}

Tensor* Graph::view(Tensor* a, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset) {
    Tensor* t = new_node(Op::VIEW, a->type, ne, {a});
    int d = 1;
    for (size_t s : nb) {
        MOE_ASSERT(d < 4);
        t->nb[d++] = s;
    }
    t->view_src = a;
    t->view_offset = offset;
    return t;
}

// Shapes are checked here with MOE_ASSERT: model builders validate weights at load time, so a
// mismatch in a graph is a bug in a builder, not bad input.

Tensor* Graph::get_rows(Tensor* w, Tensor* ids) {
    MOE_ASSERT(ids->type == Type::I32 && w->ne[2] == 1);
    return new_node(Op::GET_ROWS, Type::F32, {w->ne[0], ids->ne[0]}, {w, ids});
}

Tensor* Graph::rms_norm(Tensor* x, Tensor* weight, float eps) {
    MOE_ASSERT(x->type == Type::F32);
    MOE_ASSERT(weight == nullptr || (weight->ne[0] == x->ne[0] && weight->n_rows() == 1));
    Tensor* t = new_node(Op::RMS_NORM, Type::F32, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, {x, weight});
    t->params.f[0] = eps;
    return t;
}

namespace {
void check_broadcast(const Tensor* a, const Tensor* b) {
    MOE_ASSERT(a->type == Type::F32 && b->type == Type::F32);
    for (int d = 0; d < 4; ++d) MOE_ASSERT(b->ne[d] > 0 && a->ne[d] % b->ne[d] == 0);
}
}  // namespace

Tensor* Graph::mul(Tensor* a, Tensor* b) {
    check_broadcast(a, b);
    return new_node(Op::MUL, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b});
}

Tensor* Graph::add(Tensor* a, Tensor* b) {
    check_broadcast(a, b);
    return new_node(Op::ADD, Type::F32, {a->ne[0], a->ne[1], a->ne[2], a->ne[3]}, {a, b});
}

Tensor* Graph::mul_mat(Tensor* w, Tensor* x) {
    MOE_ASSERT(x->type == Type::F32 && w->ne[0] == x->ne[0] && w->ne[2] == 1 && w->ne[3] == 1);
    return new_node(Op::MUL_MAT, Type::F32, {w->ne[1], x->ne[1], x->ne[2], x->ne[3]}, {w, x});
}

Tensor* Graph::mul_mat_id(Tensor* experts, Tensor* x, Tensor* ids) {
    MOE_ASSERT(x->type == Type::F32 && ids->type == Type::I32);
    MOE_ASSERT(experts->ne[0] == x->ne[0] && x->ne[2] == ids->ne[1]);
    MOE_ASSERT(x->ne[1] == 1 || x->ne[1] == ids->ne[0]);
    return new_node(Op::MUL_MAT_ID, Type::F32, {experts->ne[1], ids->ne[0], ids->ne[1]}, {experts, x, ids});
}

Tensor* Graph::moe_up_gate(Tensor* up, Tensor* gate, Tensor* x, Tensor* ids, Tensor* up_bias, Tensor* gate_bias,
                           Activation act) {
    MOE_ASSERT(x->type == Type::F32 && ids->type == Type::I32);
    MOE_ASSERT(up->ne[0] == x->ne[0] && gate->ne[0] == x->ne[0] && up->ne[1] == gate->ne[1] && up->ne[2] == gate->ne[2]);
    MOE_ASSERT(x->ne[1] == ids->ne[1] && x->ne[2] == 1);
    MOE_ASSERT((up_bias == nullptr) == (gate_bias == nullptr));
    Tensor* t = new_node(Op::MOE_UP_GATE, Type::F32, {up->ne[1], ids->ne[0], ids->ne[1]},
                         {up, gate, x, ids, up_bias, gate_bias});
    t->params.i[0] = static_cast<int32_t>(act);
    if (act == Activation::SWIGLU_OAI) {
        t->params.f[0] = 1.702f;  // alpha
        t->params.f[1] = 7.0f;    // limit
    }
    return t;
}

Tensor* Graph::rope(Tensor* x, Tensor* positions, const RopeParams& p) {
    MOE_ASSERT(x->type == Type::F32 && positions->type == Type::I32 && positions->ne[0] == x->ne[2]);
    MOE_ASSERT(p.n_dims > 0 && p.n_dims <= x->ne[0] && p.n_dims % 2 == 0);
    Tensor* t = new_node(Op::ROPE, Type::F32, {x->ne[0], x->ne[1], x->ne[2]}, {x, positions});
    t->set_rope_params(p);
    return t;
}

Tensor* Graph::attention(Tensor* q, Tensor* k, Tensor* v, Tensor* q_positions, Tensor* sinks, float scale,
                         int32_t window, int32_t n_kv) {
    MOE_ASSERT(q->type == Type::F32 && q_positions->type == Type::I32 && q_positions->ne[0] == q->ne[2]);
    MOE_ASSERT(k->ne[0] == q->ne[0] && v->ne[0] == q->ne[0] && k->ne[1] == v->ne[1] && q->ne[1] % k->ne[1] == 0);
    MOE_ASSERT(n_kv > 0 && n_kv <= k->ne[2] && n_kv <= v->ne[2]);
    MOE_ASSERT(sinks == nullptr || (sinks->type == Type::F32 && sinks->ne[0] == q->ne[1]));
    Tensor* t = new_node(Op::ATTENTION, Type::F32, {q->ne[0], q->ne[1], q->ne[2]}, {q, k, v, q_positions, sinks});
    t->params.f[0] = scale;
    t->params.i[0] = window;
    t->params.i[1] = n_kv;
    return t;
}

Tensor* Graph::softmax(Tensor* x) {
    MOE_ASSERT(x->type == Type::F32);
    return new_node(Op::SOFTMAX, Type::F32, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, {x});
}

Tensor* Graph::topk(Tensor* x, int32_t k) {
    MOE_ASSERT(x->type == Type::F32 && k > 0 && k <= x->ne[0] && x->ne[2] == 1);
    Tensor* t = new_node(Op::TOPK, Type::I32, {k, x->ne[1]}, {x});
    t->params.i[0] = k;
    return t;
}

Tensor* Graph::gather(Tensor* x, Tensor* ids) {
    MOE_ASSERT(x->type == Type::F32 && ids->type == Type::I32 && ids->ne[1] == x->ne[1]);
    return new_node(Op::GATHER, Type::F32, {ids->ne[0], ids->ne[1]}, {x, ids});
}

Tensor* Graph::weighted_sum(Tensor* y, Tensor* w, Tensor* ids) {
    MOE_ASSERT(y->type == Type::F32 && w->type == Type::F32 && y->ne[1] == w->ne[0] && y->ne[2] == w->ne[1]);
    MOE_ASSERT(ids == nullptr || (ids->type == Type::I32 && ids->ne[0] == w->ne[0] && ids->ne[1] == w->ne[1]));
    return new_node(Op::WEIGHTED_SUM, Type::F32, {y->ne[0], y->ne[2]}, {y, w, ids});
}

Tensor* Graph::mask_ids(Tensor* ids, Tensor* groups, int32_t keep) {
    MOE_ASSERT(ids->type == Type::I32 && groups->type == Type::I32 && groups->n_rows() == 1);
    Tensor* t = new_node(Op::MASK_IDS, Type::I32, {ids->ne[0], ids->ne[1]}, {ids, groups});
    t->params.i[0] = keep;
    return t;
}

Tensor* Graph::silu(Tensor* x) {
    MOE_ASSERT(x->type == Type::F32);
    return new_node(Op::SILU, Type::F32, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, {x});
}

Tensor* Graph::sigmoid(Tensor* x) {
    MOE_ASSERT(x->type == Type::F32);
    return new_node(Op::SIGMOID, Type::F32, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, {x});
}

Tensor* Graph::norm_scale(Tensor* x, bool normalize, float scale) {
    MOE_ASSERT(x->type == Type::F32);
    Tensor* t = new_node(Op::NORM_SCALE, Type::F32, {x->ne[0], x->ne[1], x->ne[2], x->ne[3]}, {x});
    t->params.i[0] = normalize ? 1 : 0;
    t->params.f[0] = scale;
    return t;
}

Tensor* Graph::swiglu(Tensor* gate, Tensor* up) {
    MOE_ASSERT(gate->type == Type::F32 && up->type == Type::F32 && gate->n_elements() == up->n_elements());
    return new_node(Op::SWIGLU, Type::F32, {gate->ne[0], gate->ne[1], gate->ne[2], gate->ne[3]}, {gate, up});
}

Tensor* Graph::swiglu_oai(Tensor* gate, Tensor* up, float alpha, float limit) {
    MOE_ASSERT(gate->type == Type::F32 && up->type == Type::F32 && gate->n_elements() == up->n_elements());
    Tensor* t = new_node(Op::SWIGLU_OAI, Type::F32, {gate->ne[0], gate->ne[1], gate->ne[2], gate->ne[3]}, {gate, up});
    t->params.f[0] = alpha;
    t->params.f[1] = limit;
    return t;
}

Tensor* Graph::concat(Tensor* a, Tensor* b, Type type) {
    const auto is_float = [](const Tensor* t) { return t->type == Type::F32 || t->type == Type::F16; };
    MOE_ASSERT(is_float(a) && a->ne[3] == 1 && (type == Type::F32 || type == Type::F16));
    MOE_ASSERT(b == nullptr || (is_float(b) && b->ne[3] == 1 && b->ne[2] == a->ne[2] &&
                                (b->ne[1] == a->ne[1] || b->ne[1] == 1)));
    return new_node(Op::CONCAT, type, {a->ne[0] + (b != nullptr ? b->ne[0] : 0), a->ne[1], a->ne[2]}, {a, b});
}

Tensor* Graph::mul_mat_heads(Tensor* w, Tensor* x) {
    MOE_ASSERT(x->type == Type::F32 && w->ne[0] == x->ne[0] && w->ne[2] == x->ne[1] && w->ne[3] == 1 && x->ne[3] == 1);
    return new_node(Op::MUL_MAT_HEADS, Type::F32, {w->ne[1], x->ne[1], x->ne[2]}, {w, x});
}

Tensor* Graph::group_mask(Tensor* x, int32_t n_group, int32_t n_used, int32_t top_n) {
    MOE_ASSERT(x->type == Type::F32 && x->ne[2] == 1 && n_group > 0 && x->ne[0] % n_group == 0);
    MOE_ASSERT(n_used > 0 && n_used <= n_group && top_n > 0 && top_n <= x->ne[0] / n_group);
    Tensor* t = new_node(Op::GROUP_MASK, Type::F32, {x->ne[0], x->ne[1]}, {x});
    t->params.i[0] = n_group;
    t->params.i[1] = n_used;
    t->params.i[2] = top_n;
    return t;
}

Tensor* Graph::cpy(Tensor* src, Tensor* dst_view) {
    MOE_ASSERT(src->type == Type::F32 && src->n_elements() == dst_view->n_elements());
    return cpy_node(src, dst_view, nullptr);
}

Tensor* Graph::cpy_rows(Tensor* src, Tensor* dst_view, Tensor* rows) {
    MOE_ASSERT(src->type == Type::F32 && rows->type == Type::I32);
    MOE_ASSERT(src->ne[0] == dst_view->ne[0] && src->ne[1] == dst_view->ne[1] && src->ne[3] == 1 &&
               dst_view->ne[3] == 1 && rows->ne[0] == src->ne[2] && rows->n_elements() == rows->ne[0]);
    return cpy_node(src, dst_view, rows);
}

Tensor* Graph::cpy_node(Tensor* src, Tensor* dst_view, Tensor* rows) {
    MOE_ASSERT(dst_view->type == Type::F32 || dst_view->type == Type::F16);
    Tensor* t = new_node(Op::CPY, dst_view->type, {dst_view->ne[0], dst_view->ne[1], dst_view->ne[2], dst_view->ne[3]},
                         {src, dst_view, rows});
    for (int d = 0; d < 4; ++d) t->nb[d] = dst_view->nb[d];
    t->view_src = dst_view;
    t->view_offset = 0;
    return t;
}

}  // namespace moe
