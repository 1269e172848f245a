"""Rotary position embedding (RoPE) of queries and keys on their own, FlashInfer-compatible
(``flashinfer.rope``): the same functions, arguments and defaults.

``q`` is ``[nnz, num_q_heads, head_dim]`` and ``k`` ``[nnz, num_k_heads, head_dim]`` (float16 or
bfloat16, the same dtype, any strides with a contiguous last dimension, e.g. slices of one packed
qkv projection). The first ``rotary_dim`` dims of every head (default: all) form pairs, ``(x[i],
x[i + rotary_dim/2])`` ("rotate half", ``interleave=False``) or ``(x[2i], x[2i+1])``
(``interleave=True``), each rotated by the angle ``pos / rope_scale * rope_theta ** (-2i /
rotary_dim)`` of its row's position; the other dims are copied. ``apply_llama31_rope*`` smooth the
frequencies as Llama 3.1 does, with ``rope_scale`` as the smoothing factor (positions are not
divided); ``apply_rope_with_cos_sin_cache*`` read cos and sin from a float32 table (the vLLM /
SGLang convention). Positions come from ``indptr`` and ``offsets`` (row ``indptr[b] + j`` of request
``b`` sits at ``offsets[b] + j``) or per row from ``pos_ids`` / ``positions`` (int32 or int64). The
rotation is computed in float32 and rounded once.

The functions without ``_inplace`` return new tensors ``(q_rope, k_rope)``; the ``_inplace`` ones
write ``q`` and ``k`` and return None. Work is queued on PyTorch's current CUDA stream. Argument
errors name the argument: dtypes here (``TypeError``), everything else in the C++ library
(``ValueError``, the message of ``tessera/rope.h``'s checks), which checks every argument before it
touches the GPU.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _utils as U

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]


def _real(name: str, value: Any) -> float:
    """A real number as float (its value is checked by the library: NaN and inf reach it)."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}") from None


def _int(name: str, value: Any) -> int:
    """An integer (anything with __index__; bools rejected). Its value is checked by the library."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return int(operator.index(value))
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def _rotary_dim(rotary_dim: Any) -> int:
    """FlashInfer's None (the whole head) is the library's 0; an explicit 0 is an error, not None."""
    if rotary_dim is None:
        return 0
    value = _int("rotary_dim", rotary_dim)
    if value == 0:
        raise ValueError("rotary_dim = 0, expected an even value >= 2 (or None: head_dim)")
    return value


def _check_q_k(q: Any, k: Any, names: Tuple[str, str] = ("q", "k")) -> None:
    torch = U._torch()
    U.check_tensor(names[0], q, dtypes=(torch.float16, torch.bfloat16))
    U.check_tensor(names[1], k)
    if k.dtype != q.dtype:
        raise TypeError(f"{names[1]}.dtype = {k.dtype}, expected {q.dtype} (the dtype of {names[0]})")


def _stream(t: "torch.Tensor") -> int:
    """PyTorch's current stream for a CUDA tensor; 0 otherwise (the library then names the device)."""
    return U.current_stream(t.device) if t.is_cuda else 0


def _indptr_args(indptr: Any, offsets: Any) -> None:
    torch = U._torch()
    U.check_tensor("indptr", indptr, dtypes=(torch.int32,))
    U.check_tensor("offsets", offsets, dtypes=(torch.int32,))


def _pos_ids_arg(name: str, pos_ids: Any) -> None:
    torch = U._torch()
    U.check_tensor(name, pos_ids, dtypes=(torch.int32, torch.int64))


def _rope(q: Any, k: Any, q_rope: Any, k_rope: Any, indptr: Any, offsets: Any, rotary_dim: Any, interleave: bool,
          rope_scale: Any, rope_theta: Any) -> None:
    _check_q_k(q, k)
    _indptr_args(indptr, offsets)
    U.call(U._C().apply_rope, q, q, k, q_rope, k_rope, indptr, offsets, _rotary_dim(rotary_dim), bool(interleave),
           _real("rope_scale", rope_scale), _real("rope_theta", rope_theta), _stream(q))


def _rope_pos_ids(q: Any, k: Any, q_rope: Any, k_rope: Any, pos_ids: Any, rotary_dim: Any, interleave: bool,
                  rope_scale: Any, rope_theta: Any) -> None:
    _check_q_k(q, k)
    _pos_ids_arg("pos_ids", pos_ids)
    U.call(U._C().apply_rope_pos_ids, q, q, k, q_rope, k_rope, pos_ids, _rotary_dim(rotary_dim), bool(interleave),
           _real("rope_scale", rope_scale), _real("rope_theta", rope_theta), _stream(q))


