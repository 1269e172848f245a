"""tessera.MultiLevelCascadeAttentionWrapper: shared-prefix attention in 1 to 3 levels, one C++
runtime (tessera::BatchCascadePagedWrapper) over the caller's workspace.

CPU: the constructor's and plan()'s named errors, FlashInfer's signature, and (with a stand-in for
the C++ class that checks every call against the binding's signature in _C.pyi) what the wrapper
hands the runtime: one runtime built over the caller's workspace with num_levels, each level's host
index arrays, and the page tables run() reads (with use_cuda_graph the preallocated buffers, which
plan() fills). GPU (skipped without CUDA): random batches over one paged cache with a random page
permutation: level 0 a prefix shared by every request (lengths 0, 100, 2049), an optional middle
level shared by pairs of requests, the last level each request's own pages with 1-5 query tokens
(causal on and off); and a CUDA-graph serving loop (1-3 levels) whose captured run() is replayed
after re-plans of other batch shapes, with requests in groups with and without a shared prefix.
Every output is checked against an fp32 reference that attends each request's queries to the
concatenation of its levels' keys (the shared levels fully visible, causal within the last level).
Tolerances as in test_gpu.py.
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
W = tessera.MultiLevelCascadeAttentionWrapper
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _ws():
    """A workspace on the CPU: enough to construct the wrapper, never enough to plan."""
    return torch.empty(1 << 20, dtype=torch.uint8)


def _graph_buffers(max_groups, max_pages):
    """FlashInfer's four *_buf_arr lists, on the CPU (filled with -7 to see what plan() writes)."""
    return ([_i32([-7] * (g + 1)) for g in max_groups], [_i32([-7] * (g + 1)) for g in max_groups],
            [_i32([-7] * p) for p in max_pages], [_i32([-7] * g) for g in max_groups])


# --- CPU: signature, constructor and plan() errors -----------------------------------------------


def test_signature_matches_flashinfer():
    params = lambda f: [p for p in inspect.signature(f).parameters if p != "self"]  # noqa: E731
    assert params(W.__init__) == [
        "num_levels", "float_workspace_buffer", "kv_layout", "use_cuda_graph", "qo_indptr_buf_arr",
        "paged_kv_indptr_buf_arr", "paged_kv_indices_buf_arr", "paged_kv_last_page_len_buf_arr"]
    assert params(W.plan) == [
        "qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len", "num_qo_heads",
        "num_kv_heads", "head_dim", "page_size", "causal", "pos_encoding_mode", "use_fp16_qk_reduction", "sm_scale",
        "window_left", "logits_soft_cap", "rope_scale", "rope_theta", "q_data_type", "kv_data_type"]
    assert params(W.run) == ["q", "paged_kv_cache"]
    assert W.begin_forward is W.plan and W.forward is W.run
    for name, member in inspect.getmembers(W):
        if (not name.startswith("_") or name == "__init__") and (callable(member) or isinstance(member, property)):
            assert inspect.getdoc(member), f"MultiLevelCascadeAttentionWrapper.{name} has no docstring"


