#!/usr/bin/env bash
# Issue 24's consumer setup in one device call on a 2-GPU machine (nvidia-h100-x2): builds the peers in the
# background (resumable: a call that stops keeps /tmp only while the machine stays warm), writes the model,
# waits for the builds, then runs scripts/device_peer_bench.sh's `two` config (moeinfer under per-GPU budgets,
# the peers with -ts matched to its layers per GPU).
#   scripts/device_two_gpu_peers.sh MOEINFER_DIR PEERS_DIR [MODEL_SPEC] [BUDGETS]
# MOEINFER_DIR: a build packed by scripts/make_devcarry.sh (bench binary and library); PEERS_DIR: an ignored
# folder holding ../shared/peers (build-peers.sh and the source archives). MODEL_SPEC (default the
# Qwen3-30B-A3B shape, 48 layers, Q8_0) is a moeinfer-bench --synthetic spec; BUDGETS default 20GiB,20GiB.
# ik_llama.cpp takes ~11.5 min to build on 16 cores (more than 6 on 32): give the call its whole 600 s, or build
# in an earlier call on the same warm machine (PEERS_ONLY=1 builds and exits).
set -uo pipefail
moe=$1; peers=$2; spec=${3:-qwen3moe:preset=qwen3-30b-a3b:layers=48:experts=q8_0:dense=q8_0}
export BUDGETS=${4:-20GiB,20GiB}
here=$(cd "$(dirname "$0")" && pwd)
for p in llama ik; do
  grep -q "rc=0" "/tmp/peerbuild_$p.out" 2>/dev/null && continue
  (PEERS=$peers BUILD_S=${BUILD_S:-560} J=$(nproc) setsid nohup bash "$peers/build-peers.sh" "$p" \
     > "/tmp/peerbuild_$p.out" 2>&1 < /dev/null &)
done
[ "${PEERS_ONLY:-0}" = 1 ] && { sleep "${PEERS_WAIT:-0}"; cat /tmp/peerbuild_*.out 2>/dev/null; exit 0; }
LD_LIBRARY_PATH="$moe/lib:${LD_LIBRARY_PATH:-}" "$moe/bin/moeinfer-bench" --synthetic "$spec" \
  --synthetic-dir /tmp/moe-synth --device cpu -p 0 -n 1 -r 1 --no-warmup -o json > /tmp/synth.json 2> /tmp/synth.err ||
  { echo "writing $spec failed: $(tail -2 /tmp/synth.err)"; exit 1; }
model=$(python3 -c "import json; print(json.load(open('/tmp/synth.json'))[0]['model_path'])")
for p in llama ik; do
  for i in $(seq 1 120); do grep -q "rc=" "/tmp/peerbuild_$p.out" 2>/dev/null && break; sleep 5; done
  cat "/tmp/peerbuild_$p.out"
done
REPS=${REPS:-3} "$here/device_peer_bench.sh" "$moe" "$model" /tmp/pb two
