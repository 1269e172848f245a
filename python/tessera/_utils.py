"""Shared helpers of the Python layer: lazy torch import, argument checks, dtype/layout mapping.

Everything here runs on the CPU: the checks happen before any GPU work, so a wrong argument is
reported the same way with or without a GPU.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__: list = []  # private module

_POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI", "ROPE_LLAMA31")


_TORCH: Any = None  # the torch module, once imported


def _torch() -> Any:
    """Imports torch on first use (the package itself imports without it)."""
    global _TORCH
    if _TORCH is not None:
        return _TORCH
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tessera's attention functions take PyTorch tensors: install torch (pip install torch)"
        ) from e
    _TORCH = torch
    return torch


def _C() -> Any:
    """The extension module tessera._C."""
    from . import _C as ext

    return ext


# --- option checks -----------------------------------------------------------------------------


def unsupported(option: str, value: Any, supported: str) -> NotImplementedError:
    """The error for a FlashInfer option Tessera does not implement (yet)."""
    return NotImplementedError(
        f"{option}={value!r} is not supported by Tessera yet (supported: {supported})"
    )


def check_kv_layout(kv_layout: Any, name: str = "kv_layout") -> Any:
    """'NHD' or 'HND' -> tessera._C.Layout; anything else raises ValueError."""
    if not isinstance(kv_layout, str) or kv_layout not in ("NHD", "HND"):
        raise ValueError(f"{name} = {kv_layout!r}, expected 'NHD' or 'HND'")
    return _C().Layout.NHD if kv_layout == "NHD" else _C().Layout.HND


def check_pos_encoding_mode(pos_encoding_mode: Any) -> str:
    """'NONE', 'ROPE_LLAMA', 'ALIBI' (FlashInfer's names) or 'ROPE_LLAMA31' (Tessera's: Llama 3.1
    RoPE scaling); anything else raises ValueError."""
    if isinstance(pos_encoding_mode, str) and pos_encoding_mode in _POS_ENCODING_MODES:
        return pos_encoding_mode
    raise ValueError(
        f"pos_encoding_mode = {pos_encoding_mode!r}, expected one of {', '.join(map(repr, _POS_ENCODING_MODES))}"
    )


def check_window_left(window_left: Any) -> int:
    """Sliding window: -1 (off) or the number of keys before the query's position it sees (>= 0).

    An int (anything with __index__; bools rejected, TypeError); below -1 raises ValueError.
    """
    if isinstance(window_left, bool):
        raise TypeError("window_left must be an int, got bool")
    try:
        value = operator.index(window_left)
    except TypeError:
        raise TypeError(f"window_left must be an int, got {type(window_left).__name__}") from None
    if value < -1 or value >= 2**31:
        raise ValueError(f"window_left = {value}, expected -1 (no sliding window) or a value in [0, 2^31)")
    return int(value)


def check_logits_soft_cap(logits_soft_cap: Any) -> float:
    """None or 0 -> 0.0 (off); otherwise a finite float > 0 (TypeError / ValueError naming it)."""
    if logits_soft_cap is None:
        return 0.0
    value = _finite_float("logits_soft_cap", logits_soft_cap, "None, 0 (off) or a finite value > 0")
    if value < 0.0:
        raise ValueError(f"logits_soft_cap = {logits_soft_cap!r}, expected None, 0 (off) or a finite value > 0")
    return value


def _finite_float(name: str, value: Any, expected: str) -> float:
    """A real number (int, float, numpy scalar, one-element tensor; not a bool or a string)."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}") from None
    if not math.isfinite(result):
        raise ValueError(f"{name} = {value!r}, expected {expected}")
    return result


