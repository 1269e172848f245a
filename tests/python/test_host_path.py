"""CPU tests of the wrappers' lean per-call path (W12, bench/README.md): the fast checks of run() and
plan() still validate, and say exactly what the full checks say.

run() of the paged and ragged wrappers first compares q, out, lse and the KV cache against values
the plan computed once (its device, dtypes, head counts, a page's shape); whatever differs goes
through the full checks, which name the argument. Here every input of a table of good and bad
ones gets the same outcome (the same exception type and message, or the same arguments handed to
the runtime) with the fast paths and with the full checks alone (the plan without its "device"
and "run_fast" entries, which the fast paths need). The runtime classes are stand-ins that record
their calls, as in test_wrapper_options.py; no GPU is needed.

The last part checks what the fast paths keep between calls (each plan's constants, the
runtime's bounds as ints) and the bindings they use: the direct export of torch tensors (the same
views as DLPack's capsule) and the graph-mode plan's page-table copies (tessera._C._copy_index_arrays).
"""

import pytest

import tessera
from tessera import _C
from tessera import _utils as U
from test_cpu import _decode_plan, _i32, _paged_plan, _ragged_plan, _ws  # the CPU plan helpers
from conftest import RecordingRuntime  # the recording runtime stand-in

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

D, G, P, R = (tessera.BatchDecodeWithPagedKVCacheWrapper, tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
              tessera.BatchPrefillWithPagedKVCacheWrapper, tessera.BatchPrefillWithRaggedKVCacheWrapper)
F16 = torch.float16


@pytest.fixture
def stand_ins(install_runtime_stand_ins):
    """The runtime classes replaced by recorders (conftest.RecordingRuntime), device checks lifted."""
    install_runtime_stand_ins(("BatchDecodeWrapper", "BatchPrefillPagedWrapper", "BatchPrefillRaggedWrapper"))


def _outcome(fn):
    """('ok', a summary of what the runtime was handed) or (exception type, message)."""
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the point
        return type(e), str(e)
    return "ok", _summary(result)


def _summary(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype, str(x.device))
    if isinstance(x, (tuple, list)):
        return tuple(_summary(a) for a in x)
    if isinstance(x, dict):
        return {k: _summary(v) for k, v in x.items()}
    return x


def _both_ways(w, call):
    """The outcome of call() with the plan as made (fast paths on) and with the full checks alone,
    each with what the stand-in runtime received."""
    planned = w._planned
    slow = {k: v for k, v in planned.items() if k not in ("device", "run_fast")}
    results = []
    for p in (planned, slow):
        w._planned = p
        runtime = w._holder.cpp
        before = len(runtime.runs)
        outcome = _outcome(call)
        handed = _summary(runtime.runs[before:])
        results.append((outcome, handed))
    w._planned = planned
    return results


def _pages(n=3, page=16, hkv=2, d=128, dtype=F16, hnd=False):
    shape = (n, hkv, page, d) if hnd else (n, page, hkv, d)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


# q, cache, out, lse variations against a plan of batch 2, 8 query heads, 2 KV heads, head dim 128,
# page size 16, fp16, three pages (_decode_plan / _paged_plan).
def _q(rows=2, hq=8, d=128, dtype=F16):
    return torch.zeros(rows, hq, d, dtype=dtype)


PAGED_CASES = {
    "good": lambda: dict(q=_q(), cache=_pages()),
    "good, one tensor": lambda: dict(q=_q(), cache=torch.zeros(3, 2, 16, 2, 128, dtype=F16)),
    "good, out and lse": lambda: dict(q=_q(), cache=_pages(), out=torch.zeros(2, 8, 128, dtype=F16),
                                      lse=torch.zeros(2, 8), return_lse=True),
    "good, lse allocated": lambda: dict(q=_q(), cache=_pages(), return_lse=True),
    "q of 2 dims": lambda: dict(q=torch.zeros(2, 8 * 128, dtype=F16), cache=_pages()),
    "q heads": lambda: dict(q=_q(hq=4), cache=_pages()),
    "q head dim": lambda: dict(q=_q(d=64), cache=_pages()),
    "q dtype": lambda: dict(q=_q(dtype=torch.bfloat16), cache=_pages()),
    "q not a tensor": lambda: dict(q=[[0.0]], cache=_pages()),
    "q on another device": lambda: dict(q=_q().to("meta"), cache=_pages()),
    "cache page size": lambda: dict(q=_q(), cache=_pages(page=8)),
    "cache heads": lambda: dict(q=_q(), cache=_pages(hkv=4)),
    "cache head dim": lambda: dict(q=_q(), cache=_pages(d=64)),
    "cache dtype": lambda: dict(q=_q(), cache=_pages(dtype=torch.bfloat16)),
    "cache layout": lambda: dict(q=_q(), cache=_pages(hnd=True)),
    "cache of 3 entries": lambda: dict(q=_q(), cache=_pages() + (None,)),
    "cache as a list": lambda: dict(q=_q(), cache=list(_pages())),
    "v of another shape": lambda: dict(q=_q(), cache=(_pages()[0], torch.zeros(4, 16, 2, 128, dtype=F16))),
    "v on another device": lambda: dict(q=_q(), cache=(_pages()[0], _pages()[1].to("meta"))),
    "too few pages": lambda: dict(q=_q(), cache=_pages(n=2)),
    "one tensor, wrong 2nd dim": lambda: dict(q=_q(), cache=torch.zeros(3, 3, 16, 2, 128, dtype=F16)),
    "one tensor, dtype": lambda: dict(q=_q(), cache=torch.zeros(3, 2, 16, 2, 128, dtype=torch.bfloat16)),
    "out shape": lambda: dict(q=_q(), cache=_pages(), out=torch.zeros(3, 8, 128, dtype=F16)),
    "out dtype": lambda: dict(q=_q(), cache=_pages(), out=torch.zeros(2, 8, 128, dtype=torch.bfloat16)),
    "out on another device": lambda: dict(q=_q(), cache=_pages(), out=torch.zeros(2, 8, 128, dtype=F16, device="meta")),
    "out not a tensor": lambda: dict(q=_q(), cache=_pages(), out=0),
    "lse shape": lambda: dict(q=_q(), cache=_pages(), lse=torch.zeros(2, 4), return_lse=True),
    "lse dtype": lambda: dict(q=_q(), cache=_pages(), lse=torch.zeros(2, 8, dtype=F16), return_lse=True),
    "k_scale on a 16-bit cache": lambda: dict(q=_q(), cache=_pages(), k_scale=2.0),
    "v_scale 1.0": lambda: dict(q=_q(), cache=_pages(), v_scale=1.0),
}

