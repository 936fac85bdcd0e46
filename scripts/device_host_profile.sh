#!/usr/bin/env bash
# Where the host's time goes in a benchmark on the GPU machine: Linux perf samples every thread of a
# moeinfer-bench run (the scheduler thread, oneTBB's workers, the CUDA driver's), for
# scripts/host_profile_report.py to split by thread and symbol here, where the unstripped library is.
# The device image has no perf: scripts/make_devcarry.sh PERF=1 packs this machine's (with its libraries
# and loader, ~8 MB) into CARRY_DIR/perfpack.tar.xz. Run from the repository root on the device:
#   scripts/device_host_profile.sh CARRY_DIR OUT_DIR BENCH_ARGS...
# e.g. ... build-devcarry $OUT -m MODEL --device cuda -ot exps=CPU --expert-cache off -t 16 -p 0 -n 64 -r 2
# Writes OUT_DIR/perf.data (samples at 1999 Hz, no call graphs: the library has no frame pointers) and
# OUT_DIR/bench.txt. Then, here: python3 scripts/host_profile_report.py OUT_DIR/perf.data build/lib.
# CALLGRAPH=1 records call graphs instead, unwound from the stack copies by DWARF (.eh_frame, which a
# release build keeps), and writes the main thread's call chains as OUT_DIR/callchains.txt.xz, unwound
# and named on the device (the CUDA driver's frames need its libcuda): pack the carry with STRIP=0 so
# our frames have names. Then, here: python3 scripts/host_callgraph_report.py OUT_DIR/callchains.txt.xz.
set -euo pipefail
carry=$1; out=$2; shift 2
[ -f "$carry/perfpack.tar.xz" ] || { echo "device_host_profile: no $carry/perfpack.tar.xz (make_devcarry.sh PERF=1)" >&2; exit 1; }
# shellcheck disable=SC1091
source "$carry/setup.sh"  # unpacks what XZ=1 packed, sets LD_LIBRARY_PATH
mkdir -p "$out"
tar xJf "$carry/perfpack.tar.xz" -C /tmp
# The packed loader and libraries run perf whatever the device image's glibc is.
perf=(/tmp/perfpack/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfpack/lib /tmp/perfpack/perf)
if [ "${CALLGRAPH:-0}" = 1 ]; then
  data=/tmp/moe-callgraph.data  # ~1.5 GB for a 48-layer decode of 192 tokens: not into OUT_DIR
  "${perf[@]}" record --call-graph dwarf,6144 -F 1999 -o "$data" -- "$carry/bin/moeinfer-bench" "$@" > "$out/bench.txt" 2>&1
  # The main thread (the scheduler's) is the process's lowest thread id.
  main=$("${perf[@]}" report -i "$data" --sort pid --stdio -g none 2>/dev/null | grep -o '[0-9]*:moeinfer-bench' |
         cut -d: -f1 | sort -n | head -n 1)
  "${perf[@]}" script -i "$data" --tid "$main" -F tid,time,ip,sym,dso 2>/dev/null | xz -T0 > "$out/callchains.txt.xz"
  rm -f "$data"
else
  "${perf[@]}" record -F 1999 -o "$out/perf.data" -- "$carry/bin/moeinfer-bench" "$@" > "$out/bench.txt" 2>&1
fi
tail -n 4 "$out/bench.txt"
