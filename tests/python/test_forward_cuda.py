"""All-GPU decoding (device="cuda") against the CPU path, on small synthetic models.

Skipped with "skipped: no CUDA device" where the build has no CUDA or the machine no GPU.
Tolerances: batches of more than 8 tokens run the expert and dense products on BF16 tensor cores
(8 mantissa bits, ~4e-3 relative per product), up to 8 tokens on a Q8-activation GEMV like the CPU;
attention and norms are F32 on both sides. So the logits must agree to cosine > 0.999 and
max |gpu - cpu| <= 3e-2 * max |cpu| per token, and the argmax almost always. A token whose top-k
router logits nearly tie may legitimately pick another expert under that rounding (a few % of
tokens on these tiny random models), so up to 10% of a batch's rows may miss the per-token bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer


def _cuda_context(model, **kw):
    if not moeinfer.has_cuda:
        pytest.skip("skipped: no CUDA device (this build has no CUDA backend)")
    try:
        return moeinfer.Context(model, device="cuda", **kw)
    except RuntimeError as e:  # FAILED_PRECONDITION: no GPU on this machine
        if "no cuda device" in str(e).lower():
            pytest.skip("skipped: no CUDA device")
        raise


@pytest.fixture(scope="module", params=[("qwen3moe", "q8_0"), ("qwen3moe", "q4_0"), ("gpt-oss", "mxfp4"),
                                        ("gpt-oss", "bf16")])
def model(request, tmp_path_factory):
    arch, expert_type = request.param
    path = tmp_path_factory.mktemp("cuda") / f"{arch}-{expert_type}.gguf"
    # head_dim 64: the CUDA attention kernels cover head sizes 32..256.
    moeinfer.synth_write(str(path), arch, preset="tiny", head_dim=64, expert_type=expert_type,
                         dense_type="q8_0", seed=int(np.random.default_rng().integers(1 << 30)))
    return moeinfer.Model(str(path))


def _compare(gpu: np.ndarray, cpu: np.ndarray) -> None:
    assert gpu.shape == cpu.shape
    assert np.all(np.isfinite(gpu))
    off = 0
    for g, c in zip(gpu, cpu):
        cos = float(np.dot(g, c) / (np.linalg.norm(g) * np.linalg.norm(c)))
        if not (cos > 0.999 and np.max(np.abs(g - c)) <= 3e-2 * np.max(np.abs(c))):
            off += 1
    assert off * 10 <= len(cpu), f"{off} of {len(cpu)} rows outside the bound"
    agree = np.mean(np.argmax(gpu, axis=1) == np.argmax(cpu, axis=1))
    assert agree >= 0.9, agree


@pytest.mark.parametrize("n_prompt", [1, 5, 40])
def test_cuda_prompt_matches_cpu(model, rng, n_prompt):
    tokens = rng.integers(0, model.info.n_vocab, size=n_prompt, dtype=np.int32)
    gpu = _cuda_context(model, n_ctx=128, n_ubatch=32)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=32)
    _compare(gpu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))


def test_cuda_generation_matches_cpu(model, rng):
    """A prompt, then token-by-token decoding at growing depth (KV cache on the GPU)."""
    gpu = _cuda_context(model, n_ctx=128)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128)
    prompt = rng.integers(0, model.info.n_vocab, size=24, dtype=np.int32)
    _compare(gpu.decode(prompt), cpu.decode(prompt))
    for _ in range(12):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        _compare(gpu.decode(tok), cpu.decode(tok))
    assert gpu.n_past == cpu.n_past == 36


def test_cuda_rejects_bad_tokens_without_touching_state(model):
    gpu = _cuda_context(model, n_ctx=16)
    gpu.decode(np.array([1, 2, 3], dtype=np.int32))
    with pytest.raises(ValueError):
        gpu.decode(np.array([model.info.n_vocab], dtype=np.int32))
    assert gpu.n_past == 3


def test_default_device_is_auto(tiny_qwen):
    """device="auto" (the default) is "cuda" exactly when a device="cuda" context can be created here."""
    model = moeinfer.Model(str(tiny_qwen))
    try:
        moeinfer.Context(model, n_ctx=16, device="cuda")
        want = "cuda"
    except NotImplementedError:  # no CUDA backend in this build
        want = "cpu"
    except RuntimeError as e:  # no GPU on this machine
        assert "no cuda device" in str(e).lower()
        want = "cpu"
    ctx = moeinfer.Context(model, n_ctx=16)
    assert ctx.device == want and f"device={want}" in repr(ctx)
    assert moeinfer.Context(model, n_ctx=16, device="auto").device == want
    assert ctx.decode([1, 2, 3]).shape == (1, model.info.n_vocab)
    assert moeinfer.Context(model, n_ctx=16, device="cpu").device == "cpu"
    assert moeinfer.Context(model, n_ctx=16, device="emulated").device == "emulated"
    with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda' or 'emulated'"):
        moeinfer.Context(model, device="gpu")