PAGED_ACCEPTED = {"good", "good, one tensor", "good, out and lse", "good, lse allocated", "cache as a list",
                  "v_scale 1.0"}


def _paged_run(w, case):
    kwargs = dict(case)
    q, cache = kwargs.pop("q"), kwargs.pop("cache")
    return lambda: w.run(q, cache, **kwargs)


@pytest.mark.parametrize("name", sorted(PAGED_CASES))
@pytest.mark.parametrize("wrapper", ["decode", "graph decode", "paged prefill"])
def test_paged_run_fast_path_says_what_the_full_checks_say(stand_ins, wrapper, name):
    if wrapper == "decode":
        w = D(_ws())
        _decode_plan(w)
    elif wrapper == "graph decode":
        w = G(_ws(), _i32([0] * 3), _i32([0] * 4), _i32([0] * 2))
        _decode_plan(w)
    else:
        w = P(_ws())
        _paged_plan(w, qo_indptr=_i32([0, 1, 2]))
    fast, slow = _both_ways(w, _paged_run(w, PAGED_CASES[name]()))
    assert fast == slow
    if name in PAGED_ACCEPTED:
        assert fast[0][0] == "ok" and len(fast[1]) == 1, fast
    else:
        assert fast[0][0] != "ok" and not fast[1], f"{name}: accepted"


def test_fast_path_keeps_the_named_errors(stand_ins):
    # The errors of the table above, spelled out for the common mistakes.
    w = D(_ws())
    _decode_plan(w)
    k, v = _pages()
    with pytest.raises(ValueError, match=r"q has shape \(2, 4, 128\), expected \[rows, 8, 128\]"):
        w.run(_q(hq=4), (k, v))
    with pytest.raises(TypeError, match=r"q.dtype = torch.bfloat16, but the plan was made for q_data_type = torch.float16"):
        w.run(_q(dtype=torch.bfloat16), (k, v))
    with pytest.raises(ValueError, match=r"paged_kv_cache has shape \(3, 8, 2, 128\); with kv_layout='NHD'"):
        w.run(_q(), _pages(page=8))
    with pytest.raises(TypeError, match=r"paged_kv_cache\[0\].dtype = torch.bfloat16, but the plan was made for"):
        w.run(_q(), _pages(dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"indices\[2\] = 2 is out of range \[0, 2\)"):
        w.run(_q(), _pages(n=2))
    with pytest.raises(ValueError, match=r"out has shape \(3, 8, 128\), expected \(2, 8, 128\)"):
        w.run(_q(), (k, v), out=torch.zeros(3, 8, 128, dtype=F16))
    with pytest.raises(ValueError, match=r"paged_kv_cache\[0\] is on cpu, expected meta \(the device of q\)"):
        w.run(_q().to("meta"), (k, v))
    with pytest.raises(NotImplementedError, match=r"run\(\) got 1 extra positional argument"):
        w.run(_q(), (k, v), None)
    with pytest.raises(NotImplementedError, match=r"q_scale"):
        w.run(_q(), (k, v), q_scale=2.0)
    with pytest.raises(NotImplementedError, match=r"window_left=5 in run\(\) differs from the plan's window_left=-1"):
        w.run(_q(), (k, v), window_left=5)
    # And a good call after the bad ones goes through, handing the runtime the plan's page ids.
    out = w.run(_q(), (k, v))
    assert out.shape == (2, 8, 128) and out.dtype == F16
    args, kwargs = w._holder.cpp.runs[-1]
    assert args[0].shape == (2, 8, 128) and args[1] is k and args[2] is v and args[3] is None
    assert args[4] == _C.Layout.NHD and args[5].tolist() == [0, 1, 2] and args[6] is out
    assert kwargs == {"kv_dtype": None}


def test_q_rows_fixed_by_the_plan(stand_ins):
    # q_len_per_req > 1 fixes the query rows: the fast path compares them too.
    w = D(_ws())
    _decode_plan(w, q_len_per_req=3)
    k, v = _pages()
    with pytest.raises(ValueError, match=r"q has 2 rows, expected 6: the plan has q_len_per_req = 3"):
        w.run(_q(rows=2), (k, v))
    assert w.run(_q(rows=6), (k, v)).shape == (6, 8, 128)


RAGGED_CASES = {
    "good": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 128, dtype=F16), v=torch.zeros(37, 2, 128, dtype=F16)),
    "k heads": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 4, 128, dtype=F16), v=torch.zeros(37, 4, 128, dtype=F16)),
    "k head dim": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 64, dtype=F16), v=torch.zeros(37, 2, 64, dtype=F16)),
    "v rows": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 128, dtype=F16), v=torch.zeros(36, 2, 128, dtype=F16)),
    "v dtype": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 128, dtype=F16),
                            v=torch.zeros(37, 2, 128, dtype=torch.bfloat16)),
    "k of 4 dims": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 128, 1, dtype=F16),
                                v=torch.zeros(37, 2, 128, dtype=F16)),
    "k on another device": lambda: dict(q=_q(rows=4), k=torch.zeros(37, 2, 128, dtype=F16, device="meta"),
                                        v=torch.zeros(37, 2, 128, dtype=F16)),
    "q heads": lambda: dict(q=_q(rows=4, hq=2), k=torch.zeros(37, 2, 128, dtype=F16),
                            v=torch.zeros(37, 2, 128, dtype=F16)),
}


