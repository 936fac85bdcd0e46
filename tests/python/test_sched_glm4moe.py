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
  as in test_sched_emulated.py.
* Statistics against quantities computed here: offloaded / kept ops per MoE layer (the dense layer has none),
  uploaded and skipped expert bytes from the selected experts (expert_counts deltas) and the tensor sizes.

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays the prompts (the model seed is printed).
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer

REL_TOL = 1e-4
N_DENSE = 1  # the tiny preset's leading dense layers


def write(tmp_path_factory, name, **kw) -> moeinfer.Model:
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("sched") / f"{name}.gguf"
    moeinfer.synth_write(str(path), "glm4moe", preset="tiny", seed=seed, **kw)
    return moeinfer.Model(str(path))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> moeinfer.Model:
    return write(tmp_path_factory, "glm4moe")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> moeinfer.Model:
    """Skewed routing: ubatches of 4 tokens leave several of the 16 experts unselected."""
    return write(tmp_path_factory, "glm4moe-skewed", routing_skew=0.6)


def emulated(model, policy=None, **kw) -> moeinfer.Context:
    kw.setdefault("n_ctx", 128)
    return moeinfer.Context(model, device="emulated", policy=policy, **kw)


def n_moe_layers(model) -> int:
    return model.info.n_layer - N_DENSE


def layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def routed_expert_bytes(model) -> tuple[int, int]:
    """(up + gate, down) bytes of one routed expert (the same in every MoE layer)."""
    sizes = {}
    for t in model.tensors:
        if layer_of(t.name) == N_DENSE:
            sizes[t.name.split(".", 2)[2]] = t.n_bytes // model.info.n_expert
    return sizes["ffn_up_exps.weight"] + sizes["ffn_gate_exps.weight"], sizes["ffn_down_exps.weight"]


def assert_logits_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    err = np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)
    assert np.all(err <= REL_TOL), f"worst token: {err.max():.3g} relative (bound {REL_TOL})"


