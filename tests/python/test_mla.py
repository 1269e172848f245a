"""Tests of BatchMLAPagedAttentionWrapper (python/tessera/mla.py), FlashInfer's MLA API.

CPU: the signature and the constructor's errors. GPU (skipped without CUDA; the kernel needs
sm_90): random batches over a paged latent cache with a random page permutation (page sizes 1, 16,
64; 16 and 128 heads; 1-4 query tokens, causal and not; empty requests; small batches that plan()
splits over the KV length), ckv/kpe as slices of one [pages, page_size, 576] tensor, against an
fp32 reference over the gathered latent rows; the LSE in base 2 and base e; CUDA-graph replay of a
split plan after a re-plan; fp8 latent caches (e4m3, e5m2) with their key and value scales, in
graphs with changed scale tensors and under torch.compile; the plan's errors.
"""

import inspect
import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
HAS_SM90 = HAS_GPU and torch.cuda.get_device_capability(0) == (9, 0)
sm90 = pytest.mark.skipif(not HAS_SM90, reason="batch_mla_paged runs on sm_90 GPUs: GPU test skipped")
W = tessera.BatchMLAPagedAttentionWrapper

REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def test_signatures_match_flashinfer():
    names = lambda f: [p for p in inspect.signature(f).parameters if p != "self"]  # noqa: E731
    assert names(W.__init__) == ["float_workspace_buffer", "use_cuda_graph", "qo_indptr", "kv_indptr", "kv_indices",
                                 "kv_len_arr", "backend"]
    assert names(W.plan) == ["qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv",
                             "head_dim_kpe", "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type",
                             "use_profiler"]
    assert names(W.run) == ["q_nope", "q_pe", "ckv_cache", "kpe_cache", "out", "lse", "return_lse",
                            "profiler_buffer", "kv_len", "page_table", "return_lse_base_on_e", "k_scale", "v_scale"]
    # An fp8 cache's scales: keyword-only, after FlashInfer's arguments.
    params = inspect.signature(W.run).parameters
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in ("k_scale", "v_scale"))


def test_constructor_needs_a_cuda_workspace():
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        W([0] * 8)
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        W(torch.empty(1024, dtype=torch.uint8))


