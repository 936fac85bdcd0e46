// Weight placement at context creation: which weights live in device memory and which stay in host
// RAM, from llama.cpp-style tensor overrides, n_cpu_moe, n_gpu_layers and a VRAM budget.
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "core/status.h"

namespace moe::sched {

enum class Side : uint8_t { HOST = 0, DEVICE = 1 };
constexpr int kSides = 2;
inline const char* side_name(Side s) { return s == Side::HOST ? "host" : "device"; }

struct OverrideRule {
    std::string pattern;
    std::regex regex;
    Side side;
    // For Side::DEVICE: the index of the device in the context's device list (CUDAn), or -1 for the
    // device of the tensor's layer (GPU, CUDA, DEVICE).
    int device = -1;
};

// Parses "regex=BACKEND[,regex=BACKEND...]" (llama.cpp -ot). BACKEND: CPU for host RAM; GPU, CUDA or
// DEVICE for the memory of the device that holds the tensor's layer; CUDAn for device n of the
// context's device list (CUDA0 is the only device of a one-device context); case-insensitive.
// INVALID_ARGUMENT names a bad entry (whether device n exists is the context's to check).
StatusOr<std::vector<OverrideRule>> parse_overrides(const std::string& spec);

struct WeightDesc {
    std::string name;  // GGUF tensor name
    uint64_t bytes = 0;
};

struct PlacementParams {
    std::vector<OverrideRule> overrides;
    int n_layer = 0;
    int n_cpu_moe = 0;
    int n_gpu_layers = -1;     // -1: all
    uint64_t vram_budget = 0;  // bytes of device memory for weights (0: nothing fits)
};

// The model layer of a "blk.N.*" tensor name, or -1.
int layer_of(const std::string& name);
// Whether a tensor holds experts (weights or biases): llama.cpp names them "*_exps.*".
bool is_expert_tensor(const std::string& name);

// Side per weight (same order). RESOURCE_EXHAUSTED when the device share cannot fit vram_budget even
// with every expert tensor not pinned by an override moved to host RAM.
StatusOr<std::vector<Side>> place_weights(const std::vector<WeightDesc>& weights, const PlacementParams& params);

}  // namespace moe::sched
