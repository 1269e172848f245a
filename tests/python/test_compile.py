"""torch.compile of the plan/run wrappers' run(): the custom ops tessera::decode_run,
tessera::prefill_paged_run, tessera::prefill_ragged_run and tessera::block_sparse_paged_run
(tessera/_ops.py).

Without a GPU (these run everywhere):
- the ops' schemas (what they mutate) and their fake implementations (output shapes and dtypes);
- a function calling the ops on fake / meta tensors is captured by Dynamo as one graph, without
  running anything (fullgraph=True makes any graph break an error before the backend is called);
- the wrappers' own run(), with the C++ runtime object replaced by a stand-in that computes a
  deterministic function of its inputs on the CPU (plan() and run() are otherwise Tessera's code;
  the block-sparse runtime's stand-in binds each run to the binding's signature in _C.pyi and
  folds the plan's block mask into its result):
  one graph with zero breaks, the compiled result equals the eager one, the stand-in receives the
  same arguments from the op as from the eager run(), a new plan of the same shapes does not
  recompile, torch.library.opcheck passes, the handle table does not keep wrappers alive;
- FP8 attention plans of the prefill wrappers (e4m3 q and K/V, a float16 / bfloat16 o) the same
  way: the op's out of the plan's o dtype, q as bytes with q_dtype and q's scale (a float or a
  one-element tensor) reaching the stand-in as in eager mode; a new tensor scale without
  recompiling, a new float one as a float k_scale does; the eager errors at trace time.

With a GPU (skipped otherwise): each wrapper's step (the block-sparse one's too) under
torch._dynamo.explain (no graph break), torch.compile(fullgraph=True) against eager (FP8
attention plans of the prefill wrappers too, on sm_90), and mode="reduce-overhead" (a CUDA graph)
with use_cuda_graph=True wrappers over several calls with new queries (decode: new plans too).
"""

import gc
import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs torch >= 2.4: torch.compile support is off", allow_module_level=True)

import torch._dynamo  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import tessera  # noqa: E402
from tessera import _runtime as R  # noqa: E402
from tessera import _utils as U  # noqa: E402
from stand_ins import stub_signatures  # noqa: E402  (the stub's signatures of a _C class)

HAS_CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU tests skipped")

D, P, RG = (tessera.BatchDecodeWithPagedKVCacheWrapper, tessera.BatchPrefillWithPagedKVCacheWrapper,
            tessera.BatchPrefillWithRaggedKVCacheWrapper)
BS = tessera.BlockSparsePagedAttentionWrapper


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _ops():
    ops = R.load_ops()
    assert ops is not None, "tessera._ops did not load (a development build configured before _ops.py existed?)"
    return ops


# --- the ops: schemas and fake implementations -------------------------------------------------------------

PAGED_ARGS = ["handle", "q", "k", "v", "kv", "kv_layout", "indices", "workspace", "out", "lse", "return_lse", "k_scale",
              "v_scale", "k_scale_value", "v_scale_value"]
RAGGED_ARGS = ["handle", "q", "k", "v", "kv_layout", "workspace", "out", "lse", "return_lse", "k_scale", "v_scale",
               "k_scale_value", "v_scale_value"]
# The prefill ops' last arguments: an FP8 attention plan's q scale and the output's dtype.
PREFILL_EXTRA = ["q_scale", "q_scale_value", "o_dtype"]


@pytest.mark.parametrize("name,args", [("decode_run", PAGED_ARGS), ("prefill_paged_run", PAGED_ARGS + PREFILL_EXTRA),
                                       ("prefill_ragged_run", RAGGED_ARGS + PREFILL_EXTRA),
                                       ("block_sparse_paged_run", PAGED_ARGS)])
def test_op_schemas(name, args):
    _ops()
    schema = getattr(torch.ops.tessera, name).default._schema
    assert [a.name for a in schema.arguments] == args
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"workspace", "out", "lse"}, str(schema)
    assert [str(r.type) for r in schema.returns] == ["Tensor", "Tensor"]
    types = {a.name: str(a.type) for a in schema.arguments}
    assert types["out"] == "Optional[Tensor]" and types["lse"] == "Optional[Tensor]" and types["kv_layout"] == "str"
    assert types["k_scale"] == types["v_scale"] == "Optional[Tensor]" and types["k_scale_value"] == "float"
    if name.startswith("prefill"):
        assert types["q_scale"] == "Optional[Tensor]" and types["q_scale_value"] == "float"
        assert str(schema).endswith("Tensor? q_scale, float q_scale_value, ScalarType o_dtype) -> (Tensor, Tensor)")
        assert all(a.default_value is None for a in schema.arguments), "every argument is passed: no defaults"


def _paged_op_args(q, cache, out=None, lse=None, return_lse=True, handle=12345, prefill=False, o_dtype=None):
    kv = cache if isinstance(cache, torch.Tensor) else None
    k, v = (None, None) if kv is not None else cache
    ws = torch.empty(4096, dtype=torch.uint8, device=q.device)
    indices = torch.zeros(3, dtype=torch.int32, device=q.device)
    args = (handle, q, k, v, kv, "NHD", indices, ws, out, lse, return_lse, None, None, 1.0, 1.0)
    return args + (None, 1.0, o_dtype or q.dtype) if prefill else args


def _ragged_op_args(q, k, v, out=None, lse=None, return_lse=True, handle=12345, o_dtype=None):
    ws = torch.empty(4096, dtype=torch.uint8, device=q.device)
    return (handle, q, k, v, "NHD", ws, out, lse, return_lse, None, None, 1.0, 1.0, None, 1.0, o_dtype or q.dtype)