@pytest.mark.parametrize("name", sorted(RAGGED_CASES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_run_fast_path_says_what_the_full_checks_say(stand_ins, layout, name):
    w = R(_ws(), layout)
    _ragged_plan(w)
    case = RAGGED_CASES[name]()
    q, k, v = case["q"], case["k"], case["v"]
    if layout == "HND" and k.dim() == 3 and v.dim() == 3:
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    fast, slow = _both_ways(w, lambda: w.run(q, k, v))
    assert fast == slow
    assert (fast[0][0] == "ok") == (name == "good"), fast


# --- the plan-side shortcuts ---------------------------------------------------------------------


def test_indptr_checks_keep_their_messages():
    for n in (3, U._LIST_CHECK_MAX + 5):  # the list shortcut and the tensor operations
        good = torch.arange(n, dtype=torch.int32)
        assert U.check_indptr_values("indptr", good) == n - 1
        bad = good.clone()
        bad[0] = 1
        with pytest.raises(ValueError, match=r"^indptr\[0\] = 1, expected 0$"):
            U.check_indptr_values("indptr", bad)
        bad = good.clone()
        bad[2] = 0
        with pytest.raises(ValueError, match=r"^indptr\[2\] = 0, expected >= 1 \(indptr must be non-decreasing\)$"):
            U.check_indptr_values("indptr", bad)
    with pytest.raises(ValueError, match=r"indptr is empty"):
        U.check_indptr_values("indptr", _i32([]))


def test_default_variant_shortcut_matches_the_checks():
    fast = U.resolve_variant("NONE", -1, None, None, None)
    slow = U.resolve_variant("NONE", -1, 0.0, None, None)  # not the shortcut (logits_soft_cap given)
    assert [getattr(fast, n) for n in U.Variant.__slots__] == [getattr(slow, n) for n in U.Variant.__slots__]
    assert fast.is_default()
    # Near-defaults still get their checks.
    with pytest.raises(TypeError, match=r"window_left must be an int, got float"):
        U.resolve_variant("NONE", -1.0, None, None, None)
    with pytest.raises(TypeError, match=r"window_left must be an int, got bool"):
        U.resolve_variant("NONE", True, None, None, None)
    with pytest.raises(ValueError, match=r"pos_encoding_mode = 'none'"):
        U.resolve_variant("none", -1, None, None, None)
    with pytest.raises(TypeError, match=r"num_sink_tokens must be an int, got bool"):
        U.resolve_variant("NONE", -1, None, None, None, num_sink_tokens=False)


def test_plan_dtype_memo_never_remembers_errors():
    assert U.resolve_plan_dtypes("bf16", None) is torch.bfloat16
    assert U.resolve_plan_dtypes("bf16", None) is torch.bfloat16  # remembered
    for _ in range(2):
        with pytest.raises(TypeError, match=r"q_data_type = 'bf17' is not a dtype Tessera knows"):
            U.resolve_plan_dtypes("bf17", None)
        with pytest.raises(TypeError, match=r"q_data_type must be a torch.dtype or a string, got list"):
            U.resolve_plan_dtypes(["bf16"], None)  # unhashable: checked every time
    assert U.resolve_plan_kv_dtype(torch.float16, "e4m3") is torch.float8_e4m3fn


def test_positive_int_shortcut_keeps_the_checks():
    assert U.check_positive_int("page_size", 16) == 16
    with pytest.raises(TypeError, match=r"page_size must be an int, got bool"):
        U.check_positive_int("page_size", True)
    with pytest.raises(ValueError, match=r"page_size = 0, expected >= 1"):
        U.check_positive_int("page_size", 0)


# --- the call into the bindings ------------------------------------------------------------------


def test_launch_falls_back_to_call_when_the_binding_refuses():
    calls = []

    def binding(*args):
        calls.append(args)
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            raise TypeError("incompatible function arguments")  # what nanobind says
        return "done"

    x = torch.zeros(2, requires_grad=True)
    assert U.launch(binding, x, x, 1) == "done"
    assert len(calls) == 2 and not calls[1][0].requires_grad  # call() detached it
    with pytest.raises(ValueError, match="not a TypeError"):
        U.launch(lambda *a: (_ for _ in ()).throw(ValueError("not a TypeError")), x, x)


def test_bindings_take_torch_tensors_directly():
    probe = getattr(_C, "_run_arguments_probe", None)
    if probe is None:
        pytest.skip("this build of tessera._C has no _run_arguments_probe")
    q, o = _q(), _q()
    k = torch.zeros(3, 16, 2, 256, dtype=F16)[..., :128]  # strided
    indices = _i32([0, 1, 2])
    probe(q, k, k, None, _C.Layout.NHD, indices, o, None, 0)
    probe(q.clone().requires_grad_(), k, k, None, _C.Layout.NHD, indices, o, None, 0)  # autograd: no matter
    sub = type("Sub", (torch.Tensor,), {})
    probe(q.as_subclass(sub), k, k, None, _C.Layout.NHD, indices, o, None, 0)  # through __dlpack__
    with pytest.raises(TypeError, match="incompatible function arguments"):
        probe([1.0], k, k, None, _C.Layout.NHD, indices, o, None, 0)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        probe(torch.ones(2, 2).to_sparse(), k, k, None, _C.Layout.NHD, indices, o, None, 0)
    with pytest.raises(ValueError, match=r"out: DLTensor.ndim = 7 is out of range"):
        probe(q, k, k, None, _C.Layout.NHD, indices, torch.zeros((1,) * 7), None, 0)


@pytest.mark.parametrize("wrapper", ["decode", "paged prefill", "ragged prefill"])
def test_good_calls_take_the_fast_path(stand_ins, monkeypatch, wrapper):
    # The full checks are not run for a good call (what makes run() cheap): they would raise here.
    if wrapper == "decode":
        w = D(_ws())
        _decode_plan(w)
        args = (_q(), _pages())
    elif wrapper == "paged prefill":
        w = P(_ws())
        _paged_plan(w, qo_indptr=_i32([0, 1, 2]))
        args = (_q(), torch.zeros(3, 2, 16, 2, 128, dtype=F16))
    else:
        w = R(_ws())
        _ragged_plan(w)
        args = (_q(rows=4), torch.zeros(37, 2, 128, dtype=F16), torch.zeros(37, 2, 128, dtype=F16))
    w.run(*args)  # the page-id check of this cache's page count, once

    def full_check(*a, **k):
        raise AssertionError("the full checks ran")

    for name in ("check_tensor", "check_shape", "check_same_device", "unpack_paged_kv_cache", "kv_data_dtype_check",
                 "check_scale", "check_kv_layout", "call"):
        monkeypatch.setattr(U, name, full_check)
    out, lse = w.run(*args, return_lse=True)
    assert out.shape == (args[0].shape[0], 8, 128) and lse.shape == (args[0].shape[0], 8)
    assert len(w._holder.cpp.runs) == 2


# --- what the fast paths keep, and the bindings they call (W12) ---------------------------------


def test_run_fast_path_follows_each_plan(stand_ins):
    # The fast path's constants are the plan's: a new plan (other page ids, another dtype) replaces
    # them, and a run() against the old plan's expectations fails with the full path's error.
    w = D(_ws())
    _decode_plan(w)
    k, v = _pages(n=4)
    w.run(_q(), (k, v))
    first = w._holder.cpp.runs[-1][0][5]
    assert first.tolist() == [0, 1, 2]
    _decode_plan(w, indices=_i32([3, 2, 1]))
    w.run(_q(), (k, v))
    assert w._holder.cpp.runs[-1][0][5].tolist() == [3, 2, 1]
    assert w._planned["run_fast"] is not None
    _decode_plan(w, q_data_type=torch.bfloat16)
    with pytest.raises(TypeError, match=r"q.dtype = torch.float16, but the plan was made for q_data_type = torch.bfloat16"):
        w.run(_q(), (k, v))
    bf = _pages(n=4, dtype=torch.bfloat16)
    assert w.run(_q(dtype=torch.bfloat16), bf).dtype == torch.bfloat16
    # A page id beyond a smaller cache is still caught (the host ids' check, once per page count).
    _decode_plan(w, indices=_i32([0, 1, 3]))
    with pytest.raises(ValueError, match=r"indices\[2\] = 3 is out of range \[0, 3\)"):
        w.run(_q(), _pages(n=3))


def test_run_queries_the_stream_at_every_call(stand_ins, monkeypatch):
    # PyTorch's current stream can change between calls: it is never kept.
    streams = iter(range(100, 200))
    monkeypatch.setattr(U, "current_stream", lambda device: next(streams))
    for wrapper in (D(_ws()), G(_ws(), _i32([0] * 3), _i32([0] * 4), _i32([0] * 2))):
        _decode_plan(wrapper)
        k, v = _pages()
        wrapper.run(_q(), (k, v))
        wrapper.run(_q(), (k, v), out=torch.zeros(2, 8, 128, dtype=F16))
        a, b = (args[8] for args, _ in wrapper._holder.cpp.runs[-2:])
        assert a != b


def test_fast_path_out_is_what_the_full_path_allocates(stand_ins):
    # out is allocated contiguous, whatever q's strides (as torch.empty of its shape).
    w = D(_ws())
    _decode_plan(w)
    cache = _pages()
    odd = torch.zeros(4096, dtype=F16).as_strided((2, 8, 128), (1024, 128, 1))  # contiguous
    odd1 = torch.zeros(4096, dtype=F16).as_strided((1, 8, 128), (3000, 128, 1))  # contiguous, odd size-1 stride
    strided = torch.zeros(2, 8, 256, dtype=F16)[:, :, :128]  # not contiguous
    _decode_plan(w)
    for q in (odd, strided):
        fast, slow = _both_ways(w, lambda: w.run(q, cache).stride())
        assert fast == slow == (("ok", (1024, 128, 1)), fast[1]), (fast, slow)
    _decode_plan(w, indptr=_i32([0, 3]), last_page_len=_i32([5]))
    fast, slow = _both_ways(w, lambda: w.run(odd1, cache).stride())
    assert fast == slow and fast[0] == ("ok", (1024, 128, 1))


def test_fast_path_only_for_the_common_call(stand_ins):
    # Anything beyond (q, cache, out) takes the full path, which behaves as before.
    w = D(_ws())
    _decode_plan(w)
    k, v = _pages()
    sub = type("Sub", (torch.Tensor,), {})
    out, lse = w.run(_q().as_subclass(sub), (k, v), return_lse=True)
    assert out.shape == (2, 8, 128) and lse.shape == (2, 8)
    assert w.run(_q(), [k, v]).shape == (2, 8, 128)  # a list: the full path accepts it
    with pytest.raises(NotImplementedError, match=r"k_scale"):
        w.run(_q(), (k, v), k_scale=2.0)
    # An fp8 cache's plan has no fast path (run() fills the scale buffer).
    _decode_plan(w, kv_data_type=torch.float8_e4m3fn)
    assert w._planned["run_fast"] is None


def test_plan_hands_the_fast_run_its_constants(stand_ins):
    # What each plan passes to the C++ wrapper's fast_run() (tessera._C.PagedFastRun): the page ids
    # run() reads, the host ids' check (ids given on the host only), the device, dtypes, head
    # counts and dims, the rows a q_len_per_req plan fixes (-1: any), a page's K and V shape in
    # the layout, and the layout.
    w = D(_ws())
    _decode_plan(w)
    indices, host_ids, *static = w._holder.cpp.fast_runs[-1]
    assert indices is w._planned["indices"] and host_ids is w._planned["host_indices"]
    dev = w._planned["device"].index  # the workspace's GPU (None here: the stand-ins plan on the CPU)
    assert static == [dev, _C.DType.f16, _C.DType.f16, 8, 128, 128, -1, (16, 2, 128), (16, 2, 128), _C.Layout.NHD,
                      torch.empty_like, torch.contiguous_format]
    _decode_plan(w, q_len_per_req=3, q_data_type=torch.bfloat16)
    assert w._holder.cpp.fast_runs[-1][2:] == (dev, _C.DType.bf16, _C.DType.bf16, 8, 128, 128, 6, (16, 2, 128),
                                               (16, 2, 128), _C.Layout.NHD, torch.empty_like, torch.contiguous_format)
    hnd = P(_ws(), "HND")
    _paged_plan(hnd, head_dim_qk=192, head_dim_vo=128)
    assert hnd._holder.cpp.fast_runs[-1][2:] == (dev, _C.DType.f16, _C.DType.f16, 8, 192, 128, -1, (2, 16, 192),
                                                 (2, 16, 128), _C.Layout.HND, torch.empty_like, torch.contiguous_format)
    # fp8 caches have no fast run: fast_run() is not called.
    cpp, n = w._holder.cpp, len(w._holder.cpp.fast_runs)
    _decode_plan(w, kv_data_type=torch.float8_e4m3fn)
    assert len(w._holder.cpp.fast_runs) == (n if w._holder.cpp is cpp else 0) and w._planned["run_fast"] is None


def test_bounds_key_says_what_fits_says():
    from tessera import _runtime as R

    class Bounds:
        def __init__(self, *v):
            (self.max_batch_size, self.max_total_qo_tokens, self.num_qo_heads, self.num_kv_heads, self.head_dim,
             self.head_dim_vo) = v

    needs = [R._Need(4, 8, 32, 8, 128), R._Need(8, 8, 32, 8, 128), R._Need(4, 16, 32, 8, 128),
             R._Need(4, 8, 64, 8, 128), R._Need(4, 8, 32, 16, 128), R._Need(4, 8, 32, 8, 64),
             R._Need(4, 8, 32, 8, 256), R._Need(4, 8, 32, 8, 192, 128), R._Need(1, 1, 1, 1, 64)]
    bounds = [Bounds(4, 8, 32, 8, 128, 0), Bounds(8, 16, 64, 16, 256, 0), Bounds(4, 8, 32, 8, 192, 128),
              Bounds(2, 2, 32, 8, 128, 0)]
    for need in needs:
        for b in bounds:
            assert need.fits_key(R._bounds_key(b)) == need.fits(b)


def test_a_replaced_bounds_object_is_noticed(stand_ins):
    w = D(_ws())
    _decode_plan(w)
    holder = w._holder
    assert holder.builds == 1
    _decode_plan(w)
    assert holder.builds == 1  # the same runtime serves the same plan
    small = _C.RuntimeBounds()
    small.max_batch_size = small.max_total_qo_tokens = 1
    small.num_qo_heads, small.num_kv_heads, small.head_dim = 8, 2, 128
    holder.bounds = small  # not what was cached: read again, and the plan does not fit it
    _decode_plan(w)
    assert holder.builds == 2


# plan()'s arguments besides the page table (head counts, dtypes, page size, options) are checked
# once and kept for the next plan() with the same ones (_DecodePlanConfig in an _ArgsMemo): a plan
# whose arguments differ in value or in type is checked again, and says what the checks say.


def _plan_summary(w):
    """What a plan left: its dict (less the objects made per plan) and what the runtime received."""
    planned = {k: _summary(v) for k, v in w._planned.items() if k not in ("host_indices", "run_fast")}
    args, kwargs = w._holder.cpp.plans[-1]
    plain = (int, float, bool, str, type(None), torch.dtype, _C.DType)
    received = (_summary(args), {k: _summary(v) if isinstance(v, (torch.Tensor, *plain)) else type(v).__name__
                                 for k, v in kwargs.items()})
    return planned, received, w._holder.cpp_class_name


PLAN_ARG_CASES = {
    "the same": {},
    "num_kv_heads a bool": dict(num_kv_heads=True),
    "num_qo_heads a float": dict(num_qo_heads=8.0),
    "head_dim a 0-d tensor": dict(head_dim=torch.tensor(128)),
    "head_dim 64": dict(head_dim=64),
    "head_dim 100": dict(head_dim=100),
    "page_size 0": dict(page_size=0),
    "page_size a bool": dict(page_size=True),
    "sm_scale 0.5": dict(sm_scale=0.5),
    "sm_scale nan": dict(sm_scale=float("nan")),
    "sm_scale of 2 elements": dict(sm_scale=torch.tensor([1.0, 2.0])),
    "q_data_type float32": dict(q_data_type="float32"),
    "q_data_type bf16": dict(q_data_type="bf16"),
    "q_data_type torch.float16": dict(q_data_type=torch.float16),
    "kv_data_type fp8": dict(kv_data_type=torch.float8_e4m3fn),
    "kv_data_type bf16": dict(kv_data_type=torch.bfloat16),
    "o_data_type bf16": dict(o_data_type=torch.bfloat16),
    "window_left -2": dict(window_left=-2),
    "window_left 4": dict(window_left=4),
    "rope": dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5),
    "rope_theta without rope": dict(rope_theta=float("nan")),
    "soft cap": dict(logits_soft_cap=30.0),
    "sigmoid": dict(use_sigmoid=True),
    "low_freq_factor without llama31": dict(low_freq_factor=2.0),
    "block_tables": dict(block_tables=_i32([0, 1])),
    "seq_lens": dict(seq_lens=_i32([1, 2])),
    "fixed_split_size 3": dict(fixed_split_size=3),
    "fixed_split_size 8": dict(fixed_split_size=8),
    "disable_split_kv": dict(disable_split_kv=True),
    "q_len_per_req 2": dict(q_len_per_req=2),
    "q_len_per_req 2.0": dict(q_len_per_req=2.0),
}


@pytest.mark.parametrize("name", sorted(PLAN_ARG_CASES))
@pytest.mark.parametrize("wrapper", ["decode", "graph decode"])
def test_a_kept_plan_configuration_says_what_the_checks_say(stand_ins, wrapper, name):
    # Two wrappers planned alike; the second forgets its kept configuration: the next plan (these
    # arguments) must end the same way on both.
    from tessera import _runtime

    outcomes = []
    for forget in (False, True):
        w = D(_ws()) if wrapper == "decode" else _graph_wrapper()
        _decode_plan(w)
        _decode_plan(w)  # the kept configuration's
        if forget:
            w._plan_config = _runtime._ArgsMemo()
        outcome = _outcome(lambda: _decode_plan(w, **PLAN_ARG_CASES[name]))
        outcomes.append((outcome, _plan_summary(w) if outcome[0] == "ok" else None))
    assert outcomes[0] == outcomes[1]


def test_plans_with_the_same_arguments_skip_their_checks(stand_ins, monkeypatch):
    w = D(_ws())
    _decode_plan(w)
    first = w._plan_config.value

    def checked(*args, **kwargs):
        raise AssertionError("checked again")

    with monkeypatch.context() as m:
        for name in ("check_heads", "resolve_variant", "resolve_plan_dtypes", "resolve_sm_scale", "check_none"):
            m.setattr(U, name, checked)
        _decode_plan(w, indptr=_i32([0, 1, 3]), last_page_len=_i32([16, 7]))  # another page table
        assert w._plan_config.value is first and len(w._holder.cpp.plans) == 2
        assert w._planned["batch"] == 2 and w._holder.cpp.plans[-1][0][1].tolist() == [16, 7]
        with pytest.raises(AssertionError, match="checked again"):
            _decode_plan(w, head_dim=128.0)  # an equal value of another type
        with pytest.raises(AssertionError, match="checked again"):
            _decode_plan(w, sm_scale=0.1)
    # The page table is checked at every plan.
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1, expected >= 3"):
        _decode_plan(w, indptr=_i32([0, 3, 1]))
    with pytest.raises(ValueError, match=r"indices has 2 entries, expected >= indptr\[-1\] = 3"):
        _decode_plan(w, indices=_i32([0, 1]))
    # Tensor arguments are never kept (their values may change in place).
    _decode_plan(w, head_dim=torch.tensor(128))
    assert w._plan_config.value is first


@pytest.mark.parametrize("case", [{}, dict(head_dim=128.0), dict(page_size=0), dict(q_data_type=None),
                                  dict(q_data_type="float32"), dict(window_left=3), dict(fixed_split_size=3),
                                  dict(q_len_per_req=2)])
def test_fast_decode_plan_keeps_its_configuration_as_plan_does(stand_ins, case):
    from tessera import _runtime

    def fast_plan(w, **overrides):
        args = dict(indptr=_i32([0, 2, 3]), indices=_i32([0, 1, 2]), last_page_len=_i32([5, 16]), num_qo_heads=8,
                    num_kv_heads=2, head_dim=128, page_size=16, q_data_type=torch.float16)
        args.update(overrides)
        tessera.fast_decode_plan(w, **args)

    outcomes = []
    for forget in (False, True):
        w = D(_ws())
        fast_plan(w)
        if forget:
            w._fast_plan_config = _runtime._ArgsMemo()
        outcome = _outcome(lambda: fast_plan(w, **case))
        outcomes.append((outcome, _plan_summary(w) if outcome[0] == "ok" else None))
    assert outcomes[0] == outcomes[1]


def test_args_memo_keeps_plain_keys_only():
    from tessera import _runtime

    memo = _runtime._ArgsMemo()
    memo.put((1, 2.0, "a", None, torch.float16, False), "value")
    assert memo.get((1, 2.0, "a", None, torch.float16, False)) == "value"
    assert memo.get((True, 2.0, "a", None, torch.float16, False)) is None  # a bool is not an int
    assert memo.get((1, 2, "a", None, torch.float16, False)) is None  # nor an int a float
    assert memo.get((1, 2.0, "a", None, torch.float16, 0)) is None
    assert memo.get((torch.tensor([1, 1]), 2.0, "a", None, torch.float16, False)) is None  # never compared
    memo.put((torch.tensor(1),), "tensor")  # not kept: the last plain key stays
    assert memo.get((torch.tensor(1),)) is None and memo.get((1, 2.0, "a", None, torch.float16, False)) == "value"


# The graph-mode plan's page-table copies: one call of tessera._C._copy_index_arrays (host arrays
# are copied with memcpy there, which is what the CPU stand-ins use), else a torch copy each.


def _graph_wrapper(max_batch=3, max_pages=6):
    return G(_ws(), torch.full((max_batch + 1,), -1, dtype=torch.int32), torch.full((max_pages,), -1, dtype=torch.int32),
             torch.full((max_batch,), -1, dtype=torch.int32))


@pytest.mark.parametrize("binding", [True, False])
def test_graph_plan_fills_the_page_table_buffers(stand_ins, monkeypatch, binding):
    if not hasattr(_C, "_copy_index_arrays"):
        pytest.skip("this build of tessera._C has no _copy_index_arrays")
    calls = []
    real = _C._copy_index_arrays

    def spy(*args):
        calls.append(args)
        return real(*args) if binding else False

    monkeypatch.setattr(U, "_COPY_INDEX_ARRAYS", spy)
    w = _graph_wrapper()
    _decode_plan(w, indices=_i32([4, 2, 0, 5]))
    assert w._paged_kv_indptr_buf.tolist() == [0, 2, 3, -1]
    assert w._paged_kv_last_page_len_buf.tolist() == [5, 16, -1]
    assert w._paged_kv_indices_buf.tolist() == [4, 2, 0, -1, -1, -1]  # indptr[-1] = 3 ids
    assert len(calls) == 1
    # fast_decode_plan: the page ids only; indptr / last_page_len are the caller's to keep.
    w._paged_kv_indptr_buf.fill_(-1)
    w._paged_kv_last_page_len_buf.fill_(-1)
    tessera.fast_decode_plan(w, _i32([0, 1, 2]), _i32([1, 3]), _i32([7, 7]), 8, 2, 128, 16)
    assert w._paged_kv_indices_buf.tolist() == [1, 3, 0, -1, -1, -1]
    assert w._paged_kv_indptr_buf.tolist() == [-1] * 4 and w._paged_kv_last_page_len_buf.tolist() == [-1] * 3
    assert len(calls) == 2 and len(calls[1]) == 5
    # The buffer itself as the page ids: nothing to copy, and the run reads it.
    _decode_plan(w, indptr=_i32([0, 2]), last_page_len=_i32([4]), indices=w._paged_kv_indices_buf)
    assert w._paged_kv_indices_buf.tolist() == [1, 3, 0, -1, -1, -1]
    assert w._paged_kv_indptr_buf.tolist()[:2] == [0, 2] and w._paged_kv_last_page_len_buf.tolist()[0] == 4
    # non_blocking=False: torch's copies (which wait for the stream), not the binding's.
    _decode_plan(w, indices=_i32([5, 4, 3]), non_blocking=False)
    assert len(calls) == 3 and w._paged_kv_indices_buf.tolist()[:3] == [5, 4, 3]


@pytest.mark.parametrize("binding", [True, False])
def test_graph_prefill_plans_fill_their_buffers(stand_ins, monkeypatch, binding):
    if not hasattr(_C, "_copy_index_arrays"):
        pytest.skip("this build of tessera._C has no _copy_index_arrays")
    real = _C._copy_index_arrays
    monkeypatch.setattr(U, "_COPY_INDEX_ARRAYS", (lambda *a: real(*a)) if binding else (lambda *a: False))

    def buf(n):
        return torch.full((n,), -1, dtype=torch.int32)

    w = P(_ws(), "NHD", use_cuda_graph=True, qo_indptr_buf=buf(4), paged_kv_indptr_buf=buf(4),
          paged_kv_indices_buf=buf(6), paged_kv_last_page_len_buf=buf(3))
    _paged_plan(w, paged_kv_indices=_i32([4, 2, 0, 5]))
    assert w._qo_indptr_buf.tolist() == [0, 3, 4, -1]
    assert w._paged_kv_indptr_buf.tolist() == [0, 2, 3, -1]
    assert w._paged_kv_indices_buf.tolist() == [4, 2, 0, -1, -1, -1]
    assert w._paged_kv_last_page_len_buf.tolist() == [5, 16, -1]
    r = R(_ws(), "NHD", use_cuda_graph=True, qo_indptr_buf=buf(4), kv_indptr_buf=buf(4))
    _ragged_plan(r)
    assert r._qo_indptr_buf.tolist() == [0, 3, 4, -1] and r._kv_indptr_buf.tolist() == [0, 20, 37, -1]


def test_graph_plan_copies_strided_page_ids_through_torch(stand_ins):
    # A non-contiguous page-id tensor is refused by the binding (nothing copied) and copied by torch.
    w = _graph_wrapper()
    ids = _i32([2, 9, 1, 9, 0, 9])[::2]
    _decode_plan(w, indices=ids)
    assert w._paged_kv_indices_buf.tolist()[:3] == [2, 1, 0]
    assert w._paged_kv_indptr_buf.tolist() == [0, 2, 3, -1]


def test_copy_index_arrays_binding():
    fn = getattr(_C, "_copy_index_arrays", None)
    if fn is None:
        pytest.skip("this build of tessera._C has no _copy_index_arrays")
    src, dst = torch.arange(10, dtype=torch.int32), torch.full((10,), -1, dtype=torch.int32)
    assert fn(0, -1, dst, src, 4) is True and dst.tolist() == [0, 1, 2, 3] + [-1] * 6
    other = torch.full((3,), -1, dtype=torch.int32)
    assert fn(0, -1, dst, src, 0, other, src[5:], 3) is True and other.tolist() == [5, 6, 7]
    # All or nothing: the first pair is not copied when a later one is refused.
    dst.fill_(-1)
    refusals = [
        (other, src, 4),  # more entries than dst has
        (other, src[::2], 3),  # not contiguous
        (other, src.to(torch.int64), 3),  # not int32
        (other.view(1, 3), src, 3),  # not 1-D
        (dst[1:], dst, 3),  # overlapping ranges
    ]
    for d, s, n in refusals:
        assert fn(0, -1, dst, src, 4, d, s, n) is False
        assert dst.tolist() == [-1] * 10
    assert fn(0, -1, dst, dst, 10) is True  # the same range: nothing to do
    with pytest.raises(ValueError, match=r"n = -1, expected 0 <= n < 2\^31"):
        fn(0, -1, dst, src, -1)
    with pytest.raises(ValueError, match=r"dst1 and src1 must be given together"):
        fn(0, -1, dst, src, 1, dst, None, 1)
    # What the Python side does with what the binding cannot convert: it says False (torch copies).
    meta = torch.zeros(3, dtype=torch.int32, device="meta")
    assert U.copy_index_arrays(0, torch.device("cpu"), meta, src, 3) is False


def _views_to_compare():
    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float16).reshape(2, 3, 4, 5)
    return {
        "contiguous": base,
        "bf16": base.to(torch.bfloat16),
        "int32": torch.arange(7, dtype=torch.int32),
        "uint8": torch.zeros(5, dtype=torch.uint8),
        "float32": torch.zeros(3, 2),
        "offset view": base[1],
        "strided": base[:, :, :, 1:4],
        "transposed": base.transpose(1, 2),
        "expanded": torch.zeros(1, 4, dtype=torch.float16).expand(3, 4),
        "0-dim": torch.tensor(1.0, dtype=torch.float16),
        "empty": torch.zeros(0, 8, dtype=torch.float16),
        "6 dims": torch.zeros((1, 2, 1, 2, 1, 2), dtype=torch.float16),
        "requires grad": torch.zeros(3, requires_grad=True),
        "subclass": base.as_subclass(type("Sub", (torch.Tensor,), {})),
    }


