"""Contexts over several devices through Python: device="emulated:2" (the emulated backend playing two
devices, each with its own memory), the layer split by tensor_split, per-device budgets as a vram_budget
list, and moeinfer-bench's -dev / -ts / --vram-budget list / --device emulated:N.

Checked against: the one-device emulated context on the same fresh random model and prompt (the same CPU
kernels run on the same data, the residual stream only crosses through host memory, so the logits are
equal bit for bit), and the bytes that cross between the devices from the model's n_embd (the residual
stream, F32, out of one device and into the other: 2 * 4 * n_embd per token and boundary).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import moeinfer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=("qwen3moe", "gpt-oss"))
def model(request, tmp_path_factory) -> moeinfer.Model:
    seed = int(np.random.default_rng().integers(1 << 30))
    print(f"model seed {seed}")
    path = tmp_path_factory.mktemp("multi") / f"{request.param}.gguf"
    moeinfer.synth_write(str(path), request.param, preset="tiny", seed=seed, n_layer=4)
    return moeinfer.Model(str(path))


def context(model, device, **kw) -> moeinfer.Context:
    policy = moeinfer.Policy(expert_split=0)
    return moeinfer.Context(model, n_ctx=128, n_ubatch=8, device=device, policy=policy, **kw)


@pytest.mark.parametrize("options", [None, "peer_copies=staged"])
@pytest.mark.parametrize("split", [[1, 1], [3, 1]])
@pytest.mark.parametrize("overrides", [None, "exps=CPU"])
def test_two_devices_match_one_bit_for_bit(model, rng, split, overrides, options):
    # Emulated devices have no peer access: peer_copies=auto (the default) stages through the host too.
    one = context(model, "emulated", tensor_overrides=overrides)
    two = context(model, "emulated:2", tensor_overrides=overrides, tensor_split=split, backend_options=options)
    n = 0
    for size in (13, 1, 5):
        tokens = rng.integers(0, model.info.n_vocab, size=size, dtype=np.int32)
        a = one.decode(tokens, logits_all=True)
        b = two.decode(tokens, logits_all=True)
        assert np.array_equal(a, b)
        n += size
    assert two.stats()["bytes_between_devices"] == 2 * 4 * model.info.n_embd * n
    assert one.stats()["bytes_between_devices"] == 0
    assert two.stats()["weights_device_bytes"] == one.stats()["weights_device_bytes"]


def test_bad_peer_copies_is_named(model):
    with pytest.raises(ValueError, match="peer_copies takes auto[|]staged, got 'peer'"):
        context(model, "emulated:2", backend_options="peer_copies=peer")


def test_budget_list_and_devices_list(model, rng):
    tokens = rng.integers(0, model.info.n_vocab, size=6, dtype=np.int32)
    one = context(model, "emulated")
    two = context(model, "emulated", devices=[1, 0], vram_budget=[1 << 30, 1 << 30])
    assert np.array_equal(one.decode(tokens), two.decode(tokens))


@pytest.mark.parametrize("kw, words", [
    (dict(tensor_split=[1, -1]), "tensor_split[1]"),
    (dict(tensor_split=[1, 1, 1]), "tensor_split"),
    (dict(vram_budget=[1 << 30] * 3), "vram_budgets"),
    (dict(tensor_overrides="blk\\.0\\.=CUDA3"), "CUDA3"),
    (dict(devices=[0, 0]), "devices[1]"),
])
def test_bad_values_are_named(model, kw, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        context(model, "emulated:2", **kw)


def _bench() -> Path | None:
    env = os.environ.get("MOEINFER_TOOLS_DIR")
    if env:
        p = Path(env) / "moeinfer-bench"
        return p if p.is_file() else None
    found = [p for p in REPO.glob("build*/tools/moeinfer-bench") if p.is_file() and os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@pytest.mark.skipif(_bench() is None, reason="moeinfer-bench not built (set MOEINFER_TOOLS_DIR)")
def test_bench_flags(tmp_path):
    base = [str(_bench()), "--synthetic", "qwen3moe:preset=tiny:layers=4", "--synthetic-dir", str(tmp_path),
            "-p", "8", "-n", "2", "-r", "1", "-o", "json", "--expert-split", "off"]
    ok = subprocess.run(base + ["--device", "emulated:2", "-ts", "3/1", "--vram-budget", "1GiB,1GiB",
                                "-ot", "blk\\.3\\.=CUDA1"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(base + ["--device", "emulated:2", "-ot", "blk\\.0\\.=CUDA3"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "CUDA3" in bad.stderr
    bad = subprocess.run(base + ["--device", "emulated", "-dev", "0,1", "--vram-budget", "1GiB,1GiB,1GiB"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "vram_budgets" in bad.stderr


def test_device_stats_sum_to_the_context_stats(model, rng):
    # Experts in host RAM, offloaded from 4 tokens: each device uploads its own layers' experts; the
    # residual stream crosses once, through host memory (out of device 0, into device 1).
    policy = moeinfer.Policy(expert_split=0, offload="all=4")
    ctx = moeinfer.Context(model, n_ctx=128, n_ubatch=8, device="emulated", devices=[1, 0], tensor_split=[1, 1],
                           tensor_overrides="exps=CPU", policy=policy)
    assert [(d["kind"], d["ordinal"]) for d in ctx.devices] == [("emulated", 1), ("emulated", 0)]
    assert sum(d["n_layers"] for d in ctx.devices) == model.info.n_layer
    tokens = rng.integers(0, model.info.n_vocab, size=13, dtype=np.int32)
    ctx.decode(tokens)
    whole = ctx.stats()
    per = [ctx.device_stats(i) for i in range(len(ctx.devices))]
    for key, value in whole.items():
        if key in ("n_layer", "n_expert") or key.startswith("offload_"):
            continue
        if key == "n_ubatches":
            assert value == max(p[key] for p in per)
        elif isinstance(value, dict):
            assert value == {op: sum(p[key][op] for p in per) for op in value}, key
        else:
            assert value == sum(p[key] for p in per), key  # the seconds in device order, as the library sums
    for p in per:
        assert p["bytes_between_devices"] == 4 * model.info.n_embd * len(tokens)
        assert p["bytes_weights_full"] + p["bytes_weights_experts"] > 0
    ctx.reset_stats()
    assert all(ctx.device_stats(i)["n_ubatches"] == 0 for i in range(2))
    with pytest.raises(ValueError, match="device_index 2 is out of range: the context has 2 device"):
        ctx.device_stats(2)
    one = context(model, "emulated")
    assert len(one.devices) == 1 and one.devices[0]["n_layers"] == model.info.n_layer
    assert one.device_stats(0) == one.stats()


@pytest.mark.skipif(_bench() is None, reason="moeinfer-bench not built (set MOEINFER_TOOLS_DIR)")
def test_bench_device_stats(tmp_path):
    base = [str(_bench()), "--synthetic", "qwen3moe:preset=tiny:layers=4", "--synthetic-dir", str(tmp_path),
            "-p", "8", "-n", "2", "-r", "1", "--expert-split", "off", "--device", "emulated:2", "-ts", "3/1",
            "-ot", "exps=CPU", "--offload-policy", "all=4", "--expert-cache", "off"]
    out = subprocess.run(base + ["-o", "json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    import json
    rows = json.loads(out.stdout)
    for r in rows:
        assert [r["dev0_n_layers"], r["dev1_n_layers"]] == [3, 1]
        assert [r["dev0_ordinal"], r["dev1_ordinal"]] == [0, 1]
        for key in ("weights_host_bytes", "weights_device_bytes"):
            assert r[f"dev0_{key}"] + r[f"dev1_{key}"] == r[key]
        for key in ("bytes_between_devices", "bytes_weights_full", "bytes_weights_experts", "n_ops_device"):
            assert r[f"sched_dev0_{key}"] + r[f"sched_dev1_{key}"] == r[f"sched_{key}"], key
        assert r["sched_dev0_bytes_between_devices"] == r["sched_dev1_bytes_between_devices"] > 0
    pp = next(r for r in rows if r["n_prompt"] > 0)
    assert pp["sched_dev0_bytes_weights_full"] + pp["sched_dev0_bytes_weights_experts"] > 0  # its 3 layers' experts
    text = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "CUDA0 (device 0): 3 layers" in text.stdout and "CUDA1 (device 1): 1 layers" in text.stdout
    assert text.stdout.count("CUDA1: per ubatch") == 2  # one line per test


@pytest.mark.parametrize("share", [1.0, 0.6, 0.3])
def test_default_fills_the_devices_in_order(model, rng, share):
    # device="emulated:2" shows two devices, as a machine with two GPUs: without devices / tensor_split,
    # the model stays on one device while it fits its budget, then fills the next; experts spill to host
    # RAM only when both are full. The logits are the one-device context's bit for bit either way.
    one = context(model, "emulated")
    total = one.stats()["weights_device_bytes"]
    budget = int(total * share)
    two = context(model, "emulated:2", vram_budget=budget)
    used = two.devices
    if share == 1.0:
        assert [d["ordinal"] for d in used] == [0]
    else:
        assert [d["ordinal"] for d in used] == [0, 1]
        per = [two.device_stats(i) for i in range(2)]
        assert all(p["weights_device_bytes"] <= budget for p in per)
        assert (two.stats()["weights_host_bytes"] > 0) == (share == 0.3)
    for size in (11, 1):
        tokens = rng.integers(0, model.info.n_vocab, size=size, dtype=np.int32)
        assert np.array_equal(one.decode(tokens, logits_all=True), two.decode(tokens, logits_all=True))
    # devices=[0] and split_mode="none" keep to the first device, spilling experts there (at 30% of the
    # model, the weights other than experts alone would not fit one device).
    for kw in (dict(devices=[0]), dict(split_mode="none")) if share > 0.5 else ():
        kept = context(model, "emulated:2", vram_budget=budget, **kw)
        assert [d["ordinal"] for d in kept.devices] == [0]
        assert (kept.stats()["weights_host_bytes"] > 0) == (share < 1.0)


def test_emulated_count_is_checked(model):
    with pytest.raises(ValueError, match="emulated:N' needs a device count N from 1 to 8, got 'emulated:9'"):
        context(model, "emulated:9")
