"""moeinfer.Model on synthetic files, checked against an independent read with gguf.GGUFReader (the
PyPI `gguf` package), plus the error paths of loading and writing models.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import numpy as np
import pytest

import moeinfer

gguf = pytest.importorskip("gguf", reason="the `gguf` package is the reference: pip install gguf")
from gguf import GGUFReader, GGUFValueType  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402

EXPERT_TENSOR = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.(weight|bias)$")
INT_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
             GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
             GGUFValueType.BOOL}
FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}


def kv(reader: GGUFReader) -> dict:
    """The file's metadata as {key: python value} (GGUFReader also lists header pseudo-keys "GGUF.*")."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_info_matches_gguf_reader(tiny_model):
    reader = GGUFReader(tiny_model)
    meta = kv(reader)
    info = moeinfer.Model(tiny_model).info
    arch = meta["general.architecture"]
    tensors = {t.name: t for t in reader.tensors}

    assert info.architecture == arch
    assert info.name == meta.get("general.name", "")
    assert info.n_layer == meta[f"{arch}.block_count"]
    assert info.n_embd == meta[f"{arch}.embedding_length"]
    assert info.n_head == meta[f"{arch}.attention.head_count"]
    assert info.n_head_kv == meta[f"{arch}.attention.head_count_kv"]
    assert info.head_dim == meta.get(f"{arch}.attention.key_length", info.n_embd // info.n_head)
    assert info.n_expert == meta[f"{arch}.expert_count"]
    assert info.n_expert_used == meta[f"{arch}.expert_used_count"]
    assert info.n_ff_expert == meta[f"{arch}.expert_feed_forward_length"]
    assert info.n_ctx_train == meta[f"{arch}.context_length"]
    assert info.sliding_window == meta.get(f"{arch}.attention.sliding_window", 0)
    assert info.n_vocab == int(tensors["token_embd.weight"].shape[1])  # GGUF ne = [n_embd, n_vocab]
    assert info.n_tensors == len(reader.tensors)
    assert info.n_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert info.n_expert_bytes == sum(int(t.n_bytes) for t in reader.tensors if EXPERT_TENSOR.match(t.name))
    assert 0 < info.n_expert_bytes < info.n_bytes
    assert 0 < info.n_expert_used <= info.n_expert and info.n_head % info.n_head_kv == 0
    assert arch in repr(info) and arch in repr(moeinfer.Model(tiny_model))


def test_tensors_match_gguf_reader(tiny_model):
    reader = GGUFReader(tiny_model)
    ours = moeinfer.Model(tiny_model).tensors
    assert [t.name for t in ours] == [t.name for t in reader.tensors]
    for t, r in zip(ours, reader.tensors):
        assert t.type == r.tensor_type.name.lower(), t.name
        assert t.shape == tuple(int(d) for d in reversed(r.shape)), t.name  # numpy order
        assert t.n_bytes == int(r.n_bytes), t.name
        assert t.file_offset == int(r.data_offset), t.name
        assert t.name in repr(t)


@pytest.mark.parametrize("use_mmap", (True, False))
def test_tensor_data_matches_gguf_reader(tiny_model, use_mmap):
    reader = GGUFReader(tiny_model)
    model = moeinfer.Model(tiny_model, use_mmap=use_mmap)
    for r in reader.tensors:
        t = model.tensor(r.name, raw=True)
        assert t.dtype == np.uint8, r.name
        assert t.tobytes() == np.ascontiguousarray(r.data).tobytes(), r.name
        block_size, block_bytes = moeinfer.type_info(r.tensor_type.name)
        assert t.shape == (*reversed([int(d) for d in r.shape[1:]]), int(r.shape[0]) // block_size * block_bytes)

        values = model.tensor(r.name)
        ref = np.asarray(ref_dequantize(r.data, r.tensor_type), dtype=np.float32)
        assert values.dtype == np.float32 and values.shape == tuple(int(d) for d in reversed(r.shape)), r.name
        assert np.array_equal(values.view(np.uint32), ref.reshape(values.shape).view(np.uint32)), r.name
        if r.name.endswith(".weight"):  # biases may be zero (e.g. an unskewed router)
            assert np.count_nonzero(values) > 0, f"{r.name}: synthetic weights should not be all zero"


def test_meta_matches_gguf_reader(tiny_model):
    reader = GGUFReader(tiny_model)
    model = moeinfer.Model(tiny_model)
    n_checked = 0
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:  # lists of int / float / str, element for element
            value = model.meta(key)
            assert type(value) is list and value == list(field.contents()), key
            n_checked += 1
            continue
        value = model.meta(key)
        if kind in INT_TYPES:
            assert type(value) is int and value == int(field.contents()), key
        elif kind in FLOAT_TYPES:
            assert type(value) is float and value == float(field.contents()), key
        else:
            assert type(value) is str and value == field.contents(), key
        n_checked += 1
    assert n_checked >= 10
    with pytest.raises(KeyError):
        model.meta("no.such.key")


def test_missing_tensor_is_key_error(tiny_qwen):
    model = moeinfer.Model(tiny_qwen)
    with pytest.raises(KeyError):
        model.tensor("blk.999.ffn_up_exps.weight")


def test_paths_may_be_pathlike_str_or_bytes(tiny_qwen):
    for p in (tiny_qwen, str(tiny_qwen), os.fsencode(tiny_qwen)):
        assert moeinfer.Model(p).info.n_tensors > 0


def test_info_outlives_model(tiny_qwen):
    model = moeinfer.Model(tiny_qwen)
    info, tensors = model.info, model.tensors
    del model
    assert info.architecture == "qwen3moe" and tensors[0].name


def test_synth_is_deterministic_and_seeded(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    moeinfer.synth_write(a, preset="tiny", seed=3)
    moeinfer.synth_write(b, preset="tiny", seed=3)
    moeinfer.synth_write(c, preset="tiny", seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_synth_shape_overrides_and_types(tmp_path):
    path = tmp_path / "m.gguf"
    moeinfer.synth_write(path, "gpt-oss", preset="tiny", n_layer=3, n_expert=6, n_expert_used=2,
                         expert_type="q4_0", dense_type="bf16")
    model = moeinfer.Model(path)
    info = model.info
    assert (info.architecture, info.n_layer, info.n_expert, info.n_expert_used) == ("gpt-oss", 3, 6, 2)
    reader = GGUFReader(path)
    for t in model.tensors:
        if t.name.endswith("_exps.weight"):
            assert t.type == "q4_0", t.name
            assert t.shape[0] == 6, t.name
    assert int(reader.fields["gpt-oss.block_count"].contents()) == 3


def test_synth_progress_and_cancel(tmp_path):
    seen = []
    moeinfer.synth_write(tmp_path / "p.gguf", preset="tiny", progress=seen.append)
    assert seen, "progress was never called"
    assert all(0.0 <= f <= 1.0 for f in seen) and seen == sorted(seen)

    with pytest.raises(moeinfer.CancelledError):
        moeinfer.synth_write(tmp_path / "c.gguf", preset="tiny", progress=lambda f: False)

    class Boom(Exception):
        pass

    def explode(fraction):
        raise Boom("from the callback")

    with pytest.raises(Boom):  # the callback's own exception reaches the caller
        moeinfer.synth_write(tmp_path / "e.gguf", preset="tiny", progress=explode)


def test_load_progress_and_cancel(tiny_qwen):
    seen = []
    moeinfer.Model(tiny_qwen, progress=seen.append)
    assert seen and all(0.0 <= f <= 1.0 for f in seen) and seen == sorted(seen)
    with pytest.raises(moeinfer.CancelledError):
        moeinfer.Model(tiny_qwen, progress=lambda f: False)
    with pytest.raises(TypeError):
        moeinfer.Model(tiny_qwen, progress=42)


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------

def test_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "does-not-exist.gguf"
    with pytest.raises(FileNotFoundError) as e:
        moeinfer.Model(missing)
    assert str(e.value).count(str(missing)) == 1, str(e.value)


def test_path_with_embedded_nul_is_value_error(tiny_qwen, tmp_path):
    """The C API takes C strings: "model.gguf\0junk" must not quietly open model.gguf."""
    for path in (str(tiny_qwen) + "\0junk", os.fsencode(tiny_qwen) + b"\0junk", str(tiny_qwen) + "\0"):
        with pytest.raises(ValueError, match="null byte") as e:
            moeinfer.Model(path)
        assert type(e.value) is ValueError
    out = tmp_path / "out.gguf"
    with pytest.raises(ValueError, match="null byte"):
        moeinfer.synth_write(str(out) + "\0junk", "qwen3moe", preset="tiny")
    assert not out.exists()


@pytest.mark.parametrize("keep", (0, 3, 24, 0.5, 0.99))
def test_truncated_file_is_data_corrupt(tiny_qwen, tmp_path, keep):
    data = pathlib.Path(tiny_qwen).read_bytes()
    n = keep if isinstance(keep, int) else int(len(data) * keep)
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[:n])
    with pytest.raises(moeinfer.DataCorruptError) as e:
        moeinfer.Model(path)
    assert isinstance(e.value, ValueError) and str(e.value)


def test_wrong_magic_is_data_corrupt(tiny_qwen, tmp_path):
    path = tmp_path / "magic.gguf"
    shutil.copy(tiny_qwen, path)
    with open(path, "r+b") as f:
        f.write(b"GGML")
    with pytest.raises(moeinfer.DataCorruptError, match=r"(?i)magic") as e:
        moeinfer.Model(path)
    assert str(e.value).count(str(path)) == 1, str(e.value)


def test_bad_synth_arguments_are_value_errors(tmp_path):
    path = tmp_path / "bad.gguf"
    bad = (
        dict(arch="llama"),
        dict(preset="no-such-preset"),
        dict(preset="tiny", n_layer=-1),
        dict(preset="tiny", n_expert=4, n_expert_used=8),
        dict(preset="tiny", routing_skew=1.5),
        dict(preset="tiny", expert_type="q9_9"),
    )
    for kwargs in bad:
        with pytest.raises(ValueError):
            moeinfer.synth_write(path, **kwargs)


def test_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", moeinfer.__version__)