class Variant:
    """The variant options of one call or plan, validated: FlashInfer's (pos_encoding_mode,
    window_left, logits_soft_cap, rope_scale, rope_theta) and Tessera's own (see resolve_variant).

    pos_encoding_mode: 'NONE', 'ROPE_LLAMA', 'ROPE_LLAMA31' (RoPE with rope_scale / rope_theta, and
    the Llama 3.1 frequency scaling `llama31` = (low_freq_factor, high_freq_factor,
    old_context_len)) or 'ALIBI'; window_left: -1 or >= 0; num_sink_tokens: >= 0 (with a window);
    logits_soft_cap: 0.0 (off) or > 0; sigmoid / sigmoid_bias: sigmoid attention; user: a
    tessera.VariantSpec or None.
    """

    __slots__ = ("pos_encoding_mode", "window_left", "logits_soft_cap", "rope_scale", "rope_theta", "llama31",
                 "num_sink_tokens", "sigmoid", "sigmoid_bias", "user")

    def __init__(self, pos_encoding_mode: str, window_left: int, logits_soft_cap: float, rope_scale: float,
                 rope_theta: float, llama31: Optional[Tuple[float, float, float]] = None, num_sink_tokens: int = 0,
                 sigmoid: bool = False, sigmoid_bias: float = 0.0, user: Any = None) -> None:
        self.pos_encoding_mode = pos_encoding_mode
        self.window_left = window_left
        self.logits_soft_cap = logits_soft_cap
        self.rope_scale = rope_scale
        self.rope_theta = rope_theta
        self.llama31 = llama31
        self.num_sink_tokens = num_sink_tokens
        self.sigmoid = sigmoid
        self.sigmoid_bias = sigmoid_bias
        self.user = user

    @property
    def alibi(self) -> bool:
        return self.pos_encoding_mode == "ALIBI"

    @property
    def rope(self) -> bool:
        """RoPE fused into the kernels ('ROPE_LLAMA' or 'ROPE_LLAMA31')."""
        return self.pos_encoding_mode in ("ROPE_LLAMA", "ROPE_LLAMA31")

    @property
    def use_softmax(self) -> bool:
        """False for sigmoid attention and for a user variant without softmax: the output is then a
        weighted sum without normalisation, and there is no log-sum-exp."""
        return not self.sigmoid and (self.user is None or self.user.use_softmax)

    def is_default(self) -> bool:
        """No variant: plain softmax attention (the prebuilt kernels)."""
        return (self.pos_encoding_mode == "NONE" and self.window_left < 0 and self.logits_soft_cap == 0.0
                and not self.sigmoid and self.user is None)

    def no_lse_reason(self) -> Optional[str]:
        """None, or why return_lse=True is refused: a variant without softmax has no log-sum-exp
        (the C++ library would write NaN). The plan/run wrappers keep it in their plan dict."""
        if self.use_softmax:
            return None
        what = "use_sigmoid=True" if self.sigmoid else f"variant={self.user!r} (use_softmax=False)"
        return f"return_lse=True with {what}: attention without softmax has no log-sum-exp (pass return_lse=False)"

    def check_return_lse(self, return_lse: bool) -> None:
        """return_lse with a variant that has no softmax is a ValueError (no_lse_reason)."""
        reason = self.no_lse_reason() if return_lse else None
        if reason is not None:
            raise ValueError(reason)

    def check_tensors(self, q_rope_offset: Any, k_rope_offset: Any, batch: int, device: Any) -> None:
        """The RoPE offsets (check_rope_offset) and a user variant's tensor parameters, against a
        batch of `batch` requests on `device` (checks only, before any device work)."""
        if q_rope_offset is None and k_rope_offset is None and self.user is None:
            return
        check_rope_offset("q_rope_offset", q_rope_offset, self, batch, device)
        check_rope_offset("k_rope_offset", k_rope_offset, self, batch, device)
        if self.user is not None:
            self.user._check_device(device)

    def kwargs(self, alibi_slopes: Optional["torch.Tensor"], q_rope_offset: Optional["torch.Tensor"] = None,
               k_rope_offset: Optional["torch.Tensor"] = None) -> dict:
        """The keyword arguments of tessera._C's attention entry points: ``variant``, a
        tessera._C.VariantArgs (none for the default variant, so the prebuilt kernels run).
        alibi_slopes: the f32 [num_qo_heads] device tensor when pos_encoding_mode is 'ALIBI', else
        None; q_rope_offset / k_rope_offset: i32 [batch] device tensors or None (RoPE only)."""
        if self.is_default():
            return {}
        C = _C()
        args: Dict[str, Any] = {
            "window_left": self.window_left,
            "num_sink_tokens": self.num_sink_tokens,
            "logits_soft_cap": self.logits_soft_cap,
            "sigmoid": self.sigmoid,
            "sigmoid_bias": self.sigmoid_bias,
        }
        if self.alibi:
            args["alibi_slopes"] = alibi_slopes
        if self.rope:
            args["rope_theta"] = self.rope_theta
            args["rope_q_offset"] = q_rope_offset
            args["rope_k_offset"] = k_rope_offset
            if self.llama31 is None:
                args["pos_encoding"] = C.PosEncoding.rope_llama
                args["rope_scale"] = self.rope_scale
            else:
                # FlashInfer's Llama 3.1 convention (flashinfer.apply_llama31_rope): rope_scale is the
                # frequency factor; positions are not divided.
                args["pos_encoding"] = C.PosEncoding.rope_llama31
                args["llama31_factor"] = self.rope_scale
                low, high, old_context_len = self.llama31
                args["llama31_low_freq_factor"] = low
                args["llama31_high_freq_factor"] = high
                args["llama31_original_max_position"] = old_context_len
        if self.user is not None:
            args.update(self.user._variant_args())
        return {"variant": C.VariantArgs(**args)}


# The defaults of rope_scale / rope_theta per RoPE mode: FlashInfer's attention defaults for
# 'ROPE_LLAMA', flashinfer.apply_llama31_rope's for 'ROPE_LLAMA31' (where rope_scale is the factor).
_ROPE_DEFAULTS = {"ROPE_LLAMA": (1.0, 1e4), "ROPE_LLAMA31": (8.0, 5e5)}
# Llama 3.1's low_freq_factor, high_freq_factor and old_context_len (flashinfer.apply_llama31_rope's).
_LLAMA31_DEFAULTS = (1.0, 4.0, 8192.0)


_DEFAULT_VARIANT: Optional[Variant] = None


def resolve_variant(
    pos_encoding_mode: Any, window_left: Any, logits_soft_cap: Any, rope_scale: Any, rope_theta: Any, *,
    low_freq_factor: Any = None, high_freq_factor: Any = None, old_context_len: Any = None,
    num_sink_tokens: Any = 0, use_sigmoid: Any = False, sigmoid_bias: Any = None, variant: Any = None,
) -> Variant:
    """Validates the variant options of a call or plan.

    FlashInfer's: rope_scale (> 0) and rope_theta (> 1) are checked only with a RoPE mode
    (FlashInfer ignores them otherwise); defaults 1.0 / 1e4 with 'ROPE_LLAMA', 8.0 / 5e5 with
    'ROPE_LLAMA31'. Tessera's (keyword-only in the public functions): low_freq_factor,
    high_freq_factor, old_context_len (Llama 3.1 only: an error with another mode), num_sink_tokens
    (>= 0; > 0 needs window_left >= 0), use_sigmoid with sigmoid_bias (the bias only with
    use_sigmoid), variant (None or a tessera.VariantSpec)."""
    global _DEFAULT_VARIANT
    if (type(pos_encoding_mode) is str and pos_encoding_mode == "NONE" and type(window_left) is int
            and window_left == -1 and logits_soft_cap is None and low_freq_factor is None
            and high_freq_factor is None and old_context_len is None and type(num_sink_tokens) is int
            and num_sink_tokens == 0 and use_sigmoid is False and sigmoid_bias is None and variant is None):
        # Every plan of a serving loop without a variant: the result is always the same (rope_scale /
        # rope_theta are not read without a RoPE mode). Variants are never modified after this.
        if _DEFAULT_VARIANT is None:
            _DEFAULT_VARIANT = Variant("NONE", -1, 0.0, 1.0, 1e4)
        return _DEFAULT_VARIANT
    mode = check_pos_encoding_mode(pos_encoding_mode)
    window = check_window_left(window_left)
    cap = check_logits_soft_cap(logits_soft_cap)
    scale, theta = 1.0, 1e4
    if mode in _ROPE_DEFAULTS:
        scale, theta = _ROPE_DEFAULTS[mode]
        if rope_scale is not None:
            scale = _finite_float("rope_scale", rope_scale, f"None ({scale}) or a finite value > 0")
            if scale <= 0.0:
                raise ValueError(f"rope_scale = {rope_scale!r}, expected None ({_ROPE_DEFAULTS[mode][0]}) or a "
                                 "finite value > 0")
        if rope_theta is not None:
            theta = _finite_float("rope_theta", rope_theta, f"None ({theta:g}) or a finite value > 1")
            if theta <= 1.0:
                raise ValueError(f"rope_theta = {rope_theta!r}, expected None ({_ROPE_DEFAULTS[mode][1]:g}) or a "
                                 "finite value > 1")
    llama31 = _resolve_llama31(mode, low_freq_factor, high_freq_factor, old_context_len)
    sinks = _check_num_sink_tokens(num_sink_tokens, window)
    sigmoid, bias = _check_sigmoid(use_sigmoid, sigmoid_bias)
    if variant is not None:
        from .variant import VariantSpec

        if not isinstance(variant, VariantSpec):
            raise TypeError(f"variant must be None or a tessera.VariantSpec, got {type(variant).__name__}")
    return Variant(mode, window, cap, scale, theta, llama31, sinks, sigmoid, bias, variant)