@pytest.mark.parametrize("name", ["decode_run", "prefill_paged_run", "prefill_ragged_run", "block_sparse_paged_run"])
@pytest.mark.parametrize("given", ["none", "out", "out_lse", "no_lse"])
def test_fake_outputs(name, given):
    # The fake implementations (what torch.compile traces with): a new out of q's shape and dtype
    # (contiguous) unless the caller gives one, a new float32 [rows, num_qo_heads] lse with
    # return_lse unless given; otherwise empty tensors. Fake CUDA tensors need no GPU.
    _ops()
    op = getattr(torch.ops.tessera, name).default
    with FakeTensorMode():
        q = torch.empty(4, 16, 8, 128, dtype=torch.bfloat16, device="cuda")[:, :, 0]  # [4, 16, 128], strided
        out = torch.empty(4, 16, 128, dtype=torch.bfloat16, device="cuda") if given in ("out", "out_lse") else None
        lse = torch.empty(4, 16, dtype=torch.float32, device="cuda") if given == "out_lse" else None
        return_lse = given != "no_lse"
        if name == "prefill_ragged_run":
            kv = torch.empty(9, 2, 128, dtype=torch.bfloat16, device="cuda")
            o, l = op(*_ragged_op_args(q, kv, kv, out, lse, return_lse))
        else:
            cache = torch.empty(5, 2, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
            o, l = op(*_paged_op_args(q, cache, out, lse, return_lse, prefill=name == "prefill_paged_run"))
    assert o.device.type == "cuda" and l.device.type == "cuda" and o.dtype == torch.bfloat16 and l.dtype == torch.float32
    if out is None:
        assert o.shape == (4, 16, 128) and o.is_contiguous()
    else:
        assert o.shape == (0,)
    assert l.shape == ((4, 16) if return_lse and lse is None else (0,))


@pytest.mark.parametrize("name", ["prefill_paged_run", "prefill_ragged_run"])
@pytest.mark.parametrize("o_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("given", ["none", "out"])
def test_fake_outputs_of_fp8_attention(name, o_dtype, given):
    # An FP8 attention plan's op (e4m3 q and K/V): out of o_dtype, not q's, new or empty.
    _ops()
    op = getattr(torch.ops.tessera, name).default
    e4m3 = torch.float8_e4m3fn
    with FakeTensorMode():
        q = torch.empty(4, 16, 128, dtype=e4m3, device="cuda")
        out = torch.empty(4, 16, 128, dtype=o_dtype, device="cuda") if given == "out" else None
        scale = torch.empty(1, dtype=torch.float32, device="cuda")
        if name == "prefill_ragged_run":
            kv = torch.empty(9, 2, 128, dtype=e4m3, device="cuda")
            args = list(_ragged_op_args(q, kv, kv, out, o_dtype=o_dtype))
        else:
            cache = torch.empty(5, 16, 2, 128, dtype=e4m3, device="cuda")
            args = list(_paged_op_args(q, (cache, cache), out, prefill=True, o_dtype=o_dtype))
        args[-3:-1] = [scale, 1.0]  # q_scale a tensor
        o, l = op(*args)
    assert o.dtype == o_dtype and o.shape == ((4, 16, 128) if out is None else (0,)) and o.device.type == "cuda"
    assert l.dtype == torch.float32 and l.shape == (4, 16)


def test_ops_are_one_graph_without_running():
    # The four ops on meta tensors under fullgraph=True: a graph break would fail before the
    # backend is called; the backend records the graph and stops with a sentinel, so no op runs
    # (the handle belongs to no wrapper).
    _ops()

    class Captured(Exception):
        pass

    graphs = []

    def backend(gm, example_inputs):  # Dynamo clears the graph once the backend has failed: read it here
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        raise Captured()

    def step(q, cache, k, v, out):
        o, lse = torch.ops.tessera.decode_run(*_paged_op_args(q, cache))
        torch.ops.tessera.prefill_paged_run(*_paged_op_args(q, (cache[:, 0], cache[:, 1]), out=out, return_lse=False,
                                                            prefill=True))
        o2, _ = torch.ops.tessera.prefill_ragged_run(*_ragged_op_args(q, k, v, return_lse=False))
        o3, _ = torch.ops.tessera.block_sparse_paged_run(*_paged_op_args(q, cache, return_lse=False))
        return o + out + o2 + o3, lse

    meta = dict(dtype=torch.float16, device="meta")
    args = (torch.empty(4, 8, 128, **meta), torch.empty(5, 2, 16, 2, 128, **meta), torch.empty(9, 2, 128, **meta),
            torch.empty(9, 2, 128, **meta), torch.empty(4, 8, 128, **meta))
    torch._dynamo.reset()
    with pytest.raises(Exception) as e:
        torch.compile(step, fullgraph=True, backend=backend)(*args)
    cause = e.value
    while cause is not None and not isinstance(cause, Captured):
        cause = getattr(cause, "inner_exception", None) or cause.__cause__
    assert isinstance(cause, Captured), f"the backend was not reached: {e.value!r}"
    assert len(graphs) == 1
    assert [t for t in graphs[0] if "tessera" in t] == ["tessera.decode_run", "tessera.prefill_paged_run",
                                                        "tessera.prefill_ragged_run",
                                                        "tessera.block_sparse_paged_run"], graphs[0]


# --- the wrappers' run() with a stand-in for the C++ runtime (CPU) ----------------------------------------


class StubRuntime:
    """Stands in for the C++ runtime object (tessera::Batch*Wrapper) on the CPU: plan() keeps an fp8
    plan's scale tensors (q's too for FP8 attention); run() records its arguments and writes into
    out / lse a deterministic function of q (an FP8 attention q, which arrives as bytes with
    q_dtype, decoded from e4m3), the K/V data, the page ids and the scales."""

    def __init__(self):
        self.calls = []
        self.scales = (None, None)
        self.q_scale = None

    def plan(self, *args, **kwargs):
        self.scales = (kwargs.get("k_scale_device"), kwargs.get("v_scale_device"))
        self.q_scale = kwargs.get("q_scale_device")

    def fast_run(self, *args):
        """The C++ fast run needs a GPU: this one declines every call (conftest.RecordingRuntime)."""
        return lambda q, paged_kv_cache, out=None: None

    def run(self, q_arg, *args, kv_dtype=None, q_dtype=None):
        q = q_arg
        if q_dtype is not None:
            assert q_arg.dtype == torch.uint8 and str(q_dtype) == "DType.e4m3", (q_arg.dtype, q_dtype)
            q = q_arg.view(torch.float8_e4m3fn)
        if len(args) == 8:  # paged: k, v, kv, layout, indices, out, lse, stream
            k, v, kv, layout, indices, o, lse, stream = args
            data = [t for t in (k, v, kv) if t is not None]
            extra = float(indices.double().sum())
        else:  # ragged: k, v, out, lse, stream
            k, v, o, lse, stream = args
            data, layout, indices, extra = [k, v], None, None, 0.0
        scale = 1.0
        if self.scales[0] is not None:
            scale = float(self.scales[0]) * float(self.scales[1]) * 2
        if q_dtype is not None:
            scale *= float(self.q_scale) * 3
        mean = sum(float(t.double().mean()) for t in data)
        o.copy_(q.double() * 2 * scale + mean + extra)
        if lse is not None:
            lse.copy_(q.double().sum(-1) * scale)
        self.calls.append({
            "q": (tuple(q_arg.shape), q_arg.stride(), q_arg.dtype), "q_dtype": str(q_dtype),
            "kv": [(tuple(t.shape), t.stride(), t.dtype) for t in data],
            "layout": str(layout), "indices": None if indices is None else indices.tolist(),
            "out": (tuple(o.shape), o.stride(), o.dtype), "lse": lse is not None, "stream": stream,
            "kv_dtype": str(kv_dtype),
        })


class StubBlockSparseRuntime(StubRuntime):
    """Stands in for _C.BatchBlockSparsePagedWrapper: plan() and run() are bound to the binding's
    signatures in _C.pyi (a TypeError when a call would not reach the C++ method, as in
    test_sparse_paged.py's _StandIn); run() computes StubRuntime's paged result, then adds the
    plan's block mask (its listed column blocks and flags, which the op takes from the plan), and
    records the mask with the call."""

    signatures = None

    def _bind(self, name, *args, **kwargs):
        if StubBlockSparseRuntime.signatures is None:
            StubBlockSparseRuntime.signatures = stub_signatures("BatchBlockSparsePagedWrapper")
        StubBlockSparseRuntime.signatures[name].bind(self, *args, **kwargs)

    def plan(self, *args, **kwargs):
        self._bind("plan", *args, **kwargs)
        super().plan(*args, **kwargs)

    def run(self, q_arg, *args, **kwargs):
        self._bind("run", q_arg, *args, **kwargs)
        k, v, kv, layout, indices, blocks, flags, o, lse, stream = args
        super().run(q_arg, k, v, kv, layout, indices, o, lse, stream, **kwargs)
        o.add_(float(blocks.double().sum()) * 3 + (0.0 if flags is None else float(flags.double().sum()) * 5))
        self.calls[-1]["mask"] = (blocks.tolist(), None if flags is None else (flags.dtype, flags.tolist()))


@pytest.fixture
def stub(monkeypatch):
    """Plans build a StubRuntime (StubBlockSparseRuntime for the block-sparse wrapper) in place of
    the C++ runtime; CPU tensors pass the CUDA checks."""
    runtimes = []

    def ensure(holder, *args, **kwargs):
        if holder.cpp is None:
            sparse = holder.cpp_class_name == "BatchBlockSparsePagedWrapper"
            holder.cpp = StubBlockSparseRuntime() if sparse else StubRuntime()
            runtimes.append(holder.cpp)
        return holder.cpp

    monkeypatch.setattr(R._RuntimeHolder, "ensure", ensure)
    monkeypatch.setattr(U, "current_stream", lambda device: 7)
    monkeypatch.setattr(U, "device_index", lambda t: 0)
    monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
    _ops()
    torch._dynamo.reset()
    yield runtimes
    torch._dynamo.reset()


HQ, HKV, HD, PS = 8, 2, 128, 16
BS_MASK = (_i32([0, 2, 4, 5]), _i32([0, 2, 1, 2, 1]))  # _setup's block-sparse plan: mask_indptr, mask_indices


def _cache(num_pages, layout, combined, dtype, gen):
    shape = (num_pages, PS, HKV, HD) if layout == "NHD" else (num_pages, HKV, PS, HD)
    if combined:
        return torch.randn((shape[0], 2) + shape[1:], generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def _setup(kind, layout="NHD", combined=False, dtype=torch.bfloat16, kv_dtype=None, seed=0, o_dtype=None):
    """A planned wrapper (on the stand-in runtime), its KV argument(s) and a query of the plan's rows
    (dtype and kv_dtype torch.float8_e4m3fn: an FP8 attention plan, its o_data_type o_dtype)."""
    gen = torch.Generator().manual_seed(seed)
    cast = kv_dtype or dtype
    ws = torch.zeros(1 << 16, dtype=torch.uint8)
    opts = dict(q_data_type=dtype, kv_data_type=kv_dtype)
    if o_dtype is not None:
        opts["o_data_type"] = o_dtype
    if kind == "decode":
        w = D(ws, layout)
        w.plan(_i32([0, 2, 3]), _i32([3, 1, 0]), _i32([5, 16]), HQ, HKV, HD, PS, **opts)
        rows, kv = 2, (_cache(5, layout, combined, dtype, gen),)
    elif kind == "prefill_paged":
        w = P(ws, layout)
        w.plan(_i32([0, 3, 4]), _i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), HQ, HKV, HD, PS, causal=True, **opts)
        rows, kv = 4, (_cache(5, layout, combined, dtype, gen),)
    elif kind == "block_sparse_paged":
        # The paged prefill's batch (21 and 16 keys) in blocks of 2 x 8: block rows 0-1 are request
        # 0's (3 column blocks), block row 2 request 1's (2 column blocks).
        w = BS(ws, layout)
        w.plan(_i32([0, 3, 4]), _i32([0, 2, 3]), _i32([4, 0, 2]), _i32([5, 16]), *BS_MASK, HQ, HKV, HD, PS, 2, 8,
               mask_flags=torch.tensor([1, 0, 0, 0, 1], dtype=torch.uint8), causal=True, **opts)
        rows, kv = 4, (_cache(5, layout, combined, dtype, gen),)
    else:
        w = RG(ws, layout)
        w.plan(_i32([0, 3, 4]), _i32([0, 20, 37]), HQ, HKV, HD, causal=True, **opts)
        shape = (37, HKV, HD) if layout == "NHD" else (HKV, 37, HD)
        rows, kv = 4, (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
    if kv_dtype is not None:
        kv = tuple(tuple(t.to(cast) for t in x) if isinstance(x, tuple) else x.to(cast) for x in kv)
    q = torch.randn(rows, HQ, HD, generator=gen).to(dtype)
    return w, kv, q


OP_OF = {"decode": "tessera.decode_run.default", "prefill_paged": "tessera.prefill_paged_run.default",
         "prefill_ragged": "tessera.prefill_ragged_run.default",
         "block_sparse_paged": "tessera.block_sparse_paged_run.default"}

CASES = [
    ("decode", "NHD", False, False, True),
    ("decode", "HND", True, True, True),
    ("decode", "NHD", True, True, False),
    ("prefill_paged", "HND", False, False, True),
    ("prefill_paged", "NHD", True, True, True),
    ("prefill_ragged", "NHD", False, False, True),
    ("prefill_ragged", "HND", False, True, True),
    ("prefill_ragged", "HND", False, False, False),
    ("block_sparse_paged", "NHD", False, False, True),
    ("block_sparse_paged", "HND", True, True, True),
    ("block_sparse_paged", "NHD", False, True, False),
]


@pytest.mark.parametrize("kind,layout,combined,give_out,return_lse", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_wrapper_run_is_one_graph_and_matches_eager(stub, kind, layout, combined, give_out, return_lse):
    w, kv, q = _setup(kind, layout, combined)
    buffers = {}

    def step(q):
        out = buffers.get("out")
        res = w.run(q, *kv, out=out, return_lse=return_lse)
        o = res[0] if return_lse else res
        return (o * 1, res[1]) if return_lse else o * 1

    if give_out:
        buffers["out"] = torch.full_like(q, float("nan"))
    eager = step(q)
    eager_call = stub[0].calls[-1]
    if kind == "block_sparse_paged":  # the plan's block mask, on the workspace's device
        assert eager_call["mask"] == ([0, 2, 1, 2, 1], (torch.uint8, [1, 0, 0, 0, 1]))

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    if give_out:
        buffers["out"] = torch.full_like(q, float("nan"))
    compiled = torch.compile(step, fullgraph=True, backend=record)(q)
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function" and "tessera" in str(n.target)]
    assert called == [OP_OF[kind]]
    assert stub[0].calls[-1] == eager_call, "the op passes the runtime other arguments than the eager run()"
    for a, b in zip(eager if return_lse else (eager,), compiled if return_lse else (compiled,)):
        assert torch.equal(a, b)
    if give_out:
        assert torch.equal(buffers["out"], eager[0] if return_lse else eager), "the caller's out holds the result"
    explanation = torch._dynamo.explain(step)(q)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("kind", ["decode", "prefill_paged", "prefill_ragged", "block_sparse_paged"])
def test_aot_eager_functionalized_matches_eager(stub, kind):
    # aot_eager functionalizes the graph: the mutated out (a view of a larger buffer) and the
    # workspace go through auto_functionalized, as under inductor.
    w, kv, q = _setup(kind, "HND", seed=3)
    big = torch.zeros((2,) + tuple(q.shape), dtype=q.dtype)

    def step(q, big):
        w.run(q, *kv, out=big[1])
        o, lse = w.run(q + 1, *kv, return_lse=True)
        return o, lse

    eager_big = big.clone()
    eager = step(q, eager_big)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, big)
    assert torch.equal(big, eager_big) and torch.count_nonzero(big[1]) > 0
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@pytest.mark.parametrize("kind", ["decode", "prefill_paged", "prefill_ragged", "block_sparse_paged"])
def test_new_plan_of_the_same_shapes_does_not_recompile(stub, kind):
    from torch._dynamo.testing import CompileCounter

    w, kv, q = _setup(kind)
    counter = CompileCounter()
    step = torch.compile(lambda q: w.run(q, *kv), fullgraph=True, backend=counter)
    for seed in range(3):
        if kind == "decode":
            w.plan(_i32([0, 1, 3]), _i32([seed, 2, 4]), _i32([7, 1]), HQ, HKV, HD, PS, q_data_type=torch.bfloat16)
        elif kind == "prefill_paged":
            w.plan(_i32([0, 1, 4]), _i32([0, 1, 3]), _i32([seed, 2, 4]), _i32([7, 1]), HQ, HKV, HD, PS,
                   q_data_type=torch.bfloat16)
        elif kind == "block_sparse_paged":  # a new mask too (the op takes it from the plan): 1 + 2 block rows
            w.plan(_i32([0, 1, 4]), _i32([0, 1, 3]), _i32([seed, 2, 4]), _i32([7, 1]), _i32([0, 1, 2, 2 + seed]),
                   _i32([0, 0, 1, 2][:2 + seed]), HQ, HKV, HD, PS, 2, 8,
                   mask_flags=torch.tensor([0, seed % 2, 1, 0], dtype=torch.uint8), q_data_type=torch.bfloat16)
        else:
            w.plan(_i32([0, 1, 4]), _i32([0, 30 - seed, 37]), HQ, HKV, HD, q_data_type=torch.bfloat16)
        assert torch.equal(step(q), w.run(q, *kv)), f"plan {seed}: compiled != eager"
    assert counter.frame_count == 1


def test_compiled_run_checks_like_eager(stub):
    w, kv, q = _setup("decode")

    def step(q):
        return w.run(q, *kv)

    # A check that fails at trace time raises the eager run()'s error (without fullgraph; with it,
    # Dynamo reports the exception as unsupported).
    with pytest.raises(TypeError, match=r"q.dtype = torch.float16, but the plan was made for q_data_type = torch.bfloat16"):
        torch.compile(step, backend="eager")(q.half())
    # The page ids plan() had on the host are checked against the cache by the op, at run time.
    w.plan(_i32([0, 2, 3]), _i32([3, 1, 0]), _i32([5, 16]), HQ, HKV, HD, PS, q_data_type=torch.bfloat16)
    small = tuple(t[:3] for t in kv[0])
    with pytest.raises(ValueError, match=r"indices\[0\] = 3 is out of range \[0, 3\)"):
        torch.compile(lambda q: w.run(q, small), fullgraph=True, backend="aot_eager")(q)


@pytest.mark.parametrize("kind", ["decode", "prefill_ragged", "block_sparse_paged"])
def test_fp8_cache_scales_under_compile(stub, kind):
    # An fp8 cache's run() scales: floats and one-element tensors, set by the op before the launch.
    w, kv, q = _setup(kind, kv_dtype=torch.float8_e4m3fn, seed=5)
    scale_t = torch.tensor([0.25])

    def step(q, s):
        a = w.run(q, *kv, k_scale=0.5, v_scale=s)
        b = w.run(q, *kv, k_scale=s, v_scale=None)
        return a, b

    eager = step(q, scale_t)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, scale_t)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert not torch.equal(eager[0], eager[1])  # the scales reached the runtime
    assert stub[-1].calls[-1]["kv_dtype"] == "DType.e4m3"
    with pytest.raises(ValueError, match=r"k_scale = -1.0, expected a finite scale > 0"):
        torch.compile(lambda q: w.run(q, *kv, k_scale=-1.0), fullgraph=True, backend="aot_eager")(q)


# --- FP8 attention plans (an e4m3 q with e4m3 K/V, a 16-bit o) on the stand-in runtime -------------------

E4M3 = torch.float8_e4m3fn


def _setup_fp8(kind, layout="NHD", combined=False, o_dtype=None, seed=11):
    """An FP8 attention plan (q_data_type and kv_data_type e4m3, o_data_type o_dtype: None is
    bfloat16) on the stand-in runtime, its KV argument(s) and an e4m3 query."""
    return _setup(kind, layout, combined, dtype=E4M3, kv_dtype=E4M3, seed=seed, o_dtype=o_dtype)


def _scales(as_what):
    """run()'s q_scale, k_scale, v_scale: floats, one-element float32 tensors, or None."""
    values = (0.5, 0.25, 2.0)
    if as_what == "none":
        return (None, None, None)
    if as_what == "tensor":
        return tuple(torch.tensor([x]) for x in values)
    return values


FP8_CASES = [  # kind, layout, combined cache, o_data_type, scales as, out given, return_lse
    ("prefill_paged", "NHD", False, None, "float", False, True),
    ("prefill_paged", "HND", True, torch.float16, "tensor", True, True),
    ("prefill_paged", "NHD", True, torch.bfloat16, "none", True, False),
    ("prefill_paged", "HND", False, torch.float16, "float", False, False),
    ("prefill_ragged", "NHD", False, torch.float16, "tensor", False, True),
    ("prefill_ragged", "HND", False, None, "float", True, True),
    ("prefill_ragged", "NHD", False, torch.bfloat16, "tensor", True, False),
    ("prefill_ragged", "HND", False, torch.float16, "none", False, False),
]


@pytest.mark.parametrize("kind,layout,combined,o_dtype,scales_as,give_out,return_lse", FP8_CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c) for c in FP8_CASES])
def test_fp8_attention_run_is_one_graph_and_matches_eager(stub, kind, layout, combined, o_dtype, scales_as, give_out,
                                                          return_lse):
    # The op allocates (or is given) out of the plan's o dtype, passes q as bytes with q_dtype and
    # q's scale as the eager run() does: the stand-in sees the same call, the results are equal.
    w, kv, q = _setup_fp8(kind, layout, combined, o_dtype)
    expected = o_dtype or torch.bfloat16
    buffers = {}

    def step(q, sq, sk, sv):
        res = w.run(q, *kv, q_scale=sq, k_scale=sk, v_scale=sv, out=buffers.get("out"), return_lse=return_lse)
        o = res[0] if return_lse else res
        return (o * 1, res[1]) if return_lse else o * 1

    scales = _scales(scales_as)
    if give_out:
        buffers["out"] = torch.full(tuple(q.shape), float("nan"), dtype=expected)
    eager = step(q, *scales)
    eager_call = stub[0].calls[-1]
    eager_buf = w._kv_scales.buf.tolist()
    assert eager_call["q"][2] == torch.uint8 and eager_call["q_dtype"] == "DType.e4m3"
    assert eager_call["out"][2] == expected and eager_call["kv_dtype"] == "DType.e4m3"
    assert eager_buf == ([1.0] * 3 if scales_as == "none" else [0.25, 2.0, 0.5])  # k's, v's, q's

    w._kv_scales.buf.fill_(7.0)  # the compiled run writes this call's scales again
    w._kv_scales.last = [None] * 3
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    if give_out:
        buffers["out"] = torch.full(tuple(q.shape), float("nan"), dtype=expected)
    compiled = torch.compile(step, fullgraph=True, backend=record)(q, *scales)
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function" and "tessera" in str(n.target)]
    assert called == [OP_OF[kind]]
    assert stub[0].calls[-1] == eager_call, "the op passes the runtime other arguments than the eager run()"
    assert w._kv_scales.buf.tolist() == eager_buf
    for a, b in zip(eager if return_lse else (eager,), compiled if return_lse else (compiled,)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    o = compiled[0] if return_lse else compiled
    assert o.dtype == expected and o.shape == q.shape
    if give_out:
        assert torch.equal(buffers["out"], o), "the caller's out holds the result"
    explanation = torch._dynamo.explain(step)(q, *scales)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize("kind", ["prefill_paged", "prefill_ragged"])
def test_fp8_attention_aot_eager_functionalized_matches_eager(stub, kind):
    # Under aot_eager (functionalized, as under inductor): a given out that is a view of a larger
    # buffer of the o dtype, and a new out and lse.
    w, kv, q = _setup_fp8(kind, "HND", o_dtype=torch.float16, seed=13)
    big = torch.zeros((2,) + tuple(q.shape), dtype=torch.float16)

    def step(q, big, s):
        w.run(q, *kv, q_scale=s, k_scale=0.5, out=big[1])
        return w.run(q, *kv, q_scale=0.25, v_scale=s, return_lse=True)

    s = torch.tensor([0.125])
    eager_big = big.clone()
    eager = step(q, eager_big, s)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(q, big, s)
    assert torch.equal(big, eager_big) and torch.count_nonzero(big[1]) > 0
    assert compiled[0].dtype == torch.float16 and compiled[1].dtype == torch.float32
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@pytest.mark.parametrize("kind", ["prefill_paged", "prefill_ragged"])
def test_fp8_attention_scales_of_each_call(stub, kind):
    # A new q_scale on a later call reaches the runtime: a tensor's value without recompiling; a
    # float as a float k_scale does (Dynamo specializes on it: the same number of compiles).
    from torch._dynamo.testing import CompileCounter

    w, kv, q = _setup_fp8(kind, seed=17)
    counter = CompileCounter()
    step = torch.compile(lambda q, s: w.run(q, *kv, q_scale=s), fullgraph=True, backend=counter)
    results = []
    for value in (0.5, 0.25, 0.125):
        results.append(step(q, torch.tensor([value])))
        assert w._kv_scales.buf[2].item() == value
        assert torch.equal(results[-1], w.run(q, *kv, q_scale=torch.tensor([value]))), f"q_scale {value}"
    assert counter.frame_count == 1
    assert not torch.equal(results[0], results[1]) and not torch.equal(results[1], results[2])

    compiles = {}
    for name in ("q_scale", "k_scale"):
        torch._dynamo.reset()
        counter = CompileCounter()
        step = torch.compile(lambda q, s: w.run(q, *kv, **{name: s}), fullgraph=True, backend=counter)
        for value in (0.5, 0.25, 0.125):
            got = step(q, value)
            assert torch.equal(got, w.run(q, *kv, **{name: value})), f"{name} {value}"
        compiles[name] = counter.frame_count
    assert compiles["q_scale"] == compiles["k_scale"], compiles


@pytest.mark.parametrize("kind", ["prefill_paged", "prefill_ragged"])
def test_fp8_attention_compiled_run_checks_like_eager(stub, kind):
    w, kv, q = _setup_fp8(kind, o_dtype=torch.float16, seed=19)

    def compiled(fn, fullgraph=False):
        torch._dynamo.reset()
        return torch.compile(fn, fullgraph=fullgraph, backend="eager" if not fullgraph else "aot_eager")

    # At trace time, the eager run()'s errors: q's dtype, out's dtype (the plan's o dtype), a tensor scale.
    with pytest.raises(TypeError, match=r"q.dtype = torch.bfloat16, but the plan was made for q_data_type = "
                                        r"torch.float8_e4m3fn"):
        compiled(lambda q: w.run(q, *kv))(q.to(torch.bfloat16))
    with pytest.raises(TypeError, match=r"out.dtype = torch.bfloat16, expected torch.float16 \(the plan's o_data_type"):
        compiled(lambda q: w.run(q, *kv, out=torch.empty(tuple(q.shape), dtype=torch.bfloat16)))(q)
    with pytest.raises(ValueError, match=r"q_scale = <tensor \(2,\) torch.float32>, expected a float or a float32 "
                                         r"tensor of one element"):
        compiled(lambda q: w.run(q, *kv, q_scale=torch.ones(2)))(q)
    with pytest.raises(TypeError, match=r"q_scale must be None, a float or a float32 tensor, got str"):
        compiled(lambda q: w.run(q, *kv, q_scale="2"))(q)
    # A float's value is checked by the op when it runs, as _KVScaleBuffer.set does in eager mode.
    with pytest.raises(ValueError, match=r"q_scale = -1.0, expected a finite scale > 0"):
        compiled(lambda q: w.run(q, *kv, q_scale=-1.0), fullgraph=True)(q)
    # A 16-bit plan keeps refusing a q_scale.
    w16, kv16, q16 = _setup(kind)
    with pytest.raises(NotImplementedError, match=r"q_scale=2.0 is not supported .*None or 1.0 \(scales apply"):
        compiled(lambda q: w16.run(q, *kv16, q_scale=2.0))(q16)
    assert torch.equal(compiled(lambda q: w16.run(q, *kv16, q_scale=1.0), fullgraph=True)(q16), w16.run(q16, *kv16))


@pytest.mark.parametrize("kind", ["prefill_paged", "prefill_ragged"])
def test_fp8_attention_opcheck_with_the_stand_in_runtime(stub, kind):
    w, kv, q = _setup_fp8(kind, o_dtype=torch.float16, seed=23)
    ws = w._holder.workspace
    o_dtype = torch.float16
    out_of = lambda: torch.empty(tuple(q.shape), dtype=o_dtype)  # noqa: E731
    for out, lse, return_lse, q_scale, q_value in (
            (None, None, True, None, 0.5), (out_of(), None, True, torch.tensor([0.25]), 1.0),
            (out_of(), torch.empty(q.shape[0], HQ), True, None, 1.0), (None, None, False, torch.tensor([2.0]), 1.0)):
        if kind == "prefill_ragged":
            args = (w._handle, q, kv[0], kv[1], "NHD", ws, out, lse, return_lse, None, torch.tensor([0.5]), 2.0, 1.0,
                    q_scale, q_value, o_dtype)
            op = torch.ops.tessera.prefill_ragged_run.default
        else:
            k, v = kv[0]
            args = (w._handle, q, k, v, None, "NHD", w._planned["indices"], ws, out, lse, return_lse, None,
                    torch.tensor([0.5]), 2.0, 1.0, q_scale, q_value, o_dtype)
            op = torch.ops.tessera.prefill_paged_run.default
        # opcheck's test_schema compares every tensor argument before and after the call with
        # torch.allclose, which has no float8 kernel on the CPU ("mul_cpu_reduced_float" not
        # implemented for 'Float8_e4m3fn'): the schema's aliasing and mutation are checked with a
        # 16-bit plan (test_opcheck_with_the_stand_in_runtime), the same schema.
        torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_autograd_registration",
                                                    "test_aot_dispatch_dynamic"))
    # An o_dtype other than the plan's is refused by the op (run() always passes the plan's).
    with pytest.raises(ValueError, match=r"o_dtype = torch.bfloat16, but the plan writes torch.float16"):
        op(*args[:-1], torch.bfloat16)


