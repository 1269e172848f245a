"""GPU tests of the Python package: every wrapper and function against a PyTorch fp32 reference.

Skipped (with the reason) when torch.cuda.is_available() is False. The reference is written from
the mathematics: softmax(q k^T * sm_scale) v with GQA (query head h reads KV head h // group),
causal masking with the query offset kv_len - qo_len, base-2 log-sum-exp, and rows that see no
key give o = 0, lse = -inf. Outputs are poisoned with NaN before each call, inputs are random
(never zeros). Errors: ||out - ref|| / ||ref|| <= 1e-2 (bf16) / 4e-3 (fp16); LSE absolute error
<= 8e-3 (bf16) / 1e-3 (fp16), the tolerances of the C++ GPU tests.
"""

import math
import random

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False): GPU tests skipped", allow_module_level=True)

import tessera  # noqa: E402

DEV = torch.device("cuda")
LN2 = math.log(2.0)
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
QO_LENS = (1, 3, 17, 128)
KV_LENS = (0, 1, 15, 512, 2049)
DTYPES = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def workspace():
    """One 128 MiB float workspace shared by the tests (stream-ordered reuse is safe)."""
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


# --- reference -----------------------------------------------------------------------------------


def ref_attention(q, k, v, causal, sm_scale):
    """q [qo, Hq, D], k/v [kv, Hkv, D] (NHD) -> (o fp32 [qo, Hq, D], base-2 lse [qo, Hq])."""
    q, k, v = q.float(), k.float(), v.float()
    qo, hq, _ = q.shape
    kv, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        pos_q = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
        pos_k = torch.arange(kv, device=q.device)[None, :]
        s = s.masked_fill(pos_k > pos_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # natural log; -inf for rows that see no key
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    o = torch.einsum("hqk,khd->qhd", p, v)
    return o, (lse / LN2).transpose(0, 1).contiguous()


def assert_close(out, lse, ref_o, ref_lse, dtype, what):
    """Relative error of out, absolute error of the finite LSE entries, exact empty rows."""
    o = out.float()
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf (unwritten or wrong)"
    ref_norm = ref_o.norm().item()
    err = (o - ref_o).norm().item()
    if ref_norm > 0:
        assert err / ref_norm <= REL_TOL[dtype], f"{what}: relative error {err / ref_norm:.3g} > {REL_TOL[dtype]}"
    else:
        assert err == 0, f"{what}: expected all zeros (no keys), got max {o.abs().max().item()}"
    if lse is None:
        return
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: lse = -inf exactly where a row sees no key"
    if empty.any():
        assert (o[empty] == 0).all(), f"{what}: rows that see no key must be 0"
    finite = ~empty
    if finite.any():
        d = (lse[finite] - ref_lse[finite]).abs().max().item()
        assert d <= LSE_TOL[dtype], f"{what}: base-2 lse max abs error {d:.3g} > {LSE_TOL[dtype]}"


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


# --- case grids ----------------------------------------------------------------------------------


def make_cases(n, seed, **axes):
    """n cases; each axis value appears about n / len(values) times, in shuffled combinations."""
    rng = random.Random(seed)
    columns = {}
    for name, values in axes.items():
        col = [values[i % len(values)] for i in range(n)]
        rng.shuffle(col)
        columns[name] = col
    cases = []
    for i in range(n):
        c = {name: columns[name][i] for name in axes}
        c["seed"] = seed * 1000 + i
        cases.append(c)
    return cases


def case_id(c):
    parts = []
    for key, val in c.items():
        if key == "seed":
            continue
        if isinstance(val, torch.dtype):
            val = str(val).replace("torch.", "")
        parts.append(f"{key}={val}")
    return "-".join(parts)


def lengths(rng, batch, first, choices):
    """Per-request lengths: request 0 gets `first` (the case's axis value), the rest random."""
    return [first] + [rng.choice(choices) for _ in range(batch - 1)]


# --- paged KV cache ------------------------------------------------------------------------------


class Paged:
    """A random paged KV cache for the given lengths, pages scattered in a larger pool."""

    def __init__(self, kv_lens, page_size, hkv, d, dtype, layout, combined, gen):
        self.kv_lens, self.page_size, self.layout = list(kv_lens), page_size, layout
        pages = [math.ceil(n / page_size) for n in kv_lens]
        total = sum(pages) + 3
        perm = torch.randperm(total, generator=gen)
        self.indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
        self.indices = perm[: int(self.indptr[-1])].to(torch.int32).to(DEV)
        self.last_page_len = torch.tensor(
            [n - (p - 1) * page_size if p > 0 else 0 for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        page_shape = (page_size, hkv, d) if layout == "NHD" else (hkv, page_size, d)
        if combined:
            self.kv = torch.randn((total, 2) + page_shape, generator=gen).to(dtype).to(DEV)
            self.k, self.v = self.kv[:, 0], self.kv[:, 1]
            self.cache = self.kv
        else:
            self.k = torch.randn((total,) + page_shape, generator=gen).to(dtype).to(DEV)
            self.v = torch.randn((total,) + page_shape, generator=gen).to(dtype).to(DEV)
            self.cache = (self.k, self.v)

    def request_kv(self, b):
        """K, V of request b as [kv_len, Hkv, D]."""
        lo, hi = int(self.indptr[b]), int(self.indptr[b + 1])
        ids = self.indices[lo:hi].long()
        out = []
        for t in (self.k, self.v):
            pages = t[ids]
            if self.layout == "HND":
                pages = pages.permute(0, 2, 1, 3)
            out.append(pages.reshape(-1, pages.shape[2], pages.shape[3])[: self.kv_lens[b]])
        return out


# --- single-request functions --------------------------------------------------------------------

SINGLE_DECODE = make_cases(6, 1, kv_len=KV_LENS + (100,), group=(1, 4, 5), head_dim=(64, 128),
                           layout=("NHD", "HND"), dtype=DTYPES)


@pytest.mark.parametrize("c", SINGLE_DECODE, ids=case_id)
def test_single_decode(c):
    gen = torch.Generator().manual_seed(c["seed"])
    hkv, d, dtype = 2, c["head_dim"], c["dtype"]
    hq = hkv * c["group"]
    q = torch.randn(hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(c["kv_len"], hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(c["kv_len"], hkv, d, generator=gen).to(dtype).to(DEV)
    kk, vv = (k, v) if c["layout"] == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    out, lse = tessera.single_decode_with_kv_cache(q, kk, vv, kv_layout=c["layout"], return_lse=True)
    ref_o, ref_lse = ref_attention(q[None], k, v, False, 1 / math.sqrt(d))
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (hq,)
    assert_close(out, lse, ref_o[0], ref_lse[0], dtype, "single_decode")
    only = tessera.single_decode_with_kv_cache(q, kk, vv, kv_layout=c["layout"], sm_scale=0.3)
    assert isinstance(only, torch.Tensor)
    assert_close(only, None, ref_attention(q[None], k, v, False, 0.3)[0][0], None, dtype, "single_decode sm_scale")


SINGLE_PREFILL = make_cases(8, 2, qo_len=QO_LENS, kv_len=KV_LENS, group=(1, 4, 5), head_dim=(64, 128),
                            layout=("NHD", "HND"), dtype=DTYPES, causal=(False, True))


@pytest.mark.parametrize("c", SINGLE_PREFILL, ids=case_id)
def test_single_prefill(c):
    gen = torch.Generator().manual_seed(c["seed"])
    hkv, d, dtype = 2, c["head_dim"], c["dtype"]
    hq = hkv * c["group"]
    q = torch.randn(c["qo_len"], hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(c["kv_len"], hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(c["kv_len"], hkv, d, generator=gen).to(dtype).to(DEV)
    kk, vv = (k, v) if c["layout"] == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    out, lse = tessera.single_prefill_with_kv_cache(q, kk, vv, causal=c["causal"], kv_layout=c["layout"],
                                                    return_lse=True)
    ref_o, ref_lse = ref_attention(q, k, v, c["causal"], 1 / math.sqrt(d))
    assert out.shape == q.shape and lse.shape == (c["qo_len"], hq)
    assert_close(out, lse, ref_o, ref_lse, dtype, "single_prefill")


# --- batch decode ----------------------------------------------------------------------------------

DECODE = make_cases(16, 3, batch=(1, 7), kv_len=KV_LENS, page_size=(1, 16), group=(1, 4, 5), head_dim=(64, 128),
                    layout=("NHD", "HND"), dtype=DTYPES, combined=(False, True))


@pytest.mark.parametrize("c", DECODE, ids=case_id)
def test_batch_decode(c, workspace):
    rng = random.Random(c["seed"])
    gen = torch.Generator().manual_seed(c["seed"])
    hkv, d, dtype, ps = 2, c["head_dim"], c["dtype"], c["page_size"]
    hq = hkv * c["group"]
    kv_lens = lengths(rng, c["batch"], c["kv_len"], KV_LENS)
    cache = Paged(kv_lens, ps, hkv, d, dtype, c["layout"], c["combined"], gen)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, c["layout"])
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype)
    q = torch.randn(c["batch"], hq, d, generator=gen).to(dtype).to(DEV)
    out, lse = poisoned(q.shape, dtype), poisoned((c["batch"], hq), torch.float32)
    res = w.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    for b in range(c["batch"]):
        k, v = cache.request_kv(b)
        ref_o, ref_lse = ref_attention(q[b : b + 1], k, v, False, 1 / math.sqrt(d))
        assert_close(out[b], lse[b], ref_o[0], ref_lse[0], dtype, f"decode request {b} (kv_len {kv_lens[b]})")
    # Same plan, another "layer": fresh q; without return_lse only the output comes back.
    q2 = torch.randn(c["batch"], hq, d, generator=gen).to(dtype).to(DEV)
    out2 = w.run(q2, cache.cache)
    assert isinstance(out2, torch.Tensor) and out2.shape == q2.shape
    k, v = cache.request_kv(0)
    assert_close(out2[0], None, ref_attention(q2[:1], k, v, False, 1 / math.sqrt(d))[0][0], None, dtype, "layer 2")


# --- batch prefill over paged KV -------------------------------------------------------------------

PREFILL_PAGED = make_cases(20, 4, batch=(1, 7), qo_len=QO_LENS, kv_len=KV_LENS, page_size=(1, 16),
                           group=(1, 4, 5), head_dim=(64, 128), layout=("NHD", "HND"), dtype=DTYPES,
                           causal=(False, True), combined=(False, True))


@pytest.mark.parametrize("c", PREFILL_PAGED, ids=case_id)
def test_batch_prefill_paged(c, workspace):
    rng = random.Random(c["seed"])
    gen = torch.Generator().manual_seed(c["seed"])
    hkv, d, dtype, ps = 2, c["head_dim"], c["dtype"], c["page_size"]
    hq = hkv * c["group"]
    qo_lens = lengths(rng, c["batch"], c["qo_len"], QO_LENS)
    kv_lens = lengths(rng, c["batch"], c["kv_len"], KV_LENS)
    cache = Paged(kv_lens, ps, hkv, d, dtype, c["layout"], c["combined"], gen)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, c["layout"])
    w.plan(qo_indptr.to(DEV), cache.indptr.to(DEV), cache.indices, cache.last_page_len.to(DEV), hq, hkv, d, ps,
           causal=c["causal"], q_data_type=dtype)
    total = int(qo_indptr[-1])
    q = torch.randn(total, hq, d, generator=gen).to(dtype).to(DEV)
    out, lse = poisoned(q.shape, dtype), poisoned((total, hq), torch.float32)
    w.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    for b in range(c["batch"]):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = cache.request_kv(b)
        ref_o, ref_lse = ref_attention(q[lo:hi], k, v, c["causal"], 1 / math.sqrt(d))
        assert_close(out[lo:hi], lse[lo:hi], ref_o, ref_lse, dtype,
                     f"prefill request {b} (qo {qo_lens[b]}, kv {kv_lens[b]})")


# --- batch prefill over ragged KV ------------------------------------------------------------------

PREFILL_RAGGED = make_cases(12, 5, batch=(1, 7), qo_len=QO_LENS, kv_len=KV_LENS, group=(1, 4, 5),
                            head_dim=(64, 128), layout=("NHD", "HND"), dtype=DTYPES, causal=(False, True))


@pytest.mark.parametrize("c", PREFILL_RAGGED, ids=case_id)
def test_batch_prefill_ragged(c, workspace):
    rng = random.Random(c["seed"])
    gen = torch.Generator().manual_seed(c["seed"])
    hkv, d, dtype = 2, c["head_dim"], c["dtype"]
    hq = hkv * c["group"]
    qo_lens = lengths(rng, c["batch"], c["qo_len"], QO_LENS)
    kv_lens = lengths(rng, c["batch"], c["kv_len"], KV_LENS)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    total_q, total_kv = int(qo_indptr[-1]), int(kv_indptr[-1])
    q = torch.randn(total_q, hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(total_kv, hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(total_kv, hkv, d, generator=gen).to(dtype).to(DEV)
    kk, vv = (k, v) if c["layout"] == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, c["layout"])
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=c["causal"], q_data_type=dtype)
    out, lse = poisoned(q.shape, dtype), poisoned((total_q, hq), torch.float32)
    w.run(q, kk, vv, out=out, lse=lse, return_lse=True)
    for b in range(c["batch"]):
        qs, ks = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ref_o, ref_lse = ref_attention(q[qs], k[ks], v[ks], c["causal"], 1 / math.sqrt(d))
        assert_close(out[qs], lse[qs], ref_o, ref_lse, dtype, f"ragged request {b} (qo {qo_lens[b]}, kv {kv_lens[b]})")


# --- runtime behaviour: growth, workspace size, streams, determinism, split options ------------------


def test_plan_grows_and_reuses_the_runtime(workspace):
    gen = torch.Generator().manual_seed(7)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.bfloat16
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace)
    for kv_lens, expected_builds in (([5, 40], 1), ([7, 41], 1), ([3] * 9, 2), ([600] * 5, 2), ([9] * 33, 3)):
        cache = Paged(kv_lens, ps, hkv, d, dtype, "NHD", False, gen)
        w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype)
        assert w._holder.builds == expected_builds, (kv_lens, w._holder.builds)
        q = torch.randn(len(kv_lens), hq, d, generator=gen).to(dtype).to(DEV)
        out = w.run(q, cache.cache)
        for b in (0, len(kv_lens) - 1):
            k, v = cache.request_kv(b)
            assert_close(out[b], None, ref_attention(q[b : b + 1], k, v, False, 1 / math.sqrt(d))[0][0], None, dtype,
                         f"grow {kv_lens}")
    info = w.plan_info()
    assert info["batch_size"] == 33 and info["grid_cols"] >= 1


def test_workspace_too_small_names_the_bytes():
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(4096, dtype=torch.uint8, device=DEV))
    with pytest.raises(ValueError, match=r"float_workspace_buffer has 4096 bytes, but this plan needs \d+ bytes"):
        w.plan(torch.tensor([0, 100], dtype=torch.int32), torch.tensor([0, 300], dtype=torch.int32), 8, 8, 128,
               q_data_type=torch.float16)


def test_side_stream_determinism_and_split_options(workspace):
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d, dtype = 8, 2, 128, torch.float16
    # qo lengths 1, 17, 128; kv lengths 4000, 2049, 300 (long enough to split)
    qo_indptr = torch.tensor([0, 1, 18, 146], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 4000, 6049, 6349], dtype=torch.int32)
    q = torch.randn(146, hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(6349, hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(6349, hkv, d, generator=gen).to(dtype).to(DEV)
    refs = [ref_attention(q[int(qo_indptr[b]):int(qo_indptr[b + 1])], k[int(kv_indptr[b]):int(kv_indptr[b + 1])],
                          v[int(kv_indptr[b]):int(kv_indptr[b + 1])], True, 1 / math.sqrt(d)) for b in range(3)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs were made on the current stream
    results = []
    for opts in ({}, {"disable_split_kv": True}, {"fixed_split_size": 256}):
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace)
        with torch.cuda.stream(stream):
            w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, q_data_type=dtype, **opts)
            out1, lse1 = w.run(q, k, v, return_lse=True)
            out2, lse2 = w.run(q, k, v, return_lse=True)
        stream.synchronize()
        assert torch.equal(out1, out2) and torch.equal(lse1, lse2), f"{opts}: repeated runs differ"
        for b in range(3):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            assert_close(out1[rows], lse1[rows], refs[b][0], refs[b][1], dtype, f"{opts} request {b}")
        results.append(w.plan_info())
    assert results[1]["num_partials"] == 0 and results[1]["chunk_size"] == 0


# --- serving-style decode loop under a CUDA graph ---------------------------------------------------


def test_decode_cuda_graph_serving_loop():
    """One plan per step shared by 32 layers; run() captured once, replayed after re-planning."""
    gen = torch.Generator().manual_seed(2024)
    num_layers, batch, hq, hkv, d, ps, dtype = 32, 7, 8, 2, 128, 16, torch.bfloat16
    base = [1, 15, 16, 17, 300, 1000, 2049]
    growth = [0, 1, 37, 130, 700]  # five steps with growing lengths
    max_pages = math.ceil((max(base) + max(growth)) / ps)
    num_pages = batch * max_pages + 5
    owned = torch.randperm(num_pages, generator=gen)[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    k_cache = [torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV) for _ in range(num_layers)]
    v_cache = [torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV) for _ in range(num_layers)]

    def page_table(kv_lens):
        pages = [math.ceil(n / ps) for n in kv_lens]
        indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
        indices = torch.cat([owned[b, : pages[b]] for b in range(batch)]).to(DEV)
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        return indptr, indices, last

    def request_kv(layer, indices, indptr, kv_lens, b):
        ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
        return [t[ids].reshape(-1, hkv, d)[: kv_lens[b]] for t in (k_cache[layer], v_cache[layer])]

    graph_ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    eager_ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device=DEV)
    indices_buf = torch.zeros(batch * max_pages, dtype=torch.int32, device=DEV)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=DEV)
    graph_w = tessera.BatchDecodeWithPagedKVCacheWrapper(
        graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    eager_w = tessera.BatchDecodeWithPagedKVCacheWrapper(eager_ws, "NHD")
    q_buf = torch.randn(num_layers, batch, hq, d, generator=gen).to(dtype).to(DEV)
    out_buf = torch.zeros(num_layers, batch, hq, d, dtype=dtype, device=DEV)

    def layers():
        for layer in range(num_layers):
            graph_w.run(q_buf[layer], (k_cache[layer], v_cache[layer]), out=out_buf[layer])

    # Step 0's plan, a warm-up outside the capture, then one capture of all 32 layers.
    graph_w.plan(*page_table(base), hq, hkv, d, ps, q_data_type=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layers()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()

    for step, extra in enumerate(growth):
        kv_lens = [n + extra for n in base]
        indptr, indices, last = page_table(kv_lens)
        graph_w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype)  # outside the capture
        q_buf.copy_(torch.randn(num_layers, batch, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        replay1 = out_buf.clone()
        graph.replay()
        assert torch.equal(replay1, out_buf), f"step {step}: two replays of one plan differ"
        eager_w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype)
        for layer in range(num_layers):
            eager = eager_w.run(q_buf[layer], (k_cache[layer], v_cache[layer]))
            assert_close(out_buf[layer], None, eager.float(), None, dtype, f"step {step} layer {layer}: graph vs eager")
        for layer in (0, num_layers - 1):
            for b in range(batch):
                k, v = request_kv(layer, indices, indptr, kv_lens, b)
                ref_o, _ = ref_attention(q_buf[layer, b : b + 1], k, v, False, 1 / math.sqrt(d))
                assert_close(out_buf[layer, b], None, ref_o[0], None, dtype,
                             f"step {step} layer {layer} request {b} (kv_len {kv_lens[b]})")
    assert graph_w._holder.builds == 1


# --- merge ---------------------------------------------------------------------------------------


def ref_merge(vs, ss):
    """vs: list of [rows, H, D], ss: list of [rows, H] base-2 -> merged (fp32)."""
    s = torch.stack([x.float() for x in ss])  # [n, rows, H]
    m = torch.logsumexp(s * LN2, dim=0) / LN2
    w = torch.nan_to_num(torch.exp2(s - m[None]), nan=0.0)
    v = sum(w[i][..., None] * vs[i].float() for i in range(len(vs)))
    return v, m


@pytest.mark.parametrize("dtype", DTYPES + (torch.float32,), ids=str)
@pytest.mark.parametrize("head_dim", (64, 128))
def test_merge_state(dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    rows, heads = 37, 5
    va, vb = (torch.randn(rows, heads, head_dim, generator=gen).to(dtype).to(DEV) for _ in range(2))
    sa, sb = (torch.randn(rows, heads, generator=gen).mul(4).to(DEV) for _ in range(2))
    sa[0], sb[1], sa[2], sb[2] = float("-inf"), float("-inf"), float("-inf"), float("-inf")
    va[2].zero_(), vb[2].zero_()
    v, s = tessera.merge_state(va, sa, vb, sb)
    ref_v, ref_s = ref_merge([va, vb], [sa, sb])
    tol = {torch.float32: 1e-4, **REL_TOL}[dtype]
    assert (v.float() - ref_v).norm() / ref_v.norm() <= tol
    assert torch.equal(torch.isneginf(s), torch.isneginf(ref_s))
    fin = torch.isfinite(ref_s)
    assert (s[fin] - ref_s[fin]).abs().max() <= 1e-3
    assert (v[2] == 0).all()
    # In place: (va, sa) += (vb, sb).
    tessera.merge_state_in_place(va, sa, vb, sb)
    assert (va.float() - ref_v).norm() / ref_v.norm() <= tol
    assert torch.equal(torch.isneginf(sa), torch.isneginf(ref_s))


@pytest.mark.parametrize("num_states", (1, 2, 5))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_states(num_states, dtype):
    gen = torch.Generator().manual_seed(num_states)
    rows, heads, d = 19, 4, 128
    v = torch.randn(rows, num_states, heads, d, generator=gen).to(dtype).to(DEV)
    s = torch.randn(rows, num_states, heads, generator=gen).mul(3).to(DEV)
    s[3] = float("-inf")
    v[3] = 0
    vm, sm = tessera.merge_states(v, s)
    ref_v, ref_s = ref_merge([v[:, i] for i in range(num_states)], [s[:, i] for i in range(num_states)])
    assert vm.shape == (rows, heads, d) and sm.shape == (rows, heads)
    assert (vm.float() - ref_v).norm() / ref_v.norm() <= REL_TOL[dtype]
    fin = torch.isfinite(ref_s)
    assert torch.equal(torch.isneginf(sm), ~fin)
    assert (sm[fin] - ref_s[fin]).abs().max() <= 1e-3


def test_split_kv_by_merge_equals_full_attention():
    """Cascade identity: attention over [A | B] == merge(attention over A, attention over B)."""
    gen = torch.Generator().manual_seed(5)
    dtype, hq, hkv, d = torch.float16, 8, 2, 128
    q = torch.randn(9, hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(700, hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(700, hkv, d, generator=gen).to(dtype).to(DEV)
    oa, sa = tessera.single_prefill_with_kv_cache(q, k[:300], v[:300], return_lse=True)
    ob, sb = tessera.single_prefill_with_kv_cache(q, k[300:], v[300:], return_lse=True)
    o, s = tessera.merge_state(oa, sa, ob, sb)
    ref_o, ref_s = ref_attention(q, k, v, False, 1 / math.sqrt(d))
    assert_close(o, s, ref_o, ref_s, dtype, "merge of two halves")


# --- append ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ("NHD", "HND"))
@pytest.mark.parametrize("page_size", (1, 16))
@pytest.mark.parametrize("combined", (False, True))
def test_append_paged_kv_cache(layout, page_size, combined):
    gen = torch.Generator().manual_seed(page_size + 2 * combined)
    dtype, hkv, d = torch.bfloat16, 2, 128
    old_lens, append_lens = [0, 5, 16, 33], [3, 1, 17, 0]
    new_lens = [a + b for a, b in zip(old_lens, append_lens)]
    cache = Paged(new_lens, page_size, hkv, d, dtype, layout, combined, gen)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    nnz = sum(append_lens)
    ak = torch.randn(nnz, hkv, d, generator=gen).to(dtype).to(DEV)
    av = torch.randn(nnz, hkv, d, generator=gen).to(dtype).to(DEV)
    append_indptr = torch.tensor([0] + torch.tensor(append_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    seq_lens = tessera.get_seq_lens(cache.indptr.to(DEV), cache.last_page_len.to(DEV), page_size)
    assert seq_lens.tolist() == new_lens
    bi, pos = tessera.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    tessera.append_paged_kv_cache(ak, av, bi, pos, cache.cache, cache.indices, cache.indptr.to(DEV),
                                  cache.last_page_len.to(DEV), layout)
    row = 0
    for b in range(len(new_lens)):
        k, v = cache.request_kv(b)
        got_k, got_v = k[old_lens[b]:], v[old_lens[b]:]
        assert torch.equal(got_k, ak[row : row + append_lens[b]]) and torch.equal(got_v, av[row : row + append_lens[b]])
        row += append_lens[b]
    # Nothing else changed: restore the appended slots in a copy of "before" and compare.
    for b in range(len(new_lens)):
        ids = cache.indices[int(cache.indptr[b]):int(cache.indptr[b + 1])].long()
        for j in range(old_lens[b], new_lens[b]):
            p, slot = int(ids[j // page_size]), j % page_size
            idx = (p, slot) if layout == "NHD" else (p, slice(None), slot)
            before_k[idx] = cache.k[idx]
            before_v[idx] = cache.v[idx]
    assert torch.equal(before_k, cache.k) and torch.equal(before_v, cache.v)


# --- the README example, as written ------------------------------------------------------------------


def test_readme_example():
    import torch, tessera  # noqa: E401,F811 - the example's own first line
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")     # workspace, reused by every step
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="NHD")
    kv_cache = torch.randn(64, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")  # [pages, K/V, page_size, H_kv, D]
    indptr = torch.tensor([0, 3, 7], dtype=torch.int32)              # request 0: 3 pages, request 1: 4 pages
    indices = torch.tensor([9, 2, 40, 5, 6, 7, 63], dtype=torch.int32, device="cuda")  # the page table
    last_page_len = torch.tensor([5, 16], dtype=torch.int32)         # tokens in each request's last page
    wrapper.plan(indptr, indices, last_page_len, 32, 8, 128, 16, q_data_type=torch.bfloat16)  # once per step
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")   # one new token per request
    out, lse = wrapper.run(q, kv_cache, return_lse=True)               # per layer; lse is base 2
    print(out.shape, lse.shape)                                        # [2, 32, 128], [2, 32]

    assert out.shape == (2, 32, 128) and lse.shape == (2, 32)
    for b, (pages, length) in enumerate((([9, 2, 40], 2 * 16 + 5), ([5, 6, 7, 63], 4 * 16))):
        k = kv_cache[pages, 0].reshape(-1, 8, 128)[:length]
        v = kv_cache[pages, 1].reshape(-1, 8, 128)[:length]
        ref_o, ref_lse = ref_attention(q[b : b + 1], k, v, False, 1 / math.sqrt(128))
        assert_close(out[b], lse[b], ref_o[0], ref_lse[0], torch.bfloat16, f"README example request {b}")
