#!/usr/bin/env bash
# The main demo: set up and build, then a short sweep benchmark (llama-sweep-bench's table) on a
# small synthetic MoE model with the Qwen3-30B-A3B layer shape. CPU-only until the CUDA backend lands.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
model="$BUILD_DIR/demo-qwen3moe.gguf"
if [ ! -f "$model" ]; then
  "$BUILD_DIR/tools/moeinfer-synth" --arch qwen3moe --layers 2 --experts q8_0 --vocab 32000 -o "$model"
fi
"$BUILD_DIR/tools/moeinfer-info" "$model"
"$BUILD_DIR/tools/moeinfer-bench" "$model" -c 1024 -ub 256 --sweep-tg 16
