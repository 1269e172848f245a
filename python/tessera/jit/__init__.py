"""FlashInfer's ``flashinfer.jit`` path, for code that builds customized attention modules:
:mod:`tessera.jit.attention` has its ``gen_customize_single_decode_module`` and
``gen_customize_single_prefill_module`` (the batch wrappers take ``jit_args`` directly)."""

from . import attention  # noqa: F401

__all__ = ["attention"]
