// Synthetic MoE models: valid GGUF files with the real shapes of Qwen3-30B-A3B (qwen3moe) and
// GPT-OSS-20B/120B (gpt-oss), random weights that route like a trained model, written streaming.
// The C API (moe_synth_params_init / moe_synth_write) is a thin wrapper over these two functions.
//
// Weights (U = zero-mean uniform of the given std; synth_weights.cpp):
//   token_embd             U std 1 per element: the embeddings dominate the residual stream
//   attn_q/k/v, output,    U std 1/sqrt(fan_in) (fan_in = ne[0]): unit-rms inputs give unit-rms outputs
//     ffn_gate/up_exps
//   attn_output,           U std 0.2/sqrt(fan_in): each layer adds a small fraction to the residual
//     ffn_down_exps          (measured: the residual rms grows from 1.0 to ~1.1-1.2 over 24 layers)
//   norms                  1 + U(-0.1, 0.1);  biases U std 0.02;  attn_sinks U std 0.5
//   ffn_gate_inp (router)  rows of unit L2 norm: for a normalised input every logit is ~N(0, 1) and the
//                          experts' logits are nearly independent, so top-k spreads tokens evenly
// Routing skew s in [0, 1): the expert of popularity rank r (of n) gets the logit offset
//   -5 * s * r / (n - 1); ranks are a seeded permutation per layer (cold experts are scattered).
//   gpt-oss carries it in ffn_gate_inp.bias. qwen3moe has no router bias, so channel 0 of every token
//   embedding is a constant 1 and router row e holds expert e's offset in channel 0 (the rest of the
//   row has unit norm); the offset then reaches every token's logit, scaled by that layer's norm
//   weight of channel 0 (1 +/- 0.1). At s = 0.9 the coldest quarter of the experts gets < 1% of the
//   tokens (tests/python/test_synth_gguf.py measures it).
// Every (tensor, chunk of rows) draws from its own splitmix64 stream seeded by (seed, tensor name,
// chunk index), so the bytes do not depend on the thread count.
#pragma once

#include <string>

#include "core/status.h"
#include "moeinfer/moeinfer.h"

namespace moe {

// Fills *p (all of it; sets struct_size) with the defaults of `arch` ("qwen3moe" or "gpt-oss";
// nullptr means "qwen3moe"). INVALID_ARGUMENT for an unknown architecture or a null p.
Status synth_params_init(moe_synth_params* p, const char* arch);

// Writes the model to `path` (through `path + ".tmp"`, renamed at the end; removed on failure).
// Reads only the fields inside p.struct_size. Deterministic: the same parameters give the same
// bytes whatever the thread count. Errors: INVALID_ARGUMENT naming the bad field, IO_ERROR,
// CANCELLED when p.progress returns 0.
Status synth_write(const std::string& path, const moe_synth_params& p);

}  // namespace moe