@pytest.mark.parametrize("kind", ["decode", "prefill_paged", "prefill_ragged", "block_sparse_paged"])
def test_opcheck_with_the_stand_in_runtime(stub, kind):
    w, kv, q = _setup(kind)
    ws = w._holder.workspace
    for out, lse, return_lse in ((None, None, True), (torch.empty_like(q), None, True),
                                 (torch.empty_like(q), torch.empty(q.shape[0], HQ), True), (None, None, False)):
        if kind == "prefill_ragged":
            args = (w._handle, q, kv[0], kv[1], "NHD", ws, out, lse, return_lse, None, None, 1.0, 1.0, None, 1.0,
                    q.dtype)
            op = torch.ops.tessera.prefill_ragged_run.default
        else:
            k, v = kv[0]
            op = getattr(torch.ops.tessera, OP_OF[kind].split(".")[1]).default
            args = (w._handle, q, k, v, None, "NHD", w._planned["indices"], ws, out, lse, return_lse, None, None, 1.0,
                    1.0) + ((None, 1.0, q.dtype) if kind == "prefill_paged" else ())
        torch.library.opcheck(op, args)


def test_handles_do_not_keep_wrappers_alive():
    ws = torch.zeros(1 << 16, dtype=torch.uint8)
    a, b = D(ws), RG(ws)
    assert a._handle != b._handle and R.wrapper_for(a._handle) is a and R.wrapper_for(b._handle) is b
    handle = a._handle
    del a
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no live wrapper has handle {handle}"):
        R.wrapper_for(handle)
    assert R.wrapper_for(b._handle) is b


