"""glm4moe: moeinfer.Context (the C++ CPU forward pass) against the float64 numpy reference (reference/glm4moe.py).

Both tiny glm4moe presets (moeinfer.synth_write, fresh random weights): "tiny" as GLM-4.5 (q/k norms, routed
scaling 2.5) and "tiny-air" as GLM-4.5-Air (no q/k norms, scaling 1); each has a leading dense layer, a shared
expert, partial rotary (16 of 32 head dims) and the trailing NextN layer real files carry, which must be skipped.
The comparisons and their bounds are test_forward_reference.py's (see its docstring: F16 KV cache modelled by
the reference, per-token relative errors, tokens whose routing nearly ties excused); here the router margin is
the gap between the k-th and (k+1)-th biased sigmoid scores (the selection), relative to their RMS.
Tried on purpose against the reference: without the selection bias, the routed scaling, the weight
normalisation, the shared expert or the q bias, or rotating all 32 head dims, the F32 logits differ by 0.08 to
0.45 relative, over 1000x the 1e-4 bound.

Random data is fresh on every run; the seed is printed and MOEINFER_TEST_SEED=<seed> replays it.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import moeinfer
import shared_expert_checks
from reference import KVCache, glm4moe
from test_forward_reference import F32, QUANTISED, UNQUANTISED, F16KVCache, Weights, prompt

pytestmark = pytest.mark.fast

ARCH = "glm4moe"
PRESETS = ("tiny", "tiny-air")
WEIGHTS = UNQUANTISED + [QUANTISED[0], QUANTISED[1], QUANTISED[3]]


def reference(ref, tokens, f16_kv=True):
    """(logits, each token's smallest router margin over the MoE layers) of the float64 reference."""
    cache = F16KVCache(ref.hparams.n_layer) if f16_kv else KVCache(ref.hparams.n_layer)
    trace: dict = {}
    logits = glm4moe.forward(ref, tokens, cache=cache, trace=trace)
    return logits, np.min(np.stack(trace["router_margin"]), axis=0)


def write_model(path, preset: str, w: Weights, rng: np.random.Generator):
    return shared_expert_checks.write_model(path, ARCH, preset, w, rng)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("w", WEIGHTS, ids=lambda w: w.id)
def test_logits_match_reference(preset, w, tmp_path, rng):
    shared_expert_checks.check_logits_match_reference(ARCH, preset, w, tmp_path, rng, reference)


@pytest.mark.parametrize("w", [F32, QUANTISED[0]], ids=lambda w: w.id)
def test_ubatch_splits_and_token_by_token_agree(w, tmp_path, rng):
    model = moeinfer.Model(write_model(tmp_path / "m.gguf", "tiny", w, rng))
    shared_expert_checks.check_ubatch_splits_and_token_by_token_agree(model, rng)


def test_nextn_layer_is_in_the_file_and_not_run(tmp_path, rng):
    """The file holds block_count = 4 blocks, the last one the NextN layer (as converted GLM files); moeinfer
    runs 3 layers and binds none of blk.3's tensors, so changing them leaves the logits exactly as they were."""
    path = write_model(tmp_path / "m.gguf", "tiny", F32, rng)
    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    assert {"blk.3.nextn.eh_proj.weight", "blk.3.ffn_gate_exps.weight"} <= names
    model = moeinfer.Model(path)
    assert model.info.n_layer == 3
    tokens = prompt(rng, model.info.n_vocab, 9)
    before = moeinfer.Context(model, device="cpu", n_ctx=16).decode(tokens, logits_all=True)
    del model
    # Overwrite every blk.3 tensor's bytes in place (the file is F32) with 0.75 everywhere: any use would move
    # the logits (the same bytes in blk.2.attn_q.bias move them by ~0.27).
    data = np.memmap(path, dtype=np.uint8, mode="r+")
    for t in reader.tensors:
        if t.name.startswith("blk.3."):
            data[t.data_offset:t.data_offset + t.n_bytes] = 0x3F
    data.flush()
    del data, reader
    after = moeinfer.Context(moeinfer.Model(path), device="cpu", n_ctx=16).decode(tokens, logits_all=True)
    np.testing.assert_array_equal(after, before)
