"""GPU tests of the decode wrappers' one-call plan() (tessera._C.DecodeFastPlan, W12, bench/README.md).

After a full plan() of a configuration (one query per request, the default variant, a 16-bit
cache) the wrapper keeps a C++ object that takes the next plan()'s page table in one call of the
bindings (checks, graph-mode buffer copies, the C++ plan), or declines (None) so that the Python
path checks and names what is wrong. Here, on the GPU with the real runtime, plain and graph-mode:
- every page table of the table below gets the same outcome with the one-call path as with the
  full path alone: the same exception type and message (and the previous plan kept or dropped
  alike), or a plan whose run gives the same output bits and whose graph buffers hold the same
  page table;
- the common page tables do take the one-call path, the others do not.
Skipped, as test_host_path_gpu.py (whose guard and device it imports), without torch or a GPU.
"""

import pytest

from test_host_path_gpu import DEV, F16, tessera, torch  # the module-level skips of the one-call run's tests
from tessera import decode as D

HQ, HKV, HEAD_DIM, PAGE = 8, 2, 128, 16


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _table(indptr, indices, last_page_len, indptr_device="cpu", indices_device=DEV):
    return dict(indptr=_i32(indptr, indptr_device), indices=_i32(indices, indices_device),
                last_page_len=_i32(last_page_len))


GOOD = ([0, 2, 3], [0, 1, 2], [5, 16])
CASES = {
    "good": lambda: _table(*GOOD),
    "good, another table": lambda: _table([0, 1, 3], [2, 0, 1], [16, 7]),
    "indices on the host": lambda: _table(*GOOD, indices_device="cpu"),
    "indptr on the GPU": lambda: _table(*GOOD, indptr_device=DEV),
    "indptr not from 0": lambda: _table([1, 2, 3], [0, 1, 2], [5, 16]),
    "indptr decreasing": lambda: _table([0, 3, 2], [0, 1, 2], [5, 16]),
    "last_page_len short": lambda: _table([0, 2, 3], [0, 1, 2], [5]),
    "last_page_len 0": lambda: _table([0, 2, 3], [0, 1, 2], [0, 16]),
    "last_page_len above the page": lambda: _table([0, 2, 3], [0, 1, 2], [5, 17]),
    "too few page ids": lambda: _table([0, 2, 3], [0, 1], [5, 16]),
    "indptr int64": lambda: dict(_table(*GOOD), indptr=torch.tensor(GOOD[0], dtype=torch.int64)),
    "a larger batch": lambda: _table([0, 1, 2, 3, 4], [0, 1, 2, 0], [16, 16, 16, 3]),
}
ONE_CALL = {"good", "good, another table", "last_page_len 0", "last_page_len above the page"}


def _wrapper(graph):
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    if not graph:
        return tessera.BatchDecodeWithPagedKVCacheWrapper(ws)
    bufs = (torch.zeros(3, dtype=torch.int32, device=DEV), torch.zeros(4, dtype=torch.int32, device=DEV),
            torch.zeros(2, dtype=torch.int32, device=DEV))
    return tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, *bufs)


def _plan(w, table):
    w.plan(table["indptr"], table["indices"], table["last_page_len"], HQ, HKV, HEAD_DIM, PAGE)


def _outcome(w, table, q, cache):
    """('error', type, message, planned?) or ('ok', out, graph buffers)."""
    try:
        _plan(w, table)
    except Exception as e:  # noqa: BLE001 - the outcome compared
        return ("error", type(e), str(e), w._planned is not None)
    out = w.run(q, cache)
    bufs = None
    if w._use_cuda_graph:
        bufs = [b.clone() for b in (w._paged_kv_indptr_buf, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf)]
    torch.cuda.synchronize()
    return ("ok", out, bufs)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("graph", [False, True], ids=["decode", "graph decode"])
def test_one_call_plan_says_what_the_full_path_says(graph, name, monkeypatch):
    gen = torch.Generator(device=DEV).manual_seed(hash(name) % 2**31)
    table = CASES[name]()
    batch = table["indptr"].shape[0] - 1
    q = torch.randn(max(batch, 1), HQ, HEAD_DIM, dtype=F16, device=DEV, generator=gen)
    cache = tuple(torch.randn(3, PAGE, HKV, HEAD_DIM, dtype=F16, device=DEV, generator=gen) for _ in range(2))

    fast = _wrapper(graph)
    _plan(fast, CASES["good"]())  # the full plan that makes the one-call path
    assert fast._one_call_plan is not None
    full_steps = []
    real_step = fast._plan_step
    fast._plan_step = lambda *a, **k: (full_steps.append(1), real_step(*a, **k))[1]
    got = _outcome(fast, table, q, cache)
    assert (not full_steps) == (name in ONE_CALL), f"{name}: one-call path taken = {not full_steps}"

    with monkeypatch.context() as m:
        m.setattr(D._DecodeFastPlan, "make", staticmethod(lambda w, config: None))
        alone = _wrapper(graph)
        _plan(alone, CASES["good"]())
        assert alone._one_call_plan is None
        want = _outcome(alone, table, q, cache)

    assert got[0] == want[0], f"{name}: one-call path {got[:3]} against the full path {want[:3]}"
    if got[0] == "error":  # the same exception, and the same plan kept (a check) or dropped (the planner)
        assert got[1:] == want[1:], f"{name}: {got[1:]} against {want[1:]}"
        return
    assert torch.equal(got[1], want[1]), f"{name}: outputs differ"
    if graph:
        for a, b in zip(got[2], want[2]):
            assert torch.equal(a, b), f"{name}: graph buffers differ: {a} against {b}"


def test_one_call_plan_replans_and_follows_the_runtime():
    """Repeated plans of changing page tables through the one-call path each run as planned (against
    a fresh wrapper's full plan), the fast run is reused while the page ids are the same tensor,
    and a batch beyond the runtime's bounds grows it through the full path, after which the
    one-call path serves the new runtime."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    cache = tuple(torch.randn(8, PAGE, HKV, HEAD_DIM, dtype=F16, device=DEV, generator=gen) for _ in range(2))
    w = _wrapper(False)
    ids = _i32([3, 1, 4, 0, 5, 2, 7, 6], DEV)
    tables = [([0, 2, 3], [16, 9]), ([0, 1, 3], [4, 16]), ([0, 3, 4, 8], [2, 16, 11]), ([0, 5, 8], [16, 1])]
    runs = []
    for indptr, last in tables:
        runtime_before = w._holder.cpp
        w.plan(_i32(indptr), ids, _i32(last), HQ, HKV, HEAD_DIM, PAGE)
        q = torch.randn(len(last), HQ, HEAD_DIM, dtype=F16, device=DEV, generator=gen)
        ref = _wrapper(False)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(D._DecodeFastPlan, "make", staticmethod(lambda w, config: None))
            ref.plan(_i32(indptr), ids, _i32(last), HQ, HKV, HEAD_DIM, PAGE)
        assert torch.equal(w.run(q, cache), ref.run(q, cache)), f"page table {indptr}"
        assert w._one_call_plan is not None and w._one_call_plan.cpp is w._holder.cpp
        runs.append((runtime_before, w._holder.cpp, w._planned["run_fast"]))
    # The third table (3 requests) outgrew the first runtime (bounds of 2): a new one, then kept.
    assert runs[2][0] is not runs[2][1] and runs[3][0] is runs[3][1]
    assert runs[0][2] is not None and runs[1][2] is runs[0][2]  # one fast run while ids are one tensor
