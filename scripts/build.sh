#!/usr/bin/env bash
# Configures and builds Tessera. Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# Defaults: build/, Release, kernels for sm_80 and sm_90a, all targets.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build_dir=${1:-build}
shift || true
jobs=${TESSERA_BUILD_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs"
