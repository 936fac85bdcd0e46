"""The float64 numpy reference and moeinfer's CPU forward pass against llama.cpp's, on the same synthetic files.

Reference: llama.cpp commit 0c1e570 (the one llama-cpp-python 0.3.36 vendors), its CPU forward pass run by
scripts/reference/llama_logits_ref.cpp with an F32 KV cache, no flash attention and the whole prompt in one
ubatch. Building it takes ~25 min on 2 cores, so it does not run here: scripts/regen_forward_reference.sh wrote
tests/python/reference/forward/<arch>.json (llama.cpp's commit and settings recorded in each) from files that
moeinfer-synth wrote with fixed seeds: qwen3moe, gpt-oss, glm4moe and deepseek2, tiny presets, F32, F16 and
Q8_0 weights (MXFP4 experts for gpt-oss), and F32 files of glm4moe's Air preset and of deepseek2's V2-Lite
preset (27 layers: llama.cpp takes a file without q LoRA for V2-Lite only at 26 or 27 layers). Per case: the
synth arguments, the SHA-256 of the file, 29 token ids and llama.cpp's float32 logits at 8 of the positions.
The test writes the file again with moeinfer.synth_write and refuses to compare unless it has the recorded
bytes, so a change in the synthetic weights cannot silently make the logits stale.

Per case, at the recorded positions, against llama.cpp's logits:
  (a) the reference (tests/python/reference) with an exact float64 KV cache, as llama.cpp's F32 cache is;
  (b) moeinfer.Context on the CPU. Its KV cache is F16: the difference that makes to the reference (and where
      llama.cpp departs from the model, the difference that makes; below) is taken out of its logits first.
Errors are per token: max |got - llama.cpp| over the vocabulary / max |llama.cpp| over the stored rows. Tokens
whose top-k routing nearly ties in some layer (the reference's selection scores) are left out of the per-token
bound, as in test_forward_reference.py: a flip there changes the logits by O(0.1) legitimately. The bounds are
stated with BOUNDS below.

Where llama.cpp departs from the model's own math (the Hugging Face modeling code), the reference is run with
llama.cpp's rule for (a), the test asserts that the model's rule is far from llama.cpp on the F32 case, and (b)
takes the difference between the two rules out of moeinfer's logits (moeinfer follows the model):
  gpt-oss YaRN: llama.cpp (ggml_rope_yarn_corr_dims) floors / ceils the blend bounds of the frequency ramp;
    gpt-oss's config says "truncate": false, so transformers' _compute_yarn_parameters keeps them fractional
    (2.02 and 4.35 on the tiny preset, 2 and 5 in llama.cpp): ~6e-4 at 29 tokens, growing with the position.
  deepseek2 V2 routing: with softmax gating and expert groups, HF DeepSeek-V2's MoEGate (topk_method
    "group_limited_greedy") scores a group by its best expert; llama.cpp's build_moe_ffn scores every file's
    groups by the sum of their two best, V3's rule: other experts, ~0.1 on the V2-Lite case. (The released
    V2-Lite has one group, where the rules agree; DeepSeek-V2 / V2.5 have 8 and keep 3, so a file of theirs
    that carries expert_group_count routes differently in llama.cpp.)
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import pathlib
import sys

import numpy as np
import pytest

import moeinfer
from reference import KVCache, deepseek2, forward_for, gpt_oss
from reference import load as load_reference

pytestmark = pytest.mark.fast

REFERENCE_DIR = pathlib.Path(__file__).parent / "reference" / "forward"
DOCS = {p.stem: json.loads(p.read_text()) for p in sorted(REFERENCE_DIR.glob("*.json"))}
CASES = [(arch, case["name"]) for arch, doc in DOCS.items() for case in doc["cases"]]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Per-token relative error bounds against llama.cpp, by the case's expert type."""

    ref: float          # the float64 reference
    moe: float          # moeinfer's CPU forward pass, per 3 layers (see test_moeinfer_cpu_matches_llama_cpp)
    min_margin: float   # a token whose smallest relative top-k margin is below this may pick another expert
                        # under the arithmetic's differences (and move by O(0.1)): left out of both bounds


