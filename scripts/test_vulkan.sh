#!/usr/bin/env bash
# The tests marked `vulkan`, again, on a non-CPU backend: llama.cpp's Vulkan backend on Mesa's software Vulkan
# driver (lavapipe), which any machine can run. A GPU crash that CPU-only tests cannot see (issue: GPUs) shows here.
#
#   bash scripts/test_vulkan.sh [pytest arguments]
#
# 1. Debian's packages it needs (lavapipe, the Vulkan loader and headers, glslc, SPIR-V headers), installed when
#    missing and this is root with apt-get; otherwise it says which are missing and stops.
# 2. The llama.cpp that the installed llama-cpp-python vendors, from that version's source distribution, built
#    with -DGGML_VULKAN=ON as shared libraries into .vulkan/ (git-ignored; built once per version: about 3 minutes
#    on 2 cores: 190 s in CI, most of it compiling ggml-vulkan's shaders). Debian 12's Vulkan headers (1.3.239) predate
#    VK_EXT_layer_settings, which ggml-vulkan names: scripts/vulkan-compat/ supplies those few types.
# 3. `python -m pytest -m vulkan` with that library (LLAMA_CPP_LIB_PATH) and lavapipe admitted as a device
#    (GGML_VK_VISIBLE_DEVICES=0; ggml-vulkan skips CPU-type devices otherwise): every layer goes to Vulkan0.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python}

missing=()
[ -f /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 \
    || missing+=(mesa-vulkan-drivers)
[ -f /usr/include/vulkan/vulkan.hpp ] || missing+=(libvulkan-dev)
command -v glslc >/dev/null || missing+=(glslc)
[ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || missing+=(spirv-headers)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v cmake >/dev/null || missing+=(cmake)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test_vulkan: installing ${missing[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "test_vulkan: missing Debian packages: ${missing[*]} (apt-get install them, then run again)" >&2
        exit 1
    fi
fi

version=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
out=$root/.vulkan/llama-cpp-python-$version
lib=$out/build/bin
if [ ! -f "$lib/libllama.so" ] || [ ! -f "$lib/libggml-vulkan.so" ]; then
    t0=$(date +%s)
    rm -rf "$out" && mkdir -p "$out"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$out"
    tar -xzf "$out"/llama_cpp_python-*.tar.gz -C "$out"
    src=$(echo "$out"/llama_cpp_python-*/vendor/llama.cpp)
    cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_VULKAN=ON -DGGML_RPC=ON -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_CXX_FLAGS="-I$root/scripts/vulkan-compat" >"$out/configure.log" 2>&1 \
        || { tail -30 "$out/configure.log"; exit 1; }
    cmake --build "$out/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target llama ggml-vulkan ggml-rpc \
        >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    echo "test_vulkan: built llama.cpp $version with Vulkan in $(($(date +%s) - t0)) s ($lib)"
fi

export LLAMA_CPP_LIB_PATH=$lib LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GGML_VK_VISIBLE_DEVICES=0 SPECDEC_TEST_BACKEND=vulkan SPECDEC_VULKAN_LIB=$lib
exec "$PY" -m pytest -m vulkan "$@"
