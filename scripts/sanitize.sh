#!/usr/bin/env bash
# Builds the CPU library and the C++ and C99 tests with AddressSanitizer (LeakSanitizer on) and
# UndefinedBehaviorSanitizer, in their own build dir, and runs them through ctest. Any report fails the
# step: ASan and LSan stop at the first error, UBSan aborts (-fno-sanitize-recover, see
# cmake/MoeinferSanitize.cmake). Without Python (the module would need the ASan runtime preloaded) and
# without the install check (its consumer program is not sanitized).
#
# Usage: scripts/sanitize.sh [extra ctest arguments, e.g. -R c\.]
# Env:   MOE_SANITIZE_BUILD_DIR (default <repo>/build-sanitize), MOE_SANITIZE_JOBS (default: all cores)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
jobs="${MOE_SANITIZE_JOBS:-$(nproc)}"

start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOEINFER_SANITIZE=address,undefined -DMOEINFER_CUDA=OFF -DMOEINFER_BUILD_PYTHON=OFF \
  -DMOEINFER_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j "$jobs"
built=$(date +%s)

# halt_on_error: stop at the first report. detect_leaks: LeakSanitizer at exit. Stack traces for UBSan.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@" || rc=$?
echo "sanitize.sh: build $((built - start)) s, tests $(($(date +%s) - built)) s"
if [[ $rc -ne 0 ]]; then
  echo "sanitize.sh: FAILED (ctest exit $rc)" >&2
  exit "$rc"
fi
echo "sanitize.sh: OK, no sanitizer report"
