"""Block-sparse attention with FlashInfer's ``BlockSparseAttentionWrapper`` API (flashinfer.sparse).

The attention matrix of M query rows and N key columns is cut into R x C blocks; ``indptr`` and
``indices`` (scipy's BSR) list, for each block row, the column blocks it attends to. Each run is
one ``block_sparse_attention`` launch of the C++ library (the one-shot prefill kernels, wgmma on
sm_90), no plan/run runtime: ``plan()`` validates and keeps the block layout on the device, so
``run()`` only checks shapes and launches. The float workspace is accepted for FlashInfer's
signature and not used.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _utils as U

__all__ = ["BlockSparseAttentionWrapper"]


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


def _check_block_ids(ids: "torch.Tensor", indptr: "torch.Tensor", num_col_blocks: int) -> None:
    """Every listed column block exists and the blocks of a row increase (the kernels would mask an
    id out of range: here it is an error, at plan time, on the host copy)."""
    if ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= num_col_blocks)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"indices[{i}] = {int(ids[i])} is out of range [0, {num_col_blocks}) "
                         f"(ceil(N / C) column blocks)")
    step_ok = ids[1:] > ids[:-1]
    row_start = U._torch().zeros(ids.numel(), dtype=U._torch().bool)
    starts = indptr[1:-1].long()
    row_start[starts[starts < ids.numel()]] = True
    bad = ~(step_ok | row_start[1:])
    if bool(bad.any()):
        i = int(bad.nonzero()[0]) + 1
        raise ValueError(f"indices[{i}] = {int(ids[i])} does not increase within its block row "
                         f"(previous {int(ids[i - 1])}); list each row's column blocks in increasing order")
