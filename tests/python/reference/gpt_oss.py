"""gpt-oss (GPT-OSS-20B / 120B shape) reference forward, float64.

Per layer (HF GptOssDecoderLayer; llama.cpp llm_build_openai_moe_iswa):
  h = RMSNorm(x; attn_norm)
  q, k, v = Wq h + bq, Wk h + bk, Wv h + bv
  q, k = NeoX RoPE with YaRN frequencies; cos and sin scaled by 0.1*ln(factor)+1
  a = attention with GQA, scale 1/sqrt(head_dim), one learned sink logit per head in the softmax denominator,
      and on even layers (0, 2, ...) a sliding window: a query at p sees keys at positions in (p - window, p]
  x += Wo a + bo
  h = RMSNorm(x; post_attention_norm)
  l = W_router h + b_router; top-k of l; weights softmax over the k selected logits
  expert: g = Wg h + bg, u = Wu h + bu; g = min(g, 7); u = clip(u, -7, 7);
          y = Wd ((u + 1) * g * sigmoid(1.702 g)) + bd                 (SWIGLU_OAI)
  x += sum_e w_e y_e
logits = W_out RMSNorm(x; output_norm)
"""

from __future__ import annotations

import numpy as np

from .gguf_model import Model
from .ops import (KVCache, attention, check_tokens, default_inv_freq, linear, rms_norm, rope_neox, softmax,
                  start_pass, yarn_inv_freq)
from .routing import check_flip_layer, flip_at, logit_gaps, top_k_with_margin, trace_topk

ARCH = "gpt-oss"
SWIGLU_ALPHA = 1.702   # HF GptOssExperts.alpha / llama.cpp ggml_swiglu_oai alpha
SWIGLU_LIMIT = 7.0     # HF GptOssExperts.limit / llama.cpp ggml_swiglu_oai limit


def _check_arch(model: Model) -> None:
    if model.hparams.arch != ARCH:
        raise ValueError(f"gpt_oss.forward got a '{model.hparams.arch}' model")


def is_sliding_layer(il: int) -> bool:
    """HF layer_types default: 'sliding_attention' when (il + 1) % 2; llama.cpp set_swa_pattern(2): il % 2 < 1."""
    return il % 2 == 0


def rope_frequencies(model: Model, yarn_truncate: bool = False) -> tuple[np.ndarray, float]:
    """(inv_freq [n_rot/2], cos/sin scale) from rope.* metadata; YaRN when rope.scaling.type is 'yarn'.

    yarn_truncate=False is gpt-oss's HF config ("truncate": false, as OpenAI's own code and vLLM/SGLang);
    True reproduces ggml's rope_yarn_corr_dims (floor/ceil of the blend bounds).
    """
    hp = model.hparams
    kind = hp.rope_scaling_type
    if kind in (None, "none"):
        return default_inv_freq(hp.rope_freq_base, hp.n_rot), 1.0
    if kind != "yarn":
        raise ValueError(f"{ARCH}.rope.scaling.type '{kind}' is not supported by the reference (only 'yarn')")
    if hp.rope_scaling_factor is None or hp.rope_scaling_factor <= 0:
        raise ValueError(f"{ARCH}.rope.scaling.factor is missing or not positive for YaRN")
    if hp.rope_orig_ctx is None or hp.rope_orig_ctx <= 0:
        raise ValueError(f"{ARCH}.rope.scaling.original_context_length is missing or not positive for YaRN")
    attn_factor = model.metadata.get(f"{ARCH}.rope.scaling.attn_factor")
    if attn_factor is not None and float(attn_factor) != 1.0:
        raise ValueError(f"{ARCH}.rope.scaling.attn_factor={attn_factor} is not supported by the reference")
    return yarn_inv_freq(hp.rope_freq_base, hp.n_rot, hp.rope_scaling_factor, hp.rope_orig_ctx,
                         hp.yarn_beta_fast, hp.yarn_beta_slow, yarn_truncate)


