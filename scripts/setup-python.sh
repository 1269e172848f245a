#!/usr/bin/env bash
# Installs what the Python package and its tests need (nanobind, pytest, PyTorch) when missing.
# Idempotent and quiet when everything is present.
set -euo pipefail
missing=()
python3 -c "import nanobind" 2>/dev/null || missing+=(nanobind)
python3 -c "import pytest" 2>/dev/null || missing+=(pytest)
python3 -c "import torch" 2>/dev/null || missing+=(torch)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-python: installing ${missing[*]}"
  python3 -m pip install -q "${missing[@]}"
fi
