"""Tracing of FlexAttention-style mods into CUDA source for Tessera's variant JIT.

A ``score_mod(score, b, h, q_idx, kv_idx)`` or ``mask_mod(b, h, q_idx, kv_idx)`` is a plain Python
function written with torch operations. It is called once with symbolic scalars (``Sym``): every
operator and torch function applied to them records one line of CUDA C++ (single assignment, so a
value used twice is computed once) and returns a new symbol; ``torch`` routes its functions here
through the ``__torch_function__`` protocol, so ``torch.where(..)`` or ``bias[h, q_idx]`` on a
captured tensor are seen too. The result is a device function with the signature the variant hooks
expect (tessera/variant.h, MaskMod / ScoreMod) plus the captured tensors, which travel as variant
parameters.

Semantics follow FlexAttention's element-wise view: ``b``, ``h``, ``q_idx``, ``kv_idx`` are 32-bit
integers, ``score`` and every floating-point value fp32; integer ``//`` and ``%`` round like Python
(toward negative infinity), ``/`` is true division (by a constant: a multiplication by its
reciprocal), ``torch.tanh`` is the GPU's ``tanh.approx`` (as the built-in soft-cap), and an integer
whose range the trace knows within 2^22 converts to float exactly with two ALU operations. Captured tensors (any of float32/16, bfloat16,
float64, int8..int64, uint8, bool) are read at their strides; an index outside a dimension wraps
once from the end like Python's negative indices and is then clamped into the dimension, so a read
never leaves the tensor (the value of an out-of-range read is unspecified, as in FlexAttention).
Values that cannot be traced — Python control flow on a traced value (``if``, ``and``, ``or``,
``not``, ``bool()``, ``int()``), indexing a Python list with one, slicing, an unsupported torch
function — raise ``ModTraceError`` naming the operation and the line of the user's function.
"""

from __future__ import annotations

import inspect
import linecache
import math
import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__: list = []  # private module

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The CPU tests set this to trace mods that capture host tensors and inspect the generated code
# (the kernels can only read device tensors, so attention never sets it).
_ALLOW_HOST_CAPTURES = False


class ModTraceError(NotImplementedError):
    """A score_mod / mask_mod uses a construct Tessera cannot compile (the message says which and
    where)."""


def _torch() -> Any:
    import torch

    return torch


def _torch_dir() -> str:
    return os.path.dirname(os.path.abspath(_torch().__file__))


def _user_location() -> str:
    """' at <file>:<line>: <source>' of the innermost frame outside tessera and torch (the user's
    mod, or a helper it called)."""
    torch_dir = _torch_dir()
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep) and not path.startswith(torch_dir + os.sep):
            line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            where = f" at {f.f_code.co_filename}:{f.f_lineno}"
            return where + (f": {line}" if line else "")
        f = f.f_back
    return ""


def _error(what: str) -> ModTraceError:
    return ModTraceError(f"cannot trace {what}{_user_location()}")


# --- kinds and literals ------------------------------------------------------------------------

_BOOL, _INT, _FLOAT = "bool", "int", "float"
_C_TYPE = {_BOOL: "bool", _INT: "int", _FLOAT: "float"}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _float_literal(x: float) -> str:
    if math.isnan(x):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(x) or abs(x) > 3.4028234663852886e38:
        return "__int_as_float(0x7f800000)" if x > 0 else "__int_as_float(0xff800000)"
    text = repr(float(x))
    return f"{text}f" if ("e" in text or "." in text) else f"{text}.0f"


def _kind_of_dtype(dtype: Any) -> str:
    torch = _torch()
    if dtype == torch.bool:
        return _BOOL
    if dtype.is_floating_point:
        return _FLOAT
    return _INT


# Captured-tensor element types: torch dtype -> (C type, expression converting `x` to its kind).
def _element_types() -> Dict[Any, Tuple[str, str]]:
    torch = _torch()
    return {
        torch.float32: ("float", "{x}"),
        torch.float64: ("double", "(float){x}"),
        torch.float16: ("__half", "__half2float({x})"),
        torch.bfloat16: ("__nv_bfloat16", "__bfloat162float({x})"),
        torch.int8: ("signed char", "(int){x}"),
        torch.int16: ("short", "(int){x}"),
        torch.int32: ("int", "{x}"),
        torch.int64: ("long long", "(int){x}"),
        torch.uint8: ("unsigned char", "(int){x}"),
        torch.bool: ("unsigned char", "({x} != 0)"),
    }


# --- the trace ---------------------------------------------------------------------------------


class Capture:
    """A tensor a mod reads, passed to the kernel as the variant parameter `name`: a byte view of
    `tensor` (the captured one, or a contiguous copy when its last dimension is strided), read at
    `tensor`'s strides by the generated code."""

    def __init__(self, name: str, original: Any) -> None:
        self.name = name
        self.original = original
        self.tensor = original if original.dim() == 0 or original.stride(-1) == 1 else original.contiguous()

    def byte_view(self) -> Any:
        """The uint8 view the kernel receives (its first byte is element 0)."""
        t = self.tensor.reshape(1) if self.tensor.dim() == 0 else self.tensor
        return t.view(_torch().uint8)


class _Trace:
    """The lines of one traced function and the tensors captured by every function of a variant."""

    def __init__(self, captures: List[Capture], max_captures: int) -> None:
        self.lines: List[str] = []
        self.captures = captures
        self.max_captures = max_captures
        self.used_inputs: set = set()
        self._next = 0

    def emit(self, kind: str, expr: str, range_: Optional[Tuple[int, int]] = None,
             form: Optional[Tuple[Any, ...]] = None) -> "Sym":
        name = f"t{self._next}"
        self._next += 1
        self.lines.append(f"  const {_C_TYPE[kind]} {name} = {expr};")
        return Sym(self, name, kind, None, range_ if kind == _INT else None, form)

    def capture(self, tensor: Any) -> Capture:
        for c in self.captures:
            if c.original is tensor:
                return c
        if len(self.captures) >= self.max_captures:
            raise _error(f"more than {self.max_captures} captured tensors (the variant's parameter limit)")
        c = Capture(f"cap{len(self.captures)}", tensor)
        self.captures.append(c)
        return c


