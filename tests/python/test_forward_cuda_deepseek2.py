"""deepseek2 on the GPU (device="cuda") against the CPU path: all-GPU and hybrid (experts in host RAM).

Both tiny deepseek2 presets: "tiny" (V3-like: q LoRA, sigmoid routing with the selection bias over 2 of 4 expert
groups, YaRN) and "tiny-lite" (V2-like: plain q, softmax routing with the group limit), each with a dense first
layer and shared experts; their latent attention rows are 64 + 32 (a head size the CUDA attention kernels have),
so the absorbed attention (MUL_MAT_HEADS, CONCAT, interleaved ROPE, ATTENTION over the latent cache) and
GROUP_MASK run on the GPU. Bounds and the reasons for them are test_forward_cuda.py's (_compare: cosine > 0.999
and max |gpu - cpu| <= 3e-2 * max |cpu| per token on 90% of the rows, argmax on 90%).

Skipped with "skipped: no CUDA device" where the build has no CUDA or the machine no GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import moeinfer
from test_forward_cuda import _compare, _cuda_context


@pytest.fixture(scope="module", params=[("tiny", "q8_0", "q8_0"), ("tiny-lite", "bf16", "f16")],
                ids=lambda p: "-".join(p))
def model(request, tmp_path_factory):
    preset, expert_type, dense_type = request.param
    path = tmp_path_factory.mktemp("cuda") / f"deepseek2-{preset}.gguf"
    moeinfer.synth_write(str(path), "deepseek2", preset=preset, expert_type=expert_type, dense_type=dense_type,
                         seed=int(np.random.default_rng().integers(1 << 30)))
    return moeinfer.Model(str(path))


@pytest.mark.parametrize("n_prompt", [1, 5, 40])
def test_cuda_deepseek2_prompt_matches_cpu(model, rng, n_prompt):
    tokens = rng.integers(0, model.info.n_vocab, size=n_prompt, dtype=np.int32)
    gpu = _cuda_context(model, n_ctx=128, n_ubatch=32)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=32)
    _compare(gpu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))
    for name in ("blk.1.ffn_up_shexp.weight", "blk.0.ffn_up.weight", "blk.1.attn_k_b.weight"):
        assert gpu.tensor_location(name)[0] == "device", name


def test_cuda_deepseek2_generation_matches_cpu(model, rng):
    gpu = _cuda_context(model, n_ctx=128)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128)
    prompt = rng.integers(0, model.info.n_vocab, size=24, dtype=np.int32)
    _compare(gpu.decode(prompt), cpu.decode(prompt))
    for _ in range(12):
        tok = rng.integers(0, model.info.n_vocab, size=1, dtype=np.int32)
        _compare(gpu.decode(tok), cpu.decode(tok))
    assert gpu.n_past == cpu.n_past == 36
    np.testing.assert_array_equal(gpu.expert_counts()[0], 0)  # the dense layer routes nothing


@pytest.mark.parametrize("expert_copy", ["full", "active"])
@pytest.mark.parametrize("expert_split", [0, 2])
def test_cuda_deepseek2_hybrid_matches_cpu(model, rng, expert_copy, expert_split):
    """exps=CPU: the routed experts in host RAM, offloaded per ubatch above the threshold; the shared experts,
    the dense layer and the attention's per-head matrices stay on the GPU."""
    policy = moeinfer.Policy(expert_copy=expert_copy, expert_split=expert_split).parse_offload("all=3")
    gpu = _cuda_context(model, n_ctx=128, n_ubatch=32, tensor_overrides="exps=CPU", policy=policy)
    cpu = moeinfer.Context(model, device="cpu", n_ctx=128, n_ubatch=32)
    assert gpu.tensor_location("blk.1.ffn_up_exps.weight")[0] == "host"
    assert gpu.tensor_location("blk.1.ffn_up_shexp.weight")[0] == "device"
    for n in (20, 6, 1, 1):
        tokens = rng.integers(0, model.info.n_vocab, size=n, dtype=np.int32)
        _compare(gpu.decode(tokens, logits_all=True), cpu.decode(tokens, logits_all=True))
    s = gpu.stats()
    assert sum(s["n_offloaded"].values()) > 0, s["n_offloaded"]
