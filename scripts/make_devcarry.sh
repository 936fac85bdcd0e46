#!/usr/bin/env bash
# Packs the binaries the GPU machine needs into an ignored folder to pass to the device tool's `carry`:
#   scripts/make_devcarry.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, build-devcarry)
# OUT_DIR gets moeinfer_tests, bin/moeinfer-bench, lib/libmoeinfer.so.0 and lib/libtbb.so.12 (the device
# image has no oneTBB), stripped. On the device: export LD_LIBRARY_PATH=$PWD/OUT_DIR/lib.
# XZ=1 compresses the test binary and the library (the device tool carries at most 64 MiB with the tree).
# On the device, `source OUT_DIR/setup.sh` from the repository root unpacks them and sets LD_LIBRARY_PATH.
# The other tools the device scripts use (moeinfer-synth, moeinfer-info, the matmul micro-benchmark) go to
# OUT_DIR/bin when the build has them. PYTHON=1 adds the Python package (OUT_DIR/python/moeinfer, for pytest:
# PYTHONPATH=OUT_DIR/python, MOEINFER_TOOLS_DIR=OUT_DIR/bin); its extension links the library statically, so it
# is as large again (xz'd with XZ=1: unpack OUT_DIR/python/moeinfer/*.xz too). PERF=1 adds perf
# (OUT_DIR/perfpack.tar.xz, for scripts/device_host_profile.sh). STRIP=0 leaves the library unstripped.
set -euo pipefail
build=${1:-build}
out=${2:-build-devcarry}
tbb=$(ldconfig -p | awk '/libtbb\.so\.12 /{p = $NF} END {print p}')  # reads to the end: no SIGPIPE
[ -n "$tbb" ] || { echo "make_devcarry: libtbb.so.12 not found" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build/tests/moeinfer_tests" "$out/"
cp "$build/tools/moeinfer-bench" "$out/bin/"
for tool in tools/moeinfer-synth tools/moeinfer-info tests/moeinfer_bench_matmul; do
  [ -x "$build/$tool" ] && cp "$build/$tool" "$out/bin/"
done
cp -L "$build/lib/libmoeinfer.so.0" "$tbb" "$out/lib/"
strip "$out/moeinfer_tests" "$out/bin/"*
# STRIP=0 keeps the library's symbol table (+~6 MB), for call-graph profiles named on the device
# (scripts/device_host_profile.sh with CALLGRAPH=1).
if [ "${STRIP:-1}" = 1 ]; then strip "$out/lib/"*; fi
packed=("$out/moeinfer_tests" "$out/lib/libmoeinfer.so.0")
if [ "${PYTHON:-0}" = 1 ]; then
  ext=$(ls "$build"/python/moeinfer/_moeinfer*.so 2>/dev/null | head -n 1)
  [ -n "$ext" ] || { echo "make_devcarry: no Python extension in $build/python/moeinfer (MOEINFER_BUILD_PYTHON=ON)" >&2; exit 1; }
  mkdir -p "$out/python/moeinfer"
  cp "$build"/python/moeinfer/*.py "$ext" "$out/python/moeinfer/"
  strip "$out/python/moeinfer/$(basename "$ext")"
  packed+=("$out/python/moeinfer/$(basename "$ext")")
fi
if [ "${XZ:-0}" = 1 ]; then xz -T2 -f "${packed[@]}"; fi
# PERF=1: this machine's perf, its libraries and loader, for scripts/device_host_profile.sh (the device
# image has no perf).
if [ "${PERF:-0}" = 1 ]; then
  perf_bin=$(command -v perf) || { echo "make_devcarry: PERF=1 needs perf (apt-get install linux-perf)" >&2; exit 1; }
  stage=$(mktemp -d)
  mkdir -p "$stage/perfpack/lib"
  cp "$perf_bin" "$stage/perfpack/perf"
  ldd "$perf_bin" | awk '/=>/ {print $3}' | xargs -r -I{} cp -L {} "$stage/perfpack/lib/"
  cp -L /lib64/ld-linux-x86-64.so.2 "$stage/perfpack/lib/"
  tar cJf "$out/perfpack.tar.xz" -C "$stage" perfpack
  rm -rf "$stage"
fi
# OUT_DIR/setup.sh, sourced from the repository root on the device: unpacks what XZ=1 packed (once), puts
# the library on LD_LIBRARY_PATH and makes the tests' scratch folder (a path the test binary was built
# with: BUILD_DIR's, absolute).
cat > "$out/setup.sh" <<SETUP
for f in $out/moeinfer_tests.xz $out/lib/libmoeinfer.so.0.xz $out/python/moeinfer/*.xz; do [ -f "\$f" ] && xz -d -T4 "\$f"; done
export LD_LIBRARY_PATH=\$PWD/$out/lib:\${LD_LIBRARY_PATH:-}
mkdir -p $(cd "$build" && pwd)/tests/tmp
SETUP
du -sh "$out"
