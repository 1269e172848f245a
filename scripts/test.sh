#!/usr/bin/env bash
# Builds everything (every kernel for sm_80 and sm_90a) and runs every test. Without a GPU the GPU
# tests report "skipped" and the CPU tests (reference, validators, formats, install) run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build
ctest --test-dir build --output-on-failure
