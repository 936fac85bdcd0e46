#include "core/allocator.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <unordered_map>

namespace moe {
namespace {

size_t align_up(size_t n) { return (n + kTensorAlignment - 1) & ~(kTensorAlignment - 1); }

bool owns_planned_memory(const Tensor* t) {
    if (t->view_src != nullptr) return false;       // views and CPY share another tensor's memory
    if (t->op == Op::NONE) return t->is_input && t->data == nullptr;
    return true;
}

// First-fit free list over [0, arena_size): free blocks by offset, merged with neighbours on release.
class FreeList {
public:
    size_t allocate(size_t size) {
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            if (it->second >= size) {
                const size_t offset = it->first;
                const size_t rest = it->second - size;
                free_.erase(it);
                if (rest > 0) free_.emplace(offset + size, rest);
                return offset;
            }
        }
        // Extend the arena; if the last free block touches the end, grow from it.
        if (!free_.empty()) {
            auto last = std::prev(free_.end());
            if (last->first + last->second == end_) {
                const size_t offset = last->first;
                free_.erase(last);
                end_ = offset + size;
                return offset;
            }
        }
        const size_t offset = end_;
        end_ += size;
        return offset;
    }

    void release(size_t offset, size_t size) {
        auto it = free_.emplace(offset, size).first;
        auto next = std::next(it);
        if (next != free_.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_.erase(next);
        }
        if (it != free_.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_.erase(it);
            }
        }
    }

    size_t end() const { return end_; }

private:
    std::map<size_t, size_t> free_;
    size_t end_ = 0;
};

}  // namespace

const Tensor* storage_of(const Tensor* t) {
    while (t->view_src != nullptr) t = t->view_src;
    return t;
}

AllocPlan plan_allocation(const Graph& graph) {
    const std::vector<Tensor*>& nodes = graph.nodes();

    // Last node index reading each storage tensor (through views too).
    std::unordered_map<const Tensor*, size_t> last_use;
    for (size_t i = 0; i < nodes.size(); ++i) {
        last_use[storage_of(nodes[i])] = std::max(last_use[storage_of(nodes[i])], i);
        for (const Tensor* s : nodes[i]->src) {
            if (s != nullptr) last_use[storage_of(s)] = i;
        }
    }

    AllocPlan plan;
    FreeList free_list;
    auto place = [&](const Tensor* t) {
        const size_t size = align_up(t->n_bytes());
        plan.offsets[t] = free_list.allocate(size);
    };

    // Inputs first: they are written before any node runs.
    for (const Tensor* n : nodes) {
        for (const Tensor* s : n->src) {
            if (s != nullptr && s->op == Op::NONE && owns_planned_memory(s) && !plan.offsets.count(s)) place(s);
        }
    }
    std::vector<std::vector<const Tensor*>> dies_at(nodes.size());
    for (const auto& [t, i] : last_use) {
        if (!t->is_output) dies_at[i].push_back(t);
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
        const Tensor* n = nodes[i];
        if (owns_planned_memory(n)) place(n);
        for (const Tensor* t : dies_at[i]) {
            auto it = plan.offsets.find(t);
            if (it != plan.offsets.end()) free_list.release(it->second, align_up(t->n_bytes()));
        }
    }
    plan.arena_size = free_list.end();
    return plan;
}

void bind_allocation(const Graph& graph, const AllocPlan& plan, void* base) {
    auto* bytes = static_cast<uint8_t*>(base);
    for (const auto& [t, offset] : plan.offsets) const_cast<Tensor*>(t)->data = bytes + offset;
    bind_views(graph);
}

void bind_views(const Graph& graph) {
    for (Tensor* n : graph.nodes()) {
        if (n->view_src != nullptr) {
            MOE_ASSERT(n->view_src->data != nullptr);
            n->data = static_cast<uint8_t*>(n->view_src->data) + n->view_offset;
            n->buffer = n->view_src->buffer;
        }
    }
}

}  // namespace moe
