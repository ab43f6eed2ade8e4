#!/usr/bin/env bash
# The CUDA check, in two steps for a GPU machine that lacks our build and
# our C dependencies:
#
#   scripts/gpu-check.sh prepare [--build DIR] [--out DIR]
#       here: builds tests/test_cuda and bench/bench_cuda in the meson build
#       DIR (default build, configured by scripts/bootstrap.sh; CUDA must be
#       in it), then gathers into the folder --out (default gpu-check/,
#       git-ignored) the two programs, every shared library they load (as
#       ldd finds them) and this script.
#   scripts/gpu-check.sh run [DIR]
#       on the GPU machine, from that folder (default gpu-check/): nvidia-smi
#       once, test_cuda, then bench_cuda --json at 2048 and 8192 tokens for
#       each session dtype, each program under its own time limit; logs and
#       JSON go to $OUT (default DIR/out): host.txt, nvidia-smi.txt, ldd.log,
#       test_cuda.log, bench_cuda.log and bench_cuda.json (every row of
#       every run). Exits 1 if any step failed.
#
# The GPU machine's C library and loader run the programs (glibc keeps old
# symbol versions: they need what `prepare` prints), and its C++ runtime
# unless that lacks a version the programs need, where the folder's own
# libstdc++ and libgcc_s are used. Where the
# GPU's driver is older than the CUDA runtime the programs were built with
# (they link it statically), `run` rebuilds the CUDA part with that
# machine's nvcc from the source tree it runs in, with the folder's
# libraries, objects and Criterion headers, before it tests.
set -euo pipefail

script_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$script_dir/.." && pwd)

die() { echo "gpu-check: $*" >&2; exit 1; }

# Where a library goes in the folder: nowhere for the C runtime, which must
# match the loader of the machine that runs the programs; cxx/ for the C++
# runtime, used only where that machine's is too old; lib/ for the rest.
folder_of() {
    case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*) echo "" ;;
    libstdc++.so*|libgcc_s.so*) echo cxx ;;
    *) echo lib ;;
    esac
}

