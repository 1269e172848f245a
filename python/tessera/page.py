"""Paged KV-cache utilities, FlashInfer-compatible.

A paged cache is ``(k_cache, v_cache)``, each ``[num_pages, page_size, num_kv_heads, head_dim]``
(``kv_layout="NHD"``) or ``[num_pages, num_kv_heads, page_size, head_dim]`` (``"HND"``), or one
tensor ``[num_pages, 2, ...]`` holding both. A paged MLA latent cache is ``ckv_cache``
``[num_pages, page_size, ckv_dim]`` with ``kpe_cache`` ``[num_pages, page_size, kpe_dim]``. Request b
owns pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``; all are full except the last, which holds
``kv_last_page_len[b]`` tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple, Union

from . import _utils as U

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["append_paged_kv_cache", "append_paged_mla_kv_cache", "get_batch_indices_positions", "get_seq_lens"]


def get_seq_lens(kv_indptr: "torch.Tensor", kv_last_page_len: "torch.Tensor", page_size: int) -> "torch.Tensor":
    """KV length of each request: ``(num_pages - 1) * page_size + last_page_len`` (0 without pages).

    Args:
        kv_indptr: int32 ``[batch_size + 1]``.
        kv_last_page_len: int32 ``[batch_size]``.
        page_size: tokens per page.

    Returns:
        int32 ``[batch_size]`` on ``kv_indptr``'s device.
    """
    torch = U._torch()
    U.check_index_tensor("kv_indptr", kv_indptr)
    U.check_index_tensor("kv_last_page_len", kv_last_page_len, int(kv_indptr.shape[0]) - 1)
    page_size = U.check_positive_int("page_size", page_size)
    pages = kv_indptr[1:] - kv_indptr[:-1]
    last = kv_last_page_len.to(kv_indptr.device)
    lens = (pages - 1).clamp(min=0) * page_size + last
    return torch.where(pages > 0, lens, torch.zeros_like(lens)).to(torch.int32)


def get_batch_indices_positions(
    append_indptr: "torch.Tensor", seq_lens: "torch.Tensor", nnz: int
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Per appended row, its request and its position in that request (for append_paged_kv_cache).

    Request b appends rows ``append_indptr[b]:append_indptr[b+1]``, which become the last
    ``append_len_b`` tokens of its ``seq_lens[b]`` (the lengths AFTER the append).

    Args:
        append_indptr: int32 ``[batch_size + 1]``.
        seq_lens: int32 ``[batch_size]`` KV lengths after the append.
        nnz: number of appended rows (``append_indptr[-1]``).

    Returns:
        ``(batch_indices, positions)``, int32 ``[nnz]`` on ``append_indptr``'s device.
    """
    torch = U._torch()
    U.check_index_tensor("append_indptr", append_indptr)
    U.check_index_tensor("seq_lens", seq_lens, int(append_indptr.shape[0]) - 1)
    if isinstance(nnz, bool) or not isinstance(nnz, int) or nnz < 0:
        raise ValueError(f"nnz = {nnz!r}, expected an int >= 0")
    device = append_indptr.device
    rows = torch.arange(nnz, device=device, dtype=torch.int64)
    indptr = append_indptr.to(torch.int64)
    batch = torch.searchsorted(indptr[1:].contiguous(), rows, right=True)
    batch = batch.clamp(max=max(0, int(append_indptr.shape[0]) - 2))
    append_len = indptr[1:] - indptr[:-1]
    lens = seq_lens.to(device=device, dtype=torch.int64)
    positions = lens[batch] - append_len[batch] + (rows - indptr[batch])
    return batch.to(torch.int32), positions.to(torch.int32)


