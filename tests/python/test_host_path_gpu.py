"""GPU tests of the paged wrappers' one-call run() (tessera._C.PagedFastRun, W12, bench/README.md).

A paged plan (decode, graph-mode decode, paged prefill) makes a C++ object that takes run(q,
paged_kv_cache[, out]) in one call of the bindings: it reads the tensors through PyTorch's DLPack
exchange table, allocates a missing out through PyTorch's allocator and launches on PyTorch's
current stream, or declines (None) so that the Python path checks and names what is wrong. Here,
on the GPU with the real runtime:
- every input of test_host_path.py's table (and a strided q) gets the same outcome with the fast
  run as with the full path alone: the same exception type and message, or the same output bits;
  the common calls do take the fast run and the others do not;
- the output it allocates is a contiguous tensor of q's dtype on the plan's GPU, a new one per
  call, written on the current stream (a side stream's run matches; a CUDA graph captures the
  allocating call and its replays recompute from new queries).
Skipped (with the reason) when torch.cuda.is_available() is False.
"""

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False): GPU tests skipped", allow_module_level=True)

import tessera  # noqa: E402
from test_cpu import _decode_plan, _i32, _paged_plan  # noqa: E402
from test_host_path import PAGED_CASES, _paged_run  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())
F16 = torch.float16

CASES = dict(PAGED_CASES)
CASES["q strided"] = lambda: dict(q=torch.zeros(2, 8, 256, dtype=F16)[:, :, :128],
                                  cache=(torch.zeros(3, 16, 2, 128, dtype=F16), torch.zeros(3, 16, 2, 128, dtype=F16)))
# The calls the fast run takes: exact tensors of the plan's dtypes and shapes, (k, v) or one tensor,
# perhaps out, any strides (the runtime checks them, as on the full path); nothing else (lse, scales
# and lists go the full path).
FAST = {"good", "good, one tensor", "q strided"}


def _workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


def _planned(wrapper):
    """A wrapper of kind `wrapper` planned as test_host_path's table expects: batch 2, 8 query
    heads, 2 KV heads, head dim 128, page size 16, fp16, page ids 0, 1, 2 given on the host."""
    if wrapper == "decode":
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace())
        _decode_plan(w)
    elif wrapper == "graph decode":
        bufs = (torch.zeros(3, dtype=torch.int32, device=DEV), torch.zeros(4, dtype=torch.int32, device=DEV),
                torch.zeros(2, dtype=torch.int32, device=DEV))
        w = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(_workspace(), *bufs)
        _decode_plan(w)
    else:
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(_workspace())
        _paged_plan(w, qo_indptr=_i32([0, 1, 2]))
    return w


def _randomised(x, gen):
    """x with every floating CUDA tensor in it filled with random values (in place)."""
    if isinstance(x, torch.Tensor):
        if x.is_cuda and x.is_floating_point():
            x.copy_(torch.randn(x.shape, generator=gen, device=DEV).to(x.dtype))
    elif isinstance(x, (tuple, list)):
        for a in x:
            _randomised(a, gen)
    elif isinstance(x, dict):
        for a in x.values():
            _randomised(a, gen)
    return x


def _outcome(fn):
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the point
        return type(e), str(e)
    torch.cuda.synchronize()
    results = result if isinstance(result, tuple) else (result,)
    return "ok", tuple((tuple(r.shape), r.dtype, r.stride(), r.clone()) for r in results)


def _same(a, b):
    if a[0] != "ok" or b[0] != "ok":
        return a == b
    return len(a[1]) == len(b[1]) and all(
        x[:3] == y[:3] and torch.equal(x[3], y[3]) for x, y in zip(a[1], b[1]))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("wrapper", ["decode", "graph decode", "paged prefill"])