def test_fixed_addresses_are_static_for_cuda_graphs():
    # What torch._dynamo.mark_static_address(t, guard=False) sets: the workspace and the CUDA-graph
    # page-id buffers (the runtime keeps their addresses), not the other buffers.
    from torch._dynamo.utils import get_static_address_type

    ws, ws2 = torch.zeros(1 << 16, dtype=torch.uint8), torch.zeros(1 << 16, dtype=torch.uint8)
    indptr, indices, last = _i32([0] * 5), _i32([0] * 9), _i32([1] * 4)
    w = D(ws, "NHD", True, False, indptr, indices, last)
    assert get_static_address_type(ws) == "unguarded" and get_static_address_type(indices) == "unguarded"
    assert get_static_address_type(indptr) is None and get_static_address_type(last) is None
    r = RG(ws2)
    r.reset_workspace_buffer(ws3 := torch.zeros(1 << 16, dtype=torch.uint8))
    assert get_static_address_type(ws2) == "unguarded" and get_static_address_type(ws3) == "unguarded"
    assert w.is_cuda_graph_enabled
    # The block-sparse wrapper's: its workspace, page ids, block ids and the flags buffer beside them.
    ws4, pages, blocks = torch.zeros(1 << 16, dtype=torch.uint8), _i32([0] * 9), _i32([0] * 6)
    b = BS(ws4, "NHD", True, paged_kv_indices_buf=pages, mask_indices_buf=blocks)
    assert all(get_static_address_type(t) == "unguarded" for t in (ws4, pages, blocks, b._mask_flags_buf))


