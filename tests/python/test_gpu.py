"""GPU tests of the Python package: every wrapper and function against a PyTorch fp32 reference.

Skipped (with the reason) when torch.cuda.is_available() is False. The reference is written from
the mathematics: softmax(q k^T * sm_scale) v with GQA (query head h reads KV head h // group),
causal masking with the query offset kv_len - qo_len, base-2 log-sum-exp, and rows that see no
key give o = 0, lse = -inf. Outputs are poisoned with NaN before each call, inputs are random
(never zeros). Errors: ||out - ref|| / ||ref|| <= 1e-2 (bf16) / 4e-3 (fp16); LSE absolute error
<= 8e-3 (bf16) / 1e-3 (fp16), the tolerances of the C++ GPU tests.
"""

import math
import os
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
            fp8 = "float8" in str(t.dtype)  # gathered as bytes: not every torch indexes fp8 tensors
            pages = (t.view(torch.uint8) if fp8 else t)[ids]
            if self.layout == "HND":
                pages = pages.permute(0, 2, 1, 3)
            rows = pages.reshape(-1, pages.shape[2], pages.shape[3])[: self.kv_lens[b]]
            out.append(rows.view(t.dtype) if fp8 else rows)
        return out


# --- single-request functions --------------------------------------------------------------------

SINGLE_DECODE = make_cases(6, 1, kv_len=KV_LENS + (100,), group=(1, 4, 5), head_dim=(64, 96, 128),
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


SINGLE_PREFILL = make_cases(8, 2, qo_len=QO_LENS, kv_len=KV_LENS, group=(1, 4, 5), head_dim=(64, 96, 128),
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

DECODE = make_cases(16, 3, batch=(1, 7), kv_len=KV_LENS, page_size=(1, 16), group=(1, 4, 5), head_dim=(64, 96, 128),
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
                           group=(1, 4, 5), head_dim=(64, 96, 128), layout=("NHD", "HND"), dtype=DTYPES,
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
                            head_dim=(64, 96, 128), layout=("NHD", "HND"), dtype=DTYPES, causal=(False, True))


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
    assert info["batch_size"] == 33 and info["grid_cols"] >= 1 and info["heads_per_cta"] >= 1


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


@pytest.mark.parametrize("dtype", (torch.int8, torch.uint8, torch.float32), ids=str)
def test_workspace_of_any_dtype(dtype):
    # FlashInfer's examples allocate int8 workspaces, engines uint8; Tessera takes the bytes.
    gen = torch.Generator().manual_seed(21)
    ws = torch.empty((64 << 20) // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=DEV)
    cache = Paged([100, 7], 16, 2, 128, torch.float16, "NHD", False, gen)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 128, 16, q_data_type=torch.float16)
    q = torch.randn(2, 8, 128, generator=gen).half().to(DEV)
    out = w.run(q, cache.cache)
    for b in range(2):
        k, v = cache.request_kv(b)
        assert_close(out[b], None, ref_attention(q[b : b + 1], k, v, False, 128 ** -0.5)[0][0], None, torch.float16,
                     f"{dtype} workspace, request {b}")


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", (1, 16, 64))
@pytest.mark.parametrize("shared", (False, True))
def test_append_paged_mla_kv_cache(dtype, page_size, shared):
    """Latent rows land bit for bit where the (shuffled) page table puts them; nothing else changes."""
    gen = torch.Generator().manual_seed(page_size + 2 * shared)
    ckv_dim, kpe_dim = 512, 64
    old_lens, append_lens = [0, 5, 16, 33, 7], [3, 1, 17, 0, 2]  # nnz = 23, odd
    new_lens = [a + b for a, b in zip(old_lens, append_lens)]
    pages = [(n + page_size - 1) // page_size for n in new_lens]
    num_pages = sum(pages) + 3
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    kv_indices = perm[: sum(pages)].to(DEV)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    kv_last_page_len = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(new_lens, pages)],
                                    dtype=torch.int32, device=DEV)
    # Shared: ckv and kpe slices of one [num_pages, page_size, 576 + 8] tensor (8 elements of padding).
    width = ckv_dim + kpe_dim + 8 if shared else None
    if shared:
        whole = torch.empty(num_pages, page_size, width, dtype=dtype, device=DEV)
        whole.view(torch.int16).fill_(-1)  # poison: 0xFFFF, a NaN
        ckv_cache, kpe_cache = whole[:, :, :ckv_dim], whole[:, :, ckv_dim:ckv_dim + kpe_dim]
    else:
        ckv_cache = torch.empty(num_pages, page_size, ckv_dim, dtype=dtype, device=DEV)
        kpe_cache = torch.empty(num_pages, page_size, kpe_dim, dtype=dtype, device=DEV)
        ckv_cache.view(torch.int16).fill_(-1)
        kpe_cache.view(torch.int16).fill_(-1)
    nnz = sum(append_lens)
    # Random 16-bit patterns (NaN payloads included): a copy must keep every bit.
    rows = torch.randint(-32768, 32767, (nnz, ckv_dim + kpe_dim), generator=gen, dtype=torch.int16)
    rows[rows == -1] = 0  # never the poison
    rows = rows.view(dtype).to(DEV)
    append_ckv, append_kpe = rows[:, :ckv_dim], rows[:, ckv_dim:]
    if not shared:
        append_ckv, append_kpe = append_ckv.contiguous(), append_kpe.contiguous()
    seq_lens = tessera.get_seq_lens(kv_indptr, kv_last_page_len, page_size)
    append_indptr = torch.tensor([0] + torch.tensor(append_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    bi, pos = tessera.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    order = torch.randperm(nnz, generator=gen).to(DEV)  # targets are per row: any order
    bi, pos = bi[order], pos[order]
    expect_ckv, expect_kpe = ckv_cache.view(torch.int16).clone(), kpe_cache.view(torch.int16).clone()
    expect_whole = whole.view(torch.int16).clone() if shared else None
    page = kv_indices[(kv_indptr[bi.long()] + pos // page_size).long()].long()
    slot = (pos % page_size).long()
    expect_ckv[page, slot] = append_ckv.view(torch.int16)
    expect_kpe[page, slot] = append_kpe.view(torch.int16)
    if shared:
        expect_whole[page, slot, :ckv_dim] = append_ckv.view(torch.int16)
        expect_whole[page, slot, ckv_dim:ckv_dim + kpe_dim] = append_kpe.view(torch.int16)

    tessera.append_paged_mla_kv_cache(append_ckv, append_kpe, bi, pos, ckv_cache, kpe_cache, kv_indices, kv_indptr,
                                      kv_last_page_len)
    assert torch.equal(ckv_cache.view(torch.int16), expect_ckv)
    assert torch.equal(kpe_cache.view(torch.int16), expect_kpe)
    if shared:
        assert torch.equal(whole.view(torch.int16), expect_whole), "the padding between kpe and ckv was written"


@pytest.mark.parametrize("dtype", (torch.float8_e4m3fn, torch.float8_e5m2))
def test_append_paged_mla_kv_cache_fp8(dtype):
    """An fp8 latent cache: the rows' bytes land where the page table puts them (a bit copy)."""
    gen = torch.Generator().manual_seed(3)
    page_size, ckv_dim, kpe_dim = 16, 512, 64
    old_lens, append_lens = [0, 20, 7], [5, 13, 1]
    new_lens = [a + b for a, b in zip(old_lens, append_lens)]
    pages = [(n + page_size - 1) // page_size for n in new_lens]
    num_pages = sum(pages) + 2
    kv_indices = torch.randperm(num_pages, generator=gen)[: sum(pages)].to(torch.int32).to(DEV)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    kv_last_page_len = torch.tensor([n - (p - 1) * page_size for n, p in zip(new_lens, pages)], dtype=torch.int32,
                                    device=DEV)
    # One [num_pages, page_size, 576] tensor, ckv and kpe its slices; poisoned with 0xFF bytes.
    whole = torch.full((num_pages, page_size, ckv_dim + kpe_dim), 255, dtype=torch.uint8, device=DEV)
    ckv_cache, kpe_cache = whole.view(dtype)[:, :, :ckv_dim], whole.view(dtype)[:, :, ckv_dim:]
    nnz = sum(append_lens)
    rows = torch.randint(0, 255, (nnz, ckv_dim + kpe_dim), generator=gen, dtype=torch.uint8).to(DEV)  # never 0xFF
    seq_lens = tessera.get_seq_lens(kv_indptr, kv_last_page_len, page_size)
    append_indptr = torch.tensor([0] + torch.tensor(append_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    bi, pos = tessera.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    expect = whole.clone()
    page = kv_indices[(kv_indptr[bi.long()] + pos // page_size).long()].long()
    expect[page, (pos % page_size).long()] = rows
    view = rows.view(dtype)
    tessera.append_paged_mla_kv_cache(view[:, :ckv_dim], view[:, ckv_dim:], bi, pos, ckv_cache, kpe_cache, kv_indices,
                                      kv_indptr, kv_last_page_len)
    assert torch.equal(whole, expect)


# --- fp8 KV caches (e4m3, e5m2) -----------------------------------------------------------------------
# Codes are torch's casts of N(0, 1) values; scales are powers of two, so code x scale is exact in
# 16 bits and the reference (fp32 attention over code x scale) sees what the kernels' tiles hold.

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequant(codes, scale, head_dim=1):
    """codes x scale in fp32; scale a float or a per-KV-head tensor (KV heads on dim `head_dim`)."""
    x = codes.float()
    if isinstance(scale, torch.Tensor):
        shape = [1] * x.dim()
        shape[head_dim] = -1
        return x * scale.float().view(shape)
    return x * scale


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("per_head", (False, True))
def test_single_decode_and_prefill_fp8(fp8, per_head):
    gen = torch.Generator().manual_seed(11 + per_head)
    hkv, group, d, kv = 2, 4, 128, 777
    hq = hkv * group
    k = torch.randn(kv, hkv, d, generator=gen).to(fp8).to(DEV)
    v = torch.randn(kv, hkv, d, generator=gen).to(fp8).to(DEV)
    ks = torch.tensor([0.5, 2.0], device=DEV) if per_head else 0.25
    vs = torch.tensor([4.0, 0.125], device=DEV) if per_head else 2.0
    kd, vd = dequant(k, ks), dequant(v, vs)
    for dtype in DTYPES:
        q = torch.randn(hq, d, generator=gen).to(dtype).to(DEV)
        out, lse = tessera.single_decode_with_kv_cache(q, k, v, k_scale=ks, v_scale=vs, return_lse=True)
        ref_o, ref_lse = ref_attention(q[None], kd, vd, False, 1 / math.sqrt(d))
        assert_close(out, lse, ref_o[0], ref_lse[0], dtype, f"single_decode {fp8}")
        qp = torch.randn(50, hq, d, generator=gen).to(dtype).to(DEV)
        out, lse = tessera.single_prefill_with_kv_cache(qp, k, v, scale_k=ks, scale_v=vs, causal=True, return_lse=True)
        ref_o, ref_lse = ref_attention(qp, kd, vd, True, 1 / math.sqrt(d))
        assert_close(out, lse, ref_o, ref_lse, dtype, f"single_prefill {fp8}")


@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_wrappers_fp8(fp8, workspace):
    gen = torch.Generator().manual_seed(12)
    rng = random.Random(12)
    hkv, group, d, ps, dtype = 2, 4, 128, 16, torch.bfloat16
    hq = hkv * group
    kv_lens = lengths(rng, 5, 2049, KV_LENS)
    cache = Paged(kv_lens, ps, hkv, d, fp8, "NHD", False, gen)
    # Decode: run() takes this call's scales (two calls with different ones, one plan).
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, kv_data_type=fp8)
    q = torch.randn(5, hq, d, generator=gen).to(dtype).to(DEV)
    for ks, vs in ((0.5, 2.0), (4.0, 0.25)):
        out, lse = w.run(q, cache.cache, k_scale=ks, v_scale=vs, return_lse=True)
        for b in range(5):
            k, v = cache.request_kv(b)
            ref_o, ref_lse = ref_attention(q[b : b + 1], dequant(k, ks), dequant(v, vs), False, 1 / math.sqrt(d))
            assert_close(out[b], lse[b], ref_o[0], ref_lse[0], dtype, f"decode fp8 request {b} scales {ks}, {vs}")
    with pytest.raises(TypeError, match="kv_data_type"):
        w.run(q, (cache.k.to(dtype), cache.v.to(dtype)))
    # Prefill over the paged cache and over ragged K/V.
    qo_lens = lengths(rng, 5, 128, QO_LENS)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    qp = torch.randn(int(qo_indptr[-1]), hq, d, generator=gen).to(dtype).to(DEV)
    wp = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wp.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, causal=True,
            q_data_type=dtype, kv_data_type=fp8)
    out = wp.run(qp, cache.cache, k_scale=0.5, v_scale=0.5)
    for b in range(5):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k, v = cache.request_kv(b)
        ref_o, _ = ref_attention(qp[lo:hi], dequant(k, 0.5), dequant(v, 0.5), True, 1 / math.sqrt(d))
        assert_close(out[lo:hi], None, ref_o, None, dtype, f"paged prefill fp8 request {b}")
    ks = [cache.request_kv(b)[0] for b in range(5)]
    vs = [cache.request_kv(b)[1] for b in range(5)]
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    kr = torch.cat([x.view(torch.uint8) for x in ks]).view(fp8)
    vr = torch.cat([x.view(torch.uint8) for x in vs]).view(fp8)
    wr = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    wr.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, q_data_type=dtype, kv_data_type=fp8)
    out = wr.run(qp, kr, vr, k_scale=2.0, v_scale=0.5)
    for b in range(5):
        qs, kv_s = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ref_o, _ = ref_attention(qp[qs], dequant(kr[kv_s], 2.0), dequant(vr[kv_s], 0.5), True, 1 / math.sqrt(d))
        assert_close(out[qs], None, ref_o, None, dtype, f"ragged prefill fp8 request {b}")


def test_decode_cuda_graph_fp8_scales():
    # A captured run() holds its scale fills: replays use the capture's scales even after an eager
    # run with others.
    gen = torch.Generator().manual_seed(14)
    batch, hq, hkv, d, ps, dtype, fp8 = 3, 8, 2, 128, 16, torch.bfloat16, torch.float8_e4m3fn
    cache = Paged([40, 300, 7], ps, hkv, d, fp8, "NHD", False, gen)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device=DEV)
    indices_buf = torch.zeros(64, dtype=torch.int32, device=DEV)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=DEV)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
                                                   paged_kv_indices_buffer=indices_buf,
                                                   paged_kv_last_page_len_buffer=last_buf)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, kv_data_type=fp8)
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).to(DEV)
    out = torch.zeros_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q, cache.cache, k_scale=0.5, v_scale=2.0, out=out)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache.cache, k_scale=0.5, v_scale=2.0, out=out)

    def check(ks, vs, what):
        for b in range(batch):
            k, v = cache.request_kv(b)
            ref_o, _ = ref_attention(q[b : b + 1], dequant(k, ks), dequant(v, vs), False, 1 / math.sqrt(d))
            assert_close(out[b], None, ref_o[0], None, dtype, f"{what}, request {b}")

    out.fill_(float("nan"))
    graph.replay()
    check(0.5, 2.0, "replay")
    w.run(q, cache.cache, k_scale=4.0, v_scale=0.25, out=out)
    check(4.0, 0.25, "eager run with other scales")
    out.fill_(float("nan"))
    graph.replay()
    check(0.5, 2.0, "replay after the eager run")