def route(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
          flip: tuple[int, str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Router of layer il for normed hidden states h [n, n_embd]: (expert ids [n, k], weights [n, k]).

    With `trace`, appends 'expert_ids', 'expert_weights' and each token's routing margin, the gap between the k-th
    and (k+1)-th logit relative to the RMS of the logits (routing.logit_gaps), as 'topk_margin' and
    'router_margin' (the same: no group limit). `flip` (token, "topk"): that token takes the (k+1)-th expert
    instead of the k-th (tests/python/router_flips.py), the softmax taken over the new k logits.
    """
    hp = model.hparams
    if flip is not None and flip[1] != "topk":
        raise ValueError(f"flip decision must be 'topk' ({ARCH} has no group limit), got {flip[1]!r}")
    logits = linear(h, model.blk(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd)),
                    model.blk(il, "ffn_gate_inp.bias", (hp.n_expert,)))
    ids, margin = top_k_with_margin(logits, hp.n_expert_used, logit_gaps(logits), None if flip is None else flip[0])
    w = softmax(np.take_along_axis(logits, ids, axis=-1))
    trace_topk(trace, margin, ids, w)
    return ids, w


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = np.minimum(gate, SWIGLU_LIMIT)
    u = np.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (u + 1.0) * g / (1.0 + np.exp(-SWIGLU_ALPHA * g))


def moe(model: Model, il: int, h: np.ndarray, trace: dict | None = None,
        flip: tuple[int, str] | None = None) -> np.ndarray:
    """MoE block of layer il on normed hidden states h [n, n_embd] (experts with biases, SWIGLU_OAI); `trace` and
    `flip` as route's."""
    hp = model.hparams
    exp_shape, bias_shape = (hp.n_expert, hp.n_ff_exp, hp.n_embd), (hp.n_expert, hp.n_ff_exp)
    gate = model.blk(il, "ffn_gate_exps.weight", exp_shape)
    up = model.blk(il, "ffn_up_exps.weight", exp_shape)
    down = model.blk(il, "ffn_down_exps.weight", (hp.n_expert, hp.n_embd, hp.n_ff_exp))
    gate_b = model.blk(il, "ffn_gate_exps.bias", bias_shape)
    up_b = model.blk(il, "ffn_up_exps.bias", bias_shape)
    down_b = model.blk(il, "ffn_down_exps.bias", (hp.n_expert, hp.n_embd))
    ids, weights = route(model, il, h, trace, flip)
    out = np.zeros_like(h)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        x = h[rows]
        act = swiglu_oai(linear(x, gate[e], gate_b[e]), linear(x, up[e], up_b[e]))
        out[rows] += weights[rows, slot][:, None] * linear(act, down[e], down_b[e])
    return out


def forward(model: Model, tokens, positions=None, cache: KVCache | None = None, trace: dict | None = None,
            yarn_truncate: bool = False, flip: tuple[int, int, str] | None = None) -> np.ndarray:
    """Logits [n_tokens, n_vocab] (float64) for `tokens`, attending to `cache` (extended in place).

    positions default to the positions after the cached ones. `trace`, if given, receives per-layer lists
    'layer_out' (hidden state after the layer), 'attn_out' (attention block output before the residual add),
    'expert_ids' / 'expert_weights' and the router margins route() adds. yarn_truncate: see rope_frequencies.
    `flip` (layer, token, "topk"): that token takes the runner-up expert in that layer (route).
    """
    _check_arch(model)
    hp = model.hparams
    check_flip_layer(flip, 0, hp.n_layer)
    if hp.sliding_window is None:
        raise ValueError(f"{ARCH}.attention.sliding_window is missing")
    tokens = check_tokens(tokens, hp.n_vocab)
    n = tokens.shape[0]
    cache, pos = start_pass(cache, hp.n_layer, n, positions)
    k_pos = cache.key_positions(pos)
    inv_freq, rope_scale = rope_frequencies(model, yarn_truncate)
    scale = 1.0 / np.sqrt(hp.head_dim)
    q_dim, kv_dim, v_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_head_kv * hp.head_dim_v
    o_dim = hp.n_head * hp.head_dim_v

    x = model.get("token_embd.weight", (hp.n_vocab, hp.n_embd))[tokens]
    for il in range(hp.n_layer):
        h = rms_norm(x, model.blk(il, "attn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        q = linear(h, model.blk(il, "attn_q.weight", (q_dim, hp.n_embd)), model.blk(il, "attn_q.bias", (q_dim,)))
        k = linear(h, model.blk(il, "attn_k.weight", (kv_dim, hp.n_embd)), model.blk(il, "attn_k.bias", (kv_dim,)))
        v = linear(h, model.blk(il, "attn_v.weight", (v_dim, hp.n_embd)), model.blk(il, "attn_v.bias", (v_dim,)))
        q = rope_neox(q.reshape(n, hp.n_head, hp.head_dim), pos, inv_freq, rope_scale)
        k = rope_neox(k.reshape(n, hp.n_head_kv, hp.head_dim), pos, inv_freq, rope_scale)
        v = v.reshape(n, hp.n_head_kv, hp.head_dim_v)
        k_all, v_all = cache.extend(il, k, v)
        window = hp.sliding_window if is_sliding_layer(il) else None
        sinks = model.blk(il, "attn_sinks.weight", (hp.n_head,))
        a = attention(q, k_all, v_all, pos, k_pos, scale, window=window, sinks=sinks).reshape(n, o_dim)
        a = linear(a, model.blk(il, "attn_output.weight", (hp.n_embd, o_dim)),
                   model.blk(il, "attn_output.bias", (hp.n_embd,)))
        x = x + a

        h = rms_norm(x, model.blk(il, "post_attention_norm.weight", (hp.n_embd,)), hp.rms_eps)
        x = x + moe(model, il, h, trace, flip_at(flip, il))
        if trace is not None:
            trace.setdefault("attn_out", []).append(a)
            trace.setdefault("layer_out", []).append(x.copy())
    cache.commit(pos)

    x = rms_norm(x, model.get("output_norm.weight", (hp.n_embd,)), hp.rms_eps)
    return linear(x, model.output_weight())
