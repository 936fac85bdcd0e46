#!/usr/bin/env bash
# Per-kernel GPU time of all-GPU decode steps, kernels as a normal run launches them (CUDA graphs,
# fusion, PDL), on the GPU machine from a packed build (scripts/make_devcarry.sh), run from the repo root:
#   scripts/device_decode_profile.sh CARRY_DIR OUT_DIR SPEC [STEPS]
# ncu times every kernel of a STEPS-token decode (default 6) with warm caches (--cache-control none),
# untouched clocks (--clock-control none) and the kernels of CUDA graphs one by one (--graph-profiling
# node); scripts/ncu_step_summary.py splits the launches into steps and prints the per-kernel table.
# ncu runs kernels one at a time, so the step's kernel sum is an upper bound of the GPU's own time per
# step; compare it with 1 / the bench's tg t/s of the same build. About a minute for a 16-layer model.
# PROMPT=N profiles one prefill ubatch of N tokens instead (-p N -n 0, all its launches as one step).
set -euo pipefail
bin=$1; out=$2; spec=$3; steps=${4:-6}
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
bench=("$bin/bin/moeinfer-bench" --device cuda --synthetic "$spec" --synthetic-dir /tmp/moe-synth)
"${bench[@]}" -p 0 -n 1 -r 1 > "$out/write.log" 2>&1  # writes the model file outside the profile
run=(-p 0 -n "$steps") summary=()
if [ -n "${PROMPT:-}" ]; then run=(-p "$PROMPT" -ub "$PROMPT" -n 0) summary=(--whole); fi
"$ncu" --clock-control none --cache-control none --graph-profiling node --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  "${bench[@]}" "${run[@]}" -r 1 --no-warmup > "$out/ncu.csv" 2> "$out/ncu.err"
python3 "$(dirname "$0")/ncu_step_summary.py" "$out/ncu.csv" "${summary[@]}" | tee "$out/summary.txt"
