"""The part the FlashInfer-style wrappers share: the lazily built C++ plan/run runtime.

A wrapper holds one C++ runtime object (tessera::BatchDecodeWrapper, BatchPrefillPagedWrapper,
BatchPrefillRaggedWrapper or BatchCascadePagedWrapper, include/tessera/runtime.h). It is built in
the first plan() with RuntimeBounds derived from that plan, reused while later plans fit, and
rebuilt with larger bounds (rounded up to powers of two, so a growing batch does not rebuild at
every step) when one does not.
Every build checks that the caller's float_workspace_buffer holds workspace_size(bounds) bytes.

With use_cuda_graph=True the bounds come from the preallocated index buffers and the first plan,
the runtime is built once and never rebuilt (a captured run() has its pointers baked in), and a
later plan beyond those bounds is an error.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Dict, Optional, Tuple

from . import _utils as U
from ._jit_args import check_jit_kwargs, jit_variant

__all__: list = []  # private module


# --- torch.compile: wrapper handles and the custom ops (tessera/_ops.py) ------------------------
#
# Under torch.compile a wrapper's run() calls a PyTorch custom op (tessera::decode_run, ...) in
# place of the C++ runtime object, which a custom op cannot take as an argument: the op gets the
# wrapper's integer handle and looks the wrapper up here. The table holds weak references, so it
# never keeps a wrapper alive; a collected wrapper's entry disappears with it.

_WRAPPERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_NEXT_HANDLE = itertools.count(1)
_OPS: Optional[Any] = None  # the module tessera._ops once loaded (torch >= 2.4 has torch.library.custom_op)
_OPS_TRIED = False
_IS_COMPILING: Any = None  # torch.compiler.is_compiling, once the ops are loaded


def load_ops() -> Optional[Any]:
    """Imports tessera._ops (registering the custom ops) once; None when this torch has no
    torch.library.custom_op (before 2.4): run() then stays a plain Python call under torch.compile."""
    global _OPS, _OPS_TRIED, _IS_COMPILING
    if not _OPS_TRIED:
        _OPS_TRIED = True
        torch = U._torch()
        if hasattr(torch, "compiler") and hasattr(getattr(torch, "library", None), "custom_op"):
            try:
                from . import _ops
            except ModuleNotFoundError as e:  # a development build configured before _ops.py existed
                if e.name != f"{__package__}._ops":
                    raise
            else:
                _IS_COMPILING = torch.compiler.is_compiling
                _OPS = _ops
    return _OPS


def mark_static_address(t: Any) -> None:
    """Marks a tensor whose address the C++ runtime keeps (workspace, CUDA-graph index buffers) as
    static for torch.compile, as torch._dynamo.mark_static_address(t, guard=False) does (the same
    attribute, set here without importing Dynamo, which takes seconds): CUDA graphs of
    mode="reduce-overhead" then use it in place (no copy) and allow the ops to write it."""
    if getattr(t, "_dynamo_static_input_type", None) is None:
        t._dynamo_static_input_type = "unguarded"


def enable_compile(wrapper: Any, *static_tensors: Any) -> int:
    """Registers a wrapper for the custom ops and returns its handle; loads the ops and marks the
    tensors whose addresses the runtime keeps as static."""
    handle = next(_NEXT_HANDLE)
    _WRAPPERS[handle] = wrapper
    if load_ops() is not None:
        for t in static_tensors:
            if t is not None:
                mark_static_address(t)
    return handle


def wrapper_for(handle: int) -> Any:
    """The live wrapper of a handle (RuntimeError once it has been garbage-collected)."""
    wrapper = _WRAPPERS.get(int(handle))
    if wrapper is None:
        raise RuntimeError(
            f"tessera: no live wrapper has handle {int(handle)} (the wrapper a compiled function was traced "
            "with has been garbage-collected)"
        )
    return wrapper


def compiling() -> bool:
    """True while torch.compile (Dynamo) traces a run() and the custom ops exist: run() then does
    the checks that depend only on the plan, shapes and dtypes, and calls the op."""
    return _OPS is not None and bool(_IS_COMPILING())


class _Need:
    """What one plan requires of the runtime's bounds."""

    __slots__ = ("batch", "total_qo", "num_qo_heads", "num_kv_heads", "head_dim", "head_dim_vo")

    def __init__(self, batch: int, total_qo: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 head_dim_vo: Optional[int] = None) -> None:
        self.batch = max(1, int(batch))
        self.total_qo = max(1, int(total_qo))
        self.num_qo_heads = int(num_qo_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        # v's and o's head dim: 0 when it is head_dim (the C++ bounds' convention).
        self.head_dim_vo = 0 if head_dim_vo is None or int(head_dim_vo) == self.head_dim else int(head_dim_vo)

    def fits(self, bounds: Any) -> bool:
        # Split head dims are planned at exactly the bounds' pair; equal ones at most the bounds' head dim.
        same_dims = (self.head_dim == bounds.head_dim if self.head_dim_vo else self.head_dim <= bounds.head_dim)
        return (
            self.batch <= bounds.max_batch_size
            and self.total_qo <= bounds.max_total_qo_tokens
            and self.num_qo_heads <= bounds.num_qo_heads
            and self.num_kv_heads <= bounds.num_kv_heads
            and same_dims
            and self.head_dim_vo == bounds.head_dim_vo
        )

    def fits_key(self, b: Tuple[int, int, int, int, int, int]) -> bool:
        """fits() against bounds as _bounds_key gives them (plain ints: no reads from the C++ object)."""
        same_dims = (self.head_dim == b[4] if self.head_dim_vo else self.head_dim <= b[4])
        return (self.batch <= b[0] and self.total_qo <= b[1] and self.num_qo_heads <= b[2]
                and self.num_kv_heads <= b[3] and same_dims and self.head_dim_vo == b[5])

    def describe(self) -> str:
        vo = f", head_dim_vo={self.head_dim_vo}" if self.head_dim_vo else ""
        return (
            f"batch_size={self.batch}, query rows={self.total_qo}, num_qo_heads={self.num_qo_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}{vo}"
        )


_PLAIN_TYPES: Optional[frozenset] = None


def _plain_types() -> frozenset:
    """The argument types _ArgsMemo keeps keys of: values whose == means "the checks give the same
    result" (a bool is never taken for an int, nor a float for an int: the types are compared too)."""
    global _PLAIN_TYPES
    if _PLAIN_TYPES is None:
        _PLAIN_TYPES = frozenset((int, float, bool, str, type(None), type(U._torch().float16)))
    return _PLAIN_TYPES


class _ArgsMemo:
    """The result of a call's checks over its scalar arguments, kept for the next call with the
    same ones: a serving loop plans every step with the same head counts, dtypes, page size and
    options, and only its page table changes. get(key) gives the kept value when `key` has the same
    types and values as the key it was put under, else None (the caller then checks again and puts
    the result). put() keeps a value only when every element of its key is of a _plain_types()
    type (int, float, bool, str, None, torch.dtype): a tensor, a numpy scalar or an object as an
    argument is checked at every call. The value must be the same for equal keys: a pure function
    of them, never modified."""

    __slots__ = ("key", "types", "value")

    def __init__(self) -> None:
        self.key: Optional[Tuple[Any, ...]] = None
        self.types: Optional[Tuple[type, ...]] = None
        self.value: Any = None

    def get(self, key: Tuple[Any, ...]) -> Any:
        # Types first (so a tensor is never compared with ==), then the values.
        if self.types is not None and tuple(map(type, key)) == self.types and key == self.key:
            return self.value
        return None

    def put(self, key: Tuple[Any, ...], value: Any) -> None:
        types = tuple(map(type, key))
        plain = _plain_types()
        if all(t in plain for t in types):
            self.key, self.types, self.value = key, types, value


def _bounds(C: Any, batch: int, total_qo: int, hq: int, hkv: int, d: int, d_vo: int = 0) -> Any:
    b = C.RuntimeBounds()
    b.max_batch_size = int(batch)
    b.max_total_qo_tokens = int(total_qo)
    b.num_qo_heads = int(hq)
    b.num_kv_heads = int(hkv)
    b.head_dim = int(d)
    b.head_dim_vo = int(d_vo)
    return b


def _bounds_key(b: Any) -> Tuple[int, int, int, int, int, int]:
    """The fields of a RuntimeBounds that _Need.fits reads, as plain ints."""
    return (b.max_batch_size, b.max_total_qo_tokens, b.num_qo_heads, b.num_kv_heads, b.head_dim, b.head_dim_vo)


def _describe_bounds(b: Any) -> str:
    return (
        f"max_batch_size={b.max_batch_size}, max_total_qo_tokens={b.max_total_qo_tokens}, "
        f"num_qo_heads={b.num_qo_heads}, num_kv_heads={b.num_kv_heads}, head_dim={b.head_dim}"
        + (f", head_dim_vo={b.head_dim_vo}" if b.head_dim_vo else "")
    )


class _RuntimeHolder:
    """Builds, grows and keeps the C++ runtime object of one Python wrapper."""

    def __init__(self, cpp_class_name: str, workspace: Any, use_cuda_graph: bool,
                 cpp_args: Tuple[Any, ...] = ()) -> None:
        self.cpp_class_name = cpp_class_name
        self.workspace = workspace
        self.use_cuda_graph = use_cuda_graph
        # Arguments the C++ class's constructor and workspace_size take before the bounds (the
        # cascade runtime's num_levels): fixed for the holder's life, so every rebuild repeats them.
        self.cpp_args = tuple(cpp_args)
        self.cpp: Optional[Any] = None
        self.bounds: Optional[Any] = None
        self.options_key: Optional[Tuple[Any, ...]] = None
        self.builds = 0  # how many times the C++ object was (re)built, for tests
        # (bounds, _bounds_key(bounds)): the bounds' fields read once per bounds object (each read
        # of the C++ object's fields is a call into the bindings, at every plan).
        self._fit: Tuple[Any, Any] = (None, None)

    def workspace_bytes(self) -> int:
        ws = self.workspace
        return int(ws.numel()) * int(ws.element_size())

    def _options(self, C: Any, dtype: Any, kv_dtype: Any, split_kv: str, fixed_split_size: int) -> Any:
        """The C++ options the runtime is built with (tessera._C.RuntimeOptions; a subclass may
        build its runtime's own options type)."""
        options = C.RuntimeOptions()
        options.cuda_graph = self.use_cuda_graph
        options.split_kv = {"auto": C.SplitKV.auto, "fixed": C.SplitKV.fixed, "none": C.SplitKV.none}[split_kv]
        options.fixed_split_size = int(fixed_split_size)
        options.dtype = U.tessera_dtype(dtype)
        if kv_dtype is not None and kv_dtype != dtype:
            options.kv_dtype = U.tessera_dtype(kv_dtype)
        return options

    def _extra_key(self) -> Tuple[Any, ...]:
        """Options beyond the split and dtypes that the runtime is kept for (a subclass's)."""
        return ()

    def ensure(
        self,
        need: _Need,
        dtype: Any,
        split_kv: str,
        fixed_split_size: int,
        graph_bounds: Optional[Tuple[int, int]] = None,
        kv_dtype: Any = None,
    ) -> Any:
        """The C++ runtime for a plan with requirements `need` (built or rebuilt as needed).

        graph_bounds: with use_cuda_graph, (max_batch_size, max_total_qo_tokens) from the
        preallocated buffers. kv_dtype: K/V's torch dtype when it is not q's (an fp8 cache).
        """
        U.check_cuda("float_workspace_buffer", self.workspace)
        key = (split_kv, int(fixed_split_size), (dtype, kv_dtype) if self.use_cuda_graph else None) + self._extra_key()

        # The runtime of the last plan, when it serves this one too (every step of a serving loop).
        bounds = self.bounds
        if self.cpp is not None and bounds is not None:
            fit = self._fit
            if fit[0] is not bounds:
                fit = self._fit = (bounds, _bounds_key(bounds))
            if self.use_cuda_graph:
                if key != self.options_key:
                    raise ValueError(
                        "use_cuda_graph: this plan changes the dtype or the split options (or a wrapper's own "
                        "options) "
                        f"({key}) the wrapper was built for ({self.options_key}); build a new wrapper"
                    )
                if not need.fits_key(fit[1]):
                    raise ValueError(
                        f"use_cuda_graph: this plan ({need.describe()}) exceeds the bounds the wrapper was "
                        f"built for ({_describe_bounds(self.bounds)}); the preallocated buffers and the first "
                        "plan fix them"
                    )
                return self.cpp
            if key == self.options_key and need.fits_key(fit[1]):
                return self.cpp

        C = U._C()
        cls = getattr(C, self.cpp_class_name)
        options = self._options(C, dtype, kv_dtype, split_kv, fixed_split_size)
        device = U.device_index(self.workspace)
        if self.use_cuda_graph:
            assert graph_bounds is not None
            max_batch, max_total = graph_bounds
            if need.batch > max_batch or need.total_qo > max_total:
                raise ValueError(
                    f"use_cuda_graph: this plan ({need.describe()}) exceeds the preallocated buffers "
                    f"(max batch_size {max_batch}, max query rows {max_total})"
                )
            candidates = [_bounds(C, max_batch, max_total, need.num_qo_heads, need.num_kv_heads, need.head_dim,
                                  need.head_dim_vo)]
        else:
            old = self.bounds
            # A change between equal and split head dims starts the bounds' head dims afresh.
            keep = old if old is not None and old.head_dim_vo == need.head_dim_vo else None
            grown = _bounds(
                C,
                max(U.next_pow2(need.batch), old.max_batch_size if old is not None else 0),
                max(U.next_pow2(need.total_qo), old.max_total_qo_tokens if old is not None else 0),
                max(need.num_qo_heads, old.num_qo_heads if old is not None else 0),
                max(need.num_kv_heads, old.num_kv_heads if old is not None else 0),
                need.head_dim if need.head_dim_vo or keep is None else max(need.head_dim, keep.head_dim),
                need.head_dim_vo,
            )
            exact = _bounds(C, need.batch, need.total_qo, need.num_qo_heads, need.num_kv_heads, need.head_dim,
                            need.head_dim_vo)
            candidates = [grown, exact]

        have = self.workspace_bytes()
        b, needed = self._fitting_bounds(cls, candidates, options, device, have)
        if b is None:
            raise ValueError(
                f"float_workspace_buffer has {have} bytes, but this plan needs {needed} bytes of workspace "
                f"({need.describe()}); allocate a float_workspace_buffer of at least {needed} bytes"
            )
        # Drop the old runtime first: its destructor waits for its last plan upload.
        self.cpp = None
        # The workspace as bytes: FlashInfer's examples allocate int8, engines uint8, and DLPack
        # has no int8 counterpart in Tessera's dtypes.
        self.cpp = U.call(cls, self.workspace, self.workspace.view(U._torch().uint8), *self.cpp_args, b, options)
        self.bounds = b
        self.options_key = key
        self.builds += 1
        return self.cpp

    def _fitting_bounds(self, cls: Any, candidates: Any, options: Any, device: int, have: int) -> Tuple[Any, int]:
        """(bounds, bytes): the first candidate whose workspace_size fits `have` bytes (room for the
        most split plans), else the first whose min_workspace_size does (the runtime gives the split
        states what is left and splits less: head_dim 256 asks ~150 MiB, FlashInfer's customary
        buffer is 128 MiB); (None, the smallest size asked) when none fits."""
        sizers = [cls.workspace_size]
        if hasattr(cls, "min_workspace_size"):
            sizers.append(cls.min_workspace_size)
        smallest = None
        for sizer in sizers:
            for b in candidates:
                size = int(sizer(*self.cpp_args, b, options, device))
                if size <= have:
                    return b, size
                smallest = size if smallest is None else min(smallest, size)
        return None, smallest

    def plan_info(self) -> Dict[str, Any]:
        if self.cpp is None:
            raise RuntimeError("plan() has not been called yet")
        return dict(self.cpp.plan_info())


class _RuntimeWrapper:
    """The base of the FlashInfer-style plan/run wrappers (decode, paged and ragged prefill,
    multi-level cascade): the caller's float workspace, the lazily built C++ runtime
    (``_cpp_class``, through :class:`_RuntimeHolder`), the last plan, and the members FlashInfer's
    wrappers share."""

    _cpp_class = ""

    def _cpp_args(self) -> Tuple[Any, ...]:
        """What ``_cpp_class`` takes before the bounds in its constructor and workspace_size (the
        cascade runtime: its number of levels); none for the others."""
        return ()

    def _init_runtime(self, float_workspace_buffer: Any, kv_layout: str, use_cuda_graph: bool, backend: str,
                      jit_args: Any, jit_kwargs: Any = None) -> Any:
        """The constructor's common checks and state; returns the workspace tensor."""
        U.check_kv_layout(kv_layout)
        U.check_backend(backend, getattr(float_workspace_buffer, "device", None))
        check_jit_kwargs(f"{type(self).__name__}: jit_kwargs", jit_kwargs)
        self._jit = jit_variant(jit_args, type(self).__name__)
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        if not ws.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous")
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._float_workspace_buffer = ws
        self._holder = _RuntimeHolder(self._cpp_class, ws, self._use_cuda_graph, self._cpp_args())
        self._planned: Optional[Dict[str, Any]] = None
        return ws

    @property
    def is_cuda_graph_enabled(self) -> bool:
        """True when built with ``use_cuda_graph=True``."""
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: Any, int_workspace_buffer: Any = None) -> None:
        """Replaces the workspace (the next ``plan()`` rebuilds the runtime over it).

        ``int_workspace_buffer`` is accepted for compatibility and unused (Tessera keeps its plan in
        the float workspace). Not allowed with ``use_cuda_graph``.
        """
        if self._use_cuda_graph:
            raise ValueError("reset_workspace_buffer: not allowed with use_cuda_graph=True (captured pointers)")
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        if not ws.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous")
        self._float_workspace_buffer = ws
        self._holder = _RuntimeHolder(self._cpp_class, ws, False, self._cpp_args())
        self._planned = None
        if load_ops() is not None:
            mark_static_address(ws)

    def end_forward(self) -> None:
        """Kept for compatibility with older FlashInfer code; does nothing."""

    def plan_info(self) -> Dict[str, Any]:
        """What the last plan decided (batch size, query tile, grid, work items, splits, ...)."""
        return self._holder.plan_info()

    def _jit_plan_args(self, variant: Any, sm_scale: Any) -> Tuple[Any, Any]:
        """plan()'s (variant, sm_scale): with jit_args the JIT variant (for the workspace's device)
        and 1 (its hooks scale the logits themselves), which exclude a VariantSpec or an sm_scale of
        the caller's; else the two as given."""
        if self._jit is None:
            return variant, sm_scale
        if variant is not None:
            raise ValueError(f"{type(self).__name__}.plan: variant={variant!r} with jit_args; the wrapper runs the "
                             "JIT variant of its constructor's jit_args, expected variant=None")
        if sm_scale is not None:
            raise ValueError(f"{type(self).__name__}.plan: sm_scale = {sm_scale!r} with jit_args; the JIT variant "
                             "scales its logits itself (pass the scale as one of its additional scalars), expected "
                             "None")
        return self._jit.spec(self._float_workspace_buffer.device), 1.0

    def _jit_planned(self) -> None:
        """After plan(): a JIT variant with additional parameters takes their values at each run(),
        so the plan's one-call fast run (which has only the placeholders) is dropped."""
        if self._jit is not None and self._jit.num_args and self._planned is not None:
            self._planned["run_fast"] = None

    def _set_jit_args(self, args: Any) -> None:
        """run()'s additional arguments: the JIT variant's parameter values for this run (an error
        without jit_args, as FlashInfer's default modules take none). Set before run()'s other
        checks: a run that then fails leaves them set (the next run sets its own)."""
        if self._jit is None:
            U.check_no_extra_args(args)
            return
        cpp = self._holder.cpp
        if cpp is None or self._planned is None:
            raise RuntimeError("run() before plan(): call plan() with this step's batch first")
        if compiling():
            raise NotImplementedError(f"{type(self).__name__}.run with jit_args under torch.compile: the JIT "
                                      "variant's arguments are set on the host before the launch; call run() "
                                      "outside the compiled region")
        device = self._float_workspace_buffer.device
        params = self._jit.run_params(type(self).__name__, args, device)
        cpp.set_variant_params(params)
        self._jit.remember(device, params)


