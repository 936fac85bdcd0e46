#!/usr/bin/env bash
# All-GPU benchmarks (issue 4) on the GPU machine from prebuilt binaries, CUDA graphs on and off:
#   scripts/device_cuda_bench.sh BIN_DIR OUT_DIR MODEL_SPEC...
# Each MODEL_SPEC is a moeinfer-bench --synthetic spec. Runs pp512 and tg128 (3 repetitions after a
# warm-up) with MOEINFER_CUDA_GRAPHS=1 and =0; results go to OUT_DIR/cuda_bench.json (one JSON
# array per line) and medians to stdout. Each synthetic file is deleted once its spec is done.
set -uo pipefail
bin=$1; out=$2; shift 2
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
dir=/tmp/moe-synth
mkdir -p "$dir"
for spec in "$@"; do
  for graphs in 1 0; do
    echo "=== $spec graphs=$graphs"
    MOEINFER_CUDA_GRAPHS=$graphs "$bin/moeinfer-bench" --device cuda --synthetic "$spec" --synthetic-dir "$dir" \
        -p 512 -n 128 -r 3 -o json > "$out/run.json" 2> "$out/run.err" || { echo "FAILED"; tail -5 "$out/run.err"; continue; }
    tr -d '\n' < "$out/run.json" >> "$out/cuda_bench.json"; echo >> "$out/cuda_bench.json"
    python3 - "$out/run.json" "$graphs" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    print(f"{r['model']:28s} {r['test']:8s} graphs {sys.argv[2]}  median {statistics.median(r['samples_ts']):9.2f} t/s"
          f"  samples {' '.join(f'{s:.1f}' for s in r['samples_ts'])}")
PY
  done
  rm -rf "${dir:?}"/*
done
rm -f "$out/run.json" "$out/run.err"