@pytest.mark.parametrize("name", sorted(_views_to_compare()))
def test_runtime_bindings_view_tensors_as_dlpack_does(name):
    # The runtime bindings read torch tensors through PyTorch's DLPack C exchange API where it has
    # one; the views are those of DLPack's capsule (the other bindings' path).
    if not hasattr(_C, "_run_array_view"):
        pytest.skip("this build of tessera._C has no _run_array_view")
    t = _views_to_compare()[name]
    direct, view = _C._run_array_view(t)
    assert view == _C._capsule_array_view(t)
    assert view[0] == t.data_ptr() and view[4] == tuple(t.shape) and view[5] == tuple(t.stride())
    has_api = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert direct == (has_api and type(t) is torch.Tensor)


def test_runtime_bindings_refuse_what_dlpack_refuses():
    if not hasattr(_C, "_run_array_view"):
        pytest.skip("this build of tessera._C has no _run_array_view")
    seven = torch.zeros((1,) * 7)
    with pytest.raises(ValueError, match=r"a: DLTensor.ndim = 7 is out of range"):
        _C._run_array_view(seven)
    with pytest.raises(ValueError, match=r"a: DLTensor.ndim = 7 is out of range"):
        _C._capsule_array_view(seven)
    for bad in (torch.ones(2, 2).to_sparse(), [1.0], None):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            _C._run_array_view(bad)


