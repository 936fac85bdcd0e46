#!/usr/bin/env python3
"""Splits a scripts/device_host_profile.sh recording by thread and symbol.

    python3 scripts/host_profile_report.py PERF_DATA LIB_DIR [--window REGEX] [--tokens N] [--top N]

LIB_DIR holds the unstripped libmoeinfer.so.0* of the build that was packed (build/lib): it is added to
perf's build-id cache, so the stripped copy that ran on the device resolves to its symbols. The report
covers the window from the first to the last sample whose symbol matches --window (default: the CPU
matmul kernels, `cpu::mm::`, i.e. the timed runs rather than loading), and prints:
- the process's main thread (the scheduler's: it also takes part in the host's oneTBB work) by shared
  object and by symbol, as a share of the window and, with --tokens, in milliseconds per token;
- the other threads together (oneTBB's workers, the CUDA driver's), by symbol.
Samples are at perf's rate (1999 Hz in device_host_profile.sh), so a thread's samples / 1999 are the
seconds it ran on a CPU.
"""
from __future__ import annotations

import argparse
import collections
import glob
import re
import subprocess
import sys

RATE_HZ = 1999
LINE = re.compile(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\(([^)]*)\)\s*$")


def load(perf_data: str) -> list[tuple[int, int, float, str, str]]:
    out = subprocess.run(["perf", "script", "-i", perf_data, "-F", "pid,tid,time,ip,sym,dso"],
                         check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            sym = m.group(4).replace("(anonymous namespace)::", "")  # keeps template arguments readable
            rows.append((int(m.group(1)), int(m.group(2)), float(m.group(3)), sym, m.group(5).rsplit("/", 1)[-1]))
    return rows


def table(title: str, counts: collections.Counter, total: int, top: int, per_token: float | None) -> None:
    print(f"--- {title} ({total} samples, {total / RATE_HZ:.2f} s)")
    for key, n in counts.most_common(top):
        ms = f" {1e3 * n / RATE_HZ / per_token:7.3f} ms/token" if per_token else ""
        print(f"{n:7d} {100.0 * n / total:5.1f}%{ms}  {key[:150]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("perf_data")
    ap.add_argument("lib_dir")
    ap.add_argument("--window", default=r"cpu::mm::", help="regex of the symbols that bound the window")
    ap.add_argument("--tokens", type=float, help="tokens the window ran (for ms per token)")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    for lib in glob.glob(f"{a.lib_dir}/libmoeinfer.so.0*"):
        subprocess.run(["perf", "buildid-cache", "--add", lib], check=False, capture_output=True)
    rows = load(a.perf_data)
    if not rows:
        print("host_profile_report: no samples read", file=sys.stderr)
        return 1
    bound = re.compile(a.window)
    times = [t for _, _, t, sym, _ in rows if bound.search(sym)]
    if not times:
        print(f"host_profile_report: no sample matches --window {a.window!r}", file=sys.stderr)
        return 1
    t0, t1 = min(times), max(times)
    inside = [r for r in rows if t0 <= r[2] <= t1]
    print(f"window {t1 - t0:.3f} s ({len(inside)} samples of {len(rows)})")
    main_rows = [r for r in inside if r[0] == r[1]]
    other = [r for r in inside if r[0] != r[1]]
    threads = len({r[1] for r in other})
    table("main thread by shared object", collections.Counter(r[4] for r in main_rows), len(main_rows), a.top,
          a.tokens)
    table("main thread by symbol", collections.Counter(f"{r[4]}: {r[3]}" for r in main_rows), len(main_rows),
          a.top, a.tokens)
    table(f"other threads ({threads}) by symbol", collections.Counter(f"{r[4]}: {r[3]}" for r in other),
          max(len(other), 1), min(a.top, 12), None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
