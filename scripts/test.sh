#!/usr/bin/env bash
# Sets up, builds and runs every test: C++ units (Catch2), the C99 API tests and pytest, all via ctest.
# GPU tests print "skipped: no CUDA device" where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
# Says up front whether the GPU tests can run here ("skipped: no CUDA device" otherwise).
if [ -x tests/moeinfer_gpu_available ]; then tests/moeinfer_gpu_available || true; else echo "skipped: no CUDA device (built without CUDA)"; fi
ctest --output-on-failure -j"$(nproc)"
