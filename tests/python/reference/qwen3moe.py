"""qwen3moe (Qwen3-30B-A3B / 235B-A22B shape) reference forward, float64.

Per layer (HF Qwen3MoeDecoderLayer; llama.cpp llm_build_qwen3moe):
  h = RMSNorm(x; attn_norm)
  q, k, v = Wq h, Wk h, Wv h                    (no biases)
  q, k = per-head RMSNorm over head_dim (attn_q_norm / attn_k_norm), then NeoX RoPE with rope.freq_base
  a = softmax(q k^T / sqrt(head_dim), causal) v with GQA;   x += Wo a
  h = RMSNorm(x; ffn_norm)
  p = softmax(W_router h) over all experts; top-k; weights p_top / sum(p_top)   (norm_topk_prob)
  x += sum_e w_e * down_e(silu(gate_e h) * up_e h)
logits = W_out RMSNorm(x; output_norm)
"""

from __future__ import annotations

import numpy as np

from .gguf_model import Model
from .ops import (KVCache, attention, check_tokens, default_inv_freq, linear, rms_norm, rope_neox, softmax,
                  start_pass, top_k_desc)

ARCH = "qwen3moe"


def _check_arch(model: Model) -> None:
    if model.hparams.arch != ARCH:
        raise ValueError(f"qwen3moe.forward got a '{model.hparams.arch}' model")
    if model.hparams.rope_scaling_type not in (None, "none"):
        # Qwen3 may ship YaRN for long context; the reference models plain RoPE only, so refuse to guess.
        raise ValueError(f"{ARCH}.rope.scaling.type '{model.hparams.rope_scaling_type}' is not supported "
                         "by the qwen3moe reference")


def route(model: Model, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Router of layer il for normed hidden states h [n, n_embd]: (expert ids [n, k], weights [n, k])."""
    hp = model.hparams
    probs = softmax(linear(h, model.blk(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd))))
    ids = top_k_desc(probs, hp.n_expert_used)
    w = np.take_along_axis(probs, ids, axis=-1)
    return ids, w / np.sum(w, axis=-1, keepdims=True)


def moe(model: Model, il: int, h: np.ndarray, trace: dict | None = None) -> np.ndarray:
    """Sparse MoE block of layer il on normed hidden states h [n, n_embd]."""
    hp = model.hparams
    exp_shape = (hp.n_expert, hp.n_ff_exp, hp.n_embd)
    gate = model.blk(il, "ffn_gate_exps.weight", exp_shape)
    up = model.blk(il, "ffn_up_exps.weight", exp_shape)
    down = model.blk(il, "ffn_down_exps.weight", (hp.n_expert, hp.n_embd, hp.n_ff_exp))
    ids, weights = route(model, il, h)
    if trace is not None:
        trace.setdefault("expert_ids", []).append(ids)
        trace.setdefault("expert_weights", []).append(weights)
    out = np.zeros_like(h)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        x = h[rows]
        g = linear(x, gate[e])
        act = g / (1.0 + np.exp(-g)) * linear(x, up[e])      # silu(gate) * up
        out[rows] += weights[rows, slot][:, None] * linear(act, down[e])
    return out


def forward(model: Model, tokens, positions=None, cache: KVCache | None = None,
            trace: dict | None = None) -> np.ndarray:
    """Logits [n_tokens, n_vocab] (float64) for `tokens`, attending to `cache` (extended in place).

    positions default to the positions after the cached ones. `trace`, if given, receives per-layer lists
    'layer_out' (hidden state after the layer) and 'expert_ids' / 'expert_weights'.
    """
    _check_arch(model)
    hp = model.hparams
    tokens = check_tokens(tokens, hp.n_vocab)
    n = tokens.shape[0]
    cache, pos = start_pass(cache, hp.n_layer, n, positions)
    k_pos = cache.key_positions(pos)
    inv_freq = default_inv_freq(hp.rope_freq_base, hp.n_rot)
    scale = 1.0 / np.sqrt(hp.head_dim)
    q_dim, kv_dim, v_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_head_kv * hp.head_dim_v

    x = model.get("token_embd.weight", (hp.n_vocab, hp.n_embd))[tokens]
    for il in range(hp.n_layer):
        h = rms_norm(x, model.blk(il, "attn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        q = linear(h, model.blk(il, "attn_q.weight", (q_dim, hp.n_embd))).reshape(n, hp.n_head, hp.head_dim)
        k = linear(h, model.blk(il, "attn_k.weight", (kv_dim, hp.n_embd))).reshape(n, hp.n_head_kv, hp.head_dim)
        v = linear(h, model.blk(il, "attn_v.weight", (v_dim, hp.n_embd))).reshape(n, hp.n_head_kv, hp.head_dim_v)
        q = rms_norm(q, model.blk(il, "attn_q_norm.weight", (hp.head_dim,)), hp.rms_eps)
        k = rms_norm(k, model.blk(il, "attn_k_norm.weight", (hp.head_dim,)), hp.rms_eps)
        q = rope_neox(q, pos, inv_freq)
        k = rope_neox(k, pos, inv_freq)
        k_all, v_all = cache.extend(il, k, v)
        a = attention(q, k_all, v_all, pos, k_pos, scale).reshape(n, hp.n_head * hp.head_dim_v)
        x = x + linear(a, model.blk(il, "attn_output.weight", (hp.n_embd, hp.n_head * hp.head_dim_v)))

        h = rms_norm(x, model.blk(il, "ffn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        x = x + moe(model, il, h, trace)
        if trace is not None:
            trace.setdefault("layer_out", []).append(x.copy())
    cache.commit(pos)

    x = rms_norm(x, model.get("output_norm.weight", (hp.n_embd,)), hp.rms_eps)
    return linear(x, model.output_weight())
