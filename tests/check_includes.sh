#!/bin/sh
# Which folder of src/ may include which other folder's headers.
#
# Each folder of src/ keeps its headers to itself, but for the interfaces
# named below. A file may always include its own folder's headers (and
# those of the folders beneath it), src/'s own (last_error.h), the public
# headers of include/ and the system's. Run by meson test (suite unit);
# with no argument it checks the tree it sits in.
#
#   src/store     the session files: includes no other folder.
#   src/index     the LMDB index: of src/store only session_iface.h (which
#                 brings format.h, label.h and peek.h with it) and the
#                 platform layer: platform.h, syscall.h, lock.h (the file
#                 locks), aside.h (files written aside).
#   src/transfer  export, import, their blocks: src/index's index.h, and of
#                 src/store what src/index may.
#   src/remote    the remote tier: what src/transfer may, and kv_block.h.
#   src/cpu       the CPU attention kernel: src/store's dtype.h.
#   src/gpu       the GPU libraries: src/store's format.h (slot spans).
#   src/llama     the llama.cpp adapter: the public headers only.
set -u

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
src=$root/src
cd "$src" || exit 2

platform="store/platform.h store/syscall.h store/lock.h store/aside.h"
session="store/session_iface.h $platform"

allowed() {
    case $1 in
    store) echo "" ;;
    index) echo "$session" ;;
    transfer) echo "index/index.h $session" ;;
    remote) echo "index/index.h transfer/kv_block.h $session" ;;
    cpu) echo "store/dtype.h" ;;
    gpu) echo "store/format.h" ;;
    *) echo "" ;;
    esac
}

bad=0
for file in $(find . -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.m' -o -name '*.cpp' |
              sed 's|^\./||' | sort); do
    case $file in */*) ;; *) continue ;; esac
    folder=${file%%/*}
    for name in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file"); do
        base=${name##*/}
        # Where the header is: the file's own folder, then src/, then the
        # other folders (a header of that name in none is the system's, or
        # generated).
        if [ -n "$(find "$folder" -name "$base" -print -quit)" ] || [ -f "$base" ] ||
           [ -f "$root/include/$base" ]; then
            continue
        fi
        owner=$(find . -mindepth 2 -name "$base" | sed 's|^\./||' | head -n 1)
        [ -n "$owner" ] || continue
        ok=0
        for a in $(allowed "$folder"); do
            [ "$a" = "$owner" ] && ok=1
        done
        if [ "$ok" = 0 ]; then
            echo "src/$file includes $owner, which src/$folder may not (tests/check_includes.sh)" >&2
            bad=1
        fi
    done
done
exit $bad
