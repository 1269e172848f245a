"""FlashInfer's ``jit_args`` (the arguments of a customized attention module) as a Tessera user
variant, for the plan/run wrappers (decode, paged and ragged prefill).

FlashInfer describes a custom variant as a C++ struct (``variant_decl``) with a constructor
``(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr)`` and any of the member templates
``QueryTransform(params, q)`` (per element), ``LogitsTransform(params, logits, batch_idx, qo_idx,
kv_idx, qo_head_idx, kv_head_idx)`` and ``LogitsMask(params, batch_idx, qo_idx, kv_idx,
qo_head_idx, kv_head_idx)``, written directly or with the ``REGISTER_LOGITS_TRANSFORM`` /
``REGISTER_LOGITS_MASK`` macros and ``AttentionVariantBase``; ``params`` carries the additional
tensors and scalars the module declares (passed to ``run()`` after the cache, tensors first) and
``get_qo_len(b)`` / ``get_kv_len(b)``. Tessera compiles the struct unchanged inside generated hooks
(its VariantSpec mechanism: NVRTC, the disk cache) that follow FlashInfer's FA2 semantics:

- the logits a variant sees are ``QueryTransform(q) . k``, without any scale of Tessera's (the
  wrapper plans with ``sm_scale = 1``);
- with ``use_softmax`` (the default) the softmax weights are ``2^(LogitsTransform(s) *
  sm_scale_log2)`` (``sm_scale_log2`` when the struct has that member, else 1: the older form whose
  QueryTransform folds the scale into q), so the LSE is the base-2 one FlashInfer returns; without
  it the transformed logits are the weights;
- ``qo_idx`` is the query's index among its request's new tokens (0 for decode), ``kv_idx`` the
  key's position, ``batch_idx`` the request.

Not supported (each a NotImplementedError naming it): FlashInfer's FA3 (sm90) variant form (a
constructor over ``MainloopParams``, ``params.additional_params``, an ``Updater``), output
transforms and ``update_m_d`` hooks, the shared-memory ``REGISTER_QUERY_TRANSFORM`` /
``REGISTER_KEY_TRANSFORM`` forms and ``KeyTransform``; output dtypes other than the query's;
additional tensor or scalar dtypes outside the tables below.
"""

import keyword
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _utils as U
from .variant import VariantSpec

__all__ = ["JitVariant"]

# FlashInfer's additional tensor dtypes -> (torch dtype name, C element type of Tessera's Params).
_TENSOR_TYPES = {
    "uint8_t": ("uint8", "uint8_t"),
    "int32_t": ("int32", "int32_t"),
    "int": ("int32", "int32_t"),
    "float": ("float32", "float"),
    "half": ("float16", "__half"),
    "__half": ("float16", "__half"),
    "nv_bfloat16": ("bfloat16", "__nv_bfloat16"),
    "__nv_bfloat16": ("bfloat16", "__nv_bfloat16"),
}
# FlashInfer's additional scalar dtypes -> (Python type run() converts to, Tessera's kind). Tessera's
# scalar parameters are 32-bit: a double is passed as a float (the hooks compute in float anyway).
_SCALAR_TYPES = {"float": float, "double": float, "int": int, "int32_t": int, "uint32_t": int}

# Constructs of FlashInfer variants Tessera does not run, with what to say about each.
_UNSUPPORTED = (
    (r"\bMainloopParams\b|\badditional_params\b|\bUpdater\b",
     "FlashInfer's FA3 (sm90) variant form (a constructor over MainloopParams, params.additional_params, an "
     "Updater); write the FA2 form (constructor (const Params& params, uint32_t batch_idx, uint8_t* smem_ptr), "
     "LogitsTransform / LogitsMask members), which Tessera runs on every GPU"),
    (r"\bREGISTER_OUTPUT_TRANSFORM\b|\bOutputTransform\b", "an output transform (OutputTransform)"),
    (r"\bREGISTER_M_D_UPDATE\b|\bupdate_m_d\b", "an update_m_d hook"),
    (r"\bREGISTER_QUERY_TRANSFORM\b", "REGISTER_QUERY_TRANSFORM (its shared-memory form; a member template "
                                      "QueryTransform(params, q) per element is supported)"),
    (r"\bREGISTER_KEY_TRANSFORM\b|\bKeyTransform\b", "a key transform (KeyTransform)"),
)