prepare() {
    local build=build out=gpu-check
    while (($#)); do
        case "$1" in
        --build) build=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) die "prepare: unknown argument '$1'" ;;
        esac
    done
    cd "$repo"
    [ -f "$build/build.ninja" ] || ./scripts/bootstrap.sh
    [ -f "$build/build.ninja" ] || die "no meson build in '$build'"
    grep -q '^build tests/test_cuda:' "$build/build.ninja" ||
        die "the build in '$build' has no CUDA part (is nvcc on PATH? meson configure -Dcuda=enabled says why)"
    ninja -C "$build" tests/test_cuda bench/bench_cuda >/dev/null

    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib" "$out/cxx"
    cp "$build/tests/test_cuda" "$build/bench/bench_cuda" "$out/bin/"
    cp "$script_dir/gpu-check.sh" "$out/"
    local prog lib
    # ldd of the programs where they were built: their run paths name the
    # build's own libraries.
    for prog in "$build/tests/test_cuda" "$build/bench/bench_cuda"; do
        # "name => /path (0x...)" and the loader's own "/path (0x...)"
        ldd "$prog" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do
            local to
            to=$(folder_of "$lib")
            [ -z "$to" ] || cp -L "$lib" "$out/$to/"
        done
    done
    # What a rebuild on the GPU machine needs besides the source tree.
    mkdir -p "$out/obj" "$out/include"
    cp "$build"/tests/libctxs_test_support.a.p/*.o "$build/bench/bench_cuda.p/bench_util.c.o" \
       "$build/bench/bench_cuda.p/bench_shared.c.o" "$out/obj/"
    cp -r /usr/include/criterion "$out/include/"
    nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' >"$out/cuda-built"
    # The newest glibc symbol version the programs and their libraries need.
    objdump -T "$out"/bin/* "$out"/lib/* 2>/dev/null |
        grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 >"$out/glibc-needed"
    local size
    size=$(du -sm "$out" | cut -f1)
    echo "gpu-check: $out: $(ls "$out/bin" | tr '\n' ' ')+ $(ls "$out/lib" "$out/cxx" | grep -c so) libraries, ${size} MiB, glibc $(cat "$out/glibc-needed") or newer"
    ((size < 64)) || die "$out is ${size} MiB, more than a 64 MiB transfer allows"
}

# Runs "$@" (a program of the folder) with the folder's libraries, under a
# time limit, its output into $log; returns its exit status.
launch() {
    local limit=$1 log=$2
    shift 2
    local status=0
    LD_LIBRARY_PATH="$libpath" timeout "$limit" "$@" >"$log" 2>&1 || status=$?
    return $status
}

# The library path with which every library of both programs loads here
# (into $libpath); dies naming what is missing if there is none.
find_library_path() {
    local log=$1 prog
    for libpath in "$dir/lib" "$dir/lib:$dir/cxx"; do
        : >"$log"
        for prog in "$dir"/bin/*; do
            LD_LIBRARY_PATH="$libpath" ldd "$prog" >>"$log" 2>&1 || echo "ldd $prog failed" >>"$log"
        done
        grep -q 'not found\|failed' "$log" || return 0
    done
    die "the programs do not load here: $(grep 'not found\|failed' "$log" | head -1 | tr -s ' \t' ' ')"
}

# The CUDA version that the GPU's driver supports, as nvidia-smi states it
# ("CUDA Version: 12.4"); empty if it does not say.
driver_cuda_version() {
    { nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' | head -1
}

# Rebuilds libctxstore_cuda, test_cuda and bench_cuda into $dir/bin and
# $dir/lib with this machine's nvcc, from the source tree this script is in.
rebuild_here() {
    local nvcc_bin root cudart
    nvcc_bin=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) ||
        die "the driver needs a rebuild and there is no nvcc here"
    root=$(cd "$(dirname "$nvcc_bin")/.." && pwd)
    cudart=$(ls "$root"/lib64/libcudart_static.a "$root"/targets/*/lib/libcudart_static.a 2>/dev/null | head -1)
    [ "$cudart" ] || die "no libcudart_static.a under $root"
    echo "gpu-check: rebuilding the CUDA part with $("$nvcc_bin" --version | tail -1)"
    local tmp=$dir/rebuild src=$repo/src/gpu/cuda
    rm -rf "$tmp"
    mkdir -p "$tmp"
    local cflags=(-std=c11 -O3 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -DNDEBUG -pthread
                  -I"$repo/include" -I"$src" -isystem "$root/include")
    local arch=(-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90)
    "$nvcc_bin" -O3 -std=c++17 -DNDEBUG -DCTXS_BUILDING_LIBRARY "${arch[@]}" \
        -Xcompiler=-fPIC,-fvisibility=hidden -I"$repo/include" -I"$src" \
        -c "$src/kernels.cu" -o "$tmp/kernels.o"
    cc "${cflags[@]}" -fPIC -fvisibility=hidden -DCTXS_BUILDING_LIBRARY -c "$src/kv.c" -o "$tmp/kv.o"
    cc "${cflags[@]}" -fPIC -fvisibility=hidden -DCTXS_BUILDING_LIBRARY -c "$src/attention.c" -o "$tmp/attention.o"
    c++ -shared -o "$dir/lib/libctxstore_cuda.so.0" -Wl,-soname=libctxstore_cuda.so.0 \
        -Wl,--exclude-libs,ALL "$tmp/kernels.o" "$tmp/kv.o" "$tmp/attention.o" \
        "$dir/lib/libctxstore.so.0" "$cudart" -ldl -lrt -lpthread
    cc "${cflags[@]}" -I"$dir/include" -I"$repo/tests" -DBXF_STATIC_LIB=1 \
        -c "$repo/tests/test_cuda.c" -o "$tmp/test_cuda.o"
    cc "${cflags[@]}" -I"$repo/bench" -c "$repo/bench/bench_cuda.c" -o "$tmp/bench_cuda.o"
    local libs=("$dir/lib/libctxstore_cuda.so.0" "$dir/lib/libctxstore.so.0" "$cudart" -ldl -lrt -lpthread -lm)
    cc -pthread -o "$dir/bin/test_cuda" "$tmp/test_cuda.o" "$dir/obj/support.c.o" "$dir/obj/redis_server.c.o" \
        "$dir/lib/libcriterion.so.3" "$dir/lib/liblmdb.so.0" "$dir/lib/libhiredis.so.0.14" "${libs[@]}" \
        -Wl,--allow-shlib-undefined
    cc -pthread -o "$dir/bin/bench_cuda" "$tmp/bench_cuda.o" "$dir/obj/bench_util.c.o" \
        "$dir/obj/bench_shared.c.o" "${libs[@]}"
}