def split_options(fixed_split_size: Any, disable_split_kv: Any, unit: int, name: str = "fixed_split_size") -> Tuple[str, int]:
    """FlashInfer's split options -> (split_kv mode, fixed split size in KV tokens)."""
    if disable_split_kv:
        return "none", 0
    if fixed_split_size is None or fixed_split_size == -1:
        return "auto", 0
    size = U.check_positive_int(name, fixed_split_size) * unit
    if size % 128 != 0:
        raise ValueError(
            f"{name} = {fixed_split_size} gives a split of {size} KV tokens; Tessera needs a positive multiple of 128"
        )
    return "fixed", size


class _KVScaleBuffer:
    """The dequantization scales of a wrapper's fp8 operands: FlashInfer passes k_scale / v_scale (and,
    for FP8 attention, q_scale) to run(), Tessera's runtime takes them in the plan. The plan gets
    one-element f32 device tensors (a host factor of 1 times these): K's and V's for an fp8 cache,
    q's too for an fp8 q. run() fills them with that call's scales, so every run reads the scales
    of its own call. An eager run skips a fill whose value has not changed; with use_cuda_graph
    every run fills, so a captured run holds its fills and a replay writes the scales of its
    capture, as FlashInfer's captured scales are. q's element is filled only by the runs of an FP8
    attention plan (with_q), so a 16-bit q costs no fill and a capture holds none for it."""

    _NAMES = ("k_scale", "v_scale", "q_scale")

    def __init__(self) -> None:
        self.buf: Optional[Any] = None  # f32 [3]: k's scale, v's scale, q's scale
        self.last: list = [None, None, None]

    def plan_kwargs(self, device: Any, with_q: bool = False) -> Dict[str, Any]:
        """The plan()'s scale keywords (q_scale_device with with_q: an FP8 attention plan); the
        buffer is made once per device and kept (captured runs hold its address)."""
        torch = U._torch()
        if self.buf is None or self.buf.device != device:
            self.buf = torch.ones(3, dtype=torch.float32, device=device)
            self.last = [1.0, 1.0, 1.0]
        kwargs = {"k_scale_device": self.buf[0:1], "v_scale_device": self.buf[1:2]}
        if with_q:
            kwargs["q_scale_device"] = self.buf[2:3]
        return kwargs

    def set(self, k_scale: Any, v_scale: Any, always: bool = False, q_scale: Any = None, with_q: bool = False) -> None:
        """Fills the buffer with run()'s scales: None (1.0), a finite float > 0, or a float32
        one-element tensor on the cache's device (copied on the stream, so graph-capturable).
        q_scale is read with with_q only (an FP8 attention plan; the caller refuses it otherwise)."""
        torch = U._torch()
        assert self.buf is not None
        values = (k_scale, v_scale, q_scale) if with_q else (k_scale, v_scale)
        for i, value in enumerate(values):
            name = self._NAMES[i]
            if value is None:
                value = 1.0
            if isinstance(value, torch.Tensor):
                if value.dtype != torch.float32 or value.numel() != 1:
                    raise ValueError(
                        f"{name} = <tensor {tuple(value.shape)} {value.dtype}>, expected a float or a float32 "
                        "tensor of one element (per-head scales go to the single-request functions)"
                    )
                U.check_same_device(name, value, "float_workspace_buffer", self.buf)
                self.buf[i : i + 1].copy_(value.reshape(1), non_blocking=True)
                self.last[i] = None
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be None, a float or a float32 tensor, got {type(value).__name__}")
            value = float(value)
            if not (value > 0.0 and value != float("inf")):
                raise ValueError(f"{name} = {value}, expected a finite scale > 0")
            if always or self.last[i] != value:
                self.buf[i : i + 1].fill_(value)
                self.last[i] = value