class Sym:
    """A traced scalar: a C expression (a literal, an input or a single-assignment temporary) and
    its kind (bool, int or float)."""

    __slots__ = ("_t", "code", "kind", "value", "range", "form")

    def __init__(self, trace: _Trace, code: str, kind: str, value: Any = None,
                 range_: Optional[Tuple[int, int]] = None, form: Optional[Tuple[Any, ...]] = None) -> None:
        self._t = trace
        self.code = code
        self.kind = kind
        self.value = value  # the Python value of a literal, else None
        # What the value is, where it is one of the few shapes _lowering looks for (see there).
        self.form = form
        # Integers: the closed interval the value lies in, where the trace can tell (inputs'
        # extents, literals, + - * of known intervals), else None.
        if range_ is None and kind == _INT and isinstance(value, int):
            range_ = (value, value)
        self.range = range_

    # torch routes torch.* functions and Tensor methods given a Sym here.
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        trace = _find_trace(args, kwargs)
        name = getattr(func, "__name__", repr(func))
        return _dispatch(trace, name, list(args), dict(kwargs), f"torch.{name.strip('_')}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # protocol probes (hasattr) must see a plain missing attribute
        if name not in _HANDLERS:
            raise _error(f"the method .{name}() of a traced value (not supported)")

        def method(*args: Any, **kwargs: Any) -> Any:
            return _dispatch(self._t, name, [self, *args], kwargs, f".{name}()")

        return method

    # Python operators.
    def __add__(self, o: Any) -> "Sym": return _arith(self._t, "+", self, o)
    def __radd__(self, o: Any) -> "Sym": return _arith(self._t, "+", o, self)
    def __sub__(self, o: Any) -> "Sym": return _arith(self._t, "-", self, o)
    def __rsub__(self, o: Any) -> "Sym": return _arith(self._t, "-", o, self)
    def __mul__(self, o: Any) -> "Sym": return _arith(self._t, "*", self, o)
    def __rmul__(self, o: Any) -> "Sym": return _arith(self._t, "*", o, self)
    def __truediv__(self, o: Any) -> "Sym": return _truediv(self._t, self, o)
    def __rtruediv__(self, o: Any) -> "Sym": return _truediv(self._t, o, self)
    def __floordiv__(self, o: Any) -> "Sym": return _floordiv(self._t, self, o)
    def __rfloordiv__(self, o: Any) -> "Sym": return _floordiv(self._t, o, self)
    def __mod__(self, o: Any) -> "Sym": return _mod(self._t, self, o)
    def __rmod__(self, o: Any) -> "Sym": return _mod(self._t, o, self)
    def __pow__(self, o: Any) -> "Sym": return _pow(self._t, self, o)
    def __rpow__(self, o: Any) -> "Sym": return _pow(self._t, o, self)
    def __and__(self, o: Any) -> "Sym": return _logic(self._t, "&", self, o)
    def __rand__(self, o: Any) -> "Sym": return _logic(self._t, "&", o, self)
    def __or__(self, o: Any) -> "Sym": return _logic(self._t, "|", self, o)
    def __ror__(self, o: Any) -> "Sym": return _logic(self._t, "|", o, self)
    def __xor__(self, o: Any) -> "Sym": return _logic(self._t, "^", self, o)
    def __rxor__(self, o: Any) -> "Sym": return _logic(self._t, "^", o, self)
    def __lshift__(self, o: Any) -> "Sym": return _shift(self._t, "<<", self, o)
    def __rshift__(self, o: Any) -> "Sym": return _shift(self._t, ">>", self, o)
    def __eq__(self, o: Any) -> "Sym": return _compare(self._t, "==", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> "Sym": return _compare(self._t, "!=", self, o)  # type: ignore[override]
    def __lt__(self, o: Any) -> "Sym": return _compare(self._t, "<", self, o)
    def __le__(self, o: Any) -> "Sym": return _compare(self._t, "<=", self, o)
    def __gt__(self, o: Any) -> "Sym": return _compare(self._t, ">", self, o)
    def __ge__(self, o: Any) -> "Sym": return _compare(self._t, ">=", self, o)
    def __neg__(self) -> "Sym": return _neg(self._t, self)
    def __pos__(self) -> "Sym": return self
    def __invert__(self) -> "Sym": return _invert(self._t, self)
    def __abs__(self) -> "Sym": return _unary_math(self._t, "abs", self)

    __hash__ = None  # type: ignore[assignment]

    # Constructs that need a concrete value.
    def __bool__(self) -> bool:
        raise _error("Python control flow on a traced value (if / and / or / not / bool()); use torch.where, & and |")

    def __int__(self) -> int:
        raise _error("int() of a traced value")

    def __float__(self) -> float:
        raise _error("float() of a traced value")

    def __index__(self) -> int:
        raise _error("a traced value used as a Python index (index a captured torch tensor instead of a list)")

    def __iter__(self) -> Any:
        raise _error("iteration over a traced value")

    def __len__(self) -> int:
        raise _error("len() of a traced value")

    def __getitem__(self, index: Any) -> Any:
        raise _error("indexing a traced scalar")

    def __repr__(self) -> str:
        return f"<traced {self.kind} {self.code}>"


class TensorRef:
    """A captured tensor indexed by fewer indices than it has dimensions (``table[h]`` before
    ``[q_idx]``)."""

    def __init__(self, trace: _Trace, tensor: Any, indices: Tuple[Any, ...]) -> None:
        self._t = trace
        self.tensor = tensor
        self.indices = indices

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        raise _error(f"torch.{getattr(func, '__name__', func)} of a partly indexed captured tensor "
                     "(index every dimension)")

    def __getitem__(self, index: Any) -> Any:
        return _index(self._t, self.tensor, self.indices, index)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _error(f"a captured tensor of {self.tensor.dim()} dimensions indexed with {len(self.indices)} "
                     "indices, then used as a value (index every dimension)")


def _find_trace(args: Sequence[Any], kwargs: Dict[str, Any]) -> _Trace:
    stack = list(args) + list(kwargs.values())
    while stack:
        a = stack.pop()
        if isinstance(a, (Sym, TensorRef)):
            return a._t
        if isinstance(a, (list, tuple)):
            stack.extend(a)
    raise AssertionError("__torch_function__ without a traced argument")  # pragma: no cover


def _lift(t: _Trace, x: Any) -> Sym:
    """A traced value of x: a Sym, a Python scalar (a literal) or a one-element captured tensor."""
    if isinstance(x, Sym):
        return x
    if isinstance(x, bool):
        return Sym(t, "true" if x else "false", _BOOL, x)
    if isinstance(x, int):
        if not _INT32_MIN <= x <= _INT32_MAX:
            raise _error(f"the integer constant {x} (traced integers are 32-bit)")
        return Sym(t, str(x) if x >= 0 else f"({x})", _INT, x)
    if isinstance(x, float):
        return Sym(t, _float_literal(x), _FLOAT, x)
    torch = _torch()
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise _error(f"a captured tensor of shape {tuple(x.shape)} used as a value (index it with b, h, "
                         "q_idx or kv_idx)")
        if x.device.type == "cpu":  # a host scalar: its value now, compiled in
            return _lift(t, x.item())
        return _index(t, x.reshape(()), (), ())
    if isinstance(x, TensorRef):
        raise _error(f"a captured tensor of {x.tensor.dim()} dimensions indexed with {len(x.indices)} indices, "
                     "then used as a value (index every dimension)")
    raise _error(f"a value of type {type(x).__name__} ({x!r})")


def _promote(*xs: Sym) -> str:
    kinds = {x.kind for x in xs}
    if _FLOAT in kinds:
        return _FLOAT
    if _INT in kinds:
        return _INT
    return _BOOL


# Integers of magnitude <= 2^22 convert to float with two full-rate ALU operations (tessera_i2f),
# instead of the quarter-rate I2F conversion; a traced ALiBi-style bias converts once per score.
_SMALL_INT = 1 << 22
# How far past a block-rounded length the kernels may evaluate a mod (a CTA tile is <= 256 wide).
_TILE_SLACK = 256


def _as(x: Sym, kind: str) -> str:
    if x.kind == kind:
        return x.code
    if kind == _BOOL:
        return f"({x.code} != 0)"
    if kind == _FLOAT and x.kind == _INT and x.range is not None and -_SMALL_INT <= x.range[0] and \
            x.range[1] <= _SMALL_INT:
        return f"tessera_i2f({x.code})"
    return f"({_C_TYPE[kind]})({x.code})"


def _int_range(op: str, a: Sym, b: Sym) -> Optional[Tuple[int, int]]:
    """The interval of a op b for + - * of known integer intervals (None: unknown, or beyond 32 bits)."""
    if a.range is None or b.range is None:
        return None
    (a0, a1), (b0, b1) = a.range, b.range
    if op == "+":
        r = (a0 + b0, a1 + b1)
    elif op == "-":
        r = (a0 - b1, a1 - b0)
    elif op == "*":
        products = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        r = (min(products), max(products))
    else:
        return None
    return r if _INT32_MIN <= r[0] and r[1] <= _INT32_MAX else None


# --- built-in lowering -------------------------------------------------------------------------
#
# Some mods are common enough to have built-in forms in the kernels, which run them with fewer
# instructions (and, for the masks, ahead-of-time kernels): the causal mask q_idx >= kv_idx and a
# causal sliding window (q_idx >= kv_idx) & (q_idx - kv_idx <= W); soft-capping,
# cap * tanh(score / cap) (the kernels fold 1 / cap and cap into their own scale multiplies and,
# in bf16, need no running max); ALiBi, score + slopes[h] * (kv_idx - q_idx) (the kernels add it
# as a per-row term and per-column constants). The trace records in Sym.form what a value is
# when it is one of the steps towards these, and _lowering / _mask_lowering read the result's:
#   ("score",) ("h",)                     the inputs score and h
#   ("lin", cq, ckv, c)                   the integer cq * q_idx + ckv * kv_idx + c (q_idx, kv_idx,
#                                         integer constants, + - and * by a constant; also
#                                         converted to float)
#   ("head_table", capture, size)         t[h] of a captured contiguous 1-D float32 tensor t
#   ("alibi_bias", capture, size, sign)   t[h] * (kv_idx - q_idx) (times sign)
#   ("scaled_score", k)                   score * k or score / (1 / k), k > 0
#   ("tanh_scaled_score", k)              tanh(score * k)
#   ("soft_cap", cap)                     cap * tanh(score / cap)
#   ("alibi", capture, size)              score + t[h] * (kv_idx - q_idx)
#   ("distance", lo, hi)                  a boolean: lo <= q_idx - kv_idx <= hi (None: unbounded),
#                                         from comparisons of linear forms and their &
# Anything else (another constant, another index, an extra term) leaves the form None and the
# mod runs as traced.


def _is_zero(x: Sym) -> bool:
    return x.value is not None and not isinstance(x.value, bool) and x.value == 0


def _positive_constant(x: Sym) -> Optional[float]:
    v = x.value
    if v is None or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def _lin(x: Sym) -> Optional[Tuple[int, int, int]]:
    """(cq, ckv, c) of an integer linear in q_idx and kv_idx, or None."""
    if x.form is not None and x.form[0] == "lin":
        return x.form[1:]
    if x.kind == _INT and isinstance(x.value, int) and not isinstance(x.value, bool):
        return (0, 0, x.value)
    return None


def _arith_form(op: str, a: Sym, b: Sym) -> Optional[Tuple[Any, ...]]:
    fa, fb = a.form, b.form
    la, lb = _lin(a), _lin(b)
    if la is not None and lb is not None and op in "+-*":
        if op == "+":
            return ("lin",) + tuple(x + y for x, y in zip(la, lb))
        if op == "-":
            return ("lin",) + tuple(x - y for x, y in zip(la, lb))
        if la[:2] == (0, 0):
            return ("lin",) + tuple(la[2] * y for y in lb)
        if lb[:2] == (0, 0):
            return ("lin",) + tuple(x * lb[2] for x in la)
        return None
    if op in "+-" and _is_zero(b):
        return fa
    if op == "+" and _is_zero(a):
        return fb
    if op == "*":
        for x, y in ((a, b), (b, a)):
            fx, ly = x.form, _lin(y)
            if fx is not None and fx[0] == "head_table" and ly in ((-1, 1, 0), (1, -1, 0)):
                return ("alibi_bias", fx[1], fx[2], 1 if ly == (-1, 1, 0) else -1)
            k = _positive_constant(y)
            if k is not None and fx == ("score",):
                return ("scaled_score", k)
            if k is not None and fx is not None and fx[0] == "tanh_scaled_score" and abs(k * fx[1] - 1.0) <= 1e-6:
                return ("soft_cap", k)
    if op == "+":
        for x, y in ((a, b), (b, a)):
            if x.form == ("score",) and y.form is not None and y.form[0] == "alibi_bias" and y.form[3] == 1:
                return ("alibi", y.form[1], y.form[2])
    if op == "-" and fa == ("score",) and fb is not None and fb[0] == "alibi_bias" and fb[3] == -1:
        return ("alibi", fb[1], fb[2])
    return None


def _compare_form(op: str, a: Sym, b: Sym) -> Optional[Tuple[Any, ...]]:
    """("distance", lo, hi) of a comparison of two linear forms that depends on d = q_idx - kv_idx
    only: a - b = s * d + c with s = +-1."""
    la, lb = _lin(a), _lin(b)
    if la is None or lb is None:
        return None
    cq, ckv, c = (x - y for x, y in zip(la, lb))
    if cq != -ckv or cq not in (1, -1):
        return None
    if cq == -1:  # -d + c OP 0  <=>  d OP' c with the comparison mirrored
        op = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "==": "==", "!=": "!="}[op]
        x = c
    else:  # d + c OP 0  <=>  d OP -c
        x = -c
    return {">=": ("distance", x, None), ">": ("distance", x + 1, None), "<=": ("distance", None, x),
            "<": ("distance", None, x - 1), "==": ("distance", x, x)}.get(op)


def _and_form(a: Sym, b: Sym) -> Optional[Tuple[Any, ...]]:
    if a.value is True:
        return b.form
    if b.value is True:
        return a.form
    fa, fb = a.form, b.form
    if fa is None or fb is None or fa[0] != "distance" or fb[0] != "distance":
        return None
    los = [x for x in (fa[1], fb[1]) if x is not None]
    his = [x for x in (fa[2], fb[2]) if x is not None]
    return ("distance", max(los) if los else None, min(his) if his else None)


def _lowering(out: Sym, num_heads: Optional[int]) -> Optional[Tuple[Any, ...]]:
    """The built-in form of a score mod's result: ("soft_cap", cap), ("alibi", capture name) for
    a slope table of num_heads entries, or None."""
    f = out.form
    if f is None:
        return None
    if f[0] == "soft_cap":
        return f
    if f[0] == "alibi" and num_heads is not None and f[2] == num_heads:
        return ("alibi", f[1])
    return None


def _mask_lowering(out: Sym) -> Optional[Tuple[Any, ...]]:
    """The built-in form of a mask mod's result: ("causal", window_left) for
    0 <= q_idx - kv_idx (<= window_left; -1 for none), or None."""
    f = out.form
    if f is None or f[0] != "distance" or f[1] != 0 or (f[2] is not None and not 0 <= f[2] < 2**30):
        return None
    return ("causal", -1 if f[2] is None else f[2])


def _arith(t: _Trace, op: str, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    kind = _promote(a, b)
    if kind == _BOOL:
        kind = _INT
    out = t.emit(kind, f"{_as(a, kind)} {op} {_as(b, kind)}", _int_range(op, a, b) if kind == _INT else None)
    out.form = _arith_form(op, a, b)
    return out


def _truediv(t: _Trace, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if b.value is not None and not isinstance(b.value, bool) and b.value != 0 and math.isfinite(1.0 / b.value):
        # By a constant: a multiplication by its reciprocal (within an ulp; an IEEE division is a
        # dozen instructions per score).
        out = t.emit(_FLOAT, f"{_as(a, _FLOAT)} * {_float_literal(1.0 / b.value)}")
        out.form = _arith_form("*", a, _lift(t, 1.0 / b.value))
        return out
    return t.emit(_FLOAT, f"{_as(a, _FLOAT)} / {_as(b, _FLOAT)}")


def _floordiv(t: _Trace, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if _promote(a, b) == _FLOAT:
        return t.emit(_FLOAT, f"floorf({_as(a, _FLOAT)} / {_as(b, _FLOAT)})")
    return t.emit(_INT, f"tessera_floordiv({_as(a, _INT)}, {_as(b, _INT)})")


def _mod(t: _Trace, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if _promote(a, b) == _FLOAT:
        return t.emit(_FLOAT, f"tessera_fremainder({_as(a, _FLOAT)}, {_as(b, _FLOAT)})")
    return t.emit(_INT, f"tessera_remainder({_as(a, _INT)}, {_as(b, _INT)})")


def _fmod(t: _Trace, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if _promote(a, b) == _FLOAT:
        return t.emit(_FLOAT, f"fmodf({_as(a, _FLOAT)}, {_as(b, _FLOAT)})")
    return t.emit(_INT, f"{_as(a, _INT)} % {_as(b, _INT)}")


def _pow(t: _Trace, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if _promote(a, b) != _FLOAT and b.code.isdigit():
        return t.emit(_INT, f"tessera_ipow({_as(a, _INT)}, {b.code})")
    return t.emit(_FLOAT, f"powf({_as(a, _FLOAT)}, {_as(b, _FLOAT)})")


def _logic(t: _Trace, op: str, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    kind = _promote(a, b)
    if kind == _FLOAT:
        raise _error(f"'{op}' on floating-point values")
    if kind == _BOOL:
        c_op = {"&": "&&", "|": "||", "^": "!="}[op]
        return t.emit(_BOOL, f"{a.code} {c_op} {b.code}", form=_and_form(a, b) if op == "&" else None)
    return t.emit(_INT, f"{_as(a, _INT)} {op} {_as(b, _INT)}")


def _shift(t: _Trace, op: str, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    if _promote(a, b) == _FLOAT:
        raise _error(f"'{op}' on floating-point values")
    return t.emit(_INT, f"{_as(a, _INT)} {op} {_as(b, _INT)}")


def _compare(t: _Trace, op: str, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    kind = _promote(a, b)
    return t.emit(_BOOL, f"{_as(a, kind)} {op} {_as(b, kind)}", form=_compare_form(op, a, b))


def _neg(t: _Trace, a: Any) -> Sym:
    a = _lift(t, a)
    if a.kind == _BOOL:
        raise _error("negation (-) of a boolean (use ~ or torch.logical_not)")
    return t.emit(a.kind, f"-{a.code}", (-a.range[1], -a.range[0]) if a.range is not None else None)


def _invert(t: _Trace, a: Any) -> Sym:
    a = _lift(t, a)
    if a.kind == _FLOAT:
        raise _error("~ of a floating-point value")
    return t.emit(a.kind, f"!{a.code}" if a.kind == _BOOL else f"~{a.code}")


def _logical(t: _Trace, op: str, *xs: Any) -> Sym:
    ys = [_as(_lift(t, x), _BOOL) for x in xs]
    if op == "not":
        return t.emit(_BOOL, f"!{ys[0]}")
    c_op = {"and": "&&", "or": "||", "xor": "!="}[op]
    form = _and_form(_lift(t, xs[0]), _lift(t, xs[1])) if op == "and" else None
    return t.emit(_BOOL, f"{ys[0]} {c_op} {ys[1]}", form=form)


# Float functions of one argument: name -> C expression of `x` (a float).
_FLOAT_FUNCS = {
    "exp": "expf({x})", "exp2": "exp2f({x})", "expm1": "expm1f({x})", "log": "logf({x})", "log2": "log2f({x})",
    "log10": "log10f({x})", "log1p": "log1pf({x})", "sqrt": "sqrtf({x})", "rsqrt": "rsqrtf({x})",
    "sin": "sinf({x})", "cos": "cosf({x})", "tan": "tanf({x})", "asin": "asinf({x})", "acos": "acosf({x})",
    "atan": "atanf({x})", "sinh": "sinhf({x})", "cosh": "coshf({x})", "tanh": "tessera_tanh({x})",
    "erf": "erff({x})", "erfc": "erfcf({x})", "sigmoid": "__fdividef(1.0f, 1.0f + expf(-{x}))",
    "reciprocal": "1.0f / {x}",
    "square": "{x} * {x}", "relu": "fmaxf({x}, 0.0f)", "softplus": "log1pf(expf({x}))",
}
# Functions that keep an integer an integer: name -> (int expression, float expression).
_KIND_FUNCS = {
    "abs": ("abs({x})", "fabsf({x})"), "floor": ("{x}", "floorf({x})"), "ceil": ("{x}", "ceilf({x})"),
    "round": ("{x}", "rintf({x})"), "trunc": ("{x}", "truncf({x})"),
    "sign": ("(({x} > 0) - ({x} < 0))", "(float)(({x} > 0.0f) - ({x} < 0.0f))"),
}


def _unary_math(t: _Trace, name: str, x: Any) -> Sym:
    x = _lift(t, x)
    if name in _KIND_FUNCS:
        kind = _INT if x.kind != _FLOAT else _FLOAT
        template = _KIND_FUNCS[name][0 if kind == _INT else 1]
        if template == "{x}":
            return x if x.kind == kind else t.emit(kind, _as(x, kind))
        return t.emit(kind, template.format(x=f"({_as(x, kind)})"))
    expr = _FLOAT_FUNCS[name].format(x=f"({_as(x, _FLOAT)})")
    out = t.emit(_FLOAT, expr)
    if name == "tanh" and x.form is not None and x.form[0] == "scaled_score":
        out.form = ("tanh_scaled_score", x.form[1])
    return out


def _minmax(t: _Trace, name: str, a: Any, b: Any) -> Sym:
    a, b = _lift(t, a), _lift(t, b)
    kind = _promote(a, b)
    if kind == _FLOAT:
        fn = "fminf" if name == "min" else "fmaxf"
        return t.emit(_FLOAT, f"{fn}({_as(a, _FLOAT)}, {_as(b, _FLOAT)})")
    kind = _INT
    return t.emit(kind, f"{name}({_as(a, kind)}, {_as(b, kind)})")


def _clamp(t: _Trace, x: Any, lo: Any = None, hi: Any = None) -> Sym:
    if lo is None and hi is None:
        raise _error("torch.clamp without min and max")
    y = _lift(t, x)
    if lo is not None:
        y = _minmax(t, "max", y, lo)
    if hi is not None:
        y = _minmax(t, "min", y, hi)
    return y


def _where(t: _Trace, cond: Any, a: Any, b: Any) -> Sym:
    c, a, b = _lift(t, cond), _lift(t, a), _lift(t, b)
    if c.kind != _BOOL:
        raise _error("torch.where with a non-boolean condition")
    kind = _promote(a, b)
    return t.emit(kind, f"{c.code} ? {_as(a, kind)} : {_as(b, kind)}")


def _convert(t: _Trace, x: Any, dtype: Any) -> Sym:
    torch = _torch()
    x = _lift(t, x)
    if not isinstance(dtype, torch.dtype):
        raise _error(f"a conversion to {dtype!r} (give a torch.dtype)")
    kind = _kind_of_dtype(dtype)
    if kind == _FLOAT and x.kind == _INT and x.form is not None and x.form[0] == "lin":
        # Exact for positions below 2^24, where the kernels' ALiBi computes the same value.
        return t.emit(_FLOAT, _as(x, _FLOAT), form=x.form)
    if dtype == torch.float16:
        return t.emit(_FLOAT, f"__half2float(__float2half_rn({_as(x, _FLOAT)}))")
    if dtype == torch.bfloat16:
        return t.emit(_FLOAT, f"__bfloat162float(__float2bfloat16_rn({_as(x, _FLOAT)}))")
    return x if x.kind == kind else t.emit(kind, _as(x, kind))


def _constant_like(t: _Trace, like: Any, value: Any, dtype: Any) -> Sym:
    like = _lift(t, like)
    kind = like.kind if dtype is None else _kind_of_dtype(dtype)
    v = _lift(t, value)
    if v.kind != kind and v.value is not None:  # a literal of the wanted kind (and_masks' True)
        return _lift(t, {_BOOL: bool, _INT: int, _FLOAT: float}[kind](v.value))
    return v if v.kind == kind else t.emit(kind, _as(v, kind))


def _index(t: _Trace, tensor: Any, done: Tuple[Any, ...], index: Any) -> Any:
    """tensor[done + index]: a load once every dimension has an index, else a TensorRef."""
    torch = _torch()
    items = index if isinstance(index, tuple) else (index,)
    indices = list(done)
    for i in items:
        if isinstance(i, Sym):
            if i.kind == _FLOAT:
                raise _error("indexing a captured tensor with a floating-point value")
            if i.kind == _BOOL:
                raise _error("indexing a captured tensor with a boolean (masks are not indices)")
            indices.append(i)
        elif isinstance(i, bool) or not isinstance(i, int):
            raise _error(f"indexing a captured tensor with {i!r} (only b, h, q_idx, kv_idx, integer "
                         "expressions of them and integer constants)")
        else:
            indices.append(_lift(t, i))
    if len(indices) > tensor.dim():
        raise _error(f"{len(indices)} indices into a captured tensor of {tensor.dim()} dimensions")
    if len(indices) < tensor.dim():
        return TensorRef(t, tensor, tuple(indices))
    if tensor.device.type != "cuda" and not _ALLOW_HOST_CAPTURES:
        raise _error(f"a captured tensor on {tensor.device} (captured tensors must be on the GPU of the query)")
    if tensor.numel() == 0:
        raise _error("a read from an empty captured tensor")
    types = _element_types()
    if tensor.dtype not in types:
        raise _error(f"a captured tensor of dtype {tensor.dtype}")
    c_type, convert = types[tensor.dtype]
    cap = t.capture(tensor)
    tensor = cap.tensor
    terms = []
    for d, i in enumerate(indices):
        size, stride = int(tensor.shape[d]), int(tensor.stride(d))
        if size == 1 or stride == 0:
            continue  # every index reads the same element
        terms.append(f"(long long)tessera_clamp_index({i.code}, {size}) * {stride}LL")
    offset = " + ".join(terms) if terms else "0"
    kind = _kind_of_dtype(tensor.dtype)
    raw = f"reinterpret_cast<const {c_type}*>(params.{cap.name})[{offset}]"
    form = None
    if tensor.dim() == 1 and tensor.dtype == torch.float32 and indices[0].form == ("h",) and \
            tensor.stride(0) == 1:
        form = ("head_table", cap.name, int(tensor.shape[0]))
    return t.emit(kind, convert.format(x=f"({raw})"), form=form)


def _getitem(t: _Trace, args: List[Any], kwargs: Dict[str, Any]) -> Any:
    torch = _torch()
    base, index = args[0], args[1]
    if isinstance(base, torch.Tensor):
        return _index(t, base, (), index)
    raise _error("indexing a traced value")


# --- dispatch ----------------------------------------------------------------------------------

def _binary(fn: Callable[..., Sym], swap: bool = False) -> Callable[..., Sym]:
    def h(t: _Trace, a: List[Any], k: Dict[str, Any]) -> Sym:
        x, y = a[0], a[1] if len(a) > 1 else k.get("other")
        if "alpha" in k:  # torch.add / torch.sub(x, y, alpha=)
            y = _arith(t, "*", y, k["alpha"])
        return fn(t, y, x) if swap else fn(t, x, y)

    return h


def _arith_op(op: str) -> Callable[..., Sym]:
    return lambda t, a, b: _arith(t, op, a, b)


def _compare_op(op: str) -> Callable[..., Sym]:
    return lambda t, a, b: _compare(t, op, a, b)


def _logic_op(op: str) -> Callable[..., Sym]:
    return lambda t, a, b: _logic(t, op, a, b)


def _new_constant(value: Any) -> Callable[..., Sym]:
    def h(t: _Trace, a: List[Any], k: Dict[str, Any]) -> Sym:
        return _constant_like(t, a[0], value, k.get("dtype"))

    return h


def _full(t: _Trace, a: List[Any], k: Dict[str, Any]) -> Sym:
    value = a[2] if len(a) > 2 else k.get("fill_value")
    return _constant_like(t, a[0], value, k.get("dtype"))


def _full_like(t: _Trace, a: List[Any], k: Dict[str, Any]) -> Sym:
    value = a[1] if len(a) > 1 else k.get("fill_value")
    return _constant_like(t, a[0], value, k.get("dtype"))


def _to(t: _Trace, a: List[Any], k: Dict[str, Any]) -> Sym:
    torch = _torch()
    dtype = k.get("dtype")
    for x in a[1:]:
        if isinstance(x, torch.dtype):
            dtype = x
    if dtype is None:
        return _lift(t, a[0])  # .to(device) and the like: a no-op on a scalar
    return _convert(t, a[0], dtype)


def _make_handlers() -> Dict[str, Callable[[_Trace, List[Any], Dict[str, Any]], Any]]:
    h: Dict[str, Callable[[_Trace, List[Any], Dict[str, Any]], Any]] = {}
    for names, fn in (
        (("add", "__add__", "__iadd__"), _arith_op("+")), (("sub", "subtract", "__sub__", "__isub__"), _arith_op("-")),
        (("mul", "multiply", "__mul__", "__imul__"), _arith_op("*")),
        (("div", "divide", "true_divide", "__truediv__", "__div__", "__itruediv__"), _truediv),
        (("floor_divide", "__floordiv__", "__ifloordiv__"), _floordiv),
        (("remainder", "__mod__", "__imod__"), _mod), (("fmod",), _fmod), (("pow", "__pow__", "__ipow__"), _pow),
        (("__and__", "bitwise_and", "__iand__"), _logic_op("&")), (("__or__", "bitwise_or", "__ior__"), _logic_op("|")),
        (("__xor__", "bitwise_xor", "__ixor__"), _logic_op("^")),
        (("eq", "__eq__"), _compare_op("==")), (("ne", "not_equal", "__ne__"), _compare_op("!=")),
        (("lt", "less", "__lt__"), _compare_op("<")), (("le", "less_equal", "__le__"), _compare_op("<=")),
        (("gt", "greater", "__gt__"), _compare_op(">")), (("ge", "greater_equal", "__ge__"), _compare_op(">=")),
        (("minimum", "fmin"), lambda t, a, b: _minmax(t, "min", a, b)),
        (("maximum", "fmax"), lambda t, a, b: _minmax(t, "max", a, b)),
        (("logical_and",), lambda t, a, b: _logical(t, "and", a, b)),
        (("logical_or",), lambda t, a, b: _logical(t, "or", a, b)),
        (("logical_xor",), lambda t, a, b: _logical(t, "xor", a, b)),
        (("__lshift__", "bitwise_left_shift"), lambda t, a, b: _shift(t, "<<", a, b)),
        (("__rshift__", "bitwise_right_shift"), lambda t, a, b: _shift(t, ">>", a, b)),
    ):
        for n in names:
            h[n] = _binary(fn)
    for n, op in (("__radd__", "+"), ("__rsub__", "-"), ("__rmul__", "*")):
        h[n] = _binary(_arith_op(op), swap=True)
    h["rsub"] = _binary(_arith_op("-"), swap=True)
    h["__rtruediv__"] = h["__rdiv__"] = _binary(_truediv, swap=True)
    h["__rfloordiv__"] = _binary(_floordiv, swap=True)
    h["__rmod__"] = _binary(_mod, swap=True)
    h["__rpow__"] = _binary(_pow, swap=True)
    h["__rand__"] = _binary(_logic_op("&"), swap=True)
    h["__ror__"] = _binary(_logic_op("|"), swap=True)
    h["__rxor__"] = _binary(_logic_op("^"), swap=True)
    for n in list(_FLOAT_FUNCS) + list(_KIND_FUNCS):
        h[n] = (lambda name: lambda t, a, k: _unary_math(t, name, a[0]))(n)
    h["__abs__"] = h["absolute"] = h["abs"]
    h["special_expit"] = h["sigmoid"]
    h["neg"] = h["negative"] = h["__neg__"] = lambda t, a, k: _neg(t, a[0])
    h["positive"] = h["__pos__"] = lambda t, a, k: _lift(t, a[0])
    h["bitwise_not"] = h["__invert__"] = lambda t, a, k: _invert(t, a[0])
    h["logical_not"] = lambda t, a, k: _logical(t, "not", a[0])
    h["isnan"] = lambda t, a, k: t.emit(_BOOL, f"isnan({_as(_lift(t, a[0]), _FLOAT)})")
    h["isinf"] = lambda t, a, k: t.emit(_BOOL, f"isinf({_as(_lift(t, a[0]), _FLOAT)})")
    h["isfinite"] = lambda t, a, k: t.emit(_BOOL, f"isfinite({_as(_lift(t, a[0]), _FLOAT)})")
    h["clamp"] = h["clip"] = lambda t, a, k: _clamp(
        t, a[0], a[1] if len(a) > 1 else k.get("min"), a[2] if len(a) > 2 else k.get("max"))
    h["clamp_min"] = lambda t, a, k: _clamp(t, a[0], a[1] if len(a) > 1 else k.get("min"), None)
    h["clamp_max"] = lambda t, a, k: _clamp(t, a[0], None, a[1] if len(a) > 1 else k.get("max"))
    h["where"] = lambda t, a, k: _where(t, *(a + [k[n] for n in ("condition", "input", "other") if n in k]))
    h["to"] = h["type"] = _to
    h["type_as"] = lambda t, a, k: _convert(t, a[0], _dtype_of_kind(_lift(t, a[1]).kind))
    torch_dtypes = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
                    "int": "int32", "long": "int64", "short": "int16", "bool": "bool"}
    for n, dt in torch_dtypes.items():
        h[n] = (lambda d: lambda t, a, k: _convert(t, a[0], getattr(_torch(), d)))(dt)
    h["zeros_like"] = h["new_zeros"] = _new_constant(0)
    h["ones_like"] = h["new_ones"] = _new_constant(1)
    h["full_like"] = _full_like
    h["new_full"] = _full
    h["__getitem__"] = _getitem
    return h


def _dtype_of_kind(kind: str) -> Any:
    torch = _torch()
    return {_BOOL: torch.bool, _INT: torch.int32, _FLOAT: torch.float32}[kind]


_HANDLERS = _make_handlers()


def _dispatch(t: _Trace, name: str, args: List[Any], kwargs: Dict[str, Any], shown: str) -> Any:
    handler = _HANDLERS.get(name)
    if handler is None:
        raise _error(f"{shown} (not among the operations Tessera traces: arithmetic, comparisons, logical "
                     "and bitwise operations, torch.where, clamp, minimum/maximum, common math functions, "
                     "integer // and %, dtype conversions, indexing of captured tensors)")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "device", "layout", "pin_memory", "requires_grad")
              or v is not None}
    if "out" in kwargs:
        raise _error(f"{shown} with out=")
    return handler(t, args, kwargs)


# --- entry points ------------------------------------------------------------------------------

_HELPERS = r"""
#ifndef TESSERA_FLEX_HELPERS
#define TESSERA_FLEX_HELPERS
// Python's integer // and % (round toward negative infinity); torch.remainder for floats.
__device__ __forceinline__ int tessera_floordiv(int a, int b) {
  const int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ int tessera_remainder(int a, int b) {
  const int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ float tessera_fremainder(float a, float b) { return a - b * floorf(a / b); }
__device__ __forceinline__ int tessera_ipow(int a, int e) {
  int r = 1;
  for (; e > 0; --e) r *= a;
  return r;
}
// torch.tanh: the GPU's tanh.approx (relative error about 2^-11, like the built-in soft-cap).
__device__ __forceinline__ float tessera_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// An integer of magnitude <= 2^22 as a float, exactly: added to the bits of 1.5 * 2^23 it moves
// that float by x units of its last place (1.0 there), and the float subtraction removes the offset.
__device__ __forceinline__ float tessera_i2f(int x) { return __int_as_float(0x4B400000 + x) - 12582912.0f; }
// A captured tensor's index: negative values count from the end once, then clamped into range.
__device__ __forceinline__ int tessera_clamp_index(int i, int size) {
  i = i < 0 ? i + size : i;
  return i < 0 ? 0 : (i >= size ? size - 1 : i);
}
#endif
"""

#: The fixed variant parameters every traced variant starts with.
BATCH_PARAM = "tessera_b"
Q_OFFSET_PARAM = "tessera_q_offset"


class TracedFunction:
    """One traced mod: its device function `function` defined by `source`."""

    def __init__(self, function: str, source: str, uses_batch: bool, uses_head: bool,
                 lowering: Optional[Tuple[Any, ...]] = None) -> None:
        self.function = function
        self.source = source
        self.uses_batch = uses_batch
        self.uses_head = uses_head
        # A mod the kernels have built in (see _lowering, _mask_lowering): ("soft_cap", cap),
        # ("alibi", the slope table's capture name), ("causal", window_left); None otherwise.
        self.lowering = lowering


def _check_arity(fn: Any, n: int, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} = {fn!r} is not callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and the like: let the call say
    try:
        sig.bind(*range(n))
    except TypeError:
        raise TypeError(f"{what} {getattr(fn, '__name__', fn)}{sig} does not take {n} positional arguments "
                        f"({'(score, b, h, q_idx, kv_idx)' if n == 5 else '(b, h, q_idx, kv_idx)'})") from None


def trace_function(fn: Any, is_score: bool, function: str, captures: List[Capture], max_captures: int,
                   extents: Optional[Tuple[int, int, int, int]] = None,
                   hook_indices: bool = False) -> TracedFunction:
    """Traces one mod into the device function `function`; its captured tensors are appended to
    `captures` (shared by the functions of one variant). `extents`: (B, H, Q_LEN, KV_LEN) when
    known, so that b, h, q_idx, kv_idx carry ranges (the generated code depends on them only
    through which conversions it may shorten). The kernels also evaluate mods where the result is
    discarded (rows and columns past the end of a block or tile, missing keys as -1), so the
    ranges reach below 0 and a tile past the lengths.

    `hook_indices`: b and q_idx are the hooks' own `batch` and `qo_idx` (the request and the
    query's position in its sequence, as the plan/run wrappers run a batch in one launch) instead
    of the variant parameters BATCH_PARAM and Q_OFFSET_PARAM that flex_attention sets per call."""
    what = "score_mod" if is_score else "mask_mod"
    _check_arity(fn, 5 if is_score else 4, what)
    t = _Trace(captures, max_captures)
    names = ("b", "h", "q_idx", "kv_idx")
    ranges = [(-1, n + _TILE_SLACK) for n in extents] if extents is not None else [None] * 4
    forms = (None, ("h",), ("lin", 1, 0, 0), ("lin", 0, 1, 0))
    b, h, q, kv = (Sym(t, n, _INT, None, r, f) for n, r, f in zip(names, ranges, forms))
    try:
        result = fn(Sym(t, "score", _FLOAT, form=("score",)), b, h, q, kv) if is_score else fn(b, h, q, kv)
        out = _lift(t, result)
    except ModTraceError:
        raise
    except Exception as e:
        raise ModTraceError(f"tracing {what} {getattr(fn, '__name__', fn)!s} raised {type(e).__name__}: {e}") from e
    if is_score:
        ret, sig = _as(out, _FLOAT), "float score, "
    else:
        if out.kind != _BOOL:
            raise ModTraceError(f"{what} {getattr(fn, '__name__', fn)!s} returns a value of kind {out.kind}, expected a "
                                "boolean (a comparison or a logical combination of comparisons)")
        ret, sig = out.code, ""
    body = "\n".join(t.lines)
    uses = {v: _mentions(body + "\n" + ret, v) for v in ("b", "h")}
    ret_type = "float" if is_score else "bool"
    source = (
        _HELPERS
        + f"__device__ __forceinline__ {ret_type} {function}(const Params& params, {sig}int batch, int h, "
        "int qo_idx, int kv_idx) {\n"
        + ("  const int b = batch;\n  const int q_idx = qo_idx;\n" if hook_indices else
           f"  const int b = params.{BATCH_PARAM};\n  const int q_idx = qo_idx - params.{Q_OFFSET_PARAM};\n")
        + "  (void)batch; (void)b; (void)h; (void)q_idx; (void)kv_idx;\n"
        + (body + "\n" if body else "")
        + f"  return {ret};\n}}\n"
    )
    lowering = _lowering(out, extents[1] if extents is not None else None) if is_score else _mask_lowering(out)
    return TracedFunction(function, source, uses["b"], uses["h"], lowering)


def _mentions(code: str, name: str) -> bool:
    """Whether the generated code reads the input `name` (temporaries are t<N>, parameters
    params.<name>)."""
    return re.search(rf"(?<![A-Za-z0-9_.]){name}(?![A-Za-z0-9_])", code) is not None
