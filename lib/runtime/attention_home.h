// Layers whose attention the device backend cannot compute. A device's attention kernels cover some
// head sizes only (CUDA: 32, 64, 96, 128, 192, 256 and the MLA latent's 576); on a model with another (the
// tiny synthetic preset's 16) a device context used to fail at its first decode ("the CUDA backend
// cannot compute ATTENTION"). Instead, such a model keeps every layer's attention anchor (the weight
// whose home decides where the KV cache lives, and with it the cache writes and ATTENTION) in host
// RAM: the scheduler then runs the attention on the host, and the projections around it where their
// weights are.
#pragma once

#include <vector>

#include "core/backend.h"
#include "core/models/hparams.h"
#include "core/models/model_graph.h"
#include "sched/placement.h"

namespace moe {

// Whether `device` computes the ATTENTION of this model's layers (an F16 KV cache, as contexts keep).
bool device_computes_attention(const HParams& hp, const Backend& device);

// Override rules to put ahead of the user's: every layer's attention anchor in host RAM when `device`
// cannot compute the model's ATTENTION; none when it can.
std::vector<sched::OverrideRule> host_attention_overrides(const HParams& hp, const ModelWeights& weights,
                                                          const Backend& device);

}  // namespace moe