def _resolve_llama31(mode: str, low_freq_factor: Any, high_freq_factor: Any,
                     old_context_len: Any) -> Optional[Tuple[float, float, float]]:
    """(low_freq_factor, high_freq_factor, old_context_len) for 'ROPE_LLAMA31', else None (then
    the three must be None: they mean nothing without Llama 3.1 scaling)."""
    given = {"low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
             "old_context_len": old_context_len}
    if mode != "ROPE_LLAMA31":
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"{name} = {value!r} is used only with pos_encoding_mode='ROPE_LLAMA31' "
                                 f"(got pos_encoding_mode={mode!r})")
        return None
    values = []
    for (name, value), default in zip(given.items(), _LLAMA31_DEFAULTS):
        if value is None:
            values.append(default)
            continue
        f = _finite_float(name, value, f"None ({default:g}) or a finite value > 0")
        if f <= 0.0:
            raise ValueError(f"{name} = {value!r}, expected None ({default:g}) or a finite value > 0")
        values.append(f)
    if values[1] <= values[0]:
        raise ValueError(f"high_freq_factor = {values[1]:g} must be greater than low_freq_factor = {values[0]:g} "
                         "(Llama 3.1 RoPE scaling)")
    return values[0], values[1], values[2]


def _check_num_sink_tokens(num_sink_tokens: Any, window_left: int) -> int:
    """Attention sinks: an int >= 0; > 0 needs a sliding window (window_left >= 0)."""
    if isinstance(num_sink_tokens, bool):
        raise TypeError("num_sink_tokens must be an int, got bool")
    try:
        value = operator.index(num_sink_tokens)
    except TypeError:
        raise TypeError(f"num_sink_tokens must be an int, got {type(num_sink_tokens).__name__}") from None
    if value < 0 or value >= 2**31:
        raise ValueError(f"num_sink_tokens = {value}, expected 0 (off) or a value in [1, 2^31)")
    if value > 0 and window_left < 0:
        raise ValueError(f"num_sink_tokens = {value} needs a sliding window, but window_left = -1 (sink tokens are "
                         "the keys that stay visible outside the window)")
    return int(value)


def _check_sigmoid(use_sigmoid: Any, sigmoid_bias: Any) -> Tuple[bool, float]:
    """use_sigmoid: a bool; sigmoid_bias: None (0.0) or a finite float, only with use_sigmoid."""
    if not isinstance(use_sigmoid, bool):
        raise TypeError(f"use_sigmoid must be a bool, got {type(use_sigmoid).__name__}")
    if sigmoid_bias is None:
        return use_sigmoid, 0.0
    if not use_sigmoid:
        raise ValueError(f"sigmoid_bias = {sigmoid_bias!r} is used only with use_sigmoid=True")
    return True, _finite_float("sigmoid_bias", sigmoid_bias, "None (0.0) or a finite value")


def check_rope_offset(name: str, value: Any, variant: Variant, batch: int, device: Any) -> None:
    """A per-request RoPE position offset (q_rope_offset / k_rope_offset): None, an int (batch 1:
    the single-request functions) or an int32 tensor of `batch` elements on the CPU or on `device`;
    only with a RoPE mode. Checks only (no device work)."""
    if value is None:
        return
    if not variant.rope:
        raise ValueError(f"{name} is given, but pos_encoding_mode = {variant.pos_encoding_mode!r}; RoPE position "
                         "offsets need 'ROPE_LLAMA' or 'ROPE_LLAMA31'")
    torch = _torch()
    if isinstance(value, torch.Tensor):
        check_index_tensor(name, value, batch)
        if value.device.type != "cpu":
            check_same_device(name, value, "q", _DeviceOnly(device))
        return
    if isinstance(value, bool) or batch != 1:
        raise TypeError(f"{name} must be an int32 tensor of {batch} elements (one per request), got "
                        f"{type(value).__name__}")
    try:
        offset = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or an int32 tensor, got {type(value).__name__}") from None
    if not -(2**31) <= offset < 2**31:
        raise ValueError(f"{name} = {offset}, expected a 32-bit integer")


def rope_offset_tensor(value: Any, device: Any) -> Optional["torch.Tensor"]:
    """A checked RoPE offset (check_rope_offset) as the i32 tensor the kernels read on `device`
    (host values copied there)."""
    if value is None:
        return None
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value.contiguous() if value.device.type != "cpu" else value.to(device, non_blocking=True)
    return torch.tensor([int(value)], dtype=torch.int32, device=device)


def check_run_window_left(window_left: Any, planned: int) -> None:
    """run(window_left=...): None or the plan's value (the plan fixes the variant)."""
    if window_left is None:
        return
    value = check_window_left(window_left)
    if value != planned:
        raise NotImplementedError(
            f"window_left={value} in run() differs from the plan's window_left={planned}; Tessera fixes the "
            "sliding window at plan() (pass it to plan(), or leave run()'s window_left at None)"
        )


_ALIBI_SLOPES: dict = {}


