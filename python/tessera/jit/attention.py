"""FlashInfer's customized single-request attention modules (``flashinfer.jit.attention``).

``gen_customize_single_decode_module`` and ``gen_customize_single_prefill_module`` take FlashInfer's
arguments (the uri, dtypes, head dim(s), additional tensor and scalar names and dtypes, the variant's
name and its FA2-form declaration) and return a module for
:func:`tessera.decode.single_decode_with_kv_cache_with_jit_module` /
:func:`tessera.prefill.single_prefill_with_kv_cache_with_jit_module`. Nothing is compiled here:
Tessera compiles the variant (into its hooks, tessera._jit_args) at the first call that uses it,
through its JIT cache. ``build_and_load()`` returns the module itself (FlashInfer's newer API
returns a JIT spec to build).
"""

from typing import Any, List

from .. import _utils as U
from .._jit_args import JitVariant, check_jit_kwargs

__all__ = ["gen_customize_single_decode_module", "gen_customize_single_prefill_module", "JitModule"]


class JitModule:
    """A customized module: its checked variant (``variant``, a tessera._jit_args.JitVariant) and
    the kind of call it is for (``"decode"`` or ``"prefill"``)."""

    def __init__(self, kind: str, variant: JitVariant) -> None:
        self.kind = kind
        self.variant = variant

    def build_and_load(self) -> "JitModule":
        """FlashInfer's JIT spec API: the module itself (Tessera compiles at the first call)."""
        return self

    def __repr__(self) -> str:
        return f"JitModule({self.kind!r}, variant={self.variant.name!r}, uri={self.variant.uri!r})"


def _head_dims(args: List[Any], first: int) -> List[Any]:
    """FlashInfer's argument list with one head dim, or with head_dim_qk and head_dim_vo (the
    entry after the first head dim is an int then, a list of names otherwise)."""
    if len(args) > first + 1 and isinstance(args[first + 1], int) and not isinstance(args[first + 1], bool):
        return args
    return args[:first + 1] + [args[first]] + args[first + 1:]


def gen_customize_single_decode_module(uri: str, dtype_q: Any, dtype_kv: Any, dtype_o: Any, *args: Any,
                                       pos_encoding_mode: int = 0, use_sliding_window: bool = False,
                                       use_logits_soft_cap: bool = False) -> JitModule:
    """FlashInfer's ``gen_customize_single_decode_module(uri, dtype_q, dtype_kv, dtype_o, head_dim
    (or head_dim_qk, head_dim_vo), additional_tensor_names, additional_tensor_dtypes,
    additional_scalar_names, additional_scalar_dtypes, variant_name, variant_decl)``; the keyword
    options only at their defaults (NotImplementedError otherwise)."""
    check_jit_kwargs("gen_customize_single_decode_module", dict(
        pos_encoding_mode=pos_encoding_mode, use_sliding_window=use_sliding_window,
        use_logits_soft_cap=use_logits_soft_cap))
    rest = _head_dims(list(args), 0)
    jit_args = [uri, dtype_q, dtype_kv, dtype_o, U._torch().int32, *rest]
    return JitModule("decode", JitVariant(jit_args, "gen_customize_single_decode_module"))


def gen_customize_single_prefill_module(backend: str, uri: str, dtype_q: Any, dtype_kv: Any, dtype_o: Any,
                                        *args: Any, pos_encoding_mode: int = 0, use_sliding_window: bool = False,
                                        use_logits_soft_cap: bool = False,
                                        use_fp16_qk_reduction: bool = False) -> JitModule:
    """FlashInfer's ``gen_customize_single_prefill_module(backend, uri, dtype_q, dtype_kv, dtype_o,
    head_dim (or head_dim_qk, head_dim_vo), additional_tensor_names, additional_tensor_dtypes,
    additional_scalar_names, additional_scalar_dtypes, variant_name, variant_decl)``: ``backend``
    ``"fa2"``, ``"fa3"`` or ``"auto"`` (each runs Tessera's kernels; the declaration must be
    FlashInfer's FA2 form); the keyword options only at their defaults."""
    if backend not in ("auto", "fa2", "fa3"):
        raise U.unsupported("gen_customize_single_prefill_module: backend", backend, "'auto', 'fa2' or 'fa3'")
    check_jit_kwargs("gen_customize_single_prefill_module", dict(
        pos_encoding_mode=pos_encoding_mode, use_sliding_window=use_sliding_window,
        use_logits_soft_cap=use_logits_soft_cap, use_fp16_qk_reduction=use_fp16_qk_reduction))
    rest = _head_dims(list(args), 0)
    jit_args = [uri, dtype_q, dtype_kv, dtype_o, U._torch().int32, *rest]
    return JitModule("prefill", JitVariant(jit_args, "gen_customize_single_prefill_module"))
