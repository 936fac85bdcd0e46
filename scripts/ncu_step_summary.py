#!/usr/bin/env python3
"""Per-kernel table of decode steps from an ncu CSV (scripts/device_decode_profile.sh).

usage: ncu_step_summary.py NCU_CSV [--skip N] [--whole]

The CSV is ncu's long format (--csv --metrics gpu__time_duration.sum,dram__bytes_read.sum): one row per
(launch, metric). Launches are split into decode steps after each launch that reads the most DRAM
bytes of the run (the output projection, the last product of every step); the first N steps (default
2: graph capture and first replays) are dropped. For each kernel (name with template arguments, grid)
it prints launches per step, mean time, time per step and its share of the step's kernel time.
ncu runs kernels one at a time (no overlap between launches), so the step sum is an upper bound of
the GPU's own time per step. --whole takes every launch as one step (a profiled prefill ubatch).
"""
import argparse
import collections
import csv
import io
import re
import sys


def read_launches(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV header found (is ncu.err empty?)")
    rows = csv.DictReader(io.StringIO(text[start:]))
    launches = collections.OrderedDict()
    for r in rows:
        key = int(r["ID"])
        rec = launches.setdefault(key, {"name": r["Kernel Name"], "grid": r.get("Grid Size", "")})
        value = r["Metric Value"].replace(",", "")
        try:
            rec[r["Metric Name"]] = float(value)
        except ValueError:
            rec[r["Metric Name"]] = value
    return [launches[k] for k in sorted(launches)]


def short_name(name):
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|unnamed>::|moe::cuda::(mm::|ops::)?|moe::", "", name)
    name = re.sub(r"^void ", "", name)
    return name.split("(")[0][:70]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--whole", action="store_true", help="all launches are one step (no split, no skip)")
    args = ap.parse_args()
    launches = read_launches(args.csv)
    if not launches:
        sys.exit("no launches")
    t_key, b_key = "gpu__time_duration.sum", "dram__bytes_read.sum"
    most = max(l.get(b_key, 0.0) for l in launches)
    steps, cur = [], []
    if args.whole:
        steps, launches, args.skip = [launches], [], 0
    for l in launches:
        cur.append(l)
        if most > 0 and l.get(b_key, 0.0) >= 0.5 * most:
            steps.append(cur)
            cur = []
    kept = steps[args.skip:]
    if not kept:
        sys.exit(f"{len(steps)} steps found, {args.skip} skipped: nothing left")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    step_ns = []
    for s in kept:
        step_ns.append(sum(l.get(t_key, 0.0) for l in s))
        for l in s:
            a = agg[(short_name(l["name"]), l["grid"])]
            a[0] += 1
            a[1] += l.get(t_key, 0.0)
            a[2] += l.get(b_key, 0.0)
    n = len(kept)
    mean_step = sum(step_ns) / n
    print(f"{n} steps kept of {len(steps)} (launches per step {len(kept[-1])}); kernel time per step "
          f"{mean_step / 1e3:.1f} us (min {min(step_ns) / 1e3:.1f}, max {max(step_ns) / 1e3:.1f})")
    print(f"{'kernel':70s} {'grid':>14s} {'n/step':>6s} {'mean us':>8s} {'us/step':>8s} {'share':>6s} {'GB/s':>7s}")
    for (name, grid), (cnt, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        per_step = t / n
        gbs = b / t if t > 0 else 0.0  # bytes per ns = GB/s
        print(f"{name:70s} {grid:>14s} {cnt / n:6.1f} {t / cnt / 1e3:8.2f} {per_step / 1e3:8.1f} "
              f"{100 * per_step / mean_step:5.1f}% {gbs:7.0f}")


if __name__ == "__main__":
    main()
