"""Prefill and decode in one launch (POD attention) over a paged KV cache, FlashInfer-compatible.

- :class:`PODWithPagedKVCacheWrapper`: a batch that mixes prefill chunks and decode requests, as
  chunked-prefill schedulers build it, planned and run as one batch by the C++ runtime
  ``tessera::BatchPODPagedWrapper`` (include/tessera/runtime.h).

Plans and runs take :class:`tessera.BatchPrefillWithPagedKVCacheWrapper`'s arguments and
semantics. The plan classifies each request by its packed rows ``qo_len * num_qo_heads /
num_kv_heads``: 1 to 16 rows run on the decode side (a 16-row query tile), more on the prefill side
(the 128-row tile); one persistent launch divides its CTAs between the two, so the decode requests'
memory-bound K/V streaming runs on some SMs while the prefill's compute-bound tiles run on the
others. Log-sum-exp values are base 2.

Supported: float16 / bfloat16 q, K/V of q's dtype, equal head dims, NHD / HND, any page size,
``causal`` and ``sm_scale``. Anything else (custom masks, RoPE / ALiBi, sliding windows, soft-caps,
fp8 K/V, ``head_dim_vo != head_dim_qk``) raises NotImplementedError naming the argument, before any
GPU work: :class:`tessera.BatchPrefillWithPagedKVCacheWrapper` runs them. ``jit_args`` is refused as
by the other wrappers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from . import _runtime as R
from . import _utils as U
from .prefill import BatchPrefillWithPagedKVCacheWrapper

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["PODWithPagedKVCacheWrapper"]

# Where the NotImplementedErrors of the options POD does not run send them.
_OTHERS = ("PODWithPagedKVCacheWrapper runs the default variant with K/V of q's dtype; "
           "BatchPrefillWithPagedKVCacheWrapper runs the others")


def _check_pod_variant(custom_mask: Any, packed_custom_mask: Any, pos_encoding_mode: Any, use_fp16_qk_reduction: Any,
                       window_left: Any, logits_soft_cap: Any) -> None:
    """FlashInfer's variant options of plan(): only their defaults (the C++ runtime runs the default
    variant: kUnsupported otherwise). Values of the wrong type or range raise what the other
    wrappers raise for them (TypeError / ValueError)."""
    U.check_none("custom_mask", custom_mask, f"None; {_OTHERS}")
    U.check_none("packed_custom_mask", packed_custom_mask, f"None; {_OTHERS}")
    mode = U.check_pos_encoding_mode(pos_encoding_mode)
    if mode != "NONE":
        raise U.unsupported("pos_encoding_mode", mode, f"'NONE'; {_OTHERS}")
    U.check_false("use_fp16_qk_reduction", use_fp16_qk_reduction)
    if U.check_window_left(window_left) != -1:
        raise U.unsupported("window_left", window_left, f"-1; {_OTHERS}")
    if U.check_logits_soft_cap(logits_soft_cap) != 0.0:
        raise U.unsupported("logits_soft_cap", logits_soft_cap, f"None or 0; {_OTHERS}")


def _check_decode_sms(decode_sms: Any) -> int:
    """Tessera's decode_sms: None or 0 (chosen per plan), or the SMs of the decode side (>= 1)."""
    if decode_sms is None or (type(decode_sms) is int and decode_sms == 0):
        return 0
    return U.check_positive_int("decode_sms", decode_sms)


