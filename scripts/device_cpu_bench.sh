#!/usr/bin/env bash
# CPU-only benchmarks on the GPU machine's CPU (issue 3 targets), from prebuilt binaries:
#   scripts/device_cpu_bench.sh BIN_DIR OUT_DIR MODEL_SPEC...
# Each MODEL_SPEC is a moeinfer-bench --synthetic spec; results go to OUT_DIR as JSON and text.
# Runs pp512 and tg128 (3 repetitions after a warm-up), all cores.
set -uo pipefail
bin=$1; out=$2; shift 2
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
for spec in "$@"; do
  tag=$(echo "$spec" | tr ':=' '__')
  echo "=== $spec"
  "$bin/moeinfer-bench" --synthetic "$spec" --synthetic-dir /tmp/moe-synth -p 512 -n 128 -r 3 -o json \
      > "$out/cpu_$tag.json" 2> "$out/cpu_$tag.err" || { echo "FAILED: $spec"; tail -5 "$out/cpu_$tag.err"; continue; }
  python3 - "$out/cpu_$tag.json" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    print(f"{r['model']:28s} {r['test']:8s} threads {r['n_threads']:3d}  median {statistics.median(r['samples_ts']):9.2f} t/s"
          f"  mean {r['avg_ts']:9.2f} +- {r['stdev_ts']:.2f}")
PY
done