def test_run_is_one_custom_op_under_torch_compile(monkeypatch):
    """On the CPU, with a stand-in for the C++ runtime: torch.compile(fullgraph=True) of run() is
    one graph holding tessera::mla_run, whose result equals the eager run()'s."""
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("torch.library.custom_op needs torch >= 2.4")
    from tessera import _runtime as R
    from tessera import _utils as U

    calls = []

    class StandIn:
        def plan(self, qo_indptr, kv_indptr, last_page_len, page_size, num_heads, dtype, sm_scale, causal, stream,
                 device):
            calls.append(("plan", qo_indptr.tolist(), kv_indptr.tolist(), last_page_len.tolist(), page_size,
                          num_heads, causal))

        def run(self, q_nope, q_pe, ckv, kpe, kv_indices, o, lse, stream, kv_dtype=None):
            assert kv_dtype is None  # a 16-bit cache
            o.copy_((q_nope.double() * 2 + ckv.double().mean() + float(kv_indices.double().sum())).to(o.dtype))
            if lse is not None:
                lse.copy_(q_nope.double().sum(-1) + q_pe.double().sum(-1))
            calls.append((tuple(q_nope.shape), stream))

    def ensure(holder, need, dtype, split_kv, fixed_split_size, graph_bounds=None, kv_dtype=None):
        assert (need.batch, need.total_qo, need.num_qo_heads, split_kv) == (2, 3, 16, "auto")
        holder.cpp = StandIn()
        return holder.cpp

    monkeypatch.setattr(U, "check_cuda", lambda name, t: None)
    monkeypatch.setattr(U, "current_stream", lambda device: 7)
    monkeypatch.setattr(U, "device_index", lambda t: 0)
    monkeypatch.setattr(R._RuntimeHolder, "ensure", ensure)
    gen = torch.Generator().manual_seed(5)
    w = W(torch.zeros(1 << 16, dtype=torch.uint8))
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    w.plan(i32([0, 2, 3]), i32([0, 2, 3]), i32([4, 0, 2]), i32([20, 5]), 16, 512, 64, 16, True, 0.1,
           torch.bfloat16, torch.bfloat16)
    cache = torch.randn(5, 16, 576, generator=gen).to(torch.bfloat16)
    q = torch.randn(3, 16, 576, generator=gen).to(torch.bfloat16)
    args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
    eager_out, eager_lse = w.run(*args, return_lse=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    torch._dynamo.reset()
    try:
        out, lse = torch.compile(lambda a, b, c, d: w.run(a, b, c, d, return_lse=True), fullgraph=True,
                                 backend=backend)(*args)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1 and [t for t in graphs[0] if "tessera" in t] == ["tessera.mla_run.default"], graphs
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert calls[0] == ("plan", [0, 2, 3], [0, 2, 3], [4, 5], 16, 16, True)  # last pages of 20 and 5 tokens
    assert calls[1] == calls[-1] == ((3, 16, 512), 7)
    with pytest.raises(ValueError, match="kv_indices\\[0\\] = 4 is out of range"):
        w.run(args[0], args[1], cache[:3, :, :512], cache[:3, :, 512:])  # the page ids against a smaller cache


# --- GPU ---------------------------------------------------------------------------------------


def _batch(kv_lens, qo_lens, page_size, heads, dtype, gen, dev, kv_dtype=None):
    """A paged latent cache (pages in random order, one [pages, page_size, 576] tensor) and queries;
    an fp8 kv_dtype: stored values N(0, 16^2) in that format."""
    batch = len(kv_lens)
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(pages), 0)
    total_pages = int(kv_indptr[-1]) + 3  # spare pages nobody owns
    kv_indices = torch.randperm(total_pages, generator=gen)[: int(kv_indptr[-1])].to(torch.int32)
    if kv_dtype is None:
        cache = torch.randn(total_pages, page_size, 576, generator=gen).to(dtype)
    else:
        cache = (torch.randn(total_pages, page_size, 576, generator=gen) * 16).to(kv_dtype)
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(qo_lens), 0)
    q = torch.randn(int(qo_indptr[-1]), heads, 576, generator=gen).to(dtype)
    return {
        "cache": cache.to(dev), "q": q.to(dev), "qo_indptr": qo_indptr.to(dev), "kv_indptr": kv_indptr.to(dev),
        "kv_indices": kv_indices.to(dev), "kv_len": torch.tensor(kv_lens, dtype=torch.int32).to(dev),
    }


def _reference(b, kv_lens, qo_lens, page_size, causal, sm_scale, k_scale=1.0, v_scale=1.0):
    """fp32 attention over each request's gathered latent rows: key = [ckv, kpe] * k_scale, value =
    ckv * v_scale (an fp8 cache's dequantization; 1 for a 16-bit one)."""
    cache, q = b["cache"].float(), b["q"].float()
    kv_indptr, kv_indices = b["kv_indptr"].cpu(), b["kv_indices"].cpu()
    outs, lses = [], []
    q0 = 0
    for r, (n, m) in enumerate(zip(kv_lens, qo_lens)):
        pages = kv_indices[int(kv_indptr[r]): int(kv_indptr[r + 1])].long().to(cache.device)
        rows = cache[pages].reshape(-1, 576)[:n]  # [n, 576]
        qr = q[q0: q0 + m]  # [m, H, 576]
        logits = torch.einsum("mhd,nd->mhn", qr, rows * k_scale) * sm_scale
        if causal:
            pos = torch.arange(m, device=cache.device)[:, None] + (n - m)
            hidden = torch.arange(n, device=cache.device)[None, :] > pos  # [m, n]
            logits = logits.masked_fill(hidden[:, None, :], float("-inf"))
        lse = torch.logsumexp(logits, -1)  # [m, H], natural
        p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("mhn,nd->mhd", p, rows[:, :512] * v_scale))
        lses.append(lse / math.log(2.0))
        q0 += m
    return torch.cat(outs), torch.cat(lses)


def _check(out, lse, ref_o, ref_lse, dtype):
    rel = (out.float() - ref_o).norm() / ref_o.norm().clamp(min=1e-30)
    assert rel <= REL_TOL[dtype], f"relative error {rel:.3e}"
    empty = torch.isinf(ref_lse)
    assert torch.all(out.float()[empty] == 0)
    assert torch.all(torch.isneginf(lse[empty]))
    assert (lse[~empty] - ref_lse[~empty]).abs().max() <= LSE_TOL[dtype]


