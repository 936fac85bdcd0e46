#!/usr/bin/env bash
# One device-tool call's worth of checks after scheduler / CUDA changes, from binaries packed by
# scripts/make_devcarry.sh:   scripts/device_session_check.sh CARRY_DIR OUT_DIR [GROUP...]
# Runs the [gpu] test suite, then scripts/device_hybrid_bench.sh with GROUPs (default: split llama).
set -uo pipefail
carry=$1; out=$2; shift 2
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out/bench"
"$carry/moeinfer_tests" "[gpu]" > "$out/gpu_tests.log" 2>&1
echo "[gpu] tests: exit $?"; tail -3 "$out/gpu_tests.log"
"$(dirname "$0")/device_hybrid_bench.sh" "$carry" "$out/bench" "${@:-split llama}"