def _llama31_args(rope_scale: Any, rope_theta: Any, low_freq_factor: Any, high_freq_factor: Any,
                  old_context_len: Any) -> Tuple[float, float, float, float, float]:
    return (_real("rope_scale", rope_scale), _real("rope_theta", rope_theta), _real("low_freq_factor", low_freq_factor),
            _real("high_freq_factor", high_freq_factor), _real("old_context_len", old_context_len))


def _llama31_rope(q: Any, k: Any, q_rope: Any, k_rope: Any, indptr: Any, offsets: Any, rotary_dim: Any,
                  interleave: bool, *llama31: Any) -> None:
    _check_q_k(q, k)
    _indptr_args(indptr, offsets)
    U.call(U._C().apply_llama31_rope, q, q, k, q_rope, k_rope, indptr, offsets, _rotary_dim(rotary_dim),
           bool(interleave), *_llama31_args(*llama31), _stream(q))


def _llama31_rope_pos_ids(q: Any, k: Any, q_rope: Any, k_rope: Any, pos_ids: Any, rotary_dim: Any, interleave: bool,
                          *llama31: Any) -> None:
    _check_q_k(q, k)
    _pos_ids_arg("pos_ids", pos_ids)
    U.call(U._C().apply_llama31_rope_pos_ids, q, q, k, q_rope, k_rope, pos_ids, _rotary_dim(rotary_dim),
           bool(interleave), *_llama31_args(*llama31), _stream(q))


def _new_outputs(q: "torch.Tensor", k: "torch.Tensor") -> Tuple["torch.Tensor", "torch.Tensor"]:
    torch = U._torch()
    return torch.empty_like(q), torch.empty_like(k)


# --- positions from indptr and offsets -----------------------------------------------------------


