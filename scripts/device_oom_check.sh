#!/usr/bin/env bash
# Device out-of-memory on the GPU machine, from binaries packed by scripts/make_devcarry.sh:
#   scripts/device_oom_check.sh CARRY_DIR OUT_DIR
# 1. moeinfer_tests "[oom]": the emulated and CUDA cases with the device memory meter's test hook (a
#    refused allocation at placement falls back to more experts in host RAM; refused budgets, KV caches,
#    arenas and upload slots report the bytes asked and free, leak nothing, leave other contexts as they
#    were), and the driver's own refusal with a ballast buffer filling the GPU. -s prints the messages.
# 2. moeinfer-bench asked for the impossible, on a synthetic Q30 of 16 layers: each run must fail with
#    RESOURCE_EXHAUSTED's text (exit 1, no crash), and the same command within reason must then run.
set -uo pipefail
carry=$1; out=$2
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
"$carry/moeinfer_tests" "[oom]" -s > "$out/oom_tests.log" 2>&1
echo "[oom] tests: exit $?"; grep -E "^(creation|run): |test cases|assertions" "$out/oom_tests.log" | head -20

Q30="qwen3moe:preset=qwen3-30b-a3b:layers=16:experts=q8_0:dense=q8_0"
bench() {  # tag, then moeinfer-bench arguments
  local tag=$1; shift
  "$carry/bin/moeinfer-bench" --synthetic-dir /tmp/moe-synth --synthetic "$Q30" --device cuda -r 1 "$@" \
    > "$out/$tag.out" 2> "$out/$tag.err"
  echo "=== $tag (exit $?): $*"; tail -3 "$out/$tag.err"; tail -4 "$out/$tag.out"
}
# A KV cache no GPU holds: the default budget says what it subtracted from the free memory.
bench kv_default -c 16000000 -p 16 -n 0
# The same with every weight on the device by an explicit budget: the driver refuses the KV cache.
bench kv_budget -c 3000000 -p 16 -n 0 --vram-budget 200GiB
# A ubatch whose activations no GPU holds, weights all on the device: refused at the first prefill.
bench ubatch -c 262144 -ub 262144 -p 262144 -n 0 --vram-budget 200GiB
# Within reason, after the refusals: runs.
bench fine -c 4096 -p 512 -n 16
