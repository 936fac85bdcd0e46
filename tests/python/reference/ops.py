"""Building blocks shared by the reference architectures: norms, RoPE (plain and YaRN), attention, KV cache.

All math is float64 numpy. Shapes: hidden states [n_tokens, n_embd]; per-head tensors [n_tokens, n_heads, dim].
"""

from __future__ import annotations

import math

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (Llama/Qwen/gpt-oss RMSNorm: weight, not 1+weight)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """y = W x (+ b) for every row of x; W is numpy [n_out, n_in] (GGUF ne [n_in, n_out])."""
    y = x @ w.T
    return y if b is None else y + b


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def top_k_desc(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, largest first (ties: lower index first)."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


# --- RoPE -------------------------------------------------------------------------------------------------------

def default_inv_freq(base: float, n_rot: int) -> np.ndarray:
    """theta_i = base^(-2i / n_rot) for i in [0, n_rot/2)."""
    return base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)


def yarn_inv_freq(base: float, n_rot: int, factor: float, orig_ctx: int, beta_fast: float, beta_slow: float,
                  truncate: bool) -> tuple[np.ndarray, float]:
    """YaRN frequencies and cos/sin scale, as HF transformers' _compute_yarn_parameters.

    Pair i keeps its original frequency when it completes more than beta_fast turns within orig_ctx (short
    wavelengths), is divided by `factor` when it completes fewer than beta_slow, and is blended linearly in
    the pair index in between. `truncate` floors/ceils the blend bounds: HF applies it unless
    the config says "truncate": false, which gpt-oss's config does; ggml's rope_yarn always truncates.
    The returned scale 0.1*ln(factor)+1 multiplies both cos and sin (HF attention_factor, ggml mscale).
    """
    def correction_dim(n_rotations: float) -> float:
        return n_rot * math.log(orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, n_rot - 1)
    if low == high:
        high += 0.001  # HF's guard; ggml uses max(0.001, high - low), the same for equal bounds
    ramp = np.clip((np.arange(n_rot // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = default_inv_freq(base, n_rot)
    interpolation = extrapolation / factor
    inv_freq = interpolation * ramp + extrapolation * (1.0 - ramp)
    scale = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    return inv_freq, scale


def rope_neox(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """NeoX-style RoPE (HF rotate_half; ggml GGML_ROPE_TYPE_NEOX) on the first 2*len(inv_freq) dims of x.

    x: [n_tokens, n_heads, head_dim]. Pair (j, j + n_rot/2) rotates by angle pos * inv_freq[j]; cos and sin
    are multiplied by `scale` (YaRN), dims past n_rot pass through.
    """
    half = inv_freq.shape[0]
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = (np.cos(angle) * scale)[:, None, :]
    sin = (np.sin(angle) * scale)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


# --- attention --------------------------------------------------------------------------------------------------

def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, scale: float,
              window: int | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal GQA attention by positions; returns [n_q, n_head, head_dim_v].

    q [n_q, n_head, d], k [n_kv, n_head_kv, d], v [n_kv, n_head_kv, d_v]. Query head h reads KV head
    h // (n_head / n_head_kv) (HF repeat_kv, ggml mul_mat broadcasting). A query at position p sees keys at
    positions <= p, and with `window` only those > p - window (HF sliding_window_overlay, llama.cpp
    LLAMA_SWA_TYPE_STANDARD). `sinks` [n_head]: one logit per head that joins the softmax denominator and is
    then dropped (gpt-oss); it is not multiplied by `scale`.
    """
    n_head, n_head_kv = q.shape[1], k.shape[1]
    group = n_head // n_head_kv
    kh = np.repeat(k, group, axis=1)                    # [n_kv, n_head, d]
    vh = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, kh) * scale   # [n_head, n_q, n_kv]
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    scores = np.where(visible[None, :, :], scores, -np.inf)
    row_max = np.max(scores, axis=-1)                   # [n_head, n_q]; -inf if a row sees no key
    if sinks is not None:
        row_max = np.maximum(row_max, sinks[:, None])
    if not np.all(np.isfinite(row_max)):
        raise ValueError("a query sees no key (positions are not causal w.r.t. the KV cache)")
    p = np.exp(scores - row_max[..., None])
    denom = np.sum(p, axis=-1)
    if sinks is not None:
        denom = denom + np.exp(sinks[:, None] - row_max)
    out = np.einsum("hqk,khd->qhd", p, vh)
    return out / denom.T[:, :, None]


class KVCache:
    """Per-layer keys (after RoPE) and values of every token seen so far, with their positions.

    Keys are never evicted: a sliding window is applied by the attention mask, which is what the windowed
    layers compute whatever their cache size. A forward pass stages its new K/V with `extend` and makes them
    permanent with `commit`, so a failed pass leaves the cache as it was.
    """

    def __init__(self, n_layer: int):
        self.n_layer = n_layer
        self.k: list[np.ndarray | None] = [None] * n_layer
        self.v: list[np.ndarray | None] = [None] * n_layer
        self.positions = np.zeros(0, dtype=np.int64)
        self._staged: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def n_past(self) -> int:
        return int(self.positions.shape[0])

    def resolve_positions(self, n_tokens: int, positions) -> np.ndarray:
        """`positions` as int64 [n_tokens]; by default the next n_tokens positions after the cached ones."""
        if positions is None:
            start = int(self.positions.max()) + 1 if self.n_past else 0
            return np.arange(start, start + n_tokens, dtype=np.int64)
        pos = np.asarray(positions, dtype=np.int64)
        if pos.shape != (n_tokens,):
            raise ValueError(f"positions has shape {pos.shape}, expected ({n_tokens},)")
        if np.any(pos < 0):
            raise ValueError("positions must be non-negative")
        return pos

    def extend(self, il: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stage this pass's K/V of layer il; returns cached + new K and V."""
        if self.k[il] is not None:
            k = np.concatenate([self.k[il], k], axis=0)
            v = np.concatenate([self.v[il], v], axis=0)
        self._staged[il] = (k, v)
        return k, v

    def key_positions(self, new_positions: np.ndarray) -> np.ndarray:
        return np.concatenate([self.positions, new_positions])

    def commit(self, new_positions: np.ndarray) -> None:
        if len(self._staged) != self.n_layer:
            raise RuntimeError(f"KV cache commit with {len(self._staged)} of {self.n_layer} layers staged")
        for il, (k, v) in self._staged.items():
            self.k[il], self.v[il] = k, v
        self.positions = self.key_positions(new_positions)
        self._staged = {}


def check_tokens(tokens, n_vocab: int) -> np.ndarray:
    """tokens as a non-empty int64 vector with every id in [0, n_vocab)."""
    t = np.asarray(tokens, dtype=np.int64)
    if t.ndim != 1 or t.shape[0] == 0:
        raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {t.shape}")
    if np.any(t < 0) or np.any(t >= n_vocab):
        raise ValueError(f"token ids must be in [0, {n_vocab}), got min {t.min()} max {t.max()}")
    return t


def start_pass(cache: KVCache | None, n_layer: int, n_tokens: int, positions) -> tuple[KVCache, np.ndarray]:
    """The cache to use (a fresh one if None) and this pass's positions; rejects a cache of another depth."""
    if cache is None:
        cache = KVCache(n_layer)
    elif cache.n_layer != n_layer:
        raise ValueError(f"KV cache has {cache.n_layer} layers, the model has {n_layer}")
    cache._staged = {}
    return cache, cache.resolve_positions(n_tokens, positions)
