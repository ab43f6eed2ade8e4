#!/bin/sh
# Runs the libFuzzer targets of fuzz/ under ASan and UBSan.
#
#     scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Sets up build-fuzz (clang, -Dfuzzing_engine=libfuzzer, address and
# undefined sanitizers, debugoptimized) if it is missing, builds it, then
# runs each target (default: all) for SECONDS (default 60) over a work copy
# of its corpus, at most $CTXS_FUZZ_JOBS (default 2) at a time, merges what
# found new coverage back into fuzz/corpus/TARGET/ (libFuzzer -merge=1), and
# prints per target: execs, seconds, cov and ft, new corpus files, crashes.
#
# Work copies, logs and artifacts (crash-*, leak-*, timeout-*, oom-*) are in
# $CTXS_FUZZ_WORK (default build-fuzz/fuzz-work/TARGET/). A crash stops that
# target; see fuzz/README.md for turning it into a corpus file.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
secs=${1:-60}
if [ $# -gt 0 ]; then shift; fi
targets=${*:-"session_open import index_records index_file format cli"}
jobs=${CTXS_FUZZ_JOBS:-2}
work=${CTXS_FUZZ_WORK:-$build/fuzz-work}

case $secs in
    ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2 ;;
esac

# clang with the libFuzzer runtime.
have_libfuzzer() {
    command -v clang >/dev/null 2>&1 &&
        printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' |
            clang -fsanitize=fuzzer,address -x c - -o /dev/null >/dev/null 2>&1
}
if ! have_libfuzzer; then
    echo "fuzz.sh: installing clang (libFuzzer)" >&2
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq clang >/dev/null
    have_libfuzzer || { echo "fuzz.sh: clang cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

if [ ! -f "$build/build.ninja" ]; then
    CC=clang meson setup "$build" "$root" -Dfuzzing_engine=libfuzzer \
        -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
        -Dtests=false >/dev/null
fi
ninja -C "$build" -j2 >/dev/null

# Scratch directories of fuzzers that died (they are removed at exit).
for d in /dev/shm/ctxs-fuzz-* "${TMPDIR:-/tmp}"/ctxs-fuzz-*; do
    [ -d "$d" ] || continue
    pid=$(basename "$d" | sed 's/.*-\([0-9][0-9]*\)-[^-]*$/\1/')
    case $pid in ''|*[!0-9]*) continue ;; esac
    kill -0 "$pid" 2>/dev/null || rm -rf "$d"
done

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}

run_one() {
    t=$1
    exe=$build/fuzz/${t}_fuzzer
    [ -x "$exe" ] || { echo "fuzz.sh: no target $t" >&2; return 1; }
    w=$work/$t
    rm -rf "$w"
    mkdir -p "$w/corpus" "$w/artifacts"
    cp "$root/fuzz/corpus/$t/"* "$w/corpus/" 2>/dev/null || true
    "$exe" -max_total_time="$secs" -timeout="${CTXS_FUZZ_TIMEOUT:-30}" -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$w/artifacts/" "$w/corpus" >"$w/log" 2>&1 || true
    before=$(ls "$root/fuzz/corpus/$t" | wc -l)
    "$exe" -merge=1 -artifact_prefix="$w/artifacts/merge-" "$root/fuzz/corpus/$t" "$w/corpus" \
        >"$w/merge.log" 2>&1 || true
    after=$(ls "$root/fuzz/corpus/$t" | wc -l)
    echo $((after - before)) >"$w/new"
}

i=0
for t in $targets; do
    run_one "$t" &
    i=$((i + 1))
    if [ $((i % jobs)) -eq 0 ]; then wait; fi
done
wait

printf '%-14s %12s %8s %10s %7s %8s %8s %8s\n' target execs seconds execs/s cov ft new crashes
for t in $targets; do
    w=$work/$t
    [ -f "$w/log" ] || continue
    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$w/log" | tail -n 1)
    execs=$(echo "$done_line" | sed -n 's/^Done \([0-9]*\) runs.*/\1/p')
    s=$(echo "$done_line" | sed -n 's/.* in \([0-9]*\) second.*/\1/p')
    if [ -z "$execs" ]; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$w/log" | tail -n 1)
        s=$(grep -E '^#[0-9]+' "$w/log" | tail -n 1 | sed -n 's/.*exec\/s: \([0-9]*\).*/\1/p')
        s=${s:+?}
    fi
    last=$(grep -E '^#[0-9]+.*cov: ' "$w/log" | tail -n 1)
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    rate=-
    case ${execs:-x}${s:-x} in *[!0-9]*) ;; *) [ "$s" -gt 0 ] && rate=$((execs / s)) ;; esac
    crashes=$(ls "$w/artifacts" 2>/dev/null | grep -cE '^(merge-)?(crash|leak|timeout|oom)-' || true)
    printf '%-14s %12s %8s %10s %7s %8s %8s %8s\n' "$t" "${execs:--}" "${s:--}" "$rate" \
        "${cov:--}" "${ft:--}" "$(cat "$w/new" 2>/dev/null || echo -)" "$crashes"
    [ "$crashes" -gt 0 ] && ls "$w/artifacts" | sed "s|^|    $w/artifacts/|"
done
exit 0
