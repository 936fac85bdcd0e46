"""The hybrid scheduler on the emulated device (device="emulated": a host-memory backend that plays the GPU,
with its own buffers and explicit copies, computing with the CPU kernels), so it runs without a GPU.

What is checked, against what:
* Placement (tensor_overrides, n_cpu_moe) against the rules applied in Python to the model's tensor names.
* Logits of emulated contexts (experts in host RAM, offloaded or kept on the host per ubatch; FULL and
  ACTIVE_ONLY expert copies; bias duplication on and off) against a CPU context on the same fresh random
  model and prompt. Both sides compute with the same CPU kernels, so only op placement differs; the bound is
  max |emulated - cpu| <= 1e-4 * max |cpu| per token (float32 has ~6e-8 relative resolution: 1e-4 leaves room
  for a different summation order without letting a wrong expert, bias or slice through, which moves logits
  by O(1e-1)).
* Scheduler statistics against quantities computed independently in the test: expert bytes from the
  tensor shapes and types, the experts each ubatch selected from expert_counts() deltas, and op counts
  from the number of ubatches and layers.

Random data is fresh on every run; MOEINFER_TEST_SEED=<seed> replays the prompts (the model seed is printed).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import moeinfer

ARCHS = ("qwen3moe", "gpt-oss")
OPS = ("mul_mat", "mul_mat_id", "moe_up_gate")
REL_TOL = 1e-4
PAD = 4096  # at most this much alignment padding per tensor in the placement figures
STATS_KEYS = {"n_ubatches", "n_splits", "bytes_weights_full", "bytes_weights_experts", "bytes_weights_skipped",
              "bytes_activations", "n_weight_copies", "n_activation_copies", "n_id_readbacks", "n_offloaded",
              "n_kept_host", "n_ops_host", "n_ops_device", "seconds_total", "seconds_host_compute", "seconds_wait",
              "weights_host_bytes", "weights_device_bytes", "n_layer", "n_expert", "seconds_device_submit",
              "n_split_layers", "n_split_host_experts", "n_split_trials", "weights_host_pinned_bytes",
              "bytes_between_devices",
              "n_cache_hits", "n_cache_misses", "bytes_cache_saved", "bytes_weights_relayed",
              # the offload thresholds in effect and what measured ones came from (docs/POLICY.md)
              "offload_min_batch", "offload_min_batch_source", "offload_link_gbps", "offload_host_gbps",
              "offload_device_gbps", "offload_host_prefill_gbps"}
# Figures of the context, which reset_stats() leaves alone.
CONTEXT_KEYS = {"weights_host_bytes", "weights_device_bytes", "n_layer", "n_expert", "weights_host_pinned_bytes",
                "offload_min_batch", "offload_min_batch_source", "offload_link_gbps", "offload_host_gbps",
                "offload_device_gbps", "offload_host_prefill_gbps"}


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory) -> moeinfer.Model:
    """A tiny model of each architecture with fresh random weights (gpt-oss has expert biases)."""
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("sched") / f"{request.param}.gguf"
    moeinfer.synth_write(str(path), request.param, preset="tiny", seed=seed)
    return moeinfer.Model(str(path))


@pytest.fixture(scope="module")
def skewed(tmp_path_factory) -> moeinfer.Model:
    """gpt-oss with skewed routing: small ubatches leave several experts unselected."""
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("sched") / "gpt-oss-skewed.gguf"
    moeinfer.synth_write(str(path), "gpt-oss", preset="tiny", seed=seed, routing_skew=0.6)
    return moeinfer.Model(str(path))


def emulated(model, policy=None, **kw) -> moeinfer.Context:
    kw.setdefault("n_ctx", 128)
    return moeinfer.Context(model, device="emulated", policy=policy, **kw)


def is_expert_tensor(name: str) -> bool:
    return "_exps." in name


@dataclasses.dataclass(frozen=True)
class ExpertBytes:
    """Bytes of one expert's slice of a layer's expert tensors, from the shapes and types."""
    up_gate: int       # ffn_up_exps.weight + ffn_gate_exps.weight
    down: int          # ffn_down_exps.weight
    up_gate_bias: int  # ffn_up_exps.bias + ffn_gate_exps.bias (0 without biases)
    down_bias: int


def expert_bytes(model: moeinfer.Model) -> ExpertBytes:
    """Per-expert bytes, the same for every layer of a synthetic model (checked)."""
    per: dict[tuple[int, str], int] = {}
    n_expert = model.info.n_expert
    for t in model.tensors:
        if not is_expert_tensor(t.name):
            continue
        layer = int(t.name.split(".")[1])
        kind = t.name.split(".", 2)[2]  # e.g. "ffn_up_exps.weight"
        assert t.shape[0] == n_expert, t
        rows = int(np.prod(t.shape[1:-1], dtype=np.int64))  # 1 for a bias [n_expert, n]
        per[(layer, kind)] = moeinfer.row_bytes(t.type, t.shape[-1]) * rows
        assert per[(layer, kind)] * n_expert == t.n_bytes
    layers = {layer for layer, _ in per}
    assert layers == set(range(model.info.n_layer))
    for kind in {k for _, k in per}:
        assert len({per[(layer, kind)] for layer in layers}) == 1, kind
    get = lambda kind: per.get((0, kind), 0)  # noqa: E731
    return ExpertBytes(get("ffn_up_exps.weight") + get("ffn_gate_exps.weight"), get("ffn_down_exps.weight"),
                       get("ffn_up_exps.bias") + get("ffn_gate_exps.bias"), get("ffn_down_exps.bias"))


def row_errors(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """max |got - ref| / max |ref| per token (row), after checking shapes and that got is finite."""
    assert got.shape == ref.shape
    assert np.all(np.isfinite(got))
    return np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)


def assert_logits_close(got: np.ndarray, ref: np.ndarray) -> None:
    err = row_errors(got, ref)
    assert np.all(err <= REL_TOL), f"worst token: {err.max():.3g} relative (bound {REL_TOL})"


def check_placement_figures(ctx: moeinfer.Context, tensors) -> int:
    """The context's placement figures (weights_host_bytes, weights_device_bytes) against the bytes of `tensors`
    where ctx placed them: each tensor's allocation is padded to the buffer alignment (less than PAD more), and a
    tensor duplicated on the device (an expert bias under bias_dup) counts on both sides. Returns the bytes in
    host RAM."""
    host = device = n_host = n_device = 0
    for t in tensors:
        where, duplicated = ctx.tensor_location(t.name)
        if where == "host":
            host += t.n_bytes
            n_host += 1
        if where == "device" or duplicated:
            device += t.n_bytes
            n_device += 1
    s = ctx.stats()
    assert 0 <= s["weights_host_bytes"] - host < PAD * n_host
    assert 0 <= s["weights_device_bytes"] - device < PAD * n_device
    return host


# ---------------------------------------------------------------------------------------------
# placement
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias_dup", [True, False])
def test_experts_on_host_with_override(model, bias_dup):
    ctx = emulated(model, moeinfer.Policy(bias_dup=bias_dup), tensor_overrides="exps=CPU")
    assert ctx.device == "emulated"
    for t in model.tensors:
        where, duplicated = ctx.tensor_location(t.name)
        if is_expert_tensor(t.name):
            assert where == "host", t.name
            # Expert biases are kept on both sides when bias_dup is on; weights never are.
            assert duplicated == (bias_dup and t.name.endswith(".bias")), t.name
        else:
            assert (where, duplicated) == ("device", False), t.name
    assert check_placement_figures(ctx, model.tensors) == model.info.n_expert_bytes
    with pytest.raises(KeyError, match="no_such.weight"):
        ctx.tensor_location("no_such.weight")


def test_override_list_and_n_cpu_moe(model):
    ctx = emulated(model, tensor_overrides=[r"ffn_up_exps\.weight=CPU", "ffn_gate_exps=cpu"])
    for t in model.tensors:
        host = "ffn_up_exps.weight" in t.name or "ffn_gate_exps" in t.name
        assert ctx.tensor_location(t.name)[0] == ("host" if host else "device"), t.name

    ctx = emulated(model, n_cpu_moe=1)
    for t in model.tensors:
        host = is_expert_tensor(t.name) and t.name.startswith("blk.0.")
        assert ctx.tensor_location(t.name)[0] == ("host" if host else "device"), t.name

    # First match wins: the GPU rule for layer 1 comes before the catch-all CPU rule.
    ctx = emulated(model, tensor_overrides=r"blk\.1\..*exps=GPU,exps=CPU")
    for t in model.tensors:
        host = is_expert_tensor(t.name) and not t.name.startswith("blk.1.")
        assert ctx.tensor_location(t.name)[0] == ("host" if host else "device"), t.name


@pytest.mark.parametrize("overrides, needle", [("exps=TPU", "exps=TPU"), ("([=CPU", "([")])
def test_bad_override_names_the_entry(model, overrides, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        emulated(model, tensor_overrides=overrides)


def test_n_gpu_layers_keeps_the_first_layers_and_the_head_on_host(model):
    ctx = emulated(model, n_gpu_layers=1)  # of 2 layers: layer 1 on the device
    for t in model.tensors:
        host = t.name.startswith("blk.0.") or not t.name.startswith("blk.")  # token_embd, output* with layer 0
        assert ctx.tensor_location(t.name)[0] == ("host" if host else "device"), t.name
    ctx = emulated(model, n_gpu_layers=model.info.n_layer + 1)  # more than the layers: the head too
    assert all(ctx.tensor_location(t.name)[0] == "device" for t in model.tensors)


def test_vram_budget_moves_experts_to_host_from_the_first_layer(model):
    everything = emulated(model).stats()["weights_device_bytes"]
    assert emulated(model).stats()["weights_host_bytes"] == 0
    weights = [t for t in model.tensors if is_expert_tensor(t.name) and t.name.endswith(".weight")]
    largest = max(t.n_bytes for t in weights)
    # 1.5 expert tensors too many (all are the same size): experts are placed one by one (per-expert placement,
    # 5f15fe9), whole layers from the last one without a profile, so layer 0's expert tensors stay whole in host
    # RAM and only some of its experts are resident (a device slice), about half of them; layer 1 stays whole.
    budget = everything - largest * 3 // 2
    ctx = emulated(model, vram_budget=budget)
    host = [t.name for t in model.tensors if ctx.tensor_location(t.name)[0] == "host"]
    layer0 = {w.name for w in weights if w.name.startswith("blk.0.")}
    assert set(host) - layer0 <= {t.name for t in model.tensors if is_expert_tensor(t.name)} and layer0 <= set(host), host
    assert not any(n.startswith("blk.1.") for n in host), host
    resident = ctx.resident_experts()["n_experts"]
    assert 0 < resident[0] < model.info.n_expert and resident[1] == model.info.n_expert, resident
    assert ctx.stats()["weights_device_bytes"] <= budget
    non_expert = sum(t.n_bytes for t in model.tensors if not is_expert_tensor(t.name))
    with pytest.raises(MemoryError, match="budget"):
        emulated(model, vram_budget=non_expert // 2)


# ---------------------------------------------------------------------------------------------
# logits: emulated hybrid contexts against the CPU context
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("placement", [{"tensor_overrides": "exps=CPU"}, {"n_cpu_moe": 1}, {}],
                         ids=["exps-host", "layer0-host", "all-device"])
@pytest.mark.parametrize("expert_copy", ["full", "active"])
@pytest.mark.parametrize("bias_dup", [True, False])
def test_logits_match_cpu(model, rng, placement, expert_copy, bias_dup):
    n_layer = model.info.n_layer
    n_host_layers = {"tensor_overrides": n_layer, "n_cpu_moe": 1}.get(next(iter(placement), ""), 0)
    # Expert ops offload from 5 tokens: the prompt's ubatches of 8 and 8 tokens go to the device, its last
    # ubatch of 3 and the single-token decodes stay on the host.
    # The offload threshold alone: an expert cache holding whole matrices takes smaller ubatches to the
    # device too (test_sched_cache.py).
    policy = moeinfer.Policy(expert_copy=expert_copy, bias_dup=bias_dup, expert_split=0,
                             expert_cache=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, **placement)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt, logits_all=True), cpu.decode(prompt, logits_all=True))
    for _ in range(3):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        assert_logits_close(emu.decode(tok), cpu.decode(tok))
    assert emu.n_past == cpu.n_past == 22

    s = emu.stats()
    assert s["n_ubatches"] == 3 + 3
    # Both paths ran: per layer whose experts are in host RAM, one offloaded op of each kind in each of the
    # two 8-token ubatches, and the 4 small ubatches kept on the host.
    for op in ("mul_mat_id", "moe_up_gate"):
        assert s["n_offloaded"][op] == 2 * n_host_layers, (op, s)
        assert s["n_kept_host"][op] == 4 * n_host_layers, (op, s)
    # Dense weights are on the device: no mul_mat has host weights.
    assert s["n_offloaded"]["mul_mat"] == s["n_kept_host"]["mul_mat"] == 0


@pytest.mark.parametrize("expert_copy", ["full", "active"])
def test_logits_match_cpu_with_dense_weights_on_host(model, rng, expert_copy):
    """n_gpu_layers=1: layer 0 and the embeddings / head in host RAM, so mul_mat offloads as well."""
    # The offload threshold alone: an expert cache holding whole matrices takes smaller ubatches to the
    # device too (test_sched_cache.py).
    policy = moeinfer.Policy(expert_copy=expert_copy, expert_split=0,
                             expert_cache=0).parse_offload("all=5")
    emu = emulated(model, policy, n_ubatch=8, n_gpu_layers=1)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    prompt = rng.integers(0, model.info.n_vocab, size=19, dtype=np.int32)
    assert_logits_close(emu.decode(prompt, logits_all=True), cpu.decode(prompt, logits_all=True))
    tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
    assert_logits_close(emu.decode(tok), cpu.decode(tok))
    s = emu.stats()
    assert s["n_offloaded"]["mul_mat"] > 0 and s["n_kept_host"]["mul_mat"] > 0
    assert s["n_offloaded"]["mul_mat_id"] == 2 and s["n_kept_host"]["mul_mat_id"] == 2  # layer 0 only
    assert s["bytes_weights_full"] > 0  # dense weights are always uploaded whole


def test_expert_counts_match_cpu_and_sum_to_tokens_times_top_k(model, rng):
    emu = emulated(model, moeinfer.Policy(offload="all=1"), n_ubatch=8, tensor_overrides="exps=CPU")
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=8)
    first = rng.integers(0, model.info.n_vocab, size=3, dtype=np.int32)
    for ctx in (emu, cpu):
        ctx.decode(first)
        ctx.reset_stats()
    prompt = rng.integers(0, model.info.n_vocab, size=21, dtype=np.int32)
    emu.decode(prompt)
    cpu.decode(prompt)
    counts = emu.expert_counts()
    assert counts.dtype == np.uint64 and counts.shape == (model.info.n_layer, model.info.n_expert)
    # Each token selects n_expert_used experts in every layer; reset_stats dropped the first 3 tokens.
    assert np.all(counts.sum(axis=1) == 21 * model.info.n_expert_used)
    # The same routing as on the CPU (the router and its inputs are computed identically).
    np.testing.assert_array_equal(counts, cpu.expert_counts())
    emu.reset_stats()
    assert not emu.expert_counts().any()
    assert emu.stats()["n_ubatches"] == 0


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------

def decode_ubatches(ctx, rng, n_vocab, sizes):
    """One decode per ubatch; yields (size, expert_counts delta) after each."""
    before = ctx.expert_counts()
    for n in sizes:
        ctx.decode(rng.integers(0, n_vocab, size=n, dtype=np.int32))
        after = ctx.expert_counts()
        yield n, after - before
        before = after


@pytest.mark.parametrize("bias_dup", [True, False])
def test_active_only_uploads_exactly_the_selected_experts(skewed, rng, bias_dup):
    m = skewed
    eb = expert_bytes(m)
    n_layer, n_expert = m.info.n_layer, m.info.n_expert
    # Thresholds of 3 tokens: ubatches of 4 offload, those of 2 stay on the host.
    # The upload slots alone (test_sched_cache.py counts what the expert cache saves).
    policy = moeinfer.Policy(expert_copy="active", bias_dup=bias_dup, expert_split=0,
                             expert_cache=0).parse_offload("all=3")
    ctx = emulated(m, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    ctx.reset_stats()
    sizes = [4, 4, 2, 4, 4, 4, 2, 4]
    want_experts = want_skipped = n_offloaded_layers = 0
    for n, delta in decode_ubatches(ctx, rng, m.info.n_vocab, sizes):
        assert np.all(delta.sum(axis=1) == n * m.info.n_expert_used)
        if n < 3:
            continue
        selected = np.count_nonzero(delta, axis=1)  # per layer
        want_experts += int(selected.sum()) * (eb.up_gate + eb.down)
        want_skipped += int((n_expert - selected).sum()) * (eb.up_gate + eb.down)
        n_offloaded_layers += n_layer
    s = ctx.stats()
    assert s["n_ubatches"] == len(sizes)
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == n_offloaded_layers
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == sizes.count(2) * n_layer
    # Selected experts from the counts, against what the scheduler says it uploaded and skipped.
    assert s["bytes_weights_experts"] == want_experts
    assert s["bytes_weights_skipped"] == want_skipped
    assert want_skipped > 0, "every expert selected: the test would not see a skipped one"
    # Together: every expert of every offloaded op, once.
    assert s["bytes_weights_experts"] + s["bytes_weights_skipped"] == (
        s["n_offloaded"]["moe_up_gate"] * n_expert * eb.up_gate + s["n_offloaded"]["mul_mat_id"] * n_expert * eb.down)
    # Biases: duplicated ones never travel; otherwise each offloaded up/gate op uploads its two biases whole.
    # (The down bias is not an input of MUL_MAT_ID: a GET_ROWS gathers the selected experts' rows, and those
    # travel as activations.)
    want_full = 0 if bias_dup else s["n_offloaded"]["moe_up_gate"] * n_expert * eb.up_gate_bias
    assert s["bytes_weights_full"] == want_full
    # One readback of the router's choices per offloaded layer, shared by up/gate and down.
    assert s["n_id_readbacks"] == n_offloaded_layers


def test_full_copy_uploads_whole_expert_tensors(model, rng):
    eb = expert_bytes(model)
    n_layer, n_expert = model.info.n_layer, model.info.n_expert
    policy = moeinfer.Policy(expert_copy="full", bias_dup=False, expert_split=0, expert_cache=0).parse_offload("all=3")
    ctx = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    for _ in decode_ubatches(ctx, rng, model.info.n_vocab, [4, 2, 4]):
        pass
    s = ctx.stats()
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == 2 * n_layer
    # Whole expert tensors, plus the up/gate biases (bias_dup off; see the ACTIVE_ONLY test for the down bias).
    assert s["bytes_weights_full"] == 2 * n_layer * n_expert * (eb.up_gate + eb.down + eb.up_gate_bias)
    assert s["bytes_weights_experts"] == s["bytes_weights_skipped"] == 0
    assert s["n_id_readbacks"] == 0
    assert s["n_weight_copies"] > 0 and s["bytes_activations"] > 0 and s["n_activation_copies"] > 0


def test_expert_split_matches_cpu_and_uploads_only_the_device_experts(model, rng):
    """expert_split=2: in each offloaded ubatch, the host computes 2 experts of every layer and the device the
    others, whose weights alone are uploaded (full copies, no expert cache; test_sched_cache.py has the
    device part under active copies, which uploads only its group's selected experts)."""
    eb = expert_bytes(model)
    n_layer, n_expert = model.info.n_layer, model.info.n_expert
    policy = moeinfer.Policy(expert_copy="full", expert_split=2, expert_cache=0).parse_offload("all=3")
    emu = emulated(model, policy, n_ubatch=4, tensor_overrides="exps=CPU")
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=4)
    sizes = [4, 2, 4, 4, 1]
    for n in sizes:
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        assert_logits_close(emu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))
    np.testing.assert_array_equal(emu.expert_counts(), cpu.expert_counts())
    s = emu.stats()
    split = sum(n >= 3 for n in sizes) * n_layer
    assert s["n_split_layers"] == split
    assert s["n_split_host_experts"] == 2 * split
    # The device part: its op of each kind per split layer; the host part and the small ubatches: the rest.
    assert s["n_offloaded"]["mul_mat_id"] == s["n_offloaded"]["moe_up_gate"] == split
    assert s["n_kept_host"]["mul_mat_id"] == s["n_kept_host"]["moe_up_gate"] == split + 2 * n_layer
    assert s["bytes_weights_experts"] == split * (n_expert - 2) * (eb.up_gate + eb.down)
    assert s["bytes_weights_skipped"] == split * 2 * (eb.up_gate + eb.down)
    assert s["n_id_readbacks"] == 0  # the groups are known before the ubatch: nothing waits for the router


