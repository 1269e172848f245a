#!/usr/bin/env bash
# Installs what building the Python extension and running its tests need, when missing: nanobind
# and pytest, and PyTorch only with --with-torch (the PyPI wheel of torch for Linux x86_64 is its
# CUDA build, several GB with its NVIDIA libraries: installing it is the caller's decision, which
# .ci/run makes). Installs with pip into the environment of `python3`.
#
# Idempotent and quiet when everything is present. Exits non-zero (after one line saying what is
# missing) when an install fails, e.g. without pip or in a system Python that refuses pip installs
# (PEP 668): scripts/test.sh then still builds and runs the C++ tests.
set -euo pipefail

with_torch=0
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    *) echo "setup-python: unknown argument '$arg' (expected --with-torch)" >&2; exit 2 ;;
  esac
done

missing=()
python3 -c "import nanobind" 2>/dev/null || missing+=(nanobind)
python3 -c "import pytest" 2>/dev/null || missing+=(pytest)
if [ "$with_torch" = 1 ]; then
  python3 -c "import torch" 2>/dev/null || missing+=(torch)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup-python: installing ${missing[*]}"
if ! python3 -m pip install -q "${missing[@]}"; then
  echo "setup-python: 'python3 -m pip install ${missing[*]}' failed; install them into the Python that runs the tests" >&2
  exit 1
fi
