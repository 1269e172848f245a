"""Attention-state merge (docs/design.md §2), FlashInfer-compatible.

A state is ``(v, s)``: ``v`` ``[seq_len, num_heads, head_dim]`` the attention output over some KV
set and ``s`` ``[seq_len, num_heads]`` float32 its BASE-2 log-sum-exp (what the attention
functions return with ``return_lse=True``). Two states over disjoint KV sets merge into the state
over their union: ``s = log2(2^s_a + 2^s_b)``, ``v = 2^(s_a - s) v_a + 2^(s_b - s) v_b``. Split-KV,
cascade (shared-prefix) attention and composable formats are all this operation. A state with
``s = -inf`` is empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from . import _runtime as R
from . import _utils as U
from ._runtime import _Need
from .decode import _check_paged_cache, _check_run_queries, _run_fields
from .prefill import _check_causal

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


def _check_level_list(name: str, value: Any, levels: int) -> Sequence[Any]:
    """A list (or tuple) of one entry per level."""
    if not isinstance(value, (list, tuple)) or len(value) != levels:
        got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else f"type {type(value).__name__}"
        raise ValueError(f"{name} has {got}, expected a list of num_levels = {levels} tensors")
    return value


class _CascadeNeed(_Need):
    """A cascade plan's requirements: batch is the largest group count of any level; errors also
    name the levels (the workspace grows with them)."""

    __slots__ = ("levels",)

    def __init__(self, levels: int, groups: List[int], total_qo: int, hq: int, hkv: int, d: int) -> None:
        super().__init__(max(groups), total_qo, hq, hkv, d)
        self.levels = levels

    def describe(self) -> str:
        return f"num_levels={self.levels}, " + super().describe().replace("batch_size=", "max groups per level=", 1)


class _LevelPageIds:
    """The page ids of every level that plan() had on the host (U.HostPageIds each), checked
    against the page count of the cache each run() is given."""

    __slots__ = ("levels",)

    def __init__(self, levels: List[U.HostPageIds]) -> None:
        self.levels = levels

    def check(self, num_cache_pages: int) -> None:
        for ids in self.levels:
            ids.check(num_cache_pages)


class MultiLevelCascadeAttentionWrapper(R._RuntimeWrapper):
    """Shared-prefix (cascade) attention over a paged KV cache in ``num_levels`` levels,
    FlashInfer-compatible.

    Level ``i`` partitions the batch's query rows into groups (``qo_indptr_arr[i]``) and gives each
    group one page range (``paged_kv_indptr_arr[i]`` etc.): level 0 is typically one group of every
    row over the shared prefix, the last level one group per request over its own pages. The
    wrapper is one C++ runtime (``tessera::BatchCascadePagedWrapper``) over the caller's
    ``float_workspace_buffer`` alone: :meth:`plan` plans every level with the load-balancing
    planner (a shared level's KV is read once for all the rows of its group, packed into the same
    query tiles), and :meth:`run` computes the levels one after another and merges their states in
    level order inside the workspace (deterministic; one 16-bit rounding per level, as merging
    FlashInfer's level outputs has). ``causal`` applies to the last level only; the shared levels
    are fully visible.

    With ``use_cuda_graph=True`` :meth:`run` can be captured in a CUDA graph and replayed after any
    later :meth:`plan` within the preallocated buffers (``*_buf_arr``, one per level). As in
    FlashInfer, plan() copies each level's index arrays into those buffers, and run() reads level
    i's page ids from ``paged_kv_indices_buf_arr[i]``; the first plan fixes the number of query rows
    (q of at least that many rows at every run), the heads, head dim, dtype, page size, ``causal``
    and ``sm_scale``.

    Not supported (NotImplementedError naming them): position-dependent variants across levels
    (``window_left``, ``"ROPE_LLAMA"``, ``"ALIBI"``: a level's query positions are not the
    sequence's).
    """

    _cpp_class = "BatchCascadePagedWrapper"

    def __init__(
        self,
        num_levels: int,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf_arr: Optional[List["torch.Tensor"]] = None,
        paged_kv_indptr_buf_arr: Optional[List["torch.Tensor"]] = None,
        paged_kv_indices_buf_arr: Optional[List["torch.Tensor"]] = None,
        paged_kv_last_page_len_buf_arr: Optional[List["torch.Tensor"]] = None,
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            num_levels: number of levels, >= 1.
            float_workspace_buffer: 1-D contiguous CUDA tensor (FlashInfer's examples use 128 MB
                of uint8), the one workspace of all levels. The runtime's need grows with
                num_levels (each level keeps its plan and split states); plan() raises ValueError
                with the bytes it needs when the buffer is smaller.
            kv_layout: ``"NHD"`` or ``"HND"``.
            use_cuda_graph: keep pointers fixed so :meth:`run` can be captured.
            qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                paged_kv_last_page_len_buf_arr: with ``use_cuda_graph``, lists of ``num_levels``
                preallocated int32 CUDA tensors: level i's ``[max_groups_i + 1]``,
                ``[max_groups_i + 1]``, ``[max_pages_i]`` and ``[max_groups_i]``, where
                ``max_groups_i + 1`` is the length of ``qo_indptr_buf_arr[i]``. Ignored without
                ``use_cuda_graph`` (as in FlashInfer).
        """
        self._num_levels = U.check_positive_int("num_levels", num_levels)
        self._init_runtime(float_workspace_buffer, kv_layout, use_cuda_graph, "auto", None)
        levels = self._num_levels
        # Graph mode: per level (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf,
        # paged_kv_last_page_len_buf) and its largest group count; the first plan's query rows.
        self._graph_buffers: Optional[List[Tuple[Any, Any, Any, Any]]] = None
        self._max_groups: Optional[List[int]] = None
        self._max_rows: Optional[int] = None
        self._empty_ids: Optional["torch.Tensor"] = None  # the page table of a level without pages
        if not self._use_cuda_graph:
            return
        named = (("qo_indptr_buf_arr", qo_indptr_buf_arr), ("paged_kv_indptr_buf_arr", paged_kv_indptr_buf_arr),
                 ("paged_kv_indices_buf_arr", paged_kv_indices_buf_arr),
                 ("paged_kv_last_page_len_buf_arr", paged_kv_last_page_len_buf_arr))
        for name, value in named:
            if value is None:
                raise ValueError(f"use_cuda_graph=True needs {name} (a list of num_levels = {levels} preallocated "
                                 "int32 CUDA tensors)")
            for i, buf in enumerate(_check_level_list(name, value, levels)):
                U.check_index_tensor(f"{name}[{i}]", buf)
        assert qo_indptr_buf_arr is not None and paged_kv_indptr_buf_arr is not None
        assert paged_kv_indices_buf_arr is not None and paged_kv_last_page_len_buf_arr is not None
        max_groups = []
        for i in range(levels):
            entries = int(qo_indptr_buf_arr[i].shape[0])
            if entries < 2:
                raise ValueError(f"qo_indptr_buf_arr[{i}] has {entries} entries, expected [max_groups + 1] >= 2")
            if paged_kv_indptr_buf_arr[i].shape[0] != entries:
                raise ValueError(
                    f"paged_kv_indptr_buf_arr[{i}] has {paged_kv_indptr_buf_arr[i].shape[0]} entries, expected "
                    f"{entries} (the length of qo_indptr_buf_arr[{i}])")
            if paged_kv_last_page_len_buf_arr[i].shape[0] != entries - 1:
                raise ValueError(
                    f"paged_kv_last_page_len_buf_arr[{i}] has {paged_kv_last_page_len_buf_arr[i].shape[0]} entries, "
                    f"expected {entries - 1} (len(qo_indptr_buf_arr[{i}]) - 1)")
            max_groups.append(entries - 1)
        self._max_groups = max_groups
        self._graph_buffers = list(zip(qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                                       paged_kv_last_page_len_buf_arr))

    def _cpp_args(self) -> Tuple[Any, ...]:
        return (self._num_levels,)

    def plan(
        self,
        qo_indptr_arr: List["torch.Tensor"],
        paged_kv_indptr_arr: List["torch.Tensor"],
        paged_kv_indices_arr: List["torch.Tensor"],
        paged_kv_last_page_len: List["torch.Tensor"],
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
        """Plans every level in one runtime plan; every layer's :meth:`run` reuses it.

        Args:
            qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len:
                lists of ``num_levels`` int32 tensors: level i's query groups ``[groups_i + 1]``
                (the last entry, the batch's query rows, equal at every level), their page ranges
                ``[groups_i + 1]``, page ids ``[>= paged_kv_indptr_arr[i][-1]]`` and last-page
                lengths ``[groups_i]`` in ``[1, page_size]``. The indptr and last-page arrays are
                copied to the CPU; page ids are read on the GPU (with ``use_cuda_graph`` copied
                into ``paged_kv_indices_buf_arr[i]`` unless they are that buffer).
            num_qo_heads, num_kv_heads, head_dim, page_size: as in
                :meth:`tessera.BatchPrefillWithPagedKVCacheWrapper.plan`, the same for every level.
            causal: the last level's causal mask (query i of a group at position kv_len - qo_len +
                i of that level's pages); the shared levels are fully visible.
            sm_scale: default ``1/sqrt(head_dim)``. logits_soft_cap: ``None``/``0`` (off) or > 0.
            q_data_type, kv_data_type: float16 or bfloat16, equal; ``kv_data_type``
                ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` for an fp8 cache (read with scale
                1: FlashInfer's cascade run() takes no scales).
            pos_encoding_mode, window_left, rope_scale, rope_theta, use_fp16_qk_reduction: only
                their defaults (NotImplementedError otherwise).
        """
        levels = self._num_levels
        arrays = (("qo_indptr_arr", qo_indptr_arr), ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                  ("paged_kv_indices_arr", paged_kv_indices_arr), ("paged_kv_last_page_len", paged_kv_last_page_len))
        for name, value in arrays:
            _check_level_list(name, value, levels)
        if U.check_pos_encoding_mode(pos_encoding_mode) != "NONE":
            raise U.unsupported("pos_encoding_mode", pos_encoding_mode,
                                "'NONE' (a level's query positions are not the sequence's)")
        if U.check_window_left(window_left) != -1:
            raise U.unsupported("window_left", window_left, "-1 (a level's query positions are not the sequence's)")
        for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
            U.check_none(name, value)
        U.check_false("use_fp16_qk_reduction", use_fp16_qk_reduction)
        options = U.resolve_variant("NONE", -1, logits_soft_cap, None, None)
        causal = _check_causal(causal)
        dtype = U.resolve_plan_dtypes(q_data_type, kv_data_type)
        kv_dtype = U.resolve_plan_kv_dtype(dtype, kv_data_type)
        hq, hkv, d = U.check_heads(num_qo_heads, num_kv_heads, head_dim)
        page_size = U.check_positive_int("page_size", page_size)
        scale = U.resolve_sm_scale(sm_scale, d)

        qo_hosts = []
        for i, qo in enumerate(qo_indptr_arr):
            host = U.to_host_int32(f"qo_indptr_arr[{i}]", qo)
            U.check_indptr_values(f"qo_indptr_arr[{i}]", host)
            qo_hosts.append(host)
        rows = [int(h[-1]) for h in qo_hosts]
        if any(r != rows[-1] for r in rows):
            raise ValueError(f"qo_indptr_arr's last entries are {rows}, expected equal: every level covers all the "
                             "batch's query rows")
        total_qo = rows[-1]
        groups = [int(h.shape[0]) - 1 for h in qo_hosts]
        kv_hosts, last_hosts, num_pages = [], [], []
        for i in range(levels):
            kv_host = U.to_host_int32(f"paged_kv_indptr_arr[{i}]", paged_kv_indptr_arr[i], groups[i] + 1)
            kv_hosts.append(kv_host)
            num_pages.append(U.check_indptr_values(f"paged_kv_indptr_arr[{i}]", kv_host))
            last_hosts.append(U.to_host_int32(f"paged_kv_last_page_len[{i}]", paged_kv_last_page_len[i], groups[i]))
            indices = U.check_index_tensor(f"paged_kv_indices_arr[{i}]", paged_kv_indices_arr[i])
            if indices.shape[0] < num_pages[i]:
                raise ValueError(f"paged_kv_indices_arr[{i}] has {indices.shape[0]} entries, expected >= "
                                 f"paged_kv_indptr_arr[{i}][-1] = {num_pages[i]}")
        graph_bounds = self._graph_bounds(groups, num_pages, total_qo)

        # GPU work from here on (a failure below leaves the wrapper unplanned).
        self._planned = None
        cpp = self._holder.ensure(_CascadeNeed(levels, groups, total_qo, hq, hkv, d), dtype, "auto", 0, graph_bounds,
                                  kv_dtype=kv_dtype)
        device = self._float_workspace_buffer.device
        run_indices = []
        for i in range(levels):
            indices = paged_kv_indices_arr[i]
            if self._graph_buffers is not None:
                qo_buf, kv_buf, ids_buf, last_buf = self._graph_buffers[i]
                if indices.data_ptr() != ids_buf.data_ptr():
                    ids_buf[: num_pages[i]].copy_(indices[: num_pages[i]], non_blocking=True)
                qo_buf[: groups[i] + 1].copy_(qo_hosts[i], non_blocking=True)
                kv_buf[: groups[i] + 1].copy_(kv_hosts[i], non_blocking=True)
                last_buf[: groups[i]].copy_(last_hosts[i], non_blocking=True)
                indices = ids_buf
            elif indices.device != device:
                indices = indices.to(device, non_blocking=True)
            run_indices.append(indices if indices.numel() > 0 else self._no_pages(device))
        fp8 = U.is_fp8(kv_dtype)
        cpp.plan(qo_hosts, kv_hosts, last_hosts, page_size, hq, hkv, d, U.tessera_dtype(dtype), scale, causal,
                 U.current_stream(device), U.device_index(self._float_workspace_buffer),
                 kv_dtype=U.tessera_dtype(kv_dtype) if fp8 else None, **options.kwargs(None))
        self._planned = {
            "levels": levels,
            "groups": groups,
            "total_qo": total_qo,
            "num_qo_heads": hq,
            "num_kv_heads": hkv,
            "head_dim": d,
            "page_size": page_size,
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "indices": run_indices,
            "host_indices": _LevelPageIds([
                U.HostPageIds(f"paged_kv_indices_arr[{i}]", paged_kv_indices_arr[i], num_pages[i])
                for i in range(levels)]),
            "causal": causal,
            "sm_scale": scale,
            **_run_fields(device, self._kv_layout, hkv, d, d, page_size, kv_dtype),
        }

    begin_forward = plan

    def _graph_bounds(self, groups: List[int], num_pages: List[int], total_qo: int) -> Optional[Tuple[int, int]]:
        """With CUDA graphs: each level within its buffers; (the largest level's groups, the first
        plan's query rows), the bounds of the runtime."""
        if self._graph_buffers is None:
            return None
        assert self._max_groups is not None
        for i, (_, _, ids_buf, _) in enumerate(self._graph_buffers):
            if groups[i] > self._max_groups[i]:
                raise ValueError(
                    f"qo_indptr_arr[{i}] has {groups[i]} groups, more than the {self._max_groups[i]} of the "
                    f"preallocated qo_indptr_buf_arr[{i}] (use_cuda_graph)")
            if num_pages[i] > ids_buf.shape[0]:
                raise ValueError(
                    f"paged_kv_indptr_arr[{i}][-1] = {num_pages[i]} pages exceed the {ids_buf.shape[0]} entries of "
                    f"paged_kv_indices_buf_arr[{i}] (use_cuda_graph)")
        if self._max_rows is None:
            self._max_rows = max(1, total_qo)
        elif total_qo > self._max_rows:
            raise ValueError(
                f"qo_indptr_arr[i][-1] = {total_qo} query rows exceed the {self._max_rows} of the first plan, which "
                "fixes them with use_cuda_graph (as in FlashInfer)")
        return max(self._max_groups), self._max_rows

    def _no_pages(self, device: Any) -> "torch.Tensor":
        """The page table of a level without pages: the runtime reads no entry of it, but wants one
        that exists (an empty tensor has no storage to point at)."""
        if self._empty_ids is None or self._empty_ids.device != device:
            torch = U._torch()
            self._empty_ids = torch.zeros(1, dtype=torch.int32, device=device)
        return self._empty_ids

    def run(self, q: "torch.Tensor", paged_kv_cache: Any) -> "torch.Tensor":
        """Runs every level and merges their states in level order, on PyTorch's current stream.

        Args:
            q: ``[rows, num_qo_heads, head_dim]``, rows at least the plan's query rows (with
                ``use_cuda_graph``: at least the first plan's).
            paged_kv_cache: ``(k_cache, v_cache)`` or one ``[num_pages, 2, ...]`` tensor in
                ``kv_layout``, as in :meth:`tessera.BatchPrefillWithPagedKVCacheWrapper.run`; every
                level's page ids index it.

        Returns:
            ``out`` ``[rows, num_qo_heads, head_dim]`` (rows beyond the plan's query rows are not
            attention outputs).
        """
        p = self._planned
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with this batch's index arrays first")
        q, out, _ = _check_run_queries(q, None, None, False, p)
        k, v, kv = _check_paged_cache(paged_kv_cache, self._kv_layout, q, p)
        kv_dtype = None
        if p["fp8"]:  # fp8 K/V go to the bindings as uint8 views, their dtype named separately
            k, v, kv, kv_dtype = U.kv_arg(k), U.kv_arg(v), U.kv_arg(kv), p["kv_dtype_arg"]
        layout = p["layout_arg"]
        caches = [(k, v, kv, layout, indices) for indices in p["indices"]]
        U.launch(self._holder.cpp.run, q, q, caches, out, None, U.current_stream(q.device), kv_dtype=kv_dtype)
        return out

    forward = run

    def reset_workspace_buffer(self, float_workspace_buffer: "torch.Tensor",
                               int_workspace_buffers: Optional[List["torch.Tensor"]] = None) -> None:
        """Replaces the workspace (the next ``plan()`` rebuilds the runtime over it).

        ``int_workspace_buffers`` (FlashInfer's list of one per level) is accepted for compatibility
        and unused: Tessera keeps its plan in the float workspace. Not allowed with
        ``use_cuda_graph``.
        """
        super().reset_workspace_buffer(float_workspace_buffer)

    def plan_info(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        """What the last plan decided for each level (a list, level 0 first, of the dicts that
        :meth:`tessera.BatchPrefillWithPagedKVCacheWrapper.plan_info` returns)."""
        cpp = self._holder.cpp
        if cpp is None:
            raise RuntimeError("plan() has not been called yet")
        return [dict(cpp.plan_info(i)) for i in range(self._num_levels)]