CASES = [
    # dtype, heads, page_size, kv_lens, qo_lens, causal
    (torch.bfloat16, 16, 64, [300, 0, 1, 2049], [1, 1, 1, 1], False),
    (torch.float16, 16, 1, [65, 7, 130], [1, 1, 1], False),
    (torch.bfloat16, 128, 16, [257, 33, 5], [2, 4, 3], True),
    (torch.float16, 128, 64, [100, 64], [4, 1], True),
    (torch.bfloat16, 32, 16, [40, 9, 0], [2, 2, 0], False),
]


@sm90
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}_h{c[1]}_p{c[2]}_{'causal' if c[5] else 'full'}")
def test_mla_wrapper_matches_reference(case):
    dtype, heads, page_size, kv_lens, qo_lens, causal = case
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(hash(str(case)) % (2**31))
    b = _batch(kv_lens, qo_lens, page_size, heads, dtype, gen, dev)
    sm_scale = 1.0 / math.sqrt(192.0)
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    w.plan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], heads, 512, 64, page_size, causal, sm_scale,
           dtype, dtype)
    q, cache = b["q"], b["cache"]
    out, lse = w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], return_lse=True)
    ref_o, ref_lse = _reference(b, kv_lens, qo_lens, page_size, causal, sm_scale)
    _check(out, lse, ref_o, ref_lse, dtype)
    if case is CASES[0]:
        assert w.plan_info()["num_merges"] > 0  # 4 short-query requests cannot fill the GPU alone
    # Base e, into caller buffers.
    out2 = torch.full_like(out, float("nan"))
    lse2 = torch.full_like(lse, float("nan"))
    w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], out=out2, lse=lse2, return_lse=True,
          return_lse_base_on_e=True)
    assert torch.equal(out2, out)
    finite = torch.isfinite(lse)
    assert torch.allclose(lse2[finite], lse[finite] * math.log(2.0))


@sm90
def test_mla_wrapper_cuda_graph_replays_a_new_plan():
    dev = torch.device("cuda:0")
    dtype, heads, page_size = torch.bfloat16, 16, 16
    gen = torch.Generator().manual_seed(7)
    max_batch, max_pages = 4, 128
    bufs = [torch.zeros(max_batch + 1, dtype=torch.int32, device=dev), torch.zeros(max_batch + 1, dtype=torch.int32, device=dev),
            torch.zeros(max_pages, dtype=torch.int32, device=dev), torch.zeros(max_batch, dtype=torch.int32, device=dev)]
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev), True, *bufs)
    a = _batch([1000, 3, 40], [2, 2, 1], page_size, heads, dtype, gen, dev)  # long enough to split
    bb = _batch([17, 200, 0, 65], [1, 2, 1, 2], page_size, heads, dtype, gen, dev)
    # One cache and one query buffer large enough for both batches.
    cache = torch.cat([a["cache"], bb["cache"]])
    offset = a["cache"].shape[0]
    q = torch.zeros(8, heads, 576, dtype=dtype, device=dev)
    out = torch.zeros(8, heads, 512, dtype=dtype, device=dev)
    sm = 0.1

    def plan(x, kv_lens, page_base):
        w.plan(x["qo_indptr"], x["kv_indptr"], x["kv_indices"] + page_base, x["kv_len"], heads, 512, 64, page_size,
               True, sm, dtype, dtype)

    plan(a, [1000, 3, 40], 0)
    assert w.plan_info()["num_merges"] > 0
    n_a = a["q"].shape[0]
    q[:n_a] = a["q"]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q[:n_a, :, :512], q[:n_a, :, 512:], cache[..., :512], cache[..., 512:], out=out[:n_a])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q[:n_a, :, :512], q[:n_a, :, 512:], cache[..., :512], cache[..., 512:], out=out[:n_a])
    graph.replay()
    torch.cuda.synchronize()
    ref_a, _ = _reference({**a, "cache": cache, "kv_indices": a["kv_indices"]}, [1000, 3, 40], [2, 2, 1], page_size,
                          True, sm)
    rel = (out[:n_a].float() - ref_a).norm() / ref_a.norm()
    assert rel <= REL_TOL[dtype]
    # A new plan with the same total query rows: the captured graph reads the new page table.
    bb_q = bb["q"]
    assert bb_q.shape[0] > n_a
    with pytest.raises(ValueError, match="max_total_qo_tokens=5"):  # more query tokens than the captured run's
        w.plan(bb["qo_indptr"], bb["kv_indptr"], bb["kv_indices"], bb["kv_len"], heads, 512, 64, page_size, True,
               sm, dtype, dtype)
    b2_lens, b2_q = [17, 200, 0, 65], [1, 2, 1, 1]
    b2_qo = torch.tensor([0, 1, 3, 4, 5], dtype=torch.int32, device=dev)
    w.plan(b2_qo, bb["kv_indptr"], bb["kv_indices"] + offset, bb["kv_len"], heads, 512, 64, page_size, True, sm,
           dtype, dtype)
    q[:5] = bb_q[:5]
    graph.replay()
    torch.cuda.synchronize()
    ref_b, _ = _reference({"cache": cache, "q": q[:5], "kv_indptr": bb["kv_indptr"],
                           "kv_indices": bb["kv_indices"] + offset}, b2_lens, b2_q, page_size, True, sm)
    rel = (out[:5].float() - ref_b).norm() / ref_b.norm()
    assert rel <= REL_TOL[dtype], f"replay after re-plan: relative error {rel:.3e}"