def append_paged_kv_cache(
    append_key: "torch.Tensor",
    append_value: "torch.Tensor",
    batch_indices: "torch.Tensor",
    positions: "torch.Tensor",
    paged_kv_cache: Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]],
    kv_indices: "torch.Tensor",
    kv_indptr: "torch.Tensor",
    kv_last_page_len: "torch.Tensor",
    kv_layout: str = "NHD",
) -> None:
    """Writes new K/V rows into a paged KV cache (on PyTorch's current stream).

    Args:
        append_key, append_value: ``[nnz, num_kv_heads, head_dim]``, the cache's dtype
            (float16, bfloat16 or float32), or float16/bfloat16 for an fp8 cache
            (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``), contiguous last dimension.
        batch_indices, positions: int32 ``[nnz]`` on the GPU: row i goes to request
            ``batch_indices[i]`` at token position ``positions[i]`` (see
            :func:`get_batch_indices_positions`).
        paged_kv_cache: ``(k_cache, v_cache)`` or one ``[num_pages, 2, ...]`` tensor.
        kv_indices, kv_indptr, kv_last_page_len: the page table AFTER the append (int32, GPU).
        kv_layout: ``"NHD"`` or ``"HND"``.

    Into an fp8 cache each element is stored rounded to nearest and saturated to the largest finite
    value (448 for e4m3, 57344 for e5m2), as FlashInfer's cast does: scale the rows before appending
    (or use the C++ ``append_paged_kv_cache(..., KVScales)``, which divides by the scales).

    Rows whose target lies outside the request's pages are skipped, never written out of bounds.
    """
    torch = U._torch()
    layout = U.check_kv_layout(kv_layout)
    half_or_f32 = (torch.float16, torch.bfloat16, torch.float32)
    U.check_tensor("append_key", append_key, ndim=3, shape_hint="([nnz, num_kv_heads, head_dim])")
    U.check_tensor("append_value", append_value, ndim=3, shape_hint="([nnz, num_kv_heads, head_dim])")
    if append_key.dtype not in half_or_f32 and U.is_fp8(append_key.dtype):
        raise U.unsupported("append_key.dtype", append_key.dtype, "float16, bfloat16, float32")
    U.check_tensor("append_key", append_key, dtypes=half_or_f32)
    if append_value.dtype != append_key.dtype:
        raise TypeError(f"append_value.dtype = {append_value.dtype}, expected {append_key.dtype} (the dtype of append_key)")
    U.check_shape("append_value", append_value, tuple(append_key.shape), "the shape of append_key")
    nnz = int(append_key.shape[0])
    U.check_index_tensor("batch_indices", batch_indices, nnz)
    U.check_index_tensor("positions", positions, nnz)
    U.check_index_tensor("kv_indptr", kv_indptr)
    U.check_index_tensor("kv_indices", kv_indices)
    U.check_index_tensor("kv_last_page_len", kv_last_page_len, int(kv_indptr.shape[0]) - 1)
    k, v, kv = U.unpack_paged_kv_cache(paged_kv_cache)
    cache_dtype = (kv if kv is not None else k).dtype  # type: ignore[union-attr]
    fp8 = U.is_fp8(cache_dtype)
    if fp8:
        U.check_fp8_kv_dtype(cache_dtype, "paged_kv_cache.dtype")
        if append_key.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(
                f"append_key.dtype = {append_key.dtype}, expected torch.float16 or torch.bfloat16 (rows quantized into "
                f"the {cache_dtype} cache)"
            )
    for name, t in (("paged_kv_cache", kv), ("paged_kv_cache[0]", k), ("paged_kv_cache[1]", v)):
        expected = cache_dtype if fp8 else append_key.dtype
        if t is not None and t.dtype != expected:
            raise TypeError(f"{name}.dtype = {t.dtype}, expected {expected}"
                            f" ({'the dtype of paged_kv_cache[0]' if fp8 else 'the dtype of append_key'})")
    _, _, hkv, d = U.paged_kv_geometry(k, kv, kv_layout == "NHD")
    if append_key.shape[1] != hkv or append_key.shape[2] != d:
        raise ValueError(
            f"append_key has shape {tuple(append_key.shape)}, expected [nnz, {hkv}, {d}] (num_kv_heads, head_dim of "
            f"paged_kv_cache with kv_layout={kv_layout!r})"
        )
    U.check_cuda("append_key", append_key)
    for name, t in (("append_value", append_value), ("batch_indices", batch_indices), ("positions", positions),
                    ("kv_indices", kv_indices), ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len),
                    ("paged_kv_cache", kv if kv is not None else k)):
        U.check_same_device(name, t, "append_key", append_key)  # type: ignore[arg-type]
    U.call(
        U._C().append_paged_kv_cache_at, append_key, append_key, append_value, batch_indices, positions, U.kv_arg(k),
        U.kv_arg(v), U.kv_arg(kv), layout, kv_indptr, kv_indices, kv_last_page_len,
        U.current_stream(append_key.device), cache_dtype=U.tessera_dtype(cache_dtype) if fp8 else None,
    )


