#!/usr/bin/env bash
# Load time and peak memory of loading a model and creating a hybrid context, on the GPU machine: from the
# page cache (warm) and from a cold file (evicted with posix_fadvise(POSIX_FADV_DONTNEED) before each run),
# for one packed build or two (A/B, e.g. against a build of the commit before host-resident weights were
# used in place, which copied them into pinned memory):
#   scripts/device_load_bench.sh NEW_DIR [OLD_DIR]
# Builds are packed by scripts/make_devcarry.sh (DIR/bin/moeinfer-bench, DIR/lib). Each run is one
# moeinfer-bench process (-p 0 -n 1 -r 1: load, create, one token); a Python driver times the process and
# reads its peak resident set (ru_maxrss); builds whose bench prints the --verbose load report
# ("load X s (model, context)") also give the time of the library calls alone (process time adds the
# CUDA start-up, one decoded token and the exit).
# Environment: DEVICE (default cuda; emulated tries the script without a GPU), SPEC (default Q30-48, the largest synthetic model the other scripts use), OT (default
# exps=CPU), REPS (default 3) runs per build and mode, DIR (default /tmp/moe-load) for the model file,
# ARGS (default none) more bench flags for every run (e.g. ARGS="-t 1": the weights read into anonymous
# memory on one thread instead of min(cores, 8)).
# The eviction works only for pages nothing else maps; "cold?" marks a cold median under twice the warm
# one (the file may have stayed cached).
set -uo pipefail
new=$1; old=${2:-}
spec=${SPEC:-"qwen3moe:preset=qwen3-30b-a3b:layers=48:experts=q4_0:dense=q8_0"}
ot=${OT:-exps=CPU}
device=${DEVICE:-cuda}
dir=${DIR:-/tmp/moe-load}
mkdir -p "$dir"
# Writes the synthetic model once (the bench caches it in $dir) and finds its path.
LD_LIBRARY_PATH="$new/lib:${LD_LIBRARY_PATH:-}" "$new/bin/moeinfer-bench" --synthetic "$spec" --synthetic-dir "$dir" \
  --device "$device" -ot "$ot" -p 0 -n 1 -r 1 --no-warmup -o json > /dev/null || { echo "FAILED: writing $spec"; exit 1; }
model=$(ls -t "$dir"/*.gguf | head -1)
echo "model $model ($(du -h "$model" | cut -f1)), -ot $ot"

python3 - "$model" "$ot" "$device" "${REPS:-3}" "${ARGS:-}" "$new" $old <<'PY'
import os, re, statistics, subprocess, sys, time

model, ot, device, reps, args, builds = (sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(),
                                         sys.argv[6:])
size = os.path.getsize(model)
REPORT = re.compile(r"load ([0-9.]+) s \(model ([0-9.]+) s, context ([0-9.]+) s\), peak RSS ([0-9.]+) GB")
# Runs the bench as the only child of a fresh interpreter, so that ru_maxrss is that bench's peak alone.
WRAP = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
        "print('child_maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(rc)")

def evict():
    fd = os.open(model, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

def warm():
    with open(model, "rb") as f:
        while f.read(64 << 20):
            pass

def run(build):
    env = dict(os.environ, LD_LIBRARY_PATH=f"{build}/lib:" + os.environ.get("LD_LIBRARY_PATH", ""))
    cmd = [f"{build}/bin/moeinfer-bench", "-m", model, "--device", device, "-ot", ot, "-p", "0", "-n", "1",
           "-r", "1", "--no-warmup", "-v", "-o", "json"] + args
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", WRAP] + cmd, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    _, err = p.communicate()
    wall = time.monotonic() - t0
    kib = re.search(r"child_maxrss_kib (\d+)", err)
    peak = int(kib.group(1)) * 1024 if kib else 0
    if p.returncode != 0:
        print(f"  FAILED ({p.returncode}): {err.strip()[-400:]}")
        return None
    m = REPORT.search(err)
    return {"wall": wall, "child_peak": peak, "load": float(m.group(1)) if m else None,
            "context": float(m.group(3)) if m else None, "peak": float(m.group(4)) * 1e9 if m else None}

print(f"file {size / 1e9:.2f} GB; per build and mode: median of {reps} runs" + (f"; bench flags {' '.join(args)}" if args else ""))
print(f"{'build':40s} {'mode':5s} {'process s':>9s} {'load s':>7s} {'context s':>9s} {'peak RSS GB':>11s} {'/ file':>6s}")
for build in builds:
    medians = {}
    for mode in ("warm", "cold"):
        rows = []
        for _ in range(reps):
            evict() if mode == "cold" else warm()
            r = run(build)
            if r:
                rows.append(r)
        if not rows:
            continue
        med = lambda k: statistics.median(r[k] for r in rows) if rows[0][k] is not None else float("nan")
        medians[mode] = med("wall")
        peak = statistics.median(r["child_peak"] for r in rows)
        flag = " cold?" if mode == "cold" and "warm" in medians and medians["cold"] < 2 * medians["warm"] else ""
        print(f"{build[-40:]:40s} {mode:5s} {med('wall'):9.2f} {med('load'):7.2f} {med('context'):9.2f} "
              f"{peak / 1e9:11.2f} {peak / size:6.2f}{flag}")
PY