@sm90
def test_mla_wrapper_errors():
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(3)
    b = _batch([30, 5], [1, 1], 16, 16, torch.bfloat16, gen, dev)
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    args = (b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], 16)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(b["q"][..., :512], b["q"][..., 512:], b["cache"][..., :512], b["cache"][..., 512:])
    with pytest.raises(NotImplementedError, match="head_dim_ckv"):
        w.plan(*args, 256, 64, 16, False, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="head_dim_kpe"):
        w.plan(*args, 512, 32, 16, False, 0.1, torch.bfloat16, torch.bfloat16)
    with pytest.raises(ValueError, match="sm_scale"):
        w.plan(*args, 512, 64, 16, False, 0.0, torch.bfloat16, torch.bfloat16)
    with pytest.raises(TypeError, match="kv_data_type = torch.float32"):
        w.plan(*args, 512, 64, 16, False, 0.1, torch.bfloat16, torch.float32)
    with pytest.raises(NotImplementedError, match="q_data_type"):
        w.plan(*args, 512, 64, 16, False, 0.1, torch.float8_e4m3fn, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"kv_len_arr\[0\] = 30 needs 4 pages of 8"):
        w.plan(*args, 512, 64, 8, False, 0.1, torch.bfloat16, torch.bfloat16)
    w.plan(*args, 512, 64, 16, False, 0.1, torch.bfloat16, torch.bfloat16)
    q, cache = b["q"], b["cache"]
    with pytest.raises(ValueError, match="q_nope has shape"):
        w.run(q[:1, :, :512], q[:1, :, 512:], cache[..., :512], cache[..., 512:])
    with pytest.raises(TypeError, match="q_pe.dtype"):
        w.run(q[..., :512], q[..., 512:].half(), cache[..., :512], cache[..., 512:])
    with pytest.raises(ValueError, match="ckv_cache has shape"):
        w.run(q[..., :512], q[..., 512:], cache[:, :8, :512], cache[:, :8, 512:])
    with pytest.raises(NotImplementedError, match="page_table"):
        w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], page_table=b["kv_indices"])
    with pytest.raises(NotImplementedError, match="k_scale"):  # scales belong to fp8 caches
        w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], k_scale=0.5)
    with pytest.raises(TypeError, match="ckv_cache.dtype"):  # the plan's cache is bf16
        fp8 = cache.to(torch.float8_e4m3fn)
        w.run(q[..., :512], q[..., 512:], fp8[..., :512], fp8[..., 512:])


