#!/usr/bin/env python3
"""Runs llama_tokenize_ref (llama.cpp's tokenizer) over the committed test set for each vocabulary and
writes the expected-ids files of tests/python/test_tokenizer_llama_cpp.py, <out>/<vocab>.json.

Each file says which llama.cpp commit produced it and the SHA-256 of the vocabulary file and of the
strings file it was made from (the test refuses a file made from other inputs). Per string i:
  ids[i]           llama_tokenize(add_special=false, parse_special=false)
  ids_special[i]   the same with parse_special=true; null where equal to ids[i]
  text[i]          llama_detokenize(ids[i], unparse_special=false) as hex; null where it is the
                   string itself
  text_special[i]  llama_detokenize(ids_special[i], unparse_special=true) as hex; null likewise
add_special_prefix / add_special_suffix: what add_special=true puts around ids[i] (the same for
every string; checked here).

Usage: tokenizer_expected.py --ref BIN --vocab-dir DIR --strings FILE --out DIR --llama-commit C [NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_reference(ref: str, vocab: pathlib.Path, strings: list[str]) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".hex", delete=False) as f:
        for s in strings:
            f.write(s.encode("utf-8").hex() + "\n")
        hex_path = f.name
    out = subprocess.run([ref, str(vocab), hex_path], check=True, capture_output=True)
    pathlib.Path(hex_path).unlink()
    return json.loads(out.stdout)


def compact(name: str, strings: list[str], raw: dict) -> dict:
    results = raw["results"]
    if len(results) != len(strings):
        raise RuntimeError(f"{name}: {len(results)} results for {len(strings)} strings")
    # add_special only puts BOS/EOS around the text's tokens: the one (prefix, suffix) that every
    # string allows (an empty string alone cannot tell a prefix from a suffix).
    around = None
    for s, r in zip(strings, results):
        ids, add = r["ids"], r["ids_add_special"]
        splits = {(tuple(add[:k]), tuple(add[k + len(ids):])) for k in range(len(add) - len(ids) + 1)
                  if add[k:k + len(ids)] == ids}
        around = splits if around is None else around & splits
        if not around:
            raise RuntimeError(f"{name}: add_special does not add the same tokens to {s!r} ({ids} -> {add}) "
                               "as to the strings before it")
    if len(around) != 1:
        raise RuntimeError(f"{name}: add_special's tokens are ambiguous: {sorted(around)}")
    prefix, suffix = (list(t) for t in next(iter(around)))
    doc = {"ids": [], "ids_special": [], "text": [], "text_special": []}
    for s, r in zip(strings, results):
        own = s.encode("utf-8").hex()
        doc["ids"].append(r["ids"])
        doc["ids_special"].append(None if r["ids_special"] == r["ids"] else r["ids_special"])
        doc["text"].append(None if r["text"] == own else r["text"])
        doc["text_special"].append(None if r["text_special"] == own else r["text_special"])
    return {"add_special_prefix": prefix, "add_special_suffix": suffix, **doc}


def dumps(doc: dict) -> str:
    """JSON with one line per string (readable diffs when the reference changes)."""
    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and key not in ("add_special_prefix", "add_special_suffix"):
            body = ",\n".join(json.dumps(v, separators=(",", ":")) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{body}\n]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--vocab-dir", type=pathlib.Path, required=True)
    ap.add_argument("--strings", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--llama-commit", required=True)
    ap.add_argument("--raw", type=pathlib.Path, help="also keep llama_tokenize_ref's own output here")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    strings = json.loads(args.strings.read_text(encoding="ascii"))["strings"]
    names = args.names or sorted(p.stem for p in args.vocab_dir.glob("*.gguf"))
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        vocab = args.vocab_dir / f"{name}.gguf"
        try:
            raw = run_reference(args.ref, vocab, strings)
            if args.raw:
                args.raw.mkdir(parents=True, exist_ok=True)
                (args.raw / f"{name}.json").write_text(json.dumps(raw), encoding="ascii")
            doc = {
                "reference": f"llama.cpp {args.llama_commit} (as vendored by llama-cpp-python 0.3.36), "
                             "scripts/reference/llama_tokenize_ref.cpp, vocab_only",
                "llama_cpp_commit": args.llama_commit,
                "vocab": name,
                "vocab_sha256": sha256(vocab),
                "strings_sha256": sha256(args.strings),
                "n_tokens": raw["n_tokens"],
                **compact(name, strings, raw),
            }
        except (OSError, RuntimeError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
            err = getattr(e, "stderr", b"") or b""
            print(f"{name}: {e} {err.decode(errors='replace')}", file=sys.stderr)
            failed += 1
            continue
        out = args.out / f"{name}.json"
        out.write_text(dumps(doc), encoding="ascii")
        print(f"{name}: {out} ({out.stat().st_size} bytes)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
