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

__all__ = ["merge_state", "merge_state_in_place", "merge_states", "merge_states_ragged",
           "MultiLevelCascadeAttentionWrapper"]


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


class MultiLevelCascadeAttentionWrapper:
    """Shared-prefix (cascade) attention over a paged KV cache in ``num_levels`` levels,
    FlashInfer-compatible.

    Level ``i`` partitions the batch's query rows into groups (``qo_indptr_arr[i]``) and gives each
    group one page range (``paged_kv_indptr_arr[i]`` etc.): level 0 is typically one group of every
    row over the shared prefix, the last level one group per request over its own pages. Each
    level runs as one :class:`tessera.BatchPrefillWithPagedKVCacheWrapper` plan, so a shared
    level's KV is read once for all the rows of its group (their rows packed into the same query
    tiles), and the levels' states are merged in level order with :func:`merge_state_in_place`
    (deterministic). ``causal`` applies to the last level only; the shared levels are fully
    visible.

    This is a composition of plan/run wrappers (one plan and launch per level plus a merge per
    extra level), FlashInfer's own design; a single runtime plan over all levels is not built yet.
    Memory: levels beyond the first each allocate a workspace of ``float_workspace_buffer``'s size
    (a runtime keeps its plan in its workspace).
    Not supported (NotImplementedError naming them): ``use_cuda_graph=True``; position-dependent
    variants across levels (``window_left``, ``"ROPE_LLAMA"``, ``"ALIBI"``: a level's query
    positions are not the sequence's).
    """

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: Optional[Any] = None,
        paged_kv_indptr_buf_arr: Optional[Any] = None,
        paged_kv_indices_buf_arr: Optional[Any] = None,
        paged_kv_last_page_len_buf_arr: Optional[Any] = None,
    ) -> None:
        """Creates one prefill wrapper per level over an equal slice of the workspace.

        Args:
            num_levels: number of levels, >= 1.
            float_workspace_buffer: one-byte-element CUDA tensor (FlashInfer's examples use 128
                MB), level 0's workspace; each further level allocates one of the same size (see
                the class note).
            kv_layout: ``"NHD"`` or ``"HND"``.
            use_cuda_graph, *_buf_arr: only ``False`` / ``None``.
        """
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        torch_empty_like = U._torch().empty_like

        levels = U.check_positive_int("num_levels", num_levels)
        if use_cuda_graph:
            raise U.unsupported("use_cuda_graph", use_cuda_graph,
                                "False (MultiLevelCascadeAttentionWrapper runs one plan per level; no graph mode yet)")
        for name, value in (("qo_indptr_buf_arr", qo_indptr_buf_arr), ("paged_kv_indptr_buf_arr", paged_kv_indptr_buf_arr),
                            ("paged_kv_indices_buf_arr", paged_kv_indices_buf_arr),
                            ("paged_kv_last_page_len_buf_arr", paged_kv_last_page_len_buf_arr)):
            U.check_none(name, value)
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        if ws.element_size() != 1:
            raise TypeError(f"float_workspace_buffer.dtype = {ws.dtype}, expected a one-byte dtype (uint8, int8)")
        self._num_levels = levels
        # A Tessera runtime keeps its plan in its workspace beside the split states, so the levels,
        # planned together and run one after another, cannot share one buffer as FlashInfer's
        # levels do (theirs hold only scratch): level 0 takes the caller's buffer, every further
        # level a buffer of the same size allocated here, on its device.
        buffers = [ws] + [torch_empty_like(ws) for _ in range(levels - 1)]
        self._wrappers = [BatchPrefillWithPagedKVCacheWrapper(b, kv_layout) for b in buffers]

    def plan(
        self,
        qo_indptr_arr: Any,
        paged_kv_indptr_arr: Any,
        paged_kv_indices_arr: Any,
        paged_kv_last_page_len: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
    ) -> None:
        """Plans every level (host index arrays read as in
        :meth:`tessera.BatchPrefillWithPagedKVCacheWrapper.plan`).

        Args:
            qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len:
                lists of ``num_levels`` int32 tensors: level i's query groups ``[groups_i + 1]``
                (the last entry, the batch's query rows, equal at every level), their page ranges
                ``[groups_i + 1]``, page ids and last-page lengths ``[groups_i]``.
            num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, logits_soft_cap,
                q_data_type, kv_data_type: as in the prefill wrapper, the same for every level.
            causal: the last level's causal mask (query i of a group at position kv_len - qo_len + i).
            pos_encoding_mode, window_left, rope_scale, rope_theta, use_fp16_qk_reduction: only
                their defaults (NotImplementedError otherwise).
        """
        levels = self._num_levels
        arrays = (("qo_indptr_arr", qo_indptr_arr), ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                  ("paged_kv_indices_arr", paged_kv_indices_arr), ("paged_kv_last_page_len", paged_kv_last_page_len))
        for name, value in arrays:
            if not isinstance(value, (list, tuple)) or len(value) != levels:
                got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else type(value).__name__
                raise ValueError(f"{name} has {got}, expected a list of num_levels = {levels} tensors")
        if pos_encoding_mode != "NONE":
            raise U.unsupported("pos_encoding_mode", pos_encoding_mode,
                                "'NONE' (a level's query positions are not the sequence's)")
        if window_left != -1:
            raise U.unsupported("window_left", window_left, "-1 (a level's query positions are not the sequence's)")
        for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
            U.check_none(name, value)
        rows = []
        for i, qo in enumerate(qo_indptr_arr):
            U.check_index_tensor(f"qo_indptr_arr[{i}]", qo)
            rows.append(int(qo[-1]) if qo.numel() > 0 else 0)
        if any(r != rows[-1] for r in rows):
            raise ValueError(f"qo_indptr_arr's last entries are {rows}, expected equal: every level covers all the "
                             "batch's query rows")
        for i, w in enumerate(self._wrappers):
            w.plan(qo_indptr_arr[i], paged_kv_indptr_arr[i], paged_kv_indices_arr[i], paged_kv_last_page_len[i],
                   num_qo_heads, num_kv_heads, head_dim, page_size, causal=bool(causal) and i == levels - 1,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                   q_data_type=q_data_type, kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q: "torch.Tensor", paged_kv_cache: Any) -> "torch.Tensor":
        """Runs every level and merges their states in level order.

        Args:
            q: ``[rows, num_qo_heads, head_dim]``.
            paged_kv_cache: as in :meth:`tessera.BatchPrefillWithPagedKVCacheWrapper.run` (every
                level's pages index the same cache).

        Returns:
            ``out`` ``[rows, num_qo_heads, head_dim]``.
        """
        out, lse = self._wrappers[0].run(q, paged_kv_cache, return_lse=True)
        for w in self._wrappers[1:]:
            o_level, lse_level = w.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, o_level, lse_level)
        return out

    forward = run