# --- GPU: the real runtime ---------------------------------------------------------------------------------


def _gpu_paged(kv_lens, seed, layout="NHD"):
    """A paged bf16 cache (k, v) with the lengths' pages scattered in a larger pool."""
    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / PS) for n in kv_lens]
    total = sum(pages) + 3
    perm = torch.randperm(total, generator=gen)
    indptr = _i32([0] + torch.tensor(pages).cumsum(0).tolist())
    indices = perm[: int(indptr[-1])].to(torch.int32).cuda()
    last = _i32([n - (p - 1) * PS for n, p in zip(kv_lens, pages)])
    shape = (total, PS, HKV, HD) if layout == "NHD" else (total, HKV, PS, HD)
    k = torch.randn(shape, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(shape, generator=gen).to(torch.bfloat16).cuda()
    return indptr, indices, last, (k, v)


def _close(a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    diff = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    assert diff <= 1e-3, f"{what}: compiled differs from eager by {diff}"


def _check_explain_and_compile(step, args, what):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, f"{what}: {explanation}"
    torch._dynamo.reset()
    eager = step(*args)
    compiled = torch.compile(step, fullgraph=True)(*args)
    for a, b in zip(eager, compiled):
        _close(a, b, what)


def _check_reduce_overhead(step, make_q, replan, what, calls=5):
    """mode="reduce-overhead": CUDA graph trees warm up, record, then replay; each call gets new
    queries (and, with `replan`, a new plan first) and must match the eager run of the same plan."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(calls):
        if replan is not None:
            replan(i)
        q = make_q(i)
        eager = [t.clone() for t in step(q)]
        torch.compiler.cudagraph_mark_step_begin()  # a new inference step: earlier outputs may be overwritten
        got = [t.clone() for t in compiled(q)]
        for a, b in zip(eager, got):
            _close(a, b, f"{what}, call {i}")
    assert counters["inductor"]["cudagraph_skips"] == 0, f"{what}: no CUDA graph ({dict(counters['inductor'])})"


@needs_gpu
def test_gpu_decode_compiles():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    indptr, indices, last, cache = _gpu_paged([1, 40, 300, 17], seed=1)
    w = D(ws, "NHD")
    w.plan(indptr, indices, last, HQ, HKV, HD, PS, q_data_type=torch.bfloat16)
    q = torch.randn(4, HQ, HD, device="cuda").to(torch.bfloat16)

    def step(q):
        out, lse = w.run(q, cache, return_lse=True)
        return out, lse

    _check_explain_and_compile(step, (q,), "decode")


@needs_gpu
def test_gpu_prefill_paged_compiles():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    indptr, indices, last, cache = _gpu_paged([5, 40, 300], seed=2, layout="HND")
    qo_indptr = _i32([0, 5, 17, 18])
    w = P(ws, "HND")
    w.plan(qo_indptr, indptr, indices, last, HQ, HKV, HD, PS, causal=True, q_data_type=torch.bfloat16)
    q = torch.randn(18, HQ, HD, device="cuda").to(torch.bfloat16)

    def step(q):
        out, lse = w.run(q, cache, return_lse=True)
        return out, lse

    _check_explain_and_compile(step, (q,), "prefill paged")


@needs_gpu
def test_gpu_block_sparse_paged_compiles():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    kv_lens, qo_lens, br, bc = [5, 40, 300], [5, 12, 1], 4, 32
    indptr, indices, last, cache = _gpu_paged(kv_lens, seed=6, layout="HND")
    qo_indptr = _i32([0, 5, 17, 18])
    # Block rows of 4 queries (2, 3 and 1 per request), each listing every other column block of its
    # request and its last one; flags on none.
    mask_indptr, mask_indices = [0], []
    for qo, kv in zip(qo_lens, kv_lens):
        cols = math.ceil(kv / bc)
        for r in range(math.ceil(qo / br)):
            row = [c for c in range(cols) if (c + r) % 2 == 0 or c == cols - 1]
            mask_indices += row
            mask_indptr.append(mask_indptr[-1] + len(row))
    w = BS(ws, "HND")
    w.plan(qo_indptr, indptr, indices, last, _i32(mask_indptr), _i32(mask_indices), HQ, HKV, HD, PS, br, bc,
           causal=True, q_data_type=torch.bfloat16)
    q = torch.randn(18, HQ, HD, device="cuda").to(torch.bfloat16)

    def step(q):
        out, lse = w.run(q, cache, return_lse=True)
        return out, lse

    _check_explain_and_compile(step, (q,), "block-sparse paged")


@needs_gpu
def test_gpu_prefill_ragged_compiles():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    qo_indptr, kv_indptr = _i32([0, 5, 17, 18]), _i32([0, 5, 150, 450])
    k = torch.randn(450, HKV, HD, device="cuda").to(torch.bfloat16)
    v = torch.randn(450, HKV, HD, device="cuda").to(torch.bfloat16)
    w = RG(ws, "NHD")
    w.plan(qo_indptr, kv_indptr, HQ, HKV, HD, causal=True, q_data_type=torch.bfloat16)
    q = torch.randn(18, HQ, HD, device="cuda").to(torch.bfloat16)

    def step(q):
        out, lse = w.run(q, k, v, return_lse=True)
        return out, lse

    _check_explain_and_compile(step, (q,), "prefill ragged")


@needs_gpu
@pytest.mark.parametrize("scales_as", ["float", "tensor"])
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_gpu_fp8_attention_prefill_compiles(kind, scales_as):
    # FP8 attention (e4m3 q, K and V; float16 o) through the compiled run(): one graph without
    # breaks, the op allocates o in the plan's o_data_type, the eager run's values.
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    qo_indptr = _i32([0, 5, 17, 18])
    plan = dict(causal=True, q_data_type=E4M3, kv_data_type=E4M3, o_data_type=torch.float16)
    if kind == "paged":
        indptr, indices, last, cache = _gpu_paged([5, 40, 300], seed=7, layout="HND")
        kv = (tuple(t.to(E4M3) for t in cache),)
        w = P(ws, "HND")
        make_plan = lambda: w.plan(qo_indptr, indptr, indices, last, HQ, HKV, HD, PS, **plan)  # noqa: E731
    else:
        gen = torch.Generator().manual_seed(8)
        kv = tuple(torch.randn(450, HKV, HD, generator=gen).to(E4M3).cuda() for _ in range(2))
        w = RG(ws, "NHD")
        make_plan = lambda: w.plan(qo_indptr, _i32([0, 5, 150, 450]), HQ, HKV, HD, **plan)  # noqa: E731
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="sm_90a"):
            make_plan()
        pytest.skip("FP8 attention runs on sm_90 only")
    make_plan()
    q = torch.randn(18, HQ, HD, generator=torch.Generator().manual_seed(9)).to(E4M3).cuda()
    scales = (1 / 16, 3 / 64, 1 / 32)
    if scales_as == "tensor":
        scales = tuple(torch.tensor([s], dtype=torch.float32, device="cuda") for s in scales)

    def step(q, sq, sk, sv):
        out, lse = w.run(q, *kv, q_scale=sq, k_scale=sk, v_scale=sv, return_lse=True)
        return out, lse

    _check_explain_and_compile(step, (q,) + scales, f"FP8 attention {kind}, scales as {scales_as}")
    torch._dynamo.reset()
    out, lse = torch.compile(step, fullgraph=True)(q, *scales)
    assert out.dtype == torch.float16 and out.shape == (18, HQ, HD) and lse.dtype == torch.float32
    assert torch.isfinite(out).all()


@needs_gpu
def test_gpu_decode_reduce_overhead():
    batch, max_pages = 4, 40
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    bufs = (torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
            torch.zeros(batch * max_pages, dtype=torch.int32, device="cuda"),
            torch.zeros(batch, dtype=torch.int32, device="cuda"))
    w = D(ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
          paged_kv_last_page_len_buffer=bufs[2])
    steps = [[1, 40, 300, 17], [2, 41, 301, 18], [3, 42, 302, 100], [4, 43, 400, 101], [5, 60, 500, 102]]
    _, _, _, cache = _gpu_paged([max_pages * PS] * batch, seed=3)  # a pool of batch * max_pages + 3 pages
    gen = torch.Generator().manual_seed(4)
    owned = torch.randperm(batch * max_pages, generator=gen).view(batch, max_pages).to(torch.int32)

    def replan(i):
        pages = [math.ceil(n / PS) for n in steps[i]]
        indptr = _i32([0] + torch.tensor(pages).cumsum(0).tolist())
        indices = torch.cat([owned[b, : pages[b]] for b in range(batch)]).cuda()
        last = _i32([n - (p - 1) * PS for n, p in zip(steps[i], pages)])
        w.plan(indptr, indices, last, HQ, HKV, HD, PS, q_data_type=torch.bfloat16)

    def step(q):
        out, lse = w.run(q, cache, return_lse=True)
        return out, lse

    _check_reduce_overhead(step, lambda i: torch.randn(batch, HQ, HD, device="cuda").to(torch.bfloat16), replan,
                           "decode reduce-overhead")


@needs_gpu
def test_gpu_prefill_paged_reduce_overhead():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    indptr, indices, last, cache = _gpu_paged([5, 40, 300], seed=5)
    qo_indptr = _i32([0, 5, 17, 18])
    bufs = [torch.zeros(n, dtype=torch.int32, device="cuda") for n in (4, 4, indices.numel(), 3)]
    w = P(ws, "NHD", use_cuda_graph=True, qo_indptr_buf=bufs[0], paged_kv_indptr_buf=bufs[1],
          paged_kv_indices_buf=bufs[2], paged_kv_last_page_len_buf=bufs[3])
    w.plan(qo_indptr, indptr, indices, last, HQ, HKV, HD, PS, causal=True, q_data_type=torch.bfloat16)

    def step(q):
        out, lse = w.run(q, cache, return_lse=True)
        return out, lse

    _check_reduce_overhead(step, lambda i: torch.randn(18, HQ, HD, device="cuda").to(torch.bfloat16), None,
                           "prefill paged reduce-overhead")


@needs_gpu
def test_gpu_prefill_ragged_reduce_overhead():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    qo_indptr, kv_indptr = _i32([0, 5, 17, 18]), _i32([0, 5, 150, 450])
    k = torch.randn(450, HKV, HD, device="cuda").to(torch.bfloat16)
    v = torch.randn(450, HKV, HD, device="cuda").to(torch.bfloat16)
    bufs = [torch.zeros(4, dtype=torch.int32, device="cuda") for _ in range(2)]
    w = RG(ws, "NHD", use_cuda_graph=True, qo_indptr_buf=bufs[0], kv_indptr_buf=bufs[1])
    w.plan(qo_indptr, kv_indptr, HQ, HKV, HD, causal=True, q_data_type=torch.bfloat16)

    def step(q):
        out, lse = w.run(q, k, v, return_lse=True)
        return out, lse

    _check_reduce_overhead(step, lambda i: torch.randn(18, HQ, HD, device="cuda").to(torch.bfloat16), None,
                           "prefill ragged reduce-overhead")
