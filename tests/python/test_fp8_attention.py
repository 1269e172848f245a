"""FP8 attention: q, k and v torch.float8_e4m3fn, output float16/bfloat16 (default bfloat16),
FlashInfer's scales (a float, or a float32 tensor), through single_prefill_with_kv_cache
(``scale_q`` / ``scale_k`` / ``scale_v``, ``o_dtype``; per tensor or per KV head) and the batch
prefill wrappers (``q_data_type`` / ``kv_data_type`` / ``o_data_type`` in plan(), ``q_scale`` /
``k_scale`` / ``v_scale`` in run(), each a float or a one-element float32 tensor).

CPU: the named errors before any GPU work (e5m2 q, k of another dtype, an fp8 or float32 output
dtype, a variant option, scale_q / q_scale with a 16-bit q; in the wrappers also an fp8 q with a
16-bit cache, custom masks, head_dim_vo, use_cuda_graph, the decode and POD wrappers), and what the
wrappers hand the runtime (a stand-in recording the bindings' calls: the plan's dtypes and scale
tensors, q as bytes with its dtype, the output's dtype, each run's scales; the same under
torch.compile). GPU (skipped without CUDA; on a GPU without wgmma the call, or the wrapper's plan(),
is a NotImplementedError naming sm_90a): random requests against a reference on the dequantized
inputs (codes x scales), written from the definition; o within 4e-2 relative error (P is rounded to
e4m3 for the fp8 P V), the base-2 LSE within 8e-3 (the fp8 MMAs accumulate the logits with fewer
bits than fp32), as the C++ tests bound them (docs/kernels.md, "FP8 attention").
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the functions take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
E4M3 = torch.float8_e4m3fn
LN2 = math.log(2.0)
REL_TOL, LSE_TOL = 4e-2, 8e-3


def _fp8(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=E4M3, device=device)


def test_errors_before_gpu_work():
    q, k, v = _fp8(4, 8, 128), _fp8(64, 2, 128), _fp8(64, 2, 128)
    with pytest.raises(NotImplementedError, match="q.dtype"):
        tessera.single_prefill_with_kv_cache(q.to(torch.float8_e5m2), k.to(torch.float8_e5m2),
                                             v.to(torch.float8_e5m2))
    with pytest.raises(TypeError, match="k.dtype"):
        tessera.single_prefill_with_kv_cache(q, k.to(torch.bfloat16), v)
    with pytest.raises(TypeError, match="v.dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v.to(torch.float8_e5m2))
    with pytest.raises(NotImplementedError, match="o_dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v, o_dtype=E4M3)
    with pytest.raises(NotImplementedError, match="o_dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v, o_dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="FP8 attention"):
        tessera.single_prefill_with_kv_cache(q, k, v, window_left=16)
    with pytest.raises(NotImplementedError, match="FP8 attention"):
        tessera.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI")
    # A q scale needs an fp8 q.
    with pytest.raises(NotImplementedError, match="scale_q"):
        tessera.single_prefill_with_kv_cache(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16),
                                             scale_q=0.5)
    # Everything checked: the call stops at its first GPU step (CPU tensors).
    with pytest.raises(ValueError, match="cpu"):
        tessera.single_prefill_with_kv_cache(q, k, v, scale_q=0.5, scale_k=0.25, o_dtype=torch.float16)


# --- the batch prefill wrappers: checks before GPU work (CPU) ------------------------------------------

from tessera import _C  # noqa: E402
from tessera import _utils as U  # noqa: E402
from test_cpu import _decode_plan, _i32, _paged_plan, _ragged_plan, _ws  # noqa: E402  (the CPU plan helpers)
from conftest import RecordingRuntime  # noqa: E402  (the recording runtime stand-in)

PAGED, RAGGED = tessera.BatchPrefillWithPagedKVCacheWrapper, tessera.BatchPrefillWithRaggedKVCacheWrapper
WRAPPER_PLANS = [(PAGED, _paged_plan), (RAGGED, _ragged_plan)]
WRAPPER_IDS = ["paged", "ragged"]
FIRST_GPU_STEP = "float_workspace_buffer is on cpu, expected a CUDA tensor"


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
@pytest.mark.parametrize("dtypes", [
    dict(q_data_type=E4M3, kv_data_type=E4M3),
    dict(q_data_type=E4M3),  # kv_data_type None: q's
    dict(q_data_type="e4m3", kv_data_type="float8_e4m3fn", o_data_type=torch.float16),
    dict(q_data_type=E4M3, kv_data_type=E4M3, o_data_type="bfloat16"),
], ids=["e4m3", "kv-none", "strings-f16", "bf16"])
def test_wrapper_plan_accepts_fp8_attention(cls, plan, dtypes):
    # Every check passes; the plan stops at its first GPU step (the host workspace).
    with pytest.raises(ValueError, match=FIRST_GPU_STEP):
        plan(cls(_ws()), causal=True, **dtypes)


def test_prefill_plan_dtypes_resolve():
    # FP8 attention's (q, kv, o); the 16-bit and fp8-cache plans resolve as resolve_plan_dtypes says.
    assert U.resolve_prefill_plan_dtypes(E4M3, None, None) == (E4M3, E4M3, torch.bfloat16)
    assert U.resolve_prefill_plan_dtypes("e4m3", "e4m3", "float16") == (E4M3, E4M3, torch.float16)
    for q, kv, o in [("float16", None, None), (torch.bfloat16, "e5m2", None), (None, None, None),
                     ("bf16", torch.bfloat16, torch.bfloat16), (torch.float16, E4M3, "float16")]:
        dtype = U.resolve_plan_dtypes(q, kv, None, o)
        assert U.resolve_prefill_plan_dtypes(q, kv, o) == (dtype, U.resolve_plan_kv_dtype(dtype, kv), dtype)


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
@pytest.mark.parametrize("dtypes,error,message", [
    (dict(q_data_type=torch.float8_e5m2), NotImplementedError,
     r"q_data_type=torch.float8_e5m2 is not supported .*torch.float8_e4m3fn \(FP8 attention"),
    (dict(q_data_type=torch.float8_e5m2, kv_data_type=torch.float8_e5m2), NotImplementedError,
     r"q_data_type=torch.float8_e5m2"),
    (dict(q_data_type=E4M3, kv_data_type=torch.bfloat16), NotImplementedError,
     r"kv_data_type=torch.bfloat16 is not supported .*None or torch.float8_e4m3fn with q_data_type"),
    (dict(q_data_type=E4M3, kv_data_type="e5m2"), NotImplementedError, r"kv_data_type=torch.float8_e5m2"),
    (dict(q_data_type=E4M3, o_data_type=E4M3), NotImplementedError,
     r"o_data_type=torch.float8_e4m3fn is not supported .*torch.float16 or torch.bfloat16"),
    (dict(q_data_type=E4M3, o_data_type=torch.float32), NotImplementedError, r"o_data_type=torch.float32"),
    (dict(q_data_type=E4M3, o_data_type="float8"), TypeError, r"o_data_type = 'float8' is not a dtype"),
    # A 16-bit q keeps its rules: o_data_type is q's.
    (dict(q_data_type=torch.float16, o_data_type=torch.bfloat16), NotImplementedError, r"o_data_type"),
], ids=["e5m2", "e5m2-e5m2", "kv-16bit", "kv-e5m2", "o-fp8", "o-f32", "o-unknown", "16bit-o"])
def test_wrapper_plan_rejects_fp8_dtypes(cls, plan, dtypes, error, message):
    with pytest.raises(error, match=message):
        plan(cls(_ws()), **dtypes)


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
@pytest.mark.parametrize("option,value,message", [
    ("window_left", 16, r"window_left=16 is not supported .*-1 with q_data_type=torch.float8_e4m3fn"),
    ("pos_encoding_mode", "ALIBI", r"pos_encoding_mode='ALIBI' is not supported .*'NONE' with q_data_type"),
    ("pos_encoding_mode", "ROPE_LLAMA", r"pos_encoding_mode='ROPE_LLAMA'"),
    ("logits_soft_cap", 30.0, r"logits_soft_cap=30.0 is not supported .*None or 0 with q_data_type"),
    ("custom_mask", "mask", r"custom_mask='<tensor .* is not supported .*None with q_data_type"),
    ("packed_custom_mask", "packed", r"packed_custom_mask='<tensor"),
    ("variant", "variant", r"variant=.* is not supported .*None with q_data_type=torch.float8_e4m3fn"),
    ("head_dim_vo", 128, r"head_dim_vo=128 is not supported .*None or head_dim_qk \(192\) with q_data_type"),
])
def test_wrapper_plan_rejects_fp8_options(cls, plan, option, value, message):
    if value == "mask":  # refused before its size is read
        value = torch.ones(8, dtype=torch.bool)
    elif value == "packed":
        value = torch.zeros(8, dtype=torch.uint8)
    elif value == "variant":
        value = tessera.VariantSpec("v", "struct Params {};")
    extra = {"head_dim_qk": 192} if option == "head_dim_vo" else {}
    with pytest.raises(NotImplementedError, match=message):
        plan(cls(_ws()), q_data_type=E4M3, **{option: value}, **extra)
    # The same options with a 16-bit q are not what stops the plan (they pass or fail for their own reasons).
    if option not in ("custom_mask", "packed_custom_mask", "variant"):
        with pytest.raises(ValueError, match=FIRST_GPU_STEP):
            plan(cls(_ws()), **{option: value}, **extra)


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_plan_rejects_fp8_with_cuda_graph(cls, plan):
    bufs = dict(qo_indptr_buf=_i32([0] * 3))
    if cls is PAGED:
        bufs.update(paged_kv_indptr_buf=_i32([0] * 3), paged_kv_indices_buf=_i32([0] * 8),
                    paged_kv_last_page_len_buf=_i32([0] * 2))
    else:
        bufs.update(kv_indptr_buf=_i32([0] * 3))
    w = cls(_ws(), "NHD", use_cuda_graph=True, **bufs)
    with pytest.raises(NotImplementedError, match=r"use_cuda_graph=True is not supported .*False for a plan with "
                                                  r"q_data_type=torch.float8_e4m3fn"):
        plan(w, q_data_type=E4M3)


def test_decode_and_pod_wrappers_reject_an_fp8_q():
    message = (r"q_data_type=torch.float8_e4m3fn is not supported .*FP8 attention \(an e4m3 q with e4m3 K/V\) runs "
               r"in single_prefill_with_kv_cache, BatchPrefillWithPagedKVCacheWrapper and "
               r"BatchPrefillWithRaggedKVCacheWrapper")
    with pytest.raises(NotImplementedError, match=message):
        _decode_plan(tessera.BatchDecodeWithPagedKVCacheWrapper(_ws()), q_data_type=E4M3, kv_data_type=E4M3)
    with pytest.raises(NotImplementedError, match=message):
        _decode_plan(tessera.BatchDecodeWithPagedKVCacheWrapper(_ws()), q_data_type=None, data_type=E4M3)
    with pytest.raises(NotImplementedError, match=message):
        _paged_plan(tessera.PODWithPagedKVCacheWrapper(_ws()), q_data_type=E4M3, kv_data_type=E4M3)
    # An fp8 cache under a 16-bit q stays what it was.
    with pytest.raises(ValueError, match=FIRST_GPU_STEP):
        _decode_plan(tessera.BatchDecodeWithPagedKVCacheWrapper(_ws()), kv_data_type=E4M3)


# --- the batch prefill wrappers on a stand-in runtime (CPU) -----------------------------------------


class _Recorder(RecordingRuntime):
    """The recording stand-in of the C++ prefill runtime classes, writing NaN-free values into o (and
    lse)."""

    def run(self, *args, **kwargs):
        super().run(*args, **kwargs)
        o, lse = (args[6], args[7]) if len(args) == 9 else (args[3], args[4])  # paged / ragged
        o.fill_(0.5)
        if lse is not None:
            lse.fill_(1.5)


@pytest.fixture
def stand_ins(install_runtime_stand_ins):
    """The prefill runtime classes replaced by _Recorder, device checks lifted (conftest)."""
    install_runtime_stand_ins(("BatchPrefillPagedWrapper", "BatchPrefillRaggedWrapper"), _Recorder)


def _planned_fp8(cls, plan, **kwargs):
    """A wrapper with an FP8 attention plan on the stand-in (4 query rows, 8 heads, 2 KV heads, D 128)
    and the K/V arguments of its run()."""
    w = cls(_ws())
    plan(w, q_data_type=E4M3, kv_data_type=E4M3, causal=True, **kwargs)
    if cls is PAGED:
        kv = ((torch.zeros(3, 16, 2, 128).to(E4M3), torch.zeros(3, 16, 2, 128).to(E4M3)),)
    else:
        kv = (torch.zeros(37, 2, 128).to(E4M3), torch.zeros(37, 2, 128).to(E4M3))
    return w, kv


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_hands_the_runtime_an_fp8_plan(stand_ins, cls, plan):
    w, kv = _planned_fp8(cls, plan)
    runtime = w._holder.cpp
    (args, kwargs), = runtime.plans
    dtype_at = 7 if cls is PAGED else 5  # page_size comes before the heads in the paged plan
    assert args[dtype_at] == _C.DType.e4m3 and kwargs["kv_dtype"] == _C.DType.e4m3
    scales = w._kv_scales.buf
    assert scales.dtype == torch.float32 and scales.tolist() == [1.0, 1.0, 1.0]
    for i, name in enumerate(("k_scale_device", "v_scale_device", "q_scale_device")):
        t = kwargs[name]
        assert t.numel() == 1 and t.data_ptr() == scales[i:].data_ptr(), name
    assert "q_scale" not in kwargs  # the host factor stays 1: run() fills the device tensor

    q = torch.zeros(4, 8, 128).to(E4M3)
    out = w.run(q, *kv)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 8, 128) and (out == 0.5).all()
    (rargs, rkwargs) = runtime.runs[-1]
    assert rargs[0].dtype == torch.uint8 and rargs[0].data_ptr() == q.data_ptr()  # q as bytes, dtype named
    assert rkwargs == {"kv_dtype": _C.DType.e4m3, "q_dtype": _C.DType.e4m3}
    kv_args = rargs[1:3]
    assert all(t.dtype == torch.uint8 for t in kv_args)

    # Each run's scales land in the plan's tensors: floats, one-element tensors, None (1).
    w.run(q, *kv, q_scale=0.25, k_scale=2.0, v_scale=0.5)
    assert scales.tolist() == [2.0, 0.5, 0.25]
    w.run(q, *kv, q_scale=torch.tensor([0.125]), k_scale=torch.tensor(4.0), v_scale=None)
    assert scales.tolist() == [4.0, 1.0, 0.125]
    w.run(q, *kv)
    assert scales.tolist() == [1.0, 1.0, 1.0]

    # out and lse given: written in place; out of the plan's o dtype.
    out = torch.full((4, 8, 128), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((4, 8), float("nan"))
    result = w.run(q, *kv, out=out, lse=lse, return_lse=True)
    assert result[0] is out and result[1] is lse and (out == 0.5).all() and (lse == 1.5).all()
    assert runtime.runs[-1][0][-3 if cls is PAGED else 3] is out


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_fp8_output_dtype(stand_ins, cls, plan):
    w, kv = _planned_fp8(cls, plan, o_data_type=torch.float16)
    q = torch.zeros(4, 8, 128).to(E4M3)
    assert w.run(q, *kv).dtype == torch.float16
    lse = w.run(q, *kv, return_lse=True)[1]
    assert lse.dtype == torch.float32 and lse.shape == (4, 8)
    out = torch.zeros(4, 8, 128, dtype=torch.float16)
    assert w.run(q, *kv, out=out) is out
    with pytest.raises(TypeError, match=r"out.dtype = torch.bfloat16, expected torch.float16 \(the plan's "
                                        r"o_data_type: FP8 attention"):
        w.run(q, *kv, out=torch.zeros(4, 8, 128, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"out.dtype = torch.float8_e4m3fn, expected torch.float16"):
        w.run(q, *kv, out=torch.zeros(4, 8, 128).to(E4M3))
    # The same through the full checks alone (the plan without the entries its fast paths need).
    w._planned = {k: v for k, v in w._planned.items() if k not in ("device", "run_fast")}
    assert w.run(q, *kv).dtype == torch.float16
    assert w.run(q, *kv, out=out) is out
    with pytest.raises(TypeError, match=r"out.dtype = torch.bfloat16, expected torch.float16 \(the plan's "):
        w.run(q, *kv, out=torch.zeros(4, 8, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_fp8_run_errors(stand_ins, cls, plan):
    w, kv = _planned_fp8(cls, plan)
    q = torch.zeros(4, 8, 128).to(E4M3)
    with pytest.raises(TypeError, match=r"q.dtype = torch.bfloat16, but the plan was made for q_data_type = "
                                        r"torch.float8_e4m3fn"):
        w.run(q.to(torch.bfloat16), *kv)
    for value, error, message in [
        (0.0, ValueError, r"q_scale = 0.0, expected a finite scale > 0"),
        (float("inf"), ValueError, r"q_scale = inf"),
        ("2", TypeError, r"q_scale must be None, a float or a float32 tensor, got str"),
        (torch.ones(2), ValueError, r"q_scale = <tensor \(2,\) torch.float32>, expected a float or a float32 tensor "
                                    r"of one element"),
        (torch.ones(1, dtype=torch.float16), ValueError, r"q_scale = <tensor \(1,\) torch.float16>"),
    ]:
        with pytest.raises(error, match=message):
            w.run(q, *kv, q_scale=value)
    # A 16-bit cache's K/V under an FP8 plan: named.
    if cls is PAGED:
        with pytest.raises(TypeError, match=r"paged_kv_cache\[0\].dtype = torch.bfloat16, but the plan was made for "
                                            r"kv_data_type = torch.float8_e4m3fn"):
            w.run(q, tuple(t.to(torch.bfloat16) for t in kv[0]))
    else:
        with pytest.raises(TypeError, match=r"k.dtype = torch.bfloat16, but the plan was made for kv_data_type"):
            w.run(q, kv[0].to(torch.bfloat16), kv[1])


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_16bit_plan_keeps_refusing_q_scale(stand_ins, cls, plan):
    w = cls(_ws())
    plan(w, q_data_type=torch.bfloat16)
    q = torch.zeros(4, 8, 128, dtype=torch.bfloat16)
    kv = ((torch.zeros(3, 16, 2, 128, dtype=torch.bfloat16),) * 2,) if cls is PAGED else \
        (torch.zeros(37, 2, 128, dtype=torch.bfloat16),) * 2
    with pytest.raises(NotImplementedError, match=r"q_scale=2.0 is not supported .*None or 1.0 \(scales apply"):
        w.run(q, *kv, q_scale=2.0)
    with pytest.raises(NotImplementedError, match=r"q_scale='<tensor \(1,\) torch.float32>'"):
        w.run(q, *kv, q_scale=torch.ones(1))
    out = w.run(q, *kv, q_scale=1.0)
    assert out.dtype == torch.bfloat16
    (args, kwargs) = w._holder.cpp.runs[-1]
    assert args[0] is q and kwargs == {"kv_dtype": None}  # no q_dtype: the binding of a 16-bit run is unchanged
    assert "q_scale_device" not in w._holder.cpp.plans[-1][1]


@pytest.mark.parametrize("cls,plan", WRAPPER_PLANS, ids=WRAPPER_IDS)
def test_wrapper_fp8_run_under_torch_compile(stand_ins, cls, plan):
    # Compiled (one graph: fullgraph), run() hands the bindings what the eager run() does: q as bytes
    # with q_dtype, out of the plan's o_data_type (allocated by the custom op), this call's scales in
    # the plan's scale tensors (tests/python/test_compile.py compares the two runs' values).
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("torch.compile support needs torch >= 2.4")
    import torch._dynamo as dynamo

    w, kv = _planned_fp8(cls, plan, o_data_type=torch.float16)
    runtime = w._holder.cpp
    q = torch.zeros(4, 8, 128).to(E4M3)

    def step(q, s):
        return w.run(q, *kv, q_scale=s, k_scale=2.0, v_scale=0.5, return_lse=True)

    def described(call):  # the binding call's tensors as (dtype, shape), the rest as they are
        args, kwargs = call
        return [(a.dtype, tuple(a.shape)) if isinstance(a, torch.Tensor) else a for a in args], kwargs

    eager = step(q, torch.tensor([0.25]))
    eager_call = described(runtime.runs[-1])
    w._kv_scales.buf.fill_(1.0)  # the compiled run writes its scales again (not skipped as unchanged)
    w._kv_scales.last = [None] * 3
    dynamo.reset()
    try:
        out, lse = torch.compile(step, fullgraph=True, backend="aot_eager")(q, torch.tensor([0.25]))
    finally:
        dynamo.reset()
    assert out.dtype == torch.float16 and out.shape == (4, 8, 128) and (out == 0.5).all() and (lse == 1.5).all()
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    assert w._kv_scales.buf.tolist() == [2.0, 0.5, 0.25]
    assert described(runtime.runs[-1]) == eager_call
    args, kwargs = runtime.runs[-1]
    assert args[0].dtype == torch.uint8 and kwargs == {"kv_dtype": _C.DType.e4m3, "q_dtype": _C.DType.e4m3}


# --- GPU -------------------------------------------------------------------------------------------

def _has_wgmma():
    return HAS_GPU and torch.cuda.get_device_capability() == (9, 0)


def _quantized(shape, scale, device):
    """(codes e4m3, what they stand for in fp32) for N(0, 1) values over `scale` (per tensor, or
    per KV head along dim 1 for a [H] tensor)."""
    x = torch.randn(*shape, device=device)
    s = scale if not isinstance(scale, torch.Tensor) else scale.view(1, -1, 1)
    codes = (x / s).to(E4M3)
    return codes, codes.float() * s


def _reference(q, k, v, causal, sm_scale):
    """fp32 q [qo, Hq, D], k, v [kv, Hkv, D] -> (o [qo, Hq, D], base-2 lse [qo, Hq])."""
    qo, hq, kv, hkv = q.shape[0], q.shape[1], k.shape[0], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        pos_q = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
        s = s.masked_fill(torch.arange(kv, device=q.device)[None, :] > pos_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, v), (lse / LN2).transpose(0, 1).contiguous()


@gpu
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("o_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_head", [False, True])
def test_matches_reference_on_dequantized_inputs(head_dim, causal, o_dtype, per_head):
    torch.manual_seed(head_dim + 2 * causal + 4 * per_head)
    dev = "cuda"
    qo, kv, hq, hkv = 301, 517, 8, 2
    if per_head:
        sq = torch.tensor([1 / 16, 3 / 32], device=dev)
        sk = torch.tensor([3 / 64, 1 / 16], device=dev)
    else:
        sq, sk = 1 / 16, 3 / 64
    sv = 1 / 32
    # q's scale per KV head applies to the group's query heads: expand it over them for the codes.
    sq_rows = sq.repeat_interleave(hq // hkv) if per_head else sq
    q8, qf = _quantized((qo, hq, head_dim), sq_rows, dev)
    k8, kf = _quantized((kv, hkv, head_dim), sk, dev)
    v8, vf = _quantized((kv, hkv, head_dim), sv, dev)
    call = lambda: tessera.single_prefill_with_kv_cache(  # noqa: E731
        q8, k8, v8, scale_q=sq, scale_k=sk, scale_v=sv, o_dtype=o_dtype, causal=causal, return_lse=True)
    if not _has_wgmma():
        with pytest.raises(NotImplementedError, match="sm_90a"):
            call()
        return
    out, lse = call()
    torch.cuda.synchronize()
    assert out.dtype == o_dtype and out.shape == (qo, hq, head_dim)
    ref_o, ref_lse = _reference(qf, kf, vf, causal, 1.0 / math.sqrt(head_dim))
    o = out.float()
    assert torch.isfinite(o).all()
    rel = ((o - ref_o).norm() / ref_o.norm()).item()
    assert rel <= REL_TOL, f"relative error {rel:.3g} > {REL_TOL}"
    finite = ~torch.isneginf(ref_lse)
    d = (lse[finite] - ref_lse[finite]).abs().max().item()
    assert d <= LSE_TOL, f"base-2 lse max abs error {d:.3g} > {LSE_TOL}"
    empty = ~finite
    assert (o[empty] == 0).all() and torch.isneginf(lse[empty]).all()


@gpu
def test_default_output_is_bfloat16():
    if not _has_wgmma():
        pytest.skip("FP8 attention runs on sm_90 only")
    q8, _ = _quantized((16, 4, 128), 1 / 16, "cuda")
    k8, _ = _quantized((40, 4, 128), 1 / 16, "cuda")
    out = tessera.single_prefill_with_kv_cache(q8, k8, k8)
    assert out.dtype == torch.bfloat16


# --- the batch prefill wrappers on the GPU ----------------------------------------------------------

# Requests of odd lengths (one query; a square causal block; a long one), KV at least as long as the
# queries, so every causal row sees keys: query i of a request sits at position kv_len - qo_len + i.
QO_LENS, KV_LENS = [1, 37, 300], [45, 37, 333]
HKV = 2
SCALES = (1 / 16, 3 / 64, 1 / 32)  # q's, K's, V's dequantization factors
# Per (head_dim, causal, group): o_data_type (None: the default, bfloat16), whether out= (and, with
# return_lse, lse=) are given poisoned with NaN, and return_lse; with the three KV formats and the
# two kinds of scales, every combination of these appears.
VARIATIONS = {
    (128, False, 1): (None, False, True),
    (128, False, 4): (torch.float16, True, True),
    (128, True, 1): (torch.bfloat16, True, False),
    (128, True, 4): (torch.float16, False, False),
    (256, False, 1): (torch.float16, True, False),
    (256, False, 4): (None, True, True),
    (256, True, 1): (torch.float16, False, True),
    (256, True, 4): (torch.bfloat16, False, True),
}
KINDS = {"paged_ps1": 1, "paged_ps16": 16, "ragged": None}  # page size (None: ragged KV)


@pytest.fixture(scope="module")
def workspace():
    """One 256 MiB float workspace for the wrapper tests (stream-ordered reuse is safe): the
    runtime sizes its split states for the largest tile at the bounds' head dim, about 150 MiB at
    head dim 256."""
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def _codes(shape, scale, gen, device):
    """(e4m3 codes on `device`, what they stand for in float64: codes x scale) for N(0, 1) values."""
    codes = (torch.randn(*shape, generator=gen) / scale).to(E4M3)
    return codes.to(device), codes.double().to(device) * scale


def _reference64(q, k, v, qo_lens, kv_lens, causal, sm_scale):
    """float64 q [sum(qo_lens), Hq, D] and k, v [sum(kv_lens), Hkv, D] (the requests' rows in order)
    -> o [sum(qo_lens), Hq, D] and the base-2 lse [sum(qo_lens), Hq]: per request and query head h
    (KV head h // (Hq / Hkv)), softmax(q k^T * sm_scale) v, keys after the query's position hidden
    with causal."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    q_at = kv_at = 0
    for qo, kv in zip(qo_lens, kv_lens):
        qb = q[q_at:q_at + qo]
        kb = k[kv_at:kv_at + kv].repeat_interleave(group, dim=1)
        vb = v[kv_at:kv_at + kv].repeat_interleave(group, dim=1)
        logits = torch.einsum("qhd,khd->hqk", qb, kb) * sm_scale
        if causal:
            position = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
            logits = logits.masked_fill(torch.arange(kv, device=q.device)[None, :] > position, float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", torch.exp(logits - lse[..., None]), vb))
        lses.append((lse / LN2).transpose(0, 1))
        q_at += qo
        kv_at += kv
    return torch.cat(outs), torch.cat(lses)


def _indptr(lens):
    return _i32([0] + [sum(lens[: i + 1]) for i in range(len(lens))])


def _paged(k8, v8, kv_lens, page_size, gen):
    """The requests' K/V codes (rows in request order) in an NHD paged cache under shuffled page ids,
    with finite e4m3 codes in the unused page slots and three spare pages (a kernel that reads
    them unmasked shows): ((k_cache, v_cache), indptr, indices, last_page_len)."""
    device, (_, hkv, d) = k8.device, k8.shape
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    total = sum(pages) + 3
    ids = torch.randperm(total, generator=gen)[: sum(pages)]
    caches = []
    for x in (k8, v8):  # as bytes: not every torch indexes fp8 tensors
        cache = (torch.randn(total, page_size, hkv, d, generator=gen) * 4).to(E4M3).view(torch.uint8)
        rows = x.view(torch.uint8).cpu()
        at, page = 0, 0
        for n, count in zip(kv_lens, pages):
            for j in range(count):
                m = min(page_size, n - j * page_size)
                cache[ids[page], :m] = rows[at + j * page_size: at + j * page_size + m]
                page += 1
            at += n
        caches.append(cache.view(E4M3).to(device))
    last = _i32([n - (c - 1) * page_size for n, c in zip(kv_lens, pages)])
    return tuple(caches), _indptr(pages), ids.to(torch.int32).to(device), last


def _planned_wrapper(kind, ws, k8, v8, hq, d, gen, **plan_kwargs):
    """(wrapper, plan(), its run()'s K/V arguments) for the requests QO_LENS / KV_LENS."""
    page_size = KINDS[kind]
    if page_size is None:
        w = RAGGED(ws)
        return w, lambda: w.plan(_indptr(QO_LENS), _indptr(KV_LENS), hq, HKV, d, **plan_kwargs), (k8, v8)
    cache, indptr, indices, last = _paged(k8, v8, KV_LENS, page_size, gen)
    w = PAGED(ws)
    return w, lambda: w.plan(_indptr(QO_LENS), indptr, indices, last, hq, HKV, d, page_size, **plan_kwargs), (cache,)


def _check_per_request(o, lse, ref_o, ref_lse, what):
    """o within REL_TOL relative error of the reference in every request; the base-2 LSE within LSE_TOL."""
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    at = 0
    for b, qo in enumerate(QO_LENS):
        got, want = o[at:at + qo].double(), ref_o[at:at + qo]
        rel = ((got - want).norm() / want.norm()).item()
        assert rel <= REL_TOL, f"{what}: request {b}: relative error {rel:.3g} > {REL_TOL}"
        at += qo
    if lse is not None:
        d = (lse.double() - ref_lse).abs().max().item()
        assert d <= LSE_TOL, f"{what}: base-2 lse max abs error {d:.3g} > {LSE_TOL}"


@gpu
@pytest.mark.parametrize("scales_as", ["float", "tensor"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("kind", list(KINDS))
def test_wrappers_match_reference_on_dequantized_inputs(workspace, kind, head_dim, causal, group, scales_as):
    o_dtype, give_out, return_lse = VARIATIONS[(head_dim, causal, group)]
    gen = torch.Generator().manual_seed(list(KINDS).index(kind) * 100 + head_dim + 2 * causal + 4 * group
                                        + 8 * (scales_as == "tensor"))
    hq, d, dev, rows = HKV * group, head_dim, "cuda", sum(QO_LENS)
    sq, sk, sv = SCALES
    q8, qf = _codes((rows, hq, d), sq, gen, dev)
    k8, kf = _codes((sum(KV_LENS), HKV, d), sk, gen, dev)
    v8, vf = _codes((sum(KV_LENS), HKV, d), sv, gen, dev)
    w, plan, kv = _planned_wrapper(kind, workspace, k8, v8, hq, d, gen, causal=causal, q_data_type=E4M3,
                                   kv_data_type=E4M3, o_data_type=o_dtype)
    if not _has_wgmma():
        with pytest.raises(NotImplementedError, match="sm_90a"):
            plan()
        return
    plan()
    scales = dict(q_scale=sq, k_scale=sk, v_scale=sv)
    if scales_as == "tensor":
        scales = {name: torch.tensor([value], dtype=torch.float32, device=dev) for name, value in scales.items()}
    expected_dtype = o_dtype or torch.bfloat16
    out = lse = None
    if give_out:
        out = torch.full((rows, hq, d), float("nan"), dtype=expected_dtype, device=dev)
        if return_lse:
            lse = torch.full((rows, hq), float("nan"), dtype=torch.float32, device=dev)
    result = w.run(q8, *kv, **scales, out=out, lse=lse, return_lse=return_lse)
    torch.cuda.synchronize()
    o, l = result if return_lse else (result, None)
    if give_out:
        assert o is out and (l is lse or not return_lse)
    assert o.dtype == expected_dtype and o.shape == (rows, hq, d)
    if return_lse:
        assert l.dtype == torch.float32 and l.shape == (rows, hq)
    ref_o, ref_lse = _reference64(qf, kf, vf, QO_LENS, KV_LENS, causal, 1.0 / math.sqrt(d))
    _check_per_request(o, l, ref_o, ref_lse, f"{kind} D{d} causal={causal} group={group} scales as {scales_as}")


@gpu
@pytest.mark.parametrize("kind", ["paged_ps16", "ragged"])
def test_wrappers_read_each_runs_scales(workspace, kind):
    # One plan, three runs of the same codes under other scales (floats, then one-element tensors,
    # then floats again): each output is its own call's (the scales live in the plan's device
    # tensors, which every run fills). The second q and k scales make the logits about 3x larger,
    # so a stale q or k scale shows, as a stale v scale does.
    gen = torch.Generator().manual_seed(77 + len(kind))
    hq, d, dev = 2 * HKV, 128, "cuda"
    code = 16.0  # codes of N(0, 16^2): _codes' dequantized values times 16 are the codes
    q8, qc = _codes((sum(QO_LENS), hq, d), 1 / code, gen, dev)
    k8, kc = _codes((sum(KV_LENS), HKV, d), 1 / code, gen, dev)
    v8, vc = _codes((sum(KV_LENS), HKV, d), 1 / code, gen, dev)
    w, plan, kv = _planned_wrapper(kind, workspace, k8, v8, hq, d, gen, causal=True, q_data_type=E4M3)
    if not _has_wgmma():
        pytest.skip("FP8 attention runs on sm_90 only")
    plan()
    for sq, sk, sv, as_tensor in [(1 / 16, 3 / 64, 1 / 32, False), (1 / 8, 1 / 16, 1 / 16, True),
                                  (1 / 16, 3 / 64, 1 / 32, False)]:
        scales = dict(q_scale=sq, k_scale=sk, v_scale=sv)
        if as_tensor:
            scales = {name: torch.tensor([value], dtype=torch.float32, device=dev) for name, value in scales.items()}
        o, l = w.run(q8, *kv, **scales, return_lse=True)
        torch.cuda.synchronize()
        assert o.dtype == torch.bfloat16
        ref_o, ref_lse = _reference64(qc * code * sq, kc * code * sk, vc * code * sv, QO_LENS, KV_LENS, True,
                                      1.0 / math.sqrt(d))
        _check_per_request(o, l, ref_o, ref_lse, f"{kind} scales {sq}, {sk}, {sv} as_tensor={as_tensor}")