def alibi_slopes(num_heads: int, device: "torch.device") -> "torch.Tensor":
    """The standard ALiBi slopes of `num_heads` heads (tessera::alibi_slopes) as a float32 tensor on
    `device`. Cached per (heads, device) for the life of the process, as FlashInfer does: the same
    tensor (and device pointer) every time, which a captured CUDA graph relies on."""
    torch = _torch()
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (int(num_heads), device.type, int(index))
    t = _ALIBI_SLOPES.get(key)
    if t is None:
        t = torch.tensor(_C().alibi_slopes(int(num_heads)), dtype=torch.float32,
                         device=torch.device(device.type, index))
        _ALIBI_SLOPES[key] = t
    return t


def packbits_little(bits: "torch.Tensor") -> "torch.Tensor":
    """A 1-D bool tensor packed into uint8, little bit order (bit k of byte i is element 8 i + k),
    as flashinfer.packbits(..., bitorder="little"); on the tensor's device."""
    torch = _torch()
    b = bits.reshape(-1).to(torch.uint8)
    pad = (-b.numel()) % 8
    if pad:
        b = torch.cat([b, b.new_zeros(pad)])
    weights = torch.bitwise_left_shift(torch.ones(8, dtype=torch.int32, device=b.device),
                                       torch.arange(8, dtype=torch.int32, device=b.device))
    return (b.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


def check_none(name: str, value: Any, what: str = "None") -> None:
    """Options Tessera does not implement, accepted only at their default (None)."""
    if value is not None:
        raise unsupported(name, _short(value), what)


def check_false(name: str, value: Any) -> None:
    """Boolean options Tessera does not implement, accepted only as False."""
    if value:
        raise unsupported(name, value, "False")


_BACKENDS = ("auto", "fa2", "fa3")


def check_backend(backend: Any, device: Any = None) -> None:
    """FlashInfer's backend names: "auto", "fa2" and "fa3" all run Tessera's kernels for the device
    (the wgmma tiles on sm_90, the FA2-class mma.sync tiles elsewhere; results agree within the
    tolerances either way), so code that names a FlashInfer template runs unchanged. "fa3" on a
    CUDA device other than sm_90 is NotImplementedError, as in FlashInfer; other names too."""
    if backend not in _BACKENDS:
        raise unsupported("backend", backend, "'auto', 'fa2' or 'fa3' (each runs Tessera's kernels for the device)")
    if backend == "fa3" and device is not None and getattr(device, "type", None) == "cuda":
        torch = _torch()
        major, minor = torch.cuda.get_device_capability(device)
        if major != 9:
            raise NotImplementedError(
                f"backend='fa3' needs an sm_90 (Hopper) GPU; {torch.cuda.get_device_name(device)} is sm_{major}{minor} "
                "(use 'auto' or 'fa2')")


def check_scale(name: str, value: Any) -> None:
    """Scales where no fp8 operand takes them (q_scale; k_scale, v_scale with 16-bit K/V): only None
    or 1.0."""
    if value is None:
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == 1.0:
        return
    raise unsupported(name, _short(value),
                      "None or 1.0 (scales apply to fp8 K/V caches, and q_scale to an fp8 q: FP8 attention in "
                      f"{_FP8_ATTENTION_ENTRY_POINTS})")


def kv_scale_kwargs(names: Tuple[str, str], k_scale: Any, v_scale: Any, kv_dtype: Any, num_kv_heads: int,
                    device: Any) -> Dict[str, Any]:
    """FlashInfer's K/V scales as the bindings' keywords (k_scale / v_scale host factors,
    k_scale_device / v_scale_device f32 tensors). For an fp8 K/V (kv_dtype e4m3/e5m2) each scale is
    None (1), a finite float > 0, or a float32 tensor on K/V's device of 1 (per tensor) or
    num_kv_heads (per KV head) elements; for 16-bit K/V only None or 1.0."""
    if kv_dtype is None or not is_fp8(kv_dtype):
        for name, value in zip(names, (k_scale, v_scale)):
            check_scale(name, value)
        return {}
    out: Dict[str, Any] = {}
    for name, value, key in ((names[0], k_scale, "k"), (names[1], v_scale, "v")):
        fp8_scale_kwarg(name, value, key, num_kv_heads, device, out)
    return out


def fp8_scale_kwarg(name: str, value: Any, key: str, num_kv_heads: int, device: Any, out: Dict[str, Any]) -> None:
    """One fp8 operand's scale (`name`) into the bindings' keywords `<key>_scale` (a host factor)
    or `<key>_scale_device` (a float32 tensor on `device` of 1 or num_kv_heads elements); None
    adds nothing (1)."""
    torch = _torch()
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32:
            raise TypeError(f"{name}.dtype = {value.dtype}, expected torch.float32")
        if value.numel() not in (1, int(num_kv_heads)):
            raise ValueError(
                f"{name} has {value.numel()} elements, expected 1 (per tensor) or num_kv_heads = {num_kv_heads} "
                "(per KV head)"
            )
        check_same_device(name, value, "the KV cache", _DeviceOnly(device))
        out[f"{key}_scale_device"] = value.reshape(-1).contiguous()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (math.isfinite(float(value)) and float(value) > 0.0):
            raise ValueError(f"{name} = {value}, expected a finite scale > 0")
        out[f"{key}_scale"] = float(value)
    else:
        raise TypeError(f"{name} must be None, a float or a float32 tensor, got {type(value).__name__}")


class _DeviceOnly:
    """Something with a .device, for check_same_device against a device."""

    def __init__(self, device: Any) -> None:
        self.device = device


def check_no_extra_args(args: Sequence[Any]) -> None:
    """FlashInfer forwards extra positional run() arguments to JIT variants: a wrapper without
    jit_args takes none."""
    if args:
        raise NotImplementedError(
            f"run() got {len(args)} extra positional argument(s), which FlashInfer passes to JIT attention variants; "
            "this wrapper was built without jit_args (supported: no extra arguments, or jit_args=... in the "
            "constructor, whose additional tensors and scalars run() then takes)"
        )


def _short(value: Any) -> Any:
    torch = _torch_if_loaded()
    if torch is not None and isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)} {value.dtype}>"
    return value


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")