@sm90
def test_gpu_mla_run_compiles_and_matches_eager():
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("torch.library.custom_op needs torch >= 2.4")
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(9)
    b = _batch([700, 5, 64], [2, 1, 1], 16, 16, torch.bfloat16, gen, dev)
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    w.plan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], 16, 512, 64, 16, True, 0.1,
           torch.bfloat16, torch.bfloat16)
    q, cache = b["q"], b["cache"]
    args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
    eager_out, eager_lse = w.run(*args, return_lse=True)
    torch._dynamo.reset()
    try:
        out, lse = torch.compile(lambda a, bb, c, d: w.run(a, bb, c, d, return_lse=True), fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


FP8_CASES = [
    # q dtype, cache dtype, heads, page_size, kv_lens, qo_lens, causal
    (torch.bfloat16, torch.float8_e4m3fn, 16, 64, [300, 0, 1, 2049], [1, 1, 1, 1], False),
    (torch.float16, torch.float8_e4m3fn, 128, 16, [257, 33, 5], [2, 4, 3], True),
    (torch.bfloat16, torch.float8_e5m2, 64, 1, [65, 7, 130], [1, 2, 1], True),
]


@sm90
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: f"{str(c[0])[6:]}_{str(c[1])[6:]}_h{c[2]}_p{c[3]}")
def test_mla_wrapper_fp8_cache_matches_reference(case):
    dtype, kv_dtype, heads, page_size, kv_lens, qo_lens, causal = case
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(hash(str(case)) % (2**31))
    b = _batch(kv_lens, qo_lens, page_size, heads, dtype, gen, dev, kv_dtype)
    sm_scale = 1.0 / math.sqrt(192.0)
    k_scale, v_scale = 1.1 / 16, 0.9 / 16
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    w.plan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], heads, 512, 64, page_size, causal, sm_scale,
           dtype, kv_dtype)
    q, cache = b["q"], b["cache"]
    args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
    ref_o, ref_lse = _reference(b, kv_lens, qo_lens, page_size, causal, sm_scale, k_scale, v_scale)
    # Scales as floats, and as one-element tensors (v's read on the stream).
    out, lse = w.run(*args, return_lse=True, k_scale=k_scale, v_scale=v_scale)
    _check(out, lse, ref_o, ref_lse, dtype)
    v_tensor = torch.tensor([v_scale], dtype=torch.float32, device=dev)
    out2, lse2 = w.run(*args, return_lse=True, k_scale=k_scale, v_scale=v_tensor)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    # Without scales the cache reads as its stored values.
    out1, lse1 = w.run(*args, return_lse=True)
    ref1_o, ref1_lse = _reference(b, kv_lens, qo_lens, page_size, causal, sm_scale)
    _check(out1, lse1, ref1_o, ref1_lse, dtype)
    if case is FP8_CASES[0]:
        assert w.plan_info()["num_merges"] > 0  # the split states merge dequantized outputs
        if hasattr(torch.library, "custom_op"):
            torch._dynamo.reset()
            try:
                f = torch.compile(lambda a, bb, c, d, vs: w.run(a, bb, c, d, return_lse=True, k_scale=k_scale,
                                                                  v_scale=vs), fullgraph=True)
                out3, lse3 = f(*args, v_tensor)
            finally:
                torch._dynamo.reset()
            assert torch.equal(out3, out) and torch.equal(lse3, lse)


@sm90
def test_mla_wrapper_fp8_cache_graph_replays_new_scale_tensors():
    dev = torch.device("cuda:0")
    dtype, kv_dtype, heads, page_size = torch.bfloat16, torch.float8_e4m3fn, 32, 16
    gen = torch.Generator().manual_seed(11)
    kv_lens, qo_lens = [1000, 3, 40], [2, 2, 1]
    max_batch, max_pages = 4, 128
    bufs = [torch.zeros(max_batch + 1, dtype=torch.int32, device=dev), torch.zeros(max_batch + 1, dtype=torch.int32, device=dev),
            torch.zeros(max_pages, dtype=torch.int32, device=dev), torch.zeros(max_batch, dtype=torch.int32, device=dev)]
    w = W(torch.empty(64 << 20, dtype=torch.uint8, device=dev), True, *bufs)
    b = _batch(kv_lens, qo_lens, page_size, heads, dtype, gen, dev, kv_dtype)
    w.plan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], heads, 512, 64, page_size, True, 0.1, dtype,
           kv_dtype)
    q, cache = b["q"], b["cache"]
    out = torch.zeros(q.shape[0], heads, 512, dtype=dtype, device=dev)
    k_t = torch.tensor([1.0 / 16], dtype=torch.float32, device=dev)
    v_t = torch.tensor([1.0 / 16], dtype=torch.float32, device=dev)
    run = lambda: w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], out=out,  # noqa: E731
                        k_scale=k_t, v_scale=v_t)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for k, v in ((1.0 / 16, 1.0 / 16), (0.03, 0.2), (0.1, 0.004)):
        k_t.fill_(k)
        v_t.fill_(v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = _reference(b, kv_lens, qo_lens, page_size, True, 0.1, k, v)
        rel = (out.float() - ref).norm() / ref.norm()
        assert rel <= REL_TOL[dtype], f"k_scale {k}, v_scale {v}: relative error {rel:.3e}"
