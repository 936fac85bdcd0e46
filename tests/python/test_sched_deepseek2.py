"""The hybrid scheduler on deepseek2 (emulated device: a host-memory backend that plays the GPU), as
test_sched_emulated.py checks it on qwen3moe and gpt-oss: placement rules, offload thresholds, FULL and
ACTIVE_ONLY expert copies and the expert split, against a CPU context on the same fresh random model and
prompt (max |emulated - cpu| <= 1e-4 * max |cpu| per token: only op placement differs) and against
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

pytestmark = pytest.mark.fast

ARCH = "deepseek2"
REL_TOL = 1e-4


@pytest.fixture(scope="module", params=["tiny", "tiny-lite"])
def model(request, tmp_path_factory) -> moeinfer.Model:
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("sched-ds2") / f"{request.param}.gguf"
    moeinfer.synth_write(str(path), ARCH, preset=request.param, seed=seed)
    return moeinfer.Model(str(path))


def emulated(model, policy=None, **kw) -> moeinfer.Context:
    kw.setdefault("n_ctx", 128)
    return moeinfer.Context(model, device="emulated", policy=policy, **kw)


def is_expert_tensor(name: str) -> bool:
    return "_exps." in name


def moe_layers(model) -> list[int]:
    return sorted({int(t.name.split(".")[1]) for t in model.tensors if is_expert_tensor(t.name)})


def expert_bytes(model) -> int:
    """Bytes of one expert's up + gate + down weights (the same in every MoE layer of a synthetic model)."""
    il = moe_layers(model)[0]
    return sum(t.n_bytes for t in model.tensors if t.name.startswith(f"blk.{il}.") and is_expert_tensor(t.name)) \
        // model.info.n_expert


def assert_logits_close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    err = np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)
    assert np.all(err <= REL_TOL), f"worst token: {err.max():.3g} relative (bound {REL_TOL})"


def test_exps_rule_leaves_shared_experts_and_dense_layers_on_the_device(model):
    ctx = emulated(model, tensor_overrides="exps=CPU")
    names = [t.name for t in model.tensors]
    assert any("_shexp." in n for n in names) and any(n.startswith("blk.0.ffn_up.") for n in names)
    for t in model.tensors:
        assert ctx.tensor_location(t.name)[0] == ("host" if is_expert_tensor(t.name) else "device"), t.name
    assert moe_layers(model) == list(range(1, model.info.n_layer))  # layer 0 is dense


@pytest.mark.parametrize("placement", [{"tensor_overrides": "exps=CPU"}, {"n_gpu_layers": 1}, {}],
                         ids=["exps-host", "layers-host", "all-device"])
@pytest.mark.parametrize("expert_copy", ["full", "active"])
def test_logits_match_cpu(model, rng, placement, expert_copy):
    # Offload from 5 tokens: the prompt's ubatches of 8 and 8 go to the device, its last 3 and the decodes stay.
    policy = moeinfer.Policy(expert_copy=expert_copy, expert_split=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, **placement)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt, logits_all=True), cpu.decode(prompt, logits_all=True))
    for _ in range(3):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        assert_logits_close(emu.decode(tok), cpu.decode(tok))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    if "tensor_overrides" in placement:
        n_moe = len(moe_layers(model))
        for op in ("mul_mat_id", "moe_up_gate"):
            assert s["n_offloaded"][op] == 2 * n_moe and s["n_kept_host"][op] == 4 * n_moe, (op, s)
        assert s["n_offloaded"]["mul_mat"] == s["n_kept_host"]["mul_mat"] == 0
    if "n_gpu_layers" in placement:
        assert s["n_offloaded"]["mul_mat"] > 0 and s["n_kept_host"]["mul_mat"] > 0


def test_expert_counts_cover_only_the_moe_layers(model, rng):
    emu = emulated(model, moeinfer.Policy(offload="all=1"), n_ubatch=8, tensor_overrides="exps=CPU")
    prompt = rng.integers(0, model.info.n_vocab, size=21, dtype=np.int32)
    emu.decode(prompt)
    counts = emu.expert_counts()
    assert counts.shape == (model.info.n_layer, model.info.n_expert)
    assert not counts[0].any()  # the dense layer routes nothing
    assert np.all(counts[1:].sum(axis=1) == 21 * model.info.n_expert_used)


def test_active_only_uploads_exactly_the_selected_experts(model, rng):
    eb = expert_bytes(model)
    n_expert, n_moe = model.info.n_expert, len(moe_layers(model))
    policy = moeinfer.Policy(expert_copy="active", expert_split=0).parse_offload("all=3")
    ctx = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    ctx.reset_stats()
    sizes = [4, 2, 4, 4, 1, 4]
    want_experts = want_skipped = 0
    before = ctx.expert_counts()
    for n in sizes:
        ctx.decode(rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32))
        after = ctx.expert_counts()
        delta = after - before
        before = after
        if n >= 3:
            selected = np.count_nonzero(delta[1:], axis=1)
            want_experts += int(selected.sum()) * eb
            want_skipped += int((n_expert - selected).sum()) * eb
    s = ctx.stats()
    n_big = sum(n >= 3 for n in sizes)
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == n_big * n_moe
    assert s["n_kept_host"]["mul_mat_id"] == (len(sizes) - n_big) * n_moe
    assert s["bytes_weights_experts"] == want_experts
    assert s["bytes_weights_skipped"] == want_skipped
    assert s["n_id_readbacks"] == n_big * n_moe


def test_expert_split_matches_cpu_and_uploads_only_the_device_experts(model, rng):
    eb = expert_bytes(model)
    n_expert, n_moe = model.info.n_expert, len(moe_layers(model))
    policy = moeinfer.Policy(expert_copy="full", expert_split=3).parse_offload("all=3")
    emu = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=4)
    sizes = [4, 2, 4, 1]
    for n in sizes:
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        assert_logits_close(emu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    split = sum(n >= 3 for n in sizes) * n_moe
    assert s["n_split_layers"] == split
    assert s["n_split_host_experts"] == 3 * split
    assert s["bytes_weights_experts"] == split * (n_expert - 3) * eb
    assert s["bytes_weights_skipped"] == split * 3 * eb