@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_append_paged_kv_cache_fp8(fp8):
    gen = torch.Generator().manual_seed(13)
    hkv, d, ps = 2, 128, 16
    lens = [5, 40, 0, 17]
    cache = Paged(lens, ps, hkv, d, fp8, "NHD", False, gen)
    nnz = sum(lens)
    ak = torch.randn(nnz, hkv, d, generator=gen).to(torch.bfloat16).to(DEV)
    av = torch.randn(nnz, hkv, d, generator=gen).to(torch.bfloat16).to(DEV)
    append_indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    seq_lens = tessera.get_seq_lens(cache.indptr.to(DEV), cache.last_page_len.to(DEV), ps)
    bi, pos = tessera.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    tessera.append_paged_kv_cache(ak, av, bi, pos, cache.cache, cache.indices, cache.indptr.to(DEV),
                                  cache.last_page_len.to(DEV), "NHD")
    row = 0
    for b, n in enumerate(lens):
        k, v = cache.request_kv(b)
        # N(0, 1) rows are inside both formats' range, where torch's cast rounds to nearest even too.
        assert torch.equal(k.view(torch.uint8), ak[row : row + n].to(fp8).view(torch.uint8))
        assert torch.equal(v.view(torch.uint8), av[row : row + n].to(fp8).view(torch.uint8))
        row += n


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