def check_expert_split_auto_and_off(model, rng, n_moe_layers: int) -> None:
    """Automatic splits (whatever count the measured costs pick) still add up to the CPU path, all MoE layers of
    a ubatch or none, each split layer with 1 .. n_expert - 1 experts on the host; 0 never splits."""
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
    assert s["n_split_layers"] % n_moe_layers == 0
    assert s["n_split_layers"] <= s["n_split_host_experts"] <= s["n_split_layers"] * (model.info.n_expert - 1)
    assert off.stats()["n_split_layers"] == 0


def test_expert_split_auto_and_off(model, rng):
    check_expert_split_auto_and_off(model, rng, model.info.n_layer)


def test_stats_fields_and_types(model, rng):
    ctx = emulated(model, tensor_overrides="exps=CPU")
    ctx.decode(rng.integers(0, model.info.n_vocab, size=5, dtype=np.int32))
    s = ctx.stats()
    assert set(s) == STATS_KEYS
    assert set(s["n_offloaded"]) == set(s["n_kept_host"]) == set(OPS)
    assert s["n_layer"] == model.info.n_layer and s["n_expert"] == model.info.n_expert
    assert s["n_ubatches"] == 1 and s["n_splits"] >= 1
    assert s["n_ops_host"] > 0 and s["n_ops_device"] > 0
    assert s["seconds_total"] > 0
    assert 0 <= s["seconds_host_compute"] <= s["seconds_total"] and 0 <= s["seconds_wait"] <= s["seconds_total"]
    placement = {k: s[k] for k in CONTEXT_KEYS}
    ctx.reset_stats()
    s = ctx.stats()
    assert {k: s[k] for k in CONTEXT_KEYS} == placement
    assert all(s[k] == 0 for k in STATS_KEYS - CONTEXT_KEYS - {"n_offloaded", "n_kept_host"})
    assert not any(s["n_offloaded"].values()) and not any(s["n_kept_host"].values())


