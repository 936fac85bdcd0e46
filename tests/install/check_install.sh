#!/usr/bin/env bash
# Installs the build into a temporary prefix, then checks what a user of the package relies on:
#  - a C program builds and runs against it through find_package(moeinfer) and through pkg-config;
#  - a consumer of the shared library configures with the CUDA toolkit hidden (only the static library
#    needs the toolkit's CMake targets);
#  - the installed tools run without LD_LIBRARY_PATH (their RUNPATH finds the library);
#  - the C snippet of README.md compiles as written and runs on a model the installed moeinfer-synth wrote.
# Usage: check_install.sh BUILD_DIR
set -euo pipefail
build=$1
readme="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/README.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir -p "$work/src"
cat > "$work/src/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <moeinfer/moeinfer.h>
int main(void) {
    if (strcmp(moe_version(), MOEINFER_VERSION_STRING) != 0) return 1;
    printf("linked moeinfer %s\n", moe_version());
    return 0;
}
C
# The first ```c block of the README, byte for byte.
awk '/^```c$/ {inside = 1; next} inside && /^```$/ {exit} inside {print}' "$readme" > "$work/src/readme.c"
if ! grep -q 'int main' "$work/src/readme.c"; then
  echo "install check: no C program found in the first \`\`\`c block of $readme" >&2
  exit 1
fi
cat > "$work/src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.24)
project(consumer C)
find_package(moeinfer 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE moeinfer::moeinfer)
add_executable(readme readme.c)
set_target_properties(readme PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
target_compile_options(readme PRIVATE -Wall -Wextra -Werror)
target_link_libraries(readme PRIVATE moeinfer::moeinfer)
CM
# CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit: as on a machine without the toolkit.
cmake -S "$work/src" -B "$work/b" -DCMAKE_PREFIX_PATH="$work/prefix" --no-warn-unused-cli \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON >/dev/null
cmake --build "$work/b" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/b/consumer"
if command -v pkg-config >/dev/null; then
  flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs moeinfer)
  cc "$work/src/main.c" $flags -o "$work/pc_consumer"
  LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/pc_consumer"
fi

tools="$work/prefix/bin"
if [[ -x "$tools/moeinfer-synth" ]]; then
  layers=$((RANDOM % 4 + 1))
  experts=$((RANDOM % 8 + 4))
  env -u LD_LIBRARY_PATH "$tools/moeinfer-synth" -q --arch gpt-oss --preset tiny --layers "$layers" \
    --n-expert "$experts" -o "$work/tiny.gguf"
  env -u LD_LIBRARY_PATH "$tools/moeinfer-info" "$work/tiny.gguf" | grep -q 'gpt-oss'
  got=$(env -u LD_LIBRARY_PATH "$work/b/readme" "$work/tiny.gguf")
  echo "README snippet: $got"
  if [[ $got != "gpt-oss: $layers layers, $experts experts" ]]; then
    echo "install check: the README snippet printed '$got' for a model of $layers layers, $experts experts" >&2
    exit 1
  fi
  if [[ $(env -u LD_LIBRARY_PATH "$work/b/readme" "$work/missing.gguf" 2>&1 >/dev/null) != *missing.gguf* ]]; then
    echo "install check: the README snippet does not report a missing file" >&2
    exit 1
  fi
  echo "installed tools run without LD_LIBRARY_PATH"
else
  echo "install check: tools not built (MOEINFER_BUILD_TOOLS=OFF): RUNPATH and README model run not checked"
  env -u LD_LIBRARY_PATH "$work/b/readme" "$work/missing.gguf" 2>/dev/null && exit 1
fi
echo "install check: find_package (CUDA toolkit hidden) and pkg-config work, the README snippet builds"
