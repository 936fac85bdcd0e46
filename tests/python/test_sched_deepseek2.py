"""The hybrid scheduler on deepseek2 (emulated device: a host-memory backend that plays the GPU), as
test_sched_emulated.py checks it on qwen3moe and gpt-oss: placement rules, offload thresholds, FULL and
ACTIVE_ONLY expert copies and the expert split, against a CPU context on the same fresh random model and
prompt (max |emulated - cpu| <= 1e-4 * max |cpu| per token: only op placement differs; the expert split, which
adds the experts in another order, within shared_expert_checks.assert_split_rows_close's bounds) and against
quantities computed here from the tensor shapes and the experts each ubatch selected.

deepseek2 differs where the scheduler could trip: the leading dense layer has no routed experts (nothing to
offload or split there), the shared experts are dense products that stay with the other dense weights (an
`exps=CPU` rule must not catch `ffn_*_shexp`), the latent KV cache is one tensor per layer, and the per-head
products (MUL_MAT_HEADS) read weights of their own.

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays the prompts (the model seed is printed).
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer
from shared_expert_checks import (check_active_only_uploads, check_expert_split, check_exps_rule_placement,
                                  check_logits_match_cpu, emulated, write_sched_model)

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module", params=["tiny", "tiny-lite"])
def model(request, tmp_path_factory) -> moeinfer.Model:
    return write_sched_model(tmp_path_factory, "deepseek2", request.param, request.param)


def test_exps_rule_leaves_shared_experts_and_dense_layers_on_the_device(model):
    seen = check_exps_rule_placement(model)
    # V3's sigmoid router has a selection bias per MoE layer, V2's softmax router none; no layer past n_layer.
    assert seen["bias"] == (model.info.n_layer - 1 if any("exp_probs_b" in t.name for t in model.tensors) else 0)
    assert seen["unused"] == 0


@pytest.mark.parametrize("placement", [{"tensor_overrides": "exps=CPU"}, {"n_gpu_layers": 1}, {}],
                         ids=["exps-host", "layers-host", "all-device"])
@pytest.mark.parametrize("expert_copy", ["full", "active"])
def test_logits_match_cpu(model, rng, placement, expert_copy):
    check_logits_match_cpu(model, rng, placement, expert_copy)


def test_expert_counts_cover_only_the_moe_layers(model, rng):
    emu = emulated(model, moeinfer.Policy(offload="all=1"), n_ubatch=8, tensor_overrides="exps=CPU")
    prompt = rng.integers(0, model.info.n_vocab, size=21, dtype=np.int32)
    emu.decode(prompt)
    counts = emu.expert_counts()
    assert counts.shape == (model.info.n_layer, model.info.n_expert)
    assert not counts[0].any()  # the dense layer routes nothing
    assert np.all(counts[1:].sum(axis=1) == 21 * model.info.n_expert_used)


def test_active_only_uploads_exactly_the_selected_experts(model, rng):
    check_active_only_uploads(model, rng, bias_dup=True, sizes=[4, 2, 4, 4, 1, 4], require_skipped=False)


def test_expert_split_matches_cpu_and_uploads_only_the_device_experts(model, rng):
    check_expert_split(model, rng, "full", n_split=3, sizes=[4, 2, 4, 1])
