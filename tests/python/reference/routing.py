"""Router pieces the references with sigmoid or softmax gating and router margins share (deepseek2, glm4moe,
qwen3moe, gpt-oss): the margins of a token's selection, the runner-up selection tests/python/router_flips.py reruns
a near-tie with, and the selected experts' weights."""

from __future__ import annotations

import numpy as np

from .ops import top_k_desc


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def router_gaps(logits: np.ndarray, choice: np.ndarray, sigmoid: bool):
    """gap(a, b): how far apart two of a token's selection values (a choice, or a group's score) are, in units in
    which the router's arithmetic noise is the same for every pair, relative to the token's RMS.

    Sigmoid routers: the choices' own gap relative to their RMS (a score moves by at most a quarter of its logit's
    error). Softmax routers: a probability moves by its logit's error times itself (dp = p dl), so near a tie
    p_a - p_b ~ p (l_a - l_b), and probability gaps relative to their RMS overstate the margin of large
    probabilities by p / rms(p) -- 2x to 3x for the groups' best experts, which decide V2's group limit, where a
    group flip with Q8_0 dense weights passed a 1e-2 margin (token 10 of MOEINFER_TEST_SEED=2766577239: 1.03e-2
    in probabilities, 3.4e-3 in logits). So softmax gaps are taken between log-probabilities (logit gaps, for a
    group's best or its top-2 sum alike) relative to the RMS of the logits, as qwen3moe's router margins are
    (qwen3moe.route), to which the same per-type bounds apply. -inf (a masked choice) or 0 for b: +inf.
    """
    if sigmoid:
        rms = np.sqrt(np.mean(choice * choice, axis=-1))
        return lambda a, b: (a - b) / rms
    rms = np.sqrt(np.mean(logits * logits, axis=-1))

    def gap(a, b):
        ok = b > 0
        return np.where(ok, (np.log(a) - np.log(np.where(ok, b, 1.0))) / rms, np.inf)

    return gap


def logit_gaps(logits: np.ndarray):
    """gap(a, b) for a router that selects on its logits (gpt-oss: top-k of the logits, softmax over the k chosen):
    the logits' gap relative to the RMS of the token's logits, the units of router_gaps' softmax gaps (a logit's
    arithmetic noise does not grow with it), so the same per-type bounds apply."""
    rms = np.sqrt(np.mean(logits * logits, axis=-1))
    return lambda a, b: (a - b) / rms


def top_k_with_margin(choice: np.ndarray, k: int, gap, flip_token: int | None = None):
    """(expert ids [n, k] best first, margin [n]): the top-k of `choice` [n, n_expert] (-inf: not selectable) and
    gap(k-th, (k+1)-th choice) per token, `gap` from router_gaps or logit_gaps. With `flip_token`, that token takes
    the (k+1)-th choice instead of the k-th: what a router whose arithmetic noise exceeds the margin selects."""
    ids = top_k_desc(choice, k)
    best = -np.sort(-choice, axis=-1)
    margin = gap(best[:, k - 1], best[:, k])
    if flip_token is not None:
        order = top_k_desc(choice[flip_token], k + 1)
        ids[flip_token] = np.concatenate([order[:k - 1], order[k:]])
    return ids, margin


def trace_topk(trace: dict | None, margin: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> None:
    """Appends a layer's top-k decision without a group limit to a forward's `trace`: its margins as 'topk_margin'
    and 'router_margin' (the same), 'expert_ids' and 'expert_weights'."""
    if trace is not None:
        trace.setdefault("topk_margin", []).append(margin)
        trace.setdefault("router_margin", []).append(margin)
        trace.setdefault("expert_ids", []).append(ids)
        trace.setdefault("expert_weights", []).append(weights)


def check_flip_layer(flip: tuple[int, int, str] | None, first_moe: int, n_layer: int) -> None:
    """Refuses a forward's `flip` (layer, token, decision) whose layer is not a MoE layer (first_moe..n_layer-1)."""
    if flip is not None and not first_moe <= flip[0] < n_layer:
        raise ValueError(f"flip layer {flip[0]} is not a MoE layer (layers {first_moe}..{n_layer - 1})")


def flip_at(flip: tuple[int, int, str] | None, il: int) -> tuple[int, str] | None:
    """The (token, decision) part of a forward's `flip` for layer il's router, None where it flips another layer."""
    return flip[1:] if flip is not None and flip[0] == il else None


def expert_weights(scores: np.ndarray, ids: np.ndarray, norm: bool, scale: float) -> np.ndarray:
    """The gate scores of the selected experts [n, k], divided by their sum when `norm` (expert_weights_norm,
    HF norm_topk_prob), then times `scale` (expert_weights_scale, HF routed_scaling_factor)."""
    w = np.take_along_axis(scores, ids, axis=-1)
    if norm:
        w = w / (np.sum(w, axis=-1, keepdims=True) + 1e-20)
    return w * scale
