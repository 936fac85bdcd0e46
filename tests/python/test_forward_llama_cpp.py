"""The float64 numpy reference and moeinfer's CPU forward pass against llama.cpp's, on the same synthetic files.

Reference: llama.cpp commit 0c1e570 (the one llama-cpp-python 0.3.36 vendors), its CPU forward pass run by
scripts/reference/llama_logits_ref.cpp with an F32 KV cache, no flash attention and the whole prompt in one
ubatch. Building it takes ~25 min on 2 cores, so it does not run here: scripts/regen_forward_reference.sh wrote
tests/python/reference/forward/<arch>.json (llama.cpp's commit and settings recorded in each) from files that
moeinfer-synth wrote with fixed seeds (tiny preset; F32, F16 and Q8_0 weights, and MXFP4 experts for gpt-oss):
per case, the synth arguments, the SHA-256 of the file, 29 token ids and llama.cpp's float32 logits of 8 of
the positions. The test writes the file again with moeinfer.synth_write and refuses to compare unless it has
the recorded bytes, so a change in the synthetic weights cannot silently make the logits stale.

Per case, at the recorded positions, against llama.cpp's logits:
  (a) the reference (tests/python/reference) with an exact float64 KV cache, as llama.cpp's F32 cache is;
  (b) moeinfer.Context on the CPU (its KV cache is F16).
Errors are per token: max |got - llama.cpp| over the vocabulary / max |llama.cpp| over the stored rows. Tokens
whose top-k routing nearly ties in some layer (the reference's selection scores) are left out of the per-token
bound, as in test_forward_reference.py: a flip there changes the logits by O(0.1) legitimately. The bounds are
stated with each Bounds entry below.

Where llama.cpp and the model's own math differ, the test holds the difference to what it is:
  gpt-oss YaRN: llama.cpp (ggml_rope_yarn_corr_dims) floors / ceils the blend bounds of the frequency ramp;
  gpt-oss's Hugging Face config says "truncate": false (transformers' _compute_yarn_parameters then keeps
  them fractional), which the reference follows by default and moeinfer follows. On the tiny preset (bounds
  2.02 and 4.35 become 2 and 5) that moves the logits by ~1e-3 at 29 tokens. So llama.cpp is compared with
  the reference evaluated with yarn_truncate=True (within 2e-7 at F32: everything else agrees), the test
  asserts that the untruncated reference is far from llama.cpp, and moeinfer's logits are compared after
  taking out the difference between the two references (what is left is moeinfer's and llama.cpp's own
  rounding, bounded as for qwen3moe).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import pathlib
import sys

import numpy as np
import pytest

import moeinfer
from reference import KVCache, forward_for, gpt_oss
from reference import load as load_reference

pytestmark = pytest.mark.fast

REFERENCE_DIR = pathlib.Path(__file__).parent / "reference" / "forward"
DOCS = {p.stem: json.loads(p.read_text()) for p in sorted(REFERENCE_DIR.glob("*.json"))}
CASES = [(arch, case["name"]) for arch, doc in DOCS.items() for case in doc["cases"]]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Per-token relative error bounds against llama.cpp. A token is held to a bound only where its smallest
    relative top-k margin is at least that bound: an error e in the hidden state moves the router's scores by
    about e of their RMS, so closer ties may flip an expert (and the logits by O(0.1)) legitimately."""

    ref: float   # the float64 reference
    moe: float   # moeinfer's CPU forward pass (F16 KV cache)


# Chosen from 10-20 random models per row (moeinfer.synth_write tiny, 29 tokens; the worst stable token of each),
# against llama.cpp 0c1e570 as recorded (F32 KV cache, no flash attention):
BOUNDS = {
    # llama.cpp computes in float32 throughout: the reference is within 1.6e-7 (float32 rounding of ~30 chained
    # products and sums); moeinfer's F16 KV cache costs <= 5.6e-5 (qwen3moe; the exact-reference bound of
    # test_forward_reference.py's F16 cache).
    "f32": Bounds(ref=2e-6, moe=2.5e-4),
    # llama.cpp rounds the activations to F16 before every product with an F16 weight (ggml's vec_dot_type):
    # reference <= 2.8e-4, moeinfer (F32 activations, F16 cache) <= 2.8e-4.
    "f16": Bounds(ref=1e-3, moe=1e-3),
    # Both llama.cpp and moeinfer quantise the activations to 8 bits per 32 values (Q8_0) for Q8_0 and MXFP4
    # weights, each rounding its own float32 inputs: reference and moeinfer <= 6.6e-3 with every weight Q8_0,
    # <= 2.6e-3 with MXFP4 experts and F16 dense weights.
    "q8_0": Bounds(ref=2e-2, moe=2e-2),
    "mxfp4": Bounds(ref=1e-2, moe=1e-2),
}


