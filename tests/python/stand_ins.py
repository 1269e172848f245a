"""Stand-ins for the runtime classes of tessera._C (which need a GPU), shared by the CPU tests of
the Python wrappers: each call is bound to the binding's signature in the generated stub _C.pyi
(a TypeError when a wrapper's call would not reach the C++ method) and recorded."""

import ast
import inspect
import os

import tessera


def stub_signatures(class_name):
    """inspect.Signature of each method of a class of _C.pyi (the generated stub of the bindings),
    annotations dropped (they name classes defined elsewhere in the stub)."""
    path = os.path.join(os.path.dirname(tessera.__file__), "_C.pyi")
    tree = ast.parse(open(path, encoding="utf-8").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    namespace = {}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            a.annotation = None
        fn.returns, fn.decorator_list = None, []
        code = compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), path, "exec")
        exec(code, namespace)
    return {name: inspect.signature(f) for name, f in namespace.items() if inspect.isfunction(f)}


class SignatureStandIn:
    """Base of a stand-in for the _C class named `cpp_class`: `_check(name, ...)` binds a call to
    that method's stub signature; workspace_size() answers `needed` (a class whose binding has
min_workspace_size defines it too: the wrappers look for it); plan() and run() are
    recorded in `plans` / `runs` (subclasses add their own argument checks). A test fixture
    usually derives a fresh subclass with its own `instances` list."""

    cpp_class = ""
    instances = []
    signatures = None
    needed = 0  # the workspace-size queries' answer

    def _register(self):
        self.plans, self.runs = [], []
        type(self).instances.append(self)

    @classmethod
    def _check(cls, name, *args, **kwargs):
        if cls.signatures is None:
            cls.signatures = stub_signatures(cls.cpp_class)
        cls.signatures[name].bind(*args, **kwargs)

    @classmethod
    def workspace_size(cls, *args, **kwargs):
        cls._check("workspace_size", *args, **kwargs)
        return cls.needed

    def fast_run(self, *args, **kwargs):
        """The paged wrappers' tessera._C.PagedFastRun needs a GPU: the stand-in's declines every
        call (None), so run() takes the full path (conftest.RecordingRuntime.fast_run)."""
        self._check("fast_run", self, *args, **kwargs)
        return lambda q, paged_kv_cache, out=None: None