def test_host_page_ids_out_of_range_are_named_at_run(workspace):
    """Page ids plan() got on the host are checked against the cache at run(): an id past the
    cache's pages (or negative) is a ValueError naming it, for the decode and prefill wrappers,
    never silently masked."""
    kv_cache = torch.randn(8, 2, 16, 2, 64, dtype=torch.float16, device="cuda")  # 8 pages
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32)
    last = torch.tensor([16, 3], dtype=torch.int32)
    q = torch.randn(2, 4, 64, dtype=torch.float16, device="cuda")
    decode = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    for bad, index in ((8, 1), (-1, 2)):
        indices = torch.tensor([3, bad, 5] if index == 1 else [3, 4, bad], dtype=torch.int32)  # host
        decode.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type=torch.float16)
        with pytest.raises(ValueError, match=rf"indices\[{index}\] = {bad} is out of range \[0, 8\)"):
            decode.run(q, kv_cache)
    decode.plan(indptr, torch.tensor([3, 4, 5], dtype=torch.int32), last, 4, 2, 64, 16, q_data_type=torch.float16)
    decode.run(q, kv_cache)  # in range: runs
    prefill = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    qo_indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    prefill.plan(qo_indptr, indptr, torch.tensor([3, 9, 5], dtype=torch.int32), last, 4, 2, 64, 16,
                 q_data_type=torch.float16)
    with pytest.raises(ValueError, match=r"paged_kv_indices\[1\] = 9 is out of range \[0, 8\)"):
        prefill.run(q, kv_cache)


