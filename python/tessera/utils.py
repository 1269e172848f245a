"""FlashInfer's ``flashinfer.utils`` enums that code calling its JIT helpers passes as values:
``MaskMode`` (``mask_mode`` of :func:`tessera.prefill.single_prefill_with_kv_cache_with_jit_module`),
``PosEncodingMode`` and ``TensorLayout``, with FlashInfer's values."""

import enum

__all__ = ["MaskMode", "PosEncodingMode", "TensorLayout"]


class MaskMode(enum.IntEnum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class PosEncodingMode(enum.IntEnum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class TensorLayout(enum.IntEnum):
    NHD = 0
    HND = 1
