#!/bin/sh
# The library that is installed carries none of the test build's hooks
# (src/meson.build): nm finds none of their names in the release shared
# and static libraries, and finds every one of them in the test build, so
# that a renamed hook cannot pass this unseen.
#   test_release_symbols.sh TEST_LIB RELEASE_LIB...
set -u
nm=${NM:-nm}
hooks='ctxs__fault ctxs__fault_arm ctxs__fault_disarm ctxs__fault_calls ctxs__fault_failed
ctxs__fault_last_failed ctxs__fault_sites ctxs__open_hook ctxs__fork_hook ctxs__grow_hook
ctxs__write_path_force ctxs__write_path_asks ctxs__aside_force_named
ctxs__background_wait_idle ctxs__attention_force_isa'
test_lib=$1
shift
status=0
symbols() { { "$nm" "$1" 2>/dev/null; "$nm" -D "$1" 2>/dev/null; } | awk 'NF >= 2 { print $NF }' | sort -u; }
have=$(symbols "$test_lib")
for h in $hooks; do
    if ! printf '%s\n' "$have" | grep -qx "$h"; then
        echo "FAIL: the test build $test_lib has no $h: is the list above out of date?" >&2
        status=1
    fi
done
for lib in "$@"; do
    syms=$(symbols "$lib")
    if [ -z "$syms" ]; then
        echo "FAIL: nm read no symbols from $lib" >&2
        status=1
        continue
    fi
    for h in $hooks; do
        if printf '%s\n' "$syms" | grep -qx "$h"; then
            echo "FAIL: $lib carries the test hook $h" >&2
            status=1
        fi
    done
    # Whatever else the test build's invariant checks or fault hook might
    # leave behind by another name.
    stray=$(printf '%s\n' "$syms" | grep -E '^ctxs__(fault|invariant)' || true)
    if [ -n "$stray" ]; then
        echo "FAIL: $lib carries $stray" >&2
        status=1
    fi
    echo "$lib: none of the test hooks"
done
exit $status
