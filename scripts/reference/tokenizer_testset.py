#!/usr/bin/env python3
"""The committed test set of tests/python/test_tokenizer_llama_cpp.py: strings generated with a fixed
seed, written once to tests/python/reference/tokenizer/strings.json (the expected ids are made from
that file, never from a new draw, so the test is reproducible whatever numpy does later).

Every category the tokenizer must agree on: random characters of all scripts (those assigned in
Unicode 14.0, the version of the library's tables: run this with a Python whose unicodedata is
14.0, e.g. 3.11), CJK, emoji with skin tones and ZWJ sequences, digit runs in several scripts,
white-space runs, contractions, code, the text of the real vocabularies' special tokens, combining
marks (Thai and Indic vowel signs, U+FE0F), and NUL inside the text.

Usage: scripts/reference/tokenizer_testset.py [--out FILE] [--count N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import unicodedata

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "python" / "reference" / "tokenizer" / "strings.json"
SEED = 20261126
UNICODE_VERSION = "14.0.0"

WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\t\t\n", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c",
      "\x85", "\u2003", "\u1680", "\x1c", "\u200b", "\r"]
EMOJI = ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "🧑🏿‍🚀", "😀😃", "👩‍💻", "☺️", "✌🏻", "🫠", "🐈‍⬛"]
WORDS = ["hello", "World", "don't", "I'LL", "we'Re", "they've", "it's", "'ſ", "ma'am", "HTTPServer", "camelCase",
         "naïve", "e\u0301", "Ǆemo", "ΣΊΣΥΦΟΣ", "straße", "İstanbul", "x'S", "'D", "Ⅻ", "ⅻ", "Ω", "K", "you'd",
         "Привет", "мир", "שלום", "مرحبا", "γειά", "Ünïcödé", "the quick brown fox", " leading", "trailing "]
CODE = ["def f(x):\n    return x ** 2\n", "int main() { return 0; }", "a+=b*c/d;", "// comment\n/* x */",
        "<div class=\"a\">b</div>", "path/to/file.txt", "x = [1, 2, 3]\r\n", "foo_bar-baz.qux()",
        "if (a && b || !c) {\n\tx++;\n}", "SELECT * FROM t WHERE id=1;", "$ ls -la ~/", "#include <stdio.h>",
        "    indented\n        more", "{\"key\": [true, null, 1e-5]}", "https://example.com/a?b=c&d=e#f"]
DIGITS = ["0", "12", "123", "1234", "1234567890", "٣٤٥", "１２３", "3.14159", "1,000,000", "²³", "Ⅷ", "২০২৪",
          "00000000", "9" * 17, "१२३४", "๑๒๓"]
CJK = ["日本語のテキスト", "中文测试", "한국어 텍스트", "カタカナ", "ひらがな", "漢字かな交じり文", "繁體中文",
       "こんにちは、世界！", "我爱北京天安门。", "ｶﾀｶﾅ", "㈱㍿"]
MARKS = ["ภาษาไทย", "สวัสดีครับ", "हिन्दी", "नमस्ते", "தமிழ்", "বাংলা", "ಕನ್ನಡ", "❤\ufe0f", "a\u0300\u0301",
         "\u0301\u0302", "ก\u0e31\u0e49", "Z\u0351\u036b\u0343\u036a\u0302"]
MIXED = ["中A ", "漢字ΣΊΣΥΦΟΣ.", "カナI'LL", "ｶﾅABC!", "\u02b0AB", "A\u0301B\u0301 ", "ǅǄx", "ǈA'S", "字ǅ'd"]
# Special-token text of the vocabularies the test uses (and some that none of them has).
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
           "<|start_header_id|>", "<|end_header_id|>", "<s>", "</s>", "<unk>", "<pad>", "<start_of_turn>",
           "<end_of_turn>", "<bos>", "<eos>", "<mask>", "<|user|>", "<|assistant|>", "<|end|>", "<|system|>",
           "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
           "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|vision_start|>", "<|return|>",
           "<|reserved_special_token_0|>", "<start_of_image>", "[INST]", "<|not_a_token|>"]
ODD = ["\x00", "a\x00b", "\x00\x00", "'", "''s", "\u0301", "\ufeff", "\U0001d400", "\u00ad", "\u200d", "\ufffd",
       "\x7f", "\x01\x02", "\u2581", "▁▁x"]


def assigned_chars() -> np.ndarray:
    cps = [c for c in range(0x20, 0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    return np.array(cps)


def random_text(rng: np.random.Generator, chars: np.ndarray, special: list[str] | None = None,
                first_kind: int = 0) -> str:
    """Up to 9 parts, each of a kind drawn from first_kind .. 11 (0: random characters from `chars`;
    first_kind=1 leaves those out, as a training corpus wants). `special`: the special-token texts to
    draw from (default SPECIAL)."""
    special = SPECIAL if special is None else special
    parts = []
    for _ in range(int(rng.integers(1, 10))):
        kind = int(rng.integers(first_kind, 12))
        if kind == 0:
            parts.append("".join(chr(int(c)) for c in rng.choice(chars, int(rng.integers(1, 8)))))
        elif kind == 1:
            parts.append(str(rng.choice(WS)) * int(rng.integers(1, 4)))
        elif kind == 2:
            parts.append(str(rng.choice(EMOJI)))
        elif kind == 3:
            parts.append(str(rng.choice(WORDS)))
        elif kind == 4:
            parts.append(str(rng.choice(CODE)))
        elif kind == 5:
            parts.append(str(rng.choice(DIGITS)) * int(rng.integers(1, 3)))
        elif kind == 6:
            parts.append(str(rng.choice(CJK)))
        elif kind == 7:
            parts.append(str(rng.choice(special)))
        elif kind == 8:
            parts.append(str(rng.choice(MIXED)))
        elif kind == 9:
            parts.append(str(rng.choice(MARKS)))
        elif kind == 10:
            parts.append(str(rng.choice(ODD)))
        else:
            parts.append(" " + str(rng.choice(WORDS)))
    return "".join(parts)


# The fixed strings every test set starts with.
FIXED = WS + EMOJI + WORDS + CODE + DIGITS + CJK + MARKS + MIXED + SPECIAL + ODD


def make(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    chars = assigned_chars()
    fixed = FIXED + ["", " ", "a", "<|im_start|>user\nhi<|im_end|>", "<s> hi </s>", "<start_of_turn>user\nhi<end_of_turn>\n",
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
              "<|user|>\nhi<|end|>\n<|assistant|>", " <|end|> ", "x<s>y", "<s><s>", "\n<s>\n"]
    return fixed + [random_text(rng, chars) for _ in range(count)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--count", type=int, default=1000, help="random strings after the fixed ones (default 1000)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    if unicodedata.unidata_version != UNICODE_VERSION:
        print(f"unicodedata is {unicodedata.unidata_version}; the test set needs {UNICODE_VERSION} "
              "(the version of lib/text's tables)", file=sys.stderr)
        return 1
    strings = make(args.count, args.seed)
    doc = {"generator": "scripts/reference/tokenizer_testset.py", "seed": args.seed, "unicode": UNICODE_VERSION,
           "strings": strings}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=True, indent=0) + "\n", encoding="ascii")
    print(f"{args.out}: {len(strings)} strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
