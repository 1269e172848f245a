#!/usr/bin/env bash
# Configures (once) and builds the given targets for sm_90a in build-sm90a, with the dependencies
# staged in .deps (see gpu-check.sh). For quick runs on the device machine:
#   bash scripts/gpu-build.sh gpu_runtime_tests tessera-bench
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sm90a}
cmake_args=(-DTESSERA_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release)
[ -d .deps/googletest ] && [ ! -f /usr/include/gtest/gtest.h ] && cmake_args+=(-DTESSERA_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
[ -d .deps/include/dlpack ] && cmake_args+=(-DTESSERA_DLPACK_INCLUDE_DIR="$PWD/.deps/include")
[ -f "$BUILD_DIR/CMakeCache.txt" ] || cmake -S . -B "$BUILD_DIR" -G Ninja "${cmake_args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "$@"