# ---------------------------------------------------------------------------------------------
# policy on a context
# ---------------------------------------------------------------------------------------------

def test_effective_policy_resolves_default_thresholds(model):
    ctx = emulated(model, tensor_overrides="exps=CPU")
    expert_threshold = 32 * model.info.n_expert // model.info.n_expert_used
    assert ctx.policy.offload == {"mul_mat": (True, 32), "mul_mat_id": (True, expert_threshold),
                                  "moe_up_gate": (True, expert_threshold)}
    assert ctx.policy.expert_copy == "auto" and ctx.policy.bias_dup is True and ctx.policy.expert_cache == -1


def test_set_policy_takes_effect_at_next_decode(model, rng):
    ctx = emulated(model, moeinfer.Policy(offload="all=1", expert_split=0), n_ubatch=16, tensor_overrides="exps=CPU")
    ctx.decode(rng.integers(0, model.info.n_vocab, size=16, dtype=np.int32))
    assert ctx.stats()["n_offloaded"]["mul_mat_id"] == model.info.n_layer
    ctx.set_policy(moeinfer.Policy(offload="all=off", expert_copy="active"))
    p = ctx.policy
    assert p.expert_copy == "active" and not any(enabled for enabled, _ in p.offload.values())
    ctx.reset_stats()
    ctx.decode(rng.integers(0, model.info.n_vocab, size=16, dtype=np.int32))
    s = ctx.stats()
    assert s["n_offloaded"]["mul_mat_id"] == 0 and s["n_kept_host"]["mul_mat_id"] == model.info.n_layer
    assert s["bytes_weights_full"] == s["bytes_weights_experts"] == 0


def test_offload_budget_too_small_is_rejected(model):
    tiny_budget = moeinfer.Policy(offload_vram_budget=1)
    with pytest.raises(ValueError):
        emulated(model, tiny_budget, tensor_overrides="exps=CPU")
    ctx = emulated(model, tensor_overrides="exps=CPU")
    with pytest.raises(ValueError):
        ctx.set_policy(tiny_budget)
    assert ctx.policy.offload_vram_budget != 1


def test_device_name_is_checked(model):
    with pytest.raises(ValueError, match="emulated"):
        moeinfer.Context(model, device="tpu")
