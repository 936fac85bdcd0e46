"""Model files holding GGUF types beyond Q8_0 / Q4_0 / MXFP4 (K-quants, IQ2_XXS, ...).

A tiny synthetic model is rewritten by gguf-py (an independent writer) with one weight in another type;
the file must load, list that tensor with ggml's type name and GGUF's byte size (moeinfer-info marks the
types this build cannot convert), and give back its dequantised values bit-exact with gguf-py where we can
convert it. A CPU context computes with the types the CPU kernels have (Q4_K here: its logits are checked
against the numpy reference in test_forward_reference.py); a type no backend computes (IQ2_XXS, TQ1_0), and
on a CUDA machine a device="cuda" context with any type the CUDA kernels lack, is refused at context creation
with the tensor's name and type.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import moeinfer

gguf = pytest.importorskip("gguf", reason="the `gguf` package writes the test files: pip install gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TARGET = "blk.0.ffn_up_exps.weight"  # ne[0] = n_embd = 256: whole blocks of every type


def _find_info_tool() -> Path | None:
    env = os.environ.get("MOEINFER_TOOLS_DIR")
    if env:
        p = Path(env) / "moeinfer-info"
        return p if p.is_file() else None
    found = [p for p in REPO.glob("build*/tools/moeinfer-info") if p.is_file() and os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("types") / "base.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", n_embd=256, seed=11)
    return path


def rewrite(src: Path, dst: Path, name: str, qtype: GGMLQuantizationType, raw: np.ndarray) -> None:
    """Copies src to dst with gguf-py, tensor `name` replaced by `raw` (stored bytes) of type qtype."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name == name:
            ne = [int(d) for d in t.shape]  # GGUF order, ne[0] first
            block, size = GGML_QUANT_SIZES[qtype]
            shape_bytes = (*reversed(ne[1:]), ne[0] // block * size)
            w.add_tensor(t.name, raw.reshape(shape_bytes), raw_dtype=qtype)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_raw(rng: np.random.Generator, qtype: GGMLQuantizationType, n_elements: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, n_elements // block * size, dtype=np.uint8)
    if qtype == GGMLQuantizationType.Q4_K:  # finite fp16 d and dmin (the first 4 bytes of each block)
        blocks = raw.reshape(-1, size)
        blocks[:, 1] &= 0x3F
        blocks[:, 3] &= 0x3F
    return raw


@pytest.mark.parametrize("qtype, convertible", [(GGMLQuantizationType.Q4_K, True),
                                                (GGMLQuantizationType.IQ2_XXS, False),
                                                (GGMLQuantizationType.TQ1_0, False)])
def test_model_with_other_type_loads_lists_and_computes_or_is_refused(base_model, tmp_path, rng, qtype, convertible):
    base = moeinfer.Model(str(base_model))
    orig = next(t for t in base.tensors if t.name == TARGET)
    n = int(np.prod(orig.shape))
    raw = random_raw(rng, qtype, n)
    path = tmp_path / f"with_{qtype.name}.gguf"
    rewrite(base_model, path, TARGET, qtype, raw)

    model = moeinfer.Model(str(path))
    t = next(t for t in model.tensors if t.name == TARGET)
    assert t.type.lower() == qtype.name.lower()
    assert t.shape == orig.shape
    assert t.n_bytes == raw.size
    assert np.array_equal(model.tensor(TARGET, raw=True).ravel(), raw)
    if convertible:
        ref = np.asarray(ref_dequantize(raw, qtype), dtype=np.float32).ravel()
        got = model.tensor(TARGET)
        assert got.shape == orig.shape
        assert np.array_equal(got.ravel().view(np.uint32), ref.view(np.uint32))
    else:
        with pytest.raises(NotImplementedError, match=t.type):
            model.tensor(TARGET)

    if convertible:
        # The CPU kernels compute it: random bytes give large but finite logits.
        logits = moeinfer.Context(model, n_ctx=64, device="cpu").decode(np.arange(5, dtype=np.int32))
        assert logits.shape == (1, model.info.n_vocab) and np.all(np.isfinite(logits))
        if moeinfer.has_cuda:  # the CUDA kernels do not (yet): refused, naming the tensor and the type
            try:
                moeinfer.Context(model, n_ctx=64, device="cuda")
            except NotImplementedError as err:
                assert TARGET in str(err) and t.type in str(err), str(err)
            except RuntimeError as err:  # FAILED_PRECONDITION: a CUDA build on a machine without a GPU
                assert "no cuda device" in str(err).lower(), str(err)
            else:
                pytest.fail(f"a device='cuda' context computed {t.type}, which the CUDA kernels lack")
        return
    with pytest.raises(NotImplementedError) as err:
        moeinfer.Context(model, n_ctx=64, device="cpu")
    msg = str(err.value)
    assert TARGET in msg and t.type in msg, msg


def test_moeinfer_info_lists_every_type(base_model, tmp_path, rng):
    tool = _find_info_tool()
    if tool is None:
        pytest.skip("moeinfer-info not built (set MOEINFER_TOOLS_DIR or build it into build*/tools)")
    base = moeinfer.Model(str(base_model))
    n = int(np.prod(next(t for t in base.tensors if t.name == TARGET).shape))
    for qtype, shown in ((GGMLQuantizationType.IQ2_XXS, "iq2_xxs*"), (GGMLQuantizationType.Q6_K, "q6_K")):
        path = tmp_path / f"{qtype.name}.gguf"
        raw = random_raw(rng, qtype, n)
        rewrite(base_model, path, TARGET, qtype, raw)
        proc = subprocess.run([str(tool), str(path), "--tensors"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        line = next(ln for ln in proc.stdout.splitlines() if ln.split() and ln.split()[0] == TARGET)
        assert line.split()[1] == shown and int(line.split()[-1]) == raw.size, line
        # per-role table: layer 0 holds the new type, the others still q8_0
        role = next(ln for ln in proc.stdout.splitlines() if ln.split() and ln.split()[0] == "ffn_up_exps.weight")
        assert role.split()[2] == f"{shown},q8_0", role
        assert ("no conversion for this type" in proc.stdout) == shown.endswith("*")
