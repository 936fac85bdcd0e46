#include "runtime/attention_home.h"

#include <regex>
#include <string>

namespace moe {

bool device_computes_attention(const HParams& hp, const Backend& device) {
    const KvLayout kv = kv_layout(hp);
    Tensor q, k, v;
    const int64_t q_ne[3] = {kv.k_row, kv.k_heads, 1};
    const int64_t k_ne[3] = {kv.k_row, kv.k_heads, 1};
    const int64_t v_ne[3] = {kv.v_row, kv.v_heads, 1};
    set_shape(q, Type::F32, 3, q_ne);
    set_shape(k, Type::F16, 3, k_ne);
    set_shape(v, Type::F16, 3, v_ne);
    Tensor probe;
    probe.op = Op::ATTENTION;
    probe.src[0] = &q;
    probe.src[1] = &k;
    probe.src[2] = kv.v_row > 0 ? &v : &k;  // no V cache (deepseek2): the latent K is read as V too
    return device.supports_op(probe);
}

std::vector<sched::OverrideRule> host_attention_overrides(const HParams& hp, const ModelWeights& weights,
                                                          const Backend& device) {
    if (weights.layers.empty() || device_computes_attention(hp, device)) return {};
    // One rule for every layer: the anchors are "blk.N.<suffix>" with the same suffix in every layer.
    const std::string& first = attention_anchor(weights.layers[0])->name;
    const std::string prefix = "blk.0.";
    MOE_ASSERT(first.rfind(prefix, 0) == 0);
    std::string suffix;
    for (const char c : first.substr(prefix.size())) {
        if (c == '.') suffix += '\\';
        suffix += c;
    }
    const std::string pattern = "^blk\\.[0-9]+\\." + suffix + "$";
    return {sched::OverrideRule{pattern, std::regex(pattern), sched::Side::HOST, -1}};
}

}  // namespace moe
