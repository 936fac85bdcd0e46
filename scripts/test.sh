#!/usr/bin/env bash
# Sets up, builds and runs every test: C++ units (Catch2), the C99 API tests and pytest, all via ctest.
# GPU tests print "skipped: no CUDA device" where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j"$(nproc)"
