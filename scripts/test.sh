#!/usr/bin/env bash
# Builds everything (every kernel for sm_80 and sm_90a, and the Python extension module) and runs
# every test: CTest (C++), then pytest over tests/python. Without a GPU the GPU tests report
# "skipped" and the CPU tests (reference, validators, formats, planner, JIT, install, Python
# argument checks) run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-python.sh
bash scripts/build.sh build -DTESSERA_BUILD_PYTHON=ON
ctest --test-dir build --output-on-failure
PYTHONPATH=build/python python3 -m pytest -q tests/python -p no:cacheprovider