# --- variants: FlashInfer's window_left, logits_soft_cap, pos_encoding_mode, custom masks -----------
#
# The reference applies each option from its definition (docs/design.md §1.2, FlashInfer's semantics),
# for query i of a request at position p = kv_len - qo_len + i and key j:
#   RoPE (Llama, "rotate half"): q rotated at position p, k at position j, angle
#        (pos / rope_scale) * rope_theta^(-2d / D) for the pair (d, d + D/2), before the dot product;
#        the rotated operands are rounded to the dtype, as the kernels' shared-memory tiles hold them
#   s = sm_scale * q.k;  ALiBi: s += slope[h] * (j - p);  soft-cap: s = cap * tanh(s / cap)
#   visible: causal (j <= p), window (j >= p - window_left), custom mask[i, j]
# Each case also checks that the option changes the result by far more than the tolerance (so a
# kernel that ignored it would fail). Non-default variants are JIT-compiled on first use (cached
# on disk): the grid below keeps the distinct kernels few.


def alibi_slopes_ref(n):
    """Press et al.'s slopes: 2^(-8k/m), k = 1..m for the largest power of two m <= n, then the odd
    powers 2^(-4(2k-1)/m) for the remaining heads."""
    m = 1 << (n.bit_length() - 1)
    return [2.0 ** (-8.0 * k / m) for k in range(1, m + 1)] + [2.0 ** (-4.0 * (2 * k - 1) / m) for k in range(1, n - m + 1)]


def rope_ref(x, pos, rope_scale, rope_theta, dtype):
    """x [n, H, D] fp32 rotated at positions pos [n] (Llama, non-interleaved), rounded to dtype."""
    half = x.shape[-1] // 2
    d = torch.arange(half, dtype=torch.float64, device=x.device)
    inv_freq = rope_theta ** (-2.0 * d / x.shape[-1])
    angle = (pos.to(torch.float64)[:, None] / rope_scale) * inv_freq[None, :]
    cos, sin = angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(dtype).float()


