#include "sched/graph_cut.h"

#include <algorithm>
#include <unordered_map>

#include "core/allocator.h"

namespace moe::sched {

StatusOr<std::vector<Stage>> cut_graph(Graph& graph, std::span<const int> node_device) {
    const std::vector<Tensor*>& nodes = graph.nodes();
    MOE_ASSERT(node_device.size() == nodes.size());
    std::vector<Stage> stages;
    std::unordered_map<const Tensor*, size_t> stage_of;  // node -> its stage
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (stages.empty() || stages.back().device != node_device[i]) {
            Stage& s = stages.emplace_back();
            s.device = node_device[i];
            s.graph = std::make_unique<Graph>();
        }
        stages.back().graph->adopt(nodes[i]);
        stage_of[nodes[i]] = stages.size() - 1;
    }
    for (size_t k = 0; k < stages.size(); ++k) {
        Stage& stage = stages[k];
        std::unordered_map<const Tensor*, Tensor*> leaf_of;  // the full graph's tensor -> its leaf here
        for (Tensor* n : stage.graph->nodes()) {
            for (Tensor*& src : n->src) {
                if (src == nullptr || src->is_weight) continue;
                const bool graph_input = src->op == Op::NONE && src->is_input;
                const auto producer = stage_of.find(src);
                const bool earlier = producer != stage_of.end() && producer->second != k;
                if (!graph_input && !earlier) continue;
                Tensor*& leaf = leaf_of[src];
                if (leaf == nullptr) {
                    if (!src->is_contiguous()) {
                        return invalid_argument("graph cut: '" + src->name + "' crosses from device " +
                                                std::to_string(stages[producer->second].device) + " to device " +
                                                std::to_string(stage.device) + " as a strided view");
                    }
                    leaf = stage.graph->input_like(*src);
                    stage.inputs.emplace_back(leaf, src);
                    if (earlier) {
                        Stage& from = stages[producer->second];
                        if (std::find(from.exports.begin(), from.exports.end(), src) == from.exports.end()) {
                            from.exports.push_back(src);
                            from.graph->set_output(src);
                            // A view's storage lives as long as the view is read.
                            const_cast<Tensor*>(storage_of(src))->is_output = true;
                        }
                    }
                }
                if (n->view_src == src) n->view_src = leaf;
                src = leaf;
            }
        }
    }
    return stages;
}

uint64_t crossing_bytes(std::span<const Stage> stages) {
    uint64_t bytes = 0;
    for (const Stage& s : stages) {
        for (const Tensor* e : s.exports) bytes += e->n_bytes();
        for (const auto& [leaf, from] : s.inputs) {
            if (from->op != Op::NONE) bytes += leaf->n_bytes();
        }
    }
    return bytes;
}

}  // namespace moe::sched
