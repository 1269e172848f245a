"""FlexAttention-compatible front end: ``flex_attention``, ``create_block_mask``, ``and_masks``,
``or_masks``, ``noop_mask``, with the argument conventions of ``torch.nn.attention.flex_attention``.

Mods are plain Python functions of ``(score, b, h, q_idx, kv_idx)`` (score_mod) and
``(b, h, q_idx, kv_idx)`` (mask_mod) written with torch operations. Tessera traces them once per
call with symbolic indices (tessera._mod_trace) into CUDA source, which its variant JIT compiles
with NVRTC and caches in memory and on disk (docs/jit-cache.md): the first call of a new mod pays
the compile, later calls and later processes do not.

How a call runs: every request ``b`` is one ``block_sparse_attention`` over the block mask's blocks
(default 128 x 128; without a block mask, every block, all full). Full blocks skip the mask_mod,
partial blocks evaluate it, absent blocks are never read — FlexAttention's contract. A block mask
whose block sets differ between heads runs, per request, the union of the heads' blocks (full only
where full in every head); the mask_mod, evaluated with the real head, keeps the result exact.
Mods of the kernels' built-in forms (causal and sliding-window masks, soft-cap, ALiBi) run as
those; when nothing traced is left and the block lists follow from the mask (``_runs_dense``),
each request is instead a run of a cached ragged-runtime plan (``_DensePlan``), the built-in
variants' own kernel.

Differences from FlexAttention, each an error rather than a silent change: query, key and value
are float16 or bfloat16 CUDA tensors ``[B, H, L, E]`` with one head dim E (``value``'s last dim
equal to ``query``'s) among ``tessera._C.supported_head_dims()``; no autograd (inference only);
``kernel_options`` (Triton tuning knobs) are accepted and ignored. The LSE returned with
``return_lse=True`` is the natural-log LSE, as FlexAttention's (the C++ API's is base 2).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _C
from . import _utils as U
from ._mod_trace import BATCH_PARAM, Q_OFFSET_PARAM, Capture, ModTraceError, trace_function

__all__ = [
    "flex_attention",
    "create_block_mask",
    "create_mask",
    "and_masks",
    "or_masks",
    "noop_mask",
    "BlockMask",
    "ModTraceError",
    "flex_variant",
]

_DEFAULT_SPARSE_BLOCK_SIZE = 128
# A constant (not a call into the extension), so torch.compile traces the checks.
_SUPPORTED_HEAD_DIMS = tuple(_C.supported_head_dims())
# Captured tensors share the variant's 16 parameter slots with the two fixed ones.
_MAX_CAPTURES = 14
_LN2 = math.log(2.0)


# --- masks ---------------------------------------------------------------------------------------


def noop_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """A mask_mod that hides nothing."""
    return b.new_ones((), dtype=U._torch().bool)


def and_masks(*mask_mods: Callable[..., Any]) -> Callable[..., Any]:
    """The mask_mod that keeps a pair where every one of `mask_mods` keeps it."""
    _check_callables("and_masks", mask_mods)

    def and_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = b.new_ones((), dtype=U._torch().bool)
        for mod in mask_mods:
            result = result & mod(b, h, q_idx, kv_idx)
        return result

    return and_mask


def or_masks(*mask_mods: Callable[..., Any]) -> Callable[..., Any]:
    """The mask_mod that keeps a pair where any one of `mask_mods` keeps it."""
    _check_callables("or_masks", mask_mods)

    def or_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = b.new_zeros((), dtype=U._torch().bool)
        for mod in mask_mods:
            result = result | mod(b, h, q_idx, kv_idx)
        return result

    return or_mask


def _check_callables(name: str, mods: Sequence[Any]) -> None:
    for i, m in enumerate(mods):
        if not callable(m):
            raise TypeError(f"{name}: argument {i} = {m!r} is not a callable mask_mod")


def _is_noop(mask_mod: Any) -> bool:
    """Ours or FlexAttention's noop_mask (told by name and module: no import, which torch.compile
    would have to trace)."""
    if mask_mod is None or mask_mod is noop_mask:
        return True
    return (getattr(mask_mod, "__name__", "") == "noop_mask" and
            getattr(mask_mod, "__module__", "") == "torch.nn.attention.flex_attention")


def create_mask(mod_fn: Callable[..., Any], B: Optional[int], H: Optional[int], Q_LEN: int, KV_LEN: int,
                device: Any = "cuda") -> Any:
    """The dense bool mask ``[B, H, Q_LEN, KV_LEN]`` of a mask_mod (or of where a score_mod leaves a
    score finite), evaluated by calling the mod on broadcast index tensors, as FlexAttention's
    ``create_mask``. For tests and small sizes: it materialises every pair."""
    torch = U._torch()
    B = 1 if B is None else B
    H = 1 if H is None else H
    b = torch.arange(B, device=device, dtype=torch.int32).view(B, 1, 1, 1)
    h = torch.arange(H, device=device, dtype=torch.int32).view(1, H, 1, 1)
    q = torch.arange(Q_LEN, device=device, dtype=torch.int32).view(1, 1, Q_LEN, 1)
    kv = torch.arange(KV_LEN, device=device, dtype=torch.int32).view(1, 1, 1, KV_LEN)
    if _arity(mod_fn) == 5:
        out = mod_fn(torch.zeros((), device=device), b, h, q, kv)
        out = torch.isfinite(out) & (out != float("-inf"))
    else:
        out = mod_fn(b, h, q, kv)
    return torch.as_tensor(out, device=device).to(torch.bool).expand(B, H, Q_LEN, KV_LEN)


def _arity(fn: Any) -> int:
    import inspect

    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover
        return 4


# --- block masks ---------------------------------------------------------------------------------


class BlockMask:
    """Which (query block, KV block) pairs attention visits, in FlexAttention's layout.

    Attributes (FlexAttention's names):
        seq_lengths: ``(Q_LEN, KV_LEN)``.
        BLOCK_SIZE: ``(Q_BLOCK_SIZE, KV_BLOCK_SIZE)``.
        kv_num_blocks: int32 ``[B, H, num_q_blocks]``, partial blocks per query block.
        kv_indices: int32 ``[B, H, num_q_blocks, num_kv_blocks]``; row ``i``'s first
            ``kv_num_blocks[..., i]`` entries are its partial KV blocks, in increasing order.
        full_kv_num_blocks, full_kv_indices: the same for full blocks (every pair visible: the
            mask_mod is not evaluated there).
        mask_mod: the mask_mod evaluated in partial blocks.

    A block is full when the mask keeps every pair of it; a block that extends past Q_LEN or
    KV_LEN is at most partial (the pairs past the end count as hidden), as in FlexAttention.
    """

    def __init__(self, seq_lengths: Tuple[int, int], block_size: Tuple[int, int], kv_num_blocks: Any,
                 kv_indices: Any, full_kv_num_blocks: Any, full_kv_indices: Any, mask_mod: Any) -> None:
        """A block mask from its parts (create_block_mask builds them); the tensors as in the
        class doc, ``full_*`` may be None (no full blocks)."""
        self.seq_lengths = (int(seq_lengths[0]), int(seq_lengths[1]))
        self.BLOCK_SIZE = (int(block_size[0]), int(block_size[1]))
        self.kv_num_blocks = kv_num_blocks
        self.kv_indices = kv_indices
        self.full_kv_num_blocks = full_kv_num_blocks
        self.full_kv_indices = full_kv_indices
        self.mask_mod = mask_mod if mask_mod is not None else noop_mask
        # The mask_mod these block lists were evaluated from (create_block_mask sets it): then the
        # lists add nothing to an exact evaluation of that mask, and flex_attention may run a
        # lowered mask on the dense kernel. None for lists made elsewhere.
        self._lists_of: Any = None
        # What the kernels read, per batch entry (_bsr_entries), made once here.
        self._bsr_entries: List[Tuple[Any, Any, Any, bool]] = _bsr_entries(self)

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        """``(B, H, num_q_blocks, num_kv_blocks)``."""
        return tuple(self.kv_indices.shape)  # type: ignore[return-value]

    def to_dense(self) -> Any:
        """int32 ``[B, H, num_q_blocks, num_kv_blocks]``: 1 where the block is visited."""
        return (_block_states(self) > 0).to(U._torch().int32)

    def sparsity(self) -> float:
        """Percentage of blocks skipped."""
        dense = self.to_dense()
        return 100.0 * (1.0 - float(dense.sum()) / max(1, dense.numel()))

    def __repr__(self) -> str:
        return (f"BlockMask(shape={self.shape}, sparsity={self.sparsity():.2f}%, seq_lengths={self.seq_lengths}, "
                f"BLOCK_SIZE={self.BLOCK_SIZE}, mask_mod={getattr(self.mask_mod, '__name__', self.mask_mod)})")


def _ordered(dense: Any) -> Tuple[Any, Any]:
    """(count, indices) of the true entries of each row of a bool ``[..., n]``, indices first in
    increasing order (FlexAttention's ordering)."""
    torch = U._torch()
    num = dense.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num, indices


def _block_states(bm: Any) -> Any:
    """int8 ``[B, H, num_q_blocks, num_kv_blocks]``: 0 absent, 1 partial, 2 full, from any block
    mask with FlexAttention's attributes (Tessera's or torch's)."""
    torch = U._torch()
    kv_num, kv_idx = bm.kv_num_blocks, bm.kv_indices
    states = torch.zeros(kv_idx.shape, dtype=torch.int8, device=kv_idx.device)
    n = kv_idx.shape[-1]
    for num, idx, value in ((kv_num, kv_idx, 1), (bm.full_kv_num_blocks, bm.full_kv_indices, 2)):
        if num is None or idx is None:
            continue
        idx = idx.long()
        valid = torch.arange(idx.shape[-1], device=idx.device) < num.unsqueeze(-1).long()
        src = (valid & (idx >= 0) & (idx < n)).to(torch.int8) * value
        states.scatter_reduce_(-1, idx.clamp(0, n - 1), src, reduce="amax")
    return states


def _block_states_for_kernel(bm: Any) -> Any:
    """The block states with full demoted to partial in a last KV block that extends past KV_LEN
    (the kernel hides those columns by evaluating the mask)."""
    states = _block_states(bm)
    kv_len, kv_block = int(bm.seq_lengths[1]), int(bm.BLOCK_SIZE[1])
    if kv_len % kv_block != 0 and states.shape[-1] > 0:
        last = states[..., -1]
        states[..., -1] = last.clamp(max=1)
    return states


def _bsr_of_states(states: Any) -> Tuple[Any, Any, Any]:
    """(indptr i32, indices i32, flags u8) of one request's ``[H, num_q_blocks, num_kv_blocks]``
    states: the union of the heads' blocks, full where every head's block is full."""
    torch = U._torch()
    visible = (states > 0).any(dim=0)
    full = (states == 2).all(dim=0)
    counts = visible.sum(dim=-1, dtype=torch.int32)
    indptr = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=states.device)
    indptr[1:] = torch.cumsum(counts, 0)
    nz = visible.nonzero()
    indices = nz[:, 1].to(torch.int32).contiguous()
    flags = full[visible].to(torch.uint8).contiguous()
    if indices.numel() == 0:  # the kernels take non-empty arrays
        indices = torch.zeros(1, dtype=torch.int32, device=states.device)
        flags = torch.zeros(1, dtype=torch.uint8, device=states.device)
    return indptr, indices, flags


def _request_bsrs(bm: Any, B: int) -> List[Tuple[Any, Any, Any, bool]]:
    """Per request b < B: (indptr, indices, flags, has_partial) of its blocks (a mask of batch 1
    serves every request). Tessera's BlockMask keeps them from create_block_mask on (so
    torch.compile only reads them); torch's are converted at each call."""
    entries = getattr(bm, "_bsr_entries", None)
    if entries is None:
        entries = _bsr_entries(bm)
    return entries * B if len(entries) == 1 else entries


def _bsr_entries(bm: Any) -> List[Tuple[Any, Any, Any, bool]]:
    """One (indptr, indices, flags, has_partial) per batch entry of a block mask."""
    states = _block_states_for_kernel(bm)
    entries = []
    for b in range(states.shape[0]):
        sb = states[b]
        indptr, indices, flags = _bsr_of_states(sb)
        has_partial = bool(((sb > 0).any(dim=0) & ~(sb == 2).all(dim=0)).any())
        entries.append((indptr, indices, flags, has_partial))
    return entries


def _dense_bsr(q_len: int, kv_len: int, block: int, device: Any) -> Tuple[Any, Any, Any, bool]:
    """Every block of a q_len x kv_len grid, full except a last KV block past kv_len (built with
    shape-static torch operations, which torch.compile traces)."""
    torch = U._torch()
    nq, nkv = -(-q_len // block), -(-kv_len // block)
    indptr = torch.arange(0, (nq + 1) * nkv, nkv, dtype=torch.int32, device=device)
    indices = torch.arange(nkv, dtype=torch.int32, device=device).repeat(nq)
    flags = torch.ones((nq, nkv), dtype=torch.uint8, device=device)
    partial_last = kv_len % block != 0
    if partial_last:
        flags[:, -1] = 0
    return indptr, indices, flags.reshape(-1), partial_last


def create_block_mask(mask_mod: Callable[..., Any], B: Optional[int], H: Optional[int], Q_LEN: int, KV_LEN: int,
                      device: Any = "cuda", BLOCK_SIZE: Union[int, Tuple[int, int]] = _DEFAULT_SPARSE_BLOCK_SIZE,
                      _compile: bool = False, separate_full_blocks: bool = True) -> BlockMask:
    """FlexAttention's ``create_block_mask``: the blocks a mask_mod keeps, evaluated on the GPU.

    Args:
        mask_mod: ``(b, h, q_idx, kv_idx) -> bool``, traced (see the module docstring).
        B, H: batch size and query heads the mask depends on (``None``: 1, broadcast over all).
        Q_LEN, KV_LEN: sequence lengths (> 0).
        device: a CUDA device.
        BLOCK_SIZE: ``Q_BLOCK_SIZE = KV_BLOCK_SIZE`` or a pair (default 128).
        _compile: accepted for compatibility (the evaluation is always compiled).
        separate_full_blocks: ``False`` lists every visited block as partial (the mask_mod is
            then evaluated in every block).

    Returns:
        A :class:`BlockMask` whose block sets equal FlexAttention's for the same arguments.
    """
    torch = U._torch()
    B = 1 if B is None else U.check_positive_int("B", B)
    H = 1 if H is None else U.check_positive_int("H", H)
    q_len = U.check_positive_int("Q_LEN", Q_LEN)
    kv_len = U.check_positive_int("KV_LEN", KV_LEN)
    if isinstance(BLOCK_SIZE, int):
        q_block = kv_block = U.check_positive_int("BLOCK_SIZE", BLOCK_SIZE)
    else:
        q_block, kv_block = (U.check_positive_int("BLOCK_SIZE", x) for x in BLOCK_SIZE)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"create_block_mask: device = {device}, expected a CUDA device (the mask is evaluated on the GPU)")
    nq, nkv = -(-q_len // q_block), -(-kv_len // kv_block)
    states = torch.zeros((B, H, nq, nkv), dtype=torch.int8, device=device)
    if _is_noop(mask_mod):
        states.fill_(2)
    else:
        captures: List[Capture] = []
        extents = (B, H, nq * q_block, nkv * kv_block)  # block-rounded
        traced = trace_function(mask_mod, False, "tessera_mask_mod", captures, _MAX_CAPTURES, extents)
        params_tail = [(c.name, c.byte_view()) for c in captures]
        indptr = torch.empty(nq + 1, dtype=torch.int32, device=device)
        indices = torch.empty(nq * nkv, dtype=torch.int32, device=device)
        flags = torch.empty(nq * nkv, dtype=torch.uint8, device=device)
        stream = U.current_stream(device)
        rows = torch.arange(nq, device=device)
        for b in range(B if traced.uses_batch else 1):
            for h in range(H if traced.uses_head else 1):
                params = [(BATCH_PARAM, b), (Q_OFFSET_PARAM, kv_len - q_len)] + params_tail
                U.call(U._C().build_block_mask, indptr, traced.source, traced.function, params, q_len, kv_len,
                       q_block, kv_block, b, h, indptr, indices, flags, stream)
                counts = indptr[1:] - indptr[:-1]
                total = int(indptr[-1])
                row_of = torch.repeat_interleave(rows, counts.long(), output_size=total)
                sel = states[b, h]
                sel[row_of, indices[:total].long()] = (1 + flags[:total]).to(torch.int8)
        if not traced.uses_batch:
            states[1:] = states[:1]
        if not traced.uses_head:
            states[:, 1:] = states[:, :1]
    # FlexAttention pads both lengths with hidden pairs: a block past either end is never full.
    if q_len % q_block != 0:
        states[:, :, -1, :] = states[:, :, -1, :].clamp(max=1)
    if kv_len % kv_block != 0:
        states[..., -1] = states[..., -1].clamp(max=1)
    if not separate_full_blocks:
        states = states.clamp(max=1)
    kv_num, kv_indices = _ordered(states == 1)
    if separate_full_blocks:
        full_num, full_indices = _ordered(states == 2)
    else:
        full_num = full_indices = None
    bm = BlockMask((q_len, kv_len), (q_block, kv_block), kv_num, kv_indices, full_num, full_indices, mask_mod)
    bm._lists_of = bm.mask_mod
    return bm


# --- attention -----------------------------------------------------------------------------------


def _check_qkv(query: Any, key: Any, value: Any, enable_gqa: bool) -> Tuple[int, int, int, int, int, int]:
    torch = U._torch()
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flex_attention: {name} is a {type(t).__name__}, expected a torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"flex_attention: {name}.shape = {tuple(t.shape)}, expected 4 dims [B, H, L, E]")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"flex_attention: {name}.dtype = {t.dtype}, expected torch.float16 or torch.bfloat16")
        U.check_cuda(f"flex_attention: {name}", t)
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"flex_attention: query, key, value dtypes {query.dtype}, {key.dtype}, {value.dtype}, "
                        "expected one dtype")
    for name, t in (("key", key), ("value", value)):
        U.check_same_device(f"flex_attention: {name}", t, "query", query)
    B, Hq, L, E = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(f"flex_attention: batch sizes {B}, {key.shape[0]}, {value.shape[0]} of query, key, value "
                         "differ")
    Hkv, S = key.shape[1], key.shape[2]
    if tuple(value.shape[1:3]) != (Hkv, S):
        raise ValueError(f"flex_attention: value.shape = {tuple(value.shape)}, expected [B, {Hkv}, {S}, Ev] like key")
    if key.shape[3] != E:
        raise ValueError(f"flex_attention: key.shape[3] = {key.shape[3]}, expected query's head dim {E}")
    if value.shape[3] != E:
        raise NotImplementedError(f"flex_attention: value head dim {value.shape[3]} differs from query's {E} "
                                  "(different Q/K and V head dims are not supported yet)")
    if E not in _SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(f"flex_attention: head dim E = {E}, supported: {list(_SUPPORTED_HEAD_DIMS)}")
    if Hq != Hkv:
        if not enable_gqa:
            raise ValueError(f"flex_attention: query has {Hq} heads and key/value {Hkv}; pass enable_gqa=True for "
                             "grouped-query attention")
        if Hkv == 0 or Hq % Hkv != 0:
            raise ValueError(f"flex_attention: {Hq} query heads is not a multiple of {Hkv} key/value heads")
    return B, Hq, Hkv, L, S, E


