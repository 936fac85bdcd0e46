"""Hot experts resident on the device (Model.set_expert_profile, Context.save_expert_profile,
Context.resident_experts, moeinfer-bench --expert-profile), on the emulated device.

What is checked, against what:
* Logits of a context whose layers are partly resident (a budget of the dense weights and about half of the
  experts) against a CPU context on the same fresh random model and prompt: both compute with the CPU kernels,
  only the order of the two parts' sum differs: max |emulated - cpu| <= 1e-4 * max |cpu| per token.
* The budget: device bytes summed here from the tensor table (whole tensors on the device) and the per-layer
  resident expert counts (a slice of r experts of a tensor of E is r/E of its bytes), each padded to 256.
* Profiles: a foreign model's is ValueError naming the field, a missing file FileNotFoundError, a malformed
  one DataCorruptError.
* The bench writes the profile when the file is absent and places by it when present.

Random data is fresh on every run (the seeds are printed).
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import moeinfer

REL_TOL = 1e-4
ALIGN = 256


def pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def synth(tmp_path, arch: str, seed: int) -> moeinfer.Model:
    path = tmp_path / f"{arch}_{seed}.gguf"
    moeinfer.synth_write(str(path), arch, preset="tiny", seed=seed, routing_skew=0.6)
    return moeinfer.Model(str(path))


def used_tensors(model: moeinfer.Model) -> list:
    """The tensors contexts use (a file may hold more): those an emulated context can locate."""
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64)
    out = []
    for t in model.tensors:
        try:
            ctx.tensor_location(t.name)
        except KeyError:  # in the file, not used by the graphs (glm4moe's MTP layer)
            continue
        out.append(t)
    return out


def close_rows(got: np.ndarray, want: np.ndarray) -> None:
    for r in range(want.shape[0]):
        assert np.max(np.abs(got[r] - want[r])) <= REL_TOL * np.max(np.abs(want[r])), f"row {r}"


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe"])
def test_partly_resident_layers_match_the_cpu(arch, tmp_path, rng):
    seed = int(rng.integers(1 << 30))
    print(f"model seed {seed}")
    model = synth(tmp_path, arch, seed)
    nv = model.info.n_vocab
    prompt = rng.integers(0, nv, 24).tolist()
    steps = rng.integers(0, nv, 3).tolist()

    cpu = moeinfer.Context(model, device="cpu", n_ctx=64, n_ubatch=16)
    want = [cpu.decode(prompt, logits_all=True)] + [cpu.decode([t]) for t in steps]
    profile = tmp_path / "profile.txt"
    cpu.save_expert_profile(str(profile))
    assert profile.read_text().startswith("moeinfer-expert-profile 1\n")
    model.set_expert_profile(str(profile))

    tensors = used_tensors(model)
    dense = sum(pad(t.n_bytes) for t in tensors if "_exps." not in t.name)
    experts = sum(pad(t.n_bytes) for t in tensors if "_exps." in t.name)
    budget = dense + experts * int(rng.integers(30, 70)) // 100
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64, n_ubatch=16, vram_budget=budget)
    got = [ctx.decode(prompt, logits_all=True)] + [ctx.decode([t]) for t in steps]
    for g, w in zip(got, want):
        close_rows(np.atleast_2d(g), np.atleast_2d(w))

    res = ctx.resident_experts()
    n_expert = model.info.n_expert
    assert res["n_experts"].shape == (model.info.n_layer,)
    assert any(0 < n < n_expert for n in res["n_experts"]), res
    used = 0
    for t in tensors:
        loc, _ = ctx.tensor_location(t.name)
        if loc == "device":
            used += pad(t.n_bytes)
        elif "_exps." in t.name:
            layer = int(t.name.split(".")[1])
            used += pad(t.n_bytes // n_expert * int(res["n_experts"][layer])) if res["n_experts"][layer] else 0
    assert used <= budget


def test_foreign_missing_and_malformed_profiles(tmp_path, rng):
    qwen = synth(tmp_path, "qwen3moe", int(rng.integers(1 << 30)))
    oss = synth(tmp_path, "gpt-oss", int(rng.integers(1 << 30)))
    profile = tmp_path / "oss.txt"
    moeinfer.Context(oss, device="cpu", n_ctx=32).save_expert_profile(str(profile))
    with pytest.raises(ValueError, match="arch"):
        qwen.set_expert_profile(str(profile))
    with pytest.raises(FileNotFoundError):
        qwen.set_expert_profile(str(tmp_path / "absent.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_text(profile.read_text().replace("layer 1 ", "layer 1 x "))
    with pytest.raises(moeinfer.DataCorruptError, match="line 7"):
        oss.set_expert_profile(str(bad))
    qwen.set_expert_profile(None)


def test_bench_writes_then_reads_the_profile(tmp_path, rng):
    bench_cli = pytest.importorskip("test_bench_cli")
    if bench_cli.BIN is None:
        pytest.skip("moeinfer-bench not built")
    model_path = tmp_path / "qwen.gguf"
    moeinfer.synth_write(str(model_path), "qwen3moe", preset="tiny", seed=int(rng.integers(1 << 30)),
                         routing_skew=0.6)
    model = moeinfer.Model(str(model_path))
    tensors = used_tensors(model)
    dense = sum(pad(t.n_bytes) for t in tensors if "_exps." not in t.name)
    experts = sum(pad(t.n_bytes) for t in tensors if "_exps." in t.name)
    profile = tmp_path / "profile.txt"
    args = ["-m", str(model_path), "-t", "2", "--device", "emulated", "-p", "32", "-n", "4", "-r", "1",
            "--vram-budget", str(dense + experts // 2), "--expert-profile", str(profile)]
    first = bench_cli.run(*args)
    assert "expert profile written" in first.stderr
    text = profile.read_text().splitlines()
    assert text[0] == "moeinfer-expert-profile 1" and text[-1] == "end"
    # The timed runs' pairs: every layer's counts sum to tokens x n_expert_used.
    k = model.info.n_expert_used
    sums = {sum(int(c) for c in ln.split()[2:]) for ln in text if ln.startswith("layer ")}
    assert len(sums) == 1 and sums.pop() % k == 0
    second = bench_cli.run(*args)
    assert "expert profile written" not in second.stderr
    m = re.search(r"resident experts: (\d+) of (\d+) .* in (\d+) partly resident layers", second.stderr)
    assert m, second.stderr
    assert 0 < int(m.group(1)) < int(m.group(2))
    # A profile of another model is refused by name.
    other = tmp_path / "other.txt"
    other.write_text(profile.read_text().replace("n_expert 8", "n_expert 9"))
    proc = subprocess.run([str(bench_cli.BIN), *args[:-1], str(other)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "n_expert" in proc.stderr
