"""The model's own tokenizer (Model.tokenize / detokenize, Detokenizer) against reference tokenizers.

Byte-level BPE: for each pre-tokenizer family (tokenizer.ggml.pre), a BPE trained on the fly with
Hugging Face `tokenizers` and that family's exact Split patterns is the reference (see
tokenizer_fixtures.py); the ids must be identical for every string of a generated test set (random
Unicode, CJK, emoji and ZWJ sequences, digit runs, white-space runs, contractions, code,
special-token text, NUL). SentencePiece-style ("llama"): a sentencepiece BPE with byte fallback.
The Unicode characters drawn are those assigned in the Unicode version of both the library's tables
and the reference's regex engine (14.0; see scripts/gen_unicode_tables.py).
"""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import moeinfer

tokenizers = pytest.importorskip("tokenizers")
import tokenizer_fixtures as tf  # noqa: E402

# The test-string generator of the committed llama.cpp test set (scripts/reference/tokenizer_testset.py),
# drawing here fresh strings each run, with the special-token texts these vocabularies have.
_spec = importlib.util.spec_from_file_location(
    "tokenizer_testset", pathlib.Path(__file__).resolve().parents[2] / "scripts" / "reference" / "tokenizer_testset.py")
testset = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testset)
_ASSIGNED = testset.assigned_chars()
_SPECIAL = tf.SPECIAL + tf.USER_DEFINED


def random_text(rng: np.random.Generator, first_kind: int = 0) -> str:
    return testset.random_text(rng, _ASSIGNED, _SPECIAL, first_kind)


def strings_to_check(rng: np.random.Generator, n: int) -> list[str]:
    fixed = testset.FIXED + ["", " ", "a", "<|im_start|>user\nhi<|im_end|>"]
    return fixed + [random_text(rng) for _ in range(n)]


def training_corpus(rng: np.random.Generator, first_kind: int = 0) -> list[str]:
    return [random_text(rng, first_kind) for _ in range(3000)] + testset.WORDS * 20 + testset.CODE * 20 + testset.CJK * 20


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tok") / "base.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", seed=3)
    return path


