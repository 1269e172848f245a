"""tessera.PODWithPagedKVCacheWrapper: a batch mixing prefill chunks and decode requests, run by one
C++ runtime (tessera::BatchPODPagedWrapper) in one launch whose CTAs are divided between the two.

CPU: FlashInfer's signature, the constructor's and plan()'s named errors (every option POD does not
run is a NotImplementedError naming it, before any GPU work), and (with a stand-in for the C++
class that checks every call against the binding's signature in _C.pyi) what the wrapper hands the
runtime: a PodOptions, the host index arrays, the page table run() reads (with use_cuda_graph the
preallocated buffers, which plan() fills), and when the runtime is rebuilt. GPU (skipped without
CUDA): random mixed batches (1-3 prefill chunks of 17-600 tokens and 1-40 decode requests of 1-3
tokens, shuffled, in one paged cache with its pages in random order) over page sizes 1 and 16,
NHD and HND, causal on and off, float16 and bfloat16, GQA groups 1 and 4, head dims 64 and 128;
the split and SM options; a CUDA-graph serving loop whose captured run() is replayed after
re-plans of other mixes; and run() under torch.compile (one graph, the eager bits). Outputs and base-2 LSEs are checked per request against a float64
reference written from the mathematics (softmax(q k^T * sm_scale) v, causal offset kv_len -
qo_len). Tolerances as in test_gpu.py.
"""

import inspect
import math
import random
import types

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402
from tessera import _C  # noqa: E402
from tessera import _utils as U  # noqa: E402
from stand_ins import SignatureStandIn  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
W = tessera.PODWithPagedKVCacheWrapper
LN2 = math.log(2.0)
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _ws():
    """A workspace on the CPU: enough to construct the wrapper, never enough to plan."""
    return torch.empty(1 << 20, dtype=torch.uint8)


def _params(f):
    return [p for p in inspect.signature(f).parameters if p != "self"]


# A batch of three requests: a prefill chunk of 40 tokens (80 packed rows with a group of 2 > 16),
# two decode requests of 1 and 3 tokens.
PLAN = dict(qo_indptr=_i32([0, 40, 41, 44]), paged_kv_indptr=_i32([0, 4, 5, 7]),
            paged_kv_indices=_i32([6, 2, 0, 4, 1, 3, 5]), paged_kv_last_page_len=_i32([8, 16, 3]), num_qo_heads=4,
            num_kv_heads=2, head_dim_qk=128, page_size=16)


def _plan(w, **overrides):
    args = dict(PLAN)
    args.update(overrides)
    w.plan(**args)


# --- CPU: signature, exports, constructor and plan() errors ----------------------------------------