# Chosen from 8 random models per architecture and type (synth tiny presets, 29 tokens, the worst token with
# stable routing of each; 12 models of the 27-layer V2-Lite shape) against llama.cpp 0c1e570 as recorded (F32
# KV cache, no flash attention); observed maxima in brackets, reference | moeinfer:
BOUNDS = {
    # llama.cpp computes in float32 throughout: the reference is within float32 rounding of ~30 chained
    # products and sums [2.1e-7 | 1.7e-5 on 2-3 layers, 1.2e-4 on 27].
    "f32": Bounds(ref=2e-6, moe=1e-4, min_margin=1e-4),
    # llama.cpp rounds the activations to F16 before every product with an F16 weight (ggml's vec_dot_type for
    # F16), moeinfer keeps them F32 [2.9e-4 | 2.9e-4].
    "f16": Bounds(ref=1e-3, moe=1e-3, min_margin=1e-3),
    # Both llama.cpp and moeinfer quantise the activations to 8 bits per 32 values (Q8_0) for Q8_0 and MXFP4
    # weights, each from its own float32 inputs; the reference does not: with every weight Q8_0 [7.5e-3 |
    # 9.0e-3], with MXFP4 experts and F16 dense weights [2.7e-3 | 2.2e-3]. As test_forward_reference.py's
    # quantised bounds, and its router margin.
    "q8_0": Bounds(ref=2.5e-2, moe=2.5e-2, min_margin=1e-2),
    "mxfp4": Bounds(ref=1e-2, moe=1e-2, min_margin=1e-2),
}


def case_doc(arch: str, name: str) -> dict:
    return next(c for c in DOCS[arch]["cases"] if c["name"] == name)


def bounds(case: dict) -> Bounds:
    """The bounds of the case's expert type (with Q8_0 experts every weight is Q8_0; with MXFP4, F16)."""
    expert_type = case["synth"]["expert_type"]
    assert expert_type in BOUNDS, f"case '{case['name']}': no bounds for {expert_type} experts"
    return BOUNDS[expert_type]


def expected_logits(case: dict) -> np.ndarray:
    rows = np.frombuffer(base64.b64decode(case["logits_f32_base64"]), dtype="<f4")
    return rows.reshape(len(case["positions"]), case["n_vocab"]).astype(np.float64)


def per_token_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.max(np.abs(got - want), axis=-1) / np.max(np.abs(want))


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    """synth_file(arch, name) -> the case's model file, written again and checked byte for byte."""
    made: dict[tuple[str, str], pathlib.Path] = {}

    def make(arch: str, name: str) -> pathlib.Path:
        if (arch, name) not in made:
            case = case_doc(arch, name)
            s = case["synth"]
            path = tmp_path_factory.mktemp("llama_cpp") / f"{arch}-{name}.gguf"
            moeinfer.synth_write(path, **s)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest == case["file_sha256"], (
                f"{arch} {name}: moeinfer.synth_write({s}) no longer writes the file llama.cpp's logits were "
                f"recorded from (sha256 {digest}, recorded {case['file_sha256']} at moeinfer "
                f"{DOCS[arch]['moeinfer_commit']}); if the change is intended, run scripts/regen_forward_reference.sh")
            made[(arch, name)] = path
        return made[(arch, name)]

    return make


@contextlib.contextmanager
def llama_cpp_conventions(module, on: bool):
    """Forward keyword arguments for `module`'s forward, with the reference following llama.cpp where it
    departs from the model's own math (see the module docstring) when `on`."""
    if module is gpt_oss:
        yield {"yarn_truncate": on}
    elif module is deepseek2:
        original = deepseek2.SOFTMAX_GROUP_SCORE
        deepseek2.SOFTMAX_GROUP_SCORE = "top2_sum" if on else "max"
        try:
            yield {}
        finally:
            deepseek2.SOFTMAX_GROUP_SCORE = original
    else:
        yield {}


