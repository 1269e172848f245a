"""Prefill / append attention (any number of query tokens per request), FlashInfer-compatible.

- :func:`single_prefill_with_kv_cache`: one request, contiguous KV.
- :class:`BatchPrefillWithPagedKVCacheWrapper`: a ragged batch of queries over a paged KV cache.
- :class:`BatchPrefillWithRaggedKVCacheWrapper`: a ragged batch of queries over ragged (packed) KV.

Causal masking aligns the last query with the last key: query i of a request with ``qo_len``
queries and ``kv_len`` keys sits at position ``p = kv_len - qo_len + i`` (FlashInfer's convention).
Log-sum-exp values are base 2.

Variants (FlashInfer's options; any non-default one is JIT-compiled on first use and cached), for
query position ``p`` and key ``j``:

- ``window_left = w >= 0``: key j is visible only if ``j >= p - w`` (sliding window, combined
  with the causal mask);
- ``logits_soft_cap = c > 0``: ``s = c * tanh(s / c)`` on the scaled logits ``s = sm_scale * q.k``;
- ``pos_encoding_mode="ALIBI"``: ``s += slope[h] * (j - p)`` with the standard slopes of
  ``num_qo_heads`` heads (before the soft-cap);
- ``pos_encoding_mode="ROPE_LLAMA"``: q and k are rotated ("rotate half", Llama) at positions
  p and j, angle ``(pos / rope_scale) * rope_theta^(-2d / head_dim)``, before the dot product;
- custom masks (:func:`single_prefill_with_kv_cache` only; the plan/run wrappers raise
  NotImplementedError): a bool ``[qo_len, kv_len]`` mask, True = visible.

Tessera's variants (keyword-only arguments; no FlashInfer counterpart in these functions), as in
:mod:`tessera.decode`: ``pos_encoding_mode="ROPE_LLAMA31"`` with ``low_freq_factor``,
``high_freq_factor``, ``old_context_len``; ``q_rope_offset`` / ``k_rope_offset``;
``num_sink_tokens``; and in :func:`single_prefill_with_kv_cache` only ``use_sigmoid`` /
``sigmoid_bias`` and ``variant`` (a :class:`tessera.VariantSpec`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from . import _runtime as R
from . import _utils as U
from ._runtime import _KVScaleBuffer, _Need, _RopeOffsets, split_options
from .decode import (
    PagedKVCache,
    _check_run_queries,
    _op_kv_scales,
    _op_results,
    _op_scale,
    _paged_run,
    _paged_run_compiled,
    _paged_fast_run,
    _run_fields,
    _run_kv_scales,
)
from .variant import VariantSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "single_prefill_with_kv_cache_with_jit_module",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
]


def _check_prefill_options(
    pos_encoding_mode: Any,
    use_fp16_qk_reduction: Any,
    window_left: Any,
    logits_soft_cap: Any,
    rope_scale: Any,
    rope_theta: Any,
    **tessera_options: Any,
) -> U.Variant:
    """FlashInfer's variant options and Tessera's keyword-only ones (U.resolve_variant)."""
    U.check_false("use_fp16_qk_reduction", use_fp16_qk_reduction)
    return U.resolve_variant(pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
                             **tessera_options)


def _plan_custom_mask(custom_mask: Any, packed_custom_mask: Any, qo_host: "torch.Tensor", kv_lens: "torch.Tensor",
                      device: Any, graph_buf: Any, use_cuda_graph: bool) -> Dict[str, Any]:
    """FlashInfer's batch custom masks for the runtime's plan() (tree attention): request b's
    ``[qo_len_b, kv_len_b]`` mask, flattened and concatenated over the batch (``custom_mask``, bool,
    ``sum(qo_len_b * kv_len_b)`` elements) or packed per request with
    ``segment_packbits(..., bitorder="little")`` (``packed_custom_mask``, uint8, each request from a
    byte boundary; wins when both are given). Returns plan()'s keywords: the packed bits on the
    device (with ``use_cuda_graph`` copied into ``custom_mask_buf``, whose address the capture
    keeps) and their byte offsets on the host; ``{}`` without a mask."""
    torch = U._torch()
    if custom_mask is None and packed_custom_mask is None:
        return {}
    qo_lens = (qo_host[1:] - qo_host[:-1]).to(torch.int64)
    bits = qo_lens * kv_lens.to(torch.int64)
    byte_indptr = torch.zeros(bits.numel() + 1, dtype=torch.int64)
    byte_indptr[1:] = torch.cumsum((bits + 7) // 8, 0)
    total_bytes = int(byte_indptr[-1])
    if packed_custom_mask is not None:
        U.check_tensor("packed_custom_mask", packed_custom_mask, ndim=1, dtypes=(torch.uint8,),
                       shape_hint="(segment_packbits of the requests' masks, bitorder 'little')")
        if packed_custom_mask.shape[0] < total_bytes:
            raise ValueError(
                f"packed_custom_mask has {packed_custom_mask.shape[0]} bytes, expected >= {total_bytes} "
                "(sum over requests of ceil(qo_len * kv_len / 8))")
        packed = packed_custom_mask.to(device).contiguous()
    else:
        U.check_tensor("custom_mask", custom_mask, ndim=1, dtypes=(torch.bool,),
                       shape_hint="(flattened [qo_len, kv_len] masks of the requests, bool)")
        total_bits = int(bits.sum())
        if custom_mask.shape[0] != total_bits:
            raise ValueError(
                f"custom_mask has {custom_mask.shape[0]} elements, expected sum(qo_len * kv_len) = {total_bits}")
        bit_indptr = torch.zeros(bits.numel() + 1, dtype=torch.int64)
        bit_indptr[1:] = torch.cumsum(bits, 0)
        from .quantization import segment_packbits

        packed, _ = segment_packbits(custom_mask.to(device), bit_indptr.to(device), bitorder="little")
    if packed.numel() == 0:  # no (query, key) pair at all: the kernels still want a buffer
        packed = torch.zeros(1, dtype=torch.uint8, device=device)
    if use_cuda_graph:
        if graph_buf is None:
            raise ValueError("use_cuda_graph=True with a custom mask needs custom_mask_buf (a preallocated uint8 "
                             "CUDA tensor the captured run() reads the mask from)")
        if packed.numel() > graph_buf.shape[0]:
            raise ValueError(f"the packed mask has {packed.numel()} bytes, more than custom_mask_buf's "
                             f"{graph_buf.shape[0]}")
        graph_buf[: packed.numel()].copy_(packed, non_blocking=True)
        packed = graph_buf
    return {"custom_mask": packed, "custom_mask_indptr": byte_indptr.to(torch.int32)}


def _check_custom_mask_args(custom_mask: Any, packed_custom_mask: Any, qo_len: int, kv_len: int) -> None:
    """Type, shape and size of FlashInfer's custom_mask / packed_custom_mask (no device work)."""
    torch = U._torch()
    if packed_custom_mask is not None:
        nbytes = (qo_len * kv_len + 7) // 8
        U.check_tensor("packed_custom_mask", packed_custom_mask, ndim=1, dtypes=(torch.uint8,),
                       shape_hint="(packed bits, bitorder 'little')")
        if packed_custom_mask.shape[0] < nbytes:
            raise ValueError(
                f"packed_custom_mask has {packed_custom_mask.shape[0]} bytes, expected >= ceil(qo_len * kv_len / 8) = "
                f"{nbytes} (qo_len {qo_len}, kv_len {kv_len})"
            )
    elif custom_mask is not None:
        U.check_tensor("custom_mask", custom_mask, ndim=2, dtypes=(torch.bool,),
                       shape_hint="([qo_len, kv_len], bool)")
        U.check_shape("custom_mask", custom_mask, (qo_len, kv_len), "[qo_len, kv_len]")


