"""glm4moe (GLM-4.5 / 4.6 / 4.5-Air) reference forward, float64.

Written from Hugging Face transformers' modeling_glm4_moe.py (Glm4MoeAttention, Glm4MoeTopkRouter, Glm4MoeMoE,
Glm4MoeMLP) with llama.cpp's GGUF names (llama_model_glm4_moe). Per layer:
  h = RMSNorm(x; attn_norm)
  q, k, v = Wq h + bq, Wk h + bk, Wv h + bv                (attention_bias)
  q, k = per-head RMSNorm over head_dim where the file has attn_q_norm / attn_k_norm (use_qk_norm: GLM-4.5)
  q, k = NeoX RoPE on the first rope.dimension_count dims of each head (partial_rotary_factor), the rest as is
  a = softmax(q k^T / sqrt(head_dim), causal) v with GQA;   x += Wo a     (no output bias)
  h = RMSNorm(x; post_attention_norm)
  the first leading_dense_block_count layers:  x += down(silu(gate h) * up h)
  the others:  s = sigmoid(W_router h);  experts = top-k of s + e_score_correction_bias (exp_probs_b; n_group 1:
               no group limit, as every released config)
               w = s[experts] / (sum s[experts] + 1e-20) (norm_topk_prob) * routed_scaling_factor
               x += sum_e w_e * down_e(silu(gate_e h) * up_e h) + shared(h)   (shared: a SwiGLU MLP of
               n_ff_exp * expert_shared_count)
logits = W_out RMSNorm(x; output_norm). The file's trailing NextN layers (nextn_predict_layers) are not run.
"""

from __future__ import annotations

import numpy as np

from .gguf_model import Model
from .ops import KVCache, linear
from .qwen3moe import forward_layers, routed_experts, swiglu
from .routing import check_flip_layer, expert_weights, flip_at, router_gaps, sigmoid, top_k_with_margin, trace_topk

ARCH = "glm4moe"


def _meta(model: Model, key: str, default):
    return model.metadata.get(f"{ARCH}.{key}", default)


def _check_arch(model: Model) -> None:
    if model.hparams.arch != ARCH:
        raise ValueError(f"glm4moe.forward got a '{model.hparams.arch}' model")
    if model.hparams.rope_scaling_type not in (None, "none"):
        raise ValueError(f"{ARCH}.rope.scaling.type '{model.hparams.rope_scaling_type}' is not supported "
                         "by the glm4moe reference")
    if int(_meta(model, "expert_gating_func", 2)) not in (0, 2):
        raise ValueError(f"{ARCH}.expert_gating_func must be 2 (sigmoid)")


def selection_scores(model: Model, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sigmoid scores, scores + selection bias) of layer il's router for normed hidden states h, each [n, n_expert]."""
    hp = model.hparams
    scores = sigmoid(linear(h, model.blk(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd))))
    return scores, scores + model.blk(il, "exp_probs_b.bias", (hp.n_expert,))


def route(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
          flip: tuple[int, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Router of layer il for normed hidden states h [n, n_embd]: (expert ids [n, k], weights [n, k]).

    With `trace`, appends each token's routing margin, the gap between the k-th and (k+1)-th selection value
    relative to their RMS (routing.router_gaps), as 'topk_margin' and 'router_margin' (the same: no group limit).
    `flip` (token, "topk"): that token takes the (k+1)-th expert instead of the k-th, as deepseek2.route's.
    """
    hp = model.hparams
    if flip is not None and flip[1] != "topk":
        raise ValueError(f"flip decision must be 'topk' (glm4moe has no group limit), got {flip[1]!r}")
    scores, choice = selection_scores(model, il, h)
    ids, margin = top_k_with_margin(choice, hp.n_expert_used, router_gaps(None, choice, sigmoid=True),
                                    None if flip is None else flip[0])
    w = expert_weights(scores, ids, bool(_meta(model, "expert_weights_norm", False)),
                       float(_meta(model, "expert_weights_scale", 1.0)))
    trace_topk(trace, margin, ids, w)
    return ids, w


def moe(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
        flip: tuple[int, str] | None = None) -> np.ndarray:
    """Routed experts plus the shared experts of layer il on normed hidden states h [n, n_embd]."""
    hp = model.hparams
    ids, weights = route(model, il, h, trace, flip)
    out = routed_experts(model, il, h, ids, weights)
    n_shared = int(_meta(model, "expert_shared_count", 0))
    if n_shared > 0:
        ff = hp.n_ff_exp * n_shared
        out += swiglu(h, model.blk(il, "ffn_gate_shexp.weight", (ff, hp.n_embd)),
                      model.blk(il, "ffn_up_shexp.weight", (ff, hp.n_embd)),
                      model.blk(il, "ffn_down_shexp.weight", (hp.n_embd, ff)))
    return out


def dense(model: Model, il: int, h: np.ndarray) -> np.ndarray:
    hp = model.hparams
    ff = int(_meta(model, "feed_forward_length", 0))
    return swiglu(h, model.blk(il, "ffn_gate.weight", (ff, hp.n_embd)), model.blk(il, "ffn_up.weight", (ff, hp.n_embd)),
                  model.blk(il, "ffn_down.weight", (hp.n_embd, ff)))


def forward(model: Model, tokens, positions=None, cache: KVCache | None = None,
            trace: dict | None = None, flip: tuple[int, int, str] | None = None) -> np.ndarray:
    """Logits [n_tokens, n_vocab] (float64) for `tokens`, attending to `cache` (extended in place).

    positions default to the positions after the cached ones. `trace`, if given, receives per-layer lists
    'layer_out' (hidden state after the layer) and, MoE layers only, 'expert_ids' / 'expert_weights' and the
    router margins route() adds. `flip` (layer, token, "topk"): that token takes the runner-up expert in that
    layer (route). The layer stack is qwen3moe's (forward_layers) with attention biases, q/k norms where the file
    has them, and the dense FFN or the MoE block after post_attention_norm.
    """
    _check_arch(model)
    n_dense = int(_meta(model, "leading_dense_block_count", 0))

    check_flip_layer(flip, n_dense, model.hparams.n_layer)

    def ffn(il, h, tr):
        if il < n_dense:
            return dense(model, il, h)
        return moe(model, il, h, tr, flip_at(flip, il))

    return forward_layers(model, tokens, positions, cache, trace, "post_attention_norm.weight", ffn, qk_norm=None,
                          biases=True)