def check_positive_int(name: str, value: Any) -> int:
    """An integer >= 1 (anything with __index__: int, numpy or 0-d integer tensor; bools rejected)."""
    if type(value) is int and value >= 1:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} = {value}, expected >= 1")
    return int(value)


_SUPPORTED_HEAD_DIMS: Optional[Tuple[int, ...]] = None


def _supported_head_dims() -> Tuple[int, ...]:
    """The build's kernel configuration table (tessera._C.supported_head_dims()), read once."""
    global _SUPPORTED_HEAD_DIMS
    if _SUPPORTED_HEAD_DIMS is None:
        _SUPPORTED_HEAD_DIMS = tuple(int(d) for d in _C().supported_head_dims())
    return _SUPPORTED_HEAD_DIMS


def check_heads(num_qo_heads: Any, num_kv_heads: Any, head_dim: Any, head_dim_name: str = "head_dim") -> Tuple[int, int, int]:
    """Validates the head configuration: GQA divisibility and a head dim with kernels."""
    hq = check_positive_int("num_qo_heads", num_qo_heads)
    hkv = check_positive_int("num_kv_heads", num_kv_heads)
    d = check_positive_int(head_dim_name, head_dim)
    if hq % hkv != 0:
        raise ValueError(
            f"num_qo_heads = {hq} is not a multiple of num_kv_heads = {hkv} (GQA needs num_qo_heads % num_kv_heads == 0)"
        )
    supported = _supported_head_dims()
    if d not in supported:
        raise unsupported(head_dim_name, d, ", ".join(map(str, supported)))
    return hq, hkv, d


def check_prefill_head_dims(num_qo_heads: Any, num_kv_heads: Any, head_dim_qk: Any,
                            head_dim_vo: Any) -> Tuple[int, int, int, int]:
    """check_heads for prefill, whose v and o may have their own head dim: head_dim_vo None or
    head_dim_qk (equal head dims), or a (head_dim_qk, head_dim_vo) pair the build has kernels for
    (tessera._C.supported_prefill_split_head_dims(), e.g. 192 / 128). Returns (hq, hkv, d, dv)."""
    if head_dim_vo is None or (not isinstance(head_dim_vo, bool) and head_dim_vo == head_dim_qk):
        hq, hkv, d = check_heads(num_qo_heads, num_kv_heads, head_dim_qk, "head_dim_qk")
        return hq, hkv, d, d
    dv = check_positive_int("head_dim_vo", head_dim_vo)
    d = check_positive_int("head_dim_qk", head_dim_qk)
    pairs = [tuple(int(x) for x in p) for p in _C().supported_prefill_split_head_dims()]
    if (d, dv) not in pairs:
        raise unsupported("head_dim_vo", dv, f"None, head_dim_qk ({d}), or a (head_dim_qk, head_dim_vo) pair of {pairs}")
    hq = check_positive_int("num_qo_heads", num_qo_heads)
    hkv = check_positive_int("num_kv_heads", num_kv_heads)
    if hq % hkv != 0:
        raise ValueError(
            f"num_qo_heads = {hq} is not a multiple of num_kv_heads = {hkv} (GQA needs num_qo_heads % num_kv_heads == 0)"
        )
    return hq, hkv, d, dv


def resolve_sm_scale(sm_scale: Any, head_dim: int) -> float:
    """None -> 1/sqrt(head_dim); otherwise a finite float > 0."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        value = float(sm_scale)
    except (TypeError, ValueError):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"sm_scale = {sm_scale!r}, expected a finite value > 0 (or None for 1/sqrt(head_dim))")
    return value


# --- dtypes ------------------------------------------------------------------------------------

_DTYPE_ALIASES = {
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float8_e4m3fn": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(value: Any, name: str) -> "torch.dtype":
    """A torch.dtype from a torch.dtype or a string such as 'float16', 'bf16', 'torch.bfloat16'."""
    torch = _torch()
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value[len("torch."):] if value.startswith("torch.") else value
        canonical = _DTYPE_ALIASES.get(key)
        if canonical is not None and hasattr(torch, canonical):
            return getattr(torch, canonical)
        raise TypeError(f"{name} = {value!r} is not a dtype Tessera knows (expected e.g. 'float16' or 'bfloat16')")
    raise TypeError(f"{name} must be a torch.dtype or a string, got {type(value).__name__}")


_IS_FP8: Dict[Any, bool] = {}


def is_fp8(dtype: "torch.dtype") -> bool:
    """True for torch's fp8 dtypes."""
    known = _IS_FP8.get(dtype)
    if known is None:
        known = _IS_FP8[dtype] = "float8" in str(dtype)
    return known


# Where an fp8 q runs: every other entry point takes a 16-bit q (an fp8 cache goes as kv_data_type).
_FP8_ATTENTION_ENTRY_POINTS = ("single_prefill_with_kv_cache, BatchPrefillWithPagedKVCacheWrapper and "
                               "BatchPrefillWithRaggedKVCacheWrapper")


def check_attention_dtype(dtype: "torch.dtype", name: str) -> None:
    """Attention inputs are float16 or bfloat16; fp8 raises NotImplementedError, others TypeError.

    For the dtype of q (FP8 attention) the message says where an fp8 q runs: this check guards the
    entry points that have no FP8 attention (decode, POD, cascade, block-sparse)."""
    torch = _torch()
    if dtype in (torch.float16, torch.bfloat16):
        return
    if is_fp8(dtype):
        raise unsupported(name, dtype, "torch.float16, torch.bfloat16; FP8 attention (an e4m3 q with e4m3 K/V) runs "
                                       f"in {_FP8_ATTENTION_ENTRY_POINTS}, and an fp8 KV cache goes as kv_data_type")
    raise TypeError(f"{name} = {dtype}, expected torch.float16 or torch.bfloat16")


def _memo(cache: Dict[Any, Any], key: Any, compute: Any) -> Any:
    """compute() remembered under `key` (plans repeat the same dtype arguments every step); an
    unhashable key is computed every time, and errors are never remembered."""
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable: nothing to remember
        return compute()
    value = compute()
    if len(cache) >= 256:
        cache.clear()
    cache[key] = value
    return value