def _check_block_mask(bm: Any, B: int, Hq: int, L: int, S: int) -> None:
    for attr in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "seq_lengths"):
        if not hasattr(bm, attr):
            raise TypeError(f"flex_attention: block_mask ({type(bm).__name__}) has no attribute {attr!r}; expected a "
                            "BlockMask from create_block_mask (Tessera's or torch's)")
    if tuple(int(x) for x in bm.seq_lengths) != (L, S):
        raise ValueError(f"flex_attention: block_mask.seq_lengths = {tuple(bm.seq_lengths)}, expected ({L}, {S}) "
                         "(the query and key lengths; create the mask for these lengths)")
    bB, bH = bm.kv_indices.shape[0], bm.kv_indices.shape[1]
    if bB not in (1, B) or bH not in (1, Hq):
        raise ValueError(f"flex_attention: block_mask batch/heads = ({bB}, {bH}), expected 1 or {B} and 1 or {Hq}")


def flex_attention(query: Any, key: Any, value: Any, score_mod: Optional[Callable[..., Any]] = None,
                   block_mask: Any = None, scale: Optional[float] = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options: Optional[Dict[str, Any]] = None, *,
                   return_aux: Any = None) -> Any:
    """FlexAttention's ``flex_attention`` on Tessera's kernels (forward only).

    Args:
        query: ``[B, Hq, L, E]`` float16/bfloat16 CUDA tensor.
        key, value: ``[B, Hkv, S, E]`` of query's dtype and device.
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score`` (score = scale * q.k, fp32), traced.
        block_mask: a BlockMask of ``create_block_mask`` (Tessera's or torch's) for lengths
            ``(L, S)``; its mask_mod is evaluated in partial blocks. ``None``: every pair.
        scale: the logits' scale (default ``1/sqrt(E)``).
        enable_gqa: allow ``Hq`` a multiple of ``Hkv`` (query head h reads KV head ``h // (Hq/Hkv)``).
        return_lse: also return the natural-log LSE, float32 ``[B, Hq, L]``.
        kernel_options: accepted and ignored (FlexAttention's Triton tuning knobs).
        return_aux: FlexAttention's ``AuxRequest``: ``lse=True`` returns ``(out, AuxOutput)`` with
            the LSE; ``max_scores=True`` raises NotImplementedError.

    Returns:
        ``out`` ``[B, Hq, L, E]`` in query's dtype, ``(out, lse)`` or ``(out, aux)``. A query row
        that sees no key gets zeros (and LSE ``-inf``).
    """
    torch = U._torch()
    if return_aux is not None:
        if return_lse:
            raise ValueError("flex_attention: give return_lse or return_aux, not both")
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("flex_attention: return_aux.max_scores is not supported by Tessera yet")
        if getattr(return_aux, "lse", False):
            out, lse = flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, True, kernel_options)
            return out, _aux_output(lse)
        return flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa, False, kernel_options), \
            _aux_output(None)
    if kernel_options is not None and not isinstance(kernel_options, dict):
        raise TypeError(f"flex_attention: kernel_options = {kernel_options!r}, expected None or a dict")
    B, Hq, Hkv, L, S, E = _check_qkv(query, key, value, bool(enable_gqa))
    sm_scale = _check_scale(scale, E)
    if L == 0 or S == 0 or B == 0:
        out = torch.zeros((B, Hq, L, E), dtype=query.dtype, device=query.device)
        lse = torch.full((B, Hq, L), float("-inf"), dtype=torch.float32, device=query.device)
        return (out, lse) if return_lse else out
    if block_mask is None:
        mask_mod, q_block, kv_block = None, _DEFAULT_SPARSE_BLOCK_SIZE, _DEFAULT_SPARSE_BLOCK_SIZE
        bsrs = [_dense_bsr(L, S, kv_block, query.device)] * B
    else:
        _check_block_mask(block_mask, B, Hq, L, S)
        mask_mod = getattr(block_mask, "mask_mod", None)
        q_block, kv_block = (int(x) for x in block_mask.BLOCK_SIZE)
        bsrs = _request_bsrs(block_mask, B)
    needs_mask = not _is_noop(mask_mod) and any(entry[3] for entry in bsrs)
    extents = (B, Hq, -(-L // q_block) * q_block, -(-S // kv_block) * kv_block)  # block-rounded
    variant = _trace_variant(score_mod, mask_mod if needs_mask else None, extents, L == S)
    names, views = _CAPTURES[variant[5]]
    indptrs, indices, flags = ([entry[i] for entry in bsrs] for i in range(3))
    dense = _runs_dense(variant, block_mask, mask_mod)
    run = run_flex_attention
    if U._torch().compiler.is_compiling():  # one custom-op node in the graph (tessera/_ops.py)
        ops = _ops()
        if ops is not None:
            run = ops.FLEX_ATTENTION
    out, lse = run(query, key, value, indptrs, indices, flags, q_block, kv_block, sm_scale, bool(return_lse),
                   variant[0], variant[1], variant[2], variant[3], variant[4], views, names, float(variant[6]),
                   variant[7], int(variant[8]), dense)
    return (out, lse) if return_lse else out


def _runs_dense(variant: Tuple[str, ...], block_mask: Any, mask_mod: Any) -> bool:
    """Whether a call is the dense kernel's built-in attention: no traced code is left (every mod
    absent or lowered, variant from _trace_variant) and the block lists add nothing to the mask -
    no block mask, or lists create_block_mask evaluated from this mask_mod when that mask is
    noop_mask or was lowered to the causal mask (an exact mask makes its own block lists
    redundant). Lists from elsewhere (torch's BlockMask, a BlockMask built from parts) can drop
    blocks the mask keeps, so they keep the block-sparse kernel."""
    if variant[2] or variant[4]:
        return False
    if block_mask is None:
        return True
    if getattr(block_mask, "_lists_of", None) is not mask_mod:
        return False
    return _is_noop(mask_mod) or int(variant[8]) >= -1


# Captured tensors of traced variants, by key (the variant's sources and the captured tensors'
# identities): (capture names joined by ",", the captures' byte views). _trace_variant fills it
# and returns the key; flex_attention reads the entry. Under torch.compile, Dynamo runs
# _trace_variant once while tracing and keeps its result as a constant, then reads the entry of
# that key, so the captured tensors become inputs of the graph. Bounded: the oldest entries go.
_CAPTURES: "OrderedDict[str, Tuple[str, List[Any]]]" = OrderedDict()
_MAX_CAPTURE_ENTRIES = 64


def _trace_variant(score_mod: Any, mask_mod: Any, extents: Tuple[int, int, int, int],
                   equal_lengths: bool) -> Tuple[str, ...]:
    """(variant name, mask source, mask function, score source, score function, capture key,
    soft-cap, ALiBi slopes' capture name, causal window) of the mods (empty strings where there is
    none), tracing them; the captures go to _CAPTURES.

    Mods that are the kernels' built-in variants (tessera/_mod_trace.py, _lowering and
    _mask_lowering) are passed as those instead of as traced code: the soft-cap as its cap (a
    string, "0" for none); ALiBi as the name of the capture holding its slopes; a causal mask,
    with or without a sliding window, as the window (a string: "-2" for no causal mask, "-1"
    causal without a window, else window_left). ALiBi and the masks only when the query and key
    lengths are equal (equal_lengths): the kernels count query positions from S - L, where
    FlexAttention's q_idx starts at 0.

    Marked as Dynamo's assume_constant_result does (below): torch.compile calls it once while
    tracing and keeps the strings as constants. The mods are then not guarded: a compiled function
    keeps the captured tensors it was traced with (read at each call, so in-place updates show;
    rebinding a captured variable needs a recompile, torch._dynamo.reset())."""
    captures: List[Capture] = []
    mask_fn = (trace_function(mask_mod, False, "tessera_mask_mod", captures, _MAX_CAPTURES, extents)
               if mask_mod is not None else None)
    causal_window = "-2"
    if mask_fn is not None and mask_fn.lowering is not None and equal_lengths:
        causal_window, mask_fn = str(mask_fn.lowering[1]), None
    score_fn = (trace_function(score_mod, True, "tessera_score_mod", captures, _MAX_CAPTURES, extents)
                if score_mod is not None else None)
    soft_cap, alibi = "0", ""
    lowering = score_fn.lowering if score_fn is not None else None
    if lowering is not None and lowering[0] == "soft_cap":
        soft_cap, score_fn = repr(float(lowering[1])), None
    elif lowering is not None and lowering[0] == "alibi" and equal_lengths:
        alibi, score_fn = lowering[1], None
    name = _variant_name(mask_mod if mask_fn else None, score_mod) if (mask_fn or score_fn) else ""
    sources = (name, mask_fn.source if mask_fn else "", mask_fn.function if mask_fn else "",
               score_fn.source if score_fn else "", score_fn.function if score_fn else "")
    key = hashlib.sha1("\0".join(sources).encode()).hexdigest() + "".join(f":{id(c.original)}" for c in captures)
    _CAPTURES[key] = (",".join(c.name for c in captures), [c.byte_view() for c in captures])
    _CAPTURES.move_to_end(key)
    while len(_CAPTURES) > _MAX_CAPTURE_ENTRIES:
        _CAPTURES.popitem(last=False)
    return sources + (key, soft_cap, alibi, causal_window)


_trace_variant._dynamo_marked_constant = True  # type: ignore[attr-defined]  # = assume_constant_result


def _ops() -> Any:
    from . import _runtime as R

    return R.load_ops()


def run_flex_attention(query: Any, key: Any, value: Any, indptrs: List[Any], indices: List[Any], flags: List[Any],
                       q_block: int, kv_block: int, sm_scale: float, return_lse: bool, variant_name: str,
                       mask_source: str, mask_function: str, score_source: str, score_function: str,
                       captures: List[Any], capture_names: str, logits_soft_cap: float = 0.0,
                       alibi_capture: str = "", causal_window: int = -2, dense: bool = False) -> Tuple[Any, Any]:
    """The launches of one flex_attention call: request b is one block_sparse_attention over
    (indptrs[b], indices[b], flags[b]), or with dense (no traced code, block lists implied by the
    mask: _runs_dense) one run of a ragged runtime plan over all of its keys (_DensePlan) - the
    kernel of the built-in variants, without the block lists' per-row column lookups. Returns (out [B, Hq, L, E],
    natural-log lse [B, Hq, L] or an empty tensor). Also the implementation of the custom op
    tessera::flex_attention. logits_soft_cap (> 0) and alibi_capture (the capture whose float32
    [Hq] view are the slopes) select the kernels' built-in soft-cap and ALiBi for a lowered score
    mod; causal_window >= -1 the built-in causal mask (with window_left = causal_window when >= 0)
    for a lowered mask."""
    if dense and (mask_function or score_function):
        raise ValueError(f"run_flex_attention: dense = True with traced mods ({variant_name!r}), expected "
                         "dense only for calls without traced code")
    torch = U._torch()
    B, Hq, L, E = query.shape
    S = key.shape[2]
    out = torch.empty((B, Hq, L, E), dtype=query.dtype, device=query.device)
    lse = torch.empty((B, L, Hq), dtype=torch.float32, device=query.device) if return_lse else None
    variant: Dict[str, Any] = {}
    if mask_function or score_function:
        variant = dict(variant_name=variant_name, mask_source=mask_source, mask_function=mask_function,
                       score_source=score_source, score_function=score_function)
    tail = list(zip(capture_names.split(","), captures)) if capture_names else []
    builtin: Dict[str, Any] = {}
    if logits_soft_cap > 0:
        builtin["logits_soft_cap"] = logits_soft_cap
    if alibi_capture:
        builtin["alibi_slopes"] = dict(tail)[alibi_capture].view(torch.float32)
    if causal_window >= 0:
        builtin["window_left"] = causal_window
    stream = U.current_stream(query.device)
    C = U._C()
    if dense:
        plan = _dense_plan(query, key, sm_scale, causal_window >= -1, builtin, stream)
        for b in range(B):
            if plan is not None:
                U.call(plan.cpp.run, query, query[b].transpose(0, 1), key[b].transpose(0, 1), value[b].transpose(0, 1),
                       out[b].transpose(0, 1), lse[b] if lse is not None else None, stream)
            else:
                U.call(C.single_prefill, query, query[b].transpose(0, 1), key[b].transpose(0, 1),
                       value[b].transpose(0, 1), U.check_kv_layout("NHD"), out[b].transpose(0, 1),
                       lse[b] if lse is not None else None, sm_scale, causal_window >= -1, stream,
                       **({"variant": C.VariantArgs(**builtin)} if builtin else {}))
    else:
        for b in range(B):
            kwargs = dict(variant, **builtin)
            if variant:
                kwargs["params"] = [(BATCH_PARAM, b), (Q_OFFSET_PARAM, S - L)] + tail
            U.call(C.block_sparse_attention, query, query[b].transpose(0, 1), key[b].transpose(0, 1),
                   value[b].transpose(0, 1), indptrs[b], indices[b], flags[b], q_block, kv_block,
                   out[b].transpose(0, 1), lse[b] if lse is not None else None, sm_scale, causal_window >= -1,
                   stream, **kwargs)
    if lse is None:
        return out, torch.empty((0,), dtype=torch.float32, device=query.device)
    return out, (lse * _LN2).transpose(1, 2).contiguous()


class _DensePlan:
    """The dense route's kernel: a plan of the ragged plan/run runtime (the C++
    BatchPrefillRaggedWrapper, the kernel of the wrappers' built-in variants) for one request of L
    queries and S keys, run once per batch entry. Its persistent CTAs start a work item's loads
    under the previous item's epilogue, which the one-shot kernel (one item per CTA, one CTA per SM
    at head dim 128) cannot: W3's window cell, 9 KV tiles per item, ran 0.90 of the runtime
    one-shot (bench/results/LOG.md, session 40). KV is not split (as the block-sparse kernel), so
    the workspace holds the plan alone."""

    def __init__(self, query: Any, key: Any, sm_scale: float, causal: bool, builtin: Dict[str, Any],
                 stream: int) -> None:
        torch = U._torch()
        from ._runtime import _bounds

        C = U._C()
        _, Hq, L, E = query.shape
        Hkv, S = key.shape[1], key.shape[2]
        device = U.device_index(query)
        options = C.RuntimeOptions()
        options.split_kv = C.SplitKV.none
        options.dtype = U.tessera_dtype(query.dtype)
        bounds = _bounds(C, 1, L, Hq, Hkv, E)
        size = int(C.BatchPrefillRaggedWrapper.workspace_size(bounds, options, device))
        self.workspace = torch.empty(size, dtype=torch.uint8, device=query.device)
        self.cpp = U.call(C.BatchPrefillRaggedWrapper, query, self.workspace, bounds, options)
        self.slopes = builtin.get("alibi_slopes")  # the plan reads them at each run: kept alive
        indptr = lambda n: torch.tensor([0, n], dtype=torch.int32)  # noqa: E731
        U.call(self.cpp.plan, query, indptr(L), indptr(S), Hq, Hkv, E, U.tessera_dtype(query.dtype), sm_scale, causal,
               stream, device, **({"variant": C.VariantArgs(**builtin)} if builtin else {}))


# The dense route's plans by (device, stream, dtype, shapes, scale, causal, built-ins): each plan
# lives in its own workspace on its stream, so flex_attention calls on other streams never share
# one. Bounded: the oldest go.
_DENSE_PLANS: "OrderedDict[Tuple[Any, ...], _DensePlan]" = OrderedDict()
_MAX_DENSE_PLANS = 8


def _dense_plan(query: Any, key: Any, sm_scale: float, causal: bool, builtin: Dict[str, Any],
                stream: int) -> Optional[_DensePlan]:
    """The cached _DensePlan of a call, made on first use; None while `stream` is being captured
    into a CUDA graph and the plan does not exist yet (planning copies to the GPU and allocates,
    which a capture forbids): that call runs the one-shot ragged kernel (single_prefill), the same
    kernel family without the persistent schedule."""
    slopes = builtin.get("alibi_slopes")
    cache_key = (query.device, stream, query.dtype, tuple(query.shape[1:]), tuple(key.shape[1:]), sm_scale, causal,
                 builtin.get("window_left", -1), builtin.get("logits_soft_cap", 0.0),
                 slopes.data_ptr() if slopes is not None else 0)
    plan = _DENSE_PLANS.get(cache_key)
    if plan is None:
        if U._torch().cuda.is_current_stream_capturing():
            return None
        plan = _DENSE_PLANS[cache_key] = _DensePlan(query, key, sm_scale, causal, builtin, stream)
        while len(_DENSE_PLANS) > _MAX_DENSE_PLANS:
            _DENSE_PLANS.popitem(last=False)
    _DENSE_PLANS.move_to_end(cache_key)
    return plan


def _check_scale(scale: Any, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"flex_attention: scale = {scale!r}, expected a float or None")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"flex_attention: scale = {scale!r}, expected a finite value > 0 (or None for 1/sqrt(E))")
    return float(scale)


def _aux_output(lse: Any) -> Any:
    try:
        from torch.nn.attention.flex_attention import AuxOutput

        return AuxOutput(lse=lse, max_scores=None)
    except (ImportError, TypeError):  # pragma: no cover - a torch without AuxOutput
        from collections import namedtuple

        return namedtuple("AuxOutput", ["lse", "max_scores"])(lse, None)


# --- mods as a variant of the other entry points ------------------------------------------------

# Every parameter slot is free for captures here: b and q_idx come from the hooks' own arguments.
_MAX_VARIANT_CAPTURES = 16


def flex_variant(score_mod: Optional[Callable[..., Any]] = None, mask_mod: Optional[Callable[..., Any]] = None,
                 name: Optional[str] = None) -> Any:
    """A :class:`tessera.VariantSpec` from FlexAttention-style mods, for ``variant=`` of the
    plan/run wrappers (paged and ragged prefill, decode; FlashInfer's custom-variant role) and of
    the single-request functions.

    The mods are traced once here, as :func:`flex_attention` traces them, into the variant's
    ``logits_mask`` and ``logits_transform`` hooks; their captured tensors become its parameters
    (keep them alive and unchanged, or changed in place on purpose, while a plan uses the variant).
    Indices as a batch call sees them: ``b`` is the request, ``h`` the query head, ``q_idx`` the
    query's position in its sequence (``kv_len - qo_len + i``, the position the wrappers' causal
    mask uses) and ``kv_idx`` the key's. (:func:`flex_attention`, one sequence of ``L`` queries,
    counts ``q_idx`` from 0 instead; the two agree when the queries are the whole sequence.)

    Args:
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score`` or None.
        mask_mod: ``(b, h, q_idx, kv_idx) -> bool`` or None (``noop_mask`` counts as None).
        name: the variant's name (default ``"flex:<mod names>"``).

    Raises:
        ValueError: neither mod given; ModTraceError (a NotImplementedError): a construct the
        tracer cannot follow, naming the operation and the line of the mod.
    """
    from .variant import VariantSpec

    if mask_mod is not None and _is_noop(mask_mod):
        mask_mod = None
    if score_mod is None and mask_mod is None:
        raise ValueError("flex_variant: score_mod and mask_mod are both None (or noop_mask), expected at least one mod")
    captures: List[Capture] = []
    mask_fn = (trace_function(mask_mod, False, "tessera_mask_mod", captures, _MAX_VARIANT_CAPTURES, None,
                              hook_indices=True) if mask_mod is not None else None)
    score_fn = (trace_function(score_mod, True, "tessera_score_mod", captures, _MAX_VARIANT_CAPTURES, None,
                               hook_indices=True) if score_mod is not None else None)
    source = ""
    if mask_fn is not None:
        source += (mask_fn.source + "bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, "
                   "int qo_head, int kv_head) {\n  return tessera_mask_mod(params, batch, qo_head, qo_idx, kv_idx);\n}\n")
    if score_fn is not None:
        source += (score_fn.source + "float logits_transform(const Params& params, float logits, int batch, "
                   "int qo_idx, int kv_idx, int qo_head, int kv_head) {\n"
                   "  return tessera_score_mod(params, logits, batch, qo_head, qo_idx, kv_idx);\n}\n")
    if name is None:
        name = _variant_name(mask_mod, score_mod)
    return VariantSpec._traced(name, source, {c.name: c.byte_view() for c in captures})


def _variant_name(mask_mod: Any, score_mod: Any) -> str:
    names = [getattr(f, "__name__", "mod") for f in (mask_mod, score_mod) if f is not None]
    return "flex:" + "+".join(names)
