#!/usr/bin/env bash
# Hybrid (experts in pinned host RAM) benchmarks on the GPU machine, issue #5 targets, from prebuilt
# binaries:  scripts/device_hybrid_bench.sh BIN_DIR OUT_DIR [GROUP...]
# Groups: llama (the llama.cpp comparison), tg (hybrid TG with CUDA graphs on and off), active (FULL vs ACTIVE_ONLY on skewed GPT-OSS, ubatch
# 256..4096), active120 (the same on 12 layers of the GPT-OSS-120B shape, ubatch 1024 and 4096), pull (MOEINFER_CUDA_PULL_COPIES 1/0/unset), slots (G20 pp512, 6 vs 8 upload slots), offload (per-op offload policy: default / off / 32 over ubatch 256..4096), biasdup (bias duplication on/off, PP and TG), biasdup_ub (on/off over ubatch 256..4096), split (expert split off / auto /
# fixed counts at pp512, off / auto at Q30 pp2048), default: all. JSON per run in OUT_DIR, medians of 3.
set -uo pipefail
bin=$1; out=$2; shift 2
groups=${*:-llama tg active biasdup}
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
dir=/tmp/moe-synth
Q30="qwen3moe:preset=qwen3-30b-a3b:layers=16:experts=q8_0:dense=q8_0"
Q48="qwen3moe:preset=qwen3-30b-a3b:layers=48:experts=q4_0:dense=q8_0"
G20="gpt-oss:preset=gpt-oss-20b:layers=24:experts=mxfp4:dense=q8_0"
G20S="gpt-oss:preset=gpt-oss-20b:layers=24:experts=mxfp4:dense=q8_0:skew=0.9"
G120S="gpt-oss:preset=gpt-oss-120b:layers=12:experts=mxfp4:dense=q8_0:skew=0.9"

run() {  # tag, then moeinfer-bench arguments
  local tag=$1; shift
  echo "=== $tag: $*"
  "$bin/bin/moeinfer-bench" --synthetic-dir $dir --device cuda -r 3 -o json "$@" > "$out/$tag.json" 2> "$out/$tag.err" ||
    { echo "FAILED: $tag"; tail -5 "$out/$tag.err"; return; }
  python3 - "$out/$tag.json" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1])):
    print(f"  {r['test']:10s} ub {r.get('n_ubatch', '?'):>5}  median {statistics.median(r['samples_ts']):9.2f} t/s"
          f"  upload/ubatch {r.get('sched_bytes_uploaded_per_ubatch', 0) / 1e9:6.2f} GB"
          f"  upload {r.get('sched_upload_gbps', 0):6.1f} GB/s  wait {r.get('sched_seconds_wait', 0):.3f} s"
          f"  host {r.get('sched_seconds_host_compute', 0):.3f} s  submit {r.get('sched_seconds_device_submit', 0):.3f} s"
          f"  total {r.get('sched_seconds_total', 0):.3f} s"
          f"  split layers/ubatch {r.get('sched_n_split_layers', 0) / max(r.get('sched_n_ubatches', 1), 1):.1f}"
          f"  host experts/layer {r.get('sched_n_split_host_experts', 0) / max(r.get('sched_n_split_layers', 0), 1):.1f}")
PY
}