# --- the workspace: between min_workspace_size and workspace_size ---------------------------------


class _SizedRuntime(RecordingRuntime):
    """A recording runtime whose full workspace is 1 MiB and whose smallest is 64 KiB."""

    FULL, MIN = 1 << 20, 1 << 16

    @staticmethod
    def workspace_size(bounds, options, device):
        return _SizedRuntime.FULL

    @staticmethod
    def min_workspace_size(bounds, options, device):
        return _SizedRuntime.MIN


@pytest.mark.parametrize("wrapper, plan", [(D, _decode_plan), (P, _paged_plan), (R, _ragged_plan)])
def test_a_workspace_below_workspace_size_but_above_the_minimum_plans(install_runtime_stand_ins, wrapper, plan):
    """A float_workspace_buffer smaller than workspace_size (the most split plans: ~150 MiB at head
    dim 256, where FlashInfer's users allocate 128 MiB) but at least min_workspace_size builds the
    runtime, which splits less; below the minimum the error names the minimum."""
    install_runtime_stand_ins(("BatchDecodeWrapper", "BatchPrefillPagedWrapper", "BatchPrefillRaggedWrapper"),
                              _SizedRuntime)
    w = wrapper(torch.empty(_SizedRuntime.MIN + 256, dtype=torch.uint8))
    plan(w)
    assert len(w._holder.cpp.plans) == 1
    small = wrapper(torch.empty(_SizedRuntime.MIN - 256, dtype=torch.uint8))
    with pytest.raises(ValueError, match=f"at least {_SizedRuntime.MIN} bytes"):
        plan(small)
