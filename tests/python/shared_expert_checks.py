"""Checks shared by the tests of the MoE architectures with leading dense layers and shared experts next to the
routed ones (glm4moe, deepseek2): their CPU forward pass against a float64 reference, and the hybrid scheduler on
the emulated device. Each test file says what its architecture adds; the reasons for the bounds are in the
docstrings of test_forward_reference.py (forward) and test_sched_emulated.py (scheduler).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import moeinfer
from conftest import model_seed
from reference import load as load_reference
from test_forward_reference import UBATCH_TOL, Weights, check_close, check_exact_reference, per_token_error, prompt
from test_sched_emulated import REL_TOL, assert_logits_close, check_placement_figures, emulated, row_errors

# --- the CPU forward pass against the float64 reference -----------------------------------------------------------

N_TOKENS = 29


def write_model(path, arch: str, preset: str, w: Weights, rng: np.random.Generator, **kwargs):
    moeinfer.synth_write(path, arch, preset=preset, expert_type=w.expert_type, dense_type=w.dense_type,
                         seed=int(rng.integers(1 << 62)), **kwargs)
    return path


def check_logits_match_reference(arch: str, preset: str, w: Weights, tmp_path, rng, reference: Callable,
                                 n_tokens: int = N_TOKENS) -> None:
    """A fresh model's CPU logits for a random prompt of n_tokens (one ubatch) against reference(ref, tokens,
    f16_kv) -> (logits, per-token router margins), within w's bounds; unquantised weights also within EXACT_REF_TOL
    of the reference without the F16 cache rounding (check_exact_reference)."""
    path = write_model(tmp_path / "m.gguf", arch, preset, w, rng)
    model = moeinfer.Model(path)
    ref = load_reference(path)
    tokens = prompt(rng, model.info.n_vocab, n_tokens)

    got = moeinfer.Context(model, device="cpu", n_ctx=64).decode(tokens, logits_all=True)
    want, margins = reference(ref, tokens)
    err = check_close(got, want, margins, w, f"{preset} {w.id}")
    print(f"{arch} {preset} {w.id}: max relative error {err:.2e} (tol {w.tol:g})")
    if not w.quantised:
        check_exact_reference(got, *reference(ref, tokens, f16_kv=False))


def check_ubatch_splits_and_token_by_token_agree(model: moeinfer.Model, rng) -> None:
    """One ubatch, ubatches of 3 and 7, and token by token through the KV cache agree within UBATCH_TOL."""
    tokens = prompt(rng, model.info.n_vocab, N_TOKENS)
    whole = moeinfer.Context(model, device="cpu", n_ctx=64).decode(tokens, logits_all=True)
    atol = UBATCH_TOL * np.abs(whole).max()
    for n_ubatch in (3, 7):
        split = moeinfer.Context(model, device="cpu", n_ctx=64, n_ubatch=n_ubatch).decode(tokens, logits_all=True)
        np.testing.assert_allclose(split, whole, rtol=0, atol=atol, err_msg=f"n_ubatch={n_ubatch}")
    ctx = moeinfer.Context(model, device="cpu", n_ctx=64)
    one_by_one = np.concatenate([ctx.decode(tokens[i:i + 1], logits_all=True) for i in range(len(tokens))])
    np.testing.assert_allclose(one_by_one, whole, rtol=0, atol=atol, err_msg="token by token")


# --- the hybrid scheduler on the emulated device ------------------------------------------------------------------

def write_sched_model(tmp_path_factory, arch: str, preset: str, name: str, **kw) -> moeinfer.Model:
    seed = model_seed()
    path = tmp_path_factory.mktemp("sched") / f"{name}.gguf"
    moeinfer.synth_write(str(path), arch, preset=preset, seed=seed, **kw)
    return moeinfer.Model(str(path))


def layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def is_routed_expert(name: str) -> bool:
    return "_exps." in name


def moe_layers(model) -> list[int]:
    """The layers with routed experts (that run: a NextN layer the file holds is not one)."""
    return sorted({layer_of(t.name) for t in model.tensors
                   if is_routed_expert(t.name) and layer_of(t.name) < model.info.n_layer})


def n_dense_layers(model) -> int:
    return moe_layers(model)[0]


def expert_bytes(model) -> int:
    """Bytes of one routed expert's up + gate + down weights (the same in every MoE layer of a synthetic model)."""
    il = moe_layers(model)[0]
    return sum(t.n_bytes for t in model.tensors if layer_of(t.name) == il and is_routed_expert(t.name)) \
        // model.info.n_expert


