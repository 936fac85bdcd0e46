#!/usr/bin/env bash
# Side-by-side benchmark of moeinfer and the peers (llama.cpp, ik_llama.cpp) on ONE model file, in one device
# call, as ../shared/DESIGN.md §9 asks (a ratio counts only when both ran on the same file in the same call):
#   scripts/device_peer_bench.sh MOEINFER_DIR MODEL OUT_DIR [CONFIG...]
# MOEINFER_DIR is a build packed by scripts/make_devcarry.sh. Peers are found by LLAMA_BENCH and IK_BENCH
# (paths to each llama-bench; ../shared/peers/build-peers.sh puts them in /tmp/peer-*/build/bin); a peer
# whose binary is missing is skipped with a line saying so.
# Configs (default: gpu hybrid hybrid4096 cpu):
#   gpu         all on the GPU: pp512, tg128
#   hybrid      experts in host RAM (-ot exps=CPU): pp512, tg128
#   hybrid4096  the same, pp4096 at ubatch 4096
#   cpu         CPU only: pp512, tg128 (peers with the GPU hidden: a CUDA build with -ngl 0 still
#               offloads large prompt batches)
#   two         two GPUs under per-GPU budgets (issue 24's consumer setup; BUDGETS, default 20GiB,20GiB):
#               pp512, tg128 and pp4096 at ubatch 4096. moeinfer runs first with -dev CUDA0,CUDA1
#               --vram-budget BUDGETS; the peers then get -ts with its layers per GPU (the same weights on
#               each GPU where moeinfer keeps every weight on them; a line says when it does not). llama-bench
#               separates a split's proportions with '/' (-ts 24/24); a comma lists separate runs (-ts 24,24
#               is two runs of -ts 24: every layer on the first GPU)
# Peer flags are those of ../shared/peers/README.md. moeinfer runs its defaults; in the hybrid configs it
# runs twice, with the expert cache on (its default, "auto") and off, labelled moeinfer and moeinfer-nocache:
# the cache keeps uploaded experts in free VRAM, which the peers do not do.
# REPS (default 3) repetitions per figure (-r), THREADS (default: all cores). Prints one line per system,
# config and test with the median t/s and the ratio of each moeinfer row to each peer; JSON per run in OUT_DIR.
set -uo pipefail
moe=$1; model=$2; out=$3; shift 3
configs=${*:-gpu hybrid hybrid4096 cpu}
reps=${REPS:-3}
threads=${THREADS:-$(nproc)}
llama=${LLAMA_BENCH:-/tmp/peer-llama/build/bin/llama-bench}
ik=${IK_BENCH:-/tmp/peer-ik/build/bin/llama-bench}
mkdir -p "$out"
[ -f "$model" ] || { echo "no model file $model"; exit 1; }
echo "model $model ($(du -h "$model" | cut -f1)), threads $threads, reps $reps"

run() {  # system config, then the command; output JSON in $out/system_config.json
  local sys=$1 cfg=$2; shift 2
  local t0=$SECONDS
  if "$@" > "$out/${sys}_$cfg.json" 2> "$out/${sys}_$cfg.err"; then
    echo "  ran $sys $cfg in $((SECONDS - t0)) s"
  else
    echo "FAILED: $sys $cfg (rc $?): $(tail -n 2 "$out/${sys}_$cfg.err" | tr '\n' ' ')"
  fi
}
# The peers' --n-cpu-moe for the `two` config: as many layers' experts in host RAM as moeinfer's placement
# left there (moeinfer spills single experts, the peers whole layers: rounded up, so the peers never get more
# weight bytes on the GPUs). moeinfer-info gives the model's expert bytes and layers.
spilled_layers() {
  local host info
  host=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0]['weights_host_bytes'])" "$out/moeinfer_two.json") ||
    { echo "  two: no moeinfer placement to match" >&2; return 1; }
  [ "$host" -gt 0 ] || { echo 0; return; }
  info=$(LD_LIBRARY_PATH="$moe/lib:${LD_LIBRARY_PATH:-}" "$moe/bin/moeinfer-info" "$model") ||
    { echo "  two: moeinfer-info failed on $model" >&2; return 1; }
  python3 -c '
