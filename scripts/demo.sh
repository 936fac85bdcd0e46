#!/usr/bin/env bash
# The main demo: set up and build, write a synthetic MoE model, and print its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
model="$BUILD_DIR/demo-qwen3moe.gguf"
"$BUILD_DIR/tools/moeinfer-synth" --arch qwen3moe --layers 2 --experts q8_0 -o "$model"
"$BUILD_DIR/tools/moeinfer-info" "$model"