_PLAN_DTYPES: Dict[Any, Any] = {}


def resolve_plan_dtypes(q_data_type: Any, kv_data_type: Any, data_type: Any = None, o_data_type: Any = None) -> "torch.dtype":
    """FlashInfer's q/kv/o data types -> the single dtype Tessera's kernels use."""
    return _memo(_PLAN_DTYPES, ("q", q_data_type, kv_data_type, data_type, o_data_type),
                 lambda: _resolve_plan_dtypes(q_data_type, kv_data_type, data_type, o_data_type))


def _resolve_plan_dtypes(q_data_type: Any, kv_data_type: Any, data_type: Any, o_data_type: Any) -> "torch.dtype":
    if data_type is not None:
        if q_data_type is None:
            q_data_type = data_type
        if kv_data_type is None:
            kv_data_type = data_type
    if q_data_type is None:
        q_data_type = "float16"
    q = canonical_dtype(q_data_type, "q_data_type")
    check_attention_dtype(q, "q_data_type")
    if kv_data_type is not None:
        kv = canonical_dtype(kv_data_type, "kv_data_type")
        if is_fp8(kv):
            check_fp8_kv_dtype(kv, "kv_data_type")
            kv = q  # an fp8 cache under q's dtype (resolve_plan_kv_dtype)
        check_attention_dtype(kv, "kv_data_type")
        if kv != q:
            raise unsupported("kv_data_type", kv, f"the dtype of q ({q}); mixed q/kv dtypes are not implemented")
    if o_data_type is not None:
        o = canonical_dtype(o_data_type, "o_data_type")
        if o != q:
            raise unsupported("o_data_type", o, f"the dtype of q ({q})")
    return q


def resolve_prefill_plan_dtypes(q_data_type: Any, kv_data_type: Any,
                                o_data_type: Any) -> Tuple["torch.dtype", "torch.dtype", "torch.dtype"]:
    """(q, K/V, o) dtypes of a batch prefill plan. A 16-bit or absent q_data_type: what
    resolve_plan_dtypes and resolve_plan_kv_dtype give (o is q's dtype), unchanged. An fp8
    q_data_type is FP8 attention, which the runtime runs for e4m3 q, k and v only:
    torch.float8_e4m3fn with kv_data_type None (q's) or torch.float8_e4m3fn, and o_data_type None
    (torch.bfloat16, as FlashInfer's FP8 prefill paths write), torch.float16 or torch.bfloat16; anything
    else is NotImplementedError naming the argument."""
    return _memo(_PLAN_DTYPES, ("prefill", q_data_type, kv_data_type, o_data_type),
                 lambda: _resolve_prefill_plan_dtypes(q_data_type, kv_data_type, o_data_type))


def _resolve_prefill_plan_dtypes(q_data_type: Any, kv_data_type: Any,
                                 o_data_type: Any) -> Tuple["torch.dtype", "torch.dtype", "torch.dtype"]:
    q = canonical_dtype(q_data_type if q_data_type is not None else "float16", "q_data_type")
    if not is_fp8(q):
        dtype = resolve_plan_dtypes(q_data_type, kv_data_type, None, o_data_type)
        return dtype, resolve_plan_kv_dtype(dtype, kv_data_type), dtype
    torch = _torch()
    if q != torch.float8_e4m3fn:
        raise unsupported("q_data_type", q, "torch.float16, torch.bfloat16, or torch.float8_e4m3fn (FP8 attention "
                                            "takes e4m3 q, k and v)")
    kv = q if kv_data_type is None else canonical_dtype(kv_data_type, "kv_data_type")
    if kv != q:
        raise unsupported("kv_data_type", kv, f"None or {q} with q_data_type={q} (FP8 attention takes e4m3 q, k and "
                                              "v; an fp8 KV cache under a 16-bit q takes q_data_type float16 or "
                                              "bfloat16)")
    if o_data_type is None:
        return q, kv, torch.bfloat16
    o = canonical_dtype(o_data_type, "o_data_type")
    if o not in (torch.float16, torch.bfloat16):
        raise unsupported("o_data_type", o, f"None (torch.bfloat16), torch.float16 or torch.bfloat16 with "
                                            f"q_data_type={q} (FP8 attention writes a 16-bit output)")
    return q, kv, o


def resolve_plan_kv_dtype(q: "torch.dtype", kv_data_type: Any, data_type: Any = None) -> "torch.dtype":
    """The K/V dtype of a plan: q's (kv_data_type None or q's dtype) or an fp8 cache's
    (torch.float8_e4m3fn, torch.float8_e5m2). resolve_plan_dtypes has checked the pair."""
    return _memo(_PLAN_DTYPES, ("kv", q, kv_data_type, data_type),
                 lambda: _resolve_plan_kv_dtype(q, kv_data_type, data_type))


def _resolve_plan_kv_dtype(q: "torch.dtype", kv_data_type: Any, data_type: Any) -> "torch.dtype":
    if kv_data_type is None:
        kv_data_type = data_type
    if kv_data_type is None:
        return q
    kv = canonical_dtype(kv_data_type, "kv_data_type")
    return kv if is_fp8(kv) else q


def check_fp8_kv_dtype(dtype: "torch.dtype", name: str) -> None:
    """The fp8 K/V dtypes Tessera's kernels read: torch.float8_e4m3fn and torch.float8_e5m2."""
    torch = _torch()
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise unsupported(name, dtype, "torch.float8_e4m3fn or torch.float8_e5m2 (the fp8 KV caches Tessera reads)")


def kv_arg(t: Any) -> Any:
    """K/V as the bindings take them: fp8 tensors as uint8 views (the dtype goes separately), since
    not every PyTorch release exports fp8 through DLPack."""
    if t is None or not is_fp8(t.dtype):
        return t
    return t.view(_torch().uint8)


_TESSERA_DTYPES: Dict[Any, Any] = {}


