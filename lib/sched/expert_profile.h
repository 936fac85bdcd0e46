// Expert activation profiles: how many tokens selected each expert of each layer, written by one run
// (moe_context_save_expert_profile, moeinfer-bench --expert-profile) and read by the next to choose the
// experts that stay resident in device memory (sched/expert_placement.h).
//
// The file is text, one record per line, fields separated by single spaces:
//   moeinfer-expert-profile 1          magic and format version
//   arch qwen3moe                      general.architecture of the model
//   n_layer 48                         the model's shape: a profile of another model is refused
//   n_expert 128
//   n_expert_used 8
//   layer 0 C_0 C_1 ... C_{n_expert-1} one line per layer, in order: decimal token counts
//   ...
//   end
// Anything after "end" is ignored; nothing else may appear before it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace moe::sched {

constexpr int kExpertProfileVersion = 1;

struct ExpertProfile {
    std::string arch;
    int n_layer = 0;
    int n_expert = 0;
    int n_expert_used = 0;
    std::vector<uint64_t> counts;  // [n_layer * n_expert]: counts[layer * n_expert + expert]
};

// Writes `p` to `path` (replacing it). IO_ERROR names the path; INVALID_ARGUMENT when counts does not
// hold n_layer * n_expert values.
Status write_expert_profile(const std::string& path, const ExpertProfile& p);

// Reads the profile at `path` and checks it against the model's shape in `expected` (its counts are
// ignored). NOT_FOUND when the file does not exist, DATA_CORRUPT naming the line for a malformed file,
// UNIMPLEMENTED for another format version, INVALID_ARGUMENT naming the field when the profile was
// written for another model.
StatusOr<ExpertProfile> read_expert_profile(const std::string& path, const ExpertProfile& expected);

}  // namespace moe::sched