def case_doc(arch: str, name: str) -> dict:
    return next(c for c in DOCS[arch]["cases"] if c["name"] == name)


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
            moeinfer.synth_write(path, s["arch"], preset=s["preset"], expert_type=s["expert_type"],
                                 dense_type=s["dense_type"], seed=s["seed"])
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest == case["file_sha256"], (
                f"{arch} {name}: moeinfer.synth_write({s}) no longer writes the file llama.cpp's logits were "
                f"recorded from (sha256 {digest}, recorded {case['file_sha256']} at moeinfer "
                f"{DOCS[arch]['moeinfer_commit']}); if the change is intended, run scripts/regen_forward_reference.sh")
            made[(arch, name)] = path
        return made[(arch, name)]

    return make


def reference_rows(ref, case: dict, yarn_truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(float64 logits at the case's positions, each position's smallest relative top-k margin over the layers).

    The margin is read from the values the architecture's top-k selection sees (its module's top_k_desc:
    router probabilities, logits or biased scores), relative to their RMS; +inf where the module selects
    otherwise. The KV cache is exact, as llama.cpp's F32 cache. yarn_truncate: see reference.gpt_oss.
    """
    forward = forward_for(ref)
    module = sys.modules[forward.__module__]
    kwargs = {"yarn_truncate": yarn_truncate} if module is gpt_oss else {}
    margins: list[np.ndarray] = []
    original = getattr(module, "top_k_desc", None)

    def spy(values, k):
        s = -np.sort(-values, axis=-1)
        margins.append((s[..., k - 1] - s[..., k]) / np.sqrt(np.mean(values * values, axis=-1)))
        return original(values, k)

    if original is not None:
        module.top_k_desc = spy
    try:
        logits = forward(ref, case["tokens"], cache=KVCache(ref.hparams.n_layer), **kwargs)
    finally:
        if original is not None:
            module.top_k_desc = original
    margin = np.min(np.stack(margins), axis=0) if margins else np.full(len(case["tokens"]), np.inf)
    pos = case["positions"]
    return logits[pos], margin[pos]


def check(got: np.ndarray, want: np.ndarray, margins: np.ndarray, tol: float, what: str) -> float:
    """Asserts the per-token bound on the positions whose routing cannot flip at that error (margin >= tol);
    returns the largest error among them."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), f"{what}: non-finite logits"
    stable = margins >= tol
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
            assert case["name"] in BOUNDS, f"{arch}: case '{case['name']}' has no bounds"
            assert case["synth"]["arch"] == arch
            assert expected_logits(case).shape == (len(case["positions"]), case["n_vocab"])


@pytest.mark.parametrize("arch,name", CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_reference_matches_llama_cpp(arch, name, synth_file):
    case = case_doc(arch, name)
    ref = load_reference(synth_file(arch, name))
    want = expected_logits(case)
    tol = BOUNDS[name].ref
    got, margins = reference_rows(ref, case, yarn_truncate=True)
    err = check(got, want, margins, tol, f"reference {arch} {name}")
    print(f"reference {arch} {name}: worst relative error {err:.2e} (bound {tol:g})")
    if arch == gpt_oss.ARCH and name == "f32":
        # The YaRN difference is real and visible: llama.cpp is not the untruncated (Hugging Face) reference.
        hf, _ = reference_rows(ref, case)
        gap = per_token_error(hf, want).max()
        assert gap > 30 * tol, f"llama.cpp matches the untruncated YaRN reference too ({gap:.2e})"


@pytest.mark.parametrize("arch,name", CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_moeinfer_cpu_matches_llama_cpp(arch, name, synth_file):
    case = case_doc(arch, name)
    path = synth_file(arch, name)
    want = expected_logits(case)
    tol = BOUNDS[name].moe
    ctx = moeinfer.Context(moeinfer.Model(path), device="cpu", n_ctx=64)
    got = ctx.decode(np.asarray(case["tokens"], np.int32), logits_all=True)[case["positions"]].astype(np.float64)
    ref = load_reference(path)
    hf, margins = reference_rows(ref, case)
    if arch == gpt_oss.ARCH:
        # moeinfer follows the model's untruncated YaRN, llama.cpp truncates: take the difference the two
        # references show out of moeinfer's logits, which leaves moeinfer's and llama.cpp's own errors.
        ggml, ggml_margins = reference_rows(ref, case, yarn_truncate=True)
        got = got - (hf - ggml)
        margins = np.minimum(margins, ggml_margins)
    err = check(got, want, margins, tol, f"moeinfer {arch} {name}")
    print(f"moeinfer {arch} {name}: worst relative error {err:.2e} (bound {tol:g})")
