#include "sched/expert_split_rewrite.h"

#include <algorithm>
#include <array>
#include <vector>

#include "sched/expert_plan.h"

namespace moe::sched {
namespace {

// An expert block in the node list: the indices of its nodes, from its MOE_UP_GATE at `first` to the
// WEIGHTED_SUM of its products, each reading the router's ids or an earlier node of the block (the
// down products and the down biases' rows), and the router's ids.
struct Block {
    std::vector<size_t> members;
    Tensor* ids = nullptr;
};

Block find_block(const std::vector<Tensor*>& nodes, size_t first) {
    Block b;
    b.ids = nodes[first]->src[3];
    std::vector<const Tensor*> in_block;
    for (size_t j = first; j < nodes.size(); ++j) {
        const Tensor& n = *nodes[j];
        const bool reads = std::any_of(std::begin(n.src), std::end(n.src), [&](const Tensor* s) {
            return s != nullptr && (s == b.ids || std::find(in_block.begin(), in_block.end(), s) != in_block.end());
        });
        if (!reads) continue;
        in_block.push_back(&n);
        b.members.push_back(j);
        if (n.op == Op::WEIGHTED_SUM) return b;
    }
    MOE_ASSERT(false && "an expert block without its WEIGHTED_SUM");
    return b;
}

// Appends to `out` the two parts of block b (of layer il) and their sum; returns the sum.
Tensor* emit_parts(Graph& g, const std::vector<Tensor*>& nodes, const Block& b, int il, ExpertParts& parts,
                   std::vector<Tensor*>& out) {
    g.set_layer(il);
    Tensor* all = parts.groups;
    Tensor* row = g.view(all, {all->ne[0]}, {all->nb[1]}, static_cast<size_t>(il) * all->nb[1]);
    out.push_back(row);
    Tensor* part_sum[2] = {};
    for (const int32_t group : {kDeviceExpertGroup, kHostExpertGroup}) {
        Tensor* mask = g.mask_ids(b.ids, row, group);
        out.push_back(mask);
        parts.node_group[mask] = group;
        std::vector<std::pair<const Tensor*, Tensor*>> copy_of = {{b.ids, mask}};
        for (size_t j : b.members) {
            const Tensor& n = *nodes[j];
            std::array<Tensor*, kMaxSrc> src{};
            for (int k = 0; k < kMaxSrc; ++k) {
                const auto it = std::find_if(copy_of.begin(), copy_of.end(),
                                             [&](const auto& c) { return c.first == n.src[k]; });
                src[static_cast<size_t>(k)] = it != copy_of.end() ? it->second : n.src[k];
            }
            // The other group's slots are kNoExpert, their product rows unwritten: the sum skips them.
            if (n.op == Op::WEIGHTED_SUM) src[2] = mask;
            Tensor* c = g.copy_node(n, src);
            copy_of.emplace_back(&n, c);
            out.push_back(c);
            parts.node_group[c] = group;
            part_sum[group] = c;
        }
    }
    Tensor* sum = g.add(part_sum[kDeviceExpertGroup], part_sum[kHostExpertGroup]);
    g.set_layer(-1);
    out.push_back(sum);
    return sum;
}

}  // namespace

ExpertParts split_expert_blocks(Graph& graph, std::span<const uint8_t> layers, int n_expert) {
    ExpertParts parts;
    if (std::find(layers.begin(), layers.end(), uint8_t{1}) == layers.end()) return parts;
    const auto n_layer = static_cast<int64_t>(layers.size());
    parts.groups = graph.input(Type::I32, {n_expert, n_layer}, "expert_groups");
    const std::vector<Tensor*> nodes = graph.nodes();
    std::vector<Tensor*> out;
    out.reserve(2 * nodes.size());
    std::vector<uint8_t> moved(nodes.size(), 0);          // a block's nodes, replaced by its parts
    std::vector<std::pair<size_t, Block>> blocks;         // (index of the block's result, block)
    std::vector<std::pair<const Tensor*, Tensor*>> sums;  // (a replaced block's result, its parts' sum)
    for (size_t i = 0; i < nodes.size(); ++i) {
        Tensor* n = nodes[i];
        if (n->op == Op::MOE_UP_GATE && n->layer >= 0 && n->layer < n_layer &&
            layers[static_cast<size_t>(n->layer)] != 0) {
            Block b = find_block(nodes, i);
            for (size_t j : b.members) moved[j] = 1;
            blocks.emplace_back(b.members.back(), std::move(b));
        }
        // The parts go where the block's result was: the nodes built among the block's that do not
        // depend on it (none today) keep their places before them.
        if (!blocks.empty() && blocks.back().first == i) {
            const Block& b = blocks.back().second;
            Tensor* sum = emit_parts(graph, nodes, b, n->layer, parts, out);
            MOE_ASSERT(!n->is_output);
            sums.emplace_back(n, sum);
            continue;
        }
        if (moved[i]) continue;
        const auto reread = [&sums](Tensor*& t) {
            if (t == nullptr || t->op != Op::WEIGHTED_SUM) return;
            const auto it = std::find_if(sums.begin(), sums.end(), [t](const auto& p) { return p.first == t; });
            if (it != sums.end()) t = it->second;
        };
        for (Tensor*& s : n->src) reread(s);
        reread(n->view_src);
        out.push_back(n);
    }
    graph.set_nodes(std::move(out));
    return parts;
}

}  // namespace moe::sched