def test_fast_run_says_what_the_full_path_says(wrapper, name):
    w = _planned(wrapper)
    gen = torch.Generator(device=DEV).manual_seed(hash(name) % 2**31)
    torch.set_default_device(DEV)
    try:
        case = _randomised(CASES[name](), gen)
    finally:
        torch.set_default_device(None)
    planned = w._planned
    fast_run = planned["run_fast"]
    assert fast_run is not None
    taken = []

    def spy(q, cache, out=None):
        result = fast_run(q, cache, out)
        taken.append(result is not None)
        return result

    w._planned = dict(planned, run_fast=spy)
    fast = _outcome(_paged_run(w, case))
    w._planned = {k: v for k, v in planned.items() if k not in ("device", "run_fast")}
    slow = _outcome(_paged_run(w, case))
    w._planned = planned
    assert _same(fast, slow), (fast[:1], slow[:1], fast if fast[0] != "ok" else "", slow if slow[0] != "ok" else "")
    assert any(taken) == (name in FAST), (name, taken)
    if name in FAST:
        assert fast[0] == "ok" and torch.isfinite(fast[1][0][3].float()).all()


def _decode_inputs(batch=5, pages_per_req=7, hq=8, hkv=2, d=128, seed=7):
    """A decode plan's inputs with random K/V: (indptr, indices, last_page_len) on the host, the
    (k, v) cache and q."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    num_pages = batch * pages_per_req
    k = torch.randn(num_pages, 16, hkv, d, generator=gen, device=DEV).to(F16)
    v = torch.randn(num_pages, 16, hkv, d, generator=gen, device=DEV).to(F16)
    q = torch.randn(batch, hq, d, generator=gen, device=DEV).to(F16)
    indptr = _i32([b * pages_per_req for b in range(batch + 1)])
    indices = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    last = _i32([1 + (3 * b) % 16 for b in range(batch)])
    return (indptr, indices, last), (k, v), q


def test_fast_run_allocates_on_the_current_stream():
    (indptr, indices, last), kv, q = _decode_inputs()
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace())
    w.plan(indptr, indices.to(DEV), last, 8, 2, 128, 16)
    planned = w._planned
    reference = w.run(q, kv, out=torch.full_like(q, float("nan")))
    direct = planned["run_fast"](q, kv, None)  # the common call is the fast run's
    assert direct is not None and torch.equal(direct, reference)
    first = w.run(q, kv)
    second = w.run(q, kv)
    assert first.data_ptr() != second.data_ptr()
    for o in (first, second):
        assert o.is_contiguous() and o.dtype == F16 and o.device == DEV and o.shape == q.shape
        assert torch.equal(o, reference)
    # On a side stream, after work queued there that the run must follow.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    q2 = torch.zeros_like(q)
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000)  # the copy below and the run after it wait for this
        q2.copy_(q)
        o = w.run(q2, kv)
    side.synchronize()
    assert torch.equal(o, reference)
    # The full path alone agrees (the fast run was taken above: its object made no new plan).
    assert w._planned is planned
    w._planned = {k: v for k, v in planned.items() if k not in ("device", "run_fast")}
    assert torch.equal(w.run(q, kv), reference)


def test_a_graph_captures_the_allocating_run():
    (indptr, indices, last), kv, q = _decode_inputs(seed=11)
    bufs = (torch.zeros(6, dtype=torch.int32, device=DEV), torch.zeros(indices.numel(), dtype=torch.int32, device=DEV),
            torch.zeros(5, dtype=torch.int32, device=DEV))
    w = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(_workspace(), *bufs)
    w.plan(indptr, indices.to(DEV), last, 8, 2, 128, 16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q, kv)  # warm-up off the default stream, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = w.run(q, kv)  # out allocated inside the capture (the graph's memory pool)
    for seed in (1, 2):
        q.copy_(torch.randn(q.shape, generator=torch.Generator(device=DEV).manual_seed(seed), device=DEV).to(F16))
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, w.run(q, kv, out=torch.empty_like(q)))
