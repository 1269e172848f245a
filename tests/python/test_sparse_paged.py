"""Tests of BlockSparsePagedAttentionWrapper (python/tessera/sparse.py): block masks at each
request's logical key positions over a paged KV cache, one C++ runtime
(tessera::BatchBlockSparsePagedWrapper).

CPU: the signature, the constructor's and plan()'s named errors (the host checks of the block
mask included), and, with a stand-in for the C++ class that checks every call against the
binding's signature in _C.pyi, what the wrapper hands the runtime: host index arrays, bounds that
cover the requests and the block rows, device copies of the mask, the page ids and mask of the
preallocated buffers with use_cuda_graph, an fp8 cache as bytes. GPU (skipped without CUDA):
random batches (odd lengths, an empty request, a request without keys, page sizes 1 and 16, GQA
groups 1 and 4, causal and not, a window, a soft cap, NHD and HND, (k, v) and combined caches)
under random block masks, with and without flags on blocks that are fully visible, against a
float64 reference that gathers each request's K/V from its pages and expands its listed blocks
into a dense mask (then causal / window at logical positions kv_len - qo_len + i); an fp8 cache;
and a CUDA graph captured once and replayed after re-plans of other batches and masks.
Tolerances as in test_gpu.py: ||out - ref|| / ||ref|| <= 4e-3 (fp16) / 1e-2 (bf16), base-2 LSE
absolute error <= 1e-3 / 8e-3; rows that see no key: 0 and -inf exactly.
"""

import inspect
import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402
from tessera import _C  # noqa: E402
from tessera import _utils as U  # noqa: E402
from stand_ins import SignatureStandIn  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
W = tessera.BlockSparsePagedAttentionWrapper
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
LN2 = math.log(2.0)


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _ws():
    """A workspace on the CPU: enough to construct the wrapper, never enough to plan."""
    return torch.empty(1 << 20, dtype=torch.uint8)


# Two requests of 70 and 3 queries over 300 and 100 keys in pages of 16 (19 and 7 pages), blocks of
# 64 x 64: block rows 0-1 are request 0's (5 column blocks), block row 2 request 1's (2 blocks).
BATCH = dict(
    qo_indptr=_i32([0, 70, 73]),
    paged_kv_indptr=_i32([0, 19, 26]),
    paged_kv_indices=_i32(list(range(25, -1, -1))),
    paged_kv_last_page_len=_i32([12, 4]),
    mask_indptr=_i32([0, 3, 5, 7]),
    mask_indices=_i32([0, 2, 4, 1, 4, 0, 1]),
    num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16, block_rows=64, block_cols=64,
)


def _batch(**overrides):
    args = dict(BATCH)
    args.update(overrides)
    return args


# --- CPU: signature, exports, constructor and plan() errors --------------------------------------


