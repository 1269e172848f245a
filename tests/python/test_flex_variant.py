"""FlexAttention-style mods in the plan/run wrappers (issue 26, item 1): ``tessera.flex_variant``
traces a ``score_mod`` / ``mask_mod`` into a ``tessera.VariantSpec`` that the paged and ragged
prefill wrappers and the decode wrapper take as ``variant=``; the runtime runs it with split KV
(its states merge by their log-sum-exp).

CPU: the traced variant's hooks and parameters, named errors. GPU (skipped without CUDA): a
document mask read from a captured tensor and an ALiBi score_mod from a captured slope table,
against an fp32 PyTorch reference, paged (page size 16 and 1) and ragged prefill with a long
request that splits, and decode.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU: GPU test skipped")
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
HQ, HKV, D = 8, 2, 128


def _mods(docs, slopes):
    """A document mask (queries see their own document, causally) and an ALiBi bias, over the
    captured tensors docs [B, max_kv] and slopes [HQ]."""

    def doc_mask(b, h, q_idx, kv_idx):
        return (docs[b, q_idx] == docs[b, kv_idx]) & (kv_idx <= q_idx)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return doc_mask, alibi


# --- CPU ---------------------------------------------------------------------------------------


def test_flex_variant_builds_the_hooks():
    # Mods without captures (a captured tensor must be on the GPU: the GPU tests cover those).
    def window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < 100)

    def bias(score, b, h, q_idx, kv_idx):
        return score + 0.5 * (kv_idx - q_idx) + h

    spec = tessera.flex_variant(score_mod=bias, mask_mod=window)
    assert isinstance(spec, tessera.VariantSpec)
    assert spec.name == "flex:window+bias" and spec.use_softmax and spec.params == {}
    assert "bool logits_mask(" in spec.source and "float logits_transform(" in spec.source
    # b and q_idx are the hooks' own request and query position (no per-call parameters).
    assert "const int b = batch;" in spec.source and "const int q_idx = qo_idx;" in spec.source
    only_mask = tessera.flex_variant(mask_mod=window, name="docs")
    assert only_mask.name == "docs" and "logits_transform" not in only_mask.source


def test_flex_variant_errors_name_the_problem():
    with pytest.raises(ValueError, match="flex_variant: score_mod and mask_mod are both None"):
        tessera.flex_variant()
    with pytest.raises(ValueError, match="flex_variant: score_mod and mask_mod are both None"):
        tessera.flex_variant(mask_mod=tessera.noop_mask)
    with pytest.raises(TypeError, match="does not take 4 positional arguments"):
        tessera.flex_variant(mask_mod=lambda b, h: b)

    def data_dependent(b, h, q_idx, kv_idx):
        if q_idx > 3:  # Python control flow on a traced value
            return kv_idx >= 0
        return kv_idx < 0

    with pytest.raises(tessera.ModTraceError):
        tessera.flex_variant(mask_mod=data_dependent)


# --- GPU ---------------------------------------------------------------------------------------


def _batch(qo_lens, kv_lens, dtype, gen, dev):
    q = torch.randn(sum(qo_lens), HQ, D, generator=gen).to(dtype).to(dev)
    ks = [torch.randn(n, HKV, D, generator=gen).to(dtype).to(dev) for n in kv_lens]
    vs = [torch.randn(n, HKV, D, generator=gen).to(dtype).to(dev) for n in kv_lens]
    # Documents: runs of 1-300 positions per request.
    docs = torch.zeros(len(kv_lens), max(kv_lens), dtype=torch.int32)
    for b, n in enumerate(kv_lens):
        j, doc = 0, 0
        while j < n:
            run = 1 + int(torch.randint(300, (1,), generator=gen))
            docs[b, j: j + run] = doc
            j, doc = j + run, doc + 1
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HQ) for h in range(HQ)], dtype=torch.float32)
    qo_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(qo_lens), 0)), dtype=torch.int32)
    return q, ks, vs, docs.to(dev), slopes.to(dev), qo_indptr


def _reference(q, ks, vs, docs, slopes, qo_lens):
    """fp32 attention of each request's queries (at positions kv - qo + i) over its keys, with the
    document mask, causal masking and the ALiBi bias."""
    outs, start = [], 0
    for b, (k, v, n) in enumerate(zip(ks, vs, qo_lens)):
        kv = k.shape[0]
        qr = q[start: start + n].float()
        kr = k.float().repeat_interleave(HQ // HKV, dim=1)
        vr = v.float().repeat_interleave(HQ // HKV, dim=1)
        pos = torch.arange(kv - n, kv, device=q.device)
        key = torch.arange(kv, device=q.device)
        logits = torch.einsum("nhd,khd->hnk", qr, kr) / math.sqrt(D)
        logits = logits + slopes[:, None, None] * (key[None, None, :] - pos[None, :, None]).float()
        visible = (docs[b, pos][:, None] == docs[b, :kv][None, :]) & (key[None, :] <= pos[:, None])
        logits = logits.masked_fill(~visible[None], float("-inf"))
        outs.append(torch.einsum("hnk,khd->nhd", torch.softmax(logits, -1).nan_to_num(0.0), vr))
        start += n
    return torch.cat(outs)


def _paged(ks, vs, page_size, gen, dev):
    pages = [(k.shape[0] + page_size - 1) // page_size for k in ks]
    total = sum(pages)
    order = torch.randperm(total, generator=gen)
    cache = torch.zeros(total, 2, page_size, HKV, D, dtype=ks[0].dtype, device=dev)
    indptr, at = [0], 0
    for k, v, n in zip(ks, vs, pages):
        for i in range(n):
            rows = slice(i * page_size, min((i + 1) * page_size, k.shape[0]))
            page = int(order[at + i])
            cache[page, 0, : rows.stop - rows.start] = k[rows]
            cache[page, 1, : rows.stop - rows.start] = v[rows]
        at += n
        indptr.append(at)
    last = [(k.shape[0] - 1) % page_size + 1 for k in ks]
    return (cache, order.to(torch.int32).to(dev), torch.tensor(indptr, dtype=torch.int32),
            torch.tensor(last, dtype=torch.int32))


def _check(out, ref, dtype, what):
    rel = (out.float() - ref).norm() / ref.norm().clamp(min=1e-30)
    assert rel <= REL_TOL[dtype], f"{what}: relative error {rel:.3e}"


@gpu
@pytest.mark.parametrize("page_size", [16, 1])
def test_paged_prefill_with_mods_matches_reference(page_size):
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(31 + page_size)
    qo_lens, kv_lens = [5, 40, 1, 17], [60, 3000, 700, 17]
    q, ks, vs, docs, slopes, qo_indptr = _batch(qo_lens, kv_lens, torch.bfloat16, gen, dev)
    cache, indices, kv_indptr, last = _paged(ks, vs, page_size, gen, dev)
    doc_mask, alibi = _mods(docs, slopes)
    spec = tessera.flex_variant(score_mod=alibi, mask_mod=doc_mask)
    assert [v.dtype for v in spec.params.values()] == [torch.uint8] * 2, "the captures, as byte views"
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    w.plan(qo_indptr, kv_indptr, indices, last, HQ, HKV, D, page_size, causal=True, q_data_type=torch.bfloat16,
           variant=spec)
    out = w.run(q, cache)
    _check(out, _reference(q, ks, vs, docs, slopes, qo_lens), torch.bfloat16, f"paged {page_size}")


@gpu
def test_ragged_prefill_with_mods_splits_and_matches_reference():
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(7)
    qo_lens, kv_lens = [3, 64], [5000, 64]
    q, ks, vs, docs, slopes, qo_indptr = _batch(qo_lens, kv_lens, torch.float16, gen, dev)
    kv_indptr = torch.tensor([0] + list(torch.cumsum(torch.tensor(kv_lens), 0)), dtype=torch.int32)
    doc_mask, alibi = _mods(docs, slopes)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    w.plan(qo_indptr, kv_indptr, HQ, HKV, D, causal=True, q_data_type=torch.float16,
           variant=tessera.flex_variant(score_mod=alibi, mask_mod=doc_mask))
    assert w.plan_info()["num_merges"] > 0, "the long request was not split"
    out = w.run(q, torch.cat(ks), torch.cat(vs))
    _check(out, _reference(q, ks, vs, docs, slopes, qo_lens), torch.float16, "ragged")


@gpu
def test_decode_with_mods_matches_reference():
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(9)
    kv_lens = [4000, 33, 600]
    q, ks, vs, docs, slopes, _ = _batch([1] * len(kv_lens), kv_lens, torch.bfloat16, gen, dev)
    cache, indices, kv_indptr, last = _paged(ks, vs, 16, gen, dev)
    doc_mask, alibi = _mods(docs, slopes)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    w.plan(kv_indptr, indices, last, HQ, HKV, D, 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           variant=tessera.flex_variant(score_mod=alibi, mask_mod=doc_mask))
    out = w.run(q, cache)
    _check(out, _reference(q, ks, vs, docs, slopes, [1] * len(kv_lens)), torch.bfloat16, "decode")
