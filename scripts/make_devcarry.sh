#!/usr/bin/env bash
# Packs the binaries the GPU machine needs into an ignored folder to pass to the device tool's `carry`:
#   scripts/make_devcarry.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, build-devcarry)
# OUT_DIR gets moeinfer_tests, bin/moeinfer-bench, lib/libmoeinfer.so.0 and lib/libtbb.so.12 (the device
# image has no oneTBB), stripped. On the device: export LD_LIBRARY_PATH=$PWD/OUT_DIR/lib.
# XZ=1 compresses the test binary and the library (the device tool carries at most 64 MiB with the tree):
# unpack on the device with `xz -d OUT_DIR/moeinfer_tests.xz OUT_DIR/lib/libmoeinfer.so.0.xz`.
set -euo pipefail
build=${1:-build}
out=${2:-build-devcarry}
tbb=$(ldconfig -p | awk '/libtbb\.so\.12 /{p = $NF} END {print p}')  # reads to the end: no SIGPIPE
[ -n "$tbb" ] || { echo "make_devcarry: libtbb.so.12 not found" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build/tests/moeinfer_tests" "$out/"
cp "$build/tools/moeinfer-bench" "$out/bin/"
cp -L "$build/lib/libmoeinfer.so.0" "$tbb" "$out/lib/"
strip "$out/moeinfer_tests" "$out/bin/moeinfer-bench" "$out/lib/"*
if [ "${XZ:-0}" = 1 ]; then xz -T2 -f "$out/moeinfer_tests" "$out/lib/libmoeinfer.so.0"; fi
du -sh "$out"
