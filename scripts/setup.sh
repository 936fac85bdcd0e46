#!/usr/bin/env bash
# Installs what is missing on a fresh Debian machine (apt + pip), then configures and builds moeinfer.
# Usage: scripts/setup.sh [extra cmake args...]   (env BUILD_DIR, default ./build)
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo_cmd="sudo"; fi

apt_pkgs=(cmake ninja-build g++ pkg-config libtbb-dev catch2 python3 python3-pip clang libclang-rt-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import numpy, pytest, pybind11, gguf, tokenizers, sentencepiece, jinja2, matplotlib" >/dev/null 2>&1; then
  echo "setup: installing Python packages: numpy pytest pybind11 gguf tokenizers sentencepiece jinja2 matplotlib"
  # Debian's own python3 refuses pip installs into the system (PEP 668) unless told otherwise.
  "$PYTHON" -m pip install -q numpy pytest pybind11 gguf tokenizers sentencepiece jinja2 matplotlib 2>/dev/null ||
    "$PYTHON" -m pip install -q --break-system-packages numpy pytest pybind11 gguf tokenizers sentencepiece jinja2 matplotlib
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v "$PYTHON")" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
