// The loaded model behind the opaque moe_model handle.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/models/hparams.h"
#include "core/models/mla_split.h"
#include "text/vocab.h"

struct moe_model {
    std::string path;
    std::unique_ptr<moe::GgufFile> file;
    moe::HParams hparams;
    uint64_t n_bytes = 0;         // all tensor data
    uint64_t n_expert_bytes = 0;  // expert tensors of the layers run only
    std::unique_ptr<moe::text::Vocab> vocab;  // nullptr when the file has no tokenizer
    // Activation counts [n_layer * n_expert] of moe_model_set_expert_profile (empty: none), which the
    // placement of contexts created afterwards keeps resident by.
    std::vector<uint64_t> expert_profile;

    // Weights made from the file's (mla_split.h: ~2 GB for DeepSeek-V3 from a joint attn_kv_b, ~1 GB the
    // other way), made by the first context that binds the weights and shared by every context of the
    // model; read-only once made, freed with the model. Use derived_weights() (model.cpp), which makes them
    // once.
    std::mutex derived_mu;
    bool derived_made = false;                // guarded by derived_mu
    std::vector<moe::DerivedWeight> derived;  // written under derived_mu before derived_made; then constant
};

namespace moe {

// Opens, validates and summarises a GGUF model.
StatusOr<std::unique_ptr<moe_model>> load_model(const std::string& path, const moe_model_params& params);

// The model's derived weights, made on the first call (split_kv_b, join_kv_b); later calls, from any thread, get the
// same ones. An error is returned to every caller (the split is deterministic) and nothing is kept.
// Borrowed; valid until the model is freed.
StatusOr<const std::vector<DerivedWeight>*> derived_weights(moe_model& model);

}  // namespace moe
