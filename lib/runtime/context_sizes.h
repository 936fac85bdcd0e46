// What a context's KV cache and activations take, from its model and params: the sizes that weight
// placement budgets for on each device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "core/tensor.h"
#include "runtime/context.h"

namespace moe {

// One layer's K (or V) cache tensor; an architecture without a V cache (deepseek2's latent cache)
// gets an empty V prototype.
Tensor kv_prototype(const moe_context& ctx, bool v = false);
// Bytes of one layer's KV cache.
uint64_t kv_layer_bytes(const moe_context& ctx);
// Cache tensors per layer: K, and V unless the architecture has none.
int kv_tensors_per_layer(const moe_context& ctx);
// A KV cache of prototypes (no memory) for building graphs only, e.g. to size arenas or to see which
// node reads a weight; the tensors live in `storage`, which must outlive the cache.
KvCache prototype_kv_cache(const moe_context& ctx, std::deque<Tensor>& storage);
// Activation arena of the largest ubatch at the deepest position (what the default budget keeps free);
// split: every expert block built in two parts (the expert split's graphs need more room).
size_t estimate_arena_bytes(const moe_context& ctx, bool split);

// Device memory the default budget leaves for the CUDA context, cuBLAS and kernel scratch.
inline constexpr uint64_t kDeviceReserveBytes = uint64_t{1} << 30;

// What a device offers weights under the default budget (moe_context_params.vram_budget 0), as a
// context over several devices sizes it per device: `free` less the KV cache of its n_layers layers,
// the activations and the reserve; when its weights (`total` bytes, the largest expert tensor
// `largest_expert`) do not all fit that, also less the upload slots of `policy` and, with
// `split_arena`, the expert split's larger activations where the policy may split (what a
// one-device context also keeps free).
uint64_t default_weight_budget(const moe_context& ctx, uint64_t free, int n_layers, uint64_t total,
                               uint64_t largest_expert, const sched::Policy& policy, bool split_arena);

}  // namespace moe
