#!/usr/bin/env bash
# build/python-venv: the virtual environment that the llama-cpp-python tests
# (meson test python-llama) and bench/bench_python.py --llama run in.
# Called by bootstrap.sh after build-llama.sh; idempotent.
#
# It is Debian's python3 with its NumPy, PyTorch and pytest
# (--system-site-packages: the build tree's extension is built against
# that NumPy) and llama-cpp-python 0.3.36 from the source distribution
# build-llama.sh fetched, built WITHOUT its own llama.cpp
# (CMAKE_ARGS=-DLLAMA_BUILD=OFF): at run time it loads the libllama of
# build/llama.cpp/prefix/lib (LLAMA_CPP_LIB_PATH), the one the adapter
# links, so that the process holds one llama.cpp. Versions are pinned in
# python/requirements/llama.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
venv=build/python-venv
sdist=build/llama.cpp/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
stamp=$venv/.ready-$LLAMA_CPP_PYTHON_VERSION-$(sha256sum python/requirements/llama.txt | cut -c1-16)

[ -f "$stamp" ] && exit 0
if [ ! -f "$sdist" ]; then
    echo "python-env: $sdist is missing (scripts/build-llama.sh fetches it)" >&2
    exit 1
fi
echo "python-env: making $venv (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION without its own llama.cpp)"
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input --quiet)
# The build tools pip fetches for the source distribution, pinned too.
export PIP_CONSTRAINT=$PWD/python/requirements/llama.txt
"${pip[@]}" install -r python/requirements/llama.txt
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "${pip[@]}" install --no-deps "$sdist"
touch "$stamp"