class _PodHolder(R._RuntimeHolder):
    """The C++ runtime of a POD wrapper (tessera._C.BatchPODPagedWrapper), built, grown and kept by
    _RuntimeHolder's rules with a tessera._C.PodOptions (whose decode_sms is part of what the
    runtime is kept for); plan_info() gives the C++ PodPlanInfo as a dict."""

    def __init__(self, workspace: Any, use_cuda_graph: bool) -> None:
        super().__init__(PODWithPagedKVCacheWrapper._cpp_class, workspace, use_cuda_graph)
        self.decode_sms = 0  # PodOptions.decode_sms of the next ensure()

    def _options(self, C: Any, dtype: Any, kv_dtype: Any, split_kv: str, fixed_split_size: int) -> Any:
        options = C.PodOptions()
        options.cuda_graph = self.use_cuda_graph
        options.dtype = U.tessera_dtype(dtype)
        options.decode_sms = int(self.decode_sms)
        options.split_kv = {"auto": C.SplitKV.auto, "fixed": C.SplitKV.fixed, "none": C.SplitKV.none}[split_kv]
        options.fixed_split_size = int(fixed_split_size)
        return options

    def _extra_key(self) -> Tuple[Any, ...]:
        return (int(self.decode_sms),)

    def plan_info(self) -> Dict[str, Any]:
        if self.cpp is None:
            raise RuntimeError("plan() has not been called yet")
        info = self.cpp.plan_info()
        return {
            "num_prefill_requests": int(info.num_prefill_requests),
            "num_decode_requests": int(info.num_decode_requests),
            "prefill_ctas": int(info.prefill_ctas),
            "decode_ctas": int(info.decode_ctas),
            "decode_copies": int(info.decode_copies),
            "prefill": dict(info.prefill),
            "decode": dict(info.decode),
        }


class PODWithPagedKVCacheWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """Prefill chunks and decode requests of one batch in one launch (POD attention) over a paged KV
    cache, FlashInfer-compatible (``flashinfer.PODWithPagedKVCacheWrapper``, whose plan() and run()
    take :class:`BatchPrefillWithPagedKVCacheWrapper`'s arguments).

    Queries are ragged (``qo_indptr``); each request attends to its pages of the cache. Call
    :meth:`plan` once per batch and :meth:`run` once per layer. Requests of 1 to 16 packed rows
    (``qo_len * num_qo_heads / num_kv_heads``) run on the decode side, the others on the prefill
    side, both in one persistent launch whose CTAs are divided between them (``plan_info()`` says
    how). The C++ runtime is ``tessera::BatchPODPagedWrapper``, over the caller's
    ``float_workspace_buffer`` alone.

    With ``use_cuda_graph=True`` pass ``qo_indptr_buf`` ``[max_batch + 1]``,
    ``paged_kv_indptr_buf`` ``[max_batch + 1]``, ``paged_kv_indices_buf`` ``[max_num_pages]`` and
    ``paged_kv_last_page_len_buf`` ``[max_batch]``; plan() copies the page table into them and a
    captured :meth:`run` stays valid after any later plan within them. The first plan fixes the
    number of query rows (q / out buffers of that many rows), the heads, head dim, dtype, page size,
    ``causal`` and ``sm_scale``, and the division of the SMs is fixed at the first plan.

    Supported: the default variant (``causal``, ``sm_scale``), K/V of q's dtype (float16 or
    bfloat16), equal head dims. Custom masks, ``pos_encoding_mode`` other than ``"NONE"``,
    ``window_left >= 0``, ``logits_soft_cap > 0``, an fp8 ``kv_data_type``, ``head_dim_vo !=
    head_dim_qk``, ``jit_args`` and custom-mask buffers raise NotImplementedError naming the
    argument (:class:`BatchPrefillWithPagedKVCacheWrapper` runs them).
    """

    _cpp_class = "BatchPODPagedWrapper"

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
    ) -> None:
        """Creates the wrapper; the C++ runtime is built by the first :meth:`plan`.

        Args:
            float_workspace_buffer: 1-D contiguous CUDA tensor (e.g. 128 MiB of uint8), the only
                workspace: it holds both sides' plans and split states. plan() raises ValueError
                with the bytes it needs when it is too small.
            kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf,
                paged_kv_last_page_len_buf, backend: as for
                :class:`BatchPrefillWithPagedKVCacheWrapper`.
            jit_args: only ``None`` (POD runs the default variant).
            custom_mask_buf, mask_indptr_buf: only ``None`` (POD runs no custom masks).
        """
        U.check_none("jit_args", jit_args, f"None (POD runs the default variant); {_OTHERS}")
        U.check_none("custom_mask_buf", custom_mask_buf, f"None (no custom masks); {_OTHERS}")
        U.check_none("mask_indptr_buf", mask_indptr_buf, f"None (no custom masks); {_OTHERS}")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
                         paged_kv_indices_buf, paged_kv_last_page_len_buf, None, None, backend, None)
        self._holder = _PodHolder(self._float_workspace_buffer, self._use_cuda_graph)

    def plan(  # type: ignore[override]
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
        non_blocking: bool = False,
        *,
        o_data_type: Optional[Union[str, "torch.dtype"]] = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
        decode_sms: Optional[int] = None,
    ) -> None:
        """Plans one batch; every layer's :meth:`run` reuses it. The arguments are
        :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`'s (FlashInfer's POD plan() takes the same).

        A request with ``qo_len * num_qo_heads / num_kv_heads <= 16`` runs on the decode side, the
        others on the prefill side. custom_mask, packed_custom_mask, pos_encoding_mode,
        use_fp16_qk_reduction, window_left, logits_soft_cap: only their defaults; an fp8
        ``kv_data_type`` and ``head_dim_vo != head_dim_qk`` likewise (NotImplementedError naming
        the argument: :class:`BatchPrefillWithPagedKVCacheWrapper` runs them). rope_scale,
        rope_theta: accepted and ignored (no RoPE, as FlashInfer ignores them with
        ``pos_encoding_mode="NONE"``).

        Tessera's keyword-only options: o_data_type, fixed_split_size, disable_split_kv as for
        :meth:`BatchPrefillWithPagedKVCacheWrapper.plan`; decode_sms: SMs whose CTAs run the
        decode side (kept below the device's SM count; each runs ``plan_info()["decode_copies"]``
        16-row tiles of one KV head each, whole columns of KV heads used);
        ``None`` or 0: chosen per plan from the two sides' estimated times (with
        ``use_cuda_graph``: a third of the SMs). These options are the runtime's: a plan that
        changes them rebuilds it (with ``use_cuda_graph``, a ValueError: the first plan fixes them).
        """
        if head_dim_vo is not None and (isinstance(head_dim_vo, bool) or head_dim_vo != head_dim_qk):
            raise U.unsupported("head_dim_vo", head_dim_vo,
                                f"None or head_dim_qk ({head_dim_qk}); BatchPrefillWithPagedKVCacheWrapper runs "
                                "split head dims")
        _check_pod_variant(custom_mask, packed_custom_mask, pos_encoding_mode, use_fp16_qk_reduction, window_left,
                           logits_soft_cap)
        dtype = U.resolve_plan_dtypes(q_data_type, kv_data_type, None, o_data_type)
        kv_dtype = U.resolve_plan_kv_dtype(dtype, kv_data_type)
        if U.is_fp8(kv_dtype):
            raise U.unsupported("kv_data_type", kv_dtype,
                                f"None or q_data_type ({dtype}); {_OTHERS}, fp8 caches included")
        self._holder.decode_sms = _check_decode_sms(decode_sms)
        super().plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
                     head_dim_qk, page_size, causal=causal, sm_scale=sm_scale, q_data_type=q_data_type,
                     kv_data_type=kv_data_type, non_blocking=non_blocking, o_data_type=o_data_type,
                     fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)

    begin_forward = plan
    forward_return_lse = BatchPrefillWithPagedKVCacheWrapper.run_return_lse

    def reset_workspace_buffer(self, float_workspace_buffer: "torch.Tensor",
                               int_workspace_buffer: Optional["torch.Tensor"] = None) -> None:
        """As :meth:`BatchPrefillWithPagedKVCacheWrapper.reset_workspace_buffer`."""
        super().reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)
        self._holder = _PodHolder(self._float_workspace_buffer, False)

    def plan_info(self) -> Dict[str, Any]:
        """What the last plan decided: ``num_prefill_requests``, ``num_decode_requests``,
        ``prefill_ctas``, ``decode_ctas`` (the launch's CTAs of each side), ``decode_copies`` (the
        16-row tiles each decode CTA runs side by side, one KV head each) and ``prefill`` /
        ``decode``, each side's plan as the dict
        :meth:`BatchPrefillWithPagedKVCacheWrapper.plan_info` returns (``grid_cols`` 0: no CTAs on
        that side)."""
        return self._holder.plan_info()