def reference_rows(ref, case: dict, as_llama_cpp: bool = False, cache: KVCache | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(float64 logits at the case's positions, each position's smallest relative top-k margin over the layers).

    The margin is read from the values the architecture's top-k selections see (its module's top_k_desc:
    router probabilities, logits or biased scores, deepseek2's group scores), relative to their RMS; +inf
    where the module selects otherwise. The KV cache is exact (as llama.cpp's F32 cache) unless `cache` is given.
    """
    forward = forward_for(ref)
    module = sys.modules[forward.__module__]
    margins: list[np.ndarray] = []
    original = getattr(module, "top_k_desc", None)

    def spy(values, k):
        if k < values.shape[-1]:
            # Masked-out entries (deepseek2's dropped expert groups) are -inf: left out of the RMS, and a
            # -inf in position k+1 means nothing can take the k-th place (margin +inf).
            s = -np.sort(-values, axis=-1)
            finite = np.where(np.isfinite(values), values * values, np.nan)
            margins.append((s[..., k - 1] - s[..., k]) / np.sqrt(np.nanmean(finite, axis=-1)))
        return original(values, k)

    if original is not None:
        module.top_k_desc = spy
    try:
        with llama_cpp_conventions(module, as_llama_cpp) as kwargs:
            logits = forward(ref, case["tokens"], cache=cache or KVCache(ref.hparams.n_layer), **kwargs)
    finally:
        if original is not None:
            module.top_k_desc = original
    margin = np.min(np.stack(margins), axis=0) if margins else np.full(len(case["tokens"]), np.inf)
    pos = case["positions"]
    return logits[pos], margin[pos]


def check(got: np.ndarray, want: np.ndarray, margins: np.ndarray, tol: float, min_margin: float, what: str) -> float:
    """Asserts the per-token bound on the positions with stable routing; returns the largest error among them."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), f"{what}: non-finite logits"
    stable = margins >= min_margin
    # Never a vacuous check: near-ties are a few percent of the tokens.
    assert stable.mean() >= 0.5, f"{what}: only {stable.sum()} of {len(stable)} positions have stable routing"
    err = per_token_error(got, want)
    worst = int(np.argmax(np.where(stable, err, -1.0)))
    assert err[worst] <= tol, (f"{what}: stored row {worst} has relative error {err[worst]:.3e} > "
                               f"{tol:g} (router margin {margins[worst]:.2e}; per-position errors "
                               f"{np.array2string(err, precision=2)})")
    return float(err[worst])


def test_reference_files_name_their_source():
    assert DOCS, f"no expected-logits files in {REFERENCE_DIR}"
    for arch, doc in DOCS.items():
        assert doc["llama_cpp_commit"] == "0c1e570", arch
        assert doc["llama_cpp_settings"]["kv_type"] == "f32" and doc["llama_cpp_settings"]["flash_attn"] == "off"
        for case in doc["cases"]:
            assert bounds(case) is not None
            assert case["synth"]["arch"] == arch
            assert expected_logits(case).shape == (len(case["positions"]), case["n_vocab"])


# Where the reference following llama.cpp is far from the model's own math (F32, so the gap is far outside the
# bound): the conventions matter there, and llama.cpp follows its own.
CONVENTION_CASES = {("gpt-oss", "f32"), ("deepseek2", "lite-f32")}


@pytest.mark.parametrize("arch,name", CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_reference_matches_llama_cpp(arch, name, synth_file):
    case = case_doc(arch, name)
    ref = load_reference(synth_file(arch, name))
    want = expected_logits(case)
    b = bounds(case)
    tol = b.ref
    got, margins = reference_rows(ref, case, as_llama_cpp=True)
    err = check(got, want, margins, tol, b.min_margin, f"reference {arch} {name}")
    print(f"reference {arch} {name}: worst relative error {err:.2e} (bound {tol:g})")
    if (arch, name) in CONVENTION_CASES:
        own, _ = reference_rows(ref, case)
        gap = per_token_error(own, want).max()
        assert gap > 30 * tol, f"{arch} {name}: llama.cpp is as close to the model's own math ({gap:.2e})"
        print(f"reference {arch} {name}: the model's own math is {gap:.2e} from llama.cpp")


class F16KVCache(KVCache):
    """What moeinfer's F16 KV cache holds: the cached tensors rounded to float16."""

    def extend(self, il, k, v):
        return super().extend(il, k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64))


@pytest.mark.parametrize("arch,name", CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_moeinfer_cpu_matches_llama_cpp(arch, name, synth_file):
    case = case_doc(arch, name)
    path = synth_file(arch, name)
    want = expected_logits(case)
    b = bounds(case)
    ctx = moeinfer.Context(moeinfer.Model(path), device="cpu", n_ctx=64)
    got = ctx.decode(np.asarray(case["tokens"], np.int32), logits_all=True)[case["positions"]].astype(np.float64)
    ref = load_reference(path)
    # The F16 cache's rounding differences (float32 and float64 values on either side of a float16 boundary)
    # add up over the layers: the bound is for the 2-3 layers of the tiny presets, in proportion beyond.
    tol = b.moe * max(1.0, ref.hparams.n_layer / 3)
    as_llama, margins = reference_rows(ref, case, as_llama_cpp=True)
    own_f16, own_margins = reference_rows(ref, case, cache=F16KVCache(ref.hparams.n_layer))
    # moeinfer differs from llama.cpp's run by its F16 KV cache and by following the model's own math where
    # llama.cpp departs from it: take the difference these make to the reference out of moeinfer's logits,
    # which leaves moeinfer's and llama.cpp's own rounding (and keeps a routing flip the F16 cache causes at
    # a near-tie, also in the later tokens that attend to it, out of the comparison).
    got = got - (own_f16 - as_llama)
    err = check(got, want, np.minimum(margins, own_margins), tol, b.min_margin, f"moeinfer {arch} {name}")
    print(f"moeinfer {arch} {name}: worst relative error {err:.2e} (bound {tol:g})")
