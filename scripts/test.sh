#!/usr/bin/env bash
# Builds everything (every kernel for sm_80 and sm_90a, and the Python extension module when it can
# be built) and runs every test: first every C++ suite (CTest), whatever the state of Python, then
# pytest over tests/python when PyTorch is importable. Without a GPU the GPU tests report "skipped"
# and the CPU tests (reference, validators, formats, planner, JIT, install, no-GPU errors, Python
# argument checks) run.
#
# Without PyTorch (or nanobind, pytest, the Python headers) the Python tests are skipped with one
# line saying why, and the exit status is that of the C++ tests. TESSERA_REQUIRE_PYTHON_TESTS=1 (set
# by .ci/run) makes that skip a failure. This script installs nanobind and pytest when missing
# (scripts/setup-python.sh), never PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
require_python=${TESSERA_REQUIRE_PYTHON_TESTS:-0}

# What stops the Python extension from being built, and what stops its tests from running.
cannot_build=()
cannot_test=()
if ! command -v python3 >/dev/null; then
  cannot_build+=("python3 is not installed")
else
  bash scripts/setup-python.sh || true  # it says what failed; the C++ tests run regardless
  python3 -c "import nanobind" 2>/dev/null || cannot_build+=("nanobind is not installed (pip install nanobind)")
  python3 -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
    2>/dev/null || cannot_build+=("the Python headers are missing (Debian: apt-get install python3-dev)")
  python3 -c "import pytest" 2>/dev/null || cannot_test+=("pytest is not installed (pip install pytest)")
  python3 -c "import torch" 2>/dev/null ||
    cannot_test+=("PyTorch is not installed (the wrappers take torch tensors: pip install torch)")
fi
# The extension is built for the python3 that runs the tests (CMake could find another one).
python_args=(-DTESSERA_BUILD_PYTHON=OFF)
[ ${#cannot_build[@]} -eq 0 ] && python_args=(-DTESSERA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")

bash scripts/build.sh build "${python_args[@]}"

cpp_status=0
ctest --test-dir build --output-on-failure || cpp_status=$?

python_status=0
skipped=("${cannot_build[@]}" "${cannot_test[@]}")
if [ ${#skipped[@]} -eq 0 ]; then
  PYTHONPATH=build/python python3 -m pytest -q tests/python -p no:cacheprovider || python_status=$?
  # 5 is pytest's "no tests collected": with torch importable, that is a broken test tree.
  [ "$python_status" = 5 ] && echo "test.sh: pytest ran no test although PyTorch is importable" >&2
else
  reasons=$(IFS=';'; joined="${skipped[*]}"; echo "${joined//;/; }")
  if [ "$require_python" = 1 ]; then
    echo "test.sh: Python tests did not run and TESSERA_REQUIRE_PYTHON_TESTS=1 requires them: $reasons" >&2
    python_status=1
  else
    echo "test.sh: Python tests SKIPPED: $reasons"
  fi
fi

[ "$cpp_status" = 0 ] || echo "test.sh: C++ tests FAILED (ctest exit status $cpp_status)" >&2
[ "$python_status" = 0 ] || echo "test.sh: Python tests FAILED (exit status $python_status)" >&2
[ "$cpp_status" = 0 ] && [ "$python_status" = 0 ]
