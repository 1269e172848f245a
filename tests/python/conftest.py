"""pytest configuration for the Python package's tests.

The package under test is whatever `import tessera` finds: the installed one (`pip install .`)
or a development build (`PYTHONPATH=<build>/python`, see python/CMakeLists.txt).
"""

import os
import sys

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="session")
def repo_root() -> str:
    """The repository root (for include/tessera/version.h)."""
    return REPO_ROOT


def pytest_report_header(config):  # noqa: D103 - pytest hook
    try:
        import tessera

        where = os.path.dirname(tessera.__file__)
        return f"tessera {tessera.__version__} from {where} (python {sys.version.split()[0]})"
    except Exception as e:  # pragma: no cover - reported, then the tests fail on import
        return f"tessera: import failed: {e!r}"
