"""Tree masks (speculative verification) through the batch prefill wrappers' plan/run runtime
(issue 25, item 2): FlashInfer's ``custom_mask`` / ``packed_custom_mask`` in ``plan()``.

GPU (skipped without CUDA): random token trees (depth up to 8, width up to 8) after prefixes of
0 to 3000 keys, paged (page size 16 and 1) and ragged, bool and packed masks, against an fp32
PyTorch reference over the same masks; a CUDA graph captured once and replayed after re-plans with
other trees, batch sizes and a split (``custom_mask_buf``).
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU: GPU test skipped")
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
HQ, HKV, D = 8, 2, 128


def _tree_mask(qo, kv, gen):
    """[qo, kv] bool: the prefix, and each tree token's ancestors and itself (a random tree of
    depth <= 8 and width <= 8 over the last qo positions)."""
    prefix = kv - qo
    parent = [-1] * qo
    depth = [0] * qo
    children = [0] * qo
    for i in range(1, qo):
        candidates = [p for p in range(i) if depth[p] < 7 and children[p] < 8] or [0]
        p = candidates[int(torch.randint(len(candidates), (1,), generator=gen))]
        parent[i], depth[i] = p, depth[p] + 1
        children[p] += 1
    m = torch.zeros(qo, kv, dtype=torch.bool)
    m[:, :max(prefix, 0)] = True
    for i in range(qo):
        a = i
        while a >= 0:
            if 0 <= prefix + a < kv:
                m[i, prefix + a] = True
            a = parent[a]
    return m


def _reference(q, ks, vs, masks, qo_lens):
    """fp32 attention of each request's queries over its keys under its mask."""
    outs, start = [], 0
    for k, v, m, n in zip(ks, vs, masks, qo_lens):
        qr = q[start: start + n].float()  # [n, HQ, D]
        kr = k.float().repeat_interleave(HQ // HKV, dim=1)  # [kv, HQ, D]
        vr = v.float().repeat_interleave(HQ // HKV, dim=1)
        logits = torch.einsum("nhd,khd->hnk", qr, kr) / math.sqrt(D)
        logits = logits.masked_fill(~m.to(q.device)[None], float("-inf"))
        p = torch.softmax(logits, -1).nan_to_num(0.0)
        outs.append(torch.einsum("hnk,khd->nhd", p, vr))
        start += n
    return torch.cat(outs)


def _check(out, ref, dtype, what):
    rel = (out.float() - ref).norm() / ref.norm().clamp(min=1e-30)
    assert rel <= REL_TOL[dtype], f"{what}: relative error {rel:.3e}"


def _batch(qo_lens, kv_lens, dtype, gen, dev):
    q = torch.randn(sum(qo_lens), HQ, D, generator=gen).to(dtype).to(dev)
    ks = [torch.randn(n, HKV, D, generator=gen).to(dtype).to(dev) for n in kv_lens]
    vs = [torch.randn(n, HKV, D, generator=gen).to(dtype).to(dev) for n in kv_lens]
    masks = [_tree_mask(a, b, gen) for a, b in zip(qo_lens, kv_lens)]
    qo_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(qo_lens), 0)), dtype=torch.int32)
    return q, ks, vs, masks, qo_indptr


