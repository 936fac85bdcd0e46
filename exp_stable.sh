#!/usr/bin/env bash
# EXPERIMENT: tg128 with and without MOEINFER_DBG_STABLE_ATT (stable attention nodes, wrong values)
source build-devcarry/setup.sh
B=build-devcarry/bin/moeinfer-bench
SPEC=${SPEC:-qwen3moe:preset=qwen3-30b-a3b:layers=48:recipe=q4_k_m}
$B --synthetic $SPEC --synthetic-dir /tmp/moe-synth --device cpu -p 0 -n 1 -r 1 --no-warmup -o json > $OUT/synth.log 2>&1
nvidia-smi --query-gpu=name --format=csv >> $OUT/log.txt
for r in 1 2; do
  sides="off on"; [ $r = 2 ] && sides="on off"
  for side in $sides; do
    for cfg in gpu hyb; do
      extra=(); [ $cfg = hyb ] && extra=(-ot exps=CPU --expert-cache off -t 16)
      if [ $side = on ]; then export MOEINFER_DBG_STABLE_ATT=1; else unset MOEINFER_DBG_STABLE_ATT; fi
      timeout 200 $B --synthetic $SPEC --synthetic-dir /tmp/moe-synth --device cuda "${extra[@]}" -p 0 -n 128 -r 3 -o json > $OUT/${cfg}_${side}_$r.json 2>$OUT/${cfg}_${side}_$r.err
      python3 -c "
import json,statistics,sys
for x in json.load(open('$OUT/${cfg}_${side}_$r.json')): print('$cfg $side $r', x['test'], round(statistics.median(x['samples_ts']),2), [round(s,1) for s in x['samples_ts']])" | tee -a $OUT/log.txt
    done
  done
done