def check_exps_rule_placement(model) -> dict:
    """exps=CPU catches exactly the routed experts (ffn_{up,gate,down}_exps): the shared experts, the dense layers'
    FFN and the router's selection bias stay on the device with the other dense weights, and the tensors of
    layers past n_layer (a NextN layer) are placed nowhere. Returns how many tensors of each kind were seen."""
    ctx = emulated(model, tensor_overrides="exps=CPU")
    n_layer, n_moe, n_dense = model.info.n_layer, len(moe_layers(model)), n_dense_layers(model)
    seen = {"shexp": 0, "dense": 0, "bias": 0, "routed": 0, "unused": 0}
    for t in model.tensors:
        if layer_of(t.name) >= n_layer:
            with pytest.raises(KeyError, match=t.name.replace(".", r"\.")):
                ctx.tensor_location(t.name)
            seen["unused"] += 1
            continue
        routed = is_routed_expert(t.name)
        assert ctx.tensor_location(t.name)[0] == ("host" if routed else "device"), t.name
        seen["routed"] += routed
        seen["shexp"] += "_shexp." in t.name
        seen["dense"] += t.name.endswith(("ffn_up.weight", "ffn_gate.weight", "ffn_down.weight"))
        seen["bias"] += "exp_probs_b" in t.name
    # Every kind present: 3 routed and 3 shared per MoE layer, 3 dense FFN matrices per dense layer.
    assert n_dense >= 1 and moe_layers(model) == list(range(n_dense, n_layer))
    assert seen["routed"] == seen["shexp"] == 3 * n_moe
    assert seen["dense"] == 3 * n_dense and seen["bias"] in (0, n_moe)
    # The model's expert bytes are those of the layers run.
    assert check_placement_figures(ctx, [t for t in model.tensors if layer_of(t.name) < n_layer]) == \
        model.info.n_expert_bytes
    return seen


def check_logits_match_cpu(model, rng, placement: dict, expert_copy: str, bias_dup: bool = True) -> None:
    """A 19-token prompt in ubatches of 8 (offloaded from 5 tokens: the ubatches of 8 go to the device, the last 3
    and the 3 single-token decodes stay) on the emulated device against the CPU, with the placement (exps=CPU,
    n_cpu_moe, n_gpu_layers or none); expert counts equal; offloaded / kept expert ops counted per host MoE
    layer; the shared experts and the dense FFN are products of device weights unless n_gpu_layers moved layers
    to the host."""
    # The offload threshold alone: an expert cache holding whole matrices takes smaller ubatches to the
    # device too (test_sched_cache.py).
    policy = moeinfer.Policy(expert_copy=expert_copy, bias_dup=bias_dup, expert_split=0,
                             expert_cache=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, **placement)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt_tokens = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt_tokens, logits_all=True), cpu.decode(prompt_tokens, logits_all=True))
    for _ in range(3):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        assert_logits_close(emu.decode(tok), cpu.decode(tok))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    layers = moe_layers(model)
    if "tensor_overrides" in placement:
        n_host = len(layers)
    elif "n_cpu_moe" in placement:  # the experts of the first n_cpu_moe layers (dense ones have none)
        n_host = sum(il < placement["n_cpu_moe"] for il in layers)
    else:
        n_host = 0
    if "n_gpu_layers" in placement:
        assert s["n_offloaded"]["mul_mat"] > 0 and s["n_kept_host"]["mul_mat"] > 0
        return
    for op in ("mul_mat_id", "moe_up_gate"):
        assert s["n_offloaded"][op] == 2 * n_host, (op, s)
        assert s["n_kept_host"][op] == 4 * n_host, (op, s)
    assert s["n_offloaded"]["mul_mat"] == s["n_kept_host"]["mul_mat"] == 0


