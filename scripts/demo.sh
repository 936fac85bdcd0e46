#!/usr/bin/env bash
# The main demo: set up and build, then a short sweep benchmark (llama-sweep-bench's table) on a
# small synthetic MoE model with the Qwen3-30B-A3B layer shape, then text generation with moeinfer-run
# (plain and as a chat; the model's weights are random, so the text is noise). On the GPU when the build has CUDA and
# a GPU is present (all-GPU until the hybrid scheduler lands), on the CPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
model="$BUILD_DIR/demo-qwen3moe.gguf"
if [ ! -f "$model" ]; then
  "$BUILD_DIR/tools/moeinfer-synth" --arch qwen3moe --layers 2 --experts q8_0 --vocab 32000 -o "$model"
fi
"$BUILD_DIR/tools/moeinfer-info" "$model"
device=cpu
if [ -x "$BUILD_DIR/tests/moeinfer_gpu_available" ] && "$BUILD_DIR/tests/moeinfer_gpu_available" >/dev/null; then
  device=cuda
fi
"$BUILD_DIR/tools/moeinfer-bench" "$model" -c 1024 -ub 256 --sweep-tg 16 --device "$device"
echo
echo "== text generation (moeinfer-run; the synthetic model's weights are random, so the text is noise) =="
"$BUILD_DIR/tools/moeinfer-run" -m "$model" -p "Once upon a time" -n 32 --device "$device"
"$BUILD_DIR/tools/moeinfer-run" -m "$model" --chat-template chatml -p "Hello! Who are you?" -n 24 --device "$device"
