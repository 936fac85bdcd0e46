#include "runtime/context_sizes.h"

#include <algorithm>
#include <deque>
#include <vector>

#include "core/allocator.h"
#include "core/models/model_graph.h"
#include "sched/expert_split_rewrite.h"
#include "sched/transfers.h"

namespace moe {

Tensor kv_prototype(const moe_context& ctx, bool v) {
    const KvLayout layout = kv_layout(ctx.model->hparams);
    const int64_t ne[3] = {v ? layout.v_row : layout.k_row, v ? layout.v_heads : layout.k_heads, ctx.params.n_ctx};
    Tensor proto;
    set_shape(proto, Type::F16, 3, ne);
    return proto;
}

uint64_t kv_layer_bytes(const moe_context& ctx) {
    return kv_prototype(ctx).n_bytes() + kv_prototype(ctx, true).n_bytes();
}

int kv_tensors_per_layer(const moe_context& ctx) { return kv_layout(ctx.model->hparams).v_row > 0 ? 2 : 1; }

KvCache prototype_kv_cache(const moe_context& ctx, std::deque<Tensor>& storage) {
    KvCache kv;
    kv.n_ctx = ctx.params.n_ctx;
    for (int il = 0; il < ctx.model->hparams.n_layer; ++il) {
        kv.k.push_back(&storage.emplace_back(kv_prototype(ctx)));
        if (kv_tensors_per_layer(ctx) == 2) kv.v.push_back(&storage.emplace_back(kv_prototype(ctx, true)));
    }
    return kv;
}

size_t estimate_arena_bytes(const moe_context& ctx, bool split) {
    const HParams& hp = ctx.model->hparams;
    std::deque<Tensor> cache;
    const KvCache kv = prototype_kv_cache(ctx, cache);
    const int n = std::min(ctx.params.n_ubatch, ctx.params.n_ctx);
    const auto arena_at = [&](int n_past) {
        Graph g;
        build_model_graph(g, hp, ctx.weights, kv, n, n_past, LogitsMode::ALL, ctx.kv_addressing());
        const std::vector<uint8_t> split_layers(split ? static_cast<size_t>(hp.n_layer) : 0, 1);
        sched::split_expert_blocks(g, split_layers, hp.n_expert);
        return plan_allocation(g).arena_size;
    };
    size_t arena = arena_at(ctx.params.n_ctx - n);
    // deepseek2's prompts decompress the cache up to kMlaDecompressMaxKv rows and attend in latent space
    // beyond: the deepest decompressing ubatch may need more than the deepest one.
    if (ctx.params.n_ctx > kMlaDecompressMaxKv && n <= kMlaDecompressMaxKv &&
        mla_decompressed(hp, n, kMlaDecompressMaxKv)) {
        arena = std::max(arena, arena_at(kMlaDecompressMaxKv - n));
    }
    return arena;
}

uint64_t default_weight_budget(const moe_context& ctx, uint64_t free, int n_layers, uint64_t total,
                               uint64_t largest_expert, const sched::Policy& policy, bool split_arena) {
    const uint64_t arena = estimate_arena_bytes(ctx, false);
    const uint64_t need = kv_layer_bytes(ctx) * static_cast<uint64_t>(n_layers) + arena + kDeviceReserveBytes;
    uint64_t budget = free > need ? free - need : 0;
    if (total > budget) {
        uint64_t spill = static_cast<uint64_t>(sched::auto_upload_slots(policy)) * largest_expert;
        if (split_arena && policy.expert_split != 0) {
            spill += std::max<uint64_t>(estimate_arena_bytes(ctx, true), arena) - arena;
        }
        budget = budget > spill ? budget - spill : 0;
    }
    return budget;
}

}  // namespace moe