def ref_variant(q, k, v, causal, sm_scale, window_left=-1, soft_cap=0.0, alibi=False, rope=None, mask=None):
    """ref_attention with the variant options: q [qo, Hq, D], k/v [kv, Hkv, D] (NHD); rope =
    (rope_scale, rope_theta); mask bool [qo, kv] (True = visible). -> (o fp32, base-2 lse)."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    qo, hq, _ = q.shape
    kv, hkv = k.shape[0], k.shape[1]
    pos_q = torch.arange(qo, device=q.device) + (kv - qo)
    pos_k = torch.arange(kv, device=q.device)
    if rope is not None:
        q = rope_ref(q, pos_q, rope[0], rope[1], dtype)
        k = rope_ref(k, pos_k, rope[0], rope[1], dtype)
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if alibi:
        slopes = torch.tensor(alibi_slopes_ref(hq), dtype=torch.float32, device=q.device)
        s = s + slopes[:, None, None] * (pos_k[None, None, :] - pos_q[None, :, None]).float()
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    visible = torch.ones(qo, kv, dtype=torch.bool, device=q.device)
    if causal:
        visible &= pos_k[None, :] <= pos_q[:, None]
    if window_left >= 0:
        visible &= pos_k[None, :] >= pos_q[:, None] - window_left
    if mask is not None:
        visible &= mask.to(q.device)
    s = s.masked_fill(~visible[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    o = torch.einsum("hqk,khd->qhd", p, v)
    return o, (lse / LN2).transpose(0, 1).contiguous()


# name -> (FlashInfer keyword arguments, ref_variant keyword arguments)
VARIANTS = {
    "window": ({"window_left": 13}, {"window_left": 13}),
    "soft_cap": ({"logits_soft_cap": 2.0}, {"soft_cap": 2.0}),
    "alibi": ({"pos_encoding_mode": "ALIBI"}, {"alibi": True}),
    "rope": ({"pos_encoding_mode": "ROPE_LLAMA"}, {"rope": (1.0, 1e4)}),
    "rope_scaled": ({"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 4.0, "rope_theta": 5e5},
                    {"rope": (4.0, 5e5)}),
    "window_cap_alibi": ({"window_left": 40, "logits_soft_cap": 3.0, "pos_encoding_mode": "ALIBI"},
                         {"window_left": 40, "soft_cap": 3.0, "alibi": True}),
    "window_cap_rope": ({"window_left": 0, "logits_soft_cap": 8.0, "pos_encoding_mode": "ROPE_LLAMA",
                         "rope_theta": 5e4}, {"window_left": 0, "soft_cap": 8.0, "rope": (1.0, 5e4)}),
}
VARIANT_ENTRIES = ("single_decode", "single_prefill", "batch_decode", "batch_prefill_paged", "batch_prefill_ragged")
VARIANT_CASES = [
    {"entry": entry, "variant": name, "dtype": DTYPES[(i + j) % 2], "head_dim": (128, 64)[(i + j // 2) % 2],
     "group": (1, 4, 5)[(i + j) % 3], "seed": 100 * i + j}
    for i, entry in enumerate(VARIANT_ENTRIES)
    for j, name in enumerate(VARIANTS)
]


def _check_variant(outs, refs, plains, dtype, what):
    """outs/refs/plains: lists of (o, lse) per request; plains: the reference without the option."""
    for b, ((o, lse), (ro, rl)) in enumerate(zip(outs, refs)):
        assert_close(o, lse, ro, rl, dtype, f"{what} request {b}")
    change = max((ro - po).norm().item() / ro.norm().item() for (ro, _), (po, _) in zip(refs, plains)
                 if ro.norm().item() > 0)
    assert change > 10 * REL_TOL[dtype], f"{what}: the option barely changes the result (test not sensitive)"


def _ref_pair(q, k, v, causal, sm_scale, ref_kw):
    return ref_variant(q, k, v, causal, sm_scale, **ref_kw), ref_variant(q, k, v, causal, sm_scale)


@pytest.mark.parametrize("c", VARIANT_CASES, ids=case_id)
def test_variant(c, workspace):
    fi_kw, ref_kw = VARIANTS[c["variant"]]
    entry, dtype, d, seed = c["entry"], c["dtype"], c["head_dim"], c["seed"]
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    hkv = 2
    hq = hkv * c["group"]
    scale = 1 / math.sqrt(d)
    causal = seed % 2 == 0
    what = f"{entry} {c['variant']}"

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEV)

    outs, refs, plains = [], [], []
    if entry == "single_decode":
        q, k, v = rand(hq, d), rand(300, hkv, d), rand(300, hkv, d)
        out, lse = tessera.single_decode_with_kv_cache(q, k, v, return_lse=True, **fi_kw)
        ref, plain = _ref_pair(q[None], k, v, False, scale, ref_kw)
        outs, refs, plains = [(out, lse)], [(ref[0][0], ref[1][0])], [(plain[0][0], plain[1][0])]
    elif entry == "single_prefill":
        layout = ("NHD", "HND")[seed % 2]
        q, k, v = rand(37, hq, d), rand(300, hkv, d), rand(300, hkv, d)
        kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
        out, lse = tessera.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=layout, return_lse=True,
                                                        **fi_kw)
        ref, plain = _ref_pair(q, k, v, causal, scale, ref_kw)
        outs, refs, plains = [(out, lse)], [ref], [plain]
    elif entry in ("batch_decode", "batch_prefill_paged"):
        decode = entry == "batch_decode"
        kv_lens = [300, 1, 77, 0] if decode else [300, 17, 3, 64]
        qo_lens = [1] * len(kv_lens) if decode else [37, 1, 5, 16]
        layout, ps = ("NHD", "HND")[seed % 2], (16, 1)[rng.randrange(2)]
        cache = Paged(kv_lens, ps, hkv, d, dtype, layout, seed % 3 == 0, gen)
        # Split the long request's KV (128 tokens per chunk) in every other case: the partial
        # states of a variant are merged by their LSE. (Decode counts fixed_split_size in pages,
        # prefill in KV tokens, as FlashInfer.)
        split = {"fixed_split_size": 128 // ps if decode else 128} if seed % 4 < 2 else {}
        qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
        total = int(qo_indptr[-1])
        if decode:
            w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
            w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, **split,
                   **fi_kw)
        else:
            w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, layout)
            w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, causal=causal,
                   q_data_type=dtype, **split, **fi_kw)
        q = rand(total, hq, d)
        out, lse = poisoned(q.shape, dtype), poisoned((total, hq), torch.float32)
        w.run(q, cache.cache, out=out, lse=lse, return_lse=True)
        for b in range(len(kv_lens)):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            k, v = cache.request_kv(b)
            ref, plain = _ref_pair(q[rows], k, v, causal and not decode, scale, ref_kw)
            outs.append((out[rows], lse[rows]))
            refs.append(ref)
            plains.append(plain)
    else:
        layout = ("NHD", "HND")[seed % 2]
        qo_lens, kv_lens = [37, 1, 5, 16], [300, 17, 3, 64]
        qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
        kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        q, k, v = rand(int(qo_indptr[-1]), hq, d), rand(int(kv_indptr[-1]), hkv, d), rand(int(kv_indptr[-1]), hkv, d)
        kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
        split = {"fixed_split_size": 128} if seed % 4 < 2 else {}
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, layout)
        w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type=dtype, **split, **fi_kw)
        out, lse = poisoned(q.shape, dtype), poisoned((q.shape[0], hq), torch.float32)
        w.run(q, kk, vv, out=out, lse=lse, return_lse=True)
        for b in range(len(kv_lens)):
            qs, ks = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
            ref, plain = _ref_pair(q[qs], k[ks], v[ks], causal, scale, ref_kw)
            outs.append((out[qs], lse[qs]))
            refs.append(ref)
            plains.append(plain)
    _check_variant(outs, refs, plains, dtype, what)


def test_variant_alibi_slopes_kept_by_wrapper(workspace):
    """The wrapper keeps the ALiBi slopes its plan points to; single calls reuse one cached tensor."""
    gen = torch.Generator().manual_seed(77)
    hq, hkv, d, ps, dtype = 12, 4, 128, 16, torch.bfloat16
    cache = Paged([50, 200], ps, hkv, d, dtype, "NHD", False, gen)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype,
           pos_encoding_mode="ALIBI")
    slopes = w._alibi_slopes
    assert slopes is not None and slopes.dtype == torch.float32 and slopes.device.type == "cuda"
    assert slopes.tolist() == pytest.approx(alibi_slopes_ref(hq), rel=1e-6)
    q = torch.randn(2, hq, d, generator=gen).to(dtype).to(DEV)
    out = w.run(q, cache.cache)
    for b in range(2):
        k, v = cache.request_kv(b)
        ref_o, _ = ref_variant(q[b : b + 1], k, v, False, 1 / math.sqrt(d), alibi=True)
        assert_close(out[b], None, ref_o[0], None, dtype, f"alibi request {b}")
    # Re-planning without ALiBi releases the wrapper's reference.
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype)
    assert w._alibi_slopes is None


def test_variant_run_window_left(workspace):
    """run(window_left=...) accepts None or the plan's value (the plan fixes the variant)."""
    gen = torch.Generator().manual_seed(78)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.float16
    cache = Paged([300, 40], ps, hkv, d, dtype, "HND", True, gen)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, window_left=20, q_data_type=dtype)
    q = torch.randn(2, hq, d, generator=gen).to(dtype).to(DEV)
    for wl in (None, 20):
        out = w.run(q, cache.cache, window_left=wl)
        for b in range(2):
            k, v = cache.request_kv(b)
            ref_o, _ = ref_variant(q[b : b + 1], k, v, False, 1 / math.sqrt(d), window_left=20)
            assert_close(out[b], None, ref_o[0], None, dtype, f"window_left={wl} request {b}")
    with pytest.raises(NotImplementedError, match="window_left"):
        w.run(q, cache.cache, window_left=5)
    with pytest.raises(NotImplementedError, match="window_left"):
        w.run(q, cache.cache, window_left=-1)
    with pytest.raises(ValueError, match="window_left"):
        w.run(q, cache.cache, window_left=-4)