import math, re, sys
text = sys.stdin.read()
layers = int(re.search(r"^layers\s+(\d+)", text, re.M).group(1))
expert_gib = float(re.search(r"experts ([0-9.]+) GiB", text).group(1))
print(min(layers, math.ceil(int(sys.argv[1]) / (expert_gib * 2**30 / layers))))' "$host" <<<"$info"
}
peer() {  # system binary config
  local sys=$1 bin=$2 cfg=$3 mmap=(-mmp 0)
  [ -x "$bin" ] || { echo "  $sys: no binary at $bin, skipped"; return; }
  # llama.cpp mainline loads without mmap into pinned memory with -lm none; ik_llama.cpp spells it -mmp 0.
  [ "$sys" = llama.cpp ] && mmap=(-lm none)
  local common=(-m "$model" -fa 1 -t "$threads" -r "$reps" -o json)
  case $cfg in
    gpu)        run "$sys" "$cfg" "$bin" "${common[@]}" -ngl 99 -p 512 -n 128 ;;
    hybrid)     run "$sys" "$cfg" "$bin" "${common[@]}" -ngl 99 -ot exps=CPU "${mmap[@]}" -p 512 -n 128 ;;
    hybrid4096) run "$sys" "$cfg" "$bin" "${common[@]}" -ngl 99 -ot exps=CPU "${mmap[@]}" -p 4096 -b 4096 -ub 4096 -n 0 ;;
    cpu)        run "$sys" "$cfg" env CUDA_VISIBLE_DEVICES= "$bin" "${common[@]}" -ngl 0 -p 512 -n 128 ;;
    two)        local ts spill=()
                ts=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print(f\"{r['dev0_n_layers']}/{r['dev1_n_layers']}\")" \
                     "$out/moeinfer_two.json") || { echo "  $sys two: no moeinfer placement to match"; return; }
                local ncmoe; ncmoe=$(spilled_layers) || return
                [ "$ncmoe" -gt 0 ] && spill=(--n-cpu-moe "$ncmoe")
                echo "  $sys two: -ts $ts ${spill[*]}"
                run "$sys" "$cfg" "$bin" "${common[@]}" -ngl 99 -ts "$ts" "${spill[@]}" -p 512 -n 128
                run "$sys" "${cfg}4096" "$bin" "${common[@]}" -ngl 99 -ts "$ts" "${spill[@]}" -p 4096 -b 4096 -ub 4096 -n 0
                # What the peer understood (a wrong -ts silently puts every layer on one GPU).
                python3 -c "import json,sys; print('  $sys two: tensor_split', sorted({r.get('tensor_split') for r in json.load(open(sys.argv[1]))}))" \
                  "$out/${sys}_$cfg.json" ;;
  esac
}
moeinfer() {  # config
  local cfg=$1 bench=(env LD_LIBRARY_PATH="$moe/lib:${LD_LIBRARY_PATH:-}" "$moe/bin/moeinfer-bench" -m "$model"
                      -t "$threads" -r "$reps" -o json)
  case $cfg in
    gpu)        run moeinfer "$cfg" "${bench[@]}" --device cuda -p 512 -n 128 ;;
    hybrid)     run moeinfer "$cfg" "${bench[@]}" --device cuda -ot exps=CPU -p 512 -n 128
                run moeinfer-nocache "$cfg" "${bench[@]}" --device cuda -ot exps=CPU --expert-cache off -p 512 -n 128 ;;
    hybrid4096) run moeinfer "$cfg" "${bench[@]}" --device cuda -ot exps=CPU -p 4096 -ub 4096 -n 0
                run moeinfer-nocache "$cfg" "${bench[@]}" --device cuda -ot exps=CPU --expert-cache off -p 4096 -ub 4096 -n 0 ;;
    cpu)        run moeinfer "$cfg" "${bench[@]}" --device cpu -p 512 -n 128 ;;
    two)        run moeinfer "$cfg" "${bench[@]}" --device cuda -dev CUDA0,CUDA1 --vram-budget "${BUDGETS:-20GiB,20GiB}" -p 512 -n 128
                run moeinfer "${cfg}4096" "${bench[@]}" --device cuda -dev CUDA0,CUDA1 --vram-budget "${BUDGETS:-20GiB,20GiB}" \
                  -p 4096 -ub 4096 -n 0
                python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print('  moeinfer two: layers per GPU', r['dev0_n_layers'], r['dev1_n_layers'], ', weights in host RAM', r['weights_host_bytes'], '(peers match only at 0)')" \
                  "$out/moeinfer_two.json" ;;
  esac
}

for cfg in $configs; do
  echo "config $cfg"
  [ "$cfg" = two ] && moeinfer "$cfg"  # its placement sets the peers' -ts
  peer llama.cpp "$llama" "$cfg"
  peer ik_llama.cpp "$ik" "$cfg"
  [ "$cfg" = two ] || moeinfer "$cfg"
done

python3 - "$out" $(for c in $configs; do echo "$c"; [ "$c" = two ] && echo two4096; done) <<'PY'
import glob, json, os, statistics, sys

out, configs = sys.argv[1], sys.argv[2:]

def medians(path):
    """test name -> median t/s, from llama-bench's or moeinfer-bench's JSON (both a list of records)."""
    try:
        records = json.load(open(path))
    except (OSError, ValueError):
        return {}
    result = {}
    for r in records:
        if "test" in r:                                   # moeinfer-bench
            name, samples = r["test"], r["samples_ts"]
        else:                                             # llama-bench
            n_p, n_g = r.get("n_prompt", 0), r.get("n_gen", 0)
            name = f"pp{n_p}" if n_p else f"tg{n_g}"
            samples = r["samples_ts"]
        result[name] = statistics.median(samples)
    return result

systems = ["llama.cpp", "ik_llama.cpp", "moeinfer", "moeinfer-nocache"]
for cfg in configs:
    figures = {s: medians(os.path.join(out, f"{s}_{cfg}.json")) for s in systems}
    tests = sorted({t for f in figures.values() for t in f})
    for test in tests:
        row = {s: figures[s].get(test) for s in systems}
        cells = "  ".join(f"{s} {row[s]:10.1f}" for s in systems if row[s] is not None)
        ratios = []
        for ours in ("moeinfer", "moeinfer-nocache"):
            for peer in ("llama.cpp", "ik_llama.cpp"):
                if row[ours] and row[peer]:
                    ratios.append(f"{ours}/{peer} {row[ours] / row[peer]:.2f}x")
        print(f"{cfg:11s} {test:7s} {cells}   {'  '.join(ratios)}")
PY