def append_paged_mla_kv_cache(
    append_ckv: "torch.Tensor",
    append_kpe: "torch.Tensor",
    batch_indices: "torch.Tensor",
    positions: "torch.Tensor",
    ckv_cache: "torch.Tensor",
    kpe_cache: "torch.Tensor",
    kv_indices: "torch.Tensor",
    kv_indptr: "torch.Tensor",
    kv_last_page_len: "torch.Tensor",
) -> None:
    """Writes new MLA latent rows into a paged latent cache (on PyTorch's current stream), as
    ``flashinfer.page.append_paged_mla_kv_cache``.

    Args:
        append_ckv: ``[nnz, ckv_dim]``, the compressed KV of each new token (``ckv_dim`` = 512 for
            DeepSeek); the cache's dtype, contiguous last dimension.
        append_kpe: ``[nnz, kpe_dim]``, its rotary key part (``kpe_dim`` = 64 for DeepSeek).
        batch_indices, positions: int32 ``[nnz]`` on the GPU: row i goes to request
            ``batch_indices[i]`` at token position ``positions[i]`` (see
            :func:`get_batch_indices_positions`).
        ckv_cache: ``[num_pages, page_size, ckv_dim]``, float16, bfloat16 or an fp8 cache's
            ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (its rows come already quantized:
            the copy never converts).
        kpe_cache: ``[num_pages, page_size, kpe_dim]``, the dtype of ``ckv_cache``.
        kv_indices, kv_indptr, kv_last_page_len: the page table AFTER the append (int32, GPU).

    ``ckv_dim`` and ``kpe_dim`` may be any multiples of 16 bytes (8 16-bit or 16 fp8 elements);
    every tensor may be strided (e.g. ``ckv_cache`` and ``kpe_cache`` slices of one ``[num_pages,
    page_size, 576]`` tensor) as long as its last dimension is contiguous and its rows start at
    16-byte boundaries. The rows are copied bit for bit.

    Rows whose target lies outside the request's pages are skipped, never written out of bounds.
    """
    torch = U._torch()
    halves = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    U.check_tensor("append_ckv", append_ckv, ndim=2, shape_hint="([nnz, ckv_dim])")
    U.check_tensor("append_kpe", append_kpe, ndim=2, shape_hint="([nnz, kpe_dim])")
    U.check_tensor("ckv_cache", ckv_cache, ndim=3, shape_hint="([num_pages, page_size, ckv_dim])")
    U.check_tensor("kpe_cache", kpe_cache, ndim=3, shape_hint="([num_pages, page_size, kpe_dim])")
    U.check_tensor("ckv_cache", ckv_cache, dtypes=halves)
    for name, t in (("kpe_cache", kpe_cache), ("append_ckv", append_ckv), ("append_kpe", append_kpe)):
        if t.dtype != ckv_cache.dtype:
            raise TypeError(f"{name}.dtype = {t.dtype}, expected {ckv_cache.dtype} (the dtype of ckv_cache)")
    num_pages, page_size, ckv_dim = (int(x) for x in ckv_cache.shape)
    kpe_dim = int(kpe_cache.shape[2])
    U.check_shape("kpe_cache", kpe_cache, (num_pages, page_size, kpe_dim), "num_pages and page_size of ckv_cache")
    nnz = int(append_ckv.shape[0])
    U.check_shape("append_ckv", append_ckv, (nnz, ckv_dim), "[nnz, ckv_dim] with ckv_dim = ckv_cache.shape[2]")
    U.check_shape("append_kpe", append_kpe, (nnz, kpe_dim), "[nnz, kpe_dim] with kpe_dim = kpe_cache.shape[2]")
    U.check_index_tensor("batch_indices", batch_indices, nnz)
    U.check_index_tensor("positions", positions, nnz)
    U.check_index_tensor("kv_indptr", kv_indptr)
    U.check_index_tensor("kv_indices", kv_indices)
    U.check_index_tensor("kv_last_page_len", kv_last_page_len, int(kv_indptr.shape[0]) - 1)
    U.check_cuda("ckv_cache", ckv_cache)
    for name, t in (("kpe_cache", kpe_cache), ("append_ckv", append_ckv), ("append_kpe", append_kpe),
                    ("batch_indices", batch_indices), ("positions", positions), ("kv_indices", kv_indices),
                    ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        U.check_same_device(name, t, "ckv_cache", ckv_cache)
    fp8 = U.is_fp8(ckv_cache.dtype)
    U.call(
        U._C().append_paged_mla_kv_cache, ckv_cache, U.kv_arg(append_ckv), U.kv_arg(append_kpe), batch_indices,
        positions, U.kv_arg(ckv_cache), U.kv_arg(kpe_cache), kv_indptr, kv_indices, kv_last_page_len,
        U.current_stream(ckv_cache.device), cache_dtype=U.tessera_dtype(ckv_cache.dtype) if fp8 else None,
    )
