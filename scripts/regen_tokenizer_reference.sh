#!/usr/bin/env bash
# Regenerates the expected-ids files of tests/python/test_tokenizer_llama_cpp.py from llama.cpp's own
# tokenizer: builds libllama (CPU only: no CUDA, no curl, no examples, tests, tools or server) and
# scripts/reference/llama_tokenize_ref.cpp against it, then tokenizes the committed test set
# (tests/python/reference/tokenizer/strings.json) with every vocabulary of VOCAB_DIR.
#
# Usage: scripts/regen_tokenizer_reference.sh LLAMA_SRC VOCAB_DIR [OUT_DIR]
#   LLAMA_SRC: a llama.cpp source tree or a .tar.xz / .tar.gz of one (the files of record came from
#              commit 0c1e570, the one llama-cpp-python 0.3.36 vendors: shared/peers/llama.cpp-0c1e570-src.tar.xz)
#   VOCAB_DIR: tensor-less vocabularies from scripts/fetch_vocabs.py
#   OUT_DIR:   default tests/python/reference/tokenizer
# Environment: LLAMA_COMMIT (recorded in each file; default: the 7 hex digits in LLAMA_SRC's name),
#   BUILD_DIR (default build-tokref), JOBS (default nproc), REF_CMAKE_ARGS (more cmake arguments, e.g.
#   -DCMAKE_EXE_LINKER_FLAGS=-static for a program that runs on an older glibc), RAW_DIR (keep the
#   program's own output there too).
# The libllama build takes ~30 s on 16 cores, ~25 min on 2.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
src=$1
vocab_dir=$2
out_dir=${3:-tests/python/reference/tokenizer}
build=${BUILD_DIR:-build-tokref}
commit=${LLAMA_COMMIT:-$(basename "$src" | grep -oE '[0-9a-f]{7,40}' | head -1 || true)}
[ -n "$commit" ] || { echo "set LLAMA_COMMIT: no commit in the name '$src'" >&2; exit 2; }
ref=$(scripts/reference/build_ref.sh "$src" "$build" llama_tokenize_ref)
python3 scripts/reference/tokenizer_expected.py --ref "$ref" --vocab-dir "$vocab_dir" \
  --strings tests/python/reference/tokenizer/strings.json --out "$out_dir" --llama-commit "$commit" ${RAW_DIR:+--raw "$RAW_DIR"}
