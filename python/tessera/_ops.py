"""The plan/run wrappers' run() as PyTorch custom ops, for torch.compile.

Imported by the wrappers' constructors (tessera._runtime.load_ops), never by ``import tessera``:
it needs torch >= 2.4 (torch.library.custom_op). Under torch.compile a wrapper's run() does its
checks that depend only on the plan, shapes and dtypes in Python, which Dynamo traces, and then
calls one of these ops, which Dynamo puts into the graph as a single opaque node:

- ``tessera::decode_run``          BatchDecodeWithPagedKVCacheWrapper.run
- ``tessera::prefill_paged_run``   BatchPrefillWithPagedKVCacheWrapper.run
- ``tessera::prefill_ragged_run``  BatchPrefillWithRaggedKVCacheWrapper.run
- ``tessera::flex_attention``      tessera.flex_attention (its mods traced while Dynamo traces)
- ``tessera::mla_run``             BatchMLAPagedAttentionWrapper.run (q is q_nope: the output has its shape)
- ``tessera::block_sparse_paged_run``  BlockSparsePagedAttentionWrapper.run (decode_run's arguments and
  outputs; the block mask, mask_indices / mask_flags, comes from the plan, as the page-table ranges do)

A custom op cannot take the wrapper (a Python object holding the C++ runtime): it takes the
wrapper's integer handle and looks the wrapper up in tessera._runtime's table of weak references.
The plan itself is host state of that wrapper and of its C++ runtime (uploaded into the workspace
by plan(), outside the compiled code), as in FlashInfer.

Arguments common to the ops: ``out`` / ``lse`` the caller's output buffers or None (the op then
allocates them); ``return_lse`` whether the LSE is computed; ``workspace`` the wrapper's
float_workspace_buffer, which the run writes (split-KV partial results); ``k_scale`` / ``v_scale``
an fp8 cache's scales as one-element float32 tensors or None, ``k_scale_value`` /
``v_scale_value`` the float scales used where the tensor is None. The prefill ops also take
``q_scale`` / ``q_scale_value`` (an FP8 attention plan's scale of q, in the same pair form; None and
1.0 for a 16-bit plan) and ``o_dtype``, the dtype of the output (the plan's: q's for a 16-bit q, an
FP8 attention plan's float16 / bfloat16 o_data_type), which makes the op's output dtype a function
of its arguments for the fake implementations. The ops return ``(out, lse)``: ``out`` a new
q-shaped tensor (decode_run: of q's dtype; the prefill ops: of ``o_dtype``) when the caller passed
none, else an empty tensor of that dtype (the caller's ``out`` holds the result); ``lse`` a new
float32 ``[rows of q, num_qo_heads]`` tensor when ``return_lse`` and the caller passed none, else
an empty float32 tensor. An FP8 attention plan's q (e4m3) goes to the runtime as bytes with its
dtype named (``q_dtype``), as the eager run() passes it.

The ops are inference-only (no autograd formula), as the wrappers are: run() passes tensors that
require grad detached, as the eager run() does.
"""

from typing import List, Optional, Tuple

import torch

from . import _runtime as R
from . import _utils as U

__all__: list = []  # private module

Tensor = torch.Tensor


