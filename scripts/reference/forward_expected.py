#!/usr/bin/env python3
"""Writes the expected-logits files of tests/python/test_forward_llama_cpp.py, <out>/<arch>.json: small
synthetic models written by moeinfer-synth (fixed seeds), evaluated by llama_logits_ref (llama.cpp's CPU
forward pass) on fixed token ids.

Per architecture, one case per weight type or preset (CASES): the synth arguments, the SHA-256 and size of the file
they write (the test regenerates the file and refuses to compare if its bytes differ), the token ids, and
llama.cpp's logits of the rows at POSITIONS as float32 (little-endian, base64). llama.cpp runs with an F32
KV cache and without flash attention (the context settings are recorded), so an F32 model is evaluated in
float32 throughout.

Usage: forward_expected.py --ref BIN --synth BIN --out DIR --llama-commit C [ARCH ...]
  ARCH: the architectures to write (default: all of CASES)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

# Architecture -> [(case name, preset, expert type, dense type, seed, other synth arguments)]. F32 is llama.cpp's
# exact arithmetic; F16 weights make llama.cpp round activations to F16; Q8_0 makes both llama.cpp and moeinfer
# quantise them to 8 bits per 32; MXFP4 is gpt-oss's own expert type. The second preset of glm4moe (Air: no q/k
# norms, a NextN layer) and of deepseek2 (V2-Lite: no q LoRA, softmax routing) in F32. llama.cpp takes a deepseek2
# file for V2-Lite (no attention.q_lora_rank) only when it has 26 or 27 layers (llama-model.cpp, is_lite): the
# lite case has V2-Lite's 27.
CASES = {
    "qwen3moe": [("f32", "tiny", "f32", "f32", 2101, {}), ("f16", "tiny", "f16", "f16", 2102, {}),
                 ("q8_0", "tiny", "q8_0", "q8_0", 2103, {})],
    "gpt-oss": [("f32", "tiny", "f32", "f32", 2201, {}), ("f16", "tiny", "f16", "f16", 2202, {}),
                ("q8_0", "tiny", "q8_0", "q8_0", 2203, {}), ("mxfp4", "tiny", "mxfp4", "f16", 2204, {})],
    "glm4moe": [("f32", "tiny", "f32", "f32", 2301, {}), ("f16", "tiny", "f16", "f16", 2302, {}),
                ("q8_0", "tiny", "q8_0", "q8_0", 2303, {}), ("air-f32", "tiny-air", "f32", "f32", 2304, {})],
    "deepseek2": [("f32", "tiny", "f32", "f32", 2401, {}), ("f16", "tiny", "f16", "f16", 2402, {}),
                  ("q8_0", "tiny", "q8_0", "q8_0", 2403, {}),
                  ("lite-f32", "tiny-lite", "f32", "f32", 2404, {"n_layer": 27})],
}
# moeinfer.synth_write's argument -> moeinfer-synth's flag (the test writes the files with synth_write).
SYNTH_FLAGS = {"preset": "--preset", "expert_type": "--experts", "dense_type": "--dense", "seed": "--seed",
               "n_layer": "--layers"}
N_TOKENS = 29             # more than three of gpt-oss's tiny sliding windows (8)
POSITIONS = (0, 3, 8, 9, 16, 17, 27, 28)   # rows kept: both sides of the window edges, and the end
LLAMA_SETTINGS = {"kv_type": "f32", "flash_attn": "off", "threads": 1, "n_ubatch": N_TOKENS}


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def n_vocab_of(path: pathlib.Path) -> int:
    from gguf import GGUFReader  # gguf-py: an independent reader of the file moeinfer-synth wrote

    reader = GGUFReader(str(path))
    return int(next(t.shape[1] for t in reader.tensors if t.name == "token_embd.weight"))


def write_case(ref: str, synth: str, arch: str, case: tuple, tmp: pathlib.Path) -> dict:
    name, preset, expert_type, dense_type, seed, other = case
    args = {"arch": arch, "preset": preset, "expert_type": expert_type, "dense_type": dense_type, "seed": seed,
            **other}
    path = tmp / f"{arch}-{name}.gguf"
    flags = [f for key, flag in SYNTH_FLAGS.items() if key in args for f in (flag, str(args[key]))]
    subprocess.run([synth, "-q", "--arch", arch, *flags, "-o", str(path)], check=True)
    n_vocab = n_vocab_of(path)
    tokens = np.random.default_rng(seed).integers(0, n_vocab, N_TOKENS)
    npy = tmp / f"{arch}-{name}.npy"
    out = subprocess.run([ref, str(path), ",".join(map(str, tokens)), str(npy), "--kv-type",
                          LLAMA_SETTINGS["kv_type"], "--flash-attn", LLAMA_SETTINGS["flash_attn"], "--threads",
                          str(LLAMA_SETTINGS["threads"])], check=True, capture_output=True, text=True)
    info = json.loads(out.stdout)
    logits = np.load(npy)
    if info["arch"] != arch or logits.shape != (N_TOKENS, n_vocab) or logits.dtype != np.float32:
        raise RuntimeError(f"{arch} {name}: llama_logits_ref said {info}, logits {logits.shape} {logits.dtype}")
    if not np.all(np.isfinite(logits)):
        raise RuntimeError(f"{arch} {name}: llama.cpp's logits are not finite")
    rows = np.ascontiguousarray(logits[list(POSITIONS)], dtype="<f4")
    print(f"{arch} {name}: {path.stat().st_size} bytes, logits max |x| {np.abs(rows).max():.3f}", file=sys.stderr)
    return {"name": name, "synth": args, "file_sha256": sha256(path), "file_size": path.stat().st_size,
            "n_vocab": n_vocab, "tokens": tokens.tolist(), "positions": list(POSITIONS),
            "logits_f32_base64": base64.b64encode(rows.tobytes()).decode("ascii")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="llama_logits_ref")
    ap.add_argument("--synth", required=True, help="moeinfer-synth")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--llama-commit", required=True)
    ap.add_argument("archs", nargs="*")
    a = ap.parse_args()
    archs = a.archs or sorted(CASES)
    unknown = [arch for arch in archs if arch not in CASES]
    if unknown:
        ap.error(f"no cases for {unknown} (known: {sorted(CASES)})")
    synth_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            doc = {
                "llama_cpp_commit": a.llama_commit,
                "produced_by": "scripts/regen_forward_reference.sh (scripts/reference/llama_logits_ref.cpp)",
                "moeinfer_commit": synth_commit.strip() or None,
                "llama_cpp_settings": LLAMA_SETTINGS,
                "cases": [write_case(a.ref, a.synth, arch, case, pathlib.Path(tmp)) for case in CASES[arch]],
            }
            (a.out / f"{arch}.json").write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {a.out / (arch + '.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