def _packed_custom_mask(
    custom_mask: Any, packed_custom_mask: Any, q: "torch.Tensor", qo_len: int, kv_len: int
) -> Tuple[Optional["torch.Tensor"], Optional["torch.Tensor"]]:
    """FlashInfer's custom_mask / packed_custom_mask (checked by _check_custom_mask_args) -> (packed
    u8 mask, i32 [0, bytes] indptr) on q's device, or (None, None). packed_custom_mask wins when
    both are given (as in FlashInfer)."""
    torch = U._torch()
    if packed_custom_mask is not None:
        U.check_same_device("packed_custom_mask", packed_custom_mask, "q", q)
        packed = packed_custom_mask.contiguous()
    elif custom_mask is not None:
        U.check_same_device("custom_mask", custom_mask, "q", q)
        packed = U.packbits_little(custom_mask)
    else:
        return None, None
    if packed.numel() == 0:  # qo_len * kv_len == 0: nothing to mask, but the kernels want a buffer
        packed = torch.zeros(1, dtype=torch.uint8, device=q.device)
    # [0, bytes] without a host-to-device copy.
    indptr = torch.arange(2, dtype=torch.int32, device=q.device) * ((qo_len * kv_len + 7) // 8)
    return packed, indptr


def _head_dim_vo_kwargs(d: int, dv: int) -> Dict[str, int]:
    """The C++ plan()'s head_dim_vo keyword: only for split head dims (0 means equal)."""
    return {"head_dim_vo": dv} if dv != d else {}


def _check_split_head_dims_options(dv: int, d: int, options: Any, kv_dtype: Any) -> None:
    """Split head dims (v/o narrower than q/k) run 16-bit K/V and no variant (the C++ layer's rule,
    raised here before any GPU work)."""
    if dv == d:
        return
    if U.is_fp8(kv_dtype):
        raise U.unsupported("kv_data_type", kv_dtype, f"float16 or bfloat16 with head_dim_vo {dv} != head_dim_qk {d}")
    if not options.is_default():
        raise U.unsupported("pos_encoding_mode / window_left / logits_soft_cap and the other variant options",
                            "set", f"their defaults with head_dim_vo {dv} != head_dim_qk {d}")


def _check_causal(causal: Any) -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return causal


def _check_fp8_attention(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", o_dtype: Any,
                         options: Any) -> "torch.dtype":
    """FP8 attention (an fp8 q): e4m3 q, k and v, no variant option (custom masks are checked by
    the C++ library), and an f16/bf16 output; returns the output dtype (``None``: bfloat16). The
    head dims and the device are the C++ library's checks (NotImplementedError naming them)."""
    torch = U._torch()
    if q.dtype != torch.float8_e4m3fn:
        raise U.unsupported("q.dtype", q.dtype, "torch.float16, torch.bfloat16, or torch.float8_e4m3fn (FP8 attention)")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype = {t.dtype}, expected {q.dtype} (FP8 attention takes q, k and v in e4m3)")
    if not options.is_default():
        raise NotImplementedError(
            "FP8 attention (q of dtype torch.float8_e4m3fn) runs without variant options (supported: causal, "
            "sm_scale); pos_encoding_mode, window_left, logits_soft_cap, sinks, sigmoid and variant= need a 16-bit q")
    if o_dtype is None:
        return torch.bfloat16
    od = U.canonical_dtype(o_dtype, "o_dtype")
    if od not in (torch.float16, torch.bfloat16):
        raise U.unsupported("o_dtype", od, "torch.float16 or torch.bfloat16 with an fp8 q")
    return od


def _check_fp8_plan(options: Any, d: int, dv: int, custom_mask: Any, packed_custom_mask: Any,
                    use_cuda_graph: bool) -> None:
    """A batch prefill plan with an fp8 q (FP8 attention, q_data_type torch.float8_e4m3fn): the
    runtime runs it with the default variant (causal, sm_scale), equal head dims, no custom mask and
    no CUDA graph (a captured run() fixes a 16-bit q's dtype); each other option is
    NotImplementedError naming it, raised here before any GPU work. The head dims (128, 256) and the
    device (sm_90a) are the C++ runtime's checks, as in single_prefill_with_kv_cache."""
    fp8 = "with q_data_type=torch.float8_e4m3fn (FP8 attention runs the default variant: causal and sm_scale)"
    if use_cuda_graph:
        raise U.unsupported("use_cuda_graph", True, "False for a plan with q_data_type=torch.float8_e4m3fn (FP8 "
                                                    "attention is not captured in CUDA graphs yet)")
    for name, value in (("custom_mask", custom_mask), ("packed_custom_mask", packed_custom_mask)):
        U.check_none(name, value, f"None {fp8}")
    if dv != d:
        raise U.unsupported("head_dim_vo", dv, f"None or head_dim_qk ({d}) {fp8}")
    if options.pos_encoding_mode != "NONE":
        raise U.unsupported("pos_encoding_mode", options.pos_encoding_mode, f"'NONE' {fp8}")
    if options.window_left >= 0:
        raise U.unsupported("window_left", options.window_left, f"-1 {fp8}")
    if options.logits_soft_cap != 0.0:
        raise U.unsupported("logits_soft_cap", options.logits_soft_cap, f"None or 0 {fp8}")
    if options.num_sink_tokens:
        raise U.unsupported("num_sink_tokens", options.num_sink_tokens, f"0 {fp8}")
    if options.user is not None:
        raise U.unsupported("variant", options.user, f"None {fp8}")
    if not options.is_default():  # pragma: no cover - every option is named above
        raise NotImplementedError(f"a variant option is set {fp8}")


def _fp8_plan_fields(fp8_q: bool, o_dtype: Any) -> Dict[str, Any]:
    """The plan entries of FP8 attention, none for a 16-bit q: "o_dtype", o's dtype (run()
    allocates and checks out with it; the entry marks the plan as FP8 attention) and "q_dtype_arg",
    q's dtype as the bindings take it (q goes as bytes, as fp8 K/V do: kv_arg)."""
    if not fp8_q:
        return {}
    return {"o_dtype": o_dtype, "q_dtype_arg": U.tessera_dtype(U._torch().float8_e4m3fn)}


def _op_q_args(p: Dict[str, Any], q_scale: Any, workspace: Any) -> Tuple[Any, float, Any]:
    """The prefill ops' arguments after the K/V scales (tessera/_ops.py): q_scale as
    (q_scale, q_scale_value) and o_dtype. An FP8 attention plan's q_scale as k_scale is
    (_op_scale: a float's value is checked by the op) and its o_data_type; a 16-bit plan's
    (None, 1.0) (its run() has refused any q_scale but None / 1.0) and q's dtype."""
    if "o_dtype" not in p:
        return None, 1.0, p["dtype"]
    tensor, value = _op_scale("q_scale", q_scale, workspace)
    return tensor, value, p["o_dtype"]


def single_prefill_with_kv_cache(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    scale_q: Optional["torch.Tensor"] = None,
    scale_k: Optional["torch.Tensor"] = None,
    scale_v: Optional["torch.Tensor"] = None,
    o_dtype: Optional["torch.dtype"] = None,
    custom_mask: Optional["torch.Tensor"] = None,
    packed_custom_mask: Optional["torch.Tensor"] = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    backend: str = "auto",
    return_lse: bool = False,
    *,
    low_freq_factor: Optional[float] = None,
    high_freq_factor: Optional[float] = None,
    old_context_len: Optional[float] = None,
    q_rope_offset: Optional[Union[int, "torch.Tensor"]] = None,
    k_rope_offset: Optional[Union[int, "torch.Tensor"]] = None,
    num_sink_tokens: int = 0,
    use_sigmoid: bool = False,
    sigmoid_bias: Optional[float] = None,
    variant: Optional[VariantSpec] = None,
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """Prefill/append attention of one request against its KV cache.

    Args:
        q: ``[qo_len, num_qo_heads, head_dim]`` float16/bfloat16 CUDA tensor, or
            ``torch.float8_e4m3fn`` for FP8 attention (k and v e4m3 too, head dims 128 and 256,
            sm_90 only, no variant option: the MMAs run in fp8 and P is rounded to e4m3).
        k, v: ``[kv_len, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, kv_len, head_dim]``
            (HND), q's dtype or both ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (an fp8 cache:
            head dims 64, 128, 256), contiguous last dimension. v's head dim may differ from q's and
            k's where the build has the pair (``tessera._C.supported_prefill_split_head_dims()``:
            192 / 128, DeepSeek's non-absorbed prefill; 16-bit K/V, no variant option); the output
            then has v's head dim.
        scale_q: FP8 attention only (else ``None`` or 1): q's dequantization scale, as
            ``scale_k`` (per KV head: the query heads of a group share their KV head's factor).
        scale_k, scale_v: fp8 K/V only: the dequantization scales, each ``None`` (1), a float > 0,
            or a float32 tensor on q's device of 1 or ``num_kv_heads`` elements.
        o_dtype: ``None`` or q's dtype; with an fp8 q ``torch.float16`` or ``torch.bfloat16``
            (``None``: bfloat16).
        custom_mask: bool ``[qo_len, kv_len]`` on q's device, True = key visible to the query
            (packed here; pass ``packed_custom_mask`` to avoid that).
        packed_custom_mask: uint8 1-D, ``custom_mask`` flattened row-major and packed with
            little bit order (bit k of byte i is element ``8 i + k``, as
            ``flashinfer.packbits(mask.view(-1), bitorder="little")``), at least
            ``ceil(qo_len * kv_len / 8)`` bytes; wins over ``custom_mask`` when both are given.
            With a custom mask ``causal`` is ignored (the mask decides), as in FlashInfer.
        causal: hide keys after each query's position (offset ``kv_len - qo_len``).
        kv_layout: ``"NHD"`` or ``"HND"``.
        pos_encoding_mode: ``"NONE"``, ``"ROPE_LLAMA"``, ``"ALIBI"`` or ``"ROPE_LLAMA31"``
            (Tessera's; see the module doc).
        use_fp16_qk_reduction: only ``False``.
        sm_scale: default ``1/sqrt(head_dim)``.
        window_left: sliding window, ``-1`` (off) or ``>= 0``.
        logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``.
        rope_scale, rope_theta: RoPE parameters, used with a RoPE mode: with ``"ROPE_LLAMA"``
            positions are divided by ``rope_scale`` (defaults ``1.0`` and ``1e4``); with
            ``"ROPE_LLAMA31"`` ``rope_scale`` is the Llama 3.1 frequency factor (defaults ``8.0``
            and ``5e5``, as ``flashinfer.apply_llama31_rope``).
        backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (Tessera's kernels for the device; ``"fa3"`` needs sm_90).
        return_lse: also return the base-2 LSE, float32 ``[qo_len, num_qo_heads]``.

    Tessera's keyword-only options (no FlashInfer counterpart in this function; module doc):
        low_freq_factor, high_freq_factor, old_context_len: Llama 3.1 scaling with
            ``"ROPE_LLAMA31"`` only (defaults ``1.0``, ``4.0``, ``8192``).
        q_rope_offset, k_rope_offset: RoPE position offsets (a RoPE mode only): query i is
            rotated at ``kv_len - qo_len + i + q_rope_offset``, key j at ``j + k_rope_offset``;
            an int or an int32 tensor of one element on q's device (or the CPU).
        num_sink_tokens: attention sinks: keys ``j < num_sink_tokens`` stay visible outside the
            sliding window (they still obey ``causal``; needs ``window_left >= 0``).
        use_sigmoid, sigmoid_bias: sigmoid attention: ``out_i = sum_j sigmoid(s_ij +
            sigmoid_bias) v_j`` over the visible keys (no softmax; ``return_lse=True`` is a
            ValueError).
        variant: a :class:`tessera.VariantSpec`, a user variant in CUDA C++.

    Returns:
        ``out`` ``[qo_len, num_qo_heads, head_dim]`` or ``(out, lse)``. Rows that see no key get
        0 and LSE ``-inf``.
    """
    torch = U._torch()
    layout = U.check_kv_layout(kv_layout)
    U.check_backend(backend, getattr(q, "device", None))
    options = _check_prefill_options(pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                                     rope_scale, rope_theta, low_freq_factor=low_freq_factor,
                                     high_freq_factor=high_freq_factor, old_context_len=old_context_len,
                                     num_sink_tokens=num_sink_tokens, use_sigmoid=use_sigmoid,
                                     sigmoid_bias=sigmoid_bias, variant=variant)
    options.check_return_lse(return_lse)
    causal = _check_causal(causal)
    U.check_tensor("q", q, ndim=3, shape_hint="([qo_len, num_qo_heads, head_dim])")
    U.check_tensor("k", k, ndim=3, shape_hint="([kv_len, num_kv_heads, head_dim] or HND)")
    U.check_tensor("v", v, ndim=3, shape_hint="([kv_len, num_kv_heads, head_dim] or HND)")
    fp8_q = U.is_fp8(q.dtype)
    if fp8_q:
        out_dtype = _check_fp8_attention(q, k, v, o_dtype, options)
    else:
        U.check_scale("scale_q", scale_q)
        U.check_attention_dtype(q.dtype, "q.dtype")
        out_dtype = q.dtype
        if o_dtype is not None:
            od = U.canonical_dtype(o_dtype, "o_dtype")
            if od != q.dtype:
                raise U.unsupported("o_dtype", od, f"None or the dtype of q ({q.dtype}); another dtype with an fp8 q")
        U.kv_data_dtype_check("k", k, q.dtype)
        U.kv_data_dtype_check("v", v, q.dtype)
    if v.dtype != k.dtype:
        raise TypeError(f"v.dtype = {v.dtype}, expected {k.dtype} (the dtype of k)")
    hkv = int(k.shape[1] if kv_layout == "NHD" else k.shape[0])
    if tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected {tuple(k.shape[:2])} + (head_dim_vo,) (k's but for "
                         "the head dim)")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k has head_dim {k.shape[2]}, expected {q.shape[2]} (the head_dim of q)")
    # v's head dim may differ from q's and k's (a pair of tessera._C.supported_prefill_split_head_dims()).
    _, _, d, dv = U.check_prefill_head_dims(q.shape[1], hkv, q.shape[2], int(v.shape[2]))
    _check_split_head_dims_options(dv, d, options, k.dtype)
    fp8 = U.is_fp8(k.dtype)
    scales = U.kv_scale_kwargs(("scale_k", "scale_v"), scale_k, scale_v, k.dtype if fp8 else None, hkv, q.device)
    if fp8_q:
        U.fp8_scale_kwarg("scale_q", scale_q, "q", hkv, q.device, scales)
        scales["q_dtype"] = U.tessera_dtype(q.dtype)
    scale = U.resolve_sm_scale(sm_scale, int(q.shape[2]))
    kv_len = int(k.shape[0] if kv_layout == "NHD" else k.shape[1])
    _check_custom_mask_args(custom_mask, packed_custom_mask, int(q.shape[0]), kv_len)
    options.check_tensors(q_rope_offset, k_rope_offset, 1, q.device)
    U.check_cuda("q", q)
    U.check_same_device("k", k, "q", q)
    U.check_same_device("v", v, "q", q)
    mask, mask_indptr = _packed_custom_mask(custom_mask, packed_custom_mask, q, int(q.shape[0]), kv_len)
    if mask is not None:
        causal = False  # FlashInfer: a custom mask replaces the causal mask
    out = torch.empty((q.shape[0], q.shape[1], dv), dtype=out_dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    slopes = U.alibi_slopes(int(q.shape[1]), q.device) if options.alibi else None
    U.call(U._C().single_prefill, q, U.kv_arg(q), U.kv_arg(k), U.kv_arg(v), layout, out, lse, scale, causal,
           U.current_stream(q.device), custom_mask=mask, custom_mask_indptr=mask_indptr,
           kv_dtype=U.tessera_dtype(k.dtype) if fp8 else None, **scales,
           **options.kwargs(slopes, U.rope_offset_tensor(q_rope_offset, q.device),
                            U.rope_offset_tensor(k_rope_offset, q.device)))
    return (out, lse) if return_lse else out


def single_prefill_with_kv_cache_return_lse(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *args: Any, **kwargs: Any
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """``single_prefill_with_kv_cache(..., return_lse=True)``."""
    kwargs["return_lse"] = True
    return single_prefill_with_kv_cache(q, k, v, *args, **kwargs)  # type: ignore[return-value]


def single_prefill_with_kv_cache_with_jit_module(
    jit_module: Any,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    *args: Any,
    kv_layout: str = "NHD",
    mask_mode: int = 0,
    window_left: int = -1,
    return_lse: bool = False,
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """FlashInfer's single prefill with a customized module (from
    :func:`tessera.jit.attention.gen_customize_single_prefill_module`): ``q`` ``[qo_len,
    num_qo_heads, head_dim]``, ``k`` / ``v`` as :func:`single_prefill_with_kv_cache`, ``args`` the
    module's additional tensors then scalars. ``mask_mode``: ``tessera.utils.MaskMode``'s
    ``NON_CAUSAL`` (0) or ``CAUSAL`` (1, offset ``kv_len - qo_len``); others NotImplementedError
    (a custom mask belongs in the variant's LogitsMask). ``window_left`` only -1. The variant
    scales its own logits (no sm_scale). Returns ``out`` or ``(out, lse)`` (base 2; ValueError for
    a variant without softmax)."""
    from .decode import _jit_module_spec

    name = "single_prefill_with_kv_cache_with_jit_module"
    if isinstance(mask_mode, bool) or mask_mode not in (0, 1):
        raise U.unsupported(f"{name}: mask_mode", mask_mode, "MaskMode.NON_CAUSAL (0) or MaskMode.CAUSAL (1)")
    spec = _jit_module_spec(jit_module, "prefill", name, q, k, v, args, window_left)
    return single_prefill_with_kv_cache(q, k, v, causal=mask_mode == 1, kv_layout=kv_layout, sm_scale=1.0,
                                        return_lse=return_lse, variant=spec)


class _PrefillBase(R._RuntimeWrapper):
    """Constructor checks and plan bookkeeping shared by the two prefill wrappers."""

    def _init_base(
        self,
        float_workspace_buffer: Any,
        kv_layout: str,
        use_cuda_graph: bool,
        qo_indptr_buf: Any,
        custom_mask_buf: Any,
        mask_indptr_buf: Any,
        backend: str,
        jit_args: Any,
        jit_kwargs: Any = None,
    ) -> None:
        self._init_runtime(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs)
        if custom_mask_buf is not None:
            U.check_tensor("custom_mask_buf", custom_mask_buf, ndim=1, dtypes=(U._torch().uint8,))
            U.check_cuda("custom_mask_buf", custom_mask_buf)
        if mask_indptr_buf is not None:  # FlashInfer's device offsets; Tessera's plan uploads its own
            U.check_index_tensor("mask_indptr_buf", mask_indptr_buf)
        self._custom_mask_buf = custom_mask_buf
        self._qo_indptr_buf = qo_indptr_buf
        self._max_batch_size: Optional[int] = None
        self._max_total_num_rows: Optional[int] = None
        self._alibi_slopes: Optional["torch.Tensor"] = None  # kept while a plan uses its device pointer
        self._kv_scales = _KVScaleBuffer()  # an fp8 cache's scales, filled by run()
        if self._use_cuda_graph:
            if qo_indptr_buf is None:
                raise ValueError("use_cuda_graph=True needs qo_indptr_buf (a preallocated int32 CUDA tensor)")
            U.check_index_tensor("qo_indptr_buf", qo_indptr_buf)
            if qo_indptr_buf.shape[0] < 2:
                raise ValueError("qo_indptr_buf has fewer than 2 entries, expected [max_batch_size + 1]")
            self._max_batch_size = int(qo_indptr_buf.shape[0]) - 1
        self._rope_offsets = _RopeOffsets(self._use_cuda_graph, self._max_batch_size)

    def _graph_bounds(self, batch: int, total_qo: int) -> Optional[Tuple[int, int]]:
        """With CUDA graphs: (max batch from qo_indptr_buf, max rows fixed by the first plan)."""
        if not self._use_cuda_graph:
            return None
        assert self._max_batch_size is not None
        if batch > self._max_batch_size:
            raise ValueError(
                f"batch_size {batch} exceeds the {self._max_batch_size} requests of the preallocated qo_indptr_buf "
                "(use_cuda_graph)"
            )
        if self._max_total_num_rows is None:
            self._max_total_num_rows = max(1, total_qo)
        elif total_qo > self._max_total_num_rows:
            raise ValueError(
                f"qo_indptr[-1] = {total_qo} query rows exceed the {self._max_total_num_rows} of the first plan, which "
                "fixes them with use_cuda_graph (as in FlashInfer)"
            )
        return self._max_batch_size, self._max_total_num_rows


class BatchPrefillWithPagedKVCacheWrapper(_PrefillBase):
    """Batch prefill/append attention over a paged KV cache, FlashInfer-compatible.

    Queries are ragged (``qo_indptr``); each request attends to its pages of the cache. Call
    :meth:`plan` once per batch shape and :meth:`run` once per layer. With ``use_cuda_graph=True``
    pass ``qo_indptr_buf`` ``[max_batch + 1]``, ``paged_kv_indptr_buf`` ``[max_batch + 1]``,
    ``paged_kv_indices_buf`` ``[max_num_pages]`` and ``paged_kv_last_page_len_buf`` ``[max_batch]``;
    the first plan fixes the number of query rows (q/out buffers of that many rows).
    """

    _cpp_class = "BatchPrefillPagedWrapper"

    def __init__(
        self,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional["torch.Tensor"] = None,
        paged_kv_indptr_buf: Optional["torch.Tensor"] = None,
        paged_kv_indices_buf: Optional["torch.Tensor"] = None,
        paged_kv_last_page_len_buf: Optional["torch.Tensor"] = None,
        custom_mask_buf: Optional["torch.Tensor"] = None,
        mask_indptr_buf: Optional["torch.Tensor"] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
        jit_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor (e.g. 128 MiB of uint8).
            kv_layout: ``"NHD"`` or ``"HND"``.
            use_cuda_graph: keep pointers fixed so :meth:`run` can be captured.
            qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf:
                preallocated int32 CUDA buffers, required with ``use_cuda_graph``.
            custom_mask_buf: with ``use_cuda_graph`` and custom masks, a uint8 CUDA buffer large
                enough for any plan's packed masks (the captured run() reads them there);
                mask_indptr_buf: accepted (the plan uploads its own offsets).
            backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (Tessera's kernels for the device; ``"fa3"`` needs sm_90).
            jit_args: FlashInfer's customized-module arguments; the wrapper then runs that variant
                (as :class:`tessera.BatchDecodeWithPagedKVCacheWrapper` describes), ``run(q, ...,
                *args)`` taking its additional tensors, then scalars.
            jit_kwargs: FlashInfer's keyword options of the customized module (``None`` or a dict
                of ``pos_encoding_mode``, ``use_sliding_window``, ``use_logits_soft_cap``,
                ``use_fp16_qk_reduction`` at their defaults: the variant is its declaration alone).
        """
        self._init_base(float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, custom_mask_buf,
                        mask_indptr_buf, backend, jit_args, jit_kwargs)
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        if self._use_cuda_graph:
            for name, buf in (
                ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                ("paged_kv_indices_buf", paged_kv_indices_buf),
                ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf),
            ):
                if buf is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (a preallocated int32 CUDA tensor)")
                U.check_index_tensor(name, buf)
            assert self._max_batch_size is not None
            assert paged_kv_indptr_buf is not None and paged_kv_last_page_len_buf is not None
            if paged_kv_indptr_buf.shape[0] != self._max_batch_size + 1:
                raise ValueError(
                    f"paged_kv_indptr_buf has {paged_kv_indptr_buf.shape[0]} entries, expected "
                    f"{self._max_batch_size + 1} (the length of qo_indptr_buf)"
                )
            if paged_kv_last_page_len_buf.shape[0] != self._max_batch_size:
                raise ValueError(
                    f"paged_kv_last_page_len_buf has {paged_kv_last_page_len_buf.shape[0]} entries, expected "
                    f"{self._max_batch_size} (len(qo_indptr_buf) - 1)"
                )
        # torch.compile: the handle of the custom op tessera::prefill_paged_run (tessera/_ops.py); the
        # workspace and the preallocated page ids keep their addresses (static for CUDA graphs).
        self._handle = R.enable_compile(self, self._float_workspace_buffer,
                                        paged_kv_indices_buf if self._use_cuda_graph else None)

    def plan(
        self,
        qo_indptr: "torch.Tensor",
        paged_kv_indptr: "torch.Tensor",
        paged_kv_indices: "torch.Tensor",
        paged_kv_last_page_len: "torch.Tensor",
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional["torch.Tensor"] = None,
        packed_custom_mask: Optional["torch.Tensor"] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: Union[str, "torch.dtype"] = "float16",
        kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional["torch.Tensor"] = None,
        token_pos_in_items_ptr: Optional["torch.Tensor"] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional["torch.Tensor"] = None,
        seq_lens: Optional["torch.Tensor"] = None,
        seq_lens_q: Optional["torch.Tensor"] = None,
        block_tables: Optional["torch.Tensor"] = None,
        max_token_per_sequence: Optional[int] = None,
        max_sequence_kv: Optional[int] = None,
        *,
        o_data_type: Optional[Union[str, "torch.dtype"]] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
        low_freq_factor: Optional[float] = None,
        high_freq_factor: Optional[float] = None,
        old_context_len: Optional[float] = None,
        q_rope_offset: Optional["torch.Tensor"] = None,
        k_rope_offset: Optional["torch.Tensor"] = None,
        num_sink_tokens: int = 0,
        use_sigmoid: bool = False,
        sigmoid_bias: Optional[float] = None,
        variant: Optional[VariantSpec] = None,
    ) -> None:
        """Plans one batch shape; every layer's :meth:`run` reuses it.

        Args:
            qo_indptr: int32 ``[batch_size + 1]``, request b owns query rows
                ``qo_indptr[b]:qo_indptr[b+1]`` (copied to the CPU).
            paged_kv_indptr: int32 ``[batch_size + 1]`` page ranges (copied to the CPU).
            paged_kv_indices: int32 ``[>= paged_kv_indptr[-1]]`` page ids on the GPU.
            paged_kv_last_page_len: int32 ``[batch_size]`` in ``[1, page_size]`` (copied to the CPU).
            num_qo_heads, num_kv_heads, head_dim_qk: heads (head dim one of tessera._C.supported_head_dims()).
            page_size: tokens per page (>= 1).
            head_dim_vo: ``None`` (``head_dim_qk``), or the head dim of v and of the output when
                it differs: a pair of ``tessera._C.supported_prefill_split_head_dims()``
                (``head_dim_qk=192, head_dim_vo=128``, DeepSeek's non-absorbed prefill), with a 16-bit
                KV cache and no variant option (others raise NotImplementedError naming them).
            causal: causal mask with offset ``kv_len - qo_len``.
            pos_encoding_mode: ``"NONE"``, ``"ROPE_LLAMA"``, ``"ALIBI"`` or ``"ROPE_LLAMA31"``
                (Tessera's; see the module doc; the ALiBi slopes live on the workspace's GPU, kept by
                the wrapper).
            sm_scale: default ``1/sqrt(head_dim_qk)``.
            window_left: sliding window, ``-1`` (off) or ``>= 0``.
            logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``.
            rope_scale, rope_theta: RoPE parameters, as in :func:`single_prefill_with_kv_cache`
                (``"ROPE_LLAMA"``: defaults ``1.0`` and ``1e4``; ``"ROPE_LLAMA31"``: the frequency
                factor, defaults ``8.0`` and ``5e5``).
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16, all equal, except
                ``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` for an fp8 cache
                (head dims 64, 128, 256; its scales go to :meth:`run`). FP8 attention:
                ``q_data_type=torch.float8_e4m3fn`` with ``kv_data_type`` ``None`` or
                ``torch.float8_e4m3fn`` and ``o_data_type`` ``None`` (``torch.bfloat16``, as FlashInfer's FP8
                prefill paths write) or ``torch.float16``: the MMAs run in fp8 (P rounded to e4m3),
                sm_90a only, head dims 128 and 256, ``causal`` and ``sm_scale`` only (a variant option,
                a custom mask, ``head_dim_vo``, ``use_cuda_graph`` raise NotImplementedError naming
                them); q's, K's and V's scales go to :meth:`run`. An e5m2 q, an fp8 q with a 16-bit
                cache and an fp8 ``o_data_type`` are NotImplementedError naming the argument.
            fixed_split_size: split KV ranges at multiples of this many KV tokens (a multiple of
                128; batch-invariant results). disable_split_kv: never split.
            custom_mask: bool, the requests' ``[qo_len, kv_len]`` masks flattened and
                concatenated (``sum(qo_len * kv_len)`` elements, True = key visible: tree attention
                for speculative verification), packed here; packed_custom_mask: uint8, the same
                packed per request with ``segment_packbits(..., bitorder="little")`` (wins when both
                are given). As in FlashInfer, a custom mask replaces ``causal``. With
                ``use_cuda_graph`` the packed bits are copied into ``custom_mask_buf``.
            use_fp16_qk_reduction, prefix_len_ptr,
            token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr, seq_lens, seq_lens_q,
            block_tables, max_token_per_sequence, max_sequence_kv: not supported
            (NotImplementedError unless left at their defaults). non_blocking: accepted.

        Tessera's keyword-only options (see :func:`single_prefill_with_kv_cache`):
            low_freq_factor, high_freq_factor, old_context_len: Llama 3.1 scaling with
                ``"ROPE_LLAMA31"``.
            q_rope_offset, k_rope_offset: per-request RoPE position offsets, int32
                ``[batch_size]`` on the CPU or the workspace's GPU (a RoPE mode only): request b's
                query i is rotated at ``kv_len - qo_len + i + q_rope_offset[b]``, its key j at
                ``j + k_rope_offset[b]``; kept by the wrapper for the runs of the plan (with
                ``use_cuda_graph`` copied into a buffer of its own).
            num_sink_tokens: attention sinks with the sliding window (``window_left >= 0``).
            variant: a :class:`tessera.VariantSpec` (CUDA C++ hooks, or
                :func:`tessera.flex_variant` of a score_mod / mask_mod, whose ``b`` is the request
                and ``q_idx`` the query's position in its sequence); compiled at the first run.
                One that defines ``output_transform`` fails its compile (the runtime merges split
                KV chunks by their log-sum-exp; :func:`single_prefill_with_kv_cache` runs it).
            use_sigmoid, sigmoid_bias: sigmoid attention (as :func:`single_prefill_with_kv_cache`).
                Without softmax (this, or a variant with ``use_softmax=False``) the plan never
                splits KV, and ``run(return_lse=True)`` is a ValueError.

        The variant options are fixed by the plan: every :meth:`run` of it uses them (with
        ``use_cuda_graph``, the first plan fixes them for the life of the wrapper).
        """
        variant, sm_scale = self._jit_plan_args(variant, sm_scale)
        options = _check_prefill_options(pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                                         rope_scale, rope_theta, low_freq_factor=low_freq_factor,
                                         high_freq_factor=high_freq_factor, old_context_len=old_context_len,
                                         num_sink_tokens=num_sink_tokens, use_sigmoid=use_sigmoid,
                                         sigmoid_bias=sigmoid_bias, variant=variant)
        for name, value in (("prefix_len_ptr", prefix_len_ptr), ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                            ("max_item_len_ptr", max_item_len_ptr), ("seq_lens", seq_lens),
                            ("seq_lens_q", seq_lens_q), ("block_tables", block_tables),
                            ("max_token_per_sequence", max_token_per_sequence),
                            ("max_sequence_kv", max_sequence_kv)):
            U.check_none(name, value)
        if token_pos_in_items_len:
            raise U.unsupported("token_pos_in_items_len", token_pos_in_items_len, "0")
        causal = _check_causal(causal)
        dtype, kv_dtype, o_dtype = U.resolve_prefill_plan_dtypes(q_data_type, kv_data_type, o_data_type)
        fp8_q = U.is_fp8(dtype)
        hq, hkv, d, dv = U.check_prefill_head_dims(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo)
        if self._jit is not None:
            self._jit.check_plan(type(self).__name__, options, dtype, kv_dtype, d, dv)
        if fp8_q:
            _check_fp8_plan(options, d, dv, custom_mask, packed_custom_mask, self._use_cuda_graph)
        _check_split_head_dims_options(dv, d, options, kv_dtype)
        page_size = U.check_positive_int("page_size", page_size)
        scale = U.resolve_sm_scale(sm_scale, d)
        split, split_size = split_options(fixed_split_size, disable_split_kv, 1)

        qo_host = U.to_host_int32("qo_indptr", qo_indptr)
        U.check_indptr_values("qo_indptr", qo_host)
        batch = int(qo_host.shape[0]) - 1
        kv_host = U.to_host_int32("paged_kv_indptr", paged_kv_indptr, batch + 1)
        U.check_indptr_values("paged_kv_indptr", kv_host)
        last_host = U.to_host_int32("paged_kv_last_page_len", paged_kv_last_page_len, batch)
        U.check_index_tensor("paged_kv_indices", paged_kv_indices)
        num_pages = int(kv_host[-1])
        if paged_kv_indices.shape[0] < num_pages:
            raise ValueError(
                f"paged_kv_indices has {paged_kv_indices.shape[0]} entries, expected >= paged_kv_indptr[-1] = {num_pages}"
            )
        total_qo = int(qo_host[-1])
        if self._use_cuda_graph:
            assert self._paged_kv_indices_buf is not None
            if num_pages > self._paged_kv_indices_buf.shape[0]:
                raise ValueError(
                    f"paged_kv_indptr[-1] = {num_pages} pages exceed the {self._paged_kv_indices_buf.shape[0]} entries "
                    "of paged_kv_indices_buf (use_cuda_graph)"
                )
        options.check_tensors(q_rope_offset, k_rope_offset, batch, self._float_workspace_buffer.device)
        graph_bounds = self._graph_bounds(batch, total_qo)
        pages = kv_host[1:] - kv_host[:-1]
        kv_lens = U._torch().where(pages > 0, (pages - 1) * page_size + last_host, U._torch().zeros_like(pages))
        mask = _plan_custom_mask(custom_mask, packed_custom_mask, qo_host, kv_lens,
                                 self._float_workspace_buffer.device, self._custom_mask_buf, self._use_cuda_graph)
        causal = causal and not mask  # FlashInfer: a custom mask replaces the causal mask

        # GPU work from here on (a failure below leaves the wrapper unplanned).
        self._planned = None
        cpp = self._holder.ensure(_Need(batch, total_qo, hq, hkv, d, dv), dtype, split, split_size, graph_bounds,
                                  kv_dtype=kv_dtype)
        device = self._float_workspace_buffer.device
        if self._use_cuda_graph:
            assert self._paged_kv_indices_buf is not None and self._qo_indptr_buf is not None
            assert self._paged_kv_indptr_buf is not None and self._paged_kv_last_page_len_buf is not None
            # In one call of the bindings when it can (U.copy_index_arrays), else a torch copy each.
            if not (non_blocking and U.copy_index_arrays(
                    U.current_stream(device), device, self._paged_kv_indices_buf, paged_kv_indices, num_pages,
                    self._qo_indptr_buf, qo_host, batch + 1, self._paged_kv_indptr_buf, kv_host, batch + 1,
                    self._paged_kv_last_page_len_buf, last_host, batch)):
                if paged_kv_indices.data_ptr() != self._paged_kv_indices_buf.data_ptr():
                    self._paged_kv_indices_buf[:num_pages].copy_(paged_kv_indices[:num_pages], non_blocking=True)
                self._qo_indptr_buf[: batch + 1].copy_(qo_host, non_blocking=non_blocking)
                self._paged_kv_indptr_buf[: batch + 1].copy_(kv_host, non_blocking=non_blocking)
                self._paged_kv_last_page_len_buf[:batch].copy_(last_host, non_blocking=non_blocking)
            run_indices = self._paged_kv_indices_buf
        else:
            run_indices = (paged_kv_indices if paged_kv_indices.device == device
                           else paged_kv_indices.to(device, non_blocking=True))
        self._alibi_slopes = U.alibi_slopes(hq, device) if options.alibi else None
        q_offset, k_offset = self._rope_offsets.plan_tensors(
            U.rope_offset_tensor(q_rope_offset, device), U.rope_offset_tensor(k_rope_offset, device), batch, device)
        fp8 = U.is_fp8(kv_dtype)
        cpp.plan(qo_host, kv_host, last_host, page_size, hq, hkv, d, U.tessera_dtype(dtype), scale, causal,
                 U.current_stream(device), U.device_index(self._float_workspace_buffer),
                 kv_dtype=U.tessera_dtype(kv_dtype) if fp8 else None,
                 **(self._kv_scales.plan_kwargs(device, with_q=fp8_q) if fp8 else {}),
                 **options.kwargs(self._alibi_slopes, q_offset, k_offset), **_head_dim_vo_kwargs(d, dv), **mask)
        self._planned = {
            "batch": batch,
            "total_qo": total_qo,
            "num_qo_heads": hq,
            "num_kv_heads": hkv,
            "head_dim": d,
            "head_dim_vo": dv,
            "page_size": page_size,
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "indices": run_indices,
            "host_indices": U.HostPageIds("paged_kv_indices", paged_kv_indices, num_pages),
            "custom_mask": mask.get("custom_mask"),  # kept alive: the plan points at it
            "causal": causal,
            "sm_scale": scale,
            "window_left": options.window_left,
            "no_lse": options.no_lse_reason(),
            **_run_fields(device, self._kv_layout, hkv, d, dv, page_size, kv_dtype, None, dtype, hq),
            **_fp8_plan_fields(fp8_q, o_dtype),
        }
        self._planned["run_fast"] = _paged_fast_run(self._planned, cpp)
        self._jit_planned()

    begin_forward = plan

    def run(
        self,
        q: "torch.Tensor",
        paged_kv_cache: PagedKVCache,
        *args: Any,
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        out: Optional["torch.Tensor"] = None,
        lse: Optional["torch.Tensor"] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
        window_left: Optional[int] = None,
    ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        """Runs the planned batch for one layer on PyTorch's current CUDA stream.

        Args:
            q: ``[qo_indptr[-1], num_qo_heads, head_dim]`` (more rows are allowed and ignored), the
                plan's ``q_data_type``.
            paged_kv_cache: ``(k_cache, v_cache)`` or one ``[num_pages, 2, ...]`` tensor in
                ``kv_layout``.
            q_scale: an FP8 attention plan's (``q_data_type=torch.float8_e4m3fn``) dequantization
                scale of q, multiplied into the logits with ``k_scale`` (FlashInfer's meaning):
                ``None`` (1), a float > 0 or a one-element float32 tensor on the workspace's device,
                this call's; with a 16-bit q only ``None``/``1.0``. k_scale, v_scale: as in
                :meth:`BatchDecodeWithPagedKVCacheWrapper.run` (an fp8 cache's scales; ``v_scale``
                scales the output).
            out, lse, return_lse: as in :meth:`BatchDecodeWithPagedKVCacheWrapper.run`; ``out`` of
                the plan's ``o_data_type`` (q's dtype, or FP8 attention's 16-bit output).
            enable_pdl: accepted and ignored.
            window_left: ``None`` or the plan's ``window_left`` (the plan fixes the variant;
                another value raises NotImplementedError).

        Returns:
            ``out`` or ``(out, lse)`` (LSE base 2, float32 ``[rows, num_qo_heads]``).
        """
        p = self._planned
        # The common call, as in BatchDecodeWithPagedKVCacheWrapper.run.
        if (p is not None and not args and q_scale is None and k_scale is None and v_scale is None and not return_lse
                and window_left is None and (R._OPS is None or not R._IS_COMPILING())):
            fast = p.get("run_fast")
            if fast is not None:
                result = fast(q, paged_kv_cache, out)
                if result is not None:
                    return result
        if args and self._jit is None:
            U.check_no_extra_args(args)
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with this batch's index arrays first")
        if self._jit is not None:
            self._set_jit_args(args)
        fp8_q = "o_dtype" in p  # FP8 attention: q_scale is q's dequantization scale
        if q_scale is not None and not fp8_q:
            U.check_scale("q_scale", q_scale)
        if window_left is not None:
            U.check_run_window_left(window_left, p["window_left"])
        if R.compiling():
            return _paged_run_compiled(R._OPS.PREFILL_PAGED_RUN, self, p, q, paged_kv_cache, k_scale, v_scale, out,
                                       lse, return_lse, _op_q_args(p, q_scale, self._holder.workspace))
        return _paged_run(self, p, q, paged_kv_cache, k_scale, v_scale, out, lse, return_lse,
                          q_scale if fp8_q else None)

    forward = run

    def run_return_lse(self, q: "torch.Tensor", paged_kv_cache: PagedKVCache, *args: Any, **kwargs: Any) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """``run(..., return_lse=True)``."""
        kwargs["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kwargs)  # type: ignore[return-value]


def _ragged_kv_fast(k: Any, v: Any, q: "torch.Tensor", p: Dict[str, Any], nhd: bool) -> bool:
    """The ragged run()'s k / v checks in their common case, in few attribute reads: 3-D tensors of
    the plan's kv dtype, KV heads and head dims (k's head_dim, v's head_dim_vo) with as many rows,
    on q's device, which is the plan's. False when anything differs (the full checks then name it)."""
    device = p.get("device")
    tensor = U._torch().Tensor
    if device is None or not (isinstance(k, tensor) and isinstance(v, tensor)) or q.device != device:
        return False
    ks, vs = k.shape, v.shape
    hkv, d, dv, kv_dtype = p["num_kv_heads"], p["head_dim"], p["head_dim_vo"], p["kv_dtype"]
    if len(ks) != 3 or len(vs) != 3 or ks[2] != d or vs[2] != dv:
        return False
    if nhd:
        shapes_ok = ks[1] == hkv and vs[1] == hkv and vs[0] == ks[0]
    else:
        shapes_ok = ks[0] == hkv and vs[0] == hkv and vs[1] == ks[1]
    return (shapes_ok and k.dtype == kv_dtype and v.dtype == kv_dtype and k.device == device
            and v.device == device)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillBase):
    """Batch prefill attention over ragged (packed) KV, FlashInfer-compatible.

    Request b's queries are rows ``qo_indptr[b]:qo_indptr[b+1]`` of q and its keys/values rows
    ``kv_indptr[b]:kv_indptr[b+1]`` of k/v. With ``use_cuda_graph=True`` pass ``qo_indptr_buf``
    and ``kv_indptr_buf`` ``[max_batch + 1]``; the first plan fixes the number of query rows.
    """

    _cpp_class = "BatchPrefillRaggedWrapper"

    def __init__(
        self,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Optional["torch.Tensor"] = None,
        kv_indptr_buf: Optional["torch.Tensor"] = None,
        custom_mask_buf: Optional["torch.Tensor"] = None,
        mask_indptr_buf: Optional["torch.Tensor"] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
        jit_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor (e.g. 128 MiB of uint8).
            kv_layout: ``"NHD"`` (k/v ``[kv_rows, num_kv_heads, head_dim]``) or ``"HND"``
                (``[num_kv_heads, kv_rows, head_dim]``).
            use_cuda_graph: keep pointers fixed so :meth:`run` can be captured.
            qo_indptr_buf, kv_indptr_buf: preallocated int32 CUDA buffers, required with
                ``use_cuda_graph``.
            custom_mask_buf: with ``use_cuda_graph`` and custom masks, a uint8 CUDA buffer large
                enough for any plan's packed masks (the captured run() reads them there);
                mask_indptr_buf: accepted (the plan uploads its own offsets). backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (Tessera's kernels for the device; ``"fa3"`` needs sm_90).
            jit_args: FlashInfer's customized-module arguments; the wrapper then runs that variant
                (as :class:`tessera.BatchDecodeWithPagedKVCacheWrapper` describes), ``run(q, ...,
                *args)`` taking its additional tensors, then scalars.
            jit_kwargs: FlashInfer's keyword options of the customized module (``None`` or a dict
                of ``pos_encoding_mode``, ``use_sliding_window``, ``use_logits_soft_cap``,
                ``use_fp16_qk_reduction`` at their defaults: the variant is its declaration alone).
        """
        self._init_base(float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, custom_mask_buf,
                        mask_indptr_buf, backend, jit_args, jit_kwargs)
        self._kv_indptr_buf = kv_indptr_buf
        if self._use_cuda_graph:
            if kv_indptr_buf is None:
                raise ValueError("use_cuda_graph=True needs kv_indptr_buf (a preallocated int32 CUDA tensor)")
            U.check_index_tensor("kv_indptr_buf", kv_indptr_buf)
            assert self._max_batch_size is not None
            if kv_indptr_buf.shape[0] != self._max_batch_size + 1:
                raise ValueError(
                    f"kv_indptr_buf has {kv_indptr_buf.shape[0]} entries, expected {self._max_batch_size + 1} "
                    "(the length of qo_indptr_buf)"
                )
        # torch.compile: the handle of the custom op tessera::prefill_ragged_run (tessera/_ops.py); the
        # workspace keeps its address (static for CUDA graphs).
        self._handle = R.enable_compile(self, self._float_workspace_buffer)

    def plan(
        self,
        qo_indptr: "torch.Tensor",
        kv_indptr: "torch.Tensor",
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: Optional[int] = None,
        custom_mask: Optional["torch.Tensor"] = None,
        packed_custom_mask: Optional["torch.Tensor"] = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        q_data_type: Union[str, "torch.dtype"] = "float16",
        kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
        non_blocking: bool = True,
        prefix_len_ptr: Optional["torch.Tensor"] = None,
        token_pos_in_items_ptr: Optional["torch.Tensor"] = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Optional["torch.Tensor"] = None,
        *,
        o_data_type: Optional[Union[str, "torch.dtype"]] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
        low_freq_factor: Optional[float] = None,
        high_freq_factor: Optional[float] = None,
        old_context_len: Optional[float] = None,
        q_rope_offset: Optional["torch.Tensor"] = None,
        k_rope_offset: Optional["torch.Tensor"] = None,
        num_sink_tokens: int = 0,
        use_sigmoid: bool = False,
        sigmoid_bias: Optional[float] = None,
        variant: Optional[VariantSpec] = None,
    ) -> None:
        """Plans one batch shape; every layer's :meth:`run` reuses it.

        Args:
            qo_indptr: int32 ``[batch_size + 1]`` query row ranges (copied to the CPU).
            kv_indptr: int32 ``[batch_size + 1]`` KV row ranges (copied to the CPU).
            num_qo_heads, num_kv_heads, head_dim_qk: heads (head dim one of tessera._C.supported_head_dims()).
            head_dim_vo: ``None`` (``head_dim_qk``), or the head dim of v and of the output when
                it differs: a pair of ``tessera._C.supported_prefill_split_head_dims()``
                (``head_dim_qk=192, head_dim_vo=128``, DeepSeek's non-absorbed prefill), with a 16-bit
                KV cache and no variant option (others raise NotImplementedError naming them).
            causal: causal mask with offset ``kv_len - qo_len``.
            pos_encoding_mode: ``"NONE"``, ``"ROPE_LLAMA"``, ``"ALIBI"`` or ``"ROPE_LLAMA31"``
                (Tessera's; see the module doc; the ALiBi slopes live on the workspace's GPU, kept by
                the wrapper).
            window_left: sliding window, ``-1`` (off) or ``>= 0``.
            logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``.
            sm_scale: default ``1/sqrt(head_dim_qk)``.
            rope_scale, rope_theta: RoPE parameters, as in :func:`single_prefill_with_kv_cache`
                (``"ROPE_LLAMA"``: defaults ``1.0`` and ``1e4``; ``"ROPE_LLAMA31"``: the frequency
                factor, defaults ``8.0`` and ``5e5``).
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16, all equal, except
                ``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` for an fp8 cache
                (head dims 64, 128, 256; its scales go to :meth:`run`); FP8 attention
                (``q_data_type=torch.float8_e4m3fn``) as in
                :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`.
            fixed_split_size: split KV ranges at multiples of this many KV tokens (a multiple of
                128). disable_split_kv: never split.
            custom_mask: bool, the requests' ``[qo_len, kv_len]`` masks flattened and
                concatenated (``sum(qo_len * kv_len)`` elements, True = key visible: tree attention
                for speculative verification), packed here; packed_custom_mask: uint8, the same
                packed per request with ``segment_packbits(..., bitorder="little")`` (wins when both
                are given). As in FlashInfer, a custom mask replaces ``causal``. With
                ``use_cuda_graph`` the packed bits are copied into ``custom_mask_buf``.
            use_fp16_qk_reduction, prefix_len_ptr,
            token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr: not supported.
            non_blocking: accepted.

        Tessera's keyword-only options (low_freq_factor, high_freq_factor, old_context_len,
        q_rope_offset, k_rope_offset, num_sink_tokens; use_sigmoid, sigmoid_bias and variant only
        at their defaults): as in :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`.

        The variant options are fixed by the plan: every :meth:`run` of it uses them (with
        ``use_cuda_graph``, the first plan fixes them for the life of the wrapper).
        """
        variant, sm_scale = self._jit_plan_args(variant, sm_scale)
        options = _check_prefill_options(pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
                                         rope_scale, rope_theta, low_freq_factor=low_freq_factor,
                                         high_freq_factor=high_freq_factor, old_context_len=old_context_len,
                                         num_sink_tokens=num_sink_tokens, use_sigmoid=use_sigmoid,
                                         sigmoid_bias=sigmoid_bias, variant=variant)
        for name, value in (("prefix_len_ptr", prefix_len_ptr), ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                            ("max_item_len_ptr", max_item_len_ptr)):
            U.check_none(name, value)
        if token_pos_in_items_len:
            raise U.unsupported("token_pos_in_items_len", token_pos_in_items_len, "0")
        causal = _check_causal(causal)
        dtype, kv_dtype, o_dtype = U.resolve_prefill_plan_dtypes(q_data_type, kv_data_type, o_data_type)
        fp8_q = U.is_fp8(dtype)
        hq, hkv, d, dv = U.check_prefill_head_dims(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo)
        if self._jit is not None:
            self._jit.check_plan(type(self).__name__, options, dtype, kv_dtype, d, dv)
        if fp8_q:
            _check_fp8_plan(options, d, dv, custom_mask, packed_custom_mask, self._use_cuda_graph)
        _check_split_head_dims_options(dv, d, options, kv_dtype)
        scale = U.resolve_sm_scale(sm_scale, d)
        split, split_size = split_options(fixed_split_size, disable_split_kv, 1)

        qo_host = U.to_host_int32("qo_indptr", qo_indptr)
        U.check_indptr_values("qo_indptr", qo_host)
        batch = int(qo_host.shape[0]) - 1
        kv_host = U.to_host_int32("kv_indptr", kv_indptr, batch + 1)
        U.check_indptr_values("kv_indptr", kv_host)
        total_qo = int(qo_host[-1])
        options.check_tensors(q_rope_offset, k_rope_offset, batch, self._float_workspace_buffer.device)
        graph_bounds = self._graph_bounds(batch, total_qo)
        mask = _plan_custom_mask(custom_mask, packed_custom_mask, qo_host, kv_host[1:] - kv_host[:-1],
                                 self._float_workspace_buffer.device, self._custom_mask_buf, self._use_cuda_graph)
        causal = causal and not mask  # FlashInfer: a custom mask replaces the causal mask

        # GPU work from here on (a failure below leaves the wrapper unplanned).
        self._planned = None
        cpp = self._holder.ensure(_Need(batch, total_qo, hq, hkv, d, dv), dtype, split, split_size, graph_bounds,
                                  kv_dtype=kv_dtype)
        device = self._float_workspace_buffer.device
        if self._use_cuda_graph:
            assert self._qo_indptr_buf is not None and self._kv_indptr_buf is not None
            if not (non_blocking and U.copy_index_arrays(U.current_stream(device), device, self._qo_indptr_buf,
                                                         qo_host, batch + 1, self._kv_indptr_buf, kv_host,
                                                         batch + 1)):
                self._qo_indptr_buf[: batch + 1].copy_(qo_host, non_blocking=non_blocking)
                self._kv_indptr_buf[: batch + 1].copy_(kv_host, non_blocking=non_blocking)
        self._alibi_slopes = U.alibi_slopes(hq, device) if options.alibi else None
        q_offset, k_offset = self._rope_offsets.plan_tensors(
            U.rope_offset_tensor(q_rope_offset, device), U.rope_offset_tensor(k_rope_offset, device), batch, device)
        fp8 = U.is_fp8(kv_dtype)
        cpp.plan(qo_host, kv_host, hq, hkv, d, U.tessera_dtype(dtype), scale, causal, U.current_stream(device),
                 U.device_index(self._float_workspace_buffer), kv_dtype=U.tessera_dtype(kv_dtype) if fp8 else None,
                 **(self._kv_scales.plan_kwargs(device, with_q=fp8_q) if fp8 else {}),
                 **options.kwargs(self._alibi_slopes, q_offset, k_offset), **_head_dim_vo_kwargs(d, dv), **mask)
        self._planned = {
            "batch": batch,
            "total_qo": total_qo,
            "total_kv": int(kv_host[-1]),
            "custom_mask": mask.get("custom_mask"),  # kept alive: the plan points at it
            "num_qo_heads": hq,
            "num_kv_heads": hkv,
            "head_dim": d,
            "head_dim_vo": dv,
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "causal": causal,
            "sm_scale": scale,
            "window_left": options.window_left,
            "no_lse": options.no_lse_reason(),
            **_run_fields(device, self._kv_layout, hkv, d, dv, None, kv_dtype),
            **_fp8_plan_fields(fp8_q, o_dtype),
        }

    begin_forward = plan

    def run(
        self,
        q: "torch.Tensor",
        k: "torch.Tensor",
        v: "torch.Tensor",
        *args: Any,
        q_scale: Optional[Union[float, "torch.Tensor"]] = None,
        k_scale: Optional[Union[float, "torch.Tensor"]] = None,
        v_scale: Optional[Union[float, "torch.Tensor"]] = None,
        out: Optional["torch.Tensor"] = None,
        lse: Optional["torch.Tensor"] = None,
        return_lse: bool = False,
        enable_pdl: Optional[bool] = None,
    ) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
        """Runs the planned batch for one layer on PyTorch's current CUDA stream.

        Args:
            q: ``[qo_indptr[-1], num_qo_heads, head_dim]``, the plan's ``q_data_type``.
            k, v: ``[kv_indptr[-1], num_kv_heads, head_dim]`` (NHD) or
                ``[num_kv_heads, kv_indptr[-1], head_dim]`` (HND), the plan's ``kv_data_type``.
            q_scale: an FP8 attention plan's scale of q, as in
                :meth:`BatchPrefillWithPagedKVCacheWrapper.run`; with a 16-bit q only ``None``/``1.0``.
            k_scale, v_scale: an fp8 K/V's scales, as in :meth:`BatchDecodeWithPagedKVCacheWrapper.run`.
            out, lse, return_lse: as in :meth:`BatchPrefillWithPagedKVCacheWrapper.run`.
            enable_pdl: accepted and ignored.

        Returns:
            ``out`` or ``(out, lse)`` (LSE base 2, float32 ``[rows, num_qo_heads]``).
        """
        if args and self._jit is None:
            U.check_no_extra_args(args)
        p = self._planned
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with this batch's index arrays first")
        if self._jit is not None:
            self._set_jit_args(args)
        fp8_q = "o_dtype" in p  # FP8 attention: q_scale is q's dequantization scale
        if q_scale is not None and not fp8_q:
            U.check_scale("q_scale", q_scale)
        compiling = R.compiling()  # torch.compile traces this run(): the op tessera::prefill_ragged_run launches
        q, out, lse = _check_run_queries(q, out, lse, return_lse, p, allocate=not compiling)
        k_in, v_in = k, v
        if not compiling and _ragged_kv_fast(k, v, q, p, self._kv_layout == "NHD"):
            if self._kv_layout == "HND":
                k, v = k.transpose(0, 1), v.transpose(0, 1)  # views: [kv_rows, H_kv, D] with strides
        else:
            U.check_tensor("k", k, ndim=3, shape_hint="([kv_rows, num_kv_heads, head_dim] or HND)")
            U.check_tensor("v", v, ndim=3, shape_hint="([kv_rows, num_kv_heads, head_dim] or HND)")
            U.kv_data_dtype_check("k", k, q.dtype, p["kv_dtype"])
            U.kv_data_dtype_check("v", v, q.dtype, p["kv_dtype"])
            v_shape = tuple(k.shape[:2]) + (p.get("head_dim_vo", p["head_dim"]),)
            if tuple(v.shape) != v_shape:
                raise ValueError(f"v has shape {tuple(v.shape)}, expected {v_shape} (k's with the plan's head_dim_vo)")
            U.check_same_device("k", k, "q", q)
            U.check_same_device("v", v, "q", q)
            if self._kv_layout == "HND":
                k, v = k.transpose(0, 1), v.transpose(0, 1)  # views: [kv_rows, H_kv, D] with strides
            if k.shape[1] != p["num_kv_heads"] or k.shape[2] != p["head_dim"]:
                raise ValueError(
                    f"k has {k.shape[1]} KV heads of dim {k.shape[2]} (kv_layout={self._kv_layout!r}), but the plan "
                    f"was made for num_kv_heads {p['num_kv_heads']}, head_dim {p['head_dim']}"
                )
        if compiling:  # the op transposes HND itself, allocates out / lse when None, sets fp8 scale values
            ws = self._holder.workspace
            scales = _op_kv_scales(p, k_scale, v_scale, ws) + _op_q_args(p, q_scale, ws)
            o, l = R._OPS.PREFILL_RAGGED_RUN(self._handle, q.detach(), k_in.detach(), v_in.detach(), self._kv_layout,
                                             ws, out, lse if return_lse else None, return_lse, *scales)
            return _op_results(o, l, out, lse, return_lse)
        if _run_kv_scales(self._kv_scales, p, k_scale, v_scale, self._use_cuda_graph, q_scale if fp8_q else None):
            k, v, kv_dtype = U.kv_arg(k), U.kv_arg(v), p["kv_dtype_arg"]
        else:
            kv_dtype = None
        if fp8_q:  # q as bytes with its dtype named, as fp8 K/V
            U.launch(self._holder.cpp.run, q, U.kv_arg(q), k, v, out, lse if return_lse else None,
                     U.current_stream(q.device), kv_dtype=kv_dtype, q_dtype=p["q_dtype_arg"])
        else:
            U.launch(self._holder.cpp.run, q, q, k, v, out, lse if return_lse else None, U.current_stream(q.device),
                     kv_dtype=kv_dtype)
        return (out, lse) if return_lse else out

    forward = run

    def run_return_lse(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", *args: Any, **kwargs: Any) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """``run(..., return_lse=True)``."""
        kwargs["return_lse"] = True
        return self.run(q, k, v, *args, **kwargs)  # type: ignore[return-value]