run() {
    dir=$(cd "${1:-$repo/gpu-check}" && pwd)
    [ -x "$dir/bin/test_cuda" ] || die "$dir: no prepared folder (run 'gpu-check.sh prepare' first)"
    local out=${OUT:-$dir/out}
    mkdir -p "$out"
    rm -f "$out/bench_cuda.json" "$out/bench_cuda.log"
    local failed=0 started=$SECONDS step status
    # Scratch for the test's stores and the benchmark's sessions (1.2 GiB
    # at 8192 tokens), kept out of $OUT, whose files travel back.
    scratch=$(mktemp -d "${TMPDIR:-/var/tmp}/gpu-check.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT

    echo "host: $(uname -srm); $(ldd --version 2>&1 | head -1); programs need $(cat "$dir/glibc-needed")" |
        tee "$out/host.txt"

    echo "== nvidia-smi"
    nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt" || failed=1
    local driver built
    driver=$(driver_cuda_version)
    built=$(cat "$dir/cuda-built")
    if [ "${GPU_CHECK_REBUILD:-}" = 1 ] ||
        { [ "$driver" ] && [ "$(printf '%s\n' "$driver" "$built" | sort -V | head -1)" != "$built" ]; }; then
        echo "gpu-check: the driver supports CUDA ${driver:-?}, the programs were built with $built"
        rebuild_here 2>&1 | tee "$out/rebuild.log"
        [ "${PIPESTATUS[0]}" = 0 ] || die "the rebuild failed (rebuild.log)"
    fi

    find_library_path "$out/ldd.log"
    echo "library path: $libpath" | tee -a "$out/host.txt"

    echo "== test_cuda"
    status=0
    (cd "$scratch" && TMPDIR="$scratch" CRITERION_VERBOSITY_LEVEL=1 \
        launch 120 "$out/test_cuda.log" "$dir/bin/test_cuda" --jobs 1) || status=$?
    tail -n 40 "$out/test_cuda.log"
    echo "test_cuda: exit $status"
    ((status == 0)) || failed=1

    local tokens dtype
    for tokens in 2048 8192; do
        for dtype in f16 bf16 q8; do
            step="bench_cuda-$tokens-$dtype"
            echo "== $step ($((SECONDS - started)) s in)"
            status=0
            launch $((tokens > 2048 ? 60 : 40)) "$scratch/$step.log" "$dir/bin/bench_cuda" --json \
                --tokens "$tokens" --dtype "$dtype" --dir "$scratch" || status=$?
            # stdout and stderr share the log: the objects are its lines
            # that start with {; every step's go into one file, and its
            # text into another (few files travel back from a GPU machine)
            grep '^{' "$scratch/$step.log" >>"$out/bench_cuda.json" || true
            { echo "== $step (exit $status)"; grep -v '^{' "$scratch/$step.log"; } >>"$out/bench_cuda.log"
            grep -v '^{' "$scratch/$step.log" | tail -n 8
            echo "$step: exit $status, $(grep -c '^{' "$scratch/$step.log") measurements"
            ((status == 0)) || failed=1
        done
    done
    echo "gpu-check: done in $((SECONDS - started)) s; $([ $failed = 0 ] && echo 'every step passed' || echo 'some step FAILED')"
    return $failed
}

case "${1:-}" in
prepare) shift; prepare "$@" ;;
run) shift; run "$@" ;;
*) die "usage: gpu-check.sh prepare [--build DIR] [--out DIR] | run [DIR]" ;;
esac
