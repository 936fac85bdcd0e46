// A compute graph: tensors in an arena, nodes in topological (build) order, and the builder
// functions the model builders call. Rebuilt per ubatch; building is cheap (no allocation of
// tensor data, no kernels).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/stable_arena.h"
#include "core/tensor.h"

namespace moe {

class Graph {
public:
    Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    // Leaves.
    Tensor* new_tensor(Type type, std::initializer_list<int64_t> ne, std::string name = {});
    Tensor* input(Type type, std::initializer_list<int64_t> ne, std::string name);  // is_input = true

    // Views (no compute): a reshape of a contiguous tensor, and a strided view.
    Tensor* reshape(Tensor* a, std::initializer_list<int64_t> ne);
    Tensor* view(Tensor* a, std::initializer_list<int64_t> ne, std::initializer_list<size_t> nb, size_t offset);

    // Ops (see core/tensor.h for the exact semantics and shapes).
    Tensor* get_rows(Tensor* w, Tensor* ids);
    Tensor* rms_norm(Tensor* x, Tensor* weight, float eps);  // weight may be nullptr
    Tensor* mul(Tensor* a, Tensor* b);
    Tensor* add(Tensor* a, Tensor* b);
    Tensor* mul_mat(Tensor* w, Tensor* x);
    Tensor* mul_mat_id(Tensor* experts, Tensor* x, Tensor* ids);
    Tensor* moe_up_gate(Tensor* up, Tensor* gate, Tensor* x, Tensor* ids, Tensor* up_bias, Tensor* gate_bias,
                        Activation act);
    Tensor* rope(Tensor* x, Tensor* positions, const RopeParams& p);
    Tensor* attention(Tensor* q, Tensor* k, Tensor* v, Tensor* q_positions, Tensor* sinks, float scale,
                      int32_t window, int32_t n_kv);
    Tensor* softmax(Tensor* x);
    Tensor* topk(Tensor* x, int32_t k);
    Tensor* gather(Tensor* x, Tensor* ids);
    Tensor* weighted_sum(Tensor* y, Tensor* w, Tensor* ids = nullptr);
    Tensor* mask_ids(Tensor* ids, Tensor* groups, int32_t keep);
    Tensor* silu(Tensor* x);
    Tensor* sigmoid(Tensor* x);
    Tensor* norm_scale(Tensor* x, bool normalize, float scale);
    Tensor* swiglu(Tensor* gate, Tensor* up);
    Tensor* swiglu_oai(Tensor* gate, Tensor* up, float alpha, float limit);
    Tensor* cpy(Tensor* src, Tensor* dst_view);
    // src [A, B, T] into rows rows[t] (I32 [T], values read when the node runs) of dst_view [A, B, N].
    Tensor* cpy_rows(Tensor* src, Tensor* dst_view, Tensor* rows);
    // b may be nullptr (a alone: a contiguous copy of a in `type`); a and b F32 or F16.
    Tensor* concat(Tensor* a, Tensor* b, Type type = Type::F32);
    Tensor* mul_mat_heads(Tensor* w, Tensor* x);
    Tensor* group_mask(Tensor* x, int32_t n_group, int32_t n_used, int32_t top_n);

    // A graph over part of another graph's nodes (a stage of a run over several devices): `node` joins
    // this graph's nodes as it is. REQUIRES: the graph that made it outlives this one.
    void adopt(Tensor* node) { nodes_.push_back(node); }
    // A new input leaf of t's type and shape, contiguous (what a stage reads of a tensor computed in
    // another stage, or its own copy of an input).
    Tensor* input_like(const Tensor& t);

    // Marks the graph's result(s); nodes are computed in the order they were built.
    void set_output(Tensor* t) { t->is_output = true; outputs_.push_back(t); }

    // Different for every Graph the process makes (an address may be reused once a graph is freed).
    uint64_t serial() const { return serial_; }
    const std::vector<Tensor*>& nodes() const { return nodes_; }  // every non-leaf tensor, in order
    const std::vector<Tensor*>& outputs() const { return outputs_; }
    // Tensors tagged with `layer` from now on (for stats and placement).
    void set_layer(int32_t layer) { layer_ = layer; }

    // Rewrites of a built graph (the scheduler's expert split, sched/expert_split_rewrite.h) make nodes
    // with the builders above or copy_node, then put them in place with set_nodes.
    // A new node computing what `node` computes (op, shape, strides, params, layer, name) from the
    // operands `src` (nullptr where node has none); a view views the new operand in its view's place.
    Tensor* copy_node(const Tensor& node, const std::array<Tensor*, kMaxSrc>& src);
    // Replaces the node list. REQUIRES: nodes made by this graph, each after its operands (the order
    // they are computed in).
    void set_nodes(std::vector<Tensor*> nodes) { nodes_ = std::move(nodes); }

private:
    Tensor* new_node(Op op, Type type, std::initializer_list<int64_t> ne, std::initializer_list<Tensor*> srcs);
    Tensor* cpy_node(Tensor* src, Tensor* dst_view, Tensor* rows);

    uint64_t serial_;
    StableArena<Tensor> arena_;  // stable addresses
    std::vector<Tensor*> nodes_;
    std::vector<Tensor*> outputs_;
    int32_t layer_ = -1;
};

}  // namespace moe
