#!/usr/bin/env bash
# Builds one program of scripts/reference (llama_tokenize_ref, llama_logits_ref) against libllama from a
# llama.cpp source tree or a .tar.xz / .tar.gz of one, CPU only (no CUDA, no curl, no examples, tests, tools or
# server), and prints the program's path on stdout. The build goes to BUILD_DIR/ref (a tarball is unpacked in
# BUILD_DIR/src), so the second program reuses the first one's libllama.
#
# Usage: scripts/reference/build_ref.sh LLAMA_SRC BUILD_DIR TARGET
# Environment: JOBS (default nproc), REF_CMAKE_ARGS (more cmake arguments, e.g. -DCMAKE_EXE_LINKER_FLAGS=-static
#   for a program that runs on an older glibc).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 3 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
src=$1
build=$2
target=$3
mkdir -p "$build"
if [ -f "$src" ]; then
  rm -rf "$build/src" && mkdir -p "$build/src"
  tar xf "$src" -C "$build/src"
  src=$(dirname "$(find "$build/src" -maxdepth 3 -path '*/include/llama.h' | head -1)")/..
fi
src=$(cd "$src" && pwd)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$here" -B "$build/ref" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_SRC="$src" ${REF_CMAKE_ARGS:-} >/dev/null
cmake --build "$build/ref" --target "$target" -j"${JOBS:-$(nproc)}" >&2
echo "$build/ref/$target"
