"""deepseek2 (DeepSeek-V2/V3/R1, Kimi-K2) reference forward, float64, in the non-absorbed form.

Per layer (HF modeling_deepseek.py of deepseek-ai/DeepSeek-V3 and -V2: DeepseekV3Attention, MoEGate,
DeepseekV3MoE; GGUF names as llama.cpp's deepseek2):
  h = RMSNorm(x; attn_norm)
  q = W_qb RMSNorm(W_qa h; attn_q_a_norm)  (V2-Lite: q = W_q h);  per head q = [q_nope (Dn), q_pe (R)]
  [c, k_pe] = W_kva h;  c = RMSNorm(c; attn_kv_a_norm)     (c: kv_lora_rank, k_pe: R, shared by the heads)
  per head: k_nope = W_UK c, v = W_UV c                      (kv_b_proj; GGUF attn_k_b / attn_v_b)
  q_pe, k_pe: RoPE on de-interleaved pairs (HF permutes (d/2, 2) -> (2, d/2), then rotate_half), YaRN with
    DeepSeek's correction range (floor / ceil) and cos / sin unscaled (mscale / mscale_all_dim = 1)
  a = softmax([q_nope, q_pe] . [k_nope, k_pe] * scale, causal) v;  x += W_o a
    scale = (1 + yarn_log_multiplier * ln(factor))^2 / sqrt(Dn + R)   (HF: mscale_all_dim, yarn_get_mscale)
  h = RMSNorm(x; ffn_norm)
  leading dense layers: x += W_down (silu(W_gate h) * W_up h)
  others: x += routed experts + shared experts (one SwiGLU of n_ff_exp * expert_shared_count)
    router V3 / Kimi-K2 (sigmoid): s = sigmoid(W_r h); choice = s + exp_probs_b; group score = sum of the
      group's two best choices; V2 (softmax): s = softmax(W_r h), choice = s, group score = max of the group.
      Only the expert_group_used_count best groups compete; top-k of the choice; weights = s of the chosen,
      divided by their sum when expert_weights_norm, times expert_weights_scale.
logits = W_out RMSNorm(x; output_norm)

The cache holds what moeinfer's holds: per token the normalised latent c and the rotated k_pe (here as the
"k" and "v" of ops.KVCache, so the F16 test cache rounds exactly those), and the keys and values of the
heads are recomputed from them: the C++ absorbed attention (decode) and its prompts' form (keys and values
up-projected per head and held in F16: f16_heads) are checked against the plain formula.

Differences from HF, both where no released config reaches them: HF fills the experts of dropped groups
with 0.0 before the top-k, here (as llama.cpp) with -inf (the same whenever the kept groups hold k positive
choices); HF V2 scales the weights only when it does not normalise them, here (as V3 and llama.cpp) the
weights are normalised and then scaled (the same for every V2 config: norm_topk_prob false).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .gguf_model import Model
from .ops import KVCache, attention, check_tokens, default_inv_freq, linear, rms_norm, rope_neox, softmax, \
    start_pass, top_k_desc, yarn_inv_freq
from .qwen3moe import routed_experts, swiglu
from .routing import expert_weights, router_gaps, sigmoid, top_k_with_margin

ARCH = "deepseek2"
# How a softmax-gated (V2) router scores an expert group: "max", its best expert (HF DeepSeek-V2 MoEGate,
# topk_method "group_limited_greedy"), or "top2_sum", V3's sum of its two best, which llama.cpp (0c1e570,
# build_moe_ffn) applies to every deepseek2 file; tests set it to compare with llama.cpp.
SOFTMAX_GROUP_SCORE = "max"


@dataclasses.dataclass(frozen=True)
class MlaParams:
    """The deepseek2 keys the generic HParams does not hold (names as llama.cpp's LLM_KV_*)."""

    q_lora_rank: int            # 0: a plain attn_q
    kv_lora_rank: int
    n_rot: int                  # qk_rope_head_dim
    n_nope: int                 # qk_nope_head_dim
    head_dim_v: int
    n_dense: int                # leading_dense_block_count
    n_ff: int                   # feed_forward_length (dense layers)
    n_shared: int
    sigmoid: bool               # expert_gating_func == 2
    weights_norm: bool
    weights_scale: float
    n_group: int
    n_group_used: int
    yarn_factor: float          # 1: no YaRN
    yarn_orig_ctx: int
    yarn_log_mul: float
    yarn_beta_fast: float
    yarn_beta_slow: float


def mla_params(model: Model) -> MlaParams:
    md, a = model.metadata, ARCH + "."

    def get(key, default=None):
        if a + key in md:
            return md[a + key]
        if default is None:
            raise ValueError(f"metadata key '{a}{key}' is missing")
        return default

    kv_lora = int(get("attention.kv_lora_rank"))
    n_rot = int(get("rope.dimension_count"))
    # Split files: key_length = kv_lora + rope, the per-head sizes in the _mla keys.
    k_len = int(get("attention.key_length_mla", get("attention.key_length")))
    v_len = int(get("attention.value_length_mla", get("attention.value_length")))
    yarn = get("rope.scaling.type", "none") == "yarn"
    return MlaParams(
        q_lora_rank=int(get("attention.q_lora_rank", 0)),
        kv_lora_rank=kv_lora,
        n_rot=n_rot,
        n_nope=k_len - n_rot,
        head_dim_v=v_len,
        n_dense=int(get("leading_dense_block_count", 0)),
        n_ff=int(get("feed_forward_length", 0)),
        n_shared=int(get("expert_shared_count")),
        sigmoid=int(get("expert_gating_func", 1)) == 2,
        weights_norm=bool(get("expert_weights_norm", False)),
        weights_scale=float(get("expert_weights_scale", 1.0)),
        n_group=int(get("expert_group_count", 1)),
        n_group_used=int(get("expert_group_used_count", 1)),
        yarn_factor=float(get("rope.scaling.factor", 1.0)) if yarn else 1.0,
        yarn_orig_ctx=int(get("rope.scaling.original_context_length", 0)) if yarn else 0,
        yarn_log_mul=float(get("rope.scaling.yarn_log_multiplier", 0.0)),
        yarn_beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
        yarn_beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)),
    )


