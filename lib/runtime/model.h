// The loaded model behind the opaque moe_model handle.
#pragma once

#include <memory>
#include <string>

#include "core/gguf.h"
#include "core/models/hparams.h"
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
};

namespace moe {

// Opens, validates and summarises a GGUF model.
StatusOr<std::unique_ptr<moe_model>> load_model(const std::string& path, const moe_model_params& params);

}  // namespace moe
