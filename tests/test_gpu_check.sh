#!/usr/bin/env bash
# scripts/gpu-check.sh prepare, as on a machine without a GPU: the folder it
# gathers holds test_cuda and bench_cuda and every library they load, none
# of them taken from the build tree, under 64 MiB; test_cuda runs from it
# (exit 77 here, every device test skipped; 0 where there is a device) and
# bench_cuda says what it found.
#
# tests/meson.build sets MESON_BUILD_ROOT and MESON_SOURCE_ROOT.
# Exit 0 pass, 1 fail.
set -euo pipefail

fail() { echo "test_gpu_check: FAIL: $*" >&2; exit 1; }

out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$out"' EXIT
"$MESON_SOURCE_ROOT/scripts/gpu-check.sh" prepare --build "$MESON_BUILD_ROOT" --out "$out/folder" ||
    fail "prepare failed"
folder=$out/folder
for f in bin/test_cuda bin/bench_cuda lib/libctxstore.so.0 lib/libctxstore_cuda.so.0 gpu-check.sh; do
    [ -e "$folder/$f" ] || fail "the folder lacks $f"
done
size=$(du -sm "$folder" | cut -f1)
((size < 64)) || fail "the folder is $size MiB"

# The programs carry a run path into the build tree: every library must
# resolve in the folder or the system, none there.
for prog in "$folder"/bin/*; do
    LD_LIBRARY_PATH="$folder/lib" ldd "$prog" >"$out/ldd.txt"
    ! grep -q 'not found' "$out/ldd.txt" || fail "$(basename "$prog"): $(grep 'not found' "$out/ldd.txt")"
    grep -F "$MESON_BUILD_ROOT/" "$out/ldd.txt" | grep -vF "$folder/" >"$out/from-build.txt" || true
    [ ! -s "$out/from-build.txt" ] || fail "$(basename "$prog") loads from the build tree: $(cat "$out/from-build.txt")"
done

status=0
(cd "$out" && TMPDIR="$out" LD_LIBRARY_PATH="$folder/lib" "$folder/bin/test_cuda" --jobs 1 \
    >"$out/test.log" 2>&1) || status=$?
cat "$out/test.log"
case $status in
0) echo "test_gpu_check: test_cuda passed from the folder (a device is here)" ;;
77) grep -q 'SKIPPED .* no CUDA device' "$out/test.log" || fail "exit 77 without saying why"
    echo "test_gpu_check: test_cuda ran from the folder and skipped its device tests (no device)" ;;
*) fail "test_cuda from the folder exited $status" ;;
esac
LD_LIBRARY_PATH="$folder/lib" "$folder/bin/bench_cuda" --tokens 16 --dtype q8 --dir "$out" >"$out/bench.txt" 2>&1 ||
    fail "bench_cuda from the folder: $(cat "$out/bench.txt")"
grep -q 'no CUDA device\|NVIDIA' "$out/bench.txt" || fail "bench_cuda said: $(cat "$out/bench.txt")"
