"""Context(backend_options=...) and the offload thresholds in Context.stats(), on the emulated device:
bad options refused naming the entry, the environment as the fallback of a key left out, the fixed
thresholds on the emulated device, overrides, and with offload_calibration=on the measured thresholds
recomputed here in float64 from the figures the stats report (docs/POLICY.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import moeinfer

OPS = ("mul_mat", "mul_mat_id", "moe_up_gate")
CAP = 1 << 24


def fixed(op: str, info) -> int:
    return 32 if op == "mul_mat" else 32 * info.n_expert // info.n_expert_used


def test_help_lists_every_key():
    text = moeinfer.backend_options_help()
    for key in ("cuda_graphs", "cuda_fusion", "cuda_pdl", "cuda_pull_copies", "emulated_async", "emulated_pcie_gbps",
                "emulated_vram", "offload_calibration"):
        assert f"  {key}=" in text


@pytest.mark.parametrize("options, needle", [
    ("bogus=1", "unknown key 'bogus'"),
    ("cuda_pdl=maybe", "cuda_pdl takes on|off, got 'maybe'"),
    ("cuda_graphs=on,cuda_graphs=off", "given twice"),
])
def test_bad_options_name_the_entry(tiny_qwen, options, needle):
    model = moeinfer.Model(str(tiny_qwen))
    with pytest.raises(ValueError) as e:
        moeinfer.Context(model, device="emulated", n_ctx=64, backend_options=options)
    assert needle in str(e.value)


def test_environment_is_the_fallback(tiny_qwen, monkeypatch):
    model = moeinfer.Model(str(tiny_qwen))
    monkeypatch.setenv("MOEINFER_EMULATED_VRAM", "4096")
    with pytest.raises(MemoryError):
        moeinfer.Context(model, device="emulated", n_ctx=64, backend_options="emulated_async=off")
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64, backend_options=f"emulated_vram={64 << 30}")
    assert ctx.stats()["weights_device_bytes"] > 0


def test_emulated_device_keeps_the_fixed_thresholds(tiny_qwen):
    model = moeinfer.Model(str(tiny_qwen))
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64, tensor_overrides="exps=CPU")
    s = ctx.stats()
    assert s["offload_min_batch"] == {op: fixed(op, model.info) for op in OPS}
    assert s["offload_min_batch_source"] == {op: "default" for op in OPS}
    assert s["offload_link_gbps"] == 0.0
    assert ctx.policy.offload == {op: (True, fixed(op, model.info)) for op in OPS}


def test_override_wins(tiny_qwen):
    model = moeinfer.Model(str(tiny_qwen))
    policy = moeinfer.Policy(offload={"mul_mat_id": (True, 6)})
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64, tensor_overrides="exps=CPU", policy=policy,
                           backend_options="offload_calibration=on")
    s = ctx.stats()
    assert s["offload_min_batch"]["mul_mat_id"] == 6
    assert s["offload_min_batch_source"]["mul_mat_id"] == "override"
    assert s["offload_min_batch_source"]["moe_up_gate"] == "measured"


def test_measured_thresholds_follow_the_formula(tiny_qwen):
    model = moeinfer.Model(str(tiny_qwen))
    ctx = moeinfer.Context(model, device="emulated", n_ctx=64, tensor_overrides="exps=CPU",
                           backend_options="offload_calibration=on")
    s = ctx.stats()
    link = np.float64(s["offload_link_gbps"])
    assert link > 0
    experts_per_use = np.float64(model.info.n_expert) / np.float64(model.info.n_expert_used)
    for op in ("mul_mat_id", "moe_up_gate"):
        host, device = np.float64(s["offload_host_gbps"][op]), np.float64(s["offload_device_gbps"][op])
        assert host > 0 and device > 0
        assert s["offload_min_batch_source"][op] == "measured"
        saved = 1 / host - 1 / device  # seconds per GB of weights per token the device saves
        tokens = CAP if saved <= 0 else (1 / link) / saved * experts_per_use
        got = s["offload_min_batch"][op]
        if abs(tokens - round(tokens)) > 1e-9 * tokens:
            assert got == min(max(math.ceil(tokens), 1), CAP), (op, host, device, link)
        else:  # a whole number within rounding: either side
            assert abs(got - tokens) <= 1
    # No dense weight in host RAM: nothing measured, the fixed threshold.
    assert s["offload_min_batch_source"]["mul_mat"] == "default"
    assert s["offload_min_batch"]["mul_mat"] == 32
