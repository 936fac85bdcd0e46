"""qwen3moe (Qwen3-30B-A3B / 235B-A22B shape) reference forward, float64.

Per layer (HF Qwen3MoeDecoderLayer; llama.cpp llm_build_qwen3moe):
  h = RMSNorm(x; attn_norm)
  q, k, v = Wq h, Wk h, Wv h                    (no biases)
  q, k = per-head RMSNorm over head_dim (attn_q_norm / attn_k_norm), then NeoX RoPE with rope.freq_base
  a = softmax(q k^T / sqrt(head_dim), causal) v with GQA;   x += Wo a
  h = RMSNorm(x; ffn_norm)
  p = softmax(W_router h) over all experts; top-k; weights p_top / sum(p_top)   (norm_topk_prob, as every released
      Qwen3 MoE config; llama.cpp and moeinfer always renormalise, reading no GGUF key for it)
  x += sum_e w_e * down_e(silu(gate_e h) * up_e h)
logits = W_out RMSNorm(x; output_norm)
"""

from __future__ import annotations

import numpy as np

from .gguf_model import Model
from .ops import (KVCache, attention, check_tokens, default_inv_freq, linear, rms_norm, rope_neox, softmax,
                  start_pass)
from .routing import check_flip_layer, flip_at, router_gaps, top_k_with_margin, trace_topk

ARCH = "qwen3moe"


def _check_arch(model: Model) -> None:
    if model.hparams.arch != ARCH:
        raise ValueError(f"qwen3moe.forward got a '{model.hparams.arch}' model")
    if model.hparams.rope_scaling_type not in (None, "none"):
        # Qwen3 may ship YaRN for long context; the reference models plain RoPE only, so refuse to guess.
        raise ValueError(f"{ARCH}.rope.scaling.type '{model.hparams.rope_scaling_type}' is not supported "
                         "by the qwen3moe reference")


