#!/usr/bin/env bash
# Regenerates the expected-logits files of tests/python/test_forward_llama_cpp.py from llama.cpp's own CPU
# forward pass: builds libllama (CPU only: no CUDA, no curl, no examples, tests, tools or server) and
# scripts/reference/llama_logits_ref.cpp against it, writes small synthetic models with moeinfer-synth (fixed
# seeds, tiny shapes, F32 / F16 / Q8_0 weights; scripts/reference/forward_expected.py lists the cases) and
# stores llama.cpp's logits with the files' SHA-256 in tests/python/reference/forward/<arch>.json.
#
# Usage: scripts/regen_forward_reference.sh LLAMA_SRC [ARCH ...]
#   LLAMA_SRC: a llama.cpp source tree or a .tar.xz / .tar.gz of one (the files of record came from
#              commit 0c1e570, the one llama-cpp-python 0.3.36 vendors: shared/peers/llama.cpp-0c1e570-src.tar.xz)
#   ARCH:      the architectures to write (default: all that scripts/reference/forward_expected.py lists)
# Environment: LLAMA_COMMIT (recorded in each file; default: the 7 hex digits in LLAMA_SRC's name),
#   BUILD_DIR (default build-fwdref; a build of scripts/reference made for the tokenizer serves too),
#   MOEINFER_BUILD (a moeinfer build holding tools/moeinfer-synth, default build), JOBS (default nproc),
#   REF_CMAKE_ARGS (more cmake arguments), OUT_DIR (default tests/python/reference/forward).
# The libllama build takes ~30 s on 16 cores, ~25 min on 2; the cases then take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
src=$1
shift
out_dir=${OUT_DIR:-tests/python/reference/forward}
build=${BUILD_DIR:-build-fwdref}
synth=${MOEINFER_BUILD:-build}/tools/moeinfer-synth
[ -x "$synth" ] || { echo "no $synth: build moeinfer's moeinfer-synth target or set MOEINFER_BUILD" >&2; exit 2; }
commit=${LLAMA_COMMIT:-$(basename "$src" | grep -oE '[0-9a-f]{7,40}' | head -1 || true)}
[ -n "$commit" ] || { echo "set LLAMA_COMMIT: no commit in the name '$src'" >&2; exit 2; }
ref=$(scripts/reference/build_ref.sh "$src" "$build" llama_logits_ref)
python3 scripts/reference/forward_expected.py --ref "$ref" --synth "$synth" --out "$out_dir" --llama-commit "$commit" "$@"
