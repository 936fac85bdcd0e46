#!/usr/bin/env bash
# One GPU against two, experts in host RAM (issue 24's scaling): the same file with -ot exps=CPU and no expert
# cache (every ubatch uploads every expert), on GPU 0 alone, on GPUs 0 and 1 (layer split 1:1) with upload
# relays off, and with them on (the default, auto: where the peer link pays). Each run's median and each GPU's
# upload rate per link (own / relayed through the other GPU).
#   scripts/device_relay_bench.sh BIN_DIR OUT_DIR MODEL_SPEC [TESTS]
# MODEL_SPEC: a moeinfer-bench --synthetic spec (written to /tmp/moe-synth once). TESTS (default "pp4096 pp512
# tg128"). Runs go A B C, then C B A, -r 3 each: medians of 6 samples per configuration.
set -uo pipefail
bin=$1; out=$2; spec=$3; tests=${4:-"pp4096 pp512 tg128"}
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
args_of() {
  case $1 in
    pp4096) echo "-p 4096 -ub 4096 -n 0" ;;
    pp512) echo "-p 512 -n 0" ;;
    tg128) echo "-p 0 -n 128" ;;
  esac
}
run() {  # tag, then moeinfer-bench arguments
  local tag=$1; shift
  "$bin/bin/moeinfer-bench" --synthetic "$spec" --synthetic-dir /tmp/moe-synth --device cuda -ot exps=CPU \
    --expert-cache off -r 3 -o json "$@" > "$out/$tag.json" 2> "$out/$tag.err" ||
    { echo "FAILED: $tag"; tail -5 "$out/$tag.err"; }
}
for t in $tests; do
  a=$(args_of "$t")
  for pass in 1 2; do
    order="one off on"; [ $pass = 2 ] && order="on off one"
    for c in $order; do
      case $c in
        one) run "${t}_one_$pass" -dev CUDA0 $a ;;
        off) run "${t}_off_$pass" -dev CUDA0,CUDA1 --backend-options upload_relay=off $a ;;
        on) run "${t}_on_$pass" -dev CUDA0,CUDA1 $a ;;
      esac
    done
  done
  python3 - "$out" "$t" <<'PY'
import json, statistics, sys, os
out, t = sys.argv[1], sys.argv[2]
med = {}
for c in ("one", "off", "on"):
    samples, links = [], []
    for p in (1, 2):
        f = os.path.join(out, f"{t}_{c}_{p}.json")
        if not os.path.exists(f) or os.path.getsize(f) == 0:
            continue
        for r in json.load(open(f)):
            samples += r["samples_ts"]
            for d in (0, 1):
                k = f"sched_dev{d}_"
                if k + "seconds_total" not in r or r[k + "seconds_total"] <= 0:
                    continue
                s, up, rel = r[k + "seconds_total"], r[k + "bytes_uploaded"], r[k + "bytes_weights_relayed"]
                links.append(f"GPU{d} own {(up - rel) / s / 1e9:.1f} relayed {rel / s / 1e9:.1f} GB/s")
    if samples:
        med[c] = statistics.median(samples)
        print(f"{t:7s} {c:4s} median {med[c]:10.2f} t/s  samples {[round(x, 1) for x in samples]}  {'; '.join(links[:2])}")
if "one" in med:
    print(f"{t:7s} two GPUs / one: relays off {med.get('off', 0) / med['one']:.2f}x, on {med.get('on', 0) / med['one']:.2f}x")
PY
done