@pytest.fixture(scope="module")
def corpus_rng() -> np.random.Generator:
    import os
    import secrets

    seed = int(os.environ.get("MOEINFER_TEST_SEED", secrets.randbits(32)))
    print(f"MOEINFER_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="module", params=list(tf.FAMILIES))
def bpe_family(request, base_model, corpus_rng, tmp_path_factory):
    pre = request.param
    ref = tf.train_bpe(pre, training_corpus(corpus_rng))
    path = tf.with_tokenizer(base_model, tmp_path_factory.mktemp("tok") / f"{pre}.gguf", tf.bpe_metadata(ref, pre))
    return pre, ref, moeinfer.Model(str(path))


@pytest.mark.parametrize("parse_special", [True, False])
def test_bpe_ids_match_reference(bpe_family, rng, parse_special):
    pre, ref, model = bpe_family
    ref.encode_special_tokens = not parse_special
    mismatches = []
    for text in strings_to_check(rng, 1500):
        want = ref.encode(text, add_special_tokens=False).ids
        got = model.tokenize(text, add_special=False, parse_special=parse_special)
        if got != want:
            mismatches.append((text, got, want))
    ref.encode_special_tokens = False
    assert not mismatches, f"{pre}: {len(mismatches)} strings differ, e.g. {mismatches[0]!r}"


def test_bpe_round_trip_and_stream(bpe_family, rng):
    """Byte-level BPE is lossless, for any bytes; the streaming detokenizer returns whole characters."""
    _, _, model = bpe_family
    for text in strings_to_check(rng, 300):
        ids = model.tokenize(text, add_special=False, parse_special=True)
        assert model.detokenize(ids, render_special=True, errors="strict") == text
        det = moeinfer.Detokenizer(model, render_special=True)
        assert "".join(det.feed([t]) for t in ids) + det.flush() == text  # feed() raises on a split character
    for _ in range(200):  # invalid UTF-8 comes back byte for byte
        raw = bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        ids = model.tokenize(raw, add_special=False)
        assert model.detokenize_bytes(ids) == raw


def test_bpe_special_flags(bpe_family):
    pre, ref, model = bpe_family
    v = model.vocab
    assert v["model"] == "gpt2" and v["pre"] == pre
    bos = ref.token_to_id("<|im_start|>")
    ids = model.tokenize("hi", add_special=True)
    # llama3 adds BOS by default (llama.cpp); the others do not unless tokenizer.ggml.add_bos_token says so
    assert (ids[0] == bos) == (pre == "llama3")
    assert model.tokenize("hi", add_special=False) == ref.encode("hi", add_special_tokens=False).ids
    for t in ["<|im_end|>", "<|endoftext|>", "<|return|>"]:
        assert model.is_eog(ref.token_to_id(t))
    assert not model.is_eog(ref.token_to_id("<think>"))
    assert model.token_type(ref.token_to_id("<think>")) == moeinfer.TOKEN_CONTROL
    assert model.token_type(ref.token_to_id("<tool_call>")) == moeinfer.TOKEN_USER_DEFINED
    # control tokens render only when asked; user-defined ones always
    assert model.detokenize([ref.token_to_id("<think>")]) == ""
    assert model.detokenize([ref.token_to_id("<think>")], render_special=True) == "<think>"
    assert model.detokenize([ref.token_to_id("<tool_call>")]) == "<tool_call>"


@pytest.fixture(scope="module")
def spm_model(base_model, corpus_rng, tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")  # noqa: F841
    work = tmp_path_factory.mktemp("spm")
    # Characters of all scripts are left out of training (a vocabulary must hold every character it
    # saw): in the test strings they go to byte fallback.
    sp = tf.train_spm(training_corpus(corpus_rng, first_kind=1), work)
    path = tf.with_tokenizer(base_model, work / "spm.gguf", tf.spm_metadata(sp))
    return sp, moeinfer.Model(str(path))


def test_spm_ids_match_sentencepiece(spm_model, rng):
    sp, model = spm_model
    mismatches = []
    for text in strings_to_check(rng, 1500):
        text = text.replace("\x00", "")  # sentencepiece stops at NUL
        want = sp.encode(text)
        got = model.tokenize(text, add_special=False)
        if got != want:
            mismatches.append((text, got, want))
        assert model.detokenize(got) == sp.decode(want)
    assert not mismatches, f"{len(mismatches)} strings differ, e.g. {mismatches[0]!r}"
    assert model.tokenize("hi")[0] == sp.bos_id()  # "llama" adds BOS by default


def test_detokenizer_keeps_split_characters(spm_model):
    """Byte-fallback tokens split a character: feed() holds its first bytes back until it is whole."""
    sp, model = spm_model
    text = "\U0001f9d1\U0001f3ff\u200d\U0001f680 \u00e9"
    ids = [model.vocab["bos"]] + [sp.piece_to_id(f"<0x{b:02X}>") for b in text.encode()]
    det = moeinfer.Detokenizer(model)
    out = []
    for t in ids:
        piece = det.feed([t])
        out.append(piece)
    assert "".join(out) + det.flush() == text
    assert out[1:4] == ["", "", ""] and out[4] == "\U0001f9d1"
    det.feed([ids[1]])
    assert det.flush() == "\ufffd"  # the stream ended inside a character


def test_bad_token_ids(bpe_family):
    _, _, model = bpe_family
    n = model.vocab["n_tokens"]
    for bad in (-1, n, 2**31 - 1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model.detokenize([0, bad])
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model.token_to_piece(bad)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model.token_type(bad)
    det = moeinfer.Detokenizer(model)
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        det.feed([0, n])


def test_unsupported_tokenizers_fail_at_load(base_model, tmp_path):
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "falcon", "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.merges": ["a b"]}
    path = tf.with_tokenizer(base_model, tmp_path / "pre.gguf", meta)
    with pytest.raises(NotImplementedError, match="tokenizer.ggml.pre 'falcon'.*qwen2.*gpt-4o"):
        moeinfer.Model(str(path))
    path = tf.with_tokenizer(base_model, tmp_path / "model.gguf", {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(NotImplementedError, match="tokenizer.ggml.model 'bert'.*gpt2, llama"):
        moeinfer.Model(str(path))
    bad_types = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": [1]}
    path = tf.with_tokenizer(base_model, tmp_path / "types.gguf", bad_types)
    with pytest.raises(moeinfer.DataCorruptError, match="tokenizer.ggml.token_type: 1 elements"):
        moeinfer.Model(str(path))
    bad_eos = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.eos_token_id": 7}
    path = tf.with_tokenizer(base_model, tmp_path / "eos.gguf", bad_eos)
    with pytest.raises(moeinfer.DataCorruptError, match="eos_token_id is 7"):
        moeinfer.Model(str(path))


def test_model_without_tokenizer(base_model, tmp_path):
    path = tf.with_tokenizer(base_model, tmp_path / "none.gguf", {})
    model = moeinfer.Model(str(path))
    with pytest.raises(RuntimeError, match="no tokenizer"):
        model.tokenize("hi")
    with pytest.raises(RuntimeError, match="no tokenizer"):
        moeinfer.Detokenizer(model)


def test_meta_arrays_match_gguf_reader(bpe_family, base_model):
    from gguf import GGUFReader

    _, ref, model = bpe_family
    meta = tf.bpe_metadata(ref, model.vocab["pre"])
    assert model.meta("tokenizer.ggml.tokens") == meta["tokenizer.ggml.tokens"]
    assert model.meta("tokenizer.ggml.merges") == meta["tokenizer.ggml.merges"]
    assert model.meta("tokenizer.ggml.token_type") == meta["tokenizer.ggml.token_type"]
    assert model.meta("tokenizer.ggml.pre") == model.vocab["pre"]
    for t in range(0, model.vocab["n_tokens"], 37):
        assert model.token_text(t) == meta["tokenizer.ggml.tokens"][t]
    synth = moeinfer.Model(str(base_model))
    r = GGUFReader(base_model)
    scores = r.fields["tokenizer.ggml.scores"].contents()
    assert synth.meta("tokenizer.ggml.scores") == pytest.approx(scores, rel=0, abs=0)
