#!/usr/bin/env python3
"""Where the scheduler thread's time goes, by call tree, from a CALLGRAPH=1 scripts/device_host_profile.sh run.

    python3 scripts/host_callgraph_report.py OUT_DIR/callchains.txt.xz --tokens N [--root REGEX] [--depth D]

The input is `perf script` of the main thread's samples with DWARF-unwound call chains (made on the GPU
machine, where the CUDA driver's frames unwind). Only samples whose chain holds a frame matching --root
count (default `decode_ubatch|moe::decode`: the decode calls, not loading; chains cut short above the
runtime's decode_ubatch still match). Prints, in milliseconds per token (samples
at 1999 Hz over --tokens tokens, warm-up included if the bench had one):
- the leaf's shared object (our library, libcuda, oneTBB, libc, the kernel);
- the tree of our library's functions below Scheduler::run, to --depth levels, inclusive;
- time spent outside our library, by the nearest of our functions that called into it.
"""
from __future__ import annotations

import argparse
import collections
import lzma
import re
import sys

RATE_HZ = 1999
FRAME = re.compile(r"\t\s*[0-9a-f]+ (.*) \((.*)\)$")
OURS = "libmoeinfer"


def chains(path: str):
    """Yields each sample's frames, leaf first, as (symbol, shared object's file name)."""
    opener = lzma.open if path.endswith(".xz") else open
    frames: list[tuple[str, str]] = []
    with opener(path, "rt", errors="replace") as f:
        for line in f:
            if line.startswith("\t"):
                m = FRAME.match(line.rstrip("\n"))
                if m:
                    frames.append((m.group(1), m.group(2).rsplit("/", 1)[-1]))
            elif line.strip():
                if frames:
                    yield frames
                frames = []
    if frames:
        yield frames


def short(sym: str) -> str:
    """The function's qualified name without its argument list (templates kept, cut at 110 characters)."""
    return re.sub(r"\(.*", "", sym.replace("(anonymous namespace)::", ""))[:110]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("callchains")
    ap.add_argument("--tokens", type=float, required=True, help="tokens decoded in the recording")
    ap.add_argument("--root", default=r"decode_ubatch|moe::decode", help="regex: count only samples with such a frame")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--min-ms", type=float, default=0.05, help="leave out entries below this (ms per token)")
    a = ap.parse_args()
    root = re.compile(a.root)
    ms = lambda n: 1e3 * n / RATE_HZ / a.tokens  # noqa: E731

    leaf_dso: collections.Counter = collections.Counter()
    tree: collections.Counter = collections.Counter()
    outside: collections.Counter = collections.Counter()
    n_all = n = 0
    for frames in chains(a.callchains):
        n_all += 1
        if not any(root.search(sym) for sym, _ in frames):
            continue
        n += 1
        leaf_dso[frames[0][1]] += 1
        ours = [short(sym) for sym, dso in frames if OURS in dso]
        if OURS not in frames[0][1]:
            outside[(frames[0][1], ours[0] if ours else "?")] += 1
        path: list[str] = []
        for name in reversed(ours):  # root first; recursion and inlined repeats folded
            if not path or path[-1] != name:
                path.append(name)
        if "moe::sched::Scheduler::run" in path:
            below = path[len(path) - 1 - path[::-1].index("moe::sched::Scheduler::run") + 1:]
            below = [p for p in below if not p.startswith("std::_Function") and "lambda" not in p]
            for d in range(1, min(a.depth, len(below)) + 1):
                tree[tuple(below[:d])] += 1
    if n == 0:
        print(f"host_callgraph_report: none of {n_all} samples has a frame matching {a.root!r}", file=sys.stderr)
        return 1
    print(f"{n} of {n_all} samples under {a.root!r}: {ms(n):.2f} ms per token")
    print("--- leaf shared object, ms per token")
    for k, v in leaf_dso.most_common(12):
        print(f"{ms(v):8.3f}  {k}")
    print("--- below Scheduler::run, inclusive, ms per token")
    for k, v in sorted(tree.items(), key=lambda kv: (kv[0][:1], -kv[1])):
        if ms(v) >= a.min_ms:
            print(f"{ms(v):8.3f}  " + "  " * (len(k) - 1) + k[-1])
    print("--- outside our library, by the nearest of our callers, ms per token")
    for (dso, caller), v in outside.most_common(25):
        if ms(v) >= a.min_ms:
            print(f"{ms(v):8.3f}  {dso[:24]:24s} {caller}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
