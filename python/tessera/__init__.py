"""Tessera: an attention engine for LLM serving, with FlashInfer-compatible Python wrappers.

The functions and wrapper classes take PyTorch tensors (passed to the C++ library through
DLPack, without copies) and queue their work on PyTorch's current CUDA stream. Their names,
arguments and conventions follow FlashInfer's Python API (0.3): ``kv_layout`` "NHD"/"HND",
``last_page_len`` page tables, ``sm_scale`` defaulting to ``1/sqrt(head_dim)``, causal masking
aligned to the last key, and BASE-2 log-sum-exp values. Options Tessera does not implement yet
raise ``NotImplementedError`` naming the option.

Errors of the C++ library map to Python exceptions by their ``tessera::StatusCode`` alone, which
the exception carries as ``status_code`` (a ``tessera._C.StatusCode``); the message is the
library's:

=====================  =======================
``invalid_argument``   ``ValueError``
``unsupported``        ``NotImplementedError``
``cuda_error``         ``RuntimeError``
``internal``           ``RuntimeError``
=====================  =======================

The library has no code of its own for a wrong dtype, so a dtype the C++ layer rejects is a
``ValueError``; the Python functions check torch dtypes before calling it and raise ``TypeError``.
On a machine without a usable GPU, ``tessera._C.cuda_unavailable_reason()`` says why ("no CUDA
driver: ..." or "no CUDA device: ..."), and every GPU entry point's error carries that text.

The package imports without a GPU and without torch; ``python -m tessera`` reports the build.
"""

from __future__ import annotations

from typing import Any, Dict, List

from . import _C
from .cascade import (
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
    merge_states_ragged,
)
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    batch_decode_with_ragged_kv_cache,
    fast_decode_plan,
    single_decode_with_kv_cache,
)
from .flex import (BlockMask, ModTraceError, and_masks, create_block_mask, create_mask, flex_attention, flex_variant,
                   noop_mask, or_masks)
from .mla import BatchMLAPagedAttentionWrapper
from .page import append_paged_kv_cache, append_paged_mla_kv_cache, get_batch_indices_positions, get_seq_lens
from .pod import PODWithPagedKVCacheWrapper
from .quantization import packbits, segment_packbits
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from .sparse import BlockSparseAttentionWrapper, BlockSparsePagedAttentionWrapper, paged_block_mask
from .variant import VariantSpec
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)

__version__: str = _C.version()

__all__ = [
    "__version__",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BlockSparseAttentionWrapper",
    "BlockSparsePagedAttentionWrapper",
    "paged_block_mask",
    "BatchMLAPagedAttentionWrapper",
    "single_decode_with_kv_cache",
    "batch_decode_with_ragged_kv_cache",
    "fast_decode_plan",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "merge_states_ragged",
    "MultiLevelCascadeAttentionWrapper",
    "PODWithPagedKVCacheWrapper",
    "append_paged_kv_cache",
    "append_paged_mla_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "packbits",
    "segment_packbits",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "flex_attention",
    "flex_variant",
    "create_block_mask",
    "create_mask",
    "and_masks",
    "or_masks",
    "noop_mask",
    "BlockMask",
    "ModTraceError",
    "VariantSpec",
    "build_info",
]

# The kernel families compiled into libtessera (src/*.cu). Head dims come from the library.
_KERNEL_FAMILIES = (
    ("decode", "attention", "CUDA-core decode; tensor-core decode for GQA group >= 4 (paged, ragged, single)"),
    ("prefill (FA2-class)", "attention", "mma.sync prefill/append over dense, ragged, paged and block-sparse KV"),
    ("runtime", "attention", "plan/run persistent kernels + split-KV contraction (the Batch*Wrapper classes)"),
    ("mla", "latent", "multi-head latent attention (DeepSeek MLA, absorbed) over a paged latent cache; "
     "sm_90 (wgmma) only"),
    ("merge", "state", "attention-state merge: merge_state, merge_states, merge_states_ragged"),
    ("append", "cache", "append_paged_kv_cache into NHD/HND pages, append_paged_mla_kv_cache into MLA latent "
     "pages; any page size"),
    ("rope", "rotary", "standalone RoPE: apply_rope, apply_llama31_rope (indptr/offsets or pos_ids), "
     "apply_rope_with_cos_sin_cache; in place or out of place"),
)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else "none"


def _kernels_run_on(major: int, minor: int, archs: List[str]) -> bool:
    """Whether code compiled for `archs` (TESSERA_CUDA_ARCHS) runs on compute capability major.minor.

    SASS for sm_XY runs on sm_XZ with Z >= Y; arch-specific targets (sm_90a) only on their exact
    architecture; the PTX embedded for the last entry (when it is not an "a" target, see
    cmake/TesseraCuda.cmake) is compiled by the driver for any newer GPU.
    """
    cc = 10 * major + minor
    for a in archs:
        if a.endswith("a"):
            if int(a[:-1]) == cc:
                return True
        elif int(a) // 10 == major and int(a) % 10 <= minor:
            return True
    return bool(archs) and not archs[-1].endswith("a") and int(archs[-1]) <= cc


def build_info() -> Dict[str, Any]:
    """What this build of Tessera contains and which GPUs it sees.

    Returns:
        A dict with ``version``, ``cuda_archs`` (architectures the kernels were compiled for),
        ``cuda_runtime`` / ``cuda_driver`` versions (``"none"`` without a driver), ``gpus`` (a list
        of dicts: index, name, compute capability, SMs, memory, whether compiled kernels run on it)
        and ``kernels`` (the prebuilt families with their head dims and dtypes).
    """
    archs = [a for a in _C.cuda_archs().split(",") if a]
    head_dims = list(_C.supported_head_dims())
    gpus: List[Dict[str, Any]] = []
    for i in range(_C.cuda_device_count()):
        try:
            p = _C.cuda_device_properties(i)
        except RuntimeError:
            continue
        runs = _kernels_run_on(p["major"], p["minor"], archs)
        gpus.append({
            "index": i,
            "name": p["name"],
            "compute_capability": (p["major"], p["minor"]),
            "sm_count": p["multi_processor_count"],
            "memory_bytes": p["total_memory"],
            "kernels_compiled_for_it": runs,
        })
    kernels = []
    for name, kind, what in _KERNEL_FAMILIES:
        if kind == "attention":
            dims, dtypes = head_dims, ["float16", "bfloat16"]
        elif kind == "latent":
            dims, dtypes = "latent 512 + rotary 64 (output 512)", ["float16", "bfloat16"]
        elif kind == "rotary":
            dims, dtypes = "any head_dim >= 2, any even rotary_dim <= head_dim", ["float16", "bfloat16"]
        elif kind == "state":
            dims, dtypes = "any with head_dim * element size a multiple of 16 bytes", ["float16", "bfloat16", "float32"]
        else:
            dims, dtypes = "any with head_dim * element size a multiple of 16 bytes", ["float16", "bfloat16", "float32"]
        kernels.append({"family": name, "head_dims": dims, "dtypes": dtypes, "description": what})
    return {
        "version": __version__,
        "cuda_archs": archs,
        "cuda_runtime": _cuda_version(_C.cuda_runtime_version()),
        "cuda_driver": _cuda_version(_C.cuda_driver_version()),
        "gpus": gpus,
        "kernels": kernels,
    }


from . import cascade, decode, jit, page, pod, prefill, quantization, rope, utils  # noqa: E402,F401  (FlashInfer-style submodules)