# What the generated source defines before the variant's struct: the parts of FlashInfer's device
# vocabulary that variants use (math constants and functions, AttentionVariantBase, the REGISTER_
# macros), written for Tessera's hooks.
_PRELUDE = r"""
namespace math {
constexpr float log2e = 1.44269504088896340736f;
constexpr float loge2 = 0.693147180559945309417f;
struct Infinity {  // FlashInfer's math::inf as a value (NVRTC has no constexpr infinity)
  __device__ operator float() const { return __int_as_float(0x7f800000); }
};
constexpr Infinity inf{};
__device__ __forceinline__ float ptx_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ float ptx_log2(float x) { return log2f(x); }
__device__ __forceinline__ float ptx_rcp(float x) { return __frcp_rn(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float rsqrt(float x) { return rsqrtf(x); }
}  // namespace math
struct AttentionVariantBase {
  static constexpr bool use_softmax = true;
};
#define REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, ...) \
  template <typename Params, typename T>                                                                \
  __device__ __forceinline__ T LogitsTransform(const Params& params, T logits, uint32_t batch_idx,      \
                                               uint32_t qo_idx, uint32_t kv_idx, uint32_t qo_head_idx,  \
                                               uint32_t kv_head_idx) __VA_ARGS__
#define REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, ...)             \
  template <typename Params>                                                                            \
  __device__ __forceinline__ bool LogitsMask(const Params& params, uint32_t batch_idx, uint32_t qo_idx,  \
                                             uint32_t kv_idx, uint32_t qo_head_idx, uint32_t kv_head_idx) \
      __VA_ARGS__
"""


def _torch_dtype(name: str, value: Any) -> Any:
    """A jit_args dtype entry (a torch.dtype or its name) -> torch.dtype."""
    torch = U._torch()
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)
    raise TypeError(f"jit_args {name} = {value!r}, expected a torch.dtype")


def _names(name: str, value: Any) -> List[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"jit_args {name} = {value!r}, expected a list of str")
    return list(value)