def test_signature_matches_flashinfer():
    assert _params(W.__init__) == [
        "float_workspace_buffer", "kv_layout", "use_cuda_graph", "qo_indptr_buf", "paged_kv_indptr_buf",
        "paged_kv_indices_buf", "paged_kv_last_page_len_buf", "custom_mask_buf", "mask_indptr_buf", "backend",
        "jit_args"]
    assert _params(W.plan)[:22] == [
        "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads", "num_kv_heads",
        "head_dim_qk", "page_size", "head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
        "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap", "rope_scale", "rope_theta",
        "q_data_type", "kv_data_type", "non_blocking"]
    assert inspect.signature(W.plan).parameters["non_blocking"].default is False  # FlashInfer's POD default
    for name in ("fixed_split_size", "disable_split_kv", "decode_sms"):  # Tessera's own
        assert inspect.signature(W.plan).parameters[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert _params(W.run)[:3] == ["q", "paged_kv_cache", "args"]
    for name in ("k_scale", "v_scale", "out", "lse", "return_lse"):
        assert inspect.signature(W.run).parameters[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert W.begin_forward is W.plan and W.forward is W.run and W.forward_return_lse is W.run_return_lse
    for name, member in inspect.getmembers(W):
        if (not name.startswith("_") or name == "__init__") and (callable(member) or isinstance(member, property)):
            assert inspect.getdoc(member), f"PODWithPagedKVCacheWrapper.{name} has no docstring"


def test_exported_like_the_other_wrappers():
    assert "PODWithPagedKVCacheWrapper" in tessera.__all__
    assert tessera.pod.PODWithPagedKVCacheWrapper is W and tessera.pod.__all__ == ["PODWithPagedKVCacheWrapper"]
    for name in ("BatchPODPagedWrapper", "PodOptions", "PodPlanInfo"):
        assert hasattr(_C, name), f"tessera._C has no {name}"
    options = _C.PodOptions()
    assert (options.cuda_graph, options.dtype, options.decode_sms, options.split_kv, options.fixed_split_size) == (
        False, _C.DType.bf16, 0, _C.SplitKV.auto, 0)


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="kv_layout = 'NDH', expected 'NHD' or 'HND'"):
        W(_ws(), "NDH")
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        W([0] * 16)
    with pytest.raises(NotImplementedError, match="backend"):
        W(_ws(), "NHD", backend="cudnn")
    for backend in ("auto", "fa2", "fa3"):  # FlashInfer's names, each mapped to Tessera's kernels
        W(_ws(), "NHD", backend=backend)
    with pytest.raises(NotImplementedError, match="jit_args"):
        W(_ws(), "HND", jit_args=["x"])
    with pytest.raises(NotImplementedError, match=r"custom_mask_buf=.* is not supported.*BatchPrefillWithPagedKVCache"):
        W(_ws(), custom_mask_buf=torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="mask_indptr_buf"):
        W(_ws(), mask_indptr_buf=_i32([0, 1]))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs qo_indptr_buf"):
        W(_ws(), "NHD", True)
    with pytest.raises(ValueError, match="use_cuda_graph=True needs paged_kv_indices_buf"):
        W(_ws(), "NHD", True, _i32([0] * 5), _i32([0] * 5), None, _i32([1] * 4))
    with pytest.raises(TypeError, match="paged_kv_indptr_buf.dtype = torch.int64"):
        W(_ws(), "NHD", True, _i32([0] * 5), torch.zeros(5, dtype=torch.int64), _i32([0] * 9), _i32([1] * 4))
    with pytest.raises(ValueError, match=r"paged_kv_indptr_buf has 4 entries, expected 5 \(the length of "
                                         r"qo_indptr_buf\)"):
        W(_ws(), "NHD", True, _i32([0] * 5), _i32([0] * 4), _i32([0] * 9), _i32([1] * 4))
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buf has 5 entries, expected 4"):
        W(_ws(), "NHD", True, _i32([0] * 5), _i32([0] * 5), _i32([0] * 9), _i32([1] * 5))
    assert W(_ws(), "NHD", True, _i32([0] * 5), _i32([0] * 5), _i32([0] * 9), _i32([1] * 4)).is_cuda_graph_enabled
    # Without use_cuda_graph the buffers are ignored, as in FlashInfer.
    assert not W(_ws(), "NHD", False, _i32([0] * 5), None, None, None).is_cuda_graph_enabled

    w = W(_ws(), "HND")
    q = torch.zeros(1, 8, 64, dtype=torch.float16)
    kv = torch.zeros(1, 2, 4, 16, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(q, kv)
    with pytest.raises(NotImplementedError, match="extra positional argument"):
        w.run(q, kv, 1.0)
    with pytest.raises(RuntimeError, match=r"plan\(\) has not been called yet"):
        w.plan_info()


# (plan() keyword overrides, exception, message): all raised before any GPU work.
PLAN_ERRORS = [
    (dict(custom_mask=torch.ones(16, dtype=torch.bool)), NotImplementedError,
     r"custom_mask='<tensor \(16,\) torch.bool>' is not supported by Tessera yet \(supported: None; "
     r"PODWithPagedKVCacheWrapper runs the default variant"),
    (dict(packed_custom_mask=torch.ones(400, dtype=torch.uint8)), NotImplementedError, "packed_custom_mask="),
    (dict(pos_encoding_mode="ROPE_LLAMA"), NotImplementedError, r"pos_encoding_mode='ROPE_LLAMA' is not supported"),
    (dict(pos_encoding_mode="ALIBI"), NotImplementedError, "pos_encoding_mode='ALIBI'"),
    (dict(pos_encoding_mode="ROPE_LLAMA31"), NotImplementedError, "pos_encoding_mode='ROPE_LLAMA31'"),
    (dict(pos_encoding_mode="ROPE"), ValueError, "pos_encoding_mode = 'ROPE'"),
    (dict(window_left=128), NotImplementedError, r"window_left=128 is not supported.*BatchPrefillWithPagedKVCache"),
    (dict(window_left=-2), ValueError, "window_left = -2"),
    (dict(logits_soft_cap=30.0), NotImplementedError, "logits_soft_cap=30.0 is not supported"),
    (dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    (dict(use_fp16_qk_reduction=True), NotImplementedError, "use_fp16_qk_reduction"),
    (dict(kv_data_type=torch.float8_e4m3fn), NotImplementedError,
     r"kv_data_type=torch.float8_e4m3fn is not supported.*fp8 caches included"),
    (dict(kv_data_type="e5m2"), NotImplementedError, "kv_data_type=torch.float8_e5m2"),
    (dict(kv_data_type="bfloat16"), NotImplementedError, "kv_data_type=torch.bfloat16"),
    (dict(q_data_type="float32"), TypeError, "q_data_type = torch.float32"),
    (dict(head_dim_vo=64), NotImplementedError, r"head_dim_vo=64 is not supported.*None or head_dim_qk \(128\)"),
    (dict(head_dim_qk=192, head_dim_vo=128), NotImplementedError, r"head_dim_vo=128.*head_dim_qk \(192\)"),
    (dict(head_dim_qk=80), NotImplementedError, "head_dim_qk=80"),
    (dict(num_qo_heads=6, num_kv_heads=4), ValueError, "num_qo_heads = 6 is not a multiple of num_kv_heads = 4"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(page_size=0), ValueError, "page_size = 0, expected >= 1"),
    (dict(sm_scale=-1.0), ValueError, "sm_scale"),
    (dict(fixed_split_size=100), ValueError, "fixed_split_size = 100 gives a split of 100 KV tokens"),
    (dict(decode_sms=-1), ValueError, "decode_sms = -1"),
    (dict(decode_sms=True), TypeError, "decode_sms must be an int, got bool"),
    (dict(decode_sms=2.0), TypeError, "decode_sms must be an int, got float"),
    (dict(qo_indptr=_i32([0, 40, 39, 44])), ValueError, r"qo_indptr\[2\] = 39, expected >= 40"),
    (dict(paged_kv_indptr=_i32([0, 4, 5])), ValueError, "paged_kv_indptr has 3 entries, expected 4"),
    (dict(paged_kv_indices=_i32([0, 1, 2])), ValueError, r"paged_kv_indices has 3 entries, expected >= "
                                                        r"paged_kv_indptr\[-1\] = 7"),
    (dict(paged_kv_last_page_len=torch.ones(3, dtype=torch.int64)), TypeError, "paged_kv_last_page_len.dtype"),
]


def _id(overrides):
    """A test id from plan() overrides (tensors by their dtype)."""
    def short(v):
        return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else str(v).replace("torch.", "")
    return "-".join(f"{k}={short(v)}" for k, v in overrides.items()) or "defaults"


@pytest.mark.parametrize("overrides,error,match", PLAN_ERRORS, ids=[_id(o) for o, _, _ in PLAN_ERRORS])
def test_plan_errors_name_the_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        _plan(W(_ws()), **overrides)


@pytest.mark.parametrize("overrides", [
    {}, dict(head_dim_vo=128), dict(logits_soft_cap=0.0), dict(window_left=-1), dict(pos_encoding_mode="NONE"),
    dict(rope_scale=2.0, rope_theta=5e5), dict(kv_data_type="float16"), dict(o_data_type=torch.float16),
    dict(causal=True, sm_scale=0.1), dict(decode_sms=None), dict(decode_sms=0), dict(decode_sms=20),
    dict(fixed_split_size=256), dict(disable_split_kv=True), dict(q_data_type="bfloat16", kv_data_type="bf16"),
], ids=_id)
def test_plan_accepts_what_pod_runs(overrides):
    # Every check passes; the plan stops at its first GPU step (the CPU workspace).
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        _plan(W(_ws()), **overrides)


# --- CPU: what reaches the C++ runtime (a stand-in checked against the binding's signature) -------


class _PodStandIn(SignatureStandIn):
    """Stands in for _C.BatchPODPagedWrapper (which needs a GPU): binds every call to the binding's
    signature (a TypeError when the wrapper's call would not reach the C++ method) and records it."""

    cpp_class = "BatchPODPagedWrapper"

    def __init__(self, workspace, bounds, options):
        self._check("__init__", self, workspace, bounds, options)
        assert isinstance(options, _C.PodOptions), f"options is a {type(options).__name__}, expected a PodOptions"
        self.workspace, self.bounds, self.options = workspace, bounds, options
        self._register()

    @classmethod
    def workspace_size(cls, *args, **kwargs):
        assert isinstance(args[1], _C.PodOptions)
        return super().workspace_size(*args, **kwargs)

    def plan(self, *args, **kwargs):
        self._check("plan", self, *args, **kwargs)
        for name, a in zip(("qo_indptr", "kv_indptr", "last_page_len"), args[:3]):
            assert a.device.type == "cpu" and a.dtype == torch.int32, f"{name}: HOST int32"
        self.plans.append((args, kwargs))

    def run(self, *args, **kwargs):
        self._check("run", self, *args, **kwargs)
        assert isinstance(args[4], _C.Layout)
        self.runs.append((args, kwargs))

    def plan_info(self):
        self._check("plan_info", self)
        return types.SimpleNamespace(num_prefill_requests=1, num_decode_requests=2, prefill_ctas=100, decode_ctas=32,
                                     decode_copies=2, prefill={"q_tile_rows": 128}, decode={"q_tile_rows": 16})


@pytest.fixture
def stand_in(monkeypatch):
    """_C.BatchPODPagedWrapper replaced by the stand-in and the device checks lifted, so plan() and
    run() go through on the CPU."""
    monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
    monkeypatch.setattr(U, "current_stream", lambda device: 0)
    monkeypatch.setattr(U, "device_index", lambda t: 0)
    cls = type("BatchPODPagedWrapper", (_PodStandIn,), {"instances": []})
    monkeypatch.setattr(_C, "BatchPODPagedWrapper", cls)
    return cls


def _cache(layout="NHD", dtype=torch.float16, pages=8):
    """A combined [pages, 2, ...] cache of PLAN's geometry (2 KV heads, page size 16, head dim 128)."""
    page = (16, 2, 128) if layout == "NHD" else (2, 16, 128)
    return torch.zeros((pages, 2) + page, dtype=dtype)


def test_one_runtime_with_pod_options(stand_in):
    ws = _ws()
    w = W(ws, "HND")
    _plan(w, causal=True, q_data_type="bfloat16")
    assert len(stand_in.instances) == 1
    runtime = stand_in.instances[0]
    assert runtime.workspace.data_ptr() == ws.data_ptr() and runtime.workspace.numel() == ws.numel()
    options = runtime.options
    assert (options.cuda_graph, options.dtype, options.decode_sms, options.split_kv, options.fixed_split_size) == (
        False, _C.DType.bf16, 0, _C.SplitKV.auto, 0)
    assert runtime.bounds.max_batch_size >= 3 and runtime.bounds.max_total_qo_tokens >= 44
    assert (runtime.bounds.num_qo_heads, runtime.bounds.num_kv_heads, runtime.bounds.head_dim) == (4, 2, 128)
    assert runtime.bounds.head_dim_vo == 0
    args, kwargs = runtime.plans[-1]
    assert [t.tolist() for t in args[:3]] == [[0, 40, 41, 44], [0, 4, 5, 7], [8, 16, 3]]
    assert args[3:8] == (16, 4, 2, 128, _C.DType.bf16)
    assert args[8] == pytest.approx(128 ** -0.5) and args[9] is True
    assert {k: v for k, v in kwargs.items() if v is not None} == {}, "no variant, fp8 or mask option reaches the plan"
    assert w.plan_info() == {"num_prefill_requests": 1, "num_decode_requests": 2, "prefill_ctas": 100,
                             "decode_ctas": 32, "decode_copies": 2, "prefill": {"q_tile_rows": 128}, "decode": {"q_tile_rows": 16}}

    cache = _cache("HND", torch.bfloat16)
    q = torch.zeros(44, 4, 128, dtype=torch.bfloat16)
    out = w.run(q, cache)  # the fast path
    assert out.shape == (44, 4, 128) and out.dtype == torch.bfloat16
    (rq, k, v, kv, layout, indices, o, lse, stream), kwargs = runtime.runs[-1]
    assert rq is q and o is out and lse is None and kwargs == {"kv_dtype": None}
    assert k is None and v is None and kv is cache and layout == _C.Layout.HND
    assert indices is PLAN["paged_kv_indices"]
    out2, lse2 = w.run_return_lse(q, (cache[:, 0], cache[:, 1]), k_scale=1.0, v_scale=None)
    (_, k, v, kv, _, _, o, lse, _), _ = runtime.runs[-1]
    assert o is out2 and lse is lse2 and lse2.shape == (44, 4) and lse2.dtype == torch.float32
    assert kv is None and k.shape == (8, 2, 16, 128)
    with pytest.raises(NotImplementedError, match="k_scale=2.0 is not supported"):
        w.run(q, cache, k_scale=2.0)
    with pytest.raises(NotImplementedError, match="v_scale"):
        w.run(q, cache, v_scale=0.5)
    with pytest.raises(ValueError, match=r"paged_kv_indices\[0\] = 6 is out of range \[0, 6\)"):
        w.run(q, _cache("HND", torch.bfloat16, pages=6))
    with pytest.raises(TypeError, match="q.dtype = torch.float16, but the plan was made for q_data_type = "
                                        "torch.bfloat16"):
        w.run(q.half(), cache)

    # A re-plan within the bounds keeps the runtime; new split options or decode_sms rebuild it.
    _plan(w, qo_indptr=_i32([0, 1, 2, 3]), causal=True, q_data_type="bfloat16")
    assert w._holder.builds == 1 and len(runtime.plans) == 2
    _plan(w, causal=True, q_data_type="bfloat16", decode_sms=24)
    assert w._holder.builds == 2 and stand_in.instances[-1].options.decode_sms == 24
    _plan(w, causal=True, q_data_type="bfloat16", decode_sms=24, fixed_split_size=256)
    options = stand_in.instances[-1].options
    assert w._holder.builds == 3 and (options.split_kv, options.fixed_split_size) == (_C.SplitKV.fixed, 256)
    _plan(w, causal=True, q_data_type="bfloat16", decode_sms=24, disable_split_kv=True)
    assert stand_in.instances[-1].options.split_kv == _C.SplitKV.none
    # A bigger batch grows the bounds (powers of two).
    _plan(w, qo_indptr=_i32([0, 100, 101, 104]), decode_sms=24, disable_split_kv=True)
    assert stand_in.instances[-1].bounds.max_total_qo_tokens == 128


def test_workspace_too_small_names_the_bytes(stand_in, monkeypatch):
    monkeypatch.setattr(stand_in, "needed", 1 << 28)
    with pytest.raises(ValueError, match=r"float_workspace_buffer has 1048576 bytes, but this plan needs 268435456 "
                                         r"bytes of workspace \(batch_size=3, query rows=44"):
        _plan(W(_ws()))
    assert not stand_in.instances


def test_cuda_graph_plans_fill_the_fixed_buffers(stand_in):
    qo_buf, kv_buf, ids_buf, last_buf = bufs = (_i32([-7] * 5), _i32([-7] * 5), _i32([-7] * 9), _i32([-7] * 4))
    w = W(_ws(), "NHD", True, *bufs)
    _plan(w, causal=True)
    runtime = stand_in.instances[0]
    assert runtime.options.cuda_graph and runtime.options.dtype == _C.DType.f16
    assert (runtime.bounds.max_batch_size, runtime.bounds.max_total_qo_tokens) == (4, 44)  # buffers, first plan
    assert qo_buf.tolist() == [0, 40, 41, 44, -7] and kv_buf.tolist() == [0, 4, 5, 7, -7]
    assert ids_buf.tolist() == [6, 2, 0, 4, 1, 3, 5, -7, -7] and last_buf.tolist() == [8, 16, 3, -7]
    cache = _cache()
    q = torch.zeros(44, 4, 128, dtype=torch.float16)
    out = torch.empty_like(q)
    assert w.run(q, cache, out=out) is out
    assert runtime.runs[-1][0][5] is ids_buf, "run() reads the fixed page-id buffer"

    # Another mix: 4 decode requests; page ids already in the fixed buffer are not copied.
    ids_buf[:4] = _i32([7, 6, 5, 4])
    w.plan(_i32([0, 1, 3, 4, 5]), _i32([0, 1, 2, 3, 4]), ids_buf, _i32([1, 2, 3, 4]), 4, 2, 128, 16, causal=True,
           non_blocking=True)
    assert qo_buf.tolist() == [0, 1, 3, 4, 5] and ids_buf[:4].tolist() == [7, 6, 5, 4]
    w.run(q, cache, out=out)
    assert runtime.runs[-1][0][5] is ids_buf and w._holder.builds == 1 and len(stand_in.instances) == 1

    # Beyond the buffers, the first plan's rows or its options: named errors before any GPU work.
    with pytest.raises(ValueError, match="batch_size 5 exceeds the 4 requests of the preallocated qo_indptr_buf"):
        w.plan(_i32([0, 1, 2, 3, 4, 5]), _i32([0, 1, 2, 3, 4, 5]), ids_buf, _i32([1] * 5), 4, 2, 128, 16)
    with pytest.raises(ValueError, match="paged_kv_indptr.-1. = 10 pages exceed the 9 entries of paged_kv_indices_buf"):
        w.plan(_i32([0, 1]), _i32([0, 10]), _i32(list(range(10))), _i32([1]), 4, 2, 128, 16)
    with pytest.raises(ValueError, match="45 query rows exceed the 44 of the first plan"):
        w.plan(_i32([0, 45]), _i32([0, 3]), _i32([0, 1, 2]), _i32([1]), 4, 2, 128, 16)
    with pytest.raises(ValueError, match="use_cuda_graph: this plan changes the dtype or the split options"):
        _plan(w, causal=True, decode_sms=24)
    with pytest.raises(ValueError, match="use_cuda_graph: this plan changes the dtype"):
        _plan(w, causal=True, q_data_type="bfloat16")
    with pytest.raises(ValueError, match="reset_workspace_buffer: not allowed with use_cuda_graph=True"):
        w.reset_workspace_buffer(_ws())


def test_reset_workspace_buffer_rebuilds_a_pod_runtime(stand_in):
    w = W(_ws())
    _plan(w)
    new_ws = torch.empty(2 << 20, dtype=torch.uint8)
    w.reset_workspace_buffer(new_ws, torch.empty(8, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(torch.zeros(44, 4, 128, dtype=torch.float16), _cache())
    _plan(w, decode_sms=8)
    runtime = stand_in.instances[-1]
    assert len(stand_in.instances) == 2 and runtime.workspace.data_ptr() == new_ws.data_ptr()
    assert isinstance(runtime.options, _C.PodOptions) and runtime.options.decode_sms == 8


# --- GPU -----------------------------------------------------------------------------------------


def _reference(q, k, v, causal, sm_scale):
    """q [qo, Hq, D], k/v [kv, Hkv, D] -> (o float64 [qo, Hq, D], base-2 lse float64 [qo, Hq]):
    softmax(q k^T * sm_scale) v with query head h reading KV head h // (Hq / Hkv), query i at
    position kv - qo + i under the causal mask."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        qo, kv = q.shape[0], k.shape[0]
        pos_q = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
        pos_k = torch.arange(kv, device=q.device)[None, :]
        s = s.masked_fill(pos_k > pos_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # natural log, [Hq, qo]
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    o = torch.einsum("hqk,khd->qhd", p, v)
    return o, (lse / LN2).transpose(0, 1)


def _assert_close(out, lse, ref_o, ref_lse, dtype, what):
    """Relative error of out, absolute error of the base-2 LSE (every row here sees a key)."""
    o = out.double()
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf (unwritten or wrong)"
    err = (o - ref_o).norm().item() / max(ref_o.norm().item(), 1e-30)
    assert err <= REL_TOL[dtype], f"{what}: relative error {err:.3g} > {REL_TOL[dtype]}"
    if lse is not None:
        assert torch.isfinite(lse).all(), f"{what}: lse has NaN/inf"
        d = (lse.double() - ref_lse).abs().max().item()
        assert d <= LSE_TOL[dtype], f"{what}: base-2 lse max abs error {d:.3g} > {LSE_TOL[dtype]}"


def _mix(rng, max_prefill=3, max_decode=40):
    """A chunked-prefill step: 1-3 prefill chunks of 17-600 tokens (after a prefix of 0-1000 cached
    tokens) and 1-40 decode requests of 1-3 tokens (over 0-2000 earlier tokens), shuffled:
    [(kind, qo_len, kv_len)]."""
    reqs = []
    for _ in range(rng.randint(1, max_prefill)):
        qo = rng.randint(17, 600)
        reqs.append(("prefill", qo, qo + rng.choice([0, rng.randint(1, 1000)])))
    for _ in range(rng.randint(1, max_decode)):
        qo = rng.randint(1, 3)
        reqs.append(("decode", qo, qo + rng.randint(0, 2000)))
    rng.shuffle(reqs)
    return reqs


class _Pool:
    """One paged cache in `layout` (k and v [num_pages, ...] or one [num_pages, 2, ...] tensor),
    random contents, whose pages are handed to requests in a random order."""

    def __init__(self, num_pages, page_size, hkv, d, dtype, layout, combined, seed):
        self.page_size, self.layout = page_size, layout
        page = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        kv = torch.randn((num_pages, 2) + page, generator=gen, device="cuda").to(dtype)
        if combined:
            self.cache = kv
            self.k, self.v = kv[:, 0], kv[:, 1]
        else:
            self.k, self.v = kv[:, 0].contiguous(), kv[:, 1].contiguous()
            self.cache = (self.k, self.v)
        self.perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()

    def page_table(self, kv_lens):
        """(paged_kv_indptr, paged_kv_indices on the GPU, paged_kv_last_page_len) of fresh pages."""
        pages = [math.ceil(n / self.page_size) for n in kv_lens]
        assert sum(pages) <= len(self.perm), "pool too small"
        indptr = [0]
        for n in pages:
            indptr.append(indptr[-1] + n)
        last = [n - (p - 1) * self.page_size for n, p in zip(kv_lens, pages)]
        return _i32(indptr), _i32(self.perm[: indptr[-1]], "cuda"), _i32(last)

    def request_kv(self, indptr, indices, kv_len, b):
        """K, V of request b as [kv_len, Hkv, D]."""
        ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
        out = []
        for t in (self.k, self.v):
            pages = t[ids]
            if self.layout == "HND":
                pages = pages.permute(0, 2, 1, 3)
            out.append(pages.reshape(-1, pages.shape[2], pages.shape[3])[:kv_len])
        return out


def _pool_pages(reqs, page_size):
    return sum(math.ceil(kv / page_size) for _, _, kv in reqs) + 7


def _check_batch(out, lse, q, qo_indptr, reqs, pool, indptr, indices, causal, dtype, what):
    scale = 1 / math.sqrt(q.shape[2])
    for b, (kind, qo, kv) in enumerate(reqs):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = pool.request_kv(indptr, indices, kv, b)
        ref_o, ref_lse = _reference(q[lo:hi], k, v, causal, scale)
        _assert_close(out[lo:hi], None if lse is None else lse[lo:hi], ref_o, ref_lse, dtype,
                      f"{what} request {b} ({kind}, qo_len {qo}, kv_len {kv})")


@pytest.fixture(scope="module")
def workspace():
    """One 256 MiB float workspace shared by the tests (stream-ordered reuse is safe): POD keeps
    both sides' plans and split states in it."""
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_batch_matches_reference(page_size, layout, causal, dtype, group, head_dim, workspace):
    seed = (page_size * 1000 + (layout == "HND") * 100 + causal * 50 + (dtype == torch.bfloat16) * 20
            + group * 3 + head_dim)
    rng = random.Random(seed)
    hkv = 2
    hq = hkv * group
    reqs = _mix(rng)
    pool = _Pool(_pool_pages(reqs, page_size), page_size, hkv, head_dim, dtype, layout,
                 combined=(layout == "NHD") == (page_size == 16), seed=seed)
    indptr, indices, last = pool.page_table([kv for _, _, kv in reqs])
    qo_indptr = [0]
    for _, qo, _ in reqs:
        qo_indptr.append(qo_indptr[-1] + qo)
    rows = qo_indptr[-1]
    w = W(workspace, layout)
    # Index arrays on the GPU, as engines keep them (plan() copies what it reads to the host).
    w.plan(_i32(qo_indptr, "cuda"), indptr.cuda(), indices, last.cuda(), hq, hkv, head_dim, page_size, causal=causal,
           q_data_type=dtype)
    info = w.plan_info()
    n_prefill = sum(kind == "prefill" for kind, _, _ in reqs)
    assert (info["num_prefill_requests"], info["num_decode_requests"]) == (n_prefill, len(reqs) - n_prefill)
    assert info["prefill_ctas"] > 0 and info["decode_ctas"] > 0 and info["decode_copies"] >= 1, info
    assert info["decode"]["grid_cols"] * hkv <= info["decode_ctas"] * info["decode_copies"], info
    assert info["prefill"]["grid_cols"] > 0 and info["decode"]["grid_cols"] > 0, info

    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(rows, hq, head_dim, generator=gen, device="cuda").to(dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((rows, hq), float("nan"), dtype=torch.float32, device="cuda")
    res = w.run(q, pool.cache, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    what = f"page_size {page_size} {layout} causal {causal} {dtype} group {group} head_dim {head_dim}"
    _check_batch(out, lse, q, qo_indptr, reqs, pool, indptr, indices, causal, dtype, what)
    # The same plan again ("the next layer"), through run()'s fast path: the same bits.
    again = w.run(q, pool.cache)
    assert again.shape == q.shape and torch.equal(again, out), f"{what}: two runs of one plan differ"


@gpu
@pytest.mark.parametrize("options", [dict(decode_sms=16), dict(decode_sms=64), dict(disable_split_kv=True),
                                     dict(fixed_split_size=256), dict(fixed_split_size=1024, decode_sms=8)],
                         ids=_id)
def test_split_and_sm_options(options, workspace):
    rng = random.Random(77)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.bfloat16
    reqs = _mix(rng)
    pool = _Pool(_pool_pages(reqs, ps), ps, hkv, d, dtype, "NHD", True, 77)
    indptr, indices, last = pool.page_table([kv for _, _, kv in reqs])
    qo_indptr = [0]
    for _, qo, _ in reqs:
        qo_indptr.append(qo_indptr[-1] + qo)
    w = W(workspace)
    w.plan(_i32(qo_indptr), indptr, indices, last, hq, hkv, d, ps, causal=True, q_data_type=dtype, **options)
    info = w.plan_info()
    assert info["decode_ctas"] > 0 and info["decode"]["grid_cols"] >= 1, info
    if options.get("disable_split_kv"):
        assert info["prefill"]["num_merges"] == 0 and info["decode"]["num_merges"] == 0, info
    q = torch.randn(qo_indptr[-1], hq, d, generator=torch.Generator(device="cuda").manual_seed(78),
                    device="cuda").to(dtype)
    out, lse = w.run_return_lse(q, pool.cache)
    _check_batch(out, lse, q, qo_indptr, reqs, pool, indptr, indices, True, dtype, str(options))


@gpu
def test_cuda_graph_replays_after_replans():
    """run() captured once after the first plan (its mix has the most query rows: they fix q and
    out), replayed after 3 re-plans of other mixes; an eager wrapper runs the same plans. Both
    against the reference, two replays of one plan against each other."""
    rng = random.Random(2025)
    hq, hkv, d, ps, dtype, causal = 8, 2, 128, 16, torch.bfloat16, True
    first = [("prefill", 600, 1600)] * 3 + [("decode", 3, 2003)] * 40
    rng.shuffle(first)
    steps = [first] + [_mix(rng) for _ in range(3)]
    max_batch = 43
    max_pages = max(_pool_pages(s, ps) for s in steps)
    pool = _Pool(max_pages + 64, ps, hkv, d, dtype, "NHD", False, 2025)
    bufs = (torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda"),
            torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda"),
            torch.zeros(max_pages, dtype=torch.int32, device="cuda"),
            torch.zeros(max_batch, dtype=torch.int32, device="cuda"))
    graph_w = W(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", True, *bufs)
    eager_w = W(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD")

    def plan(wrapper, reqs):
        shuffle = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
        pool.perm = torch.randperm(len(pool.perm), generator=shuffle).tolist()  # other pages at every plan
        indptr, indices, last = pool.page_table([kv for _, _, kv in reqs])
        qo_indptr = [0]
        for _, qo, _ in reqs:
            qo_indptr.append(qo_indptr[-1] + qo)
        wrapper.plan(_i32(qo_indptr), indptr, indices, last, hq, hkv, d, ps, causal=causal, q_data_type=dtype)
        return qo_indptr, indptr, indices

    qo_indptr, _, _ = plan(graph_w, steps[0])
    rows = qo_indptr[-1]
    gen = torch.Generator(device="cuda").manual_seed(1)
    q_buf = torch.randn(rows, hq, d, generator=gen, device="cuda").to(dtype)
    out_buf = torch.zeros(rows, hq, d, dtype=dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph_w.run(q_buf, pool.cache, out=out_buf)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_w.run(q_buf, pool.cache, out=out_buf)

    for i, reqs in enumerate(steps):
        qo_indptr, indptr, indices = plan(graph_w, reqs)  # outside the capture
        n = qo_indptr[-1]
        assert n <= rows
        n_prefill = sum(kind == "prefill" for kind, _, _ in reqs)
        info = graph_w.plan_info()
        assert (info["num_prefill_requests"], info["num_decode_requests"]) == (n_prefill, len(reqs) - n_prefill)
        q_buf.copy_(torch.randn(rows, hq, d, generator=gen, device="cuda").to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        first_replay = out_buf[:n].clone()
        graph.replay()
        assert torch.equal(first_replay, out_buf[:n]), f"step {i}: two replays of one plan differ"
        _check_batch(out_buf, None, q_buf, qo_indptr, reqs, pool, indptr, indices, causal, dtype, f"step {i} (graph)")
        qo_indptr, indptr, indices = plan(eager_w, reqs)  # the same mix over other pages
        eager = eager_w.run(q_buf[:n], pool.cache)
        _check_batch(eager, None, q_buf, qo_indptr, reqs, pool, indptr, indices, causal, dtype, f"step {i} (eager)")
    assert graph_w._holder.builds == 1


@gpu
@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.compile support needs torch >= 2.4")
def test_run_compiles_into_one_graph(workspace):
    """Under torch.compile run() is the op tessera::prefill_paged_run (tessera/_ops.py), which runs
    this wrapper's runtime: one graph without breaks, the eager run's bits."""
    import torch._dynamo

    rng = random.Random(5)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.bfloat16
    reqs = _mix(rng, max_decode=8)
    pool = _Pool(_pool_pages(reqs, ps), ps, hkv, d, dtype, "HND", False, 5)
    indptr, indices, last = pool.page_table([kv for _, _, kv in reqs])
    qo_indptr = [0]
    for _, qo, _ in reqs:
        qo_indptr.append(qo_indptr[-1] + qo)
    w = W(workspace, "HND")
    w.plan(_i32(qo_indptr), indptr, indices, last, hq, hkv, d, ps, causal=True, q_data_type=dtype)
    q = torch.randn(qo_indptr[-1], hq, d, generator=torch.Generator(device="cuda").manual_seed(6),
                    device="cuda").to(dtype)

    def step(q):
        out, lse = w.run(q, pool.cache, return_lse=True)
        return out, lse

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(q)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, str(explanation)
    torch._dynamo.reset()
    eager = step(q)
    compiled = torch.compile(step, fullgraph=True)(q)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    _check_batch(compiled[0], compiled[1], q, qo_indptr, reqs, pool, indptr, indices, True, dtype, "compiled")


@gpu
def test_workspace_too_small_names_the_bytes_on_the_gpu():
    w = W(torch.empty(1 << 16, dtype=torch.uint8, device="cuda"))
    plan = dict(PLAN, paged_kv_indices=PLAN["paged_kv_indices"].cuda())
    with pytest.raises(ValueError, match=r"float_workspace_buffer has 65536 bytes, but this plan needs \d+ bytes of "
                                         r"workspace \(batch_size=3, query rows=44"):
        w.plan(**plan)
