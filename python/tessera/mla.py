"""Multi-head latent attention (DeepSeek MLA) with FlashInfer's ``BatchMLAPagedAttentionWrapper`` API
(flashinfer.mla).

Absorbed form: every query head attends to one paged latent cache, ``ckv`` (width 512) and its
rotary key part ``kpe`` (width 64). The caller passes ``q_nope`` already multiplied by the key
up-projection (width 512) and ``q_pe`` (width 64); the logits are ``sm_scale * (q_nope . ckv +
q_pe . kpe)`` and the output stays in latent space (width 512). The wrapper holds the C++
plan/run runtime's ``BatchMLAPagedWrapper`` (include/tessera/runtime.h; sm_90 GPUs, wgmma):
``plan()`` checks the page table and plans the batch on the host, balancing its (token, head) tiles
of 64 rows and chunks of their KV length over one persistent CTA per SM (a long request among short
ones is split; a batch that fills the GPU is not), and ``run()`` launches the persistent kernel and,
when the plan split a tile, the merge of its states. The plan and the split states live in the
float workspace (about 35 MiB on a 132-SM GPU; FlashInfer's examples allocate 128 MiB).

An fp8 latent cache (``kv_data_type`` ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` under float16
or bfloat16 queries) is read as stored x scale: ``run()``'s ``k_scale`` dequantizes the cache as
the key (``ckv`` and ``kpe``), ``v_scale`` as the value (``ckv``), as the decode wrappers' scales.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple, Union

from . import _runtime as R
from . import _utils as U

__all__ = ["BatchMLAPagedAttentionWrapper"]

_CKV_DIM = 512
_KPE_DIM = 64


class BatchMLAPagedAttentionWrapper:
    """MLA over a paged latent cache, decode and append-style prefill (FlashInfer's
    ``flashinfer.mla.BatchMLAPagedAttentionWrapper``).

    ``plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, 512, 64, page_size, causal,
    sm_scale, q_data_type, kv_data_type)`` fixes a batch; ``run(q_nope, q_pe, ckv_cache,
    kpe_cache)`` computes it. Request b's queries are rows ``qo_indptr[b] .. qo_indptr[b+1]-1``;
    its cache is pages ``kv_indices[kv_indptr[b] ..]`` holding ``kv_len_arr[b]`` tokens; its query
    token i sits at position ``kv_len - qo_len + i`` (the new tokens are the cache's last). The LSE
    is base 2 unless ``return_lse_base_on_e``.

    With ``use_cuda_graph=True`` the page ids live in the ``kv_indices`` buffer given here and
    ``plan()`` copies into it (the other index arrays go into the workspace with the plan), so a
    captured ``run()`` replays later plans, split or not; a later plan may not have more requests
    than the buffers or more query tokens than the first plan (the captured queries' rows), and
    keeps its heads, dtype, page size, causal and sm_scale.
    """

    def __init__(
        self,
        float_workspace_buffer: "torch.Tensor",
        use_cuda_graph: bool = False,
        qo_indptr: Optional["torch.Tensor"] = None,
        kv_indptr: Optional["torch.Tensor"] = None,
        kv_indices: Optional["torch.Tensor"] = None,
        kv_len_arr: Optional["torch.Tensor"] = None,
        backend: str = "auto",
    ) -> None:
        """Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor, 256-byte aligned (e.g. 128 MiB of
                uint8): the runtime's plan and split states (plan() names the bytes it needs when
                it holds fewer).
            use_cuda_graph: keep every device pointer fixed so ``run()`` can be captured; then the
                four int32 CUDA buffers below are required (sized for the largest batch).
            qo_indptr, kv_indptr: ``[max_batch + 1]``; kv_indices: ``[max_pages]``; kv_len_arr:
                ``[max_batch]``.
            backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (one MLA kernel, for sm_90).
        """
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        U.check_cuda("float_workspace_buffer", ws)
        U.check_backend(backend, ws.device)
        self._device = ws.device
        self._use_cuda_graph = bool(use_cuda_graph)
        self._buffers = None
        if self._use_cuda_graph:
            named = (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                     ("kv_len_arr", kv_len_arr))
            for name, t in named:
                if t is None:
                    raise ValueError(f"{name} is None, expected a preallocated int32 CUDA buffer (use_cuda_graph=True)")
                U.check_index_tensor(name, t)
                U.check_cuda(name, t)
                U.check_same_device(name, t, "float_workspace_buffer", ws)
            if qo_indptr.shape[0] != kv_indptr.shape[0] or kv_len_arr.shape[0] != kv_indptr.shape[0] - 1:
                raise ValueError(
                    f"qo_indptr, kv_indptr and kv_len_arr have {qo_indptr.shape[0]}, {kv_indptr.shape[0]} and "
                    f"{kv_len_arr.shape[0]} entries, expected max_batch + 1, max_batch + 1 and max_batch")
            # FlashInfer's graph buffers: kv_indices holds the page ids a captured run() reads; the
            # other arrays' values travel with the plan (the workspace), their sizes bound the batch.
            self._buffers = {
                "qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_len_arr": kv_len_arr,
            }
        if not ws.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous")
        # The split states' bytes: any element type (FlashInfer's examples allocate int8, which
        # DLPack has no Tessera dtype for), seen as uint8.
        self._workspace = ws.view(U._torch().uint8)
        # torch.compile: the handle of the custom op tessera::mla_run; the workspace and the graph
        # buffers keep their addresses (static for CUDA graphs).
        self._handle = R.enable_compile(self, ws, *(self._buffers.values() if self._buffers else ()))
        self._runtime = R._RuntimeHolder("BatchMLAPagedWrapper", ws, self._use_cuda_graph)
        self._graph_total_q: Optional[int] = None
        self._plan: Optional[dict] = None
        self._kv_scales = R._KVScaleBuffer()  # an fp8 cache's k_scale / v_scale, read by the kernel

    def plan(
        self,
        qo_indptr: "torch.Tensor",
        kv_indptr: "torch.Tensor",
        kv_indices: "torch.Tensor",
        kv_len_arr: "torch.Tensor",
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: Any,
        kv_data_type: Any,
        use_profiler: bool = False,
    ) -> None:
        """Fixes the batch. Index arrays are int32 (host or CUDA; read on the host here, as
        FlashInfer's plan does). ``head_dim_ckv`` must be 512 and ``head_dim_kpe`` 64;
        ``sm_scale`` is required (the usual ``1 / sqrt(192)`` belongs to the model's head dims);
        ``q_data_type`` float16 or bfloat16; ``kv_data_type`` the same, or an fp8 cache's
        ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (its scales go to :meth:`run`)."""
        torch = U._torch()
        U.check_false("use_profiler", use_profiler)
        num_heads = U.check_positive_int("num_heads", num_heads)
        page_size = U.check_positive_int("page_size", page_size)
        if head_dim_ckv != _CKV_DIM:
            raise U.unsupported("head_dim_ckv", head_dim_ckv, f"{_CKV_DIM} (DeepSeek's latent width)")
        if head_dim_kpe != _KPE_DIM:
            raise U.unsupported("head_dim_kpe", head_dim_kpe, f"{_KPE_DIM} (DeepSeek's rotary width)")
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) \
                or sm_scale <= 0:
            raise ValueError(f"sm_scale = {sm_scale!r}, expected a finite float > 0")
        q_dtype = U.canonical_dtype(q_data_type, "q_data_type")
        kv_dtype = U.canonical_dtype(kv_data_type, "kv_data_type")
        if q_dtype not in (torch.float16, torch.bfloat16):
            raise U.unsupported("q_data_type", q_dtype, "torch.float16 or torch.bfloat16")
        fp8 = U.is_fp8(kv_dtype)
        if kv_dtype != q_dtype and not fp8:
            raise TypeError(f"kv_data_type = {kv_dtype}, expected q_data_type {q_dtype}, torch.float8_e4m3fn or "
                            "torch.float8_e5m2")

        qo_host = U.to_host_int32("qo_indptr", qo_indptr)
        kv_host = U.to_host_int32("kv_indptr", kv_indptr)
        U.check_indptr_values("qo_indptr", qo_host)
        U.check_indptr_values("kv_indptr", kv_host)
        batch = qo_host.numel() - 1
        if kv_host.numel() != batch + 1:
            raise ValueError(f"kv_indptr has {kv_host.numel()} entries, expected {batch + 1} (len(qo_indptr))")
        len_host = U.to_host_int32("kv_len_arr", kv_len_arr, batch)
        U.check_index_tensor("kv_indices", kv_indices)
        if kv_indices.shape[0] < int(kv_host[-1]):
            raise ValueError(f"kv_indices has {kv_indices.shape[0]} entries, expected >= kv_indptr[-1] = {int(kv_host[-1])}")
        pages = kv_host[1:] - kv_host[:-1]
        need = (len_host.clamp(min=0) + page_size - 1) // page_size
        bad = ((len_host < 0) | (pages != need)).nonzero()
        if bad.numel() > 0:
            b = int(bad[0, 0])
            raise ValueError(
                f"kv_len_arr[{b}] = {int(len_host[b])} needs {int(need[b])} pages of {page_size}, but kv_indptr gives "
                f"request {b} {int(pages[b])}")
        last_host = torch.where(len_host > 0, (len_host - 1) % page_size + 1, torch.zeros_like(len_host))
        total_q = int(qo_host[-1])

        dev = self._device
        graph_bounds = None
        if self._use_cuda_graph:
            buf = self._buffers
            max_batch = buf["qo_indptr"].shape[0] - 1
            if batch > max_batch or int(kv_host[-1]) > buf["kv_indices"].shape[0]:
                raise ValueError(
                    f"a batch of {batch} requests and {int(kv_host[-1])} pages exceeds the CUDA-graph buffers "
                    f"({max_batch} requests, {buf['kv_indices'].shape[0]} pages)")
            if self._graph_total_q is None:
                self._graph_total_q = max(1, total_q)
            graph_bounds = (max_batch, self._graph_total_q)
            # The captured run() reads the page ids from this buffer.
            buf["kv_indices"][: int(kv_host[-1])].copy_(kv_indices[: int(kv_host[-1])])
            page_ids = buf["kv_indices"]
        else:
            page_ids = kv_indices.to(dev) if kv_indices.device != dev else kv_indices
        need = R._Need(batch, total_q, num_heads, 1, _CKV_DIM + _KPE_DIM)
        cpp = self._runtime.ensure(need, q_dtype, "auto", 0, graph_bounds=graph_bounds, kv_dtype=kv_dtype if fp8 else None)
        fp8_kwargs = dict(kv_dtype=U.tessera_dtype(kv_dtype), **self._kv_scales.plan_kwargs(dev)) if fp8 else {}
        U.call(cpp.plan, self._workspace, qo_host, kv_host, last_host, page_size, num_heads, U.tessera_dtype(q_dtype), float(sm_scale),
               bool(causal), U.current_stream(dev), U.device_index(self._workspace), **fp8_kwargs)
        self._plan = {
            "num_heads": num_heads, "page_size": page_size, "dtype": q_dtype, "kv_dtype": kv_dtype, "total_q": total_q,
            "kv_indices": page_ids, "page_ids": U.HostPageIds("kv_indices", kv_indices, int(kv_host[-1])),
        }

    def plan_info(self) -> dict:
        """What the last plan() decided (the C++ PlanInfo as a dict: items, merges, chunk size, the
        makespan against its lower bound), for tests, benchmarks and logs."""
        return self._runtime.plan_info()

    def _launch(self, q_nope: "torch.Tensor", q_pe: "torch.Tensor", ckv_cache: "torch.Tensor",
                kpe_cache: "torch.Tensor", out: "torch.Tensor", lse: Optional["torch.Tensor"], k_scale: Any = None,
                v_scale: Any = None) -> None:
        """The runtime's run() of the plan, after run()'s checks (eager, or inside the custom op);
        k_scale / v_scale as run() takes them."""
        from .decode import _run_kv_scales

        p = self._plan
        p["page_ids"].check(ckv_cache.shape[0])  # page ids plan() had on the host, against this cache
        fp8 = _run_kv_scales(self._kv_scales, p, k_scale, v_scale, self._use_cuda_graph)
        U.call(self._runtime.cpp.run, q_nope, q_nope, q_pe, U.kv_arg(ckv_cache), U.kv_arg(kpe_cache), p["kv_indices"],
               out, lse, U.current_stream(q_nope.device), kv_dtype=U.tessera_dtype(p["kv_dtype"]) if fp8 else None)

    def run(
        self,
        q_nope: "torch.Tensor",
        q_pe: "torch.Tensor",
        ckv_cache: "torch.Tensor",
        kpe_cache: "torch.Tensor",
        out: Optional["torch.Tensor"] = None,
        lse: Optional["torch.Tensor"] = None,
        return_lse: bool = False,
        profiler_buffer: Optional["torch.Tensor"] = None,
        kv_len: Optional["torch.Tensor"] = None,
        page_table: Optional["torch.Tensor"] = None,
        return_lse_base_on_e: bool = False,
        *,
        k_scale: Optional[Any] = None,
        v_scale: Optional[Any] = None,
    ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        """Args:
            q_nope: ``[total_q, num_heads, 512]``; q_pe: ``[total_q, num_heads, 64]`` (the planned
                dtype; contiguous last dimension; may be slices of one ``[.., 576]`` tensor).
            ckv_cache: ``[num_pages, page_size, 512]``; kpe_cache: ``[num_pages, page_size, 64]``
                (may be slices of one ``[num_pages, page_size, 576]`` tensor), of the planned
                ``kv_data_type``.
            out: optional ``[total_q, num_heads, 512]`` output; lse: optional float32
                ``[total_q, num_heads]``.
            k_scale, v_scale: an fp8 cache's dequantization scales, of the key (ckv and kpe) and of
                the value (ckv): None (1), a float or a float32 CUDA tensor of one element (read
                on the stream: graph-capturable). A 16-bit cache takes None or 1.0 only.

        Returns ``out``, or ``(out, lse)`` with ``return_lse``."""
        torch = U._torch()
        if self._plan is None:
            raise RuntimeError("run() called before plan()")
        U.check_none("profiler_buffer", profiler_buffer)
        U.check_none("kv_len", kv_len, "None (the planned kv_len_arr is used)")
        U.check_none("page_table", page_table, "None (the planned kv_indices are used)")
        p = self._plan
        dt = p["dtype"]
        total_q, heads = p["total_q"], p["num_heads"]
        U.check_tensor("q_nope", q_nope, ndim=3, dtypes=(dt,))
        U.check_tensor("q_pe", q_pe, ndim=3, dtypes=(dt,))
        U.check_shape("q_nope", q_nope, (total_q, heads, _CKV_DIM), "[qo_indptr[-1], num_heads, 512] of the plan")
        U.check_shape("q_pe", q_pe, (total_q, heads, _KPE_DIM), "[qo_indptr[-1], num_heads, 64] of the plan")
        U.check_tensor("ckv_cache", ckv_cache, ndim=3, dtypes=(p["kv_dtype"],))
        U.check_tensor("kpe_cache", kpe_cache, ndim=3, dtypes=(p["kv_dtype"],))
        if ckv_cache.shape[1] != p["page_size"] or ckv_cache.shape[2] != _CKV_DIM:
            raise ValueError(f"ckv_cache has shape {tuple(ckv_cache.shape)}, expected [num_pages, {p['page_size']}, 512]")
        U.check_shape("kpe_cache", kpe_cache, (ckv_cache.shape[0], p["page_size"], _KPE_DIM),
                      "[num_pages, page_size, 64] like ckv_cache")
        for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
            U.check_cuda(name, t)
            if t.device != self._device:
                raise ValueError(f"{name} is on {t.device}, expected {self._device} (the workspace's device)")
        if out is not None:
            U.check_tensor("out", out, ndim=3, dtypes=(dt,))
            U.check_shape("out", out, (total_q, heads, _CKV_DIM), "[total_q, num_heads, 512]")
        if lse is not None:
            U.check_tensor("lse", lse, ndim=2, dtypes=(torch.float32,))
            U.check_shape("lse", lse, (total_q, heads), "[total_q, num_heads]")
        if R.compiling():
            # torch.compile: one opaque node (tessera::mla_run, tessera/_ops.py) that launches what
            # the eager path below launches.
            from .decode import _op_kv_scales

            scales = _op_kv_scales(p, k_scale, v_scale, self._workspace)
            o, l = R._OPS.MLA_RUN(self._handle, q_nope, q_pe, ckv_cache, kpe_cache, self._workspace, out, lse,
                                  bool(return_lse), *scales)
            out = o if out is None else out
            lse = (l if lse is None else lse) if return_lse else lse
        else:
            if out is None:
                out = torch.empty((total_q, heads, _CKV_DIM), dtype=dt, device=q_nope.device)
            if return_lse and lse is None:
                lse = torch.empty((total_q, heads), dtype=torch.float32, device=q_nope.device)
            self._launch(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, k_scale, v_scale)
        if lse is not None and return_lse_base_on_e:
            lse.mul_(math.log(2.0))
        return (out, lse) if return_lse else out
