#!/usr/bin/env bash
# compute-sanitizer over the [gpu] test suite on the GPU machine, one test case at a time, from binaries
# packed by scripts/make_devcarry.sh:
#   scripts/device_sanitize.sh CARRY_DIR OUT_DIR TOOL [SECONDS_PER_CASE] [TAGS]
# TOOL is a compute-sanitizer tool (memcheck, racecheck, synccheck, initcheck). Each case runs under
# it with a time limit (default 120 s: the sanitizers slow kernels 10-100x, and a few cases loop over
# many shapes); a case that hits the limit is reported as such, not as clean. Per-case logs go to
# OUT_DIR/TOOL-logs.tar.gz, a summary line per case to stdout and OUT_DIR/TOOL.txt. CASES=REGEX runs
# only the cases whose names match; JOBS=N runs N cases at once; DONE=FILE skips the cases a summary of an
# earlier run lists (to go on after a run cut by the device's time limit).
set -uo pipefail
carry=$1; out=$2; tool=$3; limit=${4:-120}; tags=${5:-[gpu]}
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out/$tool"
summary="$out/$tool.txt"
: > "$summary"
extra=()
case "$tool" in
  # Every CUDA call's status is checked by the code under test, and some tests provoke failures on
  # purpose (allocations larger than the device): API errors are not memory errors here.
  memcheck) extra=(--leak-check full --report-api-errors no) ;;
  racecheck) extra=(--racecheck-report all) ;;
esac
mapfile -t cases < <("$carry/moeinfer_tests" "$tags" --list-test-names-only 2>/dev/null | sed '/^$/d' | grep -v 'perf' |
                     grep -E "${CASES:-.}" | { if [ -n "${DONE:-}" ] && [ -f "$DONE" ]; then
                       grep -vxF -f <(sed -nE 's/^(clean|TIMEOUT|ERRORS\([^)]*\)) +[0-9]+s  //p' "$DONE"); else cat; fi; })
run_case() {  # index name
  local i=$1 name=$2 log="$out/$tool/case$1.log" t0 rc dt errors state filter
  t0=$(date +%s)
  # Catch2 takes a test name as a filter; escape its wildcard and tag characters.
  filter=$(printf '%s' "$name" | sed 's/[][*\\,]/\\&/g')
  timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 86 \
      "$carry/moeinfer_tests" "$filter" > "$log" 2>&1
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -1 | grep -Eo '[0-9]+' || true)
  if [ "$rc" = 124 ]; then state="TIMEOUT"
  elif [ "$rc" = 0 ] && [ "${errors:-0}" = 0 ]; then state="clean"
  else state="ERRORS(rc=$rc, ${errors:-?} reported)"
  fi
  printf '%-9s %4ss  %s\n' "$state" "$dt" "$name" | tee -a "$summary"
}
# JOBS cases at a time (default 1): the sanitizers are mostly host-bound, and one GPU holds several.
jobs_max=${JOBS:-1}
for i in "${!cases[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  run_case "$i" "${cases[$i]}" &
done
wait
n_clean=$(grep -c '^clean' "$summary"); n_err=$(grep -c '^ERRORS' "$summary"); n_timeout=$(grep -c '^TIMEOUT' "$summary")
echo "$tool: ${#cases[@]} cases, $n_clean clean, $n_err with errors, $n_timeout past ${limit}s" | tee -a "$summary"
# The device tool brings back a few files only: the per-case logs travel as one archive.
tar -czf "$out/$tool-logs.tar.gz" -C "$out" "$tool" && rm -rf "${out:?}/$tool"
