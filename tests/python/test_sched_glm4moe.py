"""The hybrid scheduler on the emulated device (see test_sched_emulated.py) with glm4moe models: a leading dense
layer (no expert block), a shared expert (dense products), a sigmoid router with a selection bias, and the
NextN layer the file holds but nothing runs.

What is checked, against what:
* Placement: `exps=CPU` catches exactly the routed experts (ffn_{up,gate,down}_exps) and not the shared experts
  (ffn_*_shexp), the dense FFN or the router's exp_probs_b, which stay on the device with the other dense
  weights; the NextN layer's tensors are placed nowhere. Judged from the model's tensor names in Python.
* Logits of emulated contexts (experts in host RAM offloaded or kept per ubatch by the thresholds; FULL and
  ACTIVE_ONLY copies; bias duplication on and off; the expert split) against a CPU context on the same fresh
  random model and prompt: max |emulated - cpu| <= 1e-4 * max |cpu| per token, the bound and its reasoning
  as in test_sched_emulated.py; the expert split, which adds the experts in another order, within
  shared_expert_checks.assert_split_rows_close's bounds.
* Statistics against quantities computed here: offloaded / kept ops per MoE layer (the dense layer has none),
  uploaded and skipped expert bytes from the selected experts (expert_counts deltas) and the tensor sizes.

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays the prompts (the model seed is printed).
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer
from shared_expert_checks import (assert_logits_close, check_active_only_uploads, check_expert_split,
                                  check_exps_rule_placement, check_logits_match_cpu, emulated, layer_of, moe_layers,
                                  write_sched_model)
from test_sched_emulated import check_expert_split_auto_and_off


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> moeinfer.Model:
    return write_sched_model(tmp_path_factory, "glm4moe", "tiny", "glm4moe")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> moeinfer.Model:
    """Skewed routing: ubatches of 4 tokens leave several of the 16 experts unselected."""
    return write_sched_model(tmp_path_factory, "glm4moe", "tiny", "glm4moe-skewed", routing_skew=0.6)


def test_exps_override_keeps_shared_experts_and_dense_ffn_on_the_device(model):
    seen = check_exps_rule_placement(model)
    # The sigmoid router's selection bias in every MoE layer; the NextN layer's tensors placed nowhere.
    assert seen["bias"] == len(moe_layers(model)) and seen["unused"] > 0


def test_shexp_override_moves_only_the_shared_experts(model):
    ctx = emulated(model, tensor_overrides="shexp=CPU")
    for t in model.tensors:
        if layer_of(t.name) < model.info.n_layer:
            assert ctx.tensor_location(t.name)[0] == ("host" if "_shexp." in t.name else "device"), t.name


@pytest.mark.parametrize("placement", [{"tensor_overrides": "exps=CPU"}, {"n_cpu_moe": 2}, {}],
                         ids=["exps-host", "layers01-host", "all-device"])
@pytest.mark.parametrize("expert_copy", ["full", "active"])
@pytest.mark.parametrize("bias_dup", [True, False])
def test_logits_match_cpu(model, rng, placement, expert_copy, bias_dup):
    # n_cpu_moe=2 puts the experts of layers 0 and 1 in host RAM: layer 0 has none, so one MoE layer.
    check_logits_match_cpu(model, rng, placement, expert_copy, bias_dup)


def test_dense_layer_on_host_offloads_its_ffn(model, rng):
    """n_gpu_layers=2: layer 0 (the dense FFN), the embeddings and the head in host RAM; their products offload
    above the threshold, and layer 0 has no expert op to count."""
    policy = moeinfer.Policy(expert_split=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, n_gpu_layers=2)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt, logits_all=True), cpu.decode(prompt, logits_all=True))
    s = emu.stats()
    assert emu.tensor_location("blk.0.ffn_up.weight")[0] == "host"
    assert s["n_offloaded"]["mul_mat"] > 0 and s["n_kept_host"]["mul_mat"] > 0
    assert s["n_offloaded"]["mul_mat_id"] == s["n_kept_host"]["mul_mat_id"] == 0


@pytest.mark.parametrize("bias_dup", [True, False])
def test_active_only_uploads_exactly_the_selected_experts(skewed, rng, bias_dup):
    check_active_only_uploads(skewed, rng, bias_dup, sizes=[4, 4, 2, 4, 4, 2], require_skipped=True)


def test_expert_split_matches_cpu_and_uploads_only_the_device_experts(model, rng):
    check_expert_split(model, rng, "full", n_split=2, sizes=[4, 2, 4, 4, 1])


def test_expert_split_auto_and_off(model, rng):
    """Only MoE layers split (the leading dense layer has no experts)."""
    check_expert_split_auto_and_off(model, rng, len(moe_layers(model)))