def _paged(ks, vs, page_size, gen, dev):
    """A paged NHD cache holding ks / vs (pages in random order)."""
    pages = [(k.shape[0] + page_size - 1) // page_size for k in ks]
    total = sum(pages)
    order = torch.randperm(max(total, 1), generator=gen)[:total]
    cache = torch.zeros(max(total, 1), 2, page_size, HKV, D, dtype=ks[0].dtype, device=dev)
    indptr, at = [0], 0
    for k, v, n in zip(ks, vs, pages):
        for i in range(n):
            rows = slice(i * page_size, min((i + 1) * page_size, k.shape[0]))
            page = int(order[at + i])
            cache[page, 0, : rows.stop - rows.start] = k[rows]
            cache[page, 1, : rows.stop - rows.start] = v[rows]
        at += n
        indptr.append(at)
    last = [(k.shape[0] - 1) % page_size + 1 if k.shape[0] else 0 for k in ks]
    return (cache, order.to(torch.int32).to(dev), torch.tensor(indptr, dtype=torch.int32),
            torch.tensor(last, dtype=torch.int32))


@gpu
@pytest.mark.parametrize("page_size,packed", [(16, False), (1, True)], ids=["page16_bool", "page1_packed"])
def test_paged_tree_masks_match_reference(page_size, packed):
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(11 + page_size)
    qo_lens, kv_lens = [8, 1, 40, 5, 16], [3000, 6, 300, 1029, 16]
    q, ks, vs, masks, qo_indptr = _batch(qo_lens, kv_lens, torch.float16, gen, dev)
    cache, indices, kv_indptr, last = _paged(ks, vs, page_size, gen, dev)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    flat = torch.cat([m.flatten() for m in masks]).to(dev)
    mask_kwargs = {"custom_mask": flat}
    if packed:
        bit_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor([m.numel() for m in masks]), 0)))
        mask_kwargs = {"packed_custom_mask": tessera.segment_packbits(flat, bit_indptr.to(dev), bitorder="little")[0]}
    w.plan(qo_indptr, kv_indptr, indices, last, HQ, HKV, D, page_size, q_data_type=torch.float16, **mask_kwargs)
    out = w.run(q, cache)
    _check(out, _reference(q, ks, vs, masks, qo_lens), torch.float16, f"paged {page_size}")


@gpu
def test_ragged_tree_masks_split_and_causal():
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(5)
    qo_lens, kv_lens = [8, 64, 3], [4000, 64, 2500]
    q, ks, vs, masks, qo_indptr = _batch(qo_lens, kv_lens, torch.bfloat16, gen, dev)
    kv_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(kv_lens), 0)), dtype=torch.int32)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    flat = torch.cat([m.flatten() for m in masks]).to(dev)
    # causal=True is ignored with a custom mask (FlashInfer's rule); the tree masks are causal anyway.
    w.plan(qo_indptr, kv_indptr, HQ, HKV, D, causal=True, custom_mask=flat, q_data_type=torch.bfloat16)
    assert w.plan_info()["num_merges"] > 0, "the long requests were not split"
    out = w.run(q, torch.cat(ks), torch.cat(vs))
    _check(out, _reference(q, ks, vs, masks, qo_lens), torch.bfloat16, "ragged")


@gpu
def test_paged_tree_mask_cuda_graph_replays_after_replans():
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(3)
    page_size, max_batch, max_rows, max_pages = 16, 4, 48, 600
    bufs = {
        "qo_indptr_buf": torch.zeros(max_batch + 1, dtype=torch.int32, device=dev),
        "paged_kv_indptr_buf": torch.zeros(max_batch + 1, dtype=torch.int32, device=dev),
        "paged_kv_indices_buf": torch.zeros(max_pages, dtype=torch.int32, device=dev),
        "paged_kv_last_page_len_buf": torch.zeros(max_batch, dtype=torch.int32, device=dev),
        "custom_mask_buf": torch.zeros(1 << 16, dtype=torch.uint8, device=dev),
    }
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD",
                                                    use_cuda_graph=True, **bufs)
    q_buf = torch.zeros(max_rows, HQ, D, dtype=torch.float16, device=dev)
    cache_buf = torch.zeros(max_pages, 2, page_size, HKV, D, dtype=torch.float16, device=dev)
    out_buf = torch.zeros(max_rows, HQ, D, dtype=torch.float16, device=dev)
    graph = None
    # The first plan fixes the most query rows a later one may have (as in FlashInfer).
    rounds = [([40], [500]), ([8, 3], [2000, 40]), ([1, 16, 7, 8], [9, 4000, 100, 8])]
    for qo_lens, kv_lens in rounds:
        q, ks, vs, masks, qo_indptr = _batch(qo_lens, kv_lens, torch.float16, gen, dev)
        cache, indices, kv_indptr, last = _paged(ks, vs, page_size, gen, dev)
        q_buf[: q.shape[0]] = q
        cache_buf[: cache.shape[0]] = cache
        w.plan(qo_indptr, kv_indptr, indices, last, HQ, HKV, D, page_size, q_data_type=torch.float16,
               custom_mask=torch.cat([m.flatten() for m in masks]).to(dev))
        if graph is None:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                w.run(q_buf, cache_buf, out=out_buf)  # warm-up (JIT) outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(q_buf, cache_buf, out=out_buf)
        out_buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out_buf[: q.shape[0]], _reference(q, ks, vs, masks, qo_lens), torch.float16, f"replay {qo_lens}")