def apply_rope(
    q: "torch.Tensor",
    k: "torch.Tensor",
    indptr: "torch.Tensor",
    offsets: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Rotates a ragged batch of queries and keys; returns ``(q_rope, k_rope)``.

    Args:
        q: ``[nnz, num_q_heads, head_dim]``, float16 or bfloat16.
        k: ``[nnz, num_k_heads, head_dim]``, q's dtype.
        indptr: int32 ``[batch_size + 1]`` on q's device: request b owns rows
            ``indptr[b]:indptr[b+1]`` (``indptr[-1] == nnz``).
        offsets: int32 ``[batch_size]``: the position of request b's first row.
        rotary_dim: leading dims of each head that are rotated (even, <= head_dim); None: all.
        interleave: False: pairs ``(x[i], x[i + rotary_dim/2])``; True: ``(x[2i], x[2i+1])``.
        rope_scale: positions are divided by it (> 0).
        rope_theta: the frequencies' base (> 0).

    Returns:
        ``(q_rope, k_rope)``, new tensors of q's and k's shapes.
    """
    _check_q_k(q, k)
    q_rope, k_rope = _new_outputs(q, k)
    _rope(q, k, q_rope, k_rope, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta)
    return q_rope, k_rope


def apply_rope_inplace(
    q: "torch.Tensor",
    k: "torch.Tensor",
    indptr: "torch.Tensor",
    offsets: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope` writing ``q`` and ``k``."""
    _rope(q, k, q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta)


def apply_llama31_rope(
    q: "torch.Tensor",
    k: "torch.Tensor",
    indptr: "torch.Tensor",
    offsets: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """:func:`apply_rope` with Llama 3.1 frequencies; returns ``(q_rope, k_rope)``.

    The frequency ``f = rope_theta ** (-2i / rotary_dim)`` of wavelength ``w = 2 pi / f`` is kept
    when ``w < old_context_len / high_freq_factor``, divided by ``rope_scale`` when ``w >
    old_context_len / low_freq_factor``, and interpolated between the two in the band between.
    Positions are not divided (``rope_scale`` is the smoothing factor).
    """
    _check_q_k(q, k)
    q_rope, k_rope = _new_outputs(q, k)
    _llama31_rope(q, k, q_rope, k_rope, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                  low_freq_factor, high_freq_factor, old_context_len)
    return q_rope, k_rope


def apply_llama31_rope_inplace(
    q: "torch.Tensor",
    k: "torch.Tensor",
    indptr: "torch.Tensor",
    offsets: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope` writing ``q`` and ``k``."""
    _llama31_rope(q, k, q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                  high_freq_factor, old_context_len)


# --- positions per row ---------------------------------------------------------------------------


def apply_rope_pos_ids(
    q: "torch.Tensor",
    k: "torch.Tensor",
    pos_ids: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Rotates row r of ``q`` and ``k`` at position ``pos_ids[r]`` (int32 or int64 ``[nnz]`` on q's
    device); the other arguments as for :func:`apply_rope`. Returns ``(q_rope, k_rope)``."""
    _check_q_k(q, k)
    q_rope, k_rope = _new_outputs(q, k)
    _rope_pos_ids(q, k, q_rope, k_rope, pos_ids, rotary_dim, interleave, rope_scale, rope_theta)
    return q_rope, k_rope


def apply_rope_pos_ids_inplace(
    q: "torch.Tensor",
    k: "torch.Tensor",
    pos_ids: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """:func:`apply_rope_pos_ids` writing ``q`` and ``k``."""
    _rope_pos_ids(q, k, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta)


def apply_llama31_rope_pos_ids(
    q: "torch.Tensor",
    k: "torch.Tensor",
    pos_ids: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """:func:`apply_rope_pos_ids` with Llama 3.1 frequencies (see :func:`apply_llama31_rope`)."""
    _check_q_k(q, k)
    q_rope, k_rope = _new_outputs(q, k)
    _llama31_rope_pos_ids(q, k, q_rope, k_rope, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                          low_freq_factor, high_freq_factor, old_context_len)
    return q_rope, k_rope


def apply_llama31_rope_pos_ids_inplace(
    q: "torch.Tensor",
    k: "torch.Tensor",
    pos_ids: "torch.Tensor",
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """:func:`apply_llama31_rope_pos_ids` writing ``q`` and ``k``."""
    _llama31_rope_pos_ids(q, k, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor,
                          high_freq_factor, old_context_len)


# --- precomputed cos/sin -------------------------------------------------------------------------


def _flat_rows(name: str, t: "torch.Tensor") -> "torch.Tensor":
    """``[nnz, ...]`` as ``[nnz, rest]`` without a copy (the in-place form writes through it)."""
    if t.dim() <= 2:
        return t
    try:
        return t.view(t.shape[0], -1)
    except RuntimeError:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} and strides {t.stride()}, expected a tensor that views as "
            f"[nnz, num_heads * head_size] without a copy (heads head_size elements apart)"
        ) from None


def _cos_sin_cache(positions: Any, query: Any, key: Any, head_size: Any, cos_sin_cache: Any, is_neox: bool,
                   query_out: Any, key_out: Any) -> None:
    torch = U._torch()
    _check_q_k(query, key, ("query", "key"))
    _pos_ids_arg("positions", positions)
    U.check_tensor("cos_sin_cache", cos_sin_cache, dtypes=(torch.float32,))
    U.call(U._C().apply_rope_with_cos_sin_cache, query, positions, _flat_rows("query", query), _flat_rows("key", key),
           _int("head_size", head_size), cos_sin_cache, bool(is_neox), _flat_rows("query", query_out),
           _flat_rows("key", key_out), _stream(query))


def apply_rope_with_cos_sin_cache(
    positions: "torch.Tensor",
    query: "torch.Tensor",
    key: "torch.Tensor",
    head_size: int,
    cos_sin_cache: "torch.Tensor",
    is_neox: bool = True,
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Rotates with precomputed cos/sin (the vLLM / SGLang convention); returns ``(query_out,
    key_out)`` of query's and key's shapes.

    Args:
        positions: int32 or int64 ``[nnz]``: row r uses table row ``positions[r]`` (a position
            outside the table leaves the row unrotated).
        query: ``[nnz, num_q_heads * head_size]`` (or ``[nnz, num_q_heads, head_size]``), float16 or
            bfloat16.
        key: ``[nnz, num_k_heads * head_size]``, query's dtype.
        head_size: elements per head.
        cos_sin_cache: float32 ``[max_position, rotary_dim]``: cos in the first half of each row,
            sin in the second; ``rotary_dim`` (even, <= head_size) dims of each head are rotated.
        is_neox: True: pairs ``(x[i], x[i + rotary_dim/2])``; False: ``(x[2i], x[2i+1])``.
    """
    _check_q_k(query, key, ("query", "key"))
    query_out, key_out = _new_outputs(query, key)
    _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, query_out, key_out)
    return query_out, key_out


def apply_rope_with_cos_sin_cache_inplace(
    positions: "torch.Tensor",
    query: "torch.Tensor",
    key: "torch.Tensor",
    head_size: int,
    cos_sin_cache: "torch.Tensor",
    is_neox: bool = True,
) -> None:
    """:func:`apply_rope_with_cos_sin_cache` writing ``query`` and ``key``."""
    _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, query, key)