def rope_deepseek(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """HF deepseek apply_rotary_pos_emb: de-interleave the pairs ((d/2, 2) -> (2, d/2)), then NeoX RoPE.

    The result stays in the de-interleaved order; queries and keys share it, so their products do not.
    """
    n, h, d = x.shape
    x = x.reshape(n, h, d // 2, 2).transpose(0, 1, 3, 2).reshape(n, h, d)
    return rope_neox(x, positions, inv_freq)


def group_mask(groups: np.ndarray, n_group: int, n_expert: int) -> np.ndarray:
    """[n, n_expert] True for the experts of each row's groups [n, g]."""
    mask = np.zeros((groups.shape[0], n_group), dtype=bool)
    np.put_along_axis(mask, groups, True, axis=-1)
    return np.repeat(mask, n_expert // n_group, axis=-1)


def route(model: Model, p: MlaParams, il: int, h: np.ndarray, trace: dict | None = None,
          flip: tuple[int, str] | None = None):
    """(expert ids [n, k], weights [n, k]) of layer il for normed hidden states h [n, n_embd].

    With `trace`, appends the token's routing margins: the gap between the k-th and (k+1)-th choice
    ('topk_margin'), between the last kept and the first dropped group ('group_margin', inf without a group
    limit) and the smaller ('router_margin'), all by router_gaps, and the groups best first ('group_order',
    with a group limit). `flip` (token, "topk" or "group"): that token takes the runner-up of that decision
    instead, the (k+1)-th choice for the k-th or the first dropped group for the last kept one: what a router
    whose arithmetic noise exceeds the decision's margin selects (tests/python/router_flips.py).
    """
    hp = model.hparams
    logits = linear(h, model.blk(il, "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd)))
    if p.sigmoid:
        scores = sigmoid(logits)
        choice = scores + model.blk(il, "exp_probs_b.bias", (hp.n_expert,)) if model.has(
            f"blk.{il}.exp_probs_b.bias") else scores
    else:
        scores = softmax(logits)
        choice = scores
    n = h.shape[0]
    gap = router_gaps(logits, choice, p.sigmoid)
    group_margin = np.full(n, np.inf)
    group_order = None
    unmasked = choice
    if p.n_group_used < p.n_group:
        grouped = choice.reshape(n, p.n_group, -1)
        if p.sigmoid or SOFTMAX_GROUP_SCORE == "top2_sum":
            group_score = np.sum(-np.sort(-grouped, axis=-1)[..., :2], axis=-1)
        else:
            group_score = np.max(grouped, axis=-1)
        group_order = top_k_desc(group_score, p.n_group)
        choice = np.where(group_mask(group_order[:, :p.n_group_used], p.n_group, hp.n_expert), choice, -np.inf)
        gs = -np.sort(-group_score, axis=-1)
        group_margin = gap(gs[:, p.n_group_used - 1], gs[:, p.n_group_used])
    k = hp.n_expert_used
    if flip is not None and flip[1] not in ("topk", "group"):
        raise ValueError(f"flip decision must be 'topk' or 'group', got {flip[1]!r}")
    ids, topk_margin = top_k_with_margin(choice, k, gap, flip[0] if flip is not None and flip[1] == "topk" else None)
    margin = np.minimum(group_margin, topk_margin)
    if flip is not None and flip[1] == "group":
        t, u = flip[0], p.n_group_used
        if group_order is None:
            raise ValueError(f"layer {il} has no group limit to flip")
        groups = np.concatenate([group_order[t, :u - 1], group_order[t, u:u + 1]])
        row = np.where(group_mask(groups[None], p.n_group, hp.n_expert)[0], unmasked[t], -np.inf)
        ids[t] = top_k_desc(row, k)
    w = expert_weights(scores, ids, p.weights_norm, p.weights_scale)
    if trace is not None:
        trace.setdefault("router_margin", []).append(margin)
        trace.setdefault("topk_margin", []).append(topk_margin)
        trace.setdefault("group_margin", []).append(group_margin)
        if group_order is not None:
            trace.setdefault("group_order", []).append(group_order)
        trace.setdefault("expert_ids", []).append(ids)
        trace.setdefault("expert_weights", []).append(w)
    return ids, w


def moe(model: Model, p: MlaParams, il: int, h: np.ndarray, trace: dict | None = None,
        flip: tuple[int, str] | None = None) -> np.ndarray:
    hp = model.hparams
    ids, weights = route(model, p, il, h, trace, flip)
    out = routed_experts(model, il, h, ids, weights)
    sh = hp.n_ff_exp * p.n_shared
    return out + swiglu(h, model.blk(il, "ffn_gate_shexp.weight", (sh, hp.n_embd)),
                        model.blk(il, "ffn_up_shexp.weight", (sh, hp.n_embd)),
                        model.blk(il, "ffn_down_shexp.weight", (hp.n_embd, sh)))


def kv_up_projections(model: Model, p: MlaParams, il: int) -> tuple[np.ndarray, np.ndarray]:
    """W_UK [H, Dn, C] and W_UV [H, Dv, C] of layer il, from attn_k_b / attn_v_b or the older attn_kv_b."""
    hp, C = model.hparams, p.kv_lora_rank
    if model.has(f"blk.{il}.attn_k_b.weight"):
        wk = model.blk(il, "attn_k_b.weight", (hp.n_head, C, p.n_nope)).transpose(0, 2, 1)
        wv = model.blk(il, "attn_v_b.weight", (hp.n_head, p.head_dim_v, C))
        return wk, wv
    kv_b = model.blk(il, "attn_kv_b.weight", (hp.n_head * (p.n_nope + p.head_dim_v), C))
    kv_b = kv_b.reshape(hp.n_head, p.n_nope + p.head_dim_v, C)
    return kv_b[:, :p.n_nope], kv_b[:, p.n_nope:]


def forward(model: Model, tokens, positions=None, cache: KVCache | None = None,
            trace: dict | None = None, flip: tuple[int, int, str] | None = None, f16_heads: bool = False) -> np.ndarray:
    """Logits [n_tokens, n_vocab] (float64) for `tokens`, attending to `cache` (extended in place).

    `f16_heads`: the per-head keys and values, once up-projected from the cache, are rounded to float16, as
    moeinfer holds them in its prefill form (prompts of kMlaDecompressMinTokens = 32 tokens or more).

    `trace`, if given, receives per MoE layer 'router_margin' (and the margins route() adds), 'expert_ids',
    'expert_weights', and per layer 'layer_out'. `flip` (layer, token, "topk" or "group"): that token takes the
    runner-up of that decision in that layer (route).
    """
    hp = model.hparams
    if hp.arch != ARCH:
        raise ValueError(f"deepseek2.forward got a '{hp.arch}' model")
    p = mla_params(model)
    tokens = check_tokens(tokens, hp.n_vocab)
    n = tokens.shape[0]
    cache, pos = start_pass(cache, hp.n_layer, n, positions)
    k_pos = cache.key_positions(pos)
    H, C, R, Dn, Dv = hp.n_head, p.kv_lora_rank, p.n_rot, p.n_nope, p.head_dim_v
    if p.yarn_factor > 1.0:
        inv_freq, _ = yarn_inv_freq(hp.rope_freq_base, R, p.yarn_factor, p.yarn_orig_ctx, p.yarn_beta_fast,
                                    p.yarn_beta_slow, truncate=True)
        mscale = 1.0 + p.yarn_log_mul * math.log(p.yarn_factor)
    else:
        inv_freq, mscale = default_inv_freq(hp.rope_freq_base, R), 1.0
    scale = mscale * mscale / math.sqrt(Dn + R)

    x = model.get("token_embd.weight", (hp.n_vocab, hp.n_embd))[tokens]
    for il in range(hp.n_layer):
        h = rms_norm(x, model.blk(il, "attn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        if p.q_lora_rank > 0:
            qa = linear(h, model.blk(il, "attn_q_a.weight", (p.q_lora_rank, hp.n_embd)))
            qa = rms_norm(qa, model.blk(il, "attn_q_a_norm.weight", (p.q_lora_rank,)), hp.rms_eps)
            q = linear(qa, model.blk(il, "attn_q_b.weight", (H * (Dn + R), p.q_lora_rank)))
        else:
            q = linear(h, model.blk(il, "attn_q.weight", (H * (Dn + R), hp.n_embd)))
        q = q.reshape(n, H, Dn + R)
        kv = linear(h, model.blk(il, "attn_kv_a_mqa.weight", (C + R, hp.n_embd)))
        c = rms_norm(kv[:, :C], model.blk(il, "attn_kv_a_norm.weight", (C,)), hp.rms_eps)
        k_pe = rope_deepseek(kv[:, None, C:], pos, inv_freq)                  # [n, 1, R]
        c_all, k_pe_all = cache.extend(il, c[:, None, :], k_pe)               # [n_kv, 1, C], [n_kv, 1, R]
        wk, wv = kv_up_projections(model, p, il)
        k_nope = np.einsum("hdc,kc->khd", wk, c_all[:, 0])                    # [n_kv, H, Dn]
        v = np.einsum("hdc,kc->khd", wv, c_all[:, 0])                         # [n_kv, H, Dv]
        k = np.concatenate([k_nope, np.repeat(k_pe_all, H, axis=1)], axis=-1)
        if f16_heads:
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        q = np.concatenate([q[..., :Dn], rope_deepseek(q[..., Dn:], pos, inv_freq)], axis=-1)
        a = attention(q, k, v, pos, k_pos, scale).reshape(n, H * Dv)
        x = x + linear(a, model.blk(il, "attn_output.weight", (hp.n_embd, H * Dv)))

        h = rms_norm(x, model.blk(il, "ffn_norm.weight", (hp.n_embd,)), hp.rms_eps)
        if il < p.n_dense:
            x = x + swiglu(h, model.blk(il, "ffn_gate.weight", (p.n_ff, hp.n_embd)),
                           model.blk(il, "ffn_up.weight", (p.n_ff, hp.n_embd)),
                           model.blk(il, "ffn_down.weight", (hp.n_embd, p.n_ff)))
        else:
            x = x + moe(model, p, il, h, trace, flip[1:] if flip is not None and flip[0] == il else None)
        if trace is not None:
            trace.setdefault("layer_out", []).append(x.copy())
    cache.commit(pos)

    x = rms_norm(x, model.get("output_norm.weight", (hp.n_embd,)), hp.rms_eps)
    return linear(x, model.output_weight())
