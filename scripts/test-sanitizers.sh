#!/usr/bin/env bash
# The default test suite again, built with AddressSanitizer (leaks
# included) and UndefinedBehaviorSanitizer, in ./build-asan. Any report
# fails the run: the sanitizers abort on the first error, and a leak
# that LeakSanitizer reports at a test's exit (which Criterion does not
# count as a failure) is looked for in the logs.
# Extra arguments go to `meson test` (e.g. --suite unit).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh >/dev/null || exit 1

# llama.cpp as bootstrap.sh built it (uninstrumented): the adapter and the
# programs around it are.
llama_pc=$PWD/build/llama.cpp/prefix/lib/pkgconfig
if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan -Dbuildtype=debugoptimized -Db_sanitize=address,undefined \
        -Dcuda=disabled -Dpkg_config_path="$llama_pc" >/dev/null || exit 1
elif ! grep -qF "$llama_pc" build-asan/meson-info/intro-buildoptions.json 2>/dev/null; then
    meson configure build-asan -Dpkg_config_path="$llama_pc" >/dev/null || exit 1
fi
ninja -C build-asan || exit 1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
meson test -C build-asan --print-errorlogs --num-processes 2 "$@"
status=$?

log=build-asan/meson-logs/testlog.txt
if grep -qE "ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:" "$log"; then
    echo "sanitizers: reports in $log:" >&2
    grep -nE "ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:|SUMMARY:" "$log" | head -40 >&2
    status=1
fi
echo "sanitizers: $([ $status -eq 0 ] && echo clean || echo FAILED)"
exit $status
