"""Device out-of-memory through the bindings: MOE_STATUS_RESOURCE_EXHAUSTED is a MemoryError carrying the
library's message (what was allocated, the bytes asked, the bytes free), and the model still makes contexts.

The emulated device plays a card of MOEINFER_EMULATED_VRAM bytes (shared by the process's emulated devices);
an explicit vram_budget of every weight on a card half that size must be refused when the weights' device
buffer is allocated. The context made afterwards is checked against a CPU context (same kernels, so
max |emulated - cpu| <= 1e-4 * max |cpu| per token, as in test_sched_emulated.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import moeinfer

REFUSAL = re.compile(r"cannot allocate (\d+) bytes of device memory \((\d+) bytes free\)")


def padded(n: int) -> int:
    return (n + 255) // 256 * 256


def test_device_oom_is_memory_error_with_the_bytes(tiny_model, rng, monkeypatch):
    model = moeinfer.Model(str(tiny_model))
    total = sum(padded(t.n_bytes) for t in model.tensors)
    monkeypatch.setenv("MOEINFER_EMULATED_VRAM", str(total // 2))
    with pytest.raises(MemoryError) as err:
        moeinfer.Context(model, device="emulated", n_ctx=64, vram_budget=total)
    message = str(err.value)
    assert f"vram_budget of {total} bytes" in message
    assert "allocating device memory for the weights" in message
    refusal = REFUSAL.search(message)
    assert refusal is not None, message
    assert int(refusal[1]) == total
    assert int(refusal[2]) <= total // 2

    monkeypatch.delenv("MOEINFER_EMULATED_VRAM")
    prompt = rng.integers(0, model.info.n_vocab, size=7).astype(np.int32)
    emu = moeinfer.Context(model, device="emulated", n_ctx=64).decode(prompt, logits_all=True)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=64).decode(prompt, logits_all=True)
    bound = 1e-4 * np.abs(cpu).max(axis=1)
    assert (np.abs(emu - cpu).max(axis=1) <= bound).all()
