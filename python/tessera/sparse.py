"""Block-sparse attention.

- :class:`BlockSparseAttentionWrapper`: FlashInfer's ``BlockSparseAttentionWrapper`` API
  (flashinfer.sparse). The attention matrix of M query rows and N key columns is cut into R x C
  blocks; ``indptr`` and ``indices`` (scipy's BSR) list, for each block row, the column blocks it
  attends to. Each run is one ``block_sparse_attention`` launch of the C++ library (the one-shot
  prefill kernels, wgmma on sm_90), no plan/run runtime: ``plan()`` validates and keeps the block
  layout on the device, so ``run()`` only checks shapes and launches. The float workspace is
  accepted for FlashInfer's signature and not used.
- :class:`BlockSparsePagedAttentionWrapper` (Tessera's; no FlashInfer counterpart): a batch of
  requests over a paged KV cache, each under its own block mask at its LOGICAL positions, through
  the plan/run runtime (``tessera::BatchBlockSparsePagedWrapper``): blocks outside the mask are
  never loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

from . import _runtime as R
from . import _utils as U
from ._runtime import _KVScaleBuffer, _Need, split_options
from .decode import (PagedKVCache, _check_paged_cache, _check_run_queries, _paged_run_compiled, _run_fields,
                     _run_kv_scales)
from .prefill import _check_causal

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["BlockSparseAttentionWrapper", "BlockSparsePagedAttentionWrapper", "paged_block_mask"]


class BlockSparseAttentionWrapper:
    """Attention under a block-sparse mask (FlashInfer's ``flashinfer.sparse.BlockSparseAttentionWrapper``).

    ``plan(indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, ...)`` fixes the
    layout and options; ``run(q, k, v)`` computes, for query row i of block row i // R, softmax
    attention over the columns of its listed column blocks (then the causal mask with offset
    N - M, when planned), q ``[M, num_qo_heads, head_dim]``, k/v ``[N, num_kv_heads, head_dim]``.
    Rows that see no column get 0 and LSE ``-inf``; the LSE is base 2.
    """

    def __init__(self, float_workspace_buffer: "torch.Tensor", backend: str = "auto") -> None:
        """Args:
            float_workspace_buffer: a 1-D CUDA tensor of any one-byte dtype (kept for FlashInfer's
                signature; the one-shot kernels use none).
            backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (each runs Tessera's kernels for the device).
        """
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        U.check_backend(backend, ws.device)
        U.check_cuda("float_workspace_buffer", ws)
        self._float_workspace_buffer = ws
        self._planned: Optional[dict] = None

    def reset_workspace_buffer(self, float_workspace_buffer: "torch.Tensor",
                               int_workspace_buffer: Optional["torch.Tensor"] = None) -> None:
        """Replaces the (unused) workspace, as FlashInfer's wrappers allow."""
        ws = U.check_tensor("float_workspace_buffer", float_workspace_buffer, ndim=1)
        U.check_cuda("float_workspace_buffer", ws)
        self._float_workspace_buffer = ws

    def plan(
        self,
        indptr: "torch.Tensor",
        indices: "torch.Tensor",
        M: int,
        N: int,
        R: int,
        C: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        mask: Optional["torch.Tensor"] = None,
        packed_mask: Optional["torch.Tensor"] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: Union[str, "torch.dtype"] = "float16",
        kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
        o_data_type: Optional[Union[str, "torch.dtype"]] = None,
        non_blocking: bool = True,
    ) -> None:
        """Fixes the block layout and the options of the following runs.

        Args:
            indptr: int32 ``[ceil(M / R) + 1]`` offsets into indices (host or device; indptr[0] = 0,
                non-decreasing).
            indices: int32 column-block ids in ``[0, ceil(N / C))``, increasing within a block row.
            M, N: query rows and key columns. R, C: block rows and columns (any sizes >= 1).
            num_qo_heads, num_kv_heads, head_dim: the heads (GQA: num_qo_heads a multiple of
                num_kv_heads) and a head dim with kernels.
            mask, packed_mask: element masks inside blocks: not supported yet (NotImplementedError).
            causal: hide column j from query row i when j > i + N - M.
            pos_encoding_mode: ``"NONE"`` or ``"ALIBI"`` (``"ROPE_LLAMA"``: NotImplementedError here).
            use_fp16_qk_reduction: only False.
            logits_soft_cap: None/0 (off) or > 0. sm_scale: default ``1/sqrt(head_dim)``.
            rope_scale, rope_theta: used with ROPE_LLAMA only.
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16, one dtype.
            non_blocking: accepted (the layout is copied to the device on the current stream).
        """
        torch = U._torch()
        if mask is not None or packed_mask is not None:
            raise U.unsupported("mask" if mask is not None else "packed_mask", "a tensor",
                                "None (element masks inside blocks are not supported by this wrapper yet; "
                                "tessera.flex_attention takes any mask_mod)")
        U.check_false("use_fp16_qk_reduction", use_fp16_qk_reduction)
        variant = U.resolve_variant(pos_encoding_mode, -1, logits_soft_cap, rope_scale, rope_theta)
        if variant.rope:
            raise U.unsupported("pos_encoding_mode", pos_encoding_mode,
                                "'NONE' or 'ALIBI' for block-sparse attention")
        m, n = U.check_positive_int("M", M), U.check_positive_int("N", N)
        r, c = U.check_positive_int("R", R), U.check_positive_int("C", C)
        hq, hkv, d = U.check_heads(num_qo_heads, num_kv_heads, head_dim)
        dtype = U.resolve_plan_dtypes(q_data_type, kv_data_type, None, o_data_type)
        kv_dtype = U.resolve_plan_kv_dtype(dtype, kv_data_type)
        if U.is_fp8(kv_dtype):
            raise U.unsupported("kv_data_type", kv_dtype, "q's dtype (fp8 K/V are not wired into this wrapper yet)")
        row_blocks = -(-m // r)
        host_indptr = U.to_host_int32("indptr", indptr, row_blocks + 1)
        U.check_indptr_values("indptr", host_indptr)
        nnz = int(host_indptr[-1])
        U.check_index_tensor("indices", indices)
        if indices.shape[0] < nnz:
            raise ValueError(f"indices has {indices.shape[0]} entries, expected >= indptr[-1] = {nnz}")
        _check_block_ids(U.to_host_int32("indices", indices)[:nnz], host_indptr, -(-n // c))
        device = self._float_workspace_buffer.device
        dev_indptr = host_indptr.to(device, non_blocking=False)
        dev_indices = indices.to(device) if indices.device != device else indices
        if nnz == 0:  # the kernels take non-empty arrays; no block row lists anything
            dev_indices = torch.zeros(1, dtype=torch.int32, device=device)
        self._planned = {
            "indptr": dev_indptr, "indices": dev_indices, "M": m, "N": n, "R": r, "C": c,
            "num_qo_heads": hq, "num_kv_heads": hkv, "head_dim": d, "dtype": dtype, "causal": bool(causal),
            "sm_scale": U.resolve_sm_scale(sm_scale, d), "variant": variant,
        }

    begin_forward = plan

    def run(
        self,
        q: "torch.Tensor",
        k: "torch.Tensor",
        v: "torch.Tensor",
        scale_q: Optional["torch.Tensor"] = None,
        scale_k: Optional["torch.Tensor"] = None,
        scale_v: Optional["torch.Tensor"] = None,
        out: Optional["torch.Tensor"] = None,
        lse: Optional["torch.Tensor"] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
    ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        """Runs the planned attention on PyTorch's current stream.

        Args:
            q: ``[M, num_qo_heads, head_dim]``; k, v: ``[N, num_kv_heads, head_dim]`` (last dim
                contiguous), of the planned dtype, on the workspace's device.
            scale_q, scale_k, scale_v: only None (fp8 operands are not supported here).
            out: optional ``[M, num_qo_heads, head_dim]`` output of q's dtype.
            lse: optional float32 ``[M, num_qo_heads]`` (base-2 LSE, used with return_lse).
            return_lse: return ``(out, lse)``.
            enable_pdl: accepted and ignored.
        """
        torch = U._torch()
        p = self._planned
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with the block layout first")
        for name, value in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v)):
            U.check_none(name, value, "None (fp8 operands are not supported by the block-sparse wrapper)")
        hq, hkv, d, dtype = p["num_qo_heads"], p["num_kv_heads"], p["head_dim"], p["dtype"]
        U.check_tensor("q", q, ndim=3, dtypes=(dtype,))
        U.check_shape("q", q, (p["M"], hq, d), "[M, num_qo_heads, head_dim] of the plan")
        for name, t in (("k", k), ("v", v)):
            U.check_tensor(name, t, ndim=3, dtypes=(dtype,))
            U.check_shape(name, t, (p["N"], hkv, d), "[N, num_kv_heads, head_dim] of the plan")
            U.check_same_device(name, t, "q", q)
        U.check_same_device("q", q, "float_workspace_buffer", self._float_workspace_buffer)
        if out is None:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        else:
            U.check_tensor("out", out, ndim=3, dtypes=(dtype,))
            U.check_shape("out", out, tuple(q.shape))
        if return_lse:
            if lse is None:
                lse = torch.empty((q.shape[0], hq), dtype=torch.float32, device=q.device)
            else:
                U.check_tensor("lse", lse, ndim=2, dtypes=(torch.float32,))
                U.check_shape("lse", lse, (q.shape[0], hq))
        variant = p["variant"]
        alibi = U.alibi_slopes(hq, q.device) if variant.alibi else None
        U.call(U._C().block_sparse_attention, q, q, k, v, p["indptr"], p["indices"], None, p["R"], p["C"], out,
               lse if return_lse else None, p["sm_scale"], p["causal"], U.current_stream(q.device),
               logits_soft_cap=variant.logits_soft_cap, alibi_slopes=alibi)
        return (out, lse) if return_lse else out

    forward = run

    def end_forward(self) -> None:
        """Kept for compatibility with older FlashInfer code; does nothing."""


class _BlockSparseNeed(_Need):
    """A block-sparse paged plan's requirements: the runtime's max_batch_size bounds both the
    requests and the block rows, so its batch is the larger of the two."""

    __slots__ = ("requests", "block_rows")

    def __init__(self, requests: int, block_rows: int, total_qo: int, hq: int, hkv: int, d: int) -> None:
        super().__init__(max(requests, block_rows), total_qo, hq, hkv, d)
        self.requests, self.block_rows = int(requests), int(block_rows)

    def describe(self) -> str:
        rest = super().describe().split(", ", 1)[1]  # without batch_size=
        return f"requests={self.requests}, block rows={self.block_rows}, {rest}"


class BlockSparsePagedAttentionWrapper(R._RuntimeWrapper):
    """Block-sparse attention over a paged KV cache: a batch of requests, each under its own block
    mask at its LOGICAL key positions (Tessera's; FlashInfer has no counterpart).

    Request b owns query rows ``qo_indptr[b]:qo_indptr[b+1]`` and the pages
    ``paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b+1]]`` of the cache, which hold its
    ``kv_len`` keys (full pages, then ``paged_kv_last_page_len[b]`` keys in the last). Its queries are
    cut into block rows of ``block_rows`` queries (the last may have fewer), numbered request by
    request: ``R = sum over b of ceil(qo_len_b / block_rows)`` block rows. Block row r sees the column
    blocks ``mask_indices[mask_indptr[r]:mask_indptr[r+1]]`` of its request, block c being the
    request's key positions ``c * block_cols`` to ``c * block_cols + block_cols - 1`` whatever pages
    hold them (positions at or past kv_len are masked). Blocks outside the mask are never loaded.
    ``causal`` and ``window_left`` apply at logical positions too: query i of a request sits at
    ``kv_len - qo_len + i``. A block flagged in ``mask_flags`` skips every mask, so flag only blocks
    whose every (query, key) pair is visible. Rows that see no key get 0 and LSE ``-inf``; the LSE
    is base 2.

    The wrapper is one C++ runtime (``tessera::BatchBlockSparsePagedWrapper``) over the caller's
    workspace: :meth:`plan` once per batch shape and mask (it balances the listed blocks over the
    GPU and splits long block rows), :meth:`run` once per layer. With ``use_cuda_graph=True``
    :meth:`run` can be captured in a CUDA graph and replayed after any later :meth:`plan` within the
    preallocated buffers.
    """

    _cpp_class = "BatchBlockSparsePagedWrapper"

    def __init__(
        self,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        backend: str = "auto",
        *,
        paged_kv_indices_buf: Optional["torch.Tensor"] = None,
        mask_indices_buf: Optional["torch.Tensor"] = None,
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor (e.g. 128 MiB of uint8); too small
                for a plan: ValueError with the bytes it needs.
            kv_layout: ``"NHD"`` (pages ``[num_pages, page_size, num_kv_heads, head_dim]``) or
                ``"HND"`` (``[num_pages, num_kv_heads, page_size, head_dim]``).
            use_cuda_graph: keep every pointer :meth:`run` passes fixed so that it can be captured;
                needs the two buffers below. The first plan fixes the number of query rows (q and
                out of exactly that many rows at every run), the bound on the requests and on the
                block rows of later plans (the larger of the first plan's requests and query rows),
                the heads, head dim, dtypes, page size, block shape, ``causal``, ``sm_scale`` and the
                variant options.
            backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (Tessera's kernels for the device; ``"fa3"``
                needs sm_90).
            paged_kv_indices_buf: with ``use_cuda_graph``, an int32 CUDA tensor ``[max_pages]``
                that plan() copies the page ids into (unless they are this buffer) and the captured
                run() reads them from. Ignored otherwise.
            mask_indices_buf: with ``use_cuda_graph``, an int32 CUDA tensor ``[max_blocks]`` (the
                most listed blocks of any plan) that plan() copies mask_indices into (unless they
                are this buffer); the wrapper keeps a uint8 buffer of as many flags beside it.
                Ignored otherwise.
        """
        ws = self._init_runtime(float_workspace_buffer, kv_layout, use_cuda_graph, backend, None)
        self._kv_scales = _KVScaleBuffer()  # an fp8 cache's scales, filled by run()
        self._empty: Dict[Any, "torch.Tensor"] = {}  # one-element stand-ins for empty index arrays
        # Graph mode: the preallocated buffers, and the bounds the first plan fixes.
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._mask_indices_buf = mask_indices_buf
        self._mask_flags_buf: Optional["torch.Tensor"] = None
        self._max_batch: Optional[int] = None
        self._max_rows: Optional[int] = None
        if self._use_cuda_graph:
            for name, buf in (("paged_kv_indices_buf", paged_kv_indices_buf), ("mask_indices_buf", mask_indices_buf)):
                if buf is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (a preallocated int32 CUDA tensor)")
                U.check_index_tensor(name, buf)
                if buf.shape[0] < 1:
                    raise ValueError(f"{name} is empty, expected at least one entry")
                U.check_same_device(name, buf, "float_workspace_buffer", ws)
            assert mask_indices_buf is not None
            self._mask_flags_buf = U._torch().zeros(mask_indices_buf.shape[0], dtype=U._torch().uint8,
                                                    device=mask_indices_buf.device)
        # torch.compile: the handle of the custom op tessera::block_sparse_paged_run (tessera/_ops.py);
        # the workspace and the preallocated page ids and block mask keep their addresses (static for
        # CUDA graphs).
        graph_bufs = (paged_kv_indices_buf, mask_indices_buf, self._mask_flags_buf) if self._use_cuda_graph else ()
        self._handle = R.enable_compile(self, ws, *graph_bufs)

    def plan(
        self,
        qo_indptr: "torch.Tensor",
        paged_kv_indptr: "torch.Tensor",
        paged_kv_indices: "torch.Tensor",
        paged_kv_last_page_len: "torch.Tensor",
        mask_indptr: "torch.Tensor",
        mask_indices: "torch.Tensor",
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        block_rows: int,
        block_cols: int,
        *,
        mask_flags: Optional["torch.Tensor"] = None,
        causal: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type: Union[str, "torch.dtype"] = "float16",
        kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
        variant: Optional[Any] = None,
    ) -> None:
        """Plans one batch shape and block mask; every layer's :meth:`run` reuses it.

        Args:
            qo_indptr: int32 ``[batch_size + 1]``, request b owns query rows
                ``qo_indptr[b]:qo_indptr[b+1]`` (copied to the CPU).
            paged_kv_indptr: int32 ``[batch_size + 1]``, request b's page range (copied to the CPU).
            paged_kv_indices: int32 ``[>= paged_kv_indptr[-1]]`` page ids (on the CPU: checked
                against the cache at run(); copied to the workspace's GPU).
            paged_kv_last_page_len: int32 ``[batch_size]``, the keys in each request's last page,
                in ``[1, page_size]`` (copied to the CPU).
            mask_indptr: int32 ``[R + 1]``, block row r's entries of mask_indices
                ``mask_indptr[r]:mask_indptr[r+1]``; ``R = sum over b of ceil(qo_len_b / block_rows)``,
                block rows numbered request by request (copied to the CPU).
            mask_indices: int32 ``[>= mask_indptr[-1]]``, each block row's column blocks in
                increasing order, below ``ceil(kv_len / block_cols)`` of its request. Given on the
                CPU they are checked here (a ValueError names the entry) and copied to the
                workspace's GPU; given there they are used in place (keep them unchanged while the
                plan runs) and the library checks them in checked mode (``TESSERA_CHECKED=1``).
            num_qo_heads, num_kv_heads, head_dim: heads (GQA: num_qo_heads a multiple of
                num_kv_heads) and a head dim of ``tessera._C.supported_head_dims()``.
            page_size: keys per page (>= 1).
            block_rows, block_cols: the block shape in queries and keys (>= 1 each; any sizes,
                independent of page_size).
            mask_flags: None, or uint8 (or bool) ``[>= mask_indptr[-1]]``, one per entry of
                mask_indices: 1 marks a block whose every (query, key) pair is visible, which then
                skips the element masks (causal, window, keys past kv_len); a flag on a block that
                is not fully visible gives wrong results, not an error. Copied to the workspace's
                GPU unless it is there.
            causal: hide key j from query i of a request when ``j > kv_len - qo_len + i``.
            sm_scale: default ``1/sqrt(head_dim)``.
            window_left: sliding window, ``-1`` (off) or ``>= 0`` (key j visible only if
                ``j >= kv_len - qo_len + i - window_left``).
            logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``.
            q_data_type, kv_data_type: float16 or bfloat16, equal, except ``kv_data_type``
                ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` for an fp8 cache (its scales go to
                :meth:`run`).
            fixed_split_size: split long block rows at multiples of this many keys (a multiple of
                128; batch-invariant results). disable_split_kv: never split.
            variant: None or a softmax :class:`tessera.VariantSpec`, e.g.
                :func:`tessera.flex_variant` of the mask_mod of a block mask (evaluated in the
                blocks not flagged full) and a score_mod; as for the paged prefill wrapper, its
                ``b`` is the request and ``q_idx`` the query's position ``kv_len - qo_len + i``.
                :func:`paged_block_mask` turns a FlexAttention block mask into this plan's mask
                arrays.

        The options are fixed by the plan: every :meth:`run` of it uses them (with
        ``use_cuda_graph``, the first plan fixes them for the life of the wrapper).
        """
        torch = U._torch()
        options = U.resolve_variant("NONE", window_left, logits_soft_cap, None, None, variant=variant)
        if not options.use_softmax:  # as the C++ runtime: not yet tested over block-sparse KV
            raise NotImplementedError(
                f"variant={variant!r} has use_softmax=False, which BlockSparsePagedAttentionWrapper does not support "
                "yet (supported: softmax variants; the decode and prefill wrappers run it over paged KV)")
        causal = _check_causal(causal)
        dtype = U.resolve_plan_dtypes(q_data_type, kv_data_type)
        kv_dtype = U.resolve_plan_kv_dtype(dtype, kv_data_type)
        hq, hkv, d = U.check_heads(num_qo_heads, num_kv_heads, head_dim)
        page_size = U.check_positive_int("page_size", page_size)
        br = U.check_positive_int("block_rows", block_rows)
        bc = U.check_positive_int("block_cols", block_cols)
        scale = U.resolve_sm_scale(sm_scale, d)
        split, split_size = split_options(fixed_split_size, disable_split_kv, 1)

        qo_host = U.to_host_int32("qo_indptr", qo_indptr)
        total_qo = U.check_indptr_values("qo_indptr", qo_host)
        batch = int(qo_host.shape[0]) - 1
        kv_host = U.to_host_int32("paged_kv_indptr", paged_kv_indptr, batch + 1)
        num_pages = U.check_indptr_values("paged_kv_indptr", kv_host)
        last_host = U.to_host_int32("paged_kv_last_page_len", paged_kv_last_page_len, batch)
        U.check_index_tensor("paged_kv_indices", paged_kv_indices)
        if paged_kv_indices.shape[0] < num_pages:
            raise ValueError(f"paged_kv_indices has {paged_kv_indices.shape[0]} entries, expected >= "
                             f"paged_kv_indptr[-1] = {num_pages}")
        # The block rows of each request, and the column blocks its keys make.
        row_blocks = (qo_host[1:] - qo_host[:-1]).long().add(br - 1).div(br, rounding_mode="floor")
        num_rows = int(row_blocks.sum())
        mask_host = U.to_host_int32("mask_indptr", mask_indptr)
        if mask_host.shape[0] != num_rows + 1:
            raise ValueError(
                f"mask_indptr has {mask_host.shape[0]} entries, expected {num_rows + 1} (the block rows of the "
                f"requests, sum of ceil(qo_len / block_rows) = {num_rows}, plus one)")
        nnz = U.check_indptr_values("mask_indptr", mask_host)
        U.check_index_tensor("mask_indices", mask_indices)
        if mask_indices.shape[0] < nnz:
            raise ValueError(f"mask_indices has {mask_indices.shape[0]} entries, expected >= mask_indptr[-1] = {nnz}")
        if mask_flags is not None:
            U.check_tensor("mask_flags", mask_flags, ndim=1, dtypes=(torch.uint8, torch.bool),
                           shape_hint="([>= mask_indptr[-1]], one flag per entry of mask_indices)")
            if mask_flags.shape[0] < nnz:
                raise ValueError(f"mask_flags has {mask_flags.shape[0]} entries, expected >= mask_indptr[-1] = {nnz}")
        if mask_indices.is_cpu:
            pages = (kv_host[1:] - kv_host[:-1]).long()
            kv_lens = torch.where(pages > 0, (pages - 1) * page_size + last_host.long(), torch.zeros_like(pages))
            row_bounds = ((kv_lens + bc - 1) // bc).repeat_interleave(row_blocks)
            bounds = row_bounds.repeat_interleave((mask_host[1:] - mask_host[:-1]).long())

            def describe(i: int, bound: int) -> str:
                row = int(torch.searchsorted(mask_host, torch.tensor([i], dtype=torch.int32), right=True)[0]) - 1
                return f"block row {row}; ceil(kv_len / block_cols) of its request = {bound}"

            _check_block_ids(mask_indices[:nnz].long(), mask_host, bounds, "mask_indices", describe)
        graph_bounds = self._graph_bounds(batch, num_rows, total_qo, num_pages, nnz)

        # GPU work from here on (a failure below leaves the wrapper unplanned).
        self._planned = None
        cpp = self._holder.ensure(_BlockSparseNeed(batch, num_rows, total_qo, hq, hkv, d), dtype, split, split_size,
                                  graph_bounds, kv_dtype=kv_dtype)
        device = self._float_workspace_buffer.device
        flags = None if mask_flags is None else mask_flags[:nnz].view(torch.uint8)
        if self._use_cuda_graph:
            assert self._mask_indices_buf is not None and self._mask_flags_buf is not None
            run_pages = self._fill(self._paged_kv_indices_buf, paged_kv_indices, num_pages)
            run_blocks = self._fill(self._mask_indices_buf, mask_indices, nnz)
            if flags is None:  # the captured run() reads the flags buffer: no block flagged
                self._mask_flags_buf[:nnz].zero_()
            else:
                self._mask_flags_buf[:nnz].copy_(flags, non_blocking=True)
            run_flags = self._mask_flags_buf
        else:
            run_pages = self._on(device, paged_kv_indices, num_pages, torch.int32)
            run_blocks = self._on(device, mask_indices, nnz, torch.int32)
            run_flags = None if flags is None else self._on(device, flags, nnz, torch.uint8)
        fp8 = U.is_fp8(kv_dtype)
        cpp.plan(qo_host, kv_host, last_host, page_size, mask_host, br, bc, hq, hkv, d, U.tessera_dtype(dtype), scale,
                 causal, U.current_stream(device), U.device_index(self._float_workspace_buffer),
                 kv_dtype=U.tessera_dtype(kv_dtype) if fp8 else None,
                 **(self._kv_scales.plan_kwargs(device) if fp8 else {}), **options.kwargs(None))
        self._planned = {
            "batch": batch,
            "total_qo": total_qo,
            "block_rows": num_rows,
            "num_qo_heads": hq,
            "num_kv_heads": hkv,
            "head_dim": d,
            "page_size": page_size,
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "indices": run_pages,
            "host_indices": U.HostPageIds("paged_kv_indices", paged_kv_indices, num_pages),
            "mask_indices": run_blocks,
            "mask_flags": run_flags,
            "causal": causal,
            "sm_scale": scale,
            **_run_fields(device, self._kv_layout, hkv, d, d, page_size, kv_dtype),
        }

    begin_forward = plan

    def _graph_bounds(self, batch: int, num_rows: int, total_qo: int, num_pages: int,
                      nnz: int) -> Optional[Tuple[int, int]]:
        """With CUDA graphs: the plan within the preallocated buffers and the first plan's bounds;
        (max_batch_size, max_total_qo_tokens) of the runtime. None otherwise."""
        if not self._use_cuda_graph:
            return None
        assert self._paged_kv_indices_buf is not None and self._mask_indices_buf is not None
        if num_pages > self._paged_kv_indices_buf.shape[0]:
            raise ValueError(f"paged_kv_indptr[-1] = {num_pages} pages exceed the "
                             f"{self._paged_kv_indices_buf.shape[0]} entries of paged_kv_indices_buf (use_cuda_graph)")
        if nnz > self._mask_indices_buf.shape[0]:
            raise ValueError(f"mask_indptr[-1] = {nnz} listed blocks exceed the {self._mask_indices_buf.shape[0]} "
                             "entries of mask_indices_buf (use_cuda_graph)")
        if self._max_rows is None:
            self._max_rows = max(1, total_qo)
            self._max_batch = max(1, batch, num_rows, total_qo)
        elif total_qo > self._max_rows:
            raise ValueError(f"qo_indptr[-1] = {total_qo} query rows exceed the {self._max_rows} of the first plan, "
                             "which fixes them with use_cuda_graph")
        assert self._max_batch is not None
        if max(batch, num_rows) > self._max_batch:
            raise ValueError(f"this plan has {batch} requests and {num_rows} block rows; with use_cuda_graph the first "
                             f"plan bounds both by {self._max_batch} (the larger of its requests and query rows)")
        return self._max_batch, self._max_rows

    @staticmethod
    def _fill(buf: "torch.Tensor", src: "torch.Tensor", n: int) -> "torch.Tensor":
        """Graph mode: src[:n] copied into the preallocated buf (unless src is buf); returns buf."""
        if n > 0 and src.data_ptr() != buf.data_ptr():
            buf[:n].copy_(src[:n], non_blocking=True)
        return buf

    def _on(self, device: Any, t: "torch.Tensor", n: int, dtype: Any) -> "torch.Tensor":
        """t[:n] on `device` for the runs of the plan; a one-element zero tensor when n is 0 (the
        runtime reads no entry, but wants an array that exists)."""
        if n == 0:
            key = (device, dtype)
            if key not in self._empty:
                self._empty[key] = U._torch().zeros(1, dtype=dtype, device=device)
            return self._empty[key]
        t = t[:n]
        return t if t.device == device else t.to(device, non_blocking=True)

    def run(
        self,
        q: "torch.Tensor",
        paged_kv_cache: PagedKVCache,
        out: Optional["torch.Tensor"] = None,
        lse: Optional["torch.Tensor"] = None,
        return_lse: bool = False,
        *,
        k_scale: Optional[Union[float, "torch.Tensor"]] = None,
        v_scale: Optional[Union[float, "torch.Tensor"]] = None,
    ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        """Runs the planned batch for one layer on PyTorch's current CUDA stream.

        Args:
            q: ``[rows, num_qo_heads, head_dim]`` of the plan's ``q_data_type``, rows at least
                ``qo_indptr[-1]`` (with ``use_cuda_graph`` exactly the first plan's query rows).
            paged_kv_cache: ``(k_cache, v_cache)``, each ``[num_pages, page_size, num_kv_heads,
                head_dim]`` (NHD) or ``[num_pages, num_kv_heads, page_size, head_dim]`` (HND), or one
                tensor ``[num_pages, 2, ...]`` holding both, of the plan's ``kv_data_type``.
            out: optional output ``[rows, num_qo_heads, head_dim]`` of q's dtype (allocated when
                None).
            lse: optional float32 ``[rows, num_qo_heads]`` for the base-2 LSE (with return_lse;
                allocated when None).
            return_lse: return ``(out, lse)``.
            k_scale, v_scale: an fp8 cache's dequantization scales, each None (1), a float > 0 or a
                one-element float32 tensor on the workspace's device (k_scale multiplies the
                logits, v_scale the output); with a 16-bit cache only None/1.0.

        Returns:
            ``out`` or ``(out, lse)``. Rows that see no key get 0 and LSE ``-inf``.
        """
        p = self._planned
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with this batch's index arrays and block mask first")
        if R.compiling():  # torch.compile traces this run(): the checks, then tessera::block_sparse_paged_run
            return _paged_run_compiled(R._OPS.BLOCK_SPARSE_PAGED_RUN, self, p, q, paged_kv_cache, k_scale, v_scale,
                                       out, lse, return_lse)
        q, out, lse = _check_run_queries(q, out, lse, return_lse, p)
        k, v, kv = _check_paged_cache(paged_kv_cache, self._kv_layout, q, p)
        kv_dtype = None
        if _run_kv_scales(self._kv_scales, p, k_scale, v_scale, self._use_cuda_graph):
            k, v, kv, kv_dtype = U.kv_arg(k), U.kv_arg(v), U.kv_arg(kv), p["kv_dtype_arg"]
        U.launch(self._holder.cpp.run, q, q, k, v, kv, p["layout_arg"], p["indices"], p["mask_indices"],
                 p["mask_flags"], out, lse if return_lse else None, U.current_stream(q.device), kv_dtype=kv_dtype)
        return (out, lse) if return_lse else out

    forward = run


def _check_block_ids(ids: "torch.Tensor", indptr: "torch.Tensor", num_col_blocks: Any, name: str = "indices",
                     describe: Optional[Callable[[int, int], str]] = None) -> None:
    """Every listed column block exists and the blocks of a row increase (the kernels would mask an
    id out of range: here it is an error, at plan time, on the host copy). num_col_blocks: the
    bound of every id (an int), or an int64 tensor of one bound per id; describe(i, bound): what the
    bound of id i is, for the message (default: ceil(N / C) column blocks)."""
    if ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= num_col_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        bound = num_col_blocks if isinstance(num_col_blocks, int) else int(num_col_blocks[i])
        why = describe(i, bound) if describe is not None else "ceil(N / C) column blocks"
        raise ValueError(f"{name}[{i}] = {int(ids[i])} is out of range [0, {bound}) ({why})")
    step_ok = ids[1:] > ids[:-1]
    row_start = U._torch().zeros(ids.numel(), dtype=U._torch().bool)
    starts = indptr[1:-1].long()
    row_start[starts[starts < ids.numel()]] = True
    bad = ~(step_ok | row_start[1:])
    if bool(bad.any()):
        i = int(bad.nonzero()[0]) + 1
        raise ValueError(f"{name}[{i}] = {int(ids[i])} does not increase within its block row "
                         f"(previous {int(ids[i - 1])}); list each row's column blocks in increasing order")


def paged_block_mask(block_mask: Any, qo_indptr: "torch.Tensor", paged_kv_indptr: "torch.Tensor",
                     paged_kv_last_page_len: "torch.Tensor",
                     page_size: int) -> Tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """The mask arrays of :meth:`BlockSparsePagedAttentionWrapper.plan` from a FlexAttention block
    mask (:func:`tessera.create_block_mask`'s, or torch's) over key POSITIONS: block row r of the
    mask is queries at positions ``r * Q_BLOCK .. r * Q_BLOCK + Q_BLOCK - 1``, as in a prefill of
    ``Q_LEN = KV_LEN`` tokens.

    Request b (batch entry b of the mask, or entry 0 when the mask's batch is 1) has its queries at
    positions ``kv_len - qo_len .. kv_len - 1``; that offset must be a multiple of ``Q_BLOCK`` (so the
    request's block rows are whole rows of the mask: a prefill, or a chunk of one cut at block
    boundaries) and ``kv_len`` at most ``Q_LEN`` and ``KV_LEN``. The request's block rows are the
    mask's rows from ``(kv_len - qo_len) // Q_BLOCK`` on, each with the mask's column blocks below
    ``ceil(kv_len / KV_BLOCK)`` (the union over the mask's heads), flagged full where the mask's
    block is full for every head. Plan with ``block_rows, block_cols = block_mask.BLOCK_SIZE`` and
    ``variant=tessera.flex_variant(mask_mod=block_mask.mask_mod)`` (unless it is ``noop_mask``), so
    the blocks not flagged full evaluate the mask_mod.

    Args:
        block_mask: the block mask (batch 1 or ``batch_size``).
        qo_indptr, paged_kv_indptr, paged_kv_last_page_len, page_size: the batch, as for
            :meth:`BlockSparsePagedAttentionWrapper.plan`.

    Returns:
        ``(mask_indptr, mask_indices, mask_flags)``: int32 on the CPU, int32 and uint8 on the
        block mask's device.
    """
    from .flex import _block_states_for_kernel

    torch = U._torch()
    q_block, kv_block = (int(x) for x in block_mask.BLOCK_SIZE)
    q_len, kv_len_max = (int(x) for x in block_mask.seq_lengths)
    page_size = U.check_positive_int("page_size", page_size)
    qo_host = U.to_host_int32("qo_indptr", qo_indptr)
    U.check_indptr_values("qo_indptr", qo_host)
    batch = int(qo_host.shape[0]) - 1
    kv_host = U.to_host_int32("paged_kv_indptr", paged_kv_indptr, batch + 1)
    U.check_indptr_values("paged_kv_indptr", kv_host)
    last_host = U.to_host_int32("paged_kv_last_page_len", paged_kv_last_page_len, batch)
    states = _block_states_for_kernel(block_mask)  # [B, H, num_q_blocks, num_kv_blocks]
    if states.shape[0] not in (1, batch):
        raise ValueError(f"paged_block_mask: the block mask has batch {states.shape[0]}, expected 1 or the "
                         f"batch size {batch}")
    visible = (states > 0).any(dim=1)  # [B, num_q_blocks, num_kv_blocks]: union over the heads
    full = (states == 2).all(dim=1)
    indptr, indices, flags = [0], [], []
    for b in range(batch):
        qo = int(qo_host[b + 1] - qo_host[b])
        pages = int(kv_host[b + 1] - kv_host[b])
        kv = (pages - 1) * page_size + int(last_host[b]) if pages > 0 else 0
        if qo == 0:
            continue
        offset = kv - qo
        if offset < 0 or offset % q_block != 0 or kv > q_len or kv > kv_len_max:
            raise ValueError(
                f"paged_block_mask: request {b} has {qo} queries over {kv} keys: its queries must start at a "
                f"multiple of the mask's Q_BLOCK = {q_block} (kv_len - qo_len = {offset}) and kv_len must be at "
                f"most the mask's Q_LEN = {q_len} and KV_LEN = {kv_len_max}")
        entry = 0 if states.shape[0] == 1 else b
        r0, rows, cols = offset // q_block, -(-qo // q_block), -(-kv // kv_block)
        vis = visible[entry, r0:r0 + rows, :cols]
        indptr += (indptr[-1] + vis.sum(dim=1).cumsum(0).cpu()).tolist()
        indices.append(vis.nonzero()[:, 1].to(torch.int32))
        flags.append(full[entry, r0:r0 + rows, :cols][vis].to(torch.uint8))
    device = states.device
    mask_indices = torch.cat(indices) if indices else torch.zeros(0, dtype=torch.int32, device=device)
    mask_flags = torch.cat(flags) if flags else torch.zeros(0, dtype=torch.uint8, device=device)
    return torch.tensor(indptr, dtype=torch.int32), mask_indices, mask_flags