def test_exps_override_keeps_shared_experts_and_dense_ffn_on_the_device(model):
    ctx = emulated(model, tensor_overrides="exps=CPU")
    n_layer = model.info.n_layer
    seen = {"shexp": 0, "dense": 0, "bias": 0, "routed": 0, "nextn": 0}
    host = 0
    for t in model.tensors:
        if layer_of(t.name) >= n_layer:  # the NextN layer: not a weight of the model that runs
            with pytest.raises(KeyError, match=t.name.replace(".", r"\.")):
                ctx.tensor_location(t.name)
            seen["nextn"] += 1
            continue
        where, _ = ctx.tensor_location(t.name)
        routed = "_exps." in t.name
        assert where == ("host" if routed else "device"), t.name
        seen["routed"] += routed
        host += t.n_bytes if routed else 0
        seen["shexp"] += "_shexp." in t.name
        seen["dense"] += t.name.endswith(("ffn_up.weight", "ffn_gate.weight", "ffn_down.weight"))
        seen["bias"] += "exp_probs_b" in t.name
    # Every kind present: 3 routed and 3 shared per MoE layer, 3 dense FFN matrices per dense layer.
    assert seen["routed"] == seen["shexp"] == 3 * n_moe_layers(model)
    assert seen["dense"] == 3 * N_DENSE and seen["bias"] == n_moe_layers(model) and seen["nextn"] > 0
    # The model's expert bytes are those of the layers run: the NextN layer's experts are never loaded.
    assert host == model.info.n_expert_bytes


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
    n_host_layers = {"tensor_overrides": n_moe_layers(model), "n_cpu_moe": 1}.get(next(iter(placement), ""), 0)
    policy = moeinfer.Policy(expert_copy=expert_copy, bias_dup=bias_dup, expert_split=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, **placement)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt, logits_all=True), cpu.decode(prompt, logits_all=True))
    for _ in range(3):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        assert_logits_close(emu.decode(tok), cpu.decode(tok))
    s = emu.stats()
    # The two 8-token ubatches offload each host MoE layer's expert ops; the 3-token one and the decodes don't.
    for op in ("mul_mat_id", "moe_up_gate"):
        assert s["n_offloaded"][op] == 2 * n_host_layers, (op, s)
        assert s["n_kept_host"][op] == 4 * n_host_layers, (op, s)
    # The shared experts and the dense FFN are plain products of device weights: nothing to offload.
    assert s["n_offloaded"]["mul_mat"] == s["n_kept_host"]["mul_mat"] == 0


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
    m = skewed
    up_gate, down = routed_expert_bytes(m)
    n_expert, n_moe = m.info.n_expert, n_moe_layers(m)
    policy = moeinfer.Policy(expert_copy="active", bias_dup=bias_dup, expert_split=0).parse_offload("all=3")
    ctx = emulated(m, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    sizes = [4, 4, 2, 4, 4, 2]
    want_experts = want_skipped = 0
    before = ctx.expert_counts()
    for n in sizes:
        ctx.decode(rng.integers(0, m.info.n_vocab, size=n, dtype=np.int32))
        after = ctx.expert_counts()
        delta = (after - before)[N_DENSE:]  # the dense layer's row stays zero
        before = after
        assert np.all(delta.sum(axis=1) == n * m.info.n_expert_used)
        if n >= 3:
            selected = np.count_nonzero(delta, axis=1)
            want_experts += int(selected.sum()) * (up_gate + down)
            want_skipped += int((n_expert - selected).sum()) * (up_gate + down)
    assert not after[:N_DENSE].any()
    s = ctx.stats()
    n_big = sum(n >= 3 for n in sizes)
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == n_big * n_moe
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == (len(sizes) - n_big) * n_moe
    assert s["bytes_weights_experts"] == want_experts
    assert s["bytes_weights_skipped"] == want_skipped
    assert want_skipped > 0, "every expert selected: the test would not see a skipped one"
    assert s["bytes_weights_full"] == 0  # no expert biases in glm4moe: bias_dup changes nothing
    assert s["n_id_readbacks"] == n_big * n_moe


@pytest.mark.parametrize("expert_copy", ["full", "prefetch"])
def test_expert_split_matches_cpu_and_uploads_only_the_device_experts(model, rng, expert_copy):
    up_gate, down = routed_expert_bytes(model)
    n_expert, n_moe = model.info.n_expert, n_moe_layers(model)
    policy = moeinfer.Policy(expert_copy=expert_copy, expert_split=2).parse_offload("all=3")
    emu = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=4)
    sizes = [4, 2, 4, 4, 1]
    for n in sizes:
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        assert_logits_close(emu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    split = sum(n >= 3 for n in sizes) * n_moe
    assert s["n_split_layers"] == split
    assert s["n_split_host_experts"] == 2 * split
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == split
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == split + 2 * n_moe
    assert s["bytes_weights_experts"] == split * (n_expert - 2) * (up_gate + down)
    assert s["bytes_weights_skipped"] == split * 2 * (up_gate + down)


def test_expert_split_auto_and_off(model, rng):
    """Automatic splits (whatever count the measured costs pick) still add up to the CPU path, and split only
    MoE layers; 0 never splits."""
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    auto = emulated(model, moeinfer.Policy(expert_split=-1).parse_offload("all=3"), n_ubatch=8,
                    tensor_overrides="exps=CPU")
    off = emulated(model, moeinfer.Policy(expert_split=0).parse_offload("all=3"), n_ubatch=8,
                   tensor_overrides="exps=CPU")
    for n in (8, 8, 5):
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        want = cpu.decode(tokens, logits_all=True)
        assert_logits_close(auto.decode(tokens, logits_all=True), want)
        assert_logits_close(off.decode(tokens, logits_all=True), want)
    s = auto.stats()
    assert s["n_split_layers"] % n_moe_layers(model) == 0
    assert s["n_split_layers"] <= s["n_split_host_experts"] <= s["n_split_layers"] * (model.info.n_expert - 1)
    assert off.stats()["n_split_layers"] == 0
