"""Decode attention (one query token per request), FlashInfer-compatible.

- :func:`single_decode_with_kv_cache`: one request, contiguous KV.
- :class:`BatchDecodeWithPagedKVCacheWrapper`: a batch over a paged KV cache with the plan/run
  runtime (plan once per generation step, run once per layer; CUDA-Graph capturable); one or
  several (``q_len_per_req``) query tokens per request.
- :func:`fast_decode_plan`: FlashInfer's cheaper re-plan of that wrapper.

Log-sum-exp values are base 2 (as FlashInfer's Python API): ``lse = log2(sum_j exp(s_j))`` over the
scaled logits ``s_j = sm_scale * q.k_j`` (after the variant's transforms).

Variants (FlashInfer's options; any non-default one is JIT-compiled on first use and cached): with
the query at position ``p = kv_len - 1`` and key ``j``,

- ``window_left = w >= 0``: key j is visible only if ``j >= p - w`` (sliding window);
- ``logits_soft_cap = c > 0``: ``s = c * tanh(s / c)``;
- ``pos_encoding_mode="ALIBI"``: ``s += slope[h] * (j - p)`` with the standard slopes of
  ``num_qo_heads`` heads (before the soft-cap);
- ``pos_encoding_mode="ROPE_LLAMA"``: q and k are rotated ("rotate half", Llama) at positions
  p and j, angle ``(pos / rope_scale) * rope_theta^(-2d / head_dim)``, before the dot product
  (the cache keeps un-rotated keys).

Tessera's variants (keyword-only arguments; no FlashInfer counterpart in these functions):

- ``pos_encoding_mode="ROPE_LLAMA31"``: the Llama rotation with Llama 3.1 frequency scaling, the
  definition (and argument names and defaults) of ``flashinfer.apply_llama31_rope``: with
  ``f_d = rope_theta^(-2d / head_dim)`` and wavelength ``2 pi / f_d``, frequencies of wavelength
  above ``old_context_len / low_freq_factor`` are divided by ``rope_scale`` (the factor, default
  8), those below ``old_context_len / high_freq_factor`` kept, and in between ``(1 - a) f_d /
  rope_scale + a f_d`` with ``a = (old_context_len / wavelength - low_freq_factor) /
  (high_freq_factor - low_freq_factor)``; angle ``pos * f_d`` (positions are not divided).
  Defaults: ``rope_theta`` 5e5, ``low_freq_factor`` 1, ``high_freq_factor`` 4,
  ``old_context_len`` 8192.
- ``q_rope_offset``, ``k_rope_offset`` (with a RoPE mode): per-request position offsets: q rotated
  at ``p + q_rope_offset[b]``, key j at ``j + k_rope_offset[b]`` (masks keep using p and j).
- ``num_sink_tokens = n`` (with ``window_left >= 0``): keys ``j < n`` stay visible outside the
  window (StreamingLLM's attention sinks; they still obey the causal mask).
- ``use_sigmoid=True`` with ``sigmoid_bias = b``: weights ``sigmoid(s + b)`` (``s`` the scaled
  logits after ALiBi and soft-cap) instead of the softmax, no normalisation, no LSE;
  single-request functions only (the plan/run wrappers raise NotImplementedError).
- ``variant``: a user variant (:class:`tessera.VariantSpec`, CUDA C++ hooks); single-request
  functions only.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from . import _runtime as R
from . import _utils as U
from ._runtime import _KVScaleBuffer, _Need, _PrefixViews, _RopeOffsets, _RuntimeHolder, split_options
from .variant import VariantSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "single_decode_with_kv_cache",
    "batch_decode_with_ragged_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "single_decode_with_kv_cache_with_jit_module",
]

PagedKVCache = Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]


def single_decode_with_kv_cache(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
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
    """Decode attention of one request against its whole KV cache.

    Args:
        q: ``[num_qo_heads, head_dim]`` float16/bfloat16 CUDA tensor.
        k, v: ``[kv_len, num_kv_heads, head_dim]`` (``kv_layout="NHD"``) or
            ``[num_kv_heads, kv_len, head_dim]`` (``"HND"``), q's dtype or both
            ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (an fp8 cache: head dims 64, 128, 256);
            any strides with a contiguous last dimension. ``num_qo_heads`` must be a multiple of
            ``num_kv_heads``.
        kv_layout: ``"NHD"`` or ``"HND"``.
        pos_encoding_mode: ``"NONE"``, ``"ROPE_LLAMA"`` (RoPE on q and k), ``"ALIBI"`` or
            ``"ROPE_LLAMA31"`` (Tessera's: Llama 3.1 RoPE; see the module doc).
        use_tensor_cores: accepted for compatibility; Tessera picks the kernel itself.
        q_scale: only ``None``/``1.0``.
        k_scale, v_scale: fp8 K/V only: the dequantization scales (an element ``x`` stands for
            ``x * scale``), each ``None`` (1), a float > 0, or a float32 tensor on q's device of 1 or
            ``num_kv_heads`` elements (per KV head); with 16-bit K/V only ``None``/``1.0``.
        window_left: sliding window, ``-1`` (off) or the number of keys before the query's
            position it still sees.
        logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``: ``cap * tanh(logits / cap)``.
        sm_scale: logit scale, default ``1/sqrt(head_dim)``.
        rope_scale, rope_theta: RoPE parameters, used with a RoPE mode: with ``"ROPE_LLAMA"``
            positions are divided by ``rope_scale`` (defaults ``1.0`` and ``1e4``); with
            ``"ROPE_LLAMA31"`` ``rope_scale`` is the Llama 3.1 frequency factor (defaults ``8.0``
            and ``5e5``, as ``flashinfer.apply_llama31_rope``).
        return_lse: also return the base-2 log-sum-exp, float32 ``[num_qo_heads]``.

    Tessera's keyword-only options (no FlashInfer counterpart in this function; module doc):
        low_freq_factor, high_freq_factor, old_context_len: Llama 3.1 scaling with
            ``"ROPE_LLAMA31"`` only (defaults ``1.0``, ``4.0``, ``8192``).
        q_rope_offset, k_rope_offset: RoPE position offsets (a RoPE mode only): the query is
            rotated at ``kv_len - 1 + q_rope_offset`` and key j at ``j + k_rope_offset``; an int or
            an int32 tensor of one element on q's device (or the CPU).
        num_sink_tokens: attention sinks: keys ``j < num_sink_tokens`` stay visible outside the
            sliding window (needs ``window_left >= 0``). Not FlashInfer's ``sinks`` (per-head sink
            logits), which Tessera does not implement.
        use_sigmoid, sigmoid_bias: sigmoid attention: ``out = sum_j sigmoid(s_j + sigmoid_bias)
            v_j`` over the visible keys with ``s_j`` the scaled logits after ALiBi / soft-cap (no
            softmax, no normalisation; ``return_lse=True`` is a ValueError).
        variant: a :class:`tessera.VariantSpec`, a user variant in CUDA C++ (its hooks run after
            the built-in options; with ``use_softmax=False`` ``return_lse`` is refused).

    Returns:
        ``out`` ``[num_qo_heads, head_dim]`` (q's dtype), or ``(out, lse)`` with ``return_lse``.
        With ``kv_len == 0`` the output is 0 and the LSE ``-inf``.
    """
    torch = U._torch()
    layout = U.check_kv_layout(kv_layout)
    U.check_scale("q_scale", q_scale)
    options = U.resolve_variant(pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
                                low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                                old_context_len=old_context_len, num_sink_tokens=num_sink_tokens,
                                use_sigmoid=use_sigmoid, sigmoid_bias=sigmoid_bias, variant=variant)
    options.check_return_lse(return_lse)
    U.check_tensor("q", q, ndim=2, shape_hint="([num_qo_heads, head_dim])")
    U.check_attention_dtype(q.dtype, "q.dtype")
    U.check_tensor("k", k, ndim=3, shape_hint="([kv_len, num_kv_heads, head_dim] or HND)")
    U.check_tensor("v", v, ndim=3, shape_hint="([kv_len, num_kv_heads, head_dim] or HND)")
    U.kv_data_dtype_check("k", k, q.dtype)
    U.kv_data_dtype_check("v", v, q.dtype)
    if v.dtype != k.dtype:
        raise TypeError(f"v.dtype = {v.dtype}, expected {k.dtype} (the dtype of k)")
    hkv = int(k.shape[1] if kv_layout == "NHD" else k.shape[0])
    fp8 = U.is_fp8(k.dtype)
    scales = U.kv_scale_kwargs(("k_scale", "v_scale"), k_scale, v_scale, k.dtype if fp8 else None, hkv, q.device)
    U.check_heads(q.shape[0], hkv, q.shape[1])
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected {tuple(k.shape)} (the shape of k)")
    if k.shape[2] != q.shape[1]:
        raise ValueError(f"k has head_dim {k.shape[2]}, expected {q.shape[1]} (the head_dim of q)")
    scale = U.resolve_sm_scale(sm_scale, int(q.shape[1]))
    options.check_tensors(q_rope_offset, k_rope_offset, 1, q.device)
    U.check_cuda("q", q)
    U.check_same_device("k", k, "q", q)
    U.check_same_device("v", v, "q", q)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[0],), dtype=torch.float32, device=q.device) if return_lse else None
    slopes = U.alibi_slopes(int(q.shape[0]), q.device) if options.alibi else None
    U.call(U._C().single_decode, q, q, U.kv_arg(k), U.kv_arg(v), layout, out, lse, scale, U.current_stream(q.device),
           kv_dtype=U.tessera_dtype(k.dtype) if fp8 else None, **scales,
           **options.kwargs(slopes, U.rope_offset_tensor(q_rope_offset, q.device),
                            U.rope_offset_tensor(k_rope_offset, q.device)))
    return (out, lse) if return_lse else out


def batch_decode_with_ragged_kv_cache(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    kv_indptr: "torch.Tensor",
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: bool = False,
    *,
    k_scale: Optional[Any] = None,
    v_scale: Optional[Any] = None,
    low_freq_factor: Optional[float] = None,
    high_freq_factor: Optional[float] = None,
    old_context_len: Optional[float] = None,
    q_rope_offset: Optional["torch.Tensor"] = None,
    k_rope_offset: Optional["torch.Tensor"] = None,
    num_sink_tokens: int = 0,
    use_sigmoid: bool = False,
    sigmoid_bias: Optional[float] = None,
    variant: Optional[VariantSpec] = None,
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """Decode attention of a batch over ragged (packed) KV, one launch (Tessera's; FlashInfer has no
    ragged decode function): request b's single query ``q[b]`` attends to rows
    ``kv_indptr[b]:kv_indptr[b+1]`` of k and v. No plan: the one-shot kernels of
    ``tessera::batch_decode_ragged`` (CUDA cores for GQA groups < 4 and no variant, else tensor
    cores), for batches whose KV is already packed (e.g. after a gather); paged caches use
    :class:`BatchDecodeWithPagedKVCacheWrapper`.

    Args:
        q: ``[batch_size, num_qo_heads, head_dim]`` float16/bfloat16 CUDA tensor.
        k, v: ``[kv_indptr[-1] or more, num_kv_heads, head_dim]`` (NHD), q's dtype or both fp8
            (``k_scale`` / ``v_scale`` as in :func:`single_decode_with_kv_cache`).
        kv_indptr: int32 ``[batch_size + 1]``, ``kv_indptr[0] == 0``, non-decreasing, on the CPU or
            q's device.
        pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
            return_lse: as in :func:`single_decode_with_kv_cache`.
        Keyword-only: k_scale, v_scale, the RoPE / sink / sigmoid / variant options of
            :func:`single_decode_with_kv_cache`; q_rope_offset / k_rope_offset are int32
            ``[batch_size]`` tensors (per request).

    Returns:
        ``out`` ``[batch_size, num_qo_heads, head_dim]``, or ``(out, lse)`` with ``return_lse``
        (base 2, float32 ``[batch_size, num_qo_heads]``). A request without keys gets 0 and -inf.
    """
    torch = U._torch()
    options = U.resolve_variant(pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
                                low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                                old_context_len=old_context_len, num_sink_tokens=num_sink_tokens,
                                use_sigmoid=use_sigmoid, sigmoid_bias=sigmoid_bias, variant=variant)
    options.check_return_lse(return_lse)
    U.check_tensor("q", q, ndim=3, shape_hint="([batch_size, num_qo_heads, head_dim])")
    U.check_attention_dtype(q.dtype, "q.dtype")
    U.check_tensor("k", k, ndim=3, shape_hint="([total_kv, num_kv_heads, head_dim])")
    U.check_tensor("v", v, ndim=3, shape_hint="([total_kv, num_kv_heads, head_dim])")
    U.kv_data_dtype_check("k", k, q.dtype)
    U.kv_data_dtype_check("v", v, q.dtype)
    if v.dtype != k.dtype:
        raise TypeError(f"v.dtype = {v.dtype}, expected {k.dtype} (the dtype of k)")
    batch = int(q.shape[0])
    hkv = int(k.shape[1])
    fp8 = U.is_fp8(k.dtype)
    scales = U.kv_scale_kwargs(("k_scale", "v_scale"), k_scale, v_scale, k.dtype if fp8 else None, hkv, q.device)
    U.check_heads(q.shape[1], hkv, q.shape[2])
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v has shape {tuple(v.shape)}, expected {tuple(k.shape)} (the shape of k)")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k has head_dim {k.shape[2]}, expected {q.shape[2]} (the head_dim of q)")
    host = U.to_host_int32("kv_indptr", kv_indptr, batch + 1)
    U.check_indptr_values("kv_indptr", host)
    if int(host[-1]) > k.shape[0]:
        raise ValueError(f"kv_indptr[-1] = {int(host[-1])} exceeds the {k.shape[0]} rows of k")
    scale = U.resolve_sm_scale(sm_scale, int(q.shape[2]))
    options.check_tensors(q_rope_offset, k_rope_offset, batch, q.device)
    U.check_cuda("q", q)
    U.check_same_device("k", k, "q", q)
    U.check_same_device("v", v, "q", q)
    indptr = kv_indptr if kv_indptr.device == q.device else host.to(q.device, non_blocking=True)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    slopes = U.alibi_slopes(int(q.shape[1]), q.device) if options.alibi else None
    U.call(U._C().batch_decode_ragged, q, q, U.kv_arg(k), U.kv_arg(v), indptr, out, lse, scale,
           U.current_stream(q.device), kv_dtype=U.tessera_dtype(k.dtype) if fp8 else None, **scales,
           **options.kwargs(slopes, U.rope_offset_tensor(q_rope_offset, q.device),
                            U.rope_offset_tensor(k_rope_offset, q.device)))
    return (out, lse) if return_lse else out


def single_decode_with_kv_cache_with_jit_module(
    jit_module: Any,
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    *args: Any,
    kv_layout: str = "NHD",
    window_left: int = -1,
    return_lse: bool = False,
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """FlashInfer's single decode with a customized module (from
    :func:`tessera.jit.attention.gen_customize_single_decode_module`): ``q`` ``[num_qo_heads,
    head_dim]``, ``k`` / ``v`` as :func:`single_decode_with_kv_cache`, ``args`` the module's
    additional tensors then scalars. The variant scales its own logits (no sm_scale);
    ``window_left`` only -1 (NotImplementedError otherwise: a mask belongs in the variant's
    LogitsMask). Returns ``out`` or ``(out, lse)`` (base 2; ValueError for a variant without
    softmax)."""
    name = "single_decode_with_kv_cache_with_jit_module"
    spec = _jit_module_spec(jit_module, "decode", name, q, k, v, args, window_left)
    return single_decode_with_kv_cache(q, k, v, kv_layout=kv_layout, sm_scale=1.0, return_lse=return_lse,
                                       variant=spec)


def _jit_module_spec(jit_module: Any, kind: str, name: str, q: Any, k: Any, v: Any, args: Any,
                     window_left: Any) -> VariantSpec:
    """The VariantSpec of a one-shot call with a customized module (tessera.jit.attention)."""
    from .jit.attention import JitModule

    if not isinstance(jit_module, JitModule) or jit_module.kind != kind:
        raise TypeError(f"{name}: jit_module must come from tessera.jit.attention.gen_customize_single_{kind}_module, "
                        f"got {jit_module!r}")
    if window_left != -1:
        raise U.unsupported(f"{name}: window_left", window_left, "-1 (a customized module masks in its LogitsMask)")
    return jit_module.variant.call_spec(name, q, k, v, args)


class BatchDecodeWithPagedKVCacheWrapper(R._RuntimeWrapper):
    """Batch decode over a paged KV cache (one new token per request), FlashInfer-compatible.

    Per generation step call :meth:`plan` once with the page table, then :meth:`run` once per layer
    with that layer's queries and KV cache. The plan (work split and balance over all SMs) is made
    on the CPU from the indptr / last_page_len arrays and uploaded with one asynchronous copy into
    ``float_workspace_buffer``.

    With ``use_cuda_graph=True`` the wrapper keeps every device pointer fixed: pass the
    preallocated ``paged_kv_indptr_buffer`` ``[max_batch + 1]``, ``paged_kv_indices_buffer``
    ``[max_num_pages]`` and ``paged_kv_last_page_len_buffer`` ``[max_batch]`` (int32, CUDA);
    ``plan()`` copies the page table into them, and a ``run()`` captured in a ``torch.cuda.CUDAGraph``
    stays valid after any later ``plan()`` within those sizes. q / out / lse must then be fixed
    buffers of ``max_batch`` rows.
    """

    _cpp_class = "BatchDecodeWrapper"  # q_len_per_req > 1 plans switch to "BatchPrefillPagedWrapper"

    def __init__(
        self,
        float_workspace_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Optional["torch.Tensor"] = None,
        paged_kv_indices_buffer: Optional["torch.Tensor"] = None,
        paged_kv_last_page_len_buffer: Optional["torch.Tensor"] = None,
        backend: str = "auto",
        jit_args: Optional[Any] = None,
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor (e.g. 128 MiB of uint8), 256-byte
                aligned, kept alive by the wrapper. ``plan()`` raises ValueError naming the
                bytes needed when it is too small.
            kv_layout: ``"NHD"`` or ``"HND"``.
            use_cuda_graph: keep pointers fixed so ``run()`` can be captured (see the class doc).
            use_tensor_cores: accepted for compatibility; Tessera picks CUDA-core or tensor-core
                decode kernels itself.
            paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer:
                preallocated int32 CUDA buffers, required with ``use_cuda_graph``.
            backend: ``"auto"``, ``"fa2"`` or ``"fa3"`` (FlashInfer's names; each runs Tessera's
                kernels for the device; ``"fa3"`` needs an sm_90 GPU).
            jit_args: FlashInfer's customized-module arguments (a 12- or 13-entry tuple: uri,
                dtypes, head dim(s), additional tensor and scalar names and dtypes, variant_name,
                variant_decl): the wrapper runs that variant (FlashInfer's FA2 variant form,
                compiled by Tessera's JIT; docs/api-python.md, "JIT variants from FlashInfer's
                jit_args"), plan() takes no ``variant`` or ``sm_scale`` with it, and ``run(q,
                paged_kv_cache, *args)`` takes its additional tensors, then scalars.
        """
        ws = self._init_runtime(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._fixed_batch_size: Optional[int] = None
        if self._use_cuda_graph:
            for name, buf in (
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            ):
                if buf is None:
                    raise ValueError(f"use_cuda_graph=True needs {name} (a preallocated int32 CUDA tensor)")
                U.check_index_tensor(name, buf)
            assert paged_kv_indptr_buffer is not None and paged_kv_last_page_len_buffer is not None
            self._fixed_batch_size = int(paged_kv_last_page_len_buffer.shape[0])
            if self._fixed_batch_size < 1:
                raise ValueError("paged_kv_last_page_len_buffer is empty, expected [max_batch_size] entries")
            if paged_kv_indptr_buffer.shape[0] != self._fixed_batch_size + 1:
                raise ValueError(
                    f"paged_kv_indptr_buffer has {paged_kv_indptr_buffer.shape[0]} entries, expected "
                    f"{self._fixed_batch_size + 1} (len(paged_kv_last_page_len_buffer) + 1)"
                )
        self._alibi_slopes: Optional["torch.Tensor"] = None
        self._kv_scales = _KVScaleBuffer()
        self._rope_offsets = _RopeOffsets(self._use_cuda_graph, self._fixed_batch_size)
        self._graph_q_len: Optional[int] = None  # use_cuda_graph: q_len_per_req, fixed by the first plan
        self._graph_views = _PrefixViews()  # use_cuda_graph: the buffers' prefixes plan() fills
        # The configuration of the last plan() / fast_decode_plan() and the arguments it came from.
        self._plan_config = R._ArgsMemo()
        self._fast_plan_config = R._ArgsMemo()
        # plan()'s one-call path (_DecodeFastPlan) for the configuration of the last full plan.
        self._one_call_plan: Optional[_DecodeFastPlan] = None
        # torch.compile: the handle of the custom op tessera::decode_run (tessera/_ops.py); the
        # workspace and the preallocated page ids keep their addresses (static for CUDA graphs).
        self._handle = R.enable_compile(self, ws, paged_kv_indices_buffer if self._use_cuda_graph else None)

    @property
    def use_tensor_cores(self) -> bool:
        """The value given at construction (Tessera chooses the kernel family itself)."""
        return self._use_tensor_cores

    def plan(
        self,
        indptr: "torch.Tensor",
        indices: "torch.Tensor",
        last_page_len: "torch.Tensor",
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type: Union[str, "torch.dtype"] = "float16",
        kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
        data_type: Optional[Union[str, "torch.dtype"]] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        non_blocking: bool = True,
        block_tables: Optional["torch.Tensor"] = None,
        seq_lens: Optional["torch.Tensor"] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
        q_len_per_req: int = 1,
        *,
        o_data_type: Optional[Union[str, "torch.dtype"]] = None,
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
        """Plans one generation step; every layer's :meth:`run` of that step reuses the plan.

        Args:
            indptr: int32 ``[batch_size + 1]``, request b owns pages
                ``indices[indptr[b]:indptr[b+1]]`` (copied to the CPU here, as FlashInfer does).
            indices: int32 ``[>= indptr[-1]]`` page ids, on the GPU (used by :meth:`run`).
            last_page_len: int32 ``[batch_size]``, tokens in each request's last page, in
                ``[1, page_size]`` (copied to the CPU).
            num_qo_heads, num_kv_heads, head_dim: head configuration (head_dim one of tessera._C.supported_head_dims()).
            page_size: tokens per page (any value >= 1).
            pos_encoding_mode: ``"NONE"``, ``"ROPE_LLAMA"``, ``"ALIBI"`` or ``"ROPE_LLAMA31"``
                (Tessera's; see the module doc; the ALiBi slopes live on the workspace's GPU, kept
                by the wrapper).
            window_left: sliding window, ``-1`` (off) or ``>= 0``.
            logits_soft_cap: ``None``/``0`` (off) or a cap ``> 0``.
            q_data_type, kv_data_type, data_type, o_data_type: float16 or bfloat16, all equal, except
                ``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` for an fp8 cache
                (head dims 64, 128, 256; its scales go to :meth:`run`).
            sm_scale: default ``1/sqrt(head_dim)``.
            rope_scale, rope_theta: RoPE parameters, as in :func:`single_decode_with_kv_cache`
                (``"ROPE_LLAMA"``: defaults ``1.0`` and ``1e4``; ``"ROPE_LLAMA31"``: the frequency
                factor, defaults ``8.0`` and ``5e5``).
            non_blocking: accepted; the plan upload is always asynchronous.
            block_tables, seq_lens: not supported (must be ``None``).
            fixed_split_size: split long KV ranges at multiples of this many pages (batch-invariant
                results); ``fixed_split_size * page_size`` must be a multiple of 128.
            disable_split_kv: never split (batch-invariant, no merge).
            q_len_per_req: query tokens per request (FlashInfer's; e.g. draft tokens to verify in
                speculative decoding): ``run()`` then takes q ``[batch_size * q_len_per_req,
                num_qo_heads, head_dim]``, request b's tokens in rows ``b * q_len_per_req ...``,
                causal among them (token i of a request with ``kv_len`` keys sits at position
                ``kv_len - q_len_per_req + i``; its keys include the tokens being verified, so
                every ``kv_len >= q_len_per_req``, ValueError otherwise). What runs: 1, the decode
                runtime (C++ ``BatchDecodeWrapper``); > 1, the prefill runtime over the same page
                table (C++ ``BatchPrefillPagedWrapper`` with ``qo_indptr = [0, n, 2n, ...]``,
                causal), the runtime FlashInfer's tensor-core path corresponds to; any
                ``use_tensor_cores``. A wrapper whose plans switch between 1 and > 1 rebuilds its
                runtime at each switch (use one wrapper per value); with ``use_cuda_graph`` the
                first plan fixes it (q / out buffers of ``max_batch * q_len_per_req`` rows).

        Tessera's keyword-only options (see :func:`single_decode_with_kv_cache`):
            low_freq_factor, high_freq_factor, old_context_len: Llama 3.1 scaling with
                ``"ROPE_LLAMA31"``.
            q_rope_offset, k_rope_offset: per-request RoPE position offsets, int32
                ``[batch_size]`` on the CPU or the workspace's GPU (a RoPE mode only): request b's
                queries are rotated at ``p + q_rope_offset[b]``, its key j at ``j +
                k_rope_offset[b]``. The wrapper keeps them (with ``use_cuda_graph`` copied into a
                buffer of its own) for the runs of the plan.
            num_sink_tokens: attention sinks with the sliding window (``window_left >= 0``).
            variant: a :class:`tessera.VariantSpec` (CUDA C++ hooks, or
                :func:`tessera.flex_variant` of a score_mod / mask_mod, whose ``b`` is the request
                and ``q_idx`` the query's position in its sequence); compiled at the first run.
                One that defines ``output_transform`` fails its compile (the runtime merges split
                KV chunks by their log-sum-exp; :func:`single_decode_with_kv_cache` runs it).
            use_sigmoid, sigmoid_bias: sigmoid attention (as :func:`single_decode_with_kv_cache`).
                Without softmax (this, or a variant with ``use_softmax=False``) the plan never
                splits KV, and ``run(return_lse=True)`` is a ValueError.

        The variant options are fixed by the plan: every :meth:`run` of it uses them (with
        ``use_cuda_graph``, the first plan fixes them for the life of the wrapper).
        """
        variant, sm_scale = self._jit_plan_args(variant, sm_scale)
        # Every argument but the page table and the RoPE offsets, checked and resolved once
        # (_DecodePlanConfig) and kept for the next plan() with the same ones (a serving loop's).
        key = (block_tables, seq_lens, pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
               low_freq_factor, high_freq_factor, old_context_len, num_sink_tokens, use_sigmoid, sigmoid_bias,
               variant, q_data_type, kv_data_type, data_type, o_data_type, num_qo_heads, num_kv_heads, head_dim,
               page_size, sm_scale, fixed_split_size, disable_split_kv, q_len_per_req)
        config = self._plan_config.get(key)
        if config is None:
            U.check_none("block_tables", block_tables)
            U.check_none("seq_lens", seq_lens)
            options = U.resolve_variant(pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta,
                                        low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
                                        old_context_len=old_context_len, num_sink_tokens=num_sink_tokens,
                                        use_sigmoid=use_sigmoid, sigmoid_bias=sigmoid_bias, variant=variant)
            dtype = U.resolve_plan_dtypes(q_data_type, kv_data_type, data_type, o_data_type)
            config = _DecodePlanConfig(options, dtype, kv_data_type if kv_data_type is not None else data_type,
                                       num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, fixed_split_size,
                                       disable_split_kv, q_len_per_req)
            if self._jit is not None:
                self._jit.check_plan("BatchDecodeWithPagedKVCacheWrapper", options, dtype, config.kv_dtype,
                                     config.d, config.d)
            self._plan_config.put(key, config)
        one_call = self._one_call_plan
        if (one_call is not None and one_call.config is config and non_blocking and q_rope_offset is None
                and k_rope_offset is None and one_call.cpp is self._holder.cpp):
            try:
                if one_call.plan(self, indptr, indices, last_page_len):
                    return
            except BaseException:
                # It declines (None) before any GPU work, so this is the copies' or the planner's
                # failure: the wrapper is left unplanned, as the full path leaves it then.
                self._planned = None
                raise
        self._plan_step(config, indptr, indices, last_page_len, non_blocking, q_rope_offset, k_rope_offset)
        self._jit_planned()
        self._one_call_plan = _DecodeFastPlan.make(self, config)

    begin_forward = plan

    def _plan_step(
        self, config: "_DecodePlanConfig", indptr: Any, indices: Any, last_page_len: Any, non_blocking: bool,
        q_rope_offset: Any, k_rope_offset: Any, indptr_host: Any = None, last_page_len_host: Any = None,
        fill_graph_page_table: bool = True,
    ) -> None:
        """plan() and fast_decode_plan() after their own checks and their arguments' configuration
        (_DecodePlanConfig): the page table's checks and the plan. indptr_host / last_page_len_host:
        host copies the caller already has (fast_decode_plan), used instead of copying indptr /
        last_page_len; fill_graph_page_table: with use_cuda_graph, also write indptr and
        last_page_len into the preallocated buffers (run() reads neither: the plan keeps its own
        copies in the workspace; fast_decode_plan skips them, as FlashInfer's does)."""
        options, dtype, kv_dtype, q_len = config.options, config.dtype, config.kv_dtype, config.q_len
        hq, hkv, d, page_size, scale = config.hq, config.hkv, config.d, config.page_size, config.scale

        if indptr_host is None:
            indptr_host = U.to_host_int32("indptr", indptr)
        else:
            indptr_host = U.to_host_int32("global_override_indptr_cpu", indptr_host)
        num_pages = U.check_indptr_values("indptr", indptr_host)
        batch = int(indptr_host.shape[0]) - 1
        if last_page_len_host is None:
            last_page_len_host = U.to_host_int32("last_page_len", last_page_len, batch)
        U.check_index_tensor("indices", indices)
        if indices.shape[0] < num_pages:
            raise ValueError(f"indices has {indices.shape[0]} entries, expected >= indptr[-1] = {num_pages}")
        if q_len > 1:
            _check_kv_lens_cover_queries(indptr_host, last_page_len_host, page_size, q_len)
        device = self._float_workspace_buffer.device
        options.check_tensors(q_rope_offset, k_rope_offset, batch, device)
        if self._use_cuda_graph:
            assert self._fixed_batch_size is not None and self._paged_kv_indices_buf is not None
            if batch > self._fixed_batch_size:
                raise ValueError(
                    f"batch_size {batch} exceeds the {self._fixed_batch_size} requests of the preallocated "
                    "paged_kv_last_page_len_buffer (use_cuda_graph)"
                )
            if num_pages > self._paged_kv_indices_buf.shape[0]:
                raise ValueError(
                    f"indptr[-1] = {num_pages} pages exceed the {self._paged_kv_indices_buf.shape[0]} entries of "
                    "paged_kv_indices_buffer (use_cuda_graph)"
                )
            if self._graph_q_len is not None and q_len != self._graph_q_len:
                raise ValueError(
                    f"q_len_per_req = {q_len}, but this use_cuda_graph wrapper was planned with {self._graph_q_len}: "
                    "the first plan fixes it (a captured run() has its query rows baked in); use one wrapper per "
                    "q_len_per_req"
                )

        # GPU work from here on (a failure below leaves the wrapper unplanned).
        self._planned = None
        # q_len_per_req > 1 runs on the prefill runtime. The two runtimes would share the workspace,
        # so the old one is dropped first: its destructor waits for its last run.
        if self._holder.cpp_class_name != config.runtime_class:
            self._holder.cpp = None
            self._holder = _RuntimeHolder(config.runtime_class, self._float_workspace_buffer, self._use_cuda_graph)
        graph_rows = None
        if self._use_cuda_graph:
            assert self._fixed_batch_size is not None
            graph_rows = self._fixed_batch_size * q_len
        cpp = self._holder.ensure(
            config.need(batch),
            dtype,
            config.split,
            config.split_size,
            graph_bounds=(self._fixed_batch_size, graph_rows) if self._use_cuda_graph else None,
            kv_dtype=kv_dtype,
        )
        stream = U.current_stream(device)
        if self._use_cuda_graph:
            assert self._paged_kv_indices_buf is not None
            assert self._paged_kv_indptr_buf is not None and self._paged_kv_last_page_len_buf is not None
            self._graph_q_len = q_len
            # The page ids into their buffer (run() reads it) and, unless fast_decode_plan, indptr and
            # last_page_len into theirs: in one call of the bindings (U.copy_index_arrays) when it can,
            # else with a torch copy each.
            if not (non_blocking and U.copy_index_arrays(
                    stream, device, self._paged_kv_indices_buf, indices, num_pages,
                    *((self._paged_kv_indptr_buf, indptr_host, batch + 1, self._paged_kv_last_page_len_buf,
                       last_page_len_host, batch) if fill_graph_page_table else ()))):
                views = self._graph_views
                if indices.data_ptr() != self._paged_kv_indices_buf.data_ptr():
                    src = indices if indices.shape[0] == num_pages else indices[:num_pages]
                    views.get(self._paged_kv_indices_buf, num_pages).copy_(src, non_blocking=True)
                if fill_graph_page_table:
                    views.get(self._paged_kv_indptr_buf, batch + 1).copy_(indptr_host, non_blocking=non_blocking)
                    views.get(self._paged_kv_last_page_len_buf, batch).copy_(last_page_len_host,
                                                                            non_blocking=non_blocking)
            run_indices = self._paged_kv_indices_buf
        else:
            run_indices = indices if indices.device == device else indices.to(device, non_blocking=True)
        # The plan keeps the device pointers of the slopes and offsets: the wrapper keeps the tensors.
        self._alibi_slopes = U.alibi_slopes(hq, device) if options.alibi else None
        q_offset, k_offset = self._rope_offsets.plan_tensors(
            U.rope_offset_tensor(q_rope_offset, device), U.rope_offset_tensor(k_rope_offset, device), batch, device)
        plan_kwargs = config.plan_kwargs
        if plan_kwargs is None:  # an fp8 cache or a variant: keywords with this plan's tensors
            fp8 = U.is_fp8(kv_dtype)
            plan_kwargs = dict(kv_dtype=U.tessera_dtype(kv_dtype) if fp8 else None,
                               **(self._kv_scales.plan_kwargs(device) if fp8 else {}),
                               **options.kwargs(self._alibi_slopes, q_offset, k_offset))
        device_index = device.index if device.index is not None else U.device_index(self._float_workspace_buffer)
        if q_len == 1:
            cpp.plan(indptr_host, last_page_len_host, page_size, hq, hkv, d, config.dtype_arg, scale, stream,
                     device_index, **plan_kwargs)
        else:
            qo_indptr_host = U._torch().arange(batch + 1, dtype=U._torch().int32) * q_len
            cpp.plan(qo_indptr_host, indptr_host, last_page_len_host, page_size, hq, hkv, d, config.dtype_arg,
                     scale, True, stream, device_index, **plan_kwargs)
        rows = graph_rows if graph_rows is not None else batch * q_len
        self._planned = {
            "batch": batch,
            "rows": rows,
            "indices": run_indices,
            "host_indices": U.HostPageIds("indices", indices, num_pages),
            # The entries that depend on the configuration, the device and the layout alone.
            **config.planned(device, self._kv_layout, rows if q_len > 1 else None),
        }
        self._planned["run_fast"] = _paged_fast_run(self._planned, cpp)

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
        """Runs the planned step for one layer, on PyTorch's current CUDA stream.

        Args:
            q: ``[batch_size, num_qo_heads, head_dim]`` (with ``use_cuda_graph``: ``[max_batch, ...]``);
                with ``q_len_per_req = n > 1`` in the plan ``[batch_size * n, ...]`` (``[max_batch *
                n, ...]``), request b's tokens in rows ``b * n ... b * n + n - 1``.
            paged_kv_cache: ``(k_cache, v_cache)`` each ``[num_pages, page_size, num_kv_heads,
                head_dim]`` (NHD) or ``[num_pages, num_kv_heads, page_size, head_dim]`` (HND), or
                one tensor ``[num_pages, 2, ...]``.
            q_scale: only ``None``/``1.0``.
            k_scale, v_scale: an fp8 cache's dequantization scales (``None`` = 1, a float > 0, or a
                one-element float32 tensor on the cache's device), this call's; with a 16-bit cache
                only ``None``/``1.0``.
            out: optional output, q's shape and dtype (allocated when ``None``).
            lse: optional float32 ``[rows of q, num_qo_heads]`` for the base-2 LSE (used when
                ``return_lse``; allocated when ``None``).
            return_lse: return ``(out, lse)``.
            enable_pdl: accepted and ignored (no programmatic dependent launch yet).
            window_left: ``None`` or the plan's ``window_left`` (the plan fixes the variant;
                another value raises NotImplementedError).

        Returns:
            ``out`` or ``(out, lse)``.
        """
        p = self._planned
        # The common call (q, the cache, perhaps out; nothing else) on a plan with a 16-bit cache: the
        # plan's PagedFastRun (_paged_fast_run), which returns None when anything differs from what
        # the plan expects (the path below then checks and names it).
        if (p is not None and not args and q_scale is None and k_scale is None and v_scale is None and not return_lse
                and window_left is None and (R._OPS is None or not R._IS_COMPILING())):
            fast = p.get("run_fast")
            if fast is not None:
                result = fast(q, paged_kv_cache, out)
                if result is not None:
                    return result
        if args and self._jit is None:
            U.check_no_extra_args(args)
        if q_scale is not None:
            U.check_scale("q_scale", q_scale)
        if p is None:
            raise RuntimeError("run() before plan(): call plan() with this step's page table first")
        if self._jit is not None:
            self._set_jit_args(args)
        if window_left is not None:
            U.check_run_window_left(window_left, p["window_left"])
        if R.compiling():
            return _paged_run_compiled(R._OPS.DECODE_RUN, self, p, q, paged_kv_cache, k_scale, v_scale, out, lse,
                                       return_lse)
        return _paged_run(self, p, q, paged_kv_cache, k_scale, v_scale, out, lse, return_lse)

    forward = run

    def run_return_lse(self, q: "torch.Tensor", paged_kv_cache: PagedKVCache, *args: Any, **kwargs: Any) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """``run(..., return_lse=True)``."""
        kwargs["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kwargs)  # type: ignore[return-value]



class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: BatchDecodeWithPagedKVCacheWrapper with
    ``use_cuda_graph=True`` and the page-table buffers given positionally."""

    def __init__(
        self,
        workspace_buffer: "torch.Tensor",
        indptr_buffer: "torch.Tensor",
        indices_buffer: "torch.Tensor",
        last_page_len_buffer: "torch.Tensor",
        kv_layout: str = "NHD",
        use_tensor_cores: bool = False,
    ) -> None:
        """Args: as BatchDecodeWithPagedKVCacheWrapper's, with ``indptr_buffer`` ``[max_batch + 1]``,
        ``indices_buffer`` ``[max_num_pages]`` and ``last_page_len_buffer`` ``[max_batch]``
        (int32, CUDA) as its ``paged_kv_*_buffer`` arguments."""
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


# The plan keywords of a 16-bit cache and the default variant (never modified: passed as **kwargs).
_DEFAULT_PLAN_KWARGS: Dict[str, Any] = {"kv_dtype": None}


class _DecodeFastPlan:
    """plan()'s common case in one call of the bindings (tessera._C.DecodeFastPlan: the page table's
    checks, the graph-mode buffer copies and the C++ plan), for the configuration of a full plan()
    with one query per request, the default variant and a 16-bit cache, while the wrapper keeps its
    C++ runtime. Anything else (host page ids, GPU indptr, a batch above the runtime's bounds, a
    page table the checks refuse) takes the full path, which names what is wrong. W12: the Python
    around the planner measured 16-23 µs on an H100 host (bench/results/LOG.md, session 40)."""

    __slots__ = ("config", "cpp", "call", "rows", "run_indices", "run_fast")

    def __init__(self, config: "_DecodePlanConfig", cpp: Any, call: Any, rows: Optional[int]) -> None:
        self.config = config
        self.cpp = cpp
        self.call = call
        self.rows = rows  # use_cuda_graph: the plan's fixed query rows; else None (the batch)
        self.run_indices: Any = None  # the page ids of the last plan made here, and its fast run
        self.run_fast: Any = None

    @staticmethod
    def make(w: "BatchDecodeWithPagedKVCacheWrapper", config: "_DecodePlanConfig") -> Optional["_DecodeFastPlan"]:
        """The one-call path of `config` on w's current runtime, or None where it does not apply."""
        cpp = w._holder.cpp
        if (w._jit is not None or config.q_len != 1 or config.plan_kwargs is None or w._planned is None
                or w._planned["host_indices"].ids is not None  # page ids on the host: the full path's
                or cpp is None or not hasattr(cpp, "fast_plan") or w._holder.bounds is None):
            return None
        b = w._holder.bounds
        graph = ((w._paged_kv_indptr_buf, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf)
                 if w._use_cuda_graph else (None, None, None))
        device = w._float_workspace_buffer.device
        call = cpp.fast_plan(device.index if device.index is not None else U.device_index(w._float_workspace_buffer),
                             min(b.max_batch_size, b.max_total_qo_tokens), config.page_size, config.hq, config.hkv,
                             config.d, config.dtype_arg, config.scale, *graph)
        one_call = _DecodeFastPlan(config, cpp, call, w._planned["rows"] if w._use_cuda_graph else None)
        one_call.run_indices, one_call.run_fast = w._planned["indices"], w._planned["run_fast"]
        return one_call

    def plan(self, w: "BatchDecodeWithPagedKVCacheWrapper", indptr: Any, indices: Any, last_page_len: Any) -> bool:
        """Plans w's step in one call; False, with nothing done, for the full path."""
        done = self.call(indptr, indices, last_page_len)
        if done is None:
            return False
        batch, pages = done
        run_indices = w._paged_kv_indices_buf if self.rows is not None else indices
        planned = {
            "batch": batch,
            "rows": self.rows if self.rows is not None else batch,
            "indices": run_indices,
            "host_indices": U.HostPageIds("indices", indices, pages),
            **self.config.planned(w._float_workspace_buffer.device, w._kv_layout, None),
        }
        # The fast run reads its page ids from the plan's tensor: the same tensor, the same run.
        if run_indices is not self.run_indices:
            self.run_indices, self.run_fast = run_indices, _paged_fast_run(planned, self.cpp)
        planned["run_fast"] = self.run_fast
        w._planned = planned
        return True


class _DecodePlanConfig:
    """A decode plan's arguments other than the page table and the RoPE offsets, checked (in the
    order plan() has always checked them: the first failing check raises) and resolved, with what
    the plan derives from them alone. A pure function of those arguments (its fields never change;
    need() and planned() only cache what they derive): plan() and fast_decode_plan() keep the last
    one (R._ArgsMemo) for the next call with the same arguments, whose checks would pass the same
    way."""

    __slots__ = ("options", "dtype", "kv_dtype", "hq", "hkv", "d", "page_size", "scale", "split", "split_size",
                 "q_len", "runtime_class", "dtype_arg", "plan_kwargs", "_needs", "_planned_key", "_planned")

    def __init__(self, options: U.Variant, dtype: "torch.dtype", kv_data_type: Any, num_qo_heads: Any,
                 num_kv_heads: Any, head_dim: Any, page_size: Any, sm_scale: Any, fixed_split_size: Any,
                 disable_split_kv: Any, q_len_per_req: Any) -> None:
        self.options = options
        self.dtype = dtype
        self.kv_dtype = U.resolve_plan_kv_dtype(dtype, kv_data_type)
        self.hq, self.hkv, self.d = U.check_heads(num_qo_heads, num_kv_heads, head_dim)
        self.page_size = U.check_positive_int("page_size", page_size)
        self.scale = U.resolve_sm_scale(sm_scale, self.d)
        self.split, self.split_size = split_options(fixed_split_size, disable_split_kv, self.page_size)
        self.q_len = U.check_positive_int("q_len_per_req", q_len_per_req)
        # q_len_per_req > 1 runs on the prefill runtime.
        self.runtime_class = "BatchDecodeWrapper" if self.q_len == 1 else "BatchPrefillPagedWrapper"
        self.dtype_arg = U.tessera_dtype(dtype)
        # The plan's keywords with a 16-bit cache and the default variant; None when they hold
        # tensors (an fp8 cache's scale buffer, a variant's slopes or offsets): made at each plan.
        self.plan_kwargs = (_DEFAULT_PLAN_KWARGS if not U.is_fp8(self.kv_dtype) and options.is_default()
                            else None)
        self._needs: Dict[int, _Need] = {}
        self._planned_key: Any = None
        self._planned: Any = None

    def need(self, batch: int) -> _Need:
        """What a plan of `batch` requests asks of the runtime's bounds (one _Need per batch size:
        _Need is never modified)."""
        need = self._needs.get(batch)
        if need is None:
            if len(self._needs) >= 256:
                self._needs.clear()
            need = self._needs[batch] = _Need(batch, batch * self.q_len, self.hq, self.hkv, self.d)
        return need

    def planned(self, device: Any, kv_layout: str, q_rows: Optional[int]) -> Dict[str, Any]:
        """The plan dict's entries that depend on this configuration, the workspace's device, the
        layout and the exact query rows (q_len_per_req > 1) alone; kept for the last (device,
        layout, q_rows). The caller copies the entries, never modifies the dict."""
        key = (device, kv_layout, q_rows)
        if key != self._planned_key:
            self._planned = {
                "q_len_per_req": self.q_len,
                "num_qo_heads": self.hq,
                "num_kv_heads": self.hkv,
                "head_dim": self.d,
                "page_size": self.page_size,
                "dtype": self.dtype,
                "kv_dtype": self.kv_dtype,
                "sm_scale": self.scale,
                "window_left": self.options.window_left,
                "no_lse": self.options.no_lse_reason(),
                **_run_fields(device, kv_layout, self.hkv, self.d, self.d, self.page_size, self.kv_dtype, q_rows,
                              self.dtype, self.hq),
            }
            self._planned_key = key
        return self._planned


@functools.lru_cache(maxsize=64)
def _run_fields(device: Any, kv_layout: str, num_kv_heads: int, head_dim: int, head_dim_vo: int,
                page_size: Optional[int], kv_dtype: Any, q_rows: Optional[int] = None, dtype: Any = None,
                num_qo_heads: Optional[int] = None) -> Dict[str, Any]:
    """What run() compares and passes on its fast path, computed once per plan (entries of the
    plan dict): the workspace's device (q, the cache and out must be on it), v's / o's head dim, the
    exact query rows when the plan fixes them (q_len_per_req > 1) or None, a page's K and V shape
    in the layout (paged wrappers), the layout and K/V dtype as the bindings take them; with q's
    dtype and num_qo_heads given, a paged plan's run_static: the arguments of the C++ wrapper's
    fast_run() (_paged_fast_run) that depend on these alone, None for an fp8 cache. Memoised
    (plans repeat their shapes): the caller copies the entries, never modifies the dict."""
    fp8 = U.is_fp8(kv_dtype)
    if page_size is None:
        k_page = v_page = None
    elif kv_layout == "NHD":
        k_page, v_page = (page_size, num_kv_heads, head_dim), (page_size, num_kv_heads, head_dim_vo)
    else:
        k_page, v_page = (num_kv_heads, page_size, head_dim), (num_kv_heads, page_size, head_dim_vo)
    run_static = None
    if k_page is not None and dtype is not None and num_qo_heads is not None and not fp8:
        run_static = (device.index, U.tessera_dtype(dtype), U.tessera_dtype(kv_dtype), num_qo_heads, head_dim,
                      head_dim_vo, -1 if q_rows is None else q_rows, k_page, v_page, U.check_kv_layout(kv_layout))
    return {
        "run_static": run_static,
        "device": device,
        "head_dim_vo": head_dim_vo,
        "q_rows": q_rows,
        "k_page": k_page,
        "v_page": v_page,
        "layout_arg": U.check_kv_layout(kv_layout),
        "fp8": fp8,
        "kv_dtype_arg": U.tessera_dtype(kv_dtype) if fp8 else None,
    }


def _check_kv_lens_cover_queries(indptr_host: "torch.Tensor", last_page_len_host: "torch.Tensor", page_size: int,
                                 q_len: int) -> None:
    """q_len_per_req > 1: every request's KV (pages before the last, plus its last page) holds at
    least its q_len query tokens, which are appended before they are verified (FlashInfer's rule:
    otherwise its first tokens would sit before position 0 and see no key)."""
    pages = indptr_host[1:] - indptr_host[:-1]
    kv_lens = (pages - 1).clamp(min=0) * page_size + last_page_len_host * (pages > 0)
    short = (kv_lens < q_len).nonzero()
    if short.numel() > 0:
        b = int(short[0, 0])
        raise ValueError(
            f"q_len_per_req = {q_len} needs kv_len >= {q_len} for every request (the tokens being verified are "
            f"already in the KV cache), but request {b} has kv_len = {int(kv_lens[b])}"
        )


def fast_decode_plan(
    self: "BatchDecodeWithPagedKVCacheWrapper",
    indptr: "torch.Tensor",
    indices: "torch.Tensor",
    last_page_len: "torch.Tensor",
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    q_data_type: Optional[Union[str, "torch.dtype"]] = None,
    kv_data_type: Optional[Union[str, "torch.dtype"]] = None,
    data_type: Optional[Union[str, "torch.dtype"]] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    non_blocking: bool = True,
    fixed_split_size: Optional[int] = None,
    disable_split_kv: bool = False,
    q_len_per_req: int = 1,
    global_override_indptr_cpu: Optional["torch.Tensor"] = None,
) -> None:
    """FlashInfer's ``flashinfer.decode.fast_decode_plan``: replans a decode wrapper with fewer
    copies, for engines that call it as ``fast_decode_plan(wrapper, ...)`` or bind it as the
    wrapper's plan (``functools.partial(fast_decode_plan, wrapper)``).

    It is :meth:`BatchDecodeWithPagedKVCacheWrapper.plan` (the same checks, the same plan) with
    FlashInfer's shortcuts:

    - ``global_override_indptr_cpu``: int32 ``[batch_size + 1]`` on the CPU, the page ranges,
      used instead of copying ``indptr`` to the host (no device-to-host copy when ``indptr`` lives
      on the GPU);
    - with ``page_size == 1`` ``last_page_len`` is not read (every last page holds 1 token);
    - with ``use_cuda_graph`` ``indptr`` and ``last_page_len`` are not copied into the
      preallocated buffers (the caller keeps them current; Tessera's run() reads neither: the plan
      keeps its own copies in the workspace). ``indices`` is copied into the preallocated page-id
      buffer unless it is that buffer (run() reads the buffer).

    Tessera's plan() has no device-side copies to remove beyond these (it never uploads indptr /
    last_page_len separately), so the saving is the device-to-host copies.

    Args:
        self: a :class:`BatchDecodeWithPagedKVCacheWrapper` (TypeError otherwise).
        q_data_type: ``None`` means ``data_type``, else ``"float16"``, as in FlashInfer.
        The others: as :meth:`BatchDecodeWithPagedKVCacheWrapper.plan`.
    """
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise TypeError(f"fast_decode_plan: self must be a BatchDecodeWithPagedKVCacheWrapper, got {type(self).__name__}")
    if self._jit is not None:
        raise NotImplementedError("fast_decode_plan of a wrapper with jit_args: its variant is planned by "
                                  "BatchDecodeWithPagedKVCacheWrapper.plan (supported: wrappers without jit_args)")
    if q_data_type is None and data_type is None:
        q_data_type = "float16"
    options = U.resolve_variant(pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta)
    batch_hint = None
    if global_override_indptr_cpu is not None:
        U.check_index_tensor("global_override_indptr_cpu", global_override_indptr_cpu)
        if global_override_indptr_cpu.device.type != "cpu":
            raise ValueError(f"global_override_indptr_cpu is on {global_override_indptr_cpu.device}, expected the CPU "
                             "(it replaces the device-to-host copy of indptr)")
        batch_hint = int(global_override_indptr_cpu.shape[0]) - 1
    last_host = None
    if U.check_positive_int("page_size", page_size) == 1:
        torch = U._torch()
        batch = batch_hint if batch_hint is not None else int(U.check_index_tensor("indptr", indptr).shape[0]) - 1
        last_host = torch.ones(max(batch, 0), dtype=torch.int32)
    # The configuration is kept as plan()'s is (the checks above run at every call: they are cheap,
    # and they come first).
    key = (pos_encoding_mode, window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
           data_type, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale, fixed_split_size, disable_split_kv,
           q_len_per_req)
    config = self._fast_plan_config.get(key)
    if config is None:
        config = _DecodePlanConfig(options, U.resolve_plan_dtypes(q_data_type, kv_data_type, data_type),
                                   kv_data_type if kv_data_type is not None else data_type, num_qo_heads,
                                   num_kv_heads, head_dim, page_size, sm_scale, fixed_split_size, disable_split_kv,
                                   q_len_per_req)
        self._fast_plan_config.put(key, config)
    self._plan_step(config, indptr, indices, last_page_len, non_blocking, None, None,
                    indptr_host=global_override_indptr_cpu, last_page_len_host=last_host, fill_graph_page_table=False)


# --- shared run() checks of the paged wrappers ---------------------------------------------------


def _paged_run_compiled(
    op: Any, w: Any, p: Dict[str, Any], q: Any, paged_kv_cache: Any, k_scale: Any, v_scale: Any, out: Any, lse: Any,
    return_lse: bool, extra: Tuple[Any, ...] = (),
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """run() of a paged wrapper while torch.compile traces it: the eager run()'s checks that depend
    only on the plan, shapes and dtypes (Dynamo traces them; a failing one raises at trace time),
    then the custom op `op` (tessera::decode_run, prefill_paged_run or block_sparse_paged_run), which allocates
    out / lse when the caller passed none and does the rest (page ids plan() had on the host
    against this cache, an fp8 cache's scale values, the launch on the current stream). `extra`:
    the op's arguments after the K/V scales (tessera::prefill_paged_run's q scale and output
    dtype, prefill.py's _op_q_args; none for tessera::decode_run)."""
    q, out, lse = _check_run_queries(q, out, lse, return_lse, p, allocate=False)
    k, v, kv = _check_paged_cache(paged_kv_cache, w._kv_layout, q, p, check_page_ids=False)
    scales = _op_kv_scales(p, k_scale, v_scale, w._holder.workspace)
    o, l = op(w._handle, q.detach(), _detached(k), _detached(v), _detached(kv), w._kv_layout, p["indices"],
              w._holder.workspace, out, lse if return_lse else None, return_lse, *scales, *extra)
    return _op_results(o, l, out, lse, return_lse)


def _paged_run(
    w: Any, p: Dict[str, Any], q: Any, paged_kv_cache: Any, k_scale: Any, v_scale: Any, out: Any, lse: Any,
    return_lse: bool, q_scale: Any = None,
) -> Union["torch.Tensor", Tuple["torch.Tensor", "torch.Tensor"]]:
    """run() of a paged wrapper (decode, paged prefill) after its argument checks that need no
    tensor: the checks of q, out, lse and the cache (fast paths for the common case, each falling
    back to the checks that name the argument), an fp8 cache's scales (and q's, q_scale, for an FP8
    attention plan: the caller has refused a q_scale for any other), the launch on the current
    stream. An FP8 attention plan's q goes as bytes with its dtype named (q_dtype), as fp8 K/V do."""
    q, out, lse = _check_run_queries(q, out, lse, return_lse, p)
    k, v, kv = _check_paged_cache(paged_kv_cache, w._kv_layout, q, p)
    if _run_kv_scales(w._kv_scales, p, k_scale, v_scale, w._use_cuda_graph, q_scale):
        k, v, kv, kv_dtype = U.kv_arg(k), U.kv_arg(v), U.kv_arg(kv), p["kv_dtype_arg"]
    else:
        kv_dtype = None
    q_dtype = p.get("q_dtype_arg")
    if q_dtype is None:
        U.launch(w._holder.cpp.run, q, q, k, v, kv, p["layout_arg"], p["indices"], out, lse if return_lse else None,
                 U.current_stream(q.device), kv_dtype=kv_dtype)
    else:
        U.launch(w._holder.cpp.run, q, U.kv_arg(q), k, v, kv, p["layout_arg"], p["indices"], out,
                 lse if return_lse else None, U.current_stream(q.device), kv_dtype=kv_dtype, q_dtype=q_dtype)
    return (out, lse) if return_lse else out


def _paged_fast_run(p: Dict[str, Any], cpp: Any) -> Any:
    """The plan's tessera._C.PagedFastRun (decode or paged prefill): run(q, paged_kv_cache[, out])
    in one call of the bindings for exact torch.Tensors of the plan's dtypes, shapes and device
    (out allocated there when None), returning None with nothing done for anything else (the
    full path then checks and names it). Made from the plan's run_static (_run_fields), its page
    ids and the host page-id check (HostPageIds, passed only for ids given on the host); None when
    the plan has no run_static (an fp8 cache, whose run() fills the scale buffer). It keeps the C++
    runtime alive: a wrapper replaces its runtime only in plan(), which makes a new plan (and
    this) or leaves none."""
    static = p["run_static"]
    if static is None:
        return None
    host_ids = p["host_indices"]
    torch = U._torch()
    return cpp.fast_run(p["indices"], host_ids if host_ids.ids is not None else None, *static, torch.empty_like,
                        torch.contiguous_format)


def _detached(t: Any) -> Any:
    return None if t is None else t.detach()


def _op_results(o: Any, l: Any, out: Any, lse: Any, return_lse: bool) -> Any:
    """run()'s result from an op's (new out, new lse) and the caller's out / lse (see tessera/_ops.py)."""
    result = o if out is None else out
    if not return_lse:
        return result
    return result, (l if lse is None else lse)


def _op_kv_scales(p: Dict[str, Any], k_scale: Any, v_scale: Any, workspace: Any) -> Tuple[Any, Any, float, float]:
    """run()'s k_scale / v_scale as the ops take them (tensor or None, float): with a 16-bit cache
    only None/1.0 (checked here); with an fp8 cache each as _op_scale makes it."""
    if not U.is_fp8(p["kv_dtype"]):
        U.check_scale("k_scale", k_scale)
        U.check_scale("v_scale", v_scale)
        return None, None, 1.0, 1.0
    k_tensor, k_value = _op_scale("k_scale", k_scale, workspace)
    v_tensor, v_value = _op_scale("v_scale", v_scale, workspace)
    return k_tensor, v_tensor, k_value, v_value


def _op_scale(name: str, value: Any, workspace: Any) -> Tuple[Any, float]:
    """One run() scale of an fp8 operand as the ops take it, (tensor or None, float): None (None,
    1.0), a float (None, the float; its value is checked by the op, as _KVScaleBuffer.set does in
    eager mode) or a one-element float32 tensor on the workspace's device (checked here; the
    tensor, 1.0)."""
    torch = U._torch()
    if value is None:
        return None, 1.0
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32 or value.numel() != 1:
            raise ValueError(
                f"{name} = <tensor {tuple(value.shape)} {value.dtype}>, expected a float or a float32 "
                "tensor of one element (per-head scales go to the single-request functions)"
            )
        U.check_same_device(name, value, "float_workspace_buffer", workspace)
        return value.detach(), 1.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None, float(value)
    raise TypeError(f"{name} must be None, a float or a float32 tensor, got {type(value).__name__}")


def _run_kv_scales(buffer: _KVScaleBuffer, p: Dict[str, Any], k_scale: Any, v_scale: Any, graph: bool,
                   q_scale: Any = None) -> bool:
    """run()'s k_scale / v_scale: written into the plan's scale buffer for an fp8 cache (True; with
    use_cuda_graph on every run, so captures hold the fills), else only None/1.0 (False). An FP8
    attention plan (its "o_dtype" entry) takes q_scale too; other plans never read it (their run()
    has refused any value but None / 1.0)."""
    fp8 = p.get("fp8")
    if fp8 is None:
        fp8 = U.is_fp8(p["kv_dtype"])
    if fp8:
        buffer.set(k_scale, v_scale, always=graph, q_scale=q_scale, with_q="o_dtype" in p)
        return True
    if k_scale is not None:
        U.check_scale("k_scale", k_scale)
    if v_scale is not None:
        U.check_scale("v_scale", v_scale)
    return False


def _check_run_queries(
    q: Any, out: Any, lse: Any, return_lse: bool, p: Dict[str, Any], allocate: bool = True
) -> Tuple["torch.Tensor", Optional["torch.Tensor"], Optional["torch.Tensor"]]:
    """run()'s q / out / lse checks; out and lse (with return_lse) are allocated when None unless
    `allocate` is False (under torch.compile the op allocates them)."""
    torch = U._torch()
    if return_lse and p.get("no_lse") is not None:
        raise ValueError(p["no_lse"])
    hq, d, dtype = p["num_qo_heads"], p["head_dim"], p["dtype"]
    # o's dtype: q's, except in an FP8 attention plan (a 16-bit o for an e4m3 q).
    o_dtype = p.get("o_dtype", dtype)
    # The common case in few attribute reads: q of the plan's dtype and heads on the plan's device
    # (the workspace's, a CUDA device), out / lse absent or of the expected shape, dtype and device.
    # Anything else takes the checks below, which name what is wrong.
    device = p.get("device")
    if device is not None and isinstance(q, torch.Tensor):
        s = q.shape
        q_rows = p["q_rows"]
        if (len(s) == 3 and s[1] == hq and s[2] == d and q.dtype == dtype and q.device == device
                and (q_rows is None or s[0] == q_rows)):
            rows = s[0]
            dv = p["head_dim_vo"]
            out_shape = (rows, hq, dv)
            if out is None:
                if allocate:  # q's shape, dtype and device when dv == d: empty_like parses less
                    out = (torch.empty_like(q, memory_format=torch.contiguous_format) if dv == d and o_dtype is dtype
                           else torch.empty(out_shape, dtype=o_dtype, device=device))
            elif not (isinstance(out, torch.Tensor) and out.shape == out_shape and out.dtype == o_dtype
                      and out.device == device):
                out = _check_run_out(q, out, p)
            if return_lse:
                if lse is None:
                    if allocate:
                        lse = torch.empty((rows, hq), dtype=torch.float32, device=device)
                elif not (isinstance(lse, torch.Tensor) and lse.shape == (rows, hq) and lse.dtype == torch.float32
                          and lse.device == device):
                    _check_run_lse(q, lse, p)
            return q, out, lse
    U.check_tensor("q", q, ndim=3, shape_hint="([rows, num_qo_heads, head_dim])")
    if q.dtype != dtype:
        raise TypeError(f"q.dtype = {q.dtype}, but the plan was made for q_data_type = {dtype}")
    if q.shape[1] != hq or q.shape[2] != d:
        raise ValueError(
            f"q has shape {tuple(q.shape)}, expected [rows, {hq}, {d}] (num_qo_heads, head_dim of the plan)"
        )
    if p.get("q_len_per_req", 1) > 1 and q.shape[0] != p["rows"]:
        raise ValueError(
            f"q has {q.shape[0]} rows, expected {p['rows']}: the plan has q_len_per_req = {p['q_len_per_req']} query "
            "tokens per request (batch_size * q_len_per_req rows; with use_cuda_graph max_batch * q_len_per_req)"
        )
    U.check_cuda("q", q)
    dv = p.get("head_dim_vo", d)  # prefill plans with split head dims: o's head dim is v's
    out_shape = (int(q.shape[0]), hq, dv)
    if out is None:
        if allocate:
            out = torch.empty(out_shape, dtype=o_dtype, device=q.device)
    else:
        out = _check_run_out(q, out, p)
    if return_lse:
        if lse is None:
            if allocate:
                lse = torch.empty((q.shape[0], hq), dtype=torch.float32, device=q.device)
        else:
            _check_run_lse(q, lse, p)
    return q, out, lse


def _check_run_out(q: "torch.Tensor", out: Any, p: Dict[str, Any]) -> "torch.Tensor":
    """run()'s out against a checked q: [rows of q, num_qo_heads, head_dim_vo], q's dtype (an FP8
    attention plan: its o_data_type) and device."""
    hq, d = p["num_qo_heads"], p["head_dim"]
    dv = p.get("head_dim_vo", d)
    U.check_tensor("out", out, ndim=3)
    o_dtype = p.get("o_dtype")
    if o_dtype is not None:
        if out.dtype != o_dtype:
            raise TypeError(f"out.dtype = {out.dtype}, expected {o_dtype} (the plan's o_data_type: FP8 attention "
                            f"writes a 16-bit output for q of dtype {q.dtype})")
    elif out.dtype != q.dtype:
        raise TypeError(f"out.dtype = {out.dtype}, expected {q.dtype} (the dtype of q)")
    U.check_shape("out", out, (int(q.shape[0]), hq, dv),
                  "[rows of q, num_qo_heads, head_dim_vo]" if dv != d else "the shape of q")
    U.check_same_device("out", out, "q", q)
    return out


def _check_run_lse(q: "torch.Tensor", lse: Any, p: Dict[str, Any]) -> None:
    """run()'s lse against a checked q: float32 [rows of q, num_qo_heads] on q's device."""
    U.check_tensor("lse", lse, ndim=2, dtypes=(U._torch().float32,))
    U.check_shape("lse", lse, (int(q.shape[0]), p["num_qo_heads"]), "[rows of q, num_qo_heads]")
    U.check_same_device("lse", lse, "q", q)


def _paged_cache_fast(paged_kv_cache: Any, q: "torch.Tensor", p: Dict[str, Any]) -> Optional[Tuple[Any, Any, Any, int]]:
    """_check_paged_cache's common case in few attribute reads: (k, v) or one [num_pages, 2, ...]
    tensor of the plan's kv dtype and page geometry (p["k_page"] / p["v_page"]: a page's shape in
    the layout) on q's device, which is the plan's. (k, v, kv, num_pages), or None when anything
    differs (the full checks then name it)."""
    device = p.get("device")
    if device is None or q.device != device:
        return None
    tensor = U._torch().Tensor
    kv_dtype = p["kv_dtype"]
    k_page, v_page = p["k_page"], p["v_page"]
    if isinstance(paged_kv_cache, tuple) and len(paged_kv_cache) == 2:
        k, v = paged_kv_cache
        if not (isinstance(k, tensor) and isinstance(v, tensor)):
            return None
        ks, vs = k.shape, v.shape
        if (len(ks) == 4 and len(vs) == 4 and ks[1] == k_page[0] and ks[2] == k_page[1] and ks[3] == k_page[2]
                and vs[0] == ks[0] and vs[1] == v_page[0] and vs[2] == v_page[1] and vs[3] == v_page[2]
                and k.dtype == kv_dtype and v.dtype == kv_dtype and k.device == device and v.device == device):
            return k, v, None, ks[0]
        return None
    if isinstance(paged_kv_cache, tensor) and k_page == v_page:
        s = paged_kv_cache.shape
        if (len(s) == 5 and s[1] == 2 and s[2] == k_page[0] and s[3] == k_page[1] and s[4] == k_page[2]
                and paged_kv_cache.dtype == kv_dtype and paged_kv_cache.device == device):
            return None, None, paged_kv_cache, s[0]
    return None


def _check_paged_cache(
    paged_kv_cache: Any, kv_layout: str, q: "torch.Tensor", p: Dict[str, Any], check_page_ids: bool = True
) -> Tuple[Optional["torch.Tensor"], Optional["torch.Tensor"], Optional["torch.Tensor"]]:
    """run()'s paged-cache checks -> (k, v, None) or (None, None, kv). check_page_ids: the page ids
    plan() had on the host against the cache's page count (under torch.compile the op does it)."""
    fast = _paged_cache_fast(paged_kv_cache, q, p)
    if fast is not None:
        k, v, kv, num_pages = fast
        if check_page_ids:
            p["host_indices"].check(num_pages)  # page ids plan() had on the host, against this cache
        return k, v, kv
    k, v, kv = U.unpack_paged_kv_cache(paged_kv_cache)
    if kv is not None:
        if p.get("head_dim_vo", p["head_dim"]) != p["head_dim"]:
            raise ValueError(
                f"paged_kv_cache is one tensor, but the plan has head_dim_vo {p['head_dim_vo']} != head_dim "
                f"{p['head_dim']}: pass (k_cache, v_cache), V pages of the narrower head dim"
            )
        U.kv_data_dtype_check("paged_kv_cache", kv, q.dtype, p["kv_dtype"])
        U.check_same_device("paged_kv_cache", kv, "q", q)
    else:
        assert k is not None and v is not None
        U.kv_data_dtype_check("paged_kv_cache[0]", k, q.dtype, p["kv_dtype"])
        U.kv_data_dtype_check("paged_kv_cache[1]", v, q.dtype, p["kv_dtype"])
        v_shape = tuple(k.shape[:-1]) + (p.get("head_dim_vo", p["head_dim"]),)
        if tuple(v.shape) != v_shape:
            raise ValueError(
                f"paged_kv_cache[1] has shape {tuple(v.shape)}, expected {v_shape} (the shape of paged_kv_cache[0] "
                "with the plan's head_dim_vo)"
            )
        U.check_same_device("paged_kv_cache[0]", k, "q", q)
        U.check_same_device("paged_kv_cache[1]", v, "q", q)
    ref, page_size, hkv, d = U.paged_kv_geometry(k, kv, kv_layout == "NHD")
    layout_shape = "[num_pages, page_size, num_kv_heads, head_dim]" if kv_layout == "NHD" else "[num_pages, num_kv_heads, page_size, head_dim]"
    if page_size != p["page_size"] or hkv != p["num_kv_heads"] or d != p["head_dim"]:
        shape = tuple((kv if kv is not None else k).shape)  # type: ignore[union-attr]
        raise ValueError(
            f"paged_kv_cache has shape {shape}; with kv_layout={kv_layout!r} ({layout_shape}) that is page_size "
            f"{page_size}, num_kv_heads {hkv}, head_dim {d}, but the plan was made for page_size {p['page_size']}, "
            f"num_kv_heads {p['num_kv_heads']}, head_dim {p['head_dim']}"
        )
    if check_page_ids:
        p["host_indices"].check(int(ref.shape[0]))  # page ids plan() had on the host, against this cache
    return k, v, kv
