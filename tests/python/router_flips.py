"""The rows of a GPU-against-CPU comparison that a router near-tie may legitimately change.

Two implementations of a MoE model select the same experts for a token only where the router's decision is
wider than their arithmetic noise. On the tiny random models of the tests the decisions are often close: on
deepseek2 "tiny" (sigmoid choices around 0.5 plus the selection bias, a group limit and a top-k decision in each
of 2 MoE layers) 15% of the tokens have a float64 router margin below 1e-2 (reference/routing.py router_gaps),
and the CPU's Q8_0 path against the float64 reference puts 1.4% of the rows of a 20 + 6 + 1 + 1 token sequence
outside the GPU tests' per-row bound (cosine 0.999, 3e-2 of max |logit|), every one at a margin below 1e-2 or
after such a token (300 models, 2026-11-27); on glm4moe "tiny" with 64-wide heads (the same sigmoid choices
and bias, a top-k decision in each of 2 MoE layers, no group limit) 20% of the tokens, and 1.0% of the rows
(300 models), every one at a margin below 1e-2 (900 models, 2026-11-27); on qwen3moe and gpt-oss "tiny" with
64-wide heads (a softmax router's top-2 of 8 experts in each of 2 layers, chosen on the probabilities or on the
logits) 4% of the tokens, and 0.2% to 0.4% of the rows, every one excused as below (300 to 900 models of each
of test_forward_cuda's expert types, 2026-11-27). A tolerance on the fraction of rows (test_forward_cuda._compare's
10%) cannot cover that: 10% of a batch of 6 or of one token is no row at all.

So a row is excused only when the float64 reference says a flip can move it: for each decision (MoE layer,
token, and the top-k or the group limit) whose margin is below NEAR_TIE, the reference runs again with that
token's runner-up there (the (k+1)-th expert for the k-th, or the first dropped group for the last kept one),
and the rows that moves by more than half the per-row bound
(SHIFT_REL, SHIFT_COS) are excused -- the token itself and the later tokens that attend to its changed hidden
state. A near-tie that moves no row by that much excuses nothing, and every other row must meet the full bound.

NEAR_TIE is the bound of the CPU's Q8 path against the reference (test_forward_reference.QUANTISED's min_margin,
which test_forward_deepseek2 and test_forward_glm4moe hold the CPU to): the GPU's router inputs come from Q8
activations (GEMV, up to 8 tokens) or BF16 tensor cores (8 mantissa bits against Q8's 1/127 of a block's
maximum), no noisier than the CPU's, so above it both sides select what the reference does. Half the bound for a
flip's shift leaves the other half for the arithmetic noise of the rows it does not excuse (the CPU against the
reference on 600 models: deepseek2 1e-2 relative at the 99th percentile, 1.8e-2 at most; 4e-5 off the cosine at
the 99th percentile, 1.7e-4 at most; 16% of the rows excused on average, 46% at most; glm4moe 8.4e-3 and 1.7e-2
relative, 2.8e-5 and 1.3e-4 off the cosine, 20% of the rows excused on average, 57% at most; on 300 to 900
models of each type: qwen3moe with Q8_0 or Q4_0 experts 6.6e-3 and 9.5e-3 relative, 1.6e-5 and 6.3e-5 off the
cosine, 4% of the rows excused on average, 18% at most; gpt-oss with MXFP4 or BF16 experts 7.6e-3 and 1.8e-2,
2.1e-5 and 1.4e-4, 4% and 25%).

test_forward_cuda's recipe models (qwen3moe with K-quant or IQ4_XS weights of whole super-blocks) take the CPU's
own bound for such files instead, 2.5e-2 (test_forward_reference.RECIPE_BOUNDS.min_margin; reference_forward's
near_tie): their activations are rounded per 256 (Q8_K), coarser than Q8's per 32, and at NEAR_TIE the CPU took the
runner-up on q4_k_m at margins of 1.009e-2, 1.011e-2 and 1.024e-2, 3 rows of 16,800 over 600 models (in ubatches of
20; token by token it once did at 1.6e-2), each outside the bound and not excused (iq4_xs: none of 600, 9.1e-3 at
most). At 2.5e-2, 9.4% of the rows are excused on average and 29% at most (4.0% and 18% at 1e-2; 300 models).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from reference import forward_for, load as load_reference
from test_forward_reference import F16KVCache

NEAR_TIE = 1e-2       # relative router margin (router_gaps) under which either side may select the runner-up
ROW_REL = 3e-2        # test_forward_cuda._compare's per-row bound: max |gpu - cpu| / max |cpu|
ROW_COS = 0.999       # and its cosine
SHIFT_REL = ROW_REL / 2
SHIFT_COS = (1.0 - ROW_COS) / 2

# forward(tokens, flip) -> (logits [n, n_vocab], {decision: margins [n_moe_layers, n]}) with the decisions the
# architecture's router makes: "topk" and, deepseek2's, "group"; flip = (MoE layer index, token, decision)
Forward = Callable[[np.ndarray, "tuple[int, int, str] | None"], "tuple[np.ndarray, dict[str, np.ndarray]]"]

# The references whose forward takes a `flip` and traces each decision's margins ("<decision>_margin").
DECISIONS = {"deepseek2": ("topk", "group"), "glm4moe": ("topk",), "qwen3moe": ("topk",), "gpt-oss": ("topk",)}


def reference_forward(path, near_tie: float = NEAR_TIE) -> Forward:
    """The float64 reference of the file at `path` (an architecture of DECISIONS; F16 KV cache, as the contexts'),
    one pass over the whole sequence: causal attention gives each row what the contexts' ubatches through their
    cache give. `near_tie` (the forward's attribute of that name) is the margin under which excused_rows flips a
    decision: NEAR_TIE, or the CPU's bound for the file's types where that is wider (the recipe files')."""
    ref = load_reference(str(path))
    arch = ref.hparams.arch
    if arch not in DECISIONS:
        raise ValueError(f"router_flips has no reference with router flips for '{arch}' (known: {sorted(DECISIONS)})")
    run, n_dense = forward_for(ref), int(ref.metadata.get(f"{arch}.leading_dense_block_count", 0))

    def forward(tokens, flip=None):
        trace: dict = {}
        layer_flip = None if flip is None else (n_dense + flip[0], *flip[1:])
        logits = run(ref, tokens, cache=F16KVCache(ref.hparams.n_layer), trace=trace, flip=layer_flip)
        return logits, {d: np.stack(trace[f"{d}_margin"]) for d in DECISIONS[arch]}

    forward.near_tie = near_tie
    return forward


def row_shift(got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: max |got - want| / max |want| and the cosine, as _compare measures them."""
    rel = np.max(np.abs(got - want), axis=-1) / np.max(np.abs(want), axis=-1)
    cos = np.sum(got * want, axis=-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    return rel, cos


def excused_rows(forward: Forward, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(excused [n] bool, smallest router margin per token [n]) for the token sequence `tokens`; decisions under
    the forward's near_tie (NEAR_TIE where it has none) are flipped."""
    near_tie = getattr(forward, "near_tie", NEAR_TIE)
    tokens = np.asarray(tokens, dtype=np.int32)
    base, margins = forward(tokens, None)
    excused = np.zeros(len(tokens), dtype=bool)
    for decision, m in margins.items():
        for layer, token in zip(*np.nonzero(m < near_tie)):
            flipped, _ = forward(tokens, (int(layer), int(token), decision))
            rel, cos = row_shift(flipped, base)
            excused |= (rel > SHIFT_REL) | (cos < 1.0 - SHIFT_COS)
    return excused, np.concatenate(list(margins.values())).min(axis=0)
