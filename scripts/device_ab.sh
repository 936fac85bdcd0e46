#!/usr/bin/env bash
# Same-machine A/B of two packed builds (scripts/make_devcarry.sh) on the GPU machine: each moeinfer-bench
# run goes A, B, B, A, ... (machines differ by several % between device calls, so only runs of one call
# compare; the order alternates because the first run of a pair can read slower).
#   scripts/device_ab.sh A_DIR B_DIR OUT_DIR [GROUP...]
# Groups: tg (all-GPU tg128, Q30-16 / G20 / Q30-48), hybrid_tg (the same with -ot exps=CPU), pp (all-GPU
# pp512, and pp4096 with -ub 4096), hybrid_pp (the same with -ot exps=CPU: the expert uploads). JSON per run in OUT_DIR; a line per run with the median t/s.
# Default: tg hybrid_tg. SPECS="spec ..." narrows the models; REPS (default 3) repetitions per run (-r),
# ROUNDS (default 2) A/B rounds. A_ARGS / B_ARGS: extra moeinfer-bench arguments for one side only (e.g.
# B_ARGS="--expert-cache off" to compare a build that has the expert cache with one from before it).
set -uo pipefail
a=$1; b=$2; out=$3; shift 3
groups=${*:-tg hybrid_tg}
dir=/tmp/moe-synth
Q30="qwen3moe:preset=qwen3-30b-a3b:layers=16:experts=q8_0:dense=q8_0"
Q48="qwen3moe:preset=qwen3-30b-a3b:layers=48:experts=q4_0:dense=q8_0"
G20="gpt-oss:preset=gpt-oss-20b:layers=24:experts=mxfp4:dense=q8_0"
mkdir -p "$out"

run() {  # side (A or B), tag, then moeinfer-bench arguments
  local side=$1 tag=$2; shift 2
  local bin=$a side_args=${A_ARGS:-}; [ "$side" = B ] && { bin=$b; side_args=${B_ARGS:-}; }
  LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}" "$bin/bin/moeinfer-bench" --synthetic-dir $dir --device cuda -r "${REPS:-3}" \
    -o json $side_args "$@" > "$out/${tag}_$side.json" 2> "$out/${tag}_$side.err" || { echo "FAILED: $tag $side"; return; }
  python3 - "$out/${tag}_$side.json" "$tag" "$side" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    print(f"  {sys.argv[2]:14s} {sys.argv[3]}  {r['test']:8s} median {statistics.median(r['samples_ts']):9.2f} t/s")
PY
}

for g in $groups; do
  for spec in ${SPECS:-"$Q30" "$G20" "$Q48"}; do
    tag=$(echo "$spec" | grep -q gpt-oss && echo g20 || (echo "$spec" | grep -q layers=48 && echo q48 || echo q30))
    extra=(); case $g in hybrid_*) extra=(-ot exps=CPU) ;; esac
    for k in $(seq 1 "${ROUNDS:-2}"); do
      # A B in odd rounds, B A in even ones: the first run of a pair has read up to 6% slower on some
      # machines (PERF.md, 2026-11-26: the same build 640-665 t/s first, 705-716 second).
      sides="A B"; [ $((k % 2)) -eq 0 ] && sides="B A"
      for side in $sides; do
        if [ "$g" = pp ] || [ "$g" = hybrid_pp ]; then
          run $side ${g}512_${tag}_$k --synthetic "$spec" "${extra[@]}" -p 512 -n 0
          run $side ${g}4096_${tag}_$k --synthetic "$spec" "${extra[@]}" -p 4096 -ub 4096 -n 0
        else
          run $side ${g}_${tag}_$k --synthetic "$spec" "${extra[@]}" -p 0 -n 128
        fi
      done
    done
  done
done
