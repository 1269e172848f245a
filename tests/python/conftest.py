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


class RecordingRuntime:
    """A stand-in for a C++ runtime class (tessera._C.Batch*Wrapper): records plan() and run() as
    the bindings receive them, so tests check what the Python wrappers hand the runtime without a
    GPU. Subclass it to write outputs in run()."""

    def __init__(self, workspace, bounds, options):
        self.bounds, self.options = bounds, options
        self.plans, self.runs, self.fast_runs = [], [], []

    @staticmethod
    def workspace_size(bounds, options, device):
        return 0

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))

    def run(self, *args, **kwargs):
        self.runs.append((args, kwargs))

    def set_variant_params(self, params):
        """A jit_args run()'s values for the plan's variant (recorded in `variant_params`)."""
        self.__dict__.setdefault("variant_params", []).append(list(params))

    def fast_run(self, *args):
        """The paged wrappers' tessera._C.PagedFastRun reads tensors through PyTorch's DLPack
        exchange table and launches: it needs a GPU. The stand-in's declines every call (None, as
        the real one does for anything but the common case), so run() takes the full path; plan()'s
        arguments are recorded."""
        self.fast_runs.append(args)
        return lambda q, paged_kv_cache, out=None: None


@pytest.fixture
def install_runtime_stand_ins(monkeypatch):
    """install(names, base=RecordingRuntime, namespace=dict): replaces tessera._C's runtime classes
    `names` by subclasses of `base` (each with the attributes namespace() returns) and lifts the
    device checks, so the wrappers' plan() and run() go through on the CPU (the workspace, hence the
    plan's device, is the CPU); returns the classes by name."""
    from tessera import _C
    from tessera import _utils as U

    def install(names, base=RecordingRuntime, namespace=dict):
        monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
        monkeypatch.setattr(U, "current_stream", lambda device: 0)
        monkeypatch.setattr(U, "device_index", lambda t: 0)
        classes = {name: type(name, (base,), namespace()) for name in names}
        for name, cls in classes.items():
            monkeypatch.setattr(_C, name, cls)
        return classes

    return install