def test_variant_decode_cuda_graph():
    """A captured run() with ALiBi and a window replays correctly after re-planning; a plan that
    changes the variant is refused (the captured launch has it baked in)."""
    gen = torch.Generator().manual_seed(79)
    batch, hq, hkv, d, ps, dtype = 3, 8, 2, 128, 16, torch.bfloat16
    max_pages = 40
    num_pages = batch * max_pages
    k_cache = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
    v_cache = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
    owned = torch.randperm(num_pages, generator=gen).view(batch, max_pages).to(torch.int32)
    variant = {"window_left": 50, "pos_encoding_mode": "ALIBI"}

    def page_table(kv_lens):
        pages = [math.ceil(n / ps) for n in kv_lens]
        indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
        indices = torch.cat([owned[b, : pages[b]] for b in range(batch)]).to(DEV)
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        return indptr, indices, last

    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
        paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device=DEV),
        paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32, device=DEV))
    q_buf = torch.zeros(batch, hq, d, dtype=dtype, device=DEV)
    out_buf = torch.zeros(batch, hq, d, dtype=dtype, device=DEV)
    w.plan(*page_table([100, 7, 300]), hq, hkv, d, ps, q_data_type=dtype, **variant)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q_buf, (k_cache, v_cache), out=out_buf)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_buf, (k_cache, v_cache), out=out_buf)
    for kv_lens in ([100, 7, 300], [129, 1, 640]):
        indptr, indices, last = page_table(kv_lens)
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype, **variant)
        q_buf.copy_(torch.randn(batch, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        for b in range(batch):
            ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
            k = k_cache[ids].reshape(-1, hkv, d)[: kv_lens[b]]
            v = v_cache[ids].reshape(-1, hkv, d)[: kv_lens[b]]
            ref_o, _ = ref_variant(q_buf[b : b + 1], k, v, False, 1 / math.sqrt(d), window_left=50, alibi=True)
            assert_close(out_buf[b], None, ref_o[0], None, dtype, f"graph replay {kv_lens} request {b}")
    with pytest.raises(ValueError, match="variant"):
        w.plan(*page_table([100, 7, 300]), hq, hkv, d, ps, q_data_type=dtype, window_left=60,
               pos_encoding_mode="ALIBI")
    assert w._holder.builds == 1


def packbits_ref(mask):
    """bool [qo, kv] -> uint8 little bit order (flashinfer.packbits(mask.view(-1), bitorder="little"))."""
    flat = mask.flatten().tolist()
    out = [0] * ((len(flat) + 7) // 8)
    for i, bit in enumerate(flat):
        if bit:
            out[i >> 3] |= 1 << (i & 7)
    return torch.tensor(out, dtype=torch.uint8)


@pytest.mark.parametrize("how", ("bool", "packed", "causal_ignored", "window_rope", "empty_kv"))
def test_single_prefill_custom_mask(how):
    gen = torch.Generator().manual_seed(len(how))
    dtype = torch.bfloat16 if how in ("bool", "window_rope") else torch.float16
    hq, hkv, d = 8, 2, 128
    qo, kv = (37, 0) if how == "empty_kv" else (37, 300)
    q = torch.randn(qo, hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(kv, hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(kv, hkv, d, generator=gen).to(dtype).to(DEV)
    mask = torch.rand(qo, kv, generator=gen) < 0.3
    if kv:
        mask[5] = False   # a row that sees no key: o = 0, lse = -inf
        mask[6] = True
    scale = 1 / math.sqrt(d)
    kwargs, ref_kw = {}, {}
    if how == "packed":
        kwargs["packed_custom_mask"] = packbits_ref(mask).to(DEV)
    else:
        kwargs["custom_mask"] = mask.to(DEV)
    causal = how == "causal_ignored"  # FlashInfer: a custom mask replaces the causal mask
    if how == "window_rope":
        kwargs.update(window_left=64, pos_encoding_mode="ROPE_LLAMA")
        ref_kw.update(window_left=64, rope=(1.0, 1e4))
    out, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True, **kwargs)
    ref_o, ref_lse = ref_variant(q, k, v, False, scale, mask=mask, **ref_kw)
    assert_close(out, lse, ref_o, ref_lse, dtype, f"custom mask ({how})")
    if kv:
        plain_o, _ = ref_variant(q, k, v, causal, scale, **ref_kw)
        assert (ref_o - plain_o).norm() > 10 * REL_TOL[dtype] * ref_o.norm(), "the mask barely changes the result"
        assert (out[5].float() == 0).all() and torch.isneginf(lse[5]).all()


@pytest.mark.parametrize("option", ["custom_mask", "packed_custom_mask"])
def test_wrappers_check_custom_mask_sizes(option, workspace):
    """The batch wrappers take FlashInfer's flattened custom masks (tests/python/test_tree_mask.py
    checks the results); a per-request [qo_len, kv_len] shape or a short packed mask is an error."""
    value = (torch.ones(8, 40, dtype=torch.bool, device=DEV) if option == "custom_mask"
             else torch.full((39,), 255, dtype=torch.uint8, device=DEV))
    qo_indptr = torch.tensor([0, 8], dtype=torch.int32)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    with pytest.raises(ValueError, match=option):
        w.plan(qo_indptr, torch.tensor([0, 40], dtype=torch.int32), 8, 2, 128, q_data_type=torch.float16,
               **{option: value})
    p = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace)
    with pytest.raises(ValueError, match=option):
        p.plan(qo_indptr, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
               torch.tensor([8], dtype=torch.int32), 8, 2, 128, 16, q_data_type=torch.float16, **{option: value})
    g = tessera.BatchPrefillWithPagedKVCacheWrapper(
        workspace, use_cuda_graph=True, qo_indptr_buf=torch.zeros(2, dtype=torch.int32, device=DEV),
        paged_kv_indptr_buf=torch.zeros(2, dtype=torch.int32, device=DEV),
        paged_kv_indices_buf=torch.zeros(3, dtype=torch.int32, device=DEV),
        paged_kv_last_page_len_buf=torch.zeros(1, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="custom_mask_buf"):
        g.plan(qo_indptr, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
               torch.tensor([8], dtype=torch.int32), 8, 2, 128, 16, q_data_type=torch.float16,
               custom_mask=torch.ones(8 * 40, dtype=torch.bool, device=DEV))


# --- examples ------------------------------------------------------------------------------------


def test_example_decode_loop(repo_root, capsys):
    """examples/python/decode_loop.py: prefill and decode passes over every layer, its own checks of
    the cache and of every output against its torch reference pass."""
    import runpy

    example = runpy.run_path(os.path.join(repo_root, "examples", "python", "decode_loop.py"))
    status = example["main"](["--steps", "8"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("EXACT") == example["LAYERS"] and "WRONG" not in out, out
    assert out.rstrip().endswith("all results match the reference"), out


def test_flashinfer_backend_names_run_tesseras_kernels():
    """backend="fa2"/"fa3" (FlashInfer's template names) run the same kernels as "auto": the same
    bits; "fa3" off sm_90 is NotImplementedError naming the GPU."""
    q = torch.randn(37, 8, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(300, 2, 128, dtype=torch.bfloat16, device=DEV)
    v = torch.randn(300, 2, 128, dtype=torch.bfloat16, device=DEV)
    auto = tessera.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert torch.equal(tessera.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa2"), auto)
    if torch.cuda.get_device_capability(DEV)[0] == 9:
        assert torch.equal(tessera.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa3"), auto)
    else:
        with pytest.raises(NotImplementedError, match="fa3.*sm_90"):
            tessera.single_prefill_with_kv_cache(q, k, v, causal=True, backend="fa3")


def test_cuda_graph_decode_wrapper_class():
    """FlashInfer's CUDAGraphBatchDecodeWithPagedKVCacheWrapper: run() captured once replays after a
    re-plan and equals the eager wrapper."""
    gen = torch.Generator().manual_seed(77)
    batch, hq, hkv, d, ps, dtype = 3, 8, 2, 128, 16, torch.float16
    max_pages = 20
    num_pages = batch * max_pages
    k_cache = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
    v_cache = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
    owned = torch.randperm(num_pages, generator=gen).view(batch, max_pages).to(torch.int32)

    def page_table(kv_lens):
        pages = [math.ceil(n / ps) for n in kv_lens]
        indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
        indices = torch.cat([owned[b, : pages[b]] for b in range(batch)]).to(DEV)
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        return indptr, indices, last

    bufs = (torch.zeros(batch + 1, dtype=torch.int32, device=DEV), torch.zeros(num_pages, dtype=torch.int32, device=DEV),
            torch.zeros(batch, dtype=torch.int32, device=DEV))
    w = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=DEV), *bufs)
    assert w.is_cuda_graph_enabled
    eager = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=DEV))
    q = torch.randn(batch, hq, d, generator=gen).to(dtype).to(DEV)
    out = torch.zeros(batch, hq, d, dtype=dtype, device=DEV)
    w.plan(*page_table([5, 100, 300]), hq, hkv, d, ps, q_data_type=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q, (k_cache, v_cache), out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k_cache, v_cache), out=out)
    for kv_lens in ([5, 100, 300], [40, 1, 319]):
        table = page_table(kv_lens)
        w.plan(*table, hq, hkv, d, ps, q_data_type=dtype)
        out.fill_(float("nan"))
        graph.replay()
        eager.plan(*table, hq, hkv, d, ps, q_data_type=dtype)
        ref = eager.run(q, (k_cache, v_cache))
        assert_close(out, None, ref.float(), None, dtype, f"graph wrapper, kv lengths {kv_lens}")


def test_merge_states_ragged():
    """Rows merging 0, 1, 3 and 5 states against a logsumexp reference (base 2)."""
    gen = torch.Generator().manual_seed(5)
    counts = [0, 1, 3, 5]
    total, h, d = sum(counts), 4, 64
    v = torch.randn(total, h, d, generator=gen).to(DEV)
    s = (torch.randn(total, h, generator=gen) * 3).to(DEV)
    indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    v_out, s_out = tessera.merge_states_ragged(v, s, indptr)
    assert v_out.shape == (4, h, d) and s_out.shape == (4, h)
    assert (v_out[0] == 0).all() and torch.isneginf(s_out[0]).all()
    for r in range(1, 4):
        a, b = int(indptr[r]), int(indptr[r + 1])
        ref_s = torch.logsumexp(s[a:b] * LN2, dim=0) / LN2
        w = torch.exp2(s[a:b] - ref_s[None])
        ref_v = (w[..., None] * v[a:b]).sum(0)
        assert (s_out[r] - ref_s).abs().max().item() < 1e-4
        assert (v_out[r] - ref_v).abs().max().item() < 1e-4
    with pytest.raises(TypeError, match="indptr.dtype = torch.int64"):
        tessera.merge_states_ragged(v, s, indptr.long())
