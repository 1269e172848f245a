"""Prefill whose v (and output) head dim differs from q's and k's: ``head_dim_vo`` in the prefill
wrappers' plan() and v of its own head dim in single_prefill_with_kv_cache (DeepSeek's
non-absorbed prefill: q/k 192 = 128 + 64 rotary, v/o 128).

CPU: the named errors before any GPU work (an unbuilt pair, fp8 K/V, a variant option). GPU
(skipped without CUDA): random requests against an fp32 reference written from the definition
(softmax(q k^T * sm_scale) v with v narrower than k; causal with the offset kv_len - qo_len;
base-2 LSE; rows without keys 0 / -inf), ragged and paged (page sizes 1 and 16, NHD and HND)
through the wrappers, a long request split over the grid, CUDA-graph replay after a re-plan, and
the run()-time shape errors. Tolerances as in test_gpu.py.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
D_QK, D_VO = 192, 128
LN2 = math.log(2.0)
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _cpu_ws():
    return torch.empty(1 << 20, dtype=torch.uint8)


def _ragged_plan(w, **overrides):
    args = dict(qo_indptr=_i32([0, 3, 4]), kv_indptr=_i32([0, 20, 37]), num_qo_heads=8, num_kv_heads=2,
                head_dim_qk=D_QK, head_dim_vo=D_VO)
    args.update(overrides)
    w.plan(**args)


def _paged_plan(w, **overrides):
    args = dict(qo_indptr=_i32([0, 3, 4]), paged_kv_indptr=_i32([0, 2, 3]), paged_kv_indices=_i32([0, 1, 2]),
                paged_kv_last_page_len=_i32([5, 16]), num_qo_heads=8, num_kv_heads=2, head_dim_qk=D_QK, page_size=16,
                head_dim_vo=D_VO)
    args.update(overrides)
    w.plan(**args)


PLANS = [(tessera.BatchPrefillWithRaggedKVCacheWrapper, _ragged_plan),
         (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan)]


def test_build_lists_the_pair():
    assert (D_QK, D_VO) in [tuple(p) for p in tessera._C.supported_prefill_split_head_dims()]


@pytest.mark.parametrize("cls,plan", PLANS, ids=["ragged", "paged"])
def test_plan_checks_split_head_dims_before_gpu_work(cls, plan):
    # The pair passes every check; the plan stops at its first GPU step (a CPU workspace).
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu"):
        plan(cls(_cpu_ws()))
    with pytest.raises(NotImplementedError, match="head_dim_vo"):
        plan(cls(_cpu_ws()), head_dim_vo=64)
    with pytest.raises(NotImplementedError, match="head_dim_vo"):
        plan(cls(_cpu_ws()), head_dim_qk=128, head_dim_vo=64)
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        plan(cls(_cpu_ws()), kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="window_left"):
        plan(cls(_cpu_ws()), window_left=32)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        plan(cls(_cpu_ws()), pos_encoding_mode="ALIBI")


# --- GPU -------------------------------------------------------------------------------------------

def _reference(q, k, v, causal, sm_scale):
    """q [qo, Hq, Dqk], k [kv, Hkv, Dqk], v [kv, Hkv, Dvo] -> (o fp32 [qo, Hq, Dvo], base-2 lse [qo, Hq])."""
    q, k, v = q.float(), k.float(), v.float()
    qo, hq = q.shape[0], q.shape[1]
    kv, hkv = k.shape[0], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        pos_q = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
        s = s.masked_fill(torch.arange(kv, device=q.device)[None, :] > pos_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, v), (lse / LN2).transpose(0, 1).contiguous()


def _assert_close(out, lse, ref_o, ref_lse, dtype, what):
    o = out.float()
    assert out.shape[-1] == D_VO, f"{what}: out has head dim {out.shape[-1]}, expected {D_VO}"
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf (unwritten or wrong)"
    ref_norm = ref_o.norm().item()
    err = (o - ref_o).norm().item()
    if ref_norm > 0:
        assert err / ref_norm <= REL_TOL[dtype], f"{what}: relative error {err / ref_norm:.3g} > {REL_TOL[dtype]}"
    empty = torch.isneginf(ref_lse)
    assert (o[empty] == 0).all(), f"{what}: rows that see no key must be 0"
    if lse is not None:
        assert torch.equal(torch.isneginf(lse), empty), f"{what}: lse = -inf exactly where a row sees no key"
        finite = ~empty
        if finite.any():
            d = (lse[finite] - ref_lse[finite]).abs().max().item()
            assert d <= LSE_TOL[dtype], f"{what}: base-2 lse max abs error {d:.3g} > {LSE_TOL[dtype]}"


class _Batch:
    """Random requests: q [total_q, Hq, 192], per-request k [kv, Hkv, 192] and v [kv, Hkv, 128]."""

    def __init__(self, qo_lens, kv_lens, hq, hkv, dtype, seed):
        gen = torch.Generator().manual_seed(seed)
        self.qo_lens, self.kv_lens, self.hq, self.hkv, self.dtype = qo_lens, kv_lens, hq, hkv, dtype
        self.q = torch.randn(sum(qo_lens), hq, D_QK, generator=gen).to(dtype).cuda()
        self.k = [torch.randn(n, hkv, D_QK, generator=gen).to(dtype).cuda() for n in kv_lens]
        self.v = [torch.randn(n, hkv, D_VO, generator=gen).to(dtype).cuda() for n in kv_lens]
        self.qo_indptr = _i32([0] + list(torch.tensor(qo_lens).cumsum(0).tolist()))

    def check(self, out, lse, causal, sm_scale, what):
        for b, (qo, lo) in enumerate(zip(self.qo_lens, self.qo_indptr.tolist())):
            ref_o, ref_lse = _reference(self.q[lo:lo + qo], self.k[b], self.v[b], causal, sm_scale)
            _assert_close(out[lo:lo + qo], None if lse is None else lse[lo:lo + qo], ref_o, ref_lse, self.dtype,
                          f"{what} request {b}")

    def paged(self, page_size, layout, gen):
        """(k_cache, v_cache) with V pages of 128 wide, shuffled page ids, and the page table."""
        pages = [(n + page_size - 1) // page_size for n in self.kv_lens]
        num_pages = sum(pages) + 2
        perm = torch.randperm(num_pages, generator=gen).tolist()
        shape = ((num_pages, page_size, self.hkv), (num_pages, self.hkv, page_size))[layout == "HND"]
        k_cache = torch.full(shape + (D_QK,), float("nan"), dtype=self.dtype, device="cuda")
        v_cache = torch.full(shape + (D_VO,), float("nan"), dtype=self.dtype, device="cuda")
        indptr, indices, last = [0], [], []
        at = 0
        for b, n in enumerate(self.kv_lens):
            for i in range(pages[b]):
                page = perm[at]
                at += 1
                indices.append(page)
                rows = slice(i * page_size, min(n, (i + 1) * page_size))
                kk, vv = self.k[b][rows], self.v[b][rows]
                if layout == "NHD":
                    k_cache[page, :kk.shape[0]] = kk
                    v_cache[page, :vv.shape[0]] = vv
                else:
                    k_cache[page, :, :kk.shape[0]] = kk.transpose(0, 1)
                    v_cache[page, :, :vv.shape[0]] = vv.transpose(0, 1)
            indptr.append(len(indices))
            last.append(n - (pages[b] - 1) * page_size if pages[b] else 0)
        return (k_cache, v_cache), _i32(indptr), _i32(indices or [0], "cuda"), _i32(last)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_prefill(dtype, causal, layout):
    gen = torch.Generator().manual_seed(7 + causal)
    qo, kv, hq, hkv = 77, 300, 8, 2
    q = torch.randn(qo, hq, D_QK, generator=gen).to(dtype).cuda()
    k = torch.randn(kv, hkv, D_QK, generator=gen).to(dtype).cuda()
    v = torch.randn(kv, hkv, D_VO, generator=gen).to(dtype).cuda()
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    out, lse = tessera.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=layout, return_lse=True)
    ref_o, ref_lse = _reference(q, k, v, causal, 1 / math.sqrt(D_QK))
    _assert_close(out, lse, ref_o, ref_lse, dtype, f"single_prefill {layout} causal={causal}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_wrapper(dtype, causal):
    batch = _Batch([1, 17, 200, 0, 64], [15, 40, 900, 9, 64], 16, 4, dtype, seed=11 + causal)
    k = torch.cat(batch.k)
    v = torch.cat(batch.v)
    kv_indptr = _i32([0] + list(torch.tensor(batch.kv_lens).cumsum(0).tolist()))
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(batch.qo_indptr, kv_indptr, batch.hq, batch.hkv, D_QK, head_dim_vo=D_VO, causal=causal, q_data_type=dtype)
    out, lse = w.run(batch.q, k, v, return_lse=True)
    batch.check(out, lse, causal, 1 / math.sqrt(D_QK), f"ragged causal={causal}")
    # v (and out) of q's head dim are run-time errors naming the tensor.
    with pytest.raises(ValueError, match="v has shape"):
        w.run(batch.q, k, torch.cat([v, v[..., :64]], dim=-1))
    with pytest.raises(ValueError, match="out has shape"):
        w.run(batch.q, k, v, out=torch.empty_like(batch.q))


@gpu
@pytest.mark.parametrize("page_size,layout", [(1, "NHD"), (16, "HND"), (16, "NHD")])
def test_paged_wrapper(page_size, layout):
    gen = torch.Generator().manual_seed(23 + page_size)
    dtype = torch.bfloat16
    # A long request (split over the grid: the merge at v's head dim) beside short ones.
    batch = _Batch([3, 1, 130, 40], [5000, 1, 700, 40], 16, 2, dtype, seed=29 + page_size)
    cache, indptr, indices, last = batch.paged(page_size, layout, gen)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"),
                                                    kv_layout=layout)
    w.plan(batch.qo_indptr, indptr, indices, last, batch.hq, batch.hkv, D_QK, page_size, head_dim_vo=D_VO,
           causal=True, q_data_type=dtype)
    out, lse = w.run(batch.q, cache, return_lse=True)
    batch.check(out, lse, True, 1 / math.sqrt(D_QK), f"paged p{page_size} {layout}")
    with pytest.raises(ValueError, match="one tensor"):
        w.run(batch.q, torch.zeros(4, 2, 16, batch.hkv, D_QK, dtype=dtype, device="cuda"))


@gpu
def test_paged_wrapper_cuda_graph_replays_after_replans():
    gen = torch.Generator().manual_seed(31)
    dtype, page_size, hq, hkv, max_batch, rows = torch.float16, 16, 8, 2, 3, 96
    first = _Batch([2, 90, 4], [20, 500, 4], hq, hkv, dtype, seed=37)  # the most pages of the plans below
    cache, indptr, indices, last = first.paged(page_size, "NHD", gen)
    num_pages = cache[0].shape[0]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    qo_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf,
                                                    paged_kv_indptr_buf=indptr_buf, paged_kv_indices_buf=indices_buf,
                                                    paged_kv_last_page_len_buf=last_buf)
    q_buf = torch.zeros(rows, hq, D_QK, dtype=dtype, device="cuda")
    out_buf = torch.zeros(rows, hq, D_VO, dtype=dtype, device="cuda")
    k_buf, v_buf = torch.zeros_like(cache[0]), torch.zeros_like(cache[1])
    plan = lambda b, ind, ip, lp: w.plan(b.qo_indptr, ip, ind, lp, hq, hkv, D_QK, page_size,  # noqa: E731
                                         head_dim_vo=D_VO, causal=True, q_data_type=dtype)
    plan(first, indices, indptr, last)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_buf, (k_buf, v_buf), out=out_buf)
    for seed, (qo_lens, kv_lens) in enumerate((([40, 10, 46], [300, 10, 80]), ([2, 90, 4], [20, 480, 4]))):
        b = _Batch(qo_lens, kv_lens, hq, hkv, dtype, seed=41 + seed)
        (kc, vc), ip, ind, lp = b.paged(page_size, "NHD", torch.Generator().manual_seed(43 + seed))
        assert kc.shape[0] <= num_pages
        plan(b, ind, ip, lp)
        k_buf[: kc.shape[0]].copy_(kc)
        v_buf[: vc.shape[0]].copy_(vc)
        q_buf[: b.q.shape[0]].copy_(b.q)
        out_buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        b.check(out_buf, None, True, 1 / math.sqrt(D_QK), f"graph replay {seed}")