def test_signature():
    params = lambda f: [p for p in inspect.signature(f).parameters if p != "self"]  # noqa: E731
    assert params(W.__init__) == ["float_workspace_buffer", "kv_layout", "use_cuda_graph", "backend",
                                  "paged_kv_indices_buf", "mask_indices_buf"]
    assert params(W.plan) == [
        "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "mask_indptr", "mask_indices",
        "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "block_rows", "block_cols", "mask_flags", "causal",
        "sm_scale", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "fixed_split_size",
        "disable_split_kv", "variant"]
    assert params(W.run) == ["q", "paged_kv_cache", "out", "lse", "return_lse", "k_scale", "v_scale"]
    keyword_only = lambda f: [n for n, p in inspect.signature(f).parameters.items()  # noqa: E731
                              if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only(W.__init__) == ["paged_kv_indices_buf", "mask_indices_buf"]
    assert keyword_only(W.plan)[0] == "mask_flags" and keyword_only(W.run) == ["k_scale", "v_scale"]
    assert W.begin_forward is W.plan and W.forward is W.run


def test_exported_and_documented():
    assert "BlockSparsePagedAttentionWrapper" in tessera.__all__
    assert tessera.sparse.BlockSparsePagedAttentionWrapper is W
    assert tessera.sparse.__all__ == ["BlockSparseAttentionWrapper", "BlockSparsePagedAttentionWrapper",
                                      "paged_block_mask"]
    assert "paged_block_mask" in tessera.__all__ and inspect.getdoc(tessera.paged_block_mask)
    assert inspect.getdoc(W)
    for name, member in inspect.getmembers(W):
        if (not name.startswith("_") or name == "__init__") and (callable(member) or isinstance(member, property)):
            assert inspect.getdoc(member), f"BlockSparsePagedAttentionWrapper.{name} has no docstring"


def test_constructor_errors():
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        W([0] * 8)
    with pytest.raises(ValueError, match="kv_layout = 'NDH', expected 'NHD' or 'HND'"):
        W(_ws(), "NDH")
    with pytest.raises(NotImplementedError, match="backend"):
        W(_ws(), backend="cudnn")
    with pytest.raises(ValueError, match="use_cuda_graph=True needs paged_kv_indices_buf"):
        W(_ws(), use_cuda_graph=True, mask_indices_buf=_i32([0]))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs mask_indices_buf"):
        W(_ws(), use_cuda_graph=True, paged_kv_indices_buf=_i32([0]))
    with pytest.raises(TypeError, match=r"mask_indices_buf.dtype = torch.int64, expected torch.int32"):
        W(_ws(), use_cuda_graph=True, paged_kv_indices_buf=_i32([0]), mask_indices_buf=torch.zeros(4).long())
    W(_ws(), mask_indices_buf=torch.zeros(4).long())  # ignored without use_cuda_graph


@pytest.mark.parametrize("overrides, error, match", [
    (dict(mask_indptr=_i32([0, 3, 5])), ValueError,
     r"mask_indptr has 3 entries, expected 4 \(the block rows of the requests, sum of ceil\(qo_len / block_rows\) = 3"),
    (dict(mask_indptr=_i32([0, 3, 2, 7])), ValueError, r"mask_indptr\[2\] = 2, expected >= 3"),
    (dict(mask_indices=_i32([0, 2, 4, 1, 4, 0])), ValueError, r"mask_indices has 6 entries, expected >= mask_indptr"),
    (dict(mask_indices=_i32([0, 2, 4, 1, 4, 0, 2])), ValueError,
     r"mask_indices\[6\] = 2 is out of range \[0, 2\) \(block row 2; ceil\(kv_len / block_cols\) of its request = 2\)"),
    (dict(mask_indices=_i32([0, 2, 5, 1, 4, 0, 1])), ValueError,
     r"mask_indices\[2\] = 5 is out of range \[0, 5\) \(block row 0"),
    (dict(mask_indices=_i32([0, 2, 4, 4, 1, 0, 1])), ValueError, r"mask_indices\[4\] = 1 does not increase"),
    (dict(mask_indices=_i32([0, 2, 4, 1, 4, 0, 1]).long()), TypeError, r"mask_indices.dtype = torch.int64"),
    (dict(mask_flags=torch.ones(7, dtype=torch.int32)), TypeError, r"mask_flags.dtype = torch.int32"),
    (dict(mask_flags=torch.ones(6, dtype=torch.uint8)), ValueError, r"mask_flags has 6 entries, expected >= "),
    (dict(mask_flags=torch.ones(7, 1, dtype=torch.uint8)), ValueError, r"mask_flags has shape \(7, 1\)"),
    (dict(block_rows=0), ValueError, r"block_rows = 0, expected >= 1"),
    (dict(block_cols=True), TypeError, r"block_cols must be an int"),
    (dict(paged_kv_indices=_i32(list(range(25)))), ValueError, r"paged_kv_indices has 25 entries, expected >= "),
    (dict(paged_kv_last_page_len=_i32([12])), ValueError, r"paged_kv_last_page_len has 1 entries, expected 2"),
    (dict(num_qo_heads=6, num_kv_heads=4), ValueError, r"num_qo_heads = 6 is not a multiple of num_kv_heads = 4"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(window_left=-2), ValueError, "window_left"),
    (dict(q_data_type=torch.float32), TypeError, "q_data_type = torch.float32"),
    (dict(fixed_split_size=100), ValueError, "a positive multiple of 128"),
    (dict(variant=tessera.VariantSpec("weights", "", use_softmax=False)), NotImplementedError,
     r"use_softmax=False, which BlockSparsePagedAttentionWrapper does not support yet"),
], ids=["mask_indptr_length", "mask_indptr_decreasing", "mask_indices_short", "mask_indices_past_request",
        "mask_indices_past_row", "mask_indices_order", "mask_indices_dtype", "mask_flags_dtype", "mask_flags_short",
        "mask_flags_ndim", "block_rows", "block_cols", "paged_kv_indices_short", "paged_kv_last_page_len",
        "heads", "causal", "window_left", "q_data_type", "fixed_split_size", "no_softmax"])
def test_plan_errors_name_the_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        W(_ws()).plan(**_batch(**overrides))


def test_a_valid_plan_passes_the_host_checks():
    # Every check passes; the first GPU step (building the runtime over the workspace) refuses the CPU.
    flags = torch.tensor([1, 0, 0, 1, 0, 0, 1], dtype=torch.bool)
    for extra in ({}, {"mask_flags": flags}, {"mask_indices": _i32([0, 2, 4, 1, 4, 0, 1, 99])}):
        with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
            W(_ws()).plan(**_batch(**extra), causal=True)


# --- CPU: what reaches the C++ runtime (a stand-in checked against the binding's signature) -------


class _StandIn(SignatureStandIn):
    """Stands in for _C.BatchBlockSparsePagedWrapper (which needs a GPU): binds every call to the
    binding's signature (a TypeError when the wrapper's call would not reach the C++ method) and
    records it."""

    cpp_class = "BatchBlockSparsePagedWrapper"

    def __init__(self, workspace, bounds, options):
        self._check("__init__", self, workspace, bounds, options)
        self.workspace, self.bounds, self.options = workspace, bounds, options
        self._register()

    @classmethod
    def min_workspace_size(cls, *args, **kwargs):
        cls._check("min_workspace_size", *args, **kwargs)
        return cls.needed

    def plan(self, *args, **kwargs):
        self._check("plan", self, *args, **kwargs)
        for name, a in zip(("qo_indptr", "kv_indptr", "last_page_len", "page_size", "mask_indptr"), args[:5]):
            if name != "page_size":
                assert a.device.type == "cpu" and a.dtype == torch.int32 and a.is_contiguous(), f"{name}: HOST int32"
        self.plans.append((args, kwargs))

    def run(self, *args, **kwargs):
        self._check("run", self, *args, **kwargs)
        assert isinstance(args[4], _C.Layout)
        self.runs.append((args, kwargs))

    def plan_info(self):
        self._check("plan_info", self)
        return {"stand_in": True}


@pytest.fixture
def stand_in(monkeypatch):
    """_C.BatchBlockSparsePagedWrapper replaced by the stand-in, _C.VariantArgs by the dict of its
    keywords, and the device checks lifted, so plan() and run() go through on the CPU."""
    monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
    monkeypatch.setattr(U, "current_stream", lambda device: 0)
    monkeypatch.setattr(U, "device_index", lambda t: 0)
    monkeypatch.setattr(_C, "VariantArgs", lambda **kwargs: kwargs)
    cls = type("BatchBlockSparsePagedWrapper", (_StandIn,), {"instances": []})
    monkeypatch.setattr(_C, "BatchBlockSparsePagedWrapper", cls, raising=False)
    return cls


def _q(rows=73, dtype=torch.float16):
    return torch.zeros(rows, 8, 128, dtype=dtype)


def test_one_runtime_over_the_callers_workspace(stand_in):
    ws = _ws()
    w = W(ws, "HND")
    flags = torch.tensor([1, 0, 0, 1, 0, 0, 1], dtype=torch.bool)
    w.plan(**_batch(), mask_flags=flags, causal=True, q_data_type="bfloat16")
    assert len(stand_in.instances) == 1
    runtime = stand_in.instances[0]
    assert runtime.workspace.data_ptr() == ws.data_ptr() and runtime.workspace.numel() == ws.numel()
    # max_batch_size bounds both the 2 requests and the 3 block rows.
    assert runtime.bounds.max_batch_size >= 3 and runtime.bounds.max_total_qo_tokens >= 73
    assert runtime.options.dtype == _C.DType.bf16 and not runtime.options.cuda_graph
    args, kwargs = runtime.plans[-1]
    qo, kv, last, page_size, mask_indptr = args[:5]
    assert qo.tolist() == [0, 70, 73] and kv.tolist() == [0, 19, 26] and last.tolist() == [12, 4]
    assert page_size == 16 and mask_indptr.tolist() == [0, 3, 5, 7]
    assert args[5:11] == (64, 64, 8, 2, 128, _C.DType.bf16)
    assert args[11] == pytest.approx(128 ** -0.5) and args[12] is True
    assert kwargs == {"kv_dtype": None}  # the default variant: no VariantArgs
    assert w.plan_info() == {"stand_in": True}

    cache = torch.zeros(26, 2, 2, 16, 128, dtype=torch.bfloat16)  # HND, combined
    out, lse = w.run(_q(dtype=torch.bfloat16), cache, return_lse=True)
    assert out.shape == (73, 8, 128) and out.dtype == torch.bfloat16 and lse.shape == (73, 8)
    (q, k, v, kv_arg, layout, pages, blocks, run_flags, o, l, stream), kwargs = runtime.runs[-1]
    assert k is None and v is None and kv_arg is cache and layout == _C.Layout.HND
    assert pages.tolist() == BATCH["paged_kv_indices"].tolist() and o is out and l is lse
    assert blocks.dtype == torch.int32 and blocks.tolist() == BATCH["mask_indices"].tolist()
    assert run_flags.dtype == torch.uint8 and run_flags.tolist() == [1, 0, 0, 1, 0, 0, 1]
    assert kwargs == {"kv_dtype": None}

    # Another layer with (k, v) and caller-given out; without return_lse only out comes back.
    k_cache, v_cache = torch.zeros(26, 2, 16, 128, dtype=torch.bfloat16), torch.zeros(26, 2, 16, 128,
                                                                                       dtype=torch.bfloat16)
    given = torch.empty(73, 8, 128, dtype=torch.bfloat16)
    assert w.run(_q(dtype=torch.bfloat16), (k_cache, v_cache), out=given) is given
    (_, k, v, kv_arg, *_rest), _ = runtime.runs[-1]
    assert k is k_cache and v is v_cache and kv_arg is None and _rest[-2] is None  # no lse

    # A re-plan within the bounds keeps the runtime; no flags reach run() as None.
    w.plan(**_batch(), q_data_type="bfloat16")
    w.run(_q(dtype=torch.bfloat16), cache)
    assert w._holder.builds == 1 and runtime.runs[-1][0][7] is None


def test_options_reach_the_runtime(stand_in):
    w = W(_ws())
    w.plan(**_batch(), window_left=100, logits_soft_cap=30.0, sm_scale=0.25, fixed_split_size=256)
    runtime = stand_in.instances[-1]
    args, kwargs = runtime.plans[-1]
    assert args[11] == 0.25 and args[12] is False
    assert kwargs["variant"]["window_left"] == 100 and kwargs["variant"]["logits_soft_cap"] == 30.0
    assert runtime.options.split_kv == _C.SplitKV.fixed and runtime.options.fixed_split_size == 256
    w.plan(**_batch(), disable_split_kv=True)
    assert stand_in.instances[-1].options.split_kv == _C.SplitKV.none


def test_run_checks_name_the_argument(stand_in):
    w = W(_ws())
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(_q(), torch.zeros(26, 2, 16, 2, 128, dtype=torch.float16))
    w.plan(**_batch())
    with pytest.raises(ValueError, match=r"paged_kv_indices\[0\] = 25 is out of range \[0, 25\)"):
        w.run(_q(), torch.zeros(25, 2, 16, 2, 128, dtype=torch.float16))
    with pytest.raises(ValueError, match="the plan was made for page_size 16"):
        w.run(_q(), torch.zeros(26, 2, 8, 2, 128, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"q.dtype = torch.bfloat16, but the plan was made for q_data_type"):
        w.run(_q(dtype=torch.bfloat16), torch.zeros(26, 2, 16, 2, 128, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out has shape \(73, 8, 64\)"):
        w.run(_q(), torch.zeros(26, 2, 16, 2, 128, dtype=torch.float16), out=torch.empty(73, 8, 64,
                                                                                         dtype=torch.float16))
    with pytest.raises(NotImplementedError, match="k_scale"):
        w.run(_q(), torch.zeros(26, 2, 16, 2, 128, dtype=torch.float16), k_scale=2.0)


def test_empty_mask_and_page_table_get_arrays(stand_in):
    """A batch that lists no block and has no pages: the runtime reads no entry of its arrays, but
    wants ones that exist."""
    w = W(_ws())
    w.plan(**_batch(qo_indptr=_i32([0, 5]), paged_kv_indptr=_i32([0, 0]), paged_kv_indices=_i32([]),
                    paged_kv_last_page_len=_i32([0]), mask_indptr=_i32([0, 0]), mask_indices=_i32([])),
           mask_flags=torch.zeros(0, dtype=torch.uint8))
    w.run(_q(5), torch.zeros(1, 2, 16, 2, 128, dtype=torch.float16))
    (_, _, _, _, _, pages, blocks, flags, *_), _ = stand_in.instances[-1].runs[-1]
    assert pages.numel() == 1 and blocks.numel() == 1 and flags.numel() == 1


def test_fp8_cache_goes_as_bytes(stand_in):
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    w = W(_ws())
    w.plan(**_batch(), kv_data_type=fp8)
    runtime = stand_in.instances[-1]
    kwargs = runtime.plans[-1][1]
    assert kwargs["kv_dtype"] == _C.DType.e4m3 and runtime.options.kv_dtype == _C.DType.e4m3
    assert kwargs["k_scale_device"].tolist() == [1.0] and kwargs["v_scale_device"].tolist() == [1.0]
    w.run(_q(), torch.zeros(26, 2, 16, 2, 128).to(fp8), k_scale=0.5, v_scale=2.0)
    (_, _, _, kv_arg, *_), run_kwargs = runtime.runs[-1]
    assert run_kwargs == {"kv_dtype": _C.DType.e4m3} and kv_arg.dtype == torch.uint8
    assert kwargs["k_scale_device"].tolist() == [0.5] and kwargs["v_scale_device"].tolist() == [2.0]


def test_cuda_graph_plans_fill_the_fixed_buffers(stand_in):
    page_buf, block_buf = _i32([-7] * 32), _i32([-7] * 10)
    w = W(_ws(), "NHD", True, paged_kv_indices_buf=page_buf, mask_indices_buf=block_buf)
    assert w.is_cuda_graph_enabled
    flags = torch.tensor([1, 0, 0, 1, 0, 0, 1], dtype=torch.uint8)
    w.plan(**_batch(), mask_flags=flags)
    runtime = stand_in.instances[0]
    assert runtime.options.cuda_graph
    # The first plan's rows (73) fix the query rows and bound the requests and block rows.
    assert (runtime.bounds.max_batch_size, runtime.bounds.max_total_qo_tokens) == (73, 73)
    assert page_buf.tolist() == list(range(25, -1, -1)) + [-7] * 6
    assert block_buf.tolist() == [0, 2, 4, 1, 4, 0, 1, -7, -7, -7]
    cache = torch.zeros(26, 2, 16, 2, 128, dtype=torch.float16)
    w.run(_q(), cache)
    (_, _, _, _, _, pages, blocks, run_flags, *_), _ = runtime.runs[-1]
    assert pages is page_buf and blocks is block_buf and run_flags.numel() == 10
    assert run_flags[:7].tolist() == [1, 0, 0, 1, 0, 0, 1]
    graph_flags = run_flags

    # Another batch without flags: the flags buffer is cleared where the plan reads it; ids that
    # already live in the fixed buffers are not copied.
    block_buf[:2] = _i32([0, 1])
    w.plan(**_batch(qo_indptr=_i32([0, 5]), paged_kv_indptr=_i32([0, 8]), paged_kv_indices=_i32(list(range(7, -1, -1))),
                    paged_kv_last_page_len=_i32([16]), mask_indptr=_i32([0, 2]), mask_indices=block_buf))
    assert page_buf[:8].tolist() == list(range(7, -1, -1)) and block_buf[:2].tolist() == [0, 1]
    assert graph_flags[:2].tolist() == [0, 0]
    w.run(_q(), cache)
    (_, _, _, _, _, pages, blocks, run_flags, *_), _ = runtime.runs[-1]
    assert pages is page_buf and blocks is block_buf and run_flags is graph_flags
    assert w._holder.builds == 1 and len(stand_in.instances) == 1

    # Beyond the buffers or the first plan's rows: named errors before any GPU work.
    with pytest.raises(ValueError, match=r"mask_indptr\[-1\] = 11 listed blocks exceed the 10 entries of "
                                         "mask_indices_buf"):
        w.plan(**_batch(qo_indptr=_i32([0, 5]), mask_indptr=_i32([0, 11]), mask_indices=_i32(list(range(11))),
                        paged_kv_indptr=_i32([0, 32]), paged_kv_indices=_i32(list(range(32))),
                        paged_kv_last_page_len=_i32([16]), block_cols=16))
    with pytest.raises(ValueError, match="paged_kv_indptr\\[-1\\] = 33 pages exceed the 32 entries of "
                                         "paged_kv_indices_buf"):
        w.plan(**_batch(qo_indptr=_i32([0, 5]), mask_indptr=_i32([0, 0]), mask_indices=_i32([]),
                        paged_kv_indptr=_i32([0, 33]), paged_kv_indices=_i32(list(range(33))),
                        paged_kv_last_page_len=_i32([16])))
    with pytest.raises(ValueError, match="74 query rows exceed the 73 of the first plan"):
        w.plan(**_batch(qo_indptr=_i32([0, 71, 74])))
    with pytest.raises(ValueError, match="reset_workspace_buffer: not allowed with use_cuda_graph=True"):
        w.reset_workspace_buffer(_ws())


# --- GPU -----------------------------------------------------------------------------------------


class _Paged:
    """A random paged cache for the given lengths, each request's pages scattered over a pool with
    a few spare pages (the page table on the CPU)."""

    def __init__(self, kv_lens, page_size, hkv, d, dtype, layout, combined, gen):
        self.kv_lens, self.layout = list(kv_lens), layout
        pages = [math.ceil(n / page_size) for n in kv_lens]
        total = sum(pages) + 3
        self.indptr = _i32([0] + torch.tensor(pages).cumsum(0).tolist())
        self.indices = torch.randperm(total, generator=gen)[: int(self.indptr[-1])].to(torch.int32)
        self.last_page_len = _i32([n - (p - 1) * page_size if p > 0 else 0 for n, p in zip(kv_lens, pages)])
        page = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
        if combined:
            self.kv = torch.randn((total, 2) + page, generator=gen).to(dtype).cuda()
            self.k, self.v = self.kv[:, 0], self.kv[:, 1]
            self.cache = self.kv
        else:
            self.k = torch.randn((total,) + page, generator=gen).to(dtype).cuda()
            self.v = torch.randn((total,) + page, generator=gen).to(dtype).cuda()
            self.cache = (self.k, self.v)

    def request_kv(self, b):
        """K, V of request b as float64 [kv_len, Hkv, D] (fp8 pages gathered as bytes)."""
        ids = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].long().cuda()
        out = []
        for t in (self.k, self.v):
            fp8 = U.is_fp8(t.dtype)
            pages = (t.view(torch.uint8) if fp8 else t)[ids]
            if self.layout == "HND":
                pages = pages.permute(0, 2, 1, 3)
            rows = pages.reshape(-1, pages.shape[2], pages.shape[3])[: self.kv_lens[b]]
            out.append((rows.view(t.dtype) if fp8 else rows).float().double())
        return out


class _Mask:
    """A random block mask over a batch: each block row lists each of its request's column blocks
    with probability `keep`; with `flags`, about 70% of the listed blocks that every mask leaves
    whole (inside kv_len, every pair visible under causal / the window) are flagged. `dense[b]`:
    request b's [qo_len, kv_len] bool mask, the listed blocks then causal / window at logical
    positions kv_len - qo_len + i."""

    def __init__(self, qo_lens, kv_lens, br, bc, keep, flags, causal, window_left, gen):
        indptr, indices, flag_list, self.dense = [0], [], [], []
        for qo, kv in zip(qo_lens, kv_lens):
            nr, nc = -(-qo // br), -(-kv // bc)
            listed = torch.rand(nr, nc, generator=gen) < keep
            rows, cols = listed.nonzero(as_tuple=True)  # row-major: increasing columns within a row
            indices.append(cols)
            indptr += (indptr[-1] + listed.sum(1).cumsum(0)).tolist()
            r0, c0 = torch.arange(nr) * br, torch.arange(nc) * bc
            r1 = torch.clamp(r0 + br, max=qo)
            whole = (c0 + bc <= kv)[None, :].expand(nr, nc).clone()
            if causal:  # the block's last key at or before its first query's position
                whole &= (c0 + bc - 1)[None, :] <= (kv - qo + r0)[:, None]
            if window_left >= 0:  # its first key inside its last query's window
                whole &= c0[None, :] >= (kv - qo + r1 - 1 - window_left)[:, None]
            flagged = whole & (torch.rand(nr, nc, generator=gen) < 0.7) if flags else torch.zeros_like(whole)
            flag_list.append(flagged[rows, cols])
            dense = listed.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:qo, :kv]
            pos, j = kv - qo + torch.arange(qo)[:, None], torch.arange(kv)[None, :]
            if causal:
                dense &= j <= pos
            if window_left >= 0:
                dense &= j >= pos - window_left
            self.dense.append(dense)
        self.indptr = _i32(indptr)
        self.indices = torch.cat(indices).to(torch.int32) if indices else _i32([])
        self.flags = torch.cat(flag_list).to(torch.uint8) if flag_list else torch.zeros(0, dtype=torch.uint8)
        self.any_flagged = bool(self.flags.any())


def _reference(q, qo_indptr, cache, mask, sm_scale, soft_cap=0.0, scales=(1.0, 1.0)):
    """float64 attention of each request's queries over its gathered K/V under its dense mask ->
    (o [rows, Hq, D], base-2 lse [rows, Hq]); rows that see no key: 0 and -inf."""
    rows, hq, d = q.shape
    o = torch.zeros(rows, hq, d, dtype=torch.float64, device=q.device)
    lse = torch.full((rows, hq), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(qo_indptr.numel() - 1):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = cache.request_kv(b)
        k, v = k * scales[0], v * scales[1]
        group = hq // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[lo:hi].double(), k) * sm_scale
        if soft_cap > 0:
            s = soft_cap * torch.tanh(s / soft_cap)
        s = s.masked_fill(~mask.dense[b].to(q.device)[None], float("-inf"))
        l = torch.logsumexp(s, dim=-1)  # noqa: E741
        p = torch.nan_to_num(torch.exp(s - l[..., None]), nan=0.0)
        o[lo:hi] = torch.einsum("hqk,khd->qhd", p, v)
        lse[lo:hi] = (l / LN2).transpose(0, 1)
    return o, lse


def _assert_close(out, lse, ref_o, ref_lse, dtype, what):
    o = out.double()
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf (unwritten or wrong)"
    norm, err = ref_o.norm().item(), (o - ref_o).norm().item()
    assert err <= REL_TOL[dtype] * max(norm, 1e-30), f"{what}: relative error {err / max(norm, 1e-30):.3g}"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: lse = -inf exactly where a row sees no key"
    assert (o[empty] == 0).all(), f"{what}: rows that see no key must be 0"
    if (~empty).any():
        d = (lse[~empty].double() - ref_lse[~empty]).abs().max().item()
        assert d <= LSE_TOL[dtype], f"{what}: base-2 lse max abs error {d:.3g}"


# Odd lengths, an empty request, a request with queries but no key, a request with keys but no
# query, long requests the planner splits.
QO_LENS = [37, 0, 1, 200, 5, 129, 0, 64]
KV_LENS = [300, 45, 777, 1500, 0, 129, 0, 2100]

CASES = [
    dict(page_size=16, block=(64, 64), group=4, causal=True, flags=False, dtype=torch.bfloat16),
    dict(page_size=16, block=(64, 64), group=4, causal=True, flags=True, dtype=torch.float16, combined=True),
    dict(page_size=1, block=(64, 64), group=1, causal=True, flags=True, dtype=torch.float16, on_gpu=True),
    dict(page_size=16, block=(16, 48), group=1, causal=False, flags=True, dtype=torch.bfloat16, layout="HND"),
    dict(page_size=1, block=(3, 5), group=4, causal=False, flags=False, dtype=torch.bfloat16, head_dim=64),
    dict(page_size=16, block=(32, 64), group=4, causal=True, flags=True, dtype=torch.bfloat16, window_left=200,
         on_gpu=True),
    dict(page_size=16, block=(32, 16), group=4, causal=False, flags=False, dtype=torch.float16, soft_cap=30.0,
         layout="HND", combined=True),
    dict(page_size=16, block=(64, 64), group=4, causal=True, flags=True, dtype=torch.bfloat16,
         fixed_split_size=256),
]


def _case_id(c):
    parts = [f"page{c['page_size']}", "b{}x{}".format(*c["block"]), f"group{c['group']}",
             "causal" if c["causal"] else "noncausal", "flags" if c["flags"] else "noflags",
             str(c["dtype"]).replace("torch.", "")]
    parts += [f"{k}{c[k]}" for k in ("layout", "head_dim", "window_left", "soft_cap", "fixed_split_size") if k in c]
    parts += [k for k in ("combined", "on_gpu") if c.get(k)]
    return "-".join(parts)


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


@gpu
@pytest.mark.parametrize("c", CASES, ids=_case_id)
def test_matches_reference(c, workspace):
    gen = torch.Generator().manual_seed(1000 + CASES.index(c))
    hkv, d, dtype, (br, bc) = 2, c.get("head_dim", 128), c["dtype"], c["block"]
    hq = hkv * c["group"]
    window = c.get("window_left", -1)
    cache = _Paged(KV_LENS, c["page_size"], hkv, d, dtype, c.get("layout", "NHD"), c.get("combined", False), gen)
    mask = _Mask(QO_LENS, KV_LENS, br, bc, 0.6, c["flags"], c["causal"], window, gen)
    assert mask.any_flagged == c["flags"], "a case with flags must flag some block"
    qo_indptr = _i32([0] + torch.tensor(QO_LENS).cumsum(0).tolist())
    rows = int(qo_indptr[-1])
    q = torch.randn(rows, hq, d, generator=gen).to(dtype).cuda()
    dev = "cuda" if c.get("on_gpu") else "cpu"  # index arrays given on the GPU (copied to the host) or the CPU
    w = W(workspace, c.get("layout", "NHD"))
    w.plan(qo_indptr.to(dev), cache.indptr.to(dev), cache.indices.to(dev), cache.last_page_len.to(dev),
           mask.indptr.to(dev), mask.indices.to(dev), hq, hkv, d, c["page_size"], br, bc,
           mask_flags=mask.flags.to(dev) if c["flags"] else None, causal=c["causal"], window_left=window,
           logits_soft_cap=c.get("soft_cap"), q_data_type=dtype, fixed_split_size=c.get("fixed_split_size"))
    if "fixed_split_size" in c:
        assert w.plan_info()["num_partials"] > 0, "the case must split a block row"
    out = torch.full_like(q, float("nan"))
    lse = torch.full((rows, hq), float("nan"), device="cuda")
    res = w.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    ref_o, ref_lse = _reference(q, qo_indptr, cache, mask, d ** -0.5, c.get("soft_cap", 0.0))
    _assert_close(out, lse, ref_o, ref_lse, dtype, _case_id(c))
    # Same plan, another "layer": fresh q, out allocated, no lse.
    q2 = torch.randn(rows, hq, d, generator=gen).to(dtype).cuda()
    out2 = w.run(q2, cache.cache)
    ref_o2, _ = _reference(q2, qo_indptr, cache, mask, d ** -0.5, c.get("soft_cap", 0.0))
    rel = ((out2.double() - ref_o2).norm() / ref_o2.norm()).item()
    assert rel <= REL_TOL[dtype], f"layer 2: relative error {rel:.3g}"


@gpu
def test_fp8_cache(workspace):
    fp8 = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(17)
    hkv, hq, d, dtype, ps = 2, 8, 128, torch.bfloat16, 16
    cache = _Paged(KV_LENS, ps, hkv, d, fp8, "NHD", False, gen)
    mask = _Mask(QO_LENS, KV_LENS, 64, 64, 0.6, True, True, -1, gen)
    qo_indptr = _i32([0] + torch.tensor(QO_LENS).cumsum(0).tolist())
    q = torch.randn(int(qo_indptr[-1]), hq, d, generator=gen).to(dtype).cuda()
    w = W(workspace)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, mask.indptr, mask.indices, hq, hkv, d, ps,
           64, 64, mask_flags=mask.flags, causal=True, q_data_type=dtype, kv_data_type=fp8)
    for ks, vs in ((0.5, 2.0), (4.0, 0.25)):
        out, lse = w.run(q, cache.cache, return_lse=True, k_scale=ks, v_scale=vs)
        ref_o, ref_lse = _reference(q, qo_indptr, cache, mask, d ** -0.5, scales=(ks, vs))
        _assert_close(out, lse, ref_o, ref_lse, dtype, f"fp8 cache, scales {ks}, {vs}")


@gpu
def test_cuda_graph_replays_after_replans():
    """run() captured once replays correctly after re-plans that change the batch, the lengths and
    the block mask (fixed buffers whose contents change, as a serving engine keeps them)."""
    gen = torch.Generator().manual_seed(2026)
    hkv, hq, d, ps, dtype, br, bc = 2, 8, 128, 16, torch.bfloat16, 64, 64
    max_pages, max_blocks = 512, 4096
    steps = [([900, 100], 0.8, False), ([1, 300, 0, 64, 33], 0.8, True), ([5, 5, 5, 200], 0.3, False),
             ([100, 7], 0.8, True)]
    max_rows = sum(steps[0][0])  # the first plan fixes the query rows
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    page_buf = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
    block_buf = torch.zeros(max_blocks, dtype=torch.int32, device="cuda")
    w = W(ws, "NHD", use_cuda_graph=True, paged_kv_indices_buf=page_buf, mask_indices_buf=block_buf)
    q_buf = torch.zeros(max_rows, hq, d, dtype=dtype, device="cuda")
    out_buf = torch.zeros(max_rows, hq, d, dtype=dtype, device="cuda")
    lse_buf = torch.zeros(max_rows, hq, dtype=torch.float32, device="cuda")
    k_pool = torch.zeros(max_pages, ps, hkv, d, dtype=dtype, device="cuda")
    v_pool = torch.zeros_like(k_pool)
    graph = None
    for step, (qo_lens, keep, flags) in enumerate(steps):
        kv_lens = [n + int(torch.randint(0, 1500, (1,), generator=gen)) for n in qo_lens]
        cache = _Paged(kv_lens, ps, hkv, d, dtype, "NHD", False, gen)
        assert cache.k.shape[0] <= max_pages
        k_pool[: cache.k.shape[0]].copy_(cache.k)
        v_pool[: cache.v.shape[0]].copy_(cache.v)
        cache.k, cache.v = k_pool, v_pool  # the reference gathers from the fixed pool
        mask = _Mask(qo_lens, kv_lens, br, bc, keep, flags, True, -1, gen)
        qo_indptr = _i32([0] + torch.tensor(qo_lens).cumsum(0).tolist())
        rows = int(qo_indptr[-1])
        w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, mask.indptr, mask.indices, hq, hkv, d,
               ps, br, bc, mask_flags=mask.flags if flags else None, causal=True, q_data_type=dtype)
        q_buf.copy_(torch.randn(max_rows, hq, d, generator=gen).to(dtype))
        if graph is None:  # a warm-up outside the capture, then one capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                w.run(q_buf, (k_pool, v_pool), out=out_buf, lse=lse_buf, return_lse=True)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(q_buf, (k_pool, v_pool), out=out_buf, lse=lse_buf, return_lse=True)
        out_buf.fill_(float("nan"))
        lse_buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = _reference(q_buf[:rows], qo_indptr, cache, mask, d ** -0.5)
        _assert_close(out_buf[:rows], lse_buf[:rows], ref_o, ref_lse, dtype,
                      f"step {step} ({len(qo_lens)} requests, {mask.indptr.numel() - 1} block rows, "
                      f"{mask.indices.numel()} blocks)")
    assert w._holder.builds == 1


# --- FlexAttention block masks over a paged batch (paged_block_mask, variant=flex_variant) ----------


def _flex_mask(nq, nkv, blk, states):
    """A tessera.BlockMask on the CPU of one batch entry and one head from int states [nq, nkv]
    (0 absent, 1 partial, 2 full), lengths nq * blk x nkv * blk."""
    states = torch.tensor(states, dtype=torch.int8)
    def part(value):
        dense = states == value
        num = dense.sum(-1, dtype=torch.int32)
        idx = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return num[None, None], idx[None, None]
    (pn, pi), (fn, fi) = part(1), part(2)
    return tessera.BlockMask((nq * blk, nkv * blk), (blk, blk), pn, pi, fn, fi, None)


def test_paged_block_mask_cuts_each_request_out_of_the_mask():
    # A 4 x 4 mask of 16-position blocks; request 0 is a prefill of 40 keys (block rows 0-2, column
    # blocks below ceil(40 / 16) = 3), request 1 a chunk of 16 queries after 32 keys (mask row 2,
    # 48 keys: 3 column blocks), request 2 has no query.
    bm = _flex_mask(4, 4, 16, [[2, 0, 0, 0], [1, 2, 0, 1], [0, 1, 1, 0], [2, 2, 2, 1]])
    qo_indptr, kv_indptr, last = _i32([0, 40, 56, 56]), _i32([0, 3, 6, 7]), _i32([8, 16, 5])
    indptr, indices, flags = tessera.paged_block_mask(bm, qo_indptr, kv_indptr, last, 16)
    assert indptr.tolist() == [0, 1, 3, 5, 7]
    assert indices.tolist() == [0, 0, 1, 1, 2, 1, 2]
    assert flags.tolist() == [1, 0, 1, 0, 0, 0, 0]


def test_paged_block_mask_errors_name_the_request():
    bm = _flex_mask(4, 4, 16, [[2, 0, 0, 0]] * 4)
    # 10 queries after 30 keys: they start at position 30, not a multiple of 16.
    with pytest.raises(ValueError, match="request 1 has 10 queries over 40 keys"):
        tessera.paged_block_mask(bm, _i32([0, 16, 26]), _i32([0, 1, 4]), _i32([16, 8]), 16)
    # 80 keys: past the mask's 64 positions.
    with pytest.raises(ValueError, match="kv_len must be at most the mask's Q_LEN = 64"):
        tessera.paged_block_mask(bm, _i32([0, 80]), _i32([0, 5]), _i32([16]), 16)
    with pytest.raises(ValueError, match="expected 1 or the batch size 2"):
        two = tessera.BlockMask((64, 64), (16, 16), bm.kv_num_blocks.repeat(3, 1, 1), bm.kv_indices.repeat(3, 1, 1, 1),
                                None, None, None)
        tessera.paged_block_mask(two, _i32([0, 16, 32]), _i32([0, 1, 2]), _i32([16, 16]), 16)


@gpu
def test_flex_block_mask_with_its_mask_mod(workspace):
    """create_block_mask of a sliding-window causal mask_mod over positions, cut per request by
    paged_block_mask (prefills and chunks that start at a block boundary), its mask_mod evaluated
    in the partial blocks through flex_variant: against the reference of the mask_mod itself."""
    gen = torch.Generator().manual_seed(77)
    hkv, hq, d, ps, dtype, blk, window = 2, 8, 128, 16, torch.bfloat16, 64, 200
    qo_lens, kv_lens = [300, 64, 1, 128], [300, 256, 1, 384]  # query offsets 0, 192, 0, 256

    def sliding_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    length = max(kv_lens)
    bm = tessera.create_block_mask(sliding_causal, None, None, length, length, device="cuda", BLOCK_SIZE=blk)
    cache = _Paged(kv_lens, ps, hkv, d, dtype, "NHD", False, gen)
    qo_indptr = _i32([0] + torch.tensor(qo_lens).cumsum(0).tolist())
    mask_indptr, mask_indices, mask_flags = tessera.paged_block_mask(bm, qo_indptr, cache.indptr,
                                                                     cache.last_page_len, ps)
    assert bool(mask_flags.any()) and bool((mask_flags == 0).any()), "full and partial blocks both"
    listed = int(mask_indptr[-1])
    every = sum(-(-qo // blk) * -(-kv // blk) for qo, kv in zip(qo_lens, kv_lens))
    assert listed < every, "the window must leave blocks out"
    q = torch.randn(int(qo_indptr[-1]), hq, d, generator=gen).to(dtype).cuda()
    w = W(workspace)
    w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, mask_indptr, mask_indices, hq, hkv, d, ps,
           blk, blk, mask_flags=mask_flags, q_data_type=dtype, variant=tessera.flex_variant(mask_mod=sliding_causal))
    out, lse = w.run(q, cache.cache, return_lse=True)

    class Dense:
        dense = []

    for qo, kv in zip(qo_lens, kv_lens):
        pos, j = kv - qo + torch.arange(qo)[:, None], torch.arange(kv)[None, :]
        Dense.dense.append((j <= pos) & (pos - j < window))
    ref_o, ref_lse = _reference(q, qo_indptr, cache, Dense, d ** -0.5)
    _assert_close(out, lse, ref_o, ref_lse, dtype, "flex block mask with its mask_mod")
