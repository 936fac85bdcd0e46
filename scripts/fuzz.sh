#!/usr/bin/env bash
# Builds the GGUF fuzzer (clang; libFuzzer + ASan + UBSan) in its own build dir and runs it for a
# bounded time over a scratch copy of the checked-in corpus (tests/fuzz/corpus). Exits non-zero on
# any crash, sanitizer report, leak, timeout or out-of-memory; the input that caused it is kept in
# <build dir>/fuzz_work/artifacts/.
#
# Usage: scripts/fuzz.sh [seconds (default 60)] [extra libFuzzer flags ...]
# Env:   MOE_FUZZ_BUILD_DIR (default <repo>/build-fuzz), MOE_FUZZ_JOBS (build parallelism, default 2)
set -euo pipefail

secs="${1:-60}"
[[ $# -gt 0 ]] && shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${MOE_FUZZ_BUILD_DIR:-$root/build-fuzz}"

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOEINFER_BUILD_FUZZERS=ON -DMOEINFER_CUDA=OFF -DMOEINFER_BUILD_PYTHON=OFF -DMOEINFER_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" --target fuzz_gguf -j "${MOE_FUZZ_JOBS:-2}"

work="$build/fuzz_work"
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$root"/tests/fuzz/corpus/*.gguf "$work/corpus/"

echo "fuzz.sh: running fuzz_gguf for ${secs}s over $(ls "$work/corpus" | wc -l) seed files"
rc=0
"$build/tests/fuzz/fuzz_gguf" "$work/corpus" \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=16384 \
  -dict="$root/tests/fuzz/gguf.dict" -artifact_prefix="$work/artifacts/" \
  -error_exitcode=77 -timeout_exitcode=78 -print_final_stats=1 "$@" || rc=$?

if [[ $rc -ne 0 ]]; then
  echo "fuzz.sh: FAILED (libFuzzer exit $rc); reproducer(s) in $work/artifacts/:" >&2
  ls -l "$work/artifacts" >&2 || true
  exit "$rc"
fi
echo "fuzz.sh: OK, no crash in ${secs}s (corpus grew to $(ls "$work/corpus" | wc -l) files in $work/corpus)"