def test_errors_name_the_argument():
    ws = _ws()
    with pytest.raises(ValueError, match="num_levels = 0, expected >= 1"):
        W(0, ws)
    with pytest.raises(ValueError, match="kv_layout = 'NDH', expected 'NHD' or 'HND'"):
        W(2, ws, "NDH")
    with pytest.raises(ValueError, match="use_cuda_graph=True needs qo_indptr_buf_arr"):
        W(2, ws, "NHD", True)
    bufs = _graph_buffers([1, 3], [4, 8])
    with pytest.raises(ValueError, match="paged_kv_indices_buf_arr has 1 entries, expected a list of num_levels = 2"):
        W(2, ws, "NHD", True, bufs[0], bufs[1], bufs[2][:1], bufs[3])
    with pytest.raises(TypeError, match=r"paged_kv_indptr_buf_arr\[1\].dtype = torch.int64"):
        W(2, ws, "NHD", True, bufs[0], [bufs[1][0], bufs[1][1].long()], bufs[2], bufs[3])
    with pytest.raises(ValueError, match=r"paged_kv_indptr_buf_arr\[1\] has 3 entries, expected 4 \(the length of "
                                         r"qo_indptr_buf_arr\[1\]\)"):
        W(2, ws, "NHD", True, bufs[0], [bufs[1][0], _i32([0] * 3)], bufs[2], bufs[3])
    with pytest.raises(ValueError, match=r"paged_kv_last_page_len_buf_arr\[0\] has 2 entries, expected 1"):
        W(2, ws, "NHD", True, bufs[0], bufs[1], bufs[2], [_i32([1, 1]), bufs[3][1]])
    with pytest.raises(ValueError, match=r"qo_indptr_buf_arr\[0\] has 1 entries, expected \[max_groups \+ 1\] >= 2"):
        W(2, ws, "NHD", True, [_i32([0]), bufs[0][1]], bufs[1], bufs[2], bufs[3])
    # Without use_cuda_graph the buffers are ignored, as in FlashInfer.
    assert not W(2, ws, "NHD", False, *bufs).is_cuda_graph_enabled
    assert W(2, ws, "NHD", True, *bufs).is_cuda_graph_enabled

    w = W(2, ws)
    one = [_i32([0, 1])]
    with pytest.raises(ValueError, match="qo_indptr_arr has 1 entries, expected a list of num_levels = 2"):
        w.plan(one, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="paged_kv_last_page_len has type Tensor, expected a list"):
        w.plan(one * 2, one * 2, one * 2, _i32([1]), 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"qo_indptr_arr's last entries are \[3, 2\], expected equal"):
        w.plan([_i32([0, 3]), _i32([0, 1, 2])], [_i32([0, 1]), _i32([0, 1, 2])], [_i32([0]), _i32([1, 2])],
               [_i32([4]), _i32([4, 4])], 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"paged_kv_indptr_arr\[1\] has 2 entries, expected 3"):
        w.plan([_i32([0, 2])] + [_i32([0, 1, 2])], [_i32([0, 1])] * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"paged_kv_indptr_arr\[0\]\[2\] = 1, expected >= 2"):
        w.plan([_i32([0, 1, 2])] * 2, [_i32([0, 2, 1]), _i32([0, 1, 2])], [_i32([0, 1])] * 2, [_i32([1, 1])] * 2,
               8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"paged_kv_indices_arr\[1\] has 1 entries, expected >= "
                                         r"paged_kv_indptr_arr\[1\]\[-1\] = 2"):
        w.plan([_i32([0, 1, 2])] * 2, [_i32([0, 1, 2])] * 2, [_i32([0, 1]), _i32([0])], [_i32([1, 1])] * 2,
               8, 2, 128, 16)
    with pytest.raises(NotImplementedError, match="window_left"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, window_left=8)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, pos_encoding_mode="ALIBI")
    with pytest.raises(ValueError, match="pos_encoding_mode = 'ROPE'"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, pos_encoding_mode="ROPE")
    with pytest.raises(NotImplementedError, match="rope_theta"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, rope_theta=1e4)
    with pytest.raises(NotImplementedError, match="use_fp16_qk_reduction"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, use_fp16_qk_reduction=True)
    with pytest.raises(ValueError, match="num_qo_heads = 6 is not a multiple of num_kv_heads = 4"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 6, 4, 128, 16)
    with pytest.raises(TypeError, match="causal must be a bool"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, causal=1)
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(torch.zeros(1, 8, 128, dtype=torch.float16), torch.zeros(1, 2, 16, 2, 128, dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"plan\(\) has not been called yet"):
        w.plan_info()


# --- CPU: what reaches the C++ runtime (a stand-in checked against the binding's signature) -------


class _CascadeStandIn(SignatureStandIn):
    """Stands in for _C.BatchCascadePagedWrapper (which needs a GPU): binds every call to the
    binding's signature (a TypeError when the wrapper's call would not reach the C++ method) and
    records it."""

    cpp_class = "BatchCascadePagedWrapper"

    def __init__(self, workspace, num_levels, bounds, options):
        self._check("__init__", self, workspace, num_levels, bounds, options)
        self.workspace, self.levels, self.bounds, self.options = workspace, num_levels, bounds, options
        self._register()

    def plan(self, *args, **kwargs):
        self._check("plan", self, *args, **kwargs)
        for name, arrays in zip(("qo_indptr", "kv_indptr", "last_page_len"), args[:3]):
            assert isinstance(arrays, list) and len(arrays) == self.levels, name
            assert all(a.device.type == "cpu" and a.dtype == torch.int32 for a in arrays), f"{name}: HOST int32"
        self.plans.append((args, kwargs))

    def run(self, *args, **kwargs):
        self._check("run", self, *args, **kwargs)
        caches = args[1]
        assert isinstance(caches, list) and len(caches) == self.levels
        assert all(len(c) == 5 and isinstance(c[3], _C.Layout) for c in caches), "(k, v, kv, layout, indices)"
        self.runs.append((args, kwargs))

    def plan_info(self, level):
        self._check("plan_info", self, level)
        return {"level": level}


@pytest.fixture
def stand_in(monkeypatch):
    """_C.BatchCascadePagedWrapper replaced by the stand-in, _C.VariantArgs by the dict of its
    keywords, and the device checks lifted, so plan() and run() go through on the CPU."""
    monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
    monkeypatch.setattr(U, "current_stream", lambda device: 0)
    monkeypatch.setattr(U, "device_index", lambda t: 0)
    monkeypatch.setattr(_C, "VariantArgs", lambda **kwargs: kwargs)
    cls = type("BatchCascadePagedWrapper", (_CascadeStandIn,), {"instances": []})
    monkeypatch.setattr(_C, "BatchCascadePagedWrapper", cls)
    return cls


# Two levels: a 100-token prefix shared by 3 requests (one group), then each request's own pages.
TWO_LEVELS = dict(
    qo_indptr_arr=[_i32([0, 6]), _i32([0, 1, 5, 6])],
    paged_kv_indptr_arr=[_i32([0, 7]), _i32([0, 2, 3, 5])],
    paged_kv_indices_arr=[_i32([9, 8, 7, 6, 5, 4, 3]), _i32([0, 1, 2, 10, 11])],
    paged_kv_last_page_len=[_i32([4]), _i32([16, 1, 7])],
    num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16,
)


def test_one_runtime_over_the_callers_workspace(stand_in):
    ws = _ws()
    w = W(2, ws, "HND")
    w.plan(**TWO_LEVELS, causal=True, logits_soft_cap=30.0, q_data_type="bfloat16")
    assert len(stand_in.instances) == 1
    runtime = stand_in.instances[0]
    assert runtime.levels == 2 and runtime.workspace.data_ptr() == ws.data_ptr()
    assert runtime.workspace.numel() == ws.numel(), "the caller's whole buffer, no other"
    assert runtime.bounds.max_batch_size >= 3 and runtime.bounds.max_total_qo_tokens >= 6
    assert runtime.options.dtype == _C.DType.bf16 and not runtime.options.cuda_graph
    args, kwargs = runtime.plans[-1]
    qo, kv, last = args[:3]
    assert [t.tolist() for t in qo] == [[0, 6], [0, 1, 5, 6]]
    assert [t.tolist() for t in kv] == [[0, 7], [0, 2, 3, 5]]
    assert [t.tolist() for t in last] == [[4], [16, 1, 7]]
    assert args[3:8] == (16, 8, 2, 128, _C.DType.bf16)
    assert args[8] == pytest.approx(128 ** -0.5)
    assert args[9] is True  # the runtime applies it to the last level only
    assert kwargs["variant"]["logits_soft_cap"] == 30.0 and kwargs["kv_dtype"] is None
    assert w.plan_info() == [{"level": 0}, {"level": 1}]

    kv_cache = torch.zeros(12, 2, 2, 16, 128, dtype=torch.bfloat16)  # HND
    out = w.run(torch.zeros(6, 8, 128, dtype=torch.bfloat16), kv_cache)
    assert out.shape == (6, 8, 128) and out.dtype == torch.bfloat16
    (q, caches, o, lse, stream), kwargs = runtime.runs[-1]
    assert o is out and lse is None and kwargs == {"kv_dtype": None}
    for i, (k, v, combined, layout, indices) in enumerate(caches):
        assert k is None and v is None and combined is kv_cache and layout == _C.Layout.HND
        assert indices is TWO_LEVELS["paged_kv_indices_arr"][i]
    # A re-plan within the bounds keeps the runtime.
    w.plan([_i32([0, 2])] * 2, [_i32([0, 1]), _i32([0, 3])], [_i32([5]), _i32([6, 7, 8])], [_i32([3])] * 2,
           8, 2, 128, 16, q_data_type="bfloat16")
    assert w._holder.builds == 1 and len(runtime.plans) == 2


def test_workspace_too_small_names_the_bytes_and_levels(stand_in, monkeypatch):
    monkeypatch.setattr(stand_in, "workspace_size", staticmethod(lambda levels, bounds, options, device: levels << 27))
    with pytest.raises(ValueError, match=r"float_workspace_buffer has 1048576 bytes, but this plan needs 268435456 "
                                         r"bytes of workspace \(num_levels=2, max groups per level=3, query rows=6"):
        W(2, _ws()).plan(**TWO_LEVELS)
    assert not stand_in.instances


def test_page_ids_checked_against_the_cache(stand_in):
    w = W(2, _ws())
    w.plan(**TWO_LEVELS)
    with pytest.raises(ValueError, match=r"paged_kv_indices_arr\[1\]\[4\] = 11 is out of range \[0, 11\)"):
        w.run(torch.zeros(6, 8, 128, dtype=torch.float16), torch.zeros(11, 2, 16, 2, 128, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"paged_kv_cache.dtype = torch.bfloat16, but the plan was made for "
                                        "kv_data_type = torch.float16"):
        w.run(torch.zeros(6, 8, 128, dtype=torch.float16), torch.zeros(12, 2, 16, 2, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="the plan was made for page_size 16"):
        w.run(torch.zeros(6, 8, 128, dtype=torch.float16), torch.zeros(12, 2, 8, 2, 128, dtype=torch.float16))


def test_level_without_pages_gets_a_page_table(stand_in):
    """A level whose groups have no pages (no shared prefix in this batch) may pass an empty page
    table, as FlashInfer allows; the runtime wants one that exists."""
    w = W(2, _ws())
    w.plan([_i32([0, 2]), _i32([0, 1, 2])], [_i32([0, 0]), _i32([0, 1, 2])], [_i32([]), _i32([3, 4])],
           [_i32([0]), _i32([5, 5])], 8, 2, 128, 16)
    w.run(torch.zeros(2, 8, 128, dtype=torch.float16), (torch.zeros(5, 16, 2, 128, dtype=torch.float16),) * 2)
    caches = stand_in.instances[0].runs[-1][0][1]
    assert caches[0][4].numel() == 1 and caches[1][4].tolist() == [3, 4]
    assert caches[0][0] is not None and caches[0][2] is None  # (k, v) given as a tuple


def test_fp8_cache_goes_as_bytes(stand_in):
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    w = W(2, _ws())
    w.plan(**TWO_LEVELS, kv_data_type=fp8)
    runtime = stand_in.instances[0]
    assert runtime.plans[-1][1]["kv_dtype"] == _C.DType.e4m3 and runtime.options.kv_dtype == _C.DType.e4m3
    w.run(torch.zeros(6, 8, 128, dtype=torch.float16), torch.zeros(12, 2, 16, 2, 128).to(fp8))
    (_, caches, *_), kwargs = runtime.runs[-1]
    assert kwargs == {"kv_dtype": _C.DType.e4m3} and caches[0][2].dtype == torch.uint8


def test_cuda_graph_plans_fill_the_fixed_buffers(stand_in):
    qo_bufs, kv_bufs, id_bufs, last_bufs = bufs = _graph_buffers([1, 4], [8, 8])
    w = W(2, _ws(), "NHD", True, *bufs)
    w.plan(**TWO_LEVELS)
    runtime = stand_in.instances[0]
    assert runtime.options.cuda_graph
    assert (runtime.bounds.max_batch_size, runtime.bounds.max_total_qo_tokens) == (4, 6)  # buffers, first plan
    assert qo_bufs[0].tolist() == [0, 6] and qo_bufs[1].tolist() == [0, 1, 5, 6, -7]
    assert kv_bufs[1].tolist() == [0, 2, 3, 5, -7] and last_bufs[1].tolist() == [16, 1, 7, -7]
    assert id_bufs[0].tolist() == [9, 8, 7, 6, 5, 4, 3, -7] and id_bufs[1][:5].tolist() == [0, 1, 2, 10, 11]
    cache = torch.zeros(12, 2, 16, 2, 128, dtype=torch.float16)
    q = torch.zeros(6, 8, 128, dtype=torch.float16)
    w.run(q, cache)
    assert all(c[4] is buf for c, buf in zip(runtime.runs[-1][0][1], id_bufs)), "run() reads the fixed buffers"

    # Another batch shape: 1 group at each level, fewer rows; plans whose page ids already live
    # in the fixed buffer are not copied.
    id_bufs[1][:2] = _i32([4, 5])
    w.plan([_i32([0, 2])] * 2, [_i32([0, 1])] * 2, [_i32([11]), id_bufs[1]], [_i32([3])] * 2, 8, 2, 128, 16)
    assert qo_bufs[1].tolist()[:2] == [0, 2] and id_bufs[0][0] == 11 and id_bufs[1][:2].tolist() == [4, 5]
    w.run(q, cache)
    assert all(c[4] is buf for c, buf in zip(runtime.runs[-1][0][1], id_bufs))
    assert w._holder.builds == 1 and len(stand_in.instances) == 1

    # Beyond the buffers or the first plan's rows: named errors before any GPU work.
    with pytest.raises(ValueError, match=r"qo_indptr_arr\[0\] has 2 groups, more than the 1 of the preallocated "
                                         r"qo_indptr_buf_arr\[0\]"):
        w.plan([_i32([0, 1, 2])] * 2, [_i32([0, 1, 2])] * 2, [_i32([0, 1])] * 2, [_i32([1, 1])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"paged_kv_indptr_arr\[1\]\[-1\] = 9 pages exceed the 8 entries of "
                                         r"paged_kv_indices_buf_arr\[1\]"):
        w.plan([_i32([0, 2])] * 2, [_i32([0, 1]), _i32([0, 9])], [_i32([0]), _i32(list(range(9)))],
               [_i32([3])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="7 query rows exceed the 6 of the first plan"):
        w.plan([_i32([0, 7])] * 2, [_i32([0, 1])] * 2, [_i32([0])] * 2, [_i32([3])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="reset_workspace_buffer: not allowed with use_cuda_graph=True"):
        w.reset_workspace_buffer(_ws(), [None, None])


def test_reset_workspace_buffer_rebuilds_with_the_levels(stand_in):
    w = W(3, _ws())
    w.plan(**{k: (v + [v[-1]] if isinstance(v, list) else v) for k, v in TWO_LEVELS.items()})
    new_ws = torch.empty(2 << 20, dtype=torch.uint8)
    w.reset_workspace_buffer(new_ws, [torch.empty(8, dtype=torch.uint8)] * 3)
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(torch.zeros(6, 8, 128, dtype=torch.float16), torch.zeros(12, 2, 16, 2, 128, dtype=torch.float16))
    w.plan(**{k: (v + [v[-1]] if isinstance(v, list) else v) for k, v in TWO_LEVELS.items()})
    runtime = stand_in.instances[-1]
    assert len(stand_in.instances) == 2 and runtime.levels == 3 and runtime.workspace.data_ptr() == new_ws.data_ptr()


# --- GPU -----------------------------------------------------------------------------------------


class _Pool:
    """One paged cache ([pages, 2, page_size, Hkv, D], NHD) filled segment by segment, in a random
    page order."""

    def __init__(self, num_pages, page_size, hkv, d, dtype, gen):
        self.page_size = page_size
        self.cache = torch.randn(num_pages, 2, page_size, hkv, d, generator=gen).to(dtype).cuda()
        self.gen = gen
        self.reset()

    def reset(self):
        """Every page free again, in a new order (a new batch over the same cache)."""
        self.free = torch.randperm(self.cache.shape[0], generator=self.gen).tolist()

    def segment(self, length):
        """A new KV segment of `length` tokens: (page ids, last page length, k [len, Hkv, D], v)."""
        n = (length + self.page_size - 1) // self.page_size
        pages = [self.free.pop() for _ in range(n)]
        if n:
            kv = self.cache[pages].transpose(0, 1).reshape(2, n * self.page_size, *self.cache.shape[3:])[:, :length]
        else:
            kv = self.cache.new_zeros(2, 0, *self.cache.shape[3:])
        return pages, (length - (n - 1) * self.page_size) if n else 0, kv[0].float(), kv[1].float()


def _attention(q, k, v, causal, scale):
    """q [qo, Hq, D], k/v [kv, Hkv, D] fp32, causal over the last `causal_len` keys."""
    hq = q.shape[1]
    k = k.repeat_interleave(hq // k.shape[1], dim=1)
    v = v.repeat_interleave(hq // v.shape[1], dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal is not None:  # (own_len): query i sees every shared key and own keys <= own_len - qo + i
        own = causal
        qo, kv = q.shape[0], k.shape[0]
        j = torch.arange(kv, device=q.device)[None, :] - (kv - own)
        limit = torch.arange(qo, device=q.device)[:, None] + (own - qo)
        s = s.masked_fill(j > limit, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


def _batch(pool, qo_lens, levels):
    """A cascade batch: `levels` lists (outermost first) of (member requests, KV length) groups,
    members consecutive. Returns (the four plan lists, qo_indptr, each request's (k, v) segments
    in level order)."""
    qo_indptr = [0]
    for n in qo_lens:
        qo_indptr.append(qo_indptr[-1] + n)
    plan_arrays = [[], [], [], []]
    keys = [[] for _ in qo_lens]
    for groups in levels:
        g_qo, g_kv, g_idx, g_last = [0], [0], [], []
        for members, length in groups:
            pages, last, k, v = pool.segment(length)
            g_qo.append(g_qo[-1] + sum(qo_lens[b] for b in members))
            g_idx += pages
            g_kv.append(len(g_idx))
            g_last.append(last)
            for b in members:
                keys[b].append((k, v))
        plan_arrays[0].append(_i32(g_qo))
        plan_arrays[1].append(_i32(g_kv))
        plan_arrays[2].append(_i32(g_idx, "cuda"))  # empty when the level has no pages
        plan_arrays[3].append(_i32(g_last))
    return plan_arrays, qo_indptr, keys


def _workspace(levels):
    """FlashInfer's 128 MB, whatever the levels: the runtime's levels share one region of split
    states, each adds only its plan."""
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def _check_batch(out, q, qo_indptr, keys, own_lens, causal, dtype, what):
    scale = 1 / math.sqrt(q.shape[2])
    for b, segments in enumerate(keys):
        k = torch.cat([seg[0] for seg in segments])
        v = torch.cat([seg[1] for seg in segments])
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        ref = _attention(q[rows], k, v, own_lens[b] if causal else None, scale)
        err = (out[rows].float() - ref).norm().item() / max(ref.norm().item(), 1e-30)
        assert err <= REL_TOL[dtype], f"{what} request {b}: relative error {err:.3g}"


@gpu
@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("prefix", [0, 100, 2049])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(levels, prefix, causal):
    gen = torch.Generator().manual_seed(levels * 1000 + prefix + causal)
    dtype = torch.bfloat16 if causal else torch.float16
    hq, hkv, d, page_size, batch = 16, 4, 128, 16, 6
    pool = _Pool(400, page_size, hkv, d, dtype, gen)
    qo_lens = [int(x) for x in torch.randint(1, 6, (batch,), generator=gen)]
    own_lens = [max(qo, int(x)) for qo, x in zip(qo_lens, torch.randint(0, 300, (batch,), generator=gen))]
    spec = []
    if levels >= 2:
        spec.append([(list(range(batch)), prefix)])
    if levels == 3:
        spec.append([([0, 1], 37), ([2, 3], 0), ([4, 5], 260)])
    spec.append([([b], own_lens[b]) for b in range(batch)])
    plan_arrays, qo_indptr, keys = _batch(pool, qo_lens, spec)
    q = torch.randn(qo_indptr[-1], hq, d, generator=gen).to(dtype).cuda()
    ws = _workspace(levels)
    before = torch.cuda.memory_allocated()
    w = W(levels, ws)
    w.plan(*plan_arrays, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
    # One workspace, the caller's: the wrapper allocates at most a one-entry page table.
    assert torch.cuda.memory_allocated() - before < (1 << 20)
    assert len(w.plan_info()) == levels
    out = w.run(q, pool.cache)
    assert out.shape == q.shape and torch.isfinite(out.float()).all()
    _check_batch(out, q, qo_indptr, keys, own_lens, causal, dtype, f"levels {levels} prefix {prefix} causal {causal}")


# The steps of the CUDA-graph serving loop: (query tokens per request, the two shared levels'
# groups (members, prefix length), outermost first). A prefix length 0 is a group without a
# shared prefix at that level. Step 0 has the most query rows (the first plan fixes them).
GRAPH_STEPS = [
    ([5] * 8, [[(list(range(8)), 2049)], [([0, 1], 37), ([2, 3, 4], 0), ([5, 6, 7], 260)]]),
    ([3, 1, 4, 1, 5], [[([0, 1, 2], 300), ([3, 4], 0)], [([0], 0), ([1, 2], 100), ([3], 17), ([4], 0)]]),
    ([1, 1], [[([0, 1], 0)], [([0, 1], 129)]]),
    ([1, 2, 3, 4, 5, 6, 7, 8], [[([0, 1, 2, 3], 64), ([4, 5, 6, 7], 1000)],
                                [([0], 1), ([1, 2], 16), ([3], 0), ([4, 5, 6], 33), ([7], 500)]]),
]


@gpu
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_cuda_graph_replays_after_replans(levels):
    """run() captured once after the first plan, replayed after re-plans of other batch shapes
    (batch sizes 8, 5, 2, 8; levels with and without a shared prefix); an eager wrapper runs the
    same plans. Both against the reference, the replays also against each other."""
    gen = torch.Generator().manual_seed(7 + levels)
    dtype, causal = torch.bfloat16, True
    hq, hkv, d, page_size = 16, 4, 128, 16
    pool = _Pool(600, page_size, hkv, d, dtype, gen)
    max_groups = [3, 5][: levels - 1] + [8]  # the shared levels' groups, then one per request
    max_pages = [160] * levels
    bufs = [[torch.zeros(n, dtype=torch.int32, device="cuda") for n in sizes]
            for sizes in ([g + 1 for g in max_groups], [g + 1 for g in max_groups], max_pages, max_groups)]
    ws, eager_ws = _workspace(levels), _workspace(levels)
    before = torch.cuda.memory_allocated()
    graph_w = W(levels, ws, "NHD", True, *bufs)
    eager_w = W(levels, eager_ws)

    def step(i):
        pool.reset()
        qo_lens, shared = GRAPH_STEPS[i]
        own_lens = [qo + int(x) for qo, x in zip(qo_lens, torch.randint(0, 200, (len(qo_lens),), generator=gen))]
        spec = shared[: levels - 1] + [[([b], own_lens[b]) for b in range(len(qo_lens))]]
        plan_arrays, qo_indptr, keys = _batch(pool, qo_lens, spec)
        return plan_arrays, qo_indptr, keys, own_lens

    plan_arrays, qo_indptr, _, _ = step(0)
    rows = qo_indptr[-1]
    graph_w.plan(*plan_arrays, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
    assert torch.cuda.memory_allocated() - before < (1 << 20), "plan() allocates no workspace of its own"
    q_buf = torch.randn(rows, hq, d, generator=gen).to(dtype).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph_w.run(q_buf, pool.cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_buf = graph_w.run(q_buf, pool.cache)

    for i in range(len(GRAPH_STEPS)):
        plan_arrays, qo_indptr, keys, own_lens = step(i)
        n = qo_indptr[-1]
        graph_w.plan(*plan_arrays, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)  # outside the capture
        q_buf.copy_(torch.randn(rows, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        first = out_buf[:n].clone()
        graph.replay()
        assert torch.equal(first, out_buf[:n]), f"step {i}: two replays of one plan differ"
        _check_batch(out_buf, q_buf, qo_indptr, keys, own_lens, causal, dtype, f"levels {levels} step {i} (graph)")
        eager_w.plan(*plan_arrays, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
        eager = eager_w.run(q_buf[:n], pool.cache)
        _check_batch(eager, q_buf, qo_indptr, keys, own_lens, causal, dtype, f"levels {levels} step {i} (eager)")
    assert graph_w._holder.builds == 1


@gpu
def test_runtime_errors_reach_python_named():
    gen = torch.Generator().manual_seed(3)
    pool = _Pool(64, 16, 2, 128, torch.float16, gen)
    plan_arrays, qo_indptr, _ = _batch(pool, [2, 3], [[([0, 1], 40)], [([0], 20), ([1], 30)]])
    small = W(2, torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match=r"float_workspace_buffer has 1048576 bytes, but this plan needs \d+ bytes "
                                         r"of workspace \(num_levels=2, max groups per level=2"):
        small.plan(*plan_arrays, 8, 2, 128, 16)
    w = W(2, _workspace(2))
    w.plan(*plan_arrays, 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"q.shape\[0\] = 4, expected >= 5") as e:
        w.run(torch.zeros(4, 8, 128, dtype=torch.float16, device="cuda"), pool.cache)
    assert e.value.status_code == _C.StatusCode.invalid_argument
    bad_last = [plan_arrays[3][0], _i32([0, 30])]  # a request with pages whose last page holds 0 tokens
    with pytest.raises(ValueError, match="last_page_len") as e:
        w.plan(*plan_arrays[:3], bad_last, 8, 2, 128, 16)
    assert "levels[1]" in str(e.value), "the C++ error names the level"
