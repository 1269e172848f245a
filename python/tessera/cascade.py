"""Attention-state merge (docs/design.md §2), FlashInfer-compatible.

A state is ``(v, s)``: ``v`` ``[seq_len, num_heads, head_dim]`` the attention output over some KV
set and ``s`` ``[seq_len, num_heads]`` float32 its BASE-2 log-sum-exp (what the attention
functions return with ``return_lse=True``). Two states over disjoint KV sets merge into the state
over their union: ``s = log2(2^s_a + 2^s_b)``, ``v = 2^(s_a - s) v_a + 2^(s_b - s) v_b``. Split-KV,
cascade (shared-prefix) attention and composable formats are all this operation. A state with
``s = -inf`` is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _utils as U

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["merge_state", "merge_state_in_place", "merge_states", "merge_states_ragged"]


def _check_state(v_name: str, v: Any, s_name: str, s: Any, v_ndim: int) -> None:
    torch = U._torch()
    U.check_tensor(v_name, v, ndim=v_ndim, dtypes=(torch.float16, torch.bfloat16, torch.float32))
    U.check_tensor(s_name, s, ndim=v_ndim - 1, dtypes=(torch.float32,))
    if tuple(s.shape) != tuple(v.shape[:-1]):
        raise ValueError(
            f"{s_name} has shape {tuple(s.shape)}, expected {tuple(v.shape[:-1])} (the shape of {v_name} without head_dim)"
        )


def _check_devices(*named: Any) -> None:
    """The first tensor on a CUDA device, every other one on the same device."""
    (ref_name, ref), rest = named[0], named[1:]
    U.check_cuda(ref_name, ref)
    for name, t in rest:
        U.check_same_device(name, t, ref_name, ref)


def merge_state(
    v_a: "torch.Tensor", s_a: "torch.Tensor", v_b: "torch.Tensor", s_b: "torch.Tensor"
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Merges two attention states elementwise.

    Args:
        v_a, v_b: ``[seq_len, num_heads, head_dim]`` float16/bfloat16/float32, the same dtype and
            shape, contiguous last dimension.
        s_a, s_b: float32 ``[seq_len, num_heads]`` base-2 LSEs.

    Returns:
        ``(v, s)``: the merged output (``v_a``'s dtype) and its LSE.
    """
    torch = U._torch()
    _check_state("v_a", v_a, "s_a", s_a, 3)
    _check_state("v_b", v_b, "s_b", s_b, 3)
    if v_b.dtype != v_a.dtype:
        raise TypeError(f"v_b.dtype = {v_b.dtype}, expected {v_a.dtype} (the dtype of v_a)")
    U.check_shape("v_b", v_b, tuple(v_a.shape), "the shape of v_a")
    _check_devices(("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b))
    v = torch.empty_like(v_a, memory_format=torch.contiguous_format)
    s = torch.empty_like(s_a, memory_format=torch.contiguous_format)
    U.call(U._C().merge_state, v_a, v_a, s_a, v_b, s_b, v, s, U.current_stream(v_a.device))
    return v, s


def merge_state_in_place(
    v: "torch.Tensor",
    s: "torch.Tensor",
    v_other: "torch.Tensor",
    s_other: "torch.Tensor",
    mask: Optional["torch.Tensor"] = None,
) -> None:
    """Merges ``(v_other, s_other)`` into ``(v, s)`` in place.

    Args:
        v, v_other: ``[seq_len, num_heads, head_dim]``, the same dtype and shape.
        s, s_other: float32 ``[seq_len, num_heads]`` base-2 LSEs.
        mask: not supported (must be ``None``).
    """
    torch = U._torch()
    U.check_none("mask", mask)
    _check_state("v", v, "s", s, 3)
    _check_state("v_other", v_other, "s_other", s_other, 3)
    if v_other.dtype != v.dtype:
        raise TypeError(f"v_other.dtype = {v_other.dtype}, expected {v.dtype} (the dtype of v)")
    U.check_shape("v_other", v_other, tuple(v.shape), "the shape of v")
    _check_devices(("v", v), ("s", s), ("v_other", v_other), ("s_other", s_other))
    s_new = torch.empty_like(s, memory_format=torch.contiguous_format)  # s_out may not alias s_a
    U.call(U._C().merge_state, v, v, s, v_other, s_other, v, s_new, U.current_stream(v.device))
    s.copy_(s_new)


def merge_states(v: "torch.Tensor", s: "torch.Tensor") -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Merges ``num_states`` attention states per row, in index order (deterministic).

    Args:
        v: ``[seq_len, num_states, num_heads, head_dim]`` float16/bfloat16/float32.
        s: float32 ``[seq_len, num_states, num_heads]`` base-2 LSEs.

    Returns:
        ``(v_merged, s_merged)``: ``[seq_len, num_heads, head_dim]`` and ``[seq_len, num_heads]``.
    """
    torch = U._torch()
    _check_state("v", v, "s", s, 4)
    _check_devices(("v", v), ("s", s))
    v_out = torch.empty((v.shape[0], v.shape[2], v.shape[3]), dtype=v.dtype, device=v.device)
    s_out = torch.empty((v.shape[0], v.shape[2]), dtype=torch.float32, device=v.device)
    U.call(U._C().merge_states, v, v, s, v_out, s_out, U.current_stream(v.device))
    return v_out, s_out


def merge_states_ragged(v: "torch.Tensor", s: "torch.Tensor",
                        indptr: "torch.Tensor") -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Merges a variable number of states per row, in index order (deterministic): row r merges
    the packed states ``indptr[r] .. indptr[r+1]-1`` (split-KV partials of unequal counts). A row
    with no state gets ``v = 0``, ``s = -inf``. (Tessera's; FlashInfer has no ragged merge.)

    Args:
        v: ``[total_states, num_heads, head_dim]`` float16/bfloat16/float32.
        s: float32 ``[total_states, num_heads]`` base-2 LSEs.
        indptr: int32 ``[rows + 1]`` on v's device, non-decreasing from 0 to at most total_states
            (entries are clamped into range by the kernel, never read out of bounds).

    Returns:
        ``(v_merged, s_merged)``: ``[rows, num_heads, head_dim]`` and ``[rows, num_heads]``.
    """
    torch = U._torch()
    _check_state("v", v, "s", s, 3)
    U.check_index_tensor("indptr", indptr)
    if indptr.shape[0] < 1:
        raise ValueError("indptr is empty, expected rows + 1 >= 1 entries")
    _check_devices(("v", v), ("s", s), ("indptr", indptr))
    rows = indptr.shape[0] - 1
    v_out = torch.empty((rows, v.shape[1], v.shape[2]), dtype=v.dtype, device=v.device)
    s_out = torch.empty((rows, v.shape[1]), dtype=torch.float32, device=v.device)
    U.call(U._C().merge_states_ragged, v, v, s, indptr, v_out, s_out, U.current_stream(v.device))
    return v_out, s_out
