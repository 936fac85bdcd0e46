// The context behind moe_context: weights bound to tensors, the KV cache, the ubatch loop.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/models/model_graph.h"
#include "runtime/model.h"

struct moe_context {
    moe_model* model = nullptr;
    moe_context_params params{};

    std::unique_ptr<moe::Backend> backend;   // where every op runs (CPU, or CUDA for all-GPU runs)
    std::deque<moe::Tensor> weight_tensors;  // leaves over the model's data (mapped, or uploaded)
    std::unique_ptr<moe::Buffer> weight_buffer;  // device copy of the weights (device backends only)
    moe::ModelWeights weights;

    std::unique_ptr<moe::Buffer> kv_buffer;
    std::deque<moe::Tensor> kv_tensors;
    moe::KvCache kv;
    int n_past = 0;

    std::unique_ptr<moe::Buffer> arena;  // activations of the current ubatch graph

    std::vector<float> logits;
    int32_t logits_rows = 0;

    bool profiling = false;
    struct OpTime {
        int64_t count = 0;
        double seconds = 0.0;
    };
    std::array<OpTime, static_cast<size_t>(moe::Op::COUNT)> op_times{};
};

namespace moe {

StatusOr<std::unique_ptr<moe_context>> create_context(moe_model* model, const moe_context_params& params);

// Evaluates tokens; see moe_decode in moeinfer.h for the contract.
Status decode(moe_context& ctx, const int32_t* tokens, const int32_t* positions, int32_t n_tokens, bool logits_all);

}  // namespace moe
