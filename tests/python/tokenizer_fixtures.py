"""Reference tokenizers for test_tokenizer.py, and GGUF files that carry them.

Byte-level BPE vocabularies are trained on the fly with Hugging Face `tokenizers`, with each model
family's exact pre-tokenizer patterns (the originals from the families' tokenizer.json files; for
"default" and "deepseek-llm", llama.cpp's). SentencePiece-style ("llama") vocabularies are trained
with `sentencepiece` (BPE with byte fallback). Each is written into a copy of a tiny synthetic model
as tokenizer.ggml.* metadata, as llama.cpp's converter writes it.
"""

from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from gguf import GGUFReader, GGUFWriter

CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3 = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_U = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_W = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_U}*{_W}+{CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_U}+{_W}*{CONTRACTIONS}?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
# DeepSeek LLM's cased-letter class, by code point (ranges; pasting the characters risks canonical
# substitutions such as U+2126 OHM SIGN -> U+03A9).
_DS_LETTERS = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3),
    (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
]
_DS_CLASS = "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in _DS_LETTERS)
DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[" + _DS_CLASS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# tokenizer.ggml.pre -> (Split patterns applied in sequence, ignore_merges)
FAMILIES = {
    "qwen2": ([QWEN2], False),
    "llama3": ([LLAMA3], True),
    "glm4": ([LLAMA3], False),
    "gpt-4o": ([GPT4O], False),
    "deepseek-v3": (DEEPSEEK_V3, False),
    "deepseek-llm": (DEEPSEEK_LLM, False),
    "default": (DEFAULT, False),
}

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|return|>", "<think>"]
USER_DEFINED = ["<tool_call>"]

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def train_bpe(pre: str, corpus: list[str], vocab_size: int = 2000):
    """A byte-level BPE with `pre`'s pre-tokenizer, special and user-defined added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    patterns, ignore_merges = FAMILIES[pre]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns]
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    return tok


def bpe_metadata(tok, pre: str) -> dict:
    """tokenizer.ggml.* of a trained `tokenizers` BPE, as llama.cpp's converter writes it."""
    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1
    tokens = [""] * n
    for t, i in vocab.items():
        tokens[i] = t
    types = [NORMAL] * n
    for t in SPECIAL:
        types[vocab[t]] = CONTROL
    for t in USER_DEFINED:
        types[vocab[t]] = USER
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": vocab["<|endoftext|>"],
        "tokenizer.ggml.bos_token_id": vocab["<|im_start|>"],
    }


def train_spm(corpus: list[str], workdir: pathlib.Path, vocab_size: int = 1200):
    """A SentencePiece BPE with byte fallback, no normalisation (llama.cpp applies none)."""
    import sentencepiece as spm

    text = workdir / "spm_corpus.txt"
    text.write_text("\n".join(s.replace("\n", " ").replace("\r", " ") for s in corpus), encoding="utf-8")
    prefix = workdir / "spm"
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(prefix), vocab_size=vocab_size, model_type="bpe",
                                   byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
                                   remove_extra_whitespaces=False, character_coverage=0.9995, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(prefix) + ".model")


def spm_metadata(sp) -> dict:
    n = sp.get_piece_size()
    types = []
    for i in range(n):
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(UNUSED)
        else:
            types.append(NORMAL)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [float(sp.get_score(i)) for i in range(n)],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
    }


def _value_type(key: str, value) -> tuple:
    T = gguf.GGUFValueType
    if isinstance(value, str):
        return T.STRING, None
    if isinstance(value, bool):
        return T.BOOL, None
    if isinstance(value, int):
        return T.UINT32, None
    sub = {"tokenizer.ggml.tokens": T.STRING, "tokenizer.ggml.merges": T.STRING, "tokenizer.ggml.scores": T.FLOAT32,
           "tokenizer.ggml.token_type": T.INT32}.get(key)
    if sub is None:
        sub = T.STRING if value and isinstance(value[0], str) else T.INT32
    return T.ARRAY, sub


def with_tokenizer(src: pathlib.Path, dst: pathlib.Path, meta: dict) -> pathlib.Path:
    """Copies the model `src` to `dst` with its tokenizer.ggml.* metadata replaced by `meta`."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith("tokenizer."):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, value in meta.items():
        vtype, sub = _value_type(key, value)
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
