#!/bin/sh
# Runs attention.metal on the CPU, as C++ (metal_stdlib here stands in for
# Metal's), against ctxs_attention() on real sessions, for several
# threadgroup sizes and SIMD widths. Not a Metal test: it checks the
# kernel's logic (runs, blocks, barriers, reductions, indexing) where no
# Apple GPU is at hand; tests/test_metal.m checks the real thing.
#
# Usage: src/gpu/metal/emulate/run.sh BUILD_DIR   (a meson build of ctxstore)
# Needs a C++20 compiler (<barrier>) and the library's dependencies.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
ninja -C "$build" src/libctxstore.a >/dev/null
sed -E 's/\[\[[a-z_]+(\([0-9]+\))?\]\]//g' "$here/../attention.metal" \
    > "$tmp/attention_stripped.cpp"
${CXX:-c++} -std=c++20 -O1 -Wall -Wextra -Wno-unused-parameter \
    -I"$here" -I"$tmp" -I"$here/../../../../include" \
    "$here/emulate.cpp" "$build/src/libctxstore.a" \
    -llmdb -lxxhash -lz -lpthread -o "$tmp/emulate"
"$tmp/emulate" "$tmp"