def tessera_dtype(dtype: "torch.dtype") -> Any:
    """torch.float16/bfloat16/float32/float8_e4m3fn/float8_e5m2 -> tessera._C.DType."""
    mapping = _TESSERA_DTYPES
    if not mapping:
        torch = _torch()
        C = _C()
        mapping.update({torch.float16: C.DType.f16, torch.bfloat16: C.DType.bf16, torch.float32: C.DType.f32,
                        torch.float8_e4m3fn: C.DType.e4m3, torch.float8_e5m2: C.DType.e5m2})
    if dtype not in mapping:
        raise TypeError(f"dtype {dtype} has no Tessera equivalent")
    return mapping[dtype]


# --- tensors -----------------------------------------------------------------------------------


def check_tensor(
    name: str,
    t: Any,
    ndim: Optional[int] = None,
    dtypes: Optional[Sequence["torch.dtype"]] = None,
    shape_hint: str = "",
) -> "torch.Tensor":
    """Requires a torch.Tensor with `ndim` dims and one of `dtypes`; names `name` in errors."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        hint = f" {shape_hint}" if shape_hint else ""
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {ndim} dimensions{hint}")
    if dtypes is not None and t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}.dtype = {t.dtype}, expected {expected}")
    return t


def check_index_tensor(name: str, t: Any, length: Optional[int] = None) -> "torch.Tensor":
    """A 1-D int32 tensor (optionally of a given length)."""
    torch = _torch()
    if (isinstance(t, torch.Tensor) and t.dtype == torch.int32 and t.dim() == 1
            and (length is None or t.shape[0] == length)):
        return t
    check_tensor(name, t, ndim=1, dtypes=(torch.int32,))
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} has {t.shape[0]} entries, expected {length}")
    return t


def check_cuda(name: str, t: "torch.Tensor") -> None:
    """Requires device memory (raises ValueError naming the argument; on a machine without a usable
    GPU the message also says why there is none, the text the C++ library gives)."""
    if t.device.type != "cuda":
        reason = _C().cuda_unavailable_reason()
        why = f" ({reason})" if reason else ""
        raise ValueError(f"{name} is on {t.device}, expected a CUDA tensor{why}")


def check_same_device(name: str, t: "torch.Tensor", ref_name: str, ref: "torch.Tensor") -> None:
    """Requires `t` on the device of `ref`."""
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device}, expected {ref.device} (the device of {ref_name})")


def check_shape(name: str, t: "torch.Tensor", expected: Tuple[int, ...], what: str = "") -> None:
    """Requires an exact shape."""
    if tuple(t.shape) != tuple(expected):
        hint = f" ({what})" if what else ""
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(expected)}{hint}")


def to_host_int32(name: str, t: Any, length: Optional[int] = None) -> "torch.Tensor":
    """A contiguous CPU int32 copy of an index array (blocking when it lives on the GPU, as in FlashInfer)."""
    check_index_tensor(name, t, length)
    host = t if t.is_cpu else t.to("cpu")
    return host.contiguous()


# Up to this many entries an index array is checked as a Python list (a few microseconds at a batch of
# 64, against ~10 µs of tensor operations); beyond, with tensor operations, whose cost does not grow.
_LIST_CHECK_MAX = 1024


def check_indptr_values(name: str, host: "torch.Tensor") -> int:
    """indptr[0] == 0 and non-decreasing (host tensor). Returns its last entry."""
    n = host.numel()
    if 0 < n <= _LIST_CHECK_MAX:  # the common case, cheaper as a list than as tensor operations
        values = host.tolist()
        if values[0] == 0 and values == sorted(values):
            return values[-1]
    if n < 1:
        raise ValueError(f"{name} is empty, expected batch_size + 1 >= 1 entries")
    first = int(host[0])
    if first != 0:
        raise ValueError(f"{name}[0] = {first}, expected 0")
    if host.numel() > 1:
        diffs = host[1:] - host[:-1]
        bad = (diffs < 0).nonzero()
        if bad.numel() > 0:
            i = int(bad[0, 0]) + 1
            raise ValueError(
                f"{name}[{i}] = {int(host[i])}, expected >= {int(host[i - 1])} ({name} must be non-decreasing)"
            )
    return int(host[-1])


class HostPageIds:
    """Page ids a paged wrapper's plan() received in host memory (``indices[:indptr[-1]]``), checked
    against the page count of the cache each run() is given: once per page count, so the per-layer
    run()s of a step pay for one check. Ids given on the GPU are checked only in checked mode
    (``TESSERA_CHECKED=1``), as the C++ library does: reading them would synchronise."""

    def __init__(self, name: str, indices: "torch.Tensor", count: int) -> None:
        self.name = name
        # The tensor and the count, sliced (ids) only when a run() checks them: every plan makes one
        # of these, and a slice costs about a microsecond.
        self._host = indices if indices.is_cpu else None
        self._count = count
        self._checked_page_counts: set = set()

    @property
    def ids(self) -> Optional["torch.Tensor"]:
        """indices[:count] when they were given in host memory, else None."""
        host = self._host
        if host is None or host.shape[0] == self._count:
            return host
        return host[: self._count]

    def check(self, num_cache_pages: int) -> None:
        if self._host is None or num_cache_pages in self._checked_page_counts:
            return
        ids = self.ids
        bad = ((ids < 0) | (ids >= num_cache_pages)).nonzero()
        if bad.numel() > 0:
            i = int(bad[0, 0])
            raise ValueError(
                f"{self.name}[{i}] = {int(ids[i])} is out of range [0, {num_cache_pages}) "
                f"(the paged_kv_cache has {num_cache_pages} pages)"
            )
        self._checked_page_counts.add(num_cache_pages)


_RAW_STREAM: Any = None  # torch._C._cuda_getCurrentRawStream once CUDA is initialised (current_stream)


def current_stream(device: "torch.device") -> int:
    """PyTorch's current CUDA stream on `device`, as an integer handle.

    torch.cuda.current_stream(device).cuda_stream builds a Stream object per call (microseconds
    on the run() path); after the first call (which also initialises CUDA in torch) this reads the
    same handle through torch._C._cuda_getCurrentRawStream, what torch's own compiled code uses,
    where this torch has it."""
    global _RAW_STREAM
    raw = _RAW_STREAM
    if raw is not None:
        index = device.index
        return raw(index if index is not None else _torch()._C._cuda_getDevice())
    torch = _torch()
    stream = int(torch.cuda.current_stream(device).cuda_stream)
    _RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return stream


_COPY_INDEX_ARRAYS: Any = None  # tessera._C._copy_index_arrays, or False when this build has none


def copy_index_arrays(stream: int, device: "torch.device", *copies: Any) -> bool:
    """Copies of int32 index arrays into preallocated buffers (a graph-mode plan()'s page table):
    ``copies`` = (dst, src, n, ...), up to four triples, the first n entries of src into dst, on
    `stream` of `device`, in one call of tessera._C._copy_index_arrays (its host sources staged
    through pinned memory, so they may be reused at once, as after PyTorch's copy from pageable
    memory). True when done; False, with nothing copied, when the binding does not take them (a
    non-contiguous or wrong-typed array, another device, a capturing stream, host sources beyond
    its staging, a build without it, an array it cannot convert): the caller copies with torch
    then. Only for non_blocking copies (torch's blocking ones also wait for the stream).
    Tensor arguments are read through the runtime bindings' direct export (module.cpp, RunArray)."""
    global _COPY_INDEX_ARRAYS
    fn = _COPY_INDEX_ARRAYS
    if fn is None:
        fn = _COPY_INDEX_ARRAYS = getattr(_C(), "_copy_index_arrays", False)
    if fn is False:
        return False
    # A plan's device is the workspace's, a GPU; a host one only under the CPU stand-ins of tests and
    # bench/host_standin.py, where the binding copies host arrays with memcpy (device -1: no GPU).
    index = device.index if device.type == "cuda" else -1
    try:
        return fn(stream, index if index is not None else _torch().cuda.current_device(), *copies)
    except (TypeError, ValueError):  # an array the binding does not convert (raised before any copy)
        return False


def call(fn: Any, device_tensor: "torch.Tensor", *args: Any, **kwargs: Any) -> Any:
    """Calls into tessera._C with `device_tensor`'s GPU current (PyTorch exports a CUDA tensor
    through DLPack only from its current device) and tensors that require grad detached (DLPack
    cannot carry autograd; these kernels are inference-only)."""
    torch = _torch()

    def plain(a: Any) -> Any:
        return a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a

    args = tuple(plain(a) for a in args)
    kwargs = {k: plain(a) for k, a in kwargs.items()}
    index = device_tensor.device.index
    if device_tensor.device.type != "cuda" or index is None or index == torch.cuda.current_device():
        return fn(*args, **kwargs)
    with torch.cuda.device(index):
        return fn(*args, **kwargs)


def launch(fn: Any, device_tensor: "torch.Tensor", *args: Any, **kwargs: Any) -> Any:
    """call() for the hot path of the wrappers' run(), whose arguments the caller has checked: the
    binding is called directly. The extension module exports torch tensors without
    Tensor.__dlpack__'s Python-level conditions (module.cpp, TorchArray), so neither autograd nor
    PyTorch's current device matters to it; when it refuses an argument anyway (a tensor subclass,
    an older build of the module: nanobind's TypeError, raised before the C++ call runs) the call
    is made again through call(), which detaches and switches the device, as before."""
    try:
        return fn(*args, **kwargs)
    except TypeError:
        return call(fn, device_tensor, *args, **kwargs)


def device_index(t: "torch.Tensor") -> int:
    """The CUDA ordinal of a tensor (current device when unset)."""
    if t.device.index is not None:
        return int(t.device.index)
    return int(_torch().cuda.current_device())


def unpack_paged_kv_cache(
    paged_kv_cache: Any, name: str = "paged_kv_cache"
) -> Tuple[Optional["torch.Tensor"], Optional["torch.Tensor"], Optional["torch.Tensor"]]:
    """(k, v) tuple -> (k, v, None); one [num_pages, 2, ...] tensor -> (None, None, kv)."""
    torch = _torch()
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"{name} has {len(paged_kv_cache)} entries, expected (k_cache, v_cache)")
        k, v = paged_kv_cache
        check_tensor(f"{name}[0]", k, ndim=4, shape_hint="([num_pages, page_size, H_kv, D] or HND)")
        check_tensor(f"{name}[1]", v, ndim=4, shape_hint="([num_pages, page_size, H_kv, D] or HND)")
        return k, v, None
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                f"{name} has shape {tuple(paged_kv_cache.shape)}, expected a (k, v) tuple or one tensor "
                "[num_pages, 2, page_size, H_kv, D] (NHD) / [num_pages, 2, H_kv, page_size, D] (HND)"
            )
        return None, None, paged_kv_cache
    raise TypeError(f"{name} must be a (k, v) tuple of tensors or one tensor, got {type(paged_kv_cache).__name__}")


