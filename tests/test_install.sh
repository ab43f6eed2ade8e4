#!/usr/bin/env bash
# `meson install` into a temporary DESTDIR, then what a user does with it:
# build tests/install_app.c against the installed ctxstore.pc and run it,
# run the installed ctxstore tool, and check that the installed programs
# carry an rpath to the prefix's libdir (so that they run from a prefix
# like /opt/ctxstore without LD_LIBRARY_PATH).
#
# tests/meson.build sets MESON_BUILD_ROOT, MESON_SOURCE_ROOT, CTXS_PREFIX,
# CTXS_LIBDIR, CTXS_BINDIR, CTXS_INCLUDEDIR, CTXS_LIBEXECDIR (absolute
# paths, the prefix joined), CTXS_VERSION and CTXS_SANITIZE.
# Exit 0 pass, 1 fail, 77 skip.
#
# The rpath names the real prefix, not the DESTDIR, so the programs run
# here with LD_LIBRARY_PATH pointing into the DESTDIR; readelf checks the
# rpath itself.
set -euo pipefail

fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
skip() { echo "test_install: SKIP: $*" >&2; exit 77; }

for v in MESON_BUILD_ROOT MESON_SOURCE_ROOT CTXS_PREFIX CTXS_LIBDIR CTXS_BINDIR \
         CTXS_INCLUDEDIR CTXS_LIBEXECDIR CTXS_VERSION CTXS_SANITIZE; do
    [ -n "${!v:-}" ] || fail "$v is not set (run through meson test)"
done

# An instrumented library needs its sanitizer's runtime and flags in every
# program that links it; a plain `cc $(pkg-config ...)` is not that, and
# the default build runs this test unsanitized.
[ "$CTXS_SANITIZE" = none ] || skip "a -Db_sanitize=$CTXS_SANITIZE build; this test runs in the plain build"
command -v cc >/dev/null || skip "no cc on PATH"
command -v pkg-config >/dev/null || skip "no pkg-config on PATH (scripts/bootstrap.sh installs it)"
command -v readelf >/dev/null || skip "no readelf on PATH (binutils)"
MESON=${MESON:-meson}
command -v "$MESON" >/dev/null || skip "no meson on PATH"

# meson test points LD_LIBRARY_PATH at the build tree's libraries; here
# only the installed ones may be found, and only where this script says.
unset LD_LIBRARY_PATH

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ctxs-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
destdir=$tmp/destdir
libdir=$destdir$CTXS_LIBDIR

# --no-rebuild: the test runs on a built tree (meson test builds this
# test's depends first) and must not start ninja beside the other tests.
# --destdir: nothing lands outside $tmp (meson logs the install to
# meson-logs/install-log.txt in the build directory, as any install does).
"$MESON" install -C "$MESON_BUILD_ROOT" --no-rebuild --quiet --destdir "$destdir" \
    >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "meson install"; }

pc=$libdir/pkgconfig/ctxstore.pc
[ -f "$pc" ] || fail "no $pc after meson install"
[ -f "$destdir$CTXS_INCLUDEDIR/ctxstore.h" ] || fail "no ctxstore.h in $CTXS_INCLUDEDIR"

# pkg-config reads the installed .pc; the sysroot makes its -I and -L
# point into the DESTDIR.
export PKG_CONFIG_PATH=$libdir/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$destdir
pkg_version=$(pkg-config --modversion ctxstore) || fail "pkg-config --modversion ctxstore"
[ "$pkg_version" = "$CTXS_VERSION" ] || fail "ctxstore.pc says $pkg_version, the project $CTXS_VERSION"
flags=$(pkg-config --cflags --libs ctxstore) || fail "pkg-config --cflags --libs ctxstore"
echo "pkg-config --cflags --libs ctxstore: $flags"
case $flags in
    *"-L$libdir"*) ;;
    *) fail "pkg-config's flags do not point into the installed libdir $libdir" ;;
esac

# shellcheck disable=SC2086 # $flags is a list of words
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/install_app" \
    "$MESON_SOURCE_ROOT/tests/install_app.c" $flags \
    || fail "cc install_app.c \$(pkg-config --cflags --libs ctxstore)"

# The app loads the installed library, not the build tree's.
loaded=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/install_app" | sed -n 's/^[[:space:]]*\(libctxstore\.so.*\)/\1/p')
echo "install_app loads: $loaded"
case $loaded in
    *"$libdir/libctxstore.so"*) ;;
    *) fail "install_app does not load libctxstore.so from $libdir: $loaded" ;;
esac
mkdir "$tmp/scratch"
LD_LIBRARY_PATH=$libdir "$tmp/install_app" "$tmp/scratch" || fail "install_app"

tool=$destdir$CTXS_BINDIR/ctxstore
if [ -e "$tool" ]; then
    out=$(LD_LIBRARY_PATH=$libdir "$tool" --version) || fail "$tool --version"
    echo "installed tool: $out"
    [ "$out" = "ctxstore $CTXS_VERSION" ] || fail "ctxstore --version says '$out'"
else
    echo "no ctxstore tool installed (-Dtools=false)"
fi

# Every installed program finds libctxstore.so through its rpath
# (DT_RUNPATH, or DT_RPATH from older linkers) to the prefix's libdir.
n=0
for prog in "$tool" "$destdir$CTXS_LIBEXECDIR"/ctxstore/*; do
    [ -f "$prog" ] || continue
    dyn=$(readelf -d "$prog") || fail "readelf -d $prog"
    path=$(sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p' <<<"$dyn")
    case ":$path:" in
        *":$CTXS_LIBDIR:"*) ;;
        *) fail "${prog#"$destdir"}: rpath '$path', not $CTXS_LIBDIR" ;;
    esac
    echo "${prog#"$destdir"}: rpath $path"
    n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no installed programs to check"

echo "test_install: OK: installed to a DESTDIR, an app built with pkg-config ran, $n programs carry the rpath"