def _outputs(q: Tensor, out: Optional[Tensor], lse: Optional[Tensor], return_lse: bool,
             v: Optional[Tensor] = None, dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """The op's new outputs (shared by the kernels and the fake implementations): o of q's rows
    and heads and of v's head dim (a prefill plan's head_dim_vo; q's when v is None, one combined
    K/V tensor), of `dtype` (q's when None)."""
    if dtype is None:
        dtype = q.dtype
    if out is None:
        o = torch.empty((q.shape[0], q.shape[1], (v if v is not None else q).shape[-1]), dtype=dtype,
                        device=q.device)
    else:
        o = torch.empty((0,), dtype=dtype, device=q.device)
    if return_lse and lse is None:
        l = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    else:
        l = torch.empty((0,), dtype=torch.float32, device=q.device)
    return o, l


def _planned(handle: int) -> Tuple[object, dict]:
    w = R.wrapper_for(handle)
    p = w._planned
    if p is None:
        raise RuntimeError("run() before plan(): call plan() before running the compiled function")
    return w, p


def _scale(tensor: Optional[Tensor], value: float) -> object:
    return tensor if tensor is not None else value


def _check_o_dtype(p: dict, o_dtype: Optional[torch.dtype]) -> None:
    """A prefill op's o_dtype against the plan's output dtype (q's, or an FP8 attention plan's
    o_data_type): they differ only when the op is called other than by run() (Dynamo guards the
    plan's dtypes that run() read while tracing)."""
    planned = p.get("o_dtype", p["dtype"])
    if o_dtype is not None and o_dtype != planned:
        raise ValueError(f"o_dtype = {o_dtype}, but the plan writes {planned} (its o_data_type)")


def _q_kwargs(p: dict, q: Tensor, q_scale: Optional[Tensor], q_scale_value: float) -> Tuple[Tensor, object, dict]:
    """q as the binding takes it, the q scale for _run_kv_scales and the run keywords: an FP8
    attention plan's q as bytes with q_dtype (as the eager run()), a 16-bit plan's q as it is, and
    only None / 1.0 as its q_scale (run() has refused others by name)."""
    q_dtype = p.get("q_dtype_arg")
    if q_dtype is None:
        U.check_scale("q_scale", _scale(q_scale, q_scale_value))
        return q, None, {}
    return U.kv_arg(q), _scale(q_scale, q_scale_value), {"q_dtype": q_dtype}


def _paged_run(handle: int, q: Tensor, k: Optional[Tensor], v: Optional[Tensor], kv: Optional[Tensor],
               kv_layout: str, indices: Tensor, out: Optional[Tensor], lse: Optional[Tensor], return_lse: bool,
               k_scale: Optional[Tensor], v_scale: Optional[Tensor], k_scale_value: float,
               v_scale_value: float, q_scale: Optional[Tensor] = None, q_scale_value: float = 1.0,
               o_dtype: Optional[torch.dtype] = None, block_mask: bool = False) -> Tuple[Tensor, Tensor]:
    """What the eager run() of the paged wrappers does after its checks (decode.py). decode_run
    passes no q_scale / o_dtype (its plans have a 16-bit q, and o of q's dtype). block_mask:
    block_sparse_paged_run's runtime, which takes the plan's block mask (mask_indices, mask_flags)
    after the page ids (sparse.py's eager run())."""
    from .decode import _run_kv_scales

    w, p = _planned(handle)
    _check_o_dtype(p, o_dtype)
    o, l = _outputs(q, out, lse, return_lse, v, o_dtype)
    ref = kv if kv is not None else k
    assert ref is not None
    p["host_indices"].check(int(ref.shape[0]))  # page ids plan() had on the host, against this cache
    q_arg, q_scale_arg, q_kwargs = _q_kwargs(p, q, q_scale, q_scale_value)
    fp8 = _run_kv_scales(w._kv_scales, p, _scale(k_scale, k_scale_value), _scale(v_scale, v_scale_value),
                         w._use_cuda_graph, q_scale_arg)
    mask = (p["mask_indices"], p["mask_flags"]) if block_mask else ()
    U.call(w._holder.cpp.run, q, q_arg, U.kv_arg(k), U.kv_arg(v), U.kv_arg(kv), U.check_kv_layout(kv_layout),
           indices, *mask, o if out is None else out, (l if lse is None else lse) if return_lse else None,
           U.current_stream(q.device), kv_dtype=U.tessera_dtype(p["kv_dtype"]) if fp8 else None, **q_kwargs)
    return o, l


_MUTATES = ("workspace", "out", "lse")


@torch.library.custom_op("tessera::decode_run", mutates_args=_MUTATES)
def decode_run(handle: int, q: Tensor, k: Optional[Tensor], v: Optional[Tensor], kv: Optional[Tensor],
               kv_layout: str, indices: Tensor, workspace: Tensor, out: Optional[Tensor], lse: Optional[Tensor],
               return_lse: bool, k_scale: Optional[Tensor], v_scale: Optional[Tensor], k_scale_value: float,
               v_scale_value: float) -> Tuple[Tensor, Tensor]:
    """BatchDecodeWithPagedKVCacheWrapper.run of the wrapper `handle` (see the module doc)."""
    return _paged_run(handle, q, k, v, kv, kv_layout, indices, out, lse, return_lse, k_scale, v_scale,
                      k_scale_value, v_scale_value)


@torch.library.custom_op("tessera::prefill_paged_run", mutates_args=_MUTATES)
def prefill_paged_run(handle: int, q: Tensor, k: Optional[Tensor], v: Optional[Tensor], kv: Optional[Tensor],
                      kv_layout: str, indices: Tensor, workspace: Tensor, out: Optional[Tensor],
                      lse: Optional[Tensor], return_lse: bool, k_scale: Optional[Tensor], v_scale: Optional[Tensor],
                      k_scale_value: float, v_scale_value: float, q_scale: Optional[Tensor], q_scale_value: float,
                      o_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """BatchPrefillWithPagedKVCacheWrapper.run of the wrapper `handle` (see the module doc)."""
    return _paged_run(handle, q, k, v, kv, kv_layout, indices, out, lse, return_lse, k_scale, v_scale,
                      k_scale_value, v_scale_value, q_scale, q_scale_value, o_dtype)


@torch.library.custom_op("tessera::prefill_ragged_run", mutates_args=_MUTATES)
def prefill_ragged_run(handle: int, q: Tensor, k: Tensor, v: Tensor, kv_layout: str, workspace: Tensor,
                       out: Optional[Tensor], lse: Optional[Tensor], return_lse: bool, k_scale: Optional[Tensor],
                       v_scale: Optional[Tensor], k_scale_value: float, v_scale_value: float,
                       q_scale: Optional[Tensor], q_scale_value: float, o_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """BatchPrefillWithRaggedKVCacheWrapper.run of the wrapper `handle` (see the module doc)."""
    from .decode import _run_kv_scales

    w, p = _planned(handle)
    _check_o_dtype(p, o_dtype)
    o, l = _outputs(q, out, lse, return_lse, v, o_dtype)
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # views: [kv_rows, H_kv, D] with strides
    q_arg, q_scale_arg, q_kwargs = _q_kwargs(p, q, q_scale, q_scale_value)
    fp8 = _run_kv_scales(w._kv_scales, p, _scale(k_scale, k_scale_value), _scale(v_scale, v_scale_value),
                         w._use_cuda_graph, q_scale_arg)
    U.call(w._holder.cpp.run, q, q_arg, U.kv_arg(k), U.kv_arg(v), o if out is None else out,
           (l if lse is None else lse) if return_lse else None, U.current_stream(q.device),
           kv_dtype=U.tessera_dtype(p["kv_dtype"]) if fp8 else None, **q_kwargs)
    return o, l


@decode_run.register_fake
def _decode_run_fake(handle, q, k, v, kv, kv_layout, indices, workspace, out, lse, return_lse, k_scale, v_scale,
                     k_scale_value, v_scale_value):
    return _outputs(q, out, lse, return_lse)


@prefill_paged_run.register_fake
def _prefill_paged_run_fake(handle, q, k, v, kv, kv_layout, indices, workspace, out, lse, return_lse, k_scale,
                            v_scale, k_scale_value, v_scale_value, q_scale, q_scale_value, o_dtype):
    return _outputs(q, out, lse, return_lse, v, o_dtype)


@prefill_ragged_run.register_fake
def _prefill_ragged_run_fake(handle, q, k, v, kv_layout, workspace, out, lse, return_lse, k_scale, v_scale,
                             k_scale_value, v_scale_value, q_scale, q_scale_value, o_dtype):
    return _outputs(q, out, lse, return_lse, v, o_dtype)


@torch.library.custom_op("tessera::block_sparse_paged_run", mutates_args=_MUTATES)
def block_sparse_paged_run(handle: int, q: Tensor, k: Optional[Tensor], v: Optional[Tensor], kv: Optional[Tensor],
                           kv_layout: str, indices: Tensor, workspace: Tensor, out: Optional[Tensor],
                           lse: Optional[Tensor], return_lse: bool, k_scale: Optional[Tensor],
                           v_scale: Optional[Tensor], k_scale_value: float,
                           v_scale_value: float) -> Tuple[Tensor, Tensor]:
    """BlockSparsePagedAttentionWrapper.run of the wrapper `handle` (see the module doc): its block
    mask (mask_indices, mask_flags) is the plan's."""
    return _paged_run(handle, q, k, v, kv, kv_layout, indices, out, lse, return_lse, k_scale, v_scale,
                      k_scale_value, v_scale_value, block_mask=True)


@block_sparse_paged_run.register_fake
def _block_sparse_paged_run_fake(handle, q, k, v, kv, kv_layout, indices, workspace, out, lse, return_lse, k_scale,
                                 v_scale, k_scale_value, v_scale_value):
    return _outputs(q, out, lse, return_lse, v)


@torch.library.custom_op("tessera::flex_attention", mutates_args=())
def flex_attention(query: Tensor, key: Tensor, value: Tensor, indptrs: List[Tensor], indices: List[Tensor],
                   flags: List[Tensor], q_block: int, kv_block: int, sm_scale: float, return_lse: bool,
                   variant_name: str, mask_source: str, mask_function: str, score_source: str,
                   score_function: str, captures: List[Tensor], capture_names: str, logits_soft_cap: float,
                   alibi_capture: str, causal_window: int, dense: bool) -> Tuple[Tensor, Tensor]:
    """tessera.flex_attention after its checks and tracing (tessera.flex.run_flex_attention): the
    traced mods arrive as source text, their captured tensors as byte views named by
    capture_names (comma-separated), mods lowered to the built-in soft-cap, ALiBi or causal
    window as logits_soft_cap / alibi_capture / causal_window, dense for the dense kernel;
    returns (out, natural-log lse or an empty tensor)."""
    from .flex import run_flex_attention

    return run_flex_attention(query, key, value, indptrs, indices, flags, q_block, kv_block, sm_scale, return_lse,
                              variant_name, mask_source, mask_function, score_source, score_function, captures,
                              capture_names, logits_soft_cap, alibi_capture, causal_window, dense)


@flex_attention.register_fake
def _flex_attention_fake(query, key, value, indptrs, indices, flags, q_block, kv_block, sm_scale, return_lse,
                         variant_name, mask_source, mask_function, score_source, score_function, captures,
                         capture_names, logits_soft_cap, alibi_capture, causal_window, dense):
    B, Hq, L, E = query.shape
    out = torch.empty((B, Hq, L, E), dtype=query.dtype, device=query.device)
    lse = torch.empty((B, Hq, L) if return_lse else (0,), dtype=torch.float32, device=query.device)
    return out, lse


@torch.library.custom_op("tessera::mla_run", mutates_args=_MUTATES)
def mla_run(handle: int, q_nope: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor, workspace: Tensor,
            out: Optional[Tensor], lse: Optional[Tensor], return_lse: bool, k_scale: Optional[Tensor],
            v_scale: Optional[Tensor], k_scale_value: float, v_scale_value: float) -> Tuple[Tensor, Tensor]:
    """BatchMLAPagedAttentionWrapper.run of the wrapper `handle`: the output has q_nope's shape
    ([total_q, num_heads, 512]); the scales as decode_run's (an fp8 latent cache's)."""
    w = R.wrapper_for(handle)
    if w._plan is None:
        raise RuntimeError("run() before plan(): call plan() before running the compiled function")
    o, l = _outputs(q_nope, out, lse, return_lse)
    # As the eager run(): a caller's lse is written even without return_lse.
    w._launch(q_nope, q_pe, ckv, kpe, o if out is None else out, lse if lse is not None else (l if return_lse else None),
              _scale(k_scale, k_scale_value), _scale(v_scale, v_scale_value))
    return o, l


@mla_run.register_fake
def _mla_run_fake(handle, q_nope, q_pe, ckv, kpe, workspace, out, lse, return_lse, k_scale, v_scale, k_scale_value,
                  v_scale_value):
    return _outputs(q_nope, out, lse, return_lse)


# The overloads run() calls (an OpOverload is what Dynamo puts into the graph).
DECODE_RUN = torch.ops.tessera.decode_run.default
PREFILL_PAGED_RUN = torch.ops.tessera.prefill_paged_run.default
PREFILL_RAGGED_RUN = torch.ops.tessera.prefill_ragged_run.default
BLOCK_SPARSE_PAGED_RUN = torch.ops.tessera.block_sparse_paged_run.default
FLEX_ATTENTION = torch.ops.tessera.flex_attention.default
MLA_RUN = torch.ops.tessera.mla_run.default