for g in $groups; do
  case $g in
    llama)
      run q30_pp512_tg  --synthetic "$Q30" -ot exps=CPU -p 512 -n 128
      run q30_pp2048    --synthetic "$Q30" -ot exps=CPU -p 2048 -n 0 -ub 2048
      run q30_pp4096    --synthetic "$Q30" -ot exps=CPU -p 4096 -n 0 -ub 4096
      rm -f $dir/*layers=16*
      run g20_pp512_tg  --synthetic "$G20" -ot exps=CPU -p 512 -n 128
      run g20_pp4096    --synthetic "$G20" -ot exps=CPU -p 4096 -n 0 -ub 4096
      run q48_tg        --synthetic "$Q48" -ot exps=CPU -p 0 -n 128
      rm -f $dir/*layers=48* ;;
    tg)
      for spec in "$Q30" "$Q48"; do
        tag=$(echo "$spec" | grep -q layers=48 && echo q48 || echo q30)
        run ${tag}_tg_graphs  --synthetic "$spec" -ot exps=CPU -p 0 -n 128
        MOEINFER_CUDA_GRAPHS=0 run ${tag}_tg_eager --synthetic "$spec" -ot exps=CPU -p 0 -n 128
        rm -f $dir/*layers=16* $dir/*layers=48*
      done ;;
    active)
      for ub in 256 512 1024 2048 4096; do
        for copy in full active prefetch; do
          run g20s_${copy}_ub$ub --synthetic "$G20S" -ot exps=CPU -p 4096 -n 0 -ub $ub --expert-copy $copy -r 2 --expert-split off
        done
      done ;;
    active120)
      # GPT-OSS-120B's expert shape (128 experts, 4 used) over 12 of its 36 layers (20 GB of experts).
      for ub in 1024 4096; do
        for copy in full active prefetch; do
          run g120s_${copy}_ub$ub --synthetic "$G120S" -ot exps=CPU -p 4096 -n 0 -ub $ub --expert-copy $copy -r 2 --expert-split off
        done
      done
      rm -f $dir/*gpt-oss-120b* ;;
    pull)
      # Activation H2D copies as kernels (1: always, unset: while uploads are in flight) or DMA (0),
      # alternating: TG and the split's pp512.
      for k in 1 2; do
        for pull in 1 0 default; do
          MOEINFER_CUDA_PULL_COPIES=$pull run q30_tg_pull${pull}_$k --synthetic "$Q30" -ot exps=CPU -p 0 -n 128
        done
      done
      for pull in 1 0 default; do
        MOEINFER_CUDA_PULL_COPIES=$pull run q30_pp512_auto_pull$pull --synthetic "$Q30" -ot exps=CPU -p 512 -n 0 -r 5
      done ;;
    offload)
      # Per-op offload policy (seed PR 405): expert ops offloaded at the default thresholds (32 *
      # n_expert / n_expert_used tokens), never (computed on the CPU), or from 32 tokens (mainline
      # llama.cpp's rule), over ubatch 256..4096; pp4096, split off to isolate the policy.
      for spec in "$Q30" "$G20"; do
        tag=$(echo "$spec" | grep -q gpt-oss && echo g20 || echo q30)
        for ub in 256 512 1024 2048 4096; do
          run ${tag}_offload_default_ub$ub --synthetic "$spec" -ot exps=CPU -p 4096 -n 0 -ub $ub -r 2 --expert-split off
          run ${tag}_offload_off_ub$ub --synthetic "$spec" -ot exps=CPU -p 4096 -n 0 -ub $ub -r 2 --expert-split off \
            --offload-policy mul_mat_id=off,moe_up_gate=off
          run ${tag}_offload_32_ub$ub --synthetic "$spec" -ot exps=CPU -p 4096 -n 0 -ub $ub -r 2 --expert-split off \
            --offload-policy mul_mat_id=32,moe_up_gate=32
        done
      done ;;
    slots)
      # G20 pp512 with the split off / auto, and auto with the 6 slots of off (-> no look-ahead).
      run g20_pp512_off --synthetic "$G20" -ot exps=CPU -p 512 -n 0 --expert-split off
      run g20_pp512_auto --synthetic "$G20" -ot exps=CPU -p 512 -n 0
      run g20_pp512_auto_6slots --synthetic "$G20" -ot exps=CPU -p 512 -n 0 --offload-budget 846028800 ;;
    biasdup_ub)
      for ub in 256 512 1024 2048 4096; do
        run g20_dup_ub$ub   --synthetic "$G20" -ot exps=CPU -p 4096 -n 0 -ub $ub -r 2 --expert-split off
        run g20_nodup_ub$ub --synthetic "$G20" -ot exps=CPU -p 4096 -n 0 -ub $ub -r 2 --no-bias-dup --expert-split off
      done ;;
    split)
      for s in off auto 20 26 32; do
        run q30_pp512_split_$s --synthetic "$Q30" -ot exps=CPU -p 512 -n 0 --expert-split $s -r 5
      done
      for s in off auto; do
        run q30_pp2048_split_$s --synthetic "$Q30" -ot exps=CPU -p 2048 -n 0 -ub 2048 --expert-split $s
      done
      for s in off auto; do
        run g20_pp512_split_$s --synthetic "$G20" -ot exps=CPU -p 512 -n 0 --expert-split $s
      done ;;
    biasdup)
      for ot in 'exps=CPU' 'ffn_(up|gate|down)_exps\.weight=CPU'; do
        tag=$( [ "$ot" = exps=CPU ] && echo exps || echo weights )
        run g20_dup_$tag   --synthetic "$G20" -ot "$ot" -p 4096 -n 128 -ub 4096 --expert-split off
        run g20_nodup_$tag --synthetic "$G20" -ot "$ot" -p 4096 -n 128 -ub 4096 --no-bias-dup --expert-split off
      done ;;
  esac
done