def paged_kv_geometry(
    k: Optional["torch.Tensor"], kv: Optional["torch.Tensor"], layout_is_nhd: bool
) -> Tuple["torch.Tensor", int, int, int]:
    """(reference tensor, page_size, num_kv_heads, head_dim) of a paged cache."""
    if kv is not None:
        shape = tuple(kv.shape[:1]) + tuple(kv.shape[2:])
        ref = kv
    else:
        assert k is not None
        shape = tuple(k.shape)
        ref = k
    if layout_is_nhd:
        return ref, int(shape[1]), int(shape[2]), int(shape[3])
    return ref, int(shape[2]), int(shape[1]), int(shape[3])


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (x >= 1)."""
    return 1 << max(0, (int(x) - 1).bit_length())


def kv_data_dtype_check(name: str, t: "torch.Tensor", q_dtype: "torch.dtype", kv_dtype: Any = None) -> None:
    """K/V tensors have q's dtype or are an fp8 cache (torch.float8_e4m3fn / float8_e5m2); with
    kv_dtype (a plan's), exactly that dtype."""
    if kv_dtype is not None:
        if t.dtype != kv_dtype:
            raise TypeError(f"{name}.dtype = {t.dtype}, but the plan was made for kv_data_type = {kv_dtype}")
        return
    if t.dtype == q_dtype:
        return
    if is_fp8(t.dtype):
        check_fp8_kv_dtype(t.dtype, f"{name}.dtype")
        return
    raise TypeError(f"{name}.dtype = {t.dtype}, expected {q_dtype} (the dtype of q) or an fp8 dtype")


Number = Union[int, float]