class JitVariant:
    """One wrapper's ``jit_args``, checked, with the generated source of its Tessera variant."""

    def __init__(self, jit_args: Any, wrapper: str) -> None:
        """Checks ``jit_args``: FlashInfer's 12-entry form (uri, dtype_q, dtype_kv, dtype_o, idtype,
        head_dim, additional tensor names, their dtypes, additional scalar names, their dtypes,
        variant_name, variant_decl) or its 13-entry form (head_dim_qk and head_dim_vo in place of
        head_dim). `wrapper` names the wrapper in messages."""
        if not isinstance(jit_args, (list, tuple)) or len(jit_args) not in (12, 13):
            raise TypeError(f"{wrapper}: jit_args must be FlashInfer's tuple of 12 or 13 entries (uri, dtype_q, "
                            f"dtype_kv, dtype_o, idtype, head_dim[_qk, head_dim_vo], additional tensor names, "
                            f"their dtypes, additional scalar names, their dtypes, variant_name, variant_decl), "
                            f"got {U._short(jit_args)!r}")
        args = list(jit_args)
        if len(args) == 12:
            args.insert(6, args[5])
        (uri, dtype_q, dtype_kv, dtype_o, idtype, head_dim_qk, head_dim_vo, tensor_names, tensor_dtypes,
         scalar_names, scalar_dtypes, variant_name, variant_decl) = args
        if not isinstance(uri, str) or not uri:
            raise TypeError(f"{wrapper}: jit_args uri = {uri!r}, expected a non-empty str")
        self.uri = uri
        self.dtype_q = _torch_dtype("dtype_q", dtype_q)
        self.dtype_kv = _torch_dtype("dtype_kv", dtype_kv)
        self.dtype_o = _torch_dtype("dtype_o", dtype_o)
        torch = U._torch()
        if _torch_dtype("idtype", idtype) != torch.int32:
            raise U.unsupported("jit_args idtype", idtype, "torch.int32 (Tessera's index arrays are int32)")
        if self.dtype_o != self.dtype_q:
            raise NotImplementedError(f"{wrapper}: jit_args dtype_o = {self.dtype_o} differs from dtype_q = "
                                      f"{self.dtype_q}; Tessera writes the output in q's dtype")
        self.head_dim_qk = U.check_positive_int("jit_args head_dim_qk", head_dim_qk)
        self.head_dim_vo = U.check_positive_int("jit_args head_dim_vo", head_dim_vo)
        tensor_names, tensor_dtypes = _names("additional_tensor_names", tensor_names), _names(
            "additional_tensor_dtypes", tensor_dtypes)
        scalar_names, scalar_dtypes = _names("additional_scalar_names", scalar_names), _names(
            "additional_scalar_dtypes", scalar_dtypes)
        for kind, names, dtypes in (("tensor", tensor_names, tensor_dtypes), ("scalar", scalar_names, scalar_dtypes)):
            if len(names) != len(dtypes):
                raise ValueError(f"{wrapper}: jit_args has {len(names)} additional {kind} names and {len(dtypes)} "
                                 f"dtypes, expected one dtype per name")
        seen = set()
        for n in tensor_names + scalar_names:
            if not n.isidentifier() or keyword.iskeyword(n) or n.startswith("tessera_"):
                raise ValueError(f"{wrapper}: jit_args additional parameter name {n!r} is not a C identifier "
                                 "(or starts with the reserved tessera_)")
            if n in seen:
                raise ValueError(f"{wrapper}: jit_args additional parameter {n!r} is declared twice")
            seen.add(n)
        for n, t in zip(tensor_names, tensor_dtypes):
            if t not in _TENSOR_TYPES:
                raise NotImplementedError(f"{wrapper}: jit_args additional tensor {n!r} has dtype {t!r}; supported: "
                                          f"{', '.join(sorted(_TENSOR_TYPES))}")
        for n, t in zip(scalar_names, scalar_dtypes):
            if t not in _SCALAR_TYPES:
                raise NotImplementedError(f"{wrapper}: jit_args additional scalar {n!r} has dtype {t!r}; supported: "
                                          f"{', '.join(sorted(_SCALAR_TYPES))}")
        if len(seen) > 16:
            raise ValueError(f"{wrapper}: jit_args declares {len(seen)} additional parameters, expected at most 16")
        self.tensors: List[Tuple[str, str]] = list(zip(tensor_names, tensor_dtypes))
        self.scalars: List[Tuple[str, str]] = list(zip(scalar_names, scalar_dtypes))
        if not isinstance(variant_name, str) or not variant_name.isidentifier():
            raise TypeError(f"{wrapper}: jit_args variant_name = {variant_name!r}, expected a C identifier")
        if not isinstance(variant_decl, str):
            raise TypeError(f"{wrapper}: jit_args variant_decl must be a str (CUDA C++), got "
                            f"{type(variant_decl).__name__}")
        if not re.search(rf"\b(struct|class)\s+{re.escape(variant_name)}\b", variant_decl):
            raise ValueError(f"{wrapper}: jit_args variant_decl declares no struct {variant_name} (variant_name)")
        for pattern, what in _UNSUPPORTED:
            if re.search(pattern, variant_decl):
                raise NotImplementedError(f"{wrapper}: jit_args variant {variant_name} uses {what}, which Tessera "
                                          "does not support")
        match = re.search(r"\buse_softmax\s*=\s*(true|false)\b", variant_decl)
        self.use_softmax = match is None or match.group(1) == "true"
        self.name = variant_name
        self.source = self._source(variant_decl)
        self._specs: Dict[Any, Tuple[Any, VariantSpec]] = {}
        self._last: Dict[Any, Any] = {}
        self._last_values: Dict[Any, List[Tuple[str, Any]]] = {}

    @property
    def num_args(self) -> int:
        """The number of additional arguments run() takes."""
        return len(self.tensors) + len(self.scalars)

    def _source(self, decl: str) -> str:
        """Tessera hooks that construct the variant per call and apply its members."""
        name = self.name
        fields = [f"  {_TENSOR_TYPES[t][1]}* {n};" for n, t in self.tensors]
        fields += [f"  {t} {n};" for n, t in self.scalars]
        copies = [f"  f.{n} = const_cast<{_TENSOR_TYPES[t][1]}*>(params.{n});" for n, t in self.tensors]
        copies += [f"  f.{n} = static_cast<{t}>(params.{n});" for n, t in self.scalars]
        has = {hook: re.search(rf"\b{hook}\b", decl) is not None for hook in ("QueryTransform", "LogitsTransform",
                                                                            "LogitsMask")}
        has["LogitsTransform"] = has["LogitsTransform"] or "REGISTER_LOGITS_TRANSFORM" in decl
        has["LogitsMask"] = has["LogitsMask"] or "REGISTER_LOGITS_MASK" in decl
        lines = [_PRELUDE, '#line 1 "jit_args variant_decl"', decl, '#line 1 "tessera jit_args hooks"',
                 f"static_assert({name}::use_softmax == {'true' if self.use_softmax else 'false'},",
                 f'              "{name}::use_softmax is not the constant Tessera read from its declaration");',
                 "// FlashInfer's Params: the additional parameters (tensors writable, as FlashInfer's are) and",
                 "// the request's lengths.",
                 "struct TesseraJitParams {", *fields,
                 "  uint32_t tessera_qo_len, tessera_kv_len;",
                 "  __device__ uint32_t get_qo_len(uint32_t) const { return tessera_qo_len; }",
                 "  __device__ uint32_t get_kv_len(uint32_t) const { return tessera_kv_len; }",
                 "};",
                 "__device__ __forceinline__ TesseraJitParams tessera_jit_params(const Params& params, "
                 "const Request& request) {",
                 "  TesseraJitParams f;", *copies,
                 "  f.tessera_qo_len = static_cast<uint32_t>(request.qo_len);",
                 "  f.tessera_kv_len = static_cast<uint32_t>(request.kv_len);",
                 "  return f;",
                 "}",
                 "struct TesseraJitNoMember {};",
                 "struct TesseraJitMember : TesseraJitNoMember {};",
                 "// sm_scale_log2 when the variant has it (FlashInfer multiplies softmax logits by it), else 1.",
                 "template <class V>",
                 "__device__ __forceinline__ auto tessera_jit_scale(const V& v, TesseraJitMember) "
                 "-> decltype(static_cast<float>(v.sm_scale_log2)) {",
                 "  return static_cast<float>(v.sm_scale_log2);",
                 "}",
                 "template <class V>",
                 "__device__ __forceinline__ float tessera_jit_scale(const V&, TesseraJitNoMember) { return 1.f; }"]
        make = ("  TesseraJitParams p = tessera_jit_params(params, request);\n"
                f"  {name} variant(p, static_cast<uint32_t>(batch), nullptr);")
        # qo_idx: Tessera passes the query's position in the sequence; FlashInfer's is its index among
        # the request's new tokens, qo_len or more for a padding row of the last query tile (where
        # Tessera passes the last real row's position and marks the call: Request::padding_row).
        fi_indices = ("static_cast<uint32_t>(batch), static_cast<uint32_t>(request.padding_row ? request.qo_len : "
                      "qo_idx - (request.kv_len - request.qo_len)), static_cast<uint32_t>(kv_idx), "
                      "static_cast<uint32_t>(qo_head), static_cast<uint32_t>(kv_head)")
        if has["QueryTransform"]:
            lines += ["float2 query_transform(const Params& params, float2 value, int batch, int qo_idx, int kv_idx, "
                      "int qo_head, int kv_head, int dim, const Request& request) {", make,
                      "  return make_float2(static_cast<float>(variant.QueryTransform(p, value.x)),",
                      "                     static_cast<float>(variant.QueryTransform(p, value.y)));", "}"]
        if has["LogitsTransform"] or self.use_softmax:
            transformed = (f"static_cast<float>(variant.LogitsTransform(p, logits, {fi_indices}))"
                           if has["LogitsTransform"] else "logits")
            # Softmax: FlashInfer's weights are 2^(x * sm_scale_log2); Tessera's e^(returned logit).
            result = ("x * tessera_jit_scale(variant, TesseraJitMember{}) * math::loge2" if self.use_softmax
                      else "x")
            lines += ["float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, "
                      "int qo_head, int kv_head, const Request& request) {", make,
                      f"  const float x = {transformed};", f"  return {result};", "}"]
        if has["LogitsMask"]:
            lines += ["bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, "
                      "int kv_head, const Request& request) {", make,
                      f"  return variant.LogitsMask(p, {fi_indices});", "}"]
        return "\n".join(lines) + "\n"

    def spec(self, device: Any) -> VariantSpec:
        """The variant for plan() on `device`: its parameters hold the values of the last run()
        on that device (remember), placeholders (zeros, one-element tensors) before the first, and
        run() sets its own (set_variant_params). A plan after runs thus keeps their values, which a
        CUDA-graph wrapper's re-plans must (a captured run has them baked in). One object per
        (device, values), so the wrappers' plan caches see the same variant."""
        key = self._last.get(device)
        cached = self._specs.get(device)
        if cached is not None and cached[0] == key:
            return cached[1]
        torch = U._torch()
        if key is None:
            params: Dict[str, Any] = {n: torch.zeros(1, dtype=getattr(torch, _TENSOR_TYPES[t][0]), device=device)
                                      for n, t in self.tensors}
            params.update({n: _SCALAR_TYPES[t](0) for n, t in self.scalars})
        else:
            params = dict(self._last_values[device])
        spec = VariantSpec(f"{self.name} (jit_args {self.uri})", self.source, params, use_softmax=self.use_softmax)
        self._specs[device] = (key, spec)
        return spec

    def remember(self, device: Any, params: List[Tuple[str, Any]]) -> None:
        """The values a run() on `device` set (for the plans that follow: spec)."""
        self._last[device] = tuple((n, (v.data_ptr(), v.dtype) if hasattr(v, "data_ptr") else v) for n, v in params)
        self._last_values[device] = params

    def check_plan(self, wrapper: str, options: Any, dtype: Any, kv_dtype: Any, head_dim_qk: int,
                   head_dim_vo: int) -> None:
        """The plan's arguments against jit_args: no other variant options, its dtypes and head
        dims (the wrapper checked sm_scale: _jit_plan_args)."""
        if (options.pos_encoding_mode != "NONE" or options.window_left >= 0 or options.logits_soft_cap != 0.0
                or options.sigmoid):
            raise NotImplementedError(f"{wrapper}.plan: with jit_args the variant is the JIT module's; "
                                      "pos_encoding_mode, window_left, logits_soft_cap and use_sigmoid must keep "
                                      "their defaults")
        for what, got, want in (("q_data_type", dtype, self.dtype_q), ("kv_data_type", kv_dtype, self.dtype_kv)):
            if got != want:
                raise ValueError(f"{wrapper}.plan: {what} = {got}, but jit_args declares {want}")
        for what, got, want in (("head_dim_qk", head_dim_qk, self.head_dim_qk),
                                ("head_dim_vo", head_dim_vo, self.head_dim_vo)):
            if got != want:
                raise ValueError(f"{wrapper}.plan: {what} = {got}, but jit_args declares {want}")

    def run_params(self, wrapper: str, args: Sequence[Any], device: Any) -> List[Tuple[str, Any]]:
        """run()'s additional arguments (tensors, then scalars, in jit_args' order) as (name,
        value) pairs for set_variant_params, checked."""
        if len(args) != self.num_args:
            names = ", ".join(n for n, _ in self.tensors + self.scalars) or "none"
            raise TypeError(f"{wrapper}.run: got {len(args)} additional argument(s) after the KV cache, expected "
                            f"{self.num_args} ({names}) for jit_args variant {self.name}")
        torch = U._torch()
        out: List[Tuple[str, Any]] = []
        for (n, t), value in zip(self.tensors, args[:len(self.tensors)]):
            want = getattr(torch, _TENSOR_TYPES[t][0])
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{wrapper}.run: additional tensor {n!r} is a {type(value).__name__}, expected a "
                                f"torch.Tensor of {want}")
            if value.dtype != want or value.device != device:
                raise ValueError(f"{wrapper}.run: additional tensor {n!r} is {value.dtype} on {value.device}, "
                                 f"expected {want} on {device} ({t} in jit_args)")
            if not value.is_contiguous():
                raise ValueError(f"{wrapper}.run: additional tensor {n!r} is not contiguous")
            out.append((n, value.detach()))
        for (n, t), value in zip(self.scalars, args[len(self.tensors):]):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{wrapper}.run: additional scalar {n!r} = {U._short(value)!r}, expected a Python "
                                f"number ({t} in jit_args)")
            if _SCALAR_TYPES[t] is int and not isinstance(value, int):
                raise TypeError(f"{wrapper}.run: additional scalar {n!r} = {value!r}, expected an int ({t})")
            out.append((n, _SCALAR_TYPES[t](value)))
        return out


    def call_spec(self, name: str, q: Any, k: Any, v: Any, args: Sequence[Any]) -> VariantSpec:
        """A one-shot call's variant (FlashInfer's single-request functions with a customized
        module): q / k / v against the module's dtypes and head dims, `args` its additional
        tensors and scalars (run_params), which the returned spec carries."""
        torch = U._torch()
        for what, t, dtype, dim in (("q", q, self.dtype_q, self.head_dim_qk), ("k", k, self.dtype_kv, self.head_dim_qk),
                                    ("v", v, self.dtype_kv, self.head_dim_vo)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: {what} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype or t.shape[-1] != dim:
                raise ValueError(f"{name}: {what} is {t.dtype} with head dim {t.shape[-1]}, but the module declares "
                                 f"{dtype} and {dim}")
        params = self.run_params(name, args, q.device)
        return VariantSpec(f"{self.name} (jit_args {self.uri})", self.source, dict(params), use_softmax=self.use_softmax)


# FlashInfer's keyword options of a customized module, with their defaults (the only values
# Tessera takes: its variant is the declaration alone).
_MODULE_FLAGS = {"pos_encoding_mode": 0, "use_sliding_window": False, "use_logits_soft_cap": False,
                 "use_fp16_qk_reduction": False}


def check_jit_kwargs(name: str, jit_kwargs: Any) -> None:
    """None, or a dict of FlashInfer's module flags at their defaults (NotImplementedError for
    another value, TypeError for another key or type)."""
    if jit_kwargs is None:
        return
    if not isinstance(jit_kwargs, dict):
        raise TypeError(f"{name} must be a dict of keyword options or None, got {type(jit_kwargs).__name__}")
    for key, value in jit_kwargs.items():
        if key not in _MODULE_FLAGS:
            raise TypeError(f"{name}: unknown option {key!r} (FlashInfer's: {', '.join(_MODULE_FLAGS)})")
        if value != _MODULE_FLAGS[key] or isinstance(value, bool) != isinstance(_MODULE_FLAGS[key], bool):
            raise U.unsupported(f"{name}[{key!r}]", value, f"{_MODULE_FLAGS[key]!r}: a customized module's variant is "
                                                          "its declaration alone")


def jit_variant(jit_args: Any, wrapper: str) -> Optional[JitVariant]:
    """None for None, else the checked JitVariant."""
    return None if jit_args is None else JitVariant(jit_args, wrapper)