def check_active_only_uploads(model, rng, bias_dup: bool, sizes: list[int], require_skipped: bool) -> None:
    """ACTIVE_ONLY copies with exps=CPU, ubatches of 4 offloaded from 3 tokens: the uploaded and skipped expert
    bytes are those of the experts each offloaded ubatch selected (expert_counts deltas) and did not; the dense
    layers route nothing; no expert biases, so bias_dup moves no bytes."""
    eb = expert_bytes(model)
    n_expert, n_moe, n_dense = model.info.n_expert, len(moe_layers(model)), n_dense_layers(model)
    # The upload slots alone (test_sched_cache.py counts what the expert cache saves).
    policy = moeinfer.Policy(expert_copy="active", bias_dup=bias_dup, expert_split=0,
                             expert_cache=0).parse_offload("all=3")
    ctx = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    ctx.reset_stats()
    want_experts = want_skipped = 0
    before = ctx.expert_counts()
    for n in sizes:
        ctx.decode(rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32))
        after = ctx.expert_counts()
        delta = (after - before)[n_dense:]
        before = after
        assert np.all(delta.sum(axis=1) == n * model.info.n_expert_used)
        if n >= 3:
            selected = np.count_nonzero(delta, axis=1)
            want_experts += int(selected.sum()) * eb
            want_skipped += int((n_expert - selected).sum()) * eb
    assert not after[:n_dense].any()
    s = ctx.stats()
    n_big = sum(n >= 3 for n in sizes)
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == n_big * n_moe
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == (len(sizes) - n_big) * n_moe
    assert s["bytes_weights_experts"] == want_experts
    assert s["bytes_weights_skipped"] == want_skipped
    if require_skipped:
        assert want_skipped > 0, "every expert selected: the test would not see a skipped one"
    assert s["bytes_weights_full"] == 0
    assert s["n_id_readbacks"] == n_big * n_moe


# The expert split against the CPU. The split adds its host part's and its device part's expert outputs, the CPU
# its selected experts one after the other: with more than two experts per token (4 here) the two sums differ in
# the last bits of the MoE output, so of the residual. Where the next layer's RMS-normed activation lies within
# that noise of a Q8_0 rounding boundary, the two sides quantise one element to neighbouring steps and the token's
# row (and, through its cached keys and values, later rows) moves by more than REL_TOL allows: up to 1.3e-3 of
# max |logit| in 13 of 4,000 models (deepseek2 and glm4moe tiny, model seeds 0..1999, 2026-11-27), against ~2e-7
# in a row with no crossing. One Q8_0 step changes one element by 1/127 of its block's largest magnitude, so the
# product's input by at most 1/127 relative; the norms and residual sums after it carry a relative change on
# without growing it (to first order), so a row a crossing moved stays within SPLIT_STEP_TOL of max |logit|.
# A crossing needs an element within float32 noise of a boundary: 17 rows of 52,000 passed REL_TOL in those
# models, at most 3 of one sequence of 11, so fewer than SPLIT_MOVED_ROWS of the rows may. A wrong expert group
# or a dropped or doubled expert moves most rows of the split ubatches, the worst by 3.7e-2 or more (MASK_IDS
# broken in a copy of the library to drop, or to double, one expert: each of 100 models per preset whose prompts
# selected that expert failed, 2026-11-27).
SPLIT_STEP_TOL = 1 / 127
SPLIT_MOVED_ROWS = 0.5


def assert_split_rows_close(err: np.ndarray) -> None:
    """The row errors (row_errors) of a sequence computed with the expert split against the CPU's: every row within
    SPLIT_STEP_TOL, and fewer than SPLIT_MOVED_ROWS of them beyond REL_TOL (see above)."""
    moved = np.flatnonzero(err > REL_TOL)
    assert err.max() <= SPLIT_STEP_TOL, f"worst token: {err.max():.3g} relative (bound {SPLIT_STEP_TOL:.3g})"
    assert len(moved) < SPLIT_MOVED_ROWS * len(err), \
        f"{len(moved)} of {len(err)} tokens beyond {REL_TOL} relative (rows {moved.tolist()}: {err[moved]})"


def check_expert_split(model, rng, expert_copy: str, n_split: int, sizes: list[int]) -> None:
    """expert_split = n_split with exps=CPU, ubatches of 4 offloaded from 3 tokens: the CPU's logits within the
    split's bounds (assert_split_rows_close) and the same expert counts; every offloaded MoE layer split with n_split
    experts on the host, the others uploaded (full copies, no expert cache: under ACTIVE copies the device part
    uploads only its group's selected experts, test_sched_cache.py)."""
    eb = expert_bytes(model)
    n_expert, n_moe = model.info.n_expert, len(moe_layers(model))
    policy = moeinfer.Policy(expert_copy=expert_copy, expert_split=n_split, expert_cache=0).parse_offload("all=3")
    emu = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=4)
    err = []
    for n in sizes:
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        err.append(row_errors(emu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True)))
    assert_split_rows_close(np.concatenate(err))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    split = sum(n >= 3 for n in sizes) * n_moe
    assert s["n_split_layers"] == split
    assert s["n_split_host_experts"] == n_split * split
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == split
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == \
        split + (len(sizes) - sum(n >= 3 for n in sizes)) * n_moe
    assert s["bytes_weights_experts"] == split * (n_expert - n_split) * eb
    assert s["bytes_weights_skipped"] == split * n_split * eb
