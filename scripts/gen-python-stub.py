#!/usr/bin/env python3
"""Generates python/tessera/_C.pyi, the type stub of the extension module tessera._C, from the
bindings: nanobind's stubgen, then NDArray made a protocol instead of numpy's (the arrays are any
object with __dlpack__, in practice torch tensors; numpy is not a dependency).

Usage (tessera._C importable, e.g. PYTHONPATH=build/python):
  python3 scripts/gen-python-stub.py            rewrite python/tessera/_C.pyi
  python3 scripts/gen-python-stub.py --check    exit 1, printing a diff, when the file is stale
"""

import difflib
import os
import subprocess
import sys
import tempfile

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tessera", "_C.pyi")

HEADER = '''"""
Tessera's C++ API (low level; use the functions and classes of the `tessera` package).
"""

# Type stub of the extension module tessera._C, generated from the bindings by
# scripts/gen-python-stub.py (nanobind.stubgen, then NDArray made a protocol instead of numpy's:
# the arrays are any object with __dlpack__, in practice torch tensors). Do not edit by hand;
# tests/python/test_cpu.py::test_stub_matches_the_bindings checks it where the same nanobind and
# Python run.
# nanobind {version}, python {python}

import enum
from typing import Any, Protocol


class NDArray(Protocol):
    """Any DLPack-exporting tensor (torch.Tensor)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
'''

NUMPY_IMPORT = "from numpy.typing import NDArray\n"


def generate() -> str:
    import nanobind  # stubgen's output format is its version's

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "_C.pyi")
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "tessera._C", "-o", out], check=True)
        text = open(out, encoding="utf-8").read()
    if NUMPY_IMPORT not in text:
        raise SystemExit(f"gen-python-stub: stubgen output has no '{NUMPY_IMPORT.strip()}' line to replace")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    header = HEADER.format(version=nanobind.__version__, python=python)
    return header + "\n" + text[text.index(NUMPY_IMPORT) + len(NUMPY_IMPORT):]


def main(argv) -> int:
    text = generate()
    if "--check" in argv:
        current = open(STUB, encoding="utf-8").read()
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), "_C.pyi (committed)",
                                                   "_C.pyi (from the bindings)"))
        return 1
    with open(STUB, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
