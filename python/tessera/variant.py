"""User-defined attention variants from CUDA C++ source: :class:`VariantSpec`.

A :class:`VariantSpec` is the Python form of the C++ ``tessera::VariantSpec``
(include/tessera/variant.h): CUDA C++ source that defines any subset of the variant hooks as free
device functions, extra parameters the hooks read as ``params.<name>``, and whether the logits go
through a softmax. Pass it as ``variant=`` to :func:`tessera.single_decode_with_kv_cache` or
:func:`tessera.single_prefill_with_kv_cache` (Tessera's keyword; the plan/run wrappers
also take FlashInfer's own variant form through ``jit_args``: tessera._jit_args). Its source is
compiled with NVRTC for the current GPU on first use and cached in memory and on disk
(docs/jit-cache.md), the path the FlexAttention front end's traced mods take (tessera.flex: the
extension builds the same C++ ``VariantSpec`` from the name, source and parameter list). The
plan/run wrappers take it as ``plan(variant=...)`` (without softmax their plans never split KV: the
runtime merges split chunks by their log-sum-exp; an ``output_transform`` fails its kernel's
compile there); :func:`tessera.flex_variant` builds one from FlexAttention-style mods. Any hook
may take one more, last argument ``const Request& request`` (``request.qo_len``,
``request.kv_len``: the request's query rows and KV length).

The hooks (every index an ``int``; ``Params`` is the struct generated from ``params``):

- ``float2 query_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx,
  int qo_head, int kv_head, int dim)``, ``key_transform(...)`` and ``value_transform(...)`` with
  the same arguments: ``value`` holds elements ``dim`` and ``dim + head_dim / 2`` of one row;
  return the transformed pair. ``kv_idx`` is -1 in ``query_transform``, ``qo_idx`` -1 in the
  others.
- ``float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx,
  int qo_head, int kv_head)``: ``logits`` is ``sm_scale * q.k`` after the built-in transforms
  (natural units).
- ``bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head,
  int kv_head)``: False hides the key (ANDed with the built-in masks).
- ``float output_transform(const Params& params, float value, int batch, int qo_idx, int qo_head,
  int dim)``: applied to each element of the normalised output.

``qo_idx`` is the query's position in its sequence (``kv_len - qo_len + i``), ``kv_idx`` the key's;
``batch`` is the request (0 in the single-request functions). A compile error in the source is a
``ValueError`` carrying NVRTC's log with the line numbers of the source.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _utils as U

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["VariantSpec"]

# tessera::kMaxVariantParams (include/tessera/variant.h).
MAX_PARAMS = 16
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT64 = (-(2**63), 2**63 - 1)

ParamValue = Union[int, float, "torch.Tensor"]


class VariantSpec:
    """A user attention variant written in CUDA C++ (the C++ ``tessera::VariantSpec``).

    Attributes (read-only): ``name``, ``source``, ``params`` (a dict copy) and ``use_softmax``, as
    given to the constructor.
    """

    __slots__ = ("_name", "_source", "_params", "_use_softmax")

    def __init__(self, name: str, source: str, params: Optional[Mapping[str, ParamValue]] = None,
                 use_softmax: bool = True) -> None:
        """Checks and keeps the variant (nothing is compiled until a call uses it).

        Args:
            name: a non-empty name for log lines, errors and the JIT cache's records, e.g.
                ``"my_alibi"``.
            source: CUDA C++ source defining any subset of the hooks of the module doc (may be
                empty: the built-in options only).
            params: extra parameters by name (C identifiers, at most 16), visible in the source
                as ``params.<name>``: a Python ``int`` becomes an ``int32_t`` (``int64_t`` outside
                the 32-bit range), a ``float`` a ``float`` (fp32), a tensor a ``const E*`` to its
                first element, E its dtype: ``float`` (torch.float32), ``int32_t`` (int32),
                ``uint8_t`` (uint8), ``__half`` (float16), ``__nv_bfloat16`` (bfloat16). Tensors
                must be contiguous CUDA tensors on the device of the call's q, and stay alive and
                unchanged until the call's GPU work has run. Bools are rejected (use 0 / 1).
            use_softmax: ``False``: the logits after ``logits_transform`` are the weights
                (``O = sum_j x_j v_j`` over visible keys, no normalisation); the functions then
                refuse ``return_lse=True`` (there is no log-sum-exp).

        Raises:
            TypeError: a wrong type (name, source, a parameter's name or value, use_softmax).
            ValueError: an empty name, a name that is not a C identifier, more than 16 parameters,
                a non-finite float, an int outside 64 bits, a non-contiguous or host tensor.
        """
        if not isinstance(name, str):
            raise TypeError(f"VariantSpec: name must be a str, got {type(name).__name__}")
        if not name:
            raise ValueError("VariantSpec: name is empty, expected a name for logs and errors")
        if not isinstance(source, str):
            raise TypeError(f"VariantSpec: source must be a str (CUDA C++ code), got {type(source).__name__}")
        if not isinstance(use_softmax, bool):
            raise TypeError(f"VariantSpec: use_softmax must be a bool, got {type(use_softmax).__name__}")
        checked: Dict[str, ParamValue] = {}
        if params is not None:
            if not isinstance(params, Mapping):
                raise TypeError(f"VariantSpec: params must be a mapping of name to value, got {type(params).__name__}")
            if len(params) > MAX_PARAMS:
                raise ValueError(f"VariantSpec: {len(params)} params, expected at most {MAX_PARAMS}")
            for key, value in params.items():
                checked[key] = _check_param(key, value)
        self._name = name
        self._source = source
        self._params = checked
        self._use_softmax = use_softmax

    @property
    def name(self) -> str:
        """The variant's name."""
        return self._name

    @property
    def source(self) -> str:
        """The CUDA C++ source of its hooks."""
        return self._source

    @property
    def params(self) -> Dict[str, ParamValue]:
        """Its parameters by name (a copy)."""
        return dict(self._params)

    @property
    def use_softmax(self) -> bool:
        """Whether the logits go through a softmax (False: they are the weights)."""
        return self._use_softmax

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={U._short(v)}" for k, v in self._params.items())
        return (f"VariantSpec({self._name!r}, <{len(self._source)} characters of source>, params={{{params}}}, "
                f"use_softmax={self._use_softmax})")

    def _check_device(self, device: Any) -> None:
        """Its tensor parameters on `device` (the call's q), named in the error otherwise."""
        torch = U._torch()
        for key, value in self._params.items():
            if isinstance(value, torch.Tensor) and value.device != device:
                raise ValueError(f"VariantSpec {self._name!r}: params[{key!r}] is on {value.device}, expected {device} "
                                 "(the device of q)")

    @classmethod
    def _traced(cls, name: str, source: str, params: Dict[str, Any]) -> "VariantSpec":
        """A variant of traced mods (tessera.flex_variant): its tensor parameters are the
        captures' byte views, which the generated code indexes at the captured strides, so they
        need not be contiguous (the other checks hold)."""
        spec = cls(name, source)
        checked: Dict[str, ParamValue] = {}
        for key, value in params.items():
            if _is_tensor(value) and not value.is_contiguous():
                _check_param(key, value.as_strided((1,), (1,)))  # dtype, device: the view's own
                checked[key] = value
            else:
                checked[key] = _check_param(key, value)
        spec._params = checked
        return spec

    def _variant_args(self) -> Dict[str, Any]:
        """The user_* keywords of tessera._C.VariantArgs (the extension builds the C++ VariantSpec,
        converting the parameters as it does for the FlexAttention front end's)."""
        params: List[Tuple[str, Any]] = [(k, v.detach() if _is_tensor(v) else v) for k, v in self._params.items()]
        return {"user_name": self._name, "user_source": self._source, "user_params": params,
                "user_use_softmax": self._use_softmax}


def _is_tensor(value: Any) -> bool:
    torch = U._torch_if_loaded()
    return torch is not None and isinstance(value, torch.Tensor)


def _check_param(key: Any, value: Any) -> ParamValue:
    if not isinstance(key, str):
        raise TypeError(f"VariantSpec: params has a key of type {type(key).__name__}, expected str")
    if not _IDENTIFIER.match(key):
        raise ValueError(f"VariantSpec: params[{key!r}]: the name is not a C identifier")
    where = f"VariantSpec: params[{key!r}]"
    if isinstance(value, bool):
        raise TypeError(f"{where} is a bool, expected an int, a float or a tensor (use 0 / 1)")
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"{where} = {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} = {value}, expected a finite value")
        return value
    if _is_tensor(value):
        torch = U._torch()
        dtypes = (torch.float32, torch.int32, torch.uint8, torch.float16, torch.bfloat16)
        if value.dtype not in dtypes:
            raise TypeError(f"{where}.dtype = {value.dtype}, expected one of {', '.join(map(str, dtypes))}")
        if value.device.type != "cuda":
            raise ValueError(f"{where} is on {value.device}, expected a CUDA tensor (the hooks read it on the GPU)")
        if not value.is_contiguous():
            raise ValueError(f"{where} is not contiguous (the hooks index it from its first element)")
        return value
    raise TypeError(f"{where} is a {type(value).__name__}, expected an int, a float or a torch.Tensor")
