// The experts a device context keeps in device memory, per layer (moe_context_get_resident_experts),
// printed after a run: how much of the model the VRAM budget holds and which layers it split.
#ifndef MOEINFER_TOOLS_BENCH_RESIDENCY_H
#define MOEINFER_TOOLS_BENCH_RESIDENCY_H

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "moeinfer/moeinfer.h"

namespace bench {

// "resident experts: 150 of 256 (12.5 MiB) in 3 partly resident layers; per layer: 128 96 54 0".
inline std::optional<Failure> print_residency(FILE* out, const moe_context* ctx, const moe_model_info& info) {
    int32_t n = 0;
    if (moe_context_get_resident_experts(ctx, nullptr, nullptr, 0, &n) != MOE_STATUS_OK) {
        return library_error("moe_context_get_resident_experts");
    }
    std::vector<int32_t> experts(static_cast<size_t>(n));
    std::vector<uint64_t> bytes(static_cast<size_t>(n));
    if (moe_context_get_resident_experts(ctx, experts.data(), bytes.data(), n, &n) != MOE_STATUS_OK) {
        return library_error("moe_context_get_resident_experts");
    }
    int64_t total = 0, partial = 0, moe_layers = 0;
    uint64_t total_bytes = 0;
    std::string per_layer;
    for (int32_t il = 0; il < n; ++il) {
        total += experts[static_cast<size_t>(il)];
        total_bytes += bytes[static_cast<size_t>(il)];
        partial += experts[static_cast<size_t>(il)] > 0 && experts[static_cast<size_t>(il)] < info.n_expert;
        moe_layers += 1;
        per_layer.append(" ").append(std::to_string(experts[static_cast<size_t>(il)]));  // (GCC 12 false -Wrestrict)
    }
    std::fprintf(out, "resident experts: %lld of %lld (%.1f MiB) in %lld partly resident layers; per layer:%s\n",
                 static_cast<long long>(total), static_cast<long long>(moe_layers * info.n_expert),
                 static_cast<double>(total_bytes) / (1024.0 * 1024.0), static_cast<long long>(partial),
                 per_layer.c_str());
    return std::nullopt;
}

}  // namespace bench

#endif  // MOEINFER_TOOLS_BENCH_RESIDENCY_H