def route(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
          flip: tuple[int, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Router of layer il for normed hidden states h [n, n_embd]: (expert ids [n, k], weights [n, k]).

    With `trace`, appends 'expert_ids', 'expert_weights' and each token's routing margin, the gap between the k-th
    and (k+1)-th log-probability (their logits' gap) relative to the RMS of the logits (routing.router_gaps), as
    'topk_margin' and 'router_margin' (the same: no group limit). `flip` (token, "topk"): that token takes the
    (k+1)-th expert instead of the k-th (tests/python/router_flips.py), its weights renormalised over the new k.
    """
    hp = model.hparams
    if flip is not None and flip[1] != "topk":
        raise ValueError(f"flip decision must be 'topk' ({ARCH} has no group limit), got {flip[1]!r}")
    logits = linear(h, model.blk(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd)))
    probs = softmax(logits)
    ids, margin = top_k_with_margin(probs, hp.n_expert_used, router_gaps(logits, probs, sigmoid=False),
                                    None if flip is None else flip[0])
    w = np.take_along_axis(probs, ids, axis=-1)
    w = w / np.sum(w, axis=-1, keepdims=True)
    trace_topk(trace, margin, ids, w)
    return ids, w


def swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """down(silu(gate x) * up x)."""
    g = linear(x, gate)
    return linear(g / (1.0 + np.exp(-g)) * linear(x, up), down)


def routed_experts(model: Model, il: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum over each token's chosen experts e of weights * down_e(silu(gate_e h) * up_e h), layer il's expert
    tensors (shared by the SwiGLU-expert architectures)."""
    hp = model.hparams
    exp_shape = (hp.n_expert, hp.n_ff_exp, hp.n_embd)
    gate = model.blk(il, "ffn_gate_exps.weight", exp_shape)
    up = model.blk(il, "ffn_up_exps.weight", exp_shape)
    down = model.blk(il, "ffn_down_exps.weight", (hp.n_expert, hp.n_embd, hp.n_ff_exp))
    out = np.zeros_like(h)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        out[rows] += weights[rows, slot][:, None] * swiglu(h[rows], gate[e], up[e], down[e])
    return out


def moe(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
        flip: tuple[int, str] | None = None) -> np.ndarray:
    """Sparse MoE block of layer il on normed hidden states h [n, n_embd]; `trace` and `flip` as route's."""
    ids, weights = route(model, il, h, trace, flip)
    return routed_experts(model, il, h, ids, weights)


def attention_block(model: Model, il: int, h: np.ndarray, pos: np.ndarray, k_pos: np.ndarray, cache: KVCache,
                    inv_freq: np.ndarray, qk_norm: bool | None, biases: bool) -> np.ndarray:
    """Layer il's GQA self-attention on normed h [n, n_embd], its output projection applied: q/k/v products (+ their
    biases when `biases`), per-head q/k RMSNorm (qk_norm None: where the file has attn_q_norm), NeoX RoPE of the
    first n_rot dims, causal softmax(q k^T / sqrt(head_dim)) v over `cache` (extended in place)."""
    hp = model.hparams
    n, D, Dv, H, Hkv = h.shape[0], hp.head_dim, hp.head_dim_v, hp.n_head, hp.n_head_kv

    def proj(name, rows):
        b = model.blk(il, f"{name}.bias", (rows,)) if biases else None
        return linear(h, model.blk(il, f"{name}.weight", (rows, hp.n_embd)), b)

    q = proj("attn_q", H * D).reshape(n, H, D)
    k = proj("attn_k", Hkv * D).reshape(n, Hkv, D)
    v = proj("attn_v", Hkv * Dv).reshape(n, Hkv, Dv)
    if qk_norm or (qk_norm is None and model.has(f"blk.{il}.attn_q_norm.weight")):
        q = rms_norm(q, model.blk(il, "attn_q_norm.weight", (D,)), hp.rms_eps)
        k = rms_norm(k, model.blk(il, "attn_k_norm.weight", (D,)), hp.rms_eps)
    q = rope_neox(q, pos, inv_freq)
    k = rope_neox(k, pos, inv_freq)
    k_all, v_all = cache.extend(il, k, v)
    a = attention(q, k_all, v_all, pos, k_pos, 1.0 / np.sqrt(D)).reshape(n, H * Dv)
    return linear(a, model.blk(il, "attn_output.weight", (hp.n_embd, H * Dv)))


def forward_layers(model: Model, tokens, positions, cache: KVCache | None, trace: dict | None, ffn_norm: str,
                   ffn, qk_norm: bool | None, biases: bool) -> np.ndarray:
    """The pre-norm decoder stack of qwen3moe-like architectures: per layer x += attention_block(RMSNorm(x;
    attn_norm)), x += ffn(il, RMSNorm(x; ffn_norm), trace); logits = W_out RMSNorm(x; output_norm). Appends each
    layer's output to trace['layer_out']."""
    hp = model.hparams
    tokens = check_tokens(tokens, hp.n_vocab)
    n = tokens.shape[0]
    cache, pos = start_pass(cache, hp.n_layer, n, positions)
    k_pos = cache.key_positions(pos)
    inv_freq = default_inv_freq(hp.rope_freq_base, hp.n_rot)

    x = model.get("token_embd.weight", (hp.n_vocab, hp.n_embd))[tokens]
    for il in range(hp.n_layer):
        h = rms_norm(x, model.blk(il, "attn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        x = x + attention_block(model, il, h, pos, k_pos, cache, inv_freq, qk_norm, biases)
        h = rms_norm(x, model.blk(il, ffn_norm, (hp.n_embd,)), hp.rms_eps)
        x = x + ffn(il, h, trace)
        if trace is not None:
            trace.setdefault("layer_out", []).append(x.copy())
    cache.commit(pos)

    x = rms_norm(x, model.get("output_norm.weight", (hp.n_embd,)), hp.rms_eps)
    return linear(x, model.output_weight())


def forward(model: Model, tokens, positions=None, cache: KVCache | None = None,
            trace: dict | None = None, flip: tuple[int, int, str] | None = None) -> np.ndarray:
    """Logits [n_tokens, n_vocab] (float64) for `tokens`, attending to `cache` (extended in place).

    positions default to the positions after the cached ones. `trace`, if given, receives per-layer lists
    'layer_out' (hidden state after the layer), 'expert_ids' / 'expert_weights' and the router margins route()
    adds. `flip` (layer, token, "topk"): that token takes the runner-up expert in that layer (route).
    """
    _check_arch(model)
    check_flip_layer(flip, 0, model.hparams.n_layer)
    return forward_layers(model, tokens, positions, cache, trace, "ffn_norm.weight",
                          lambda il, h, tr: moe(model, il, h, tr, flip_at(flip, il)), qk_norm=True, biases=False)
