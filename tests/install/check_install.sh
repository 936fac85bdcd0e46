#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a C program against it twice:
# through find_package(moeinfer) and through pkg-config. Usage: check_install.sh BUILD_DIR
set -euo pipefail
build=$1
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
cat > "$work/src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.24)
project(consumer C)
find_package(moeinfer 0.1 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE moeinfer::moeinfer)
CM
cmake -S "$work/src" -B "$work/b" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/b" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/b/consumer"
if command -v pkg-config >/dev/null; then
  flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs moeinfer)
  cc "$work/src/main.c" $flags -o "$work/pc_consumer"
  LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/pc_consumer"
fi
echo "install check: find_package and pkg-config both work"