class _PrefixViews:
    """Views buf[:n] of a wrapper's preallocated buffers, made once per (buffer, n): a graph-mode
    plan() fills prefixes of its page-table buffers at every step, and slicing a tensor costs about a
    microsecond of host time. The buffers are the wrapper's for its whole life."""

    def __init__(self) -> None:
        self.views: Dict[Tuple[int, int], Any] = {}

    def get(self, buf: Any, n: int) -> Any:
        key = (id(buf), n)
        view = self.views.get(key)
        if view is None:
            if len(self.views) >= 256:
                self.views.clear()
            view = self.views[key] = buf[:n]
        return view


class _RopeOffsets:
    """The per-request RoPE offsets (plan()'s q_rope_offset / k_rope_offset) a plan points the
    kernels at: the wrapper keeps the tensors for the runs of the plan. With use_cuda_graph they are
    copied into two rows of a buffer made once (a captured run() has their address baked in, and the
    C++ runtime refuses a later plan whose variant points elsewhere)."""

    def __init__(self, use_cuda_graph: bool, max_batch: Optional[int]) -> None:
        self.use_cuda_graph = use_cuda_graph
        self.max_batch = max_batch
        self.graph_rows: Optional[Any] = None  # int32 [2, max_batch]: q's offsets, k's offsets
        self.kept: Tuple[Any, Any] = (None, None)

    def plan_tensors(self, q_offset: Any, k_offset: Any, batch: int, device: Any) -> Tuple[Any, Any]:
        """The tensors the plan passes (i32 [batch] on `device`, or None), kept until the next plan."""
        if self.use_cuda_graph and (q_offset is not None or k_offset is not None):
            torch = U._torch()
            if self.graph_rows is None:
                assert self.max_batch is not None
                self.graph_rows = torch.zeros((2, self.max_batch), dtype=torch.int32, device=device)
            rows = []
            for i, t in enumerate((q_offset, k_offset)):
                if t is None:
                    rows.append(None)
                    continue
                row = self.graph_rows[i, :batch]
                row.copy_(t, non_blocking=True)
                rows.append(row)
            q_offset, k_offset = rows
        self.kept = (q_offset, k_offset)
        return q_offset, k_offset
