"""FlashInfer's documented wrapper usage, run with ``import tessera as flashinfer`` (issue 26).

Each test replays the call sequence of one "Example" section of FlashInfer's API reference
(docs.flashinfer.ai / the docstrings of flashinfer/decode.py, prefill.py, cascade.py, mla.py):
the same constructors, the same positional and keyword arguments in the same places, the same
index arrays, dtypes, page sizes and 128 MB workspaces, and one plan() reused by a loop over
layers. Only two things change: the import, and the number of layers (FlashInfer's examples loop
over 32; three keep the plan-once / run-per-layer pattern and run fast; MLA's batch is cut from
114 requests to 6). FlashInfer's examples only print shapes, so every output here is also
compared, request by request, with an fp32 PyTorch reference computed from the same tensors.

Tests:
- BatchDecodeWithPagedKVCacheWrapper: paged decode, GQA 64/8, page size 16, NHD.
- BatchPrefillWithPagedKVCacheWrapper: causal append over the same page table; then the
  example's second half, a custom mask equal to the causal one (``plan(..., custom_mask=mask)``).
- BatchPrefillWithRaggedKVCacheWrapper: the same two halves over ragged K/V.
- MultiLevelCascadeAttentionWrapper: two levels (a prefix shared by the batch, then each
  request's own pages); skipped while tessera has no such class.
- flashinfer.mla.BatchMLAPagedAttentionWrapper: absorbed MLA decode, page size 1 (sm_90 only,
  like Tessera's MLA kernel).

Block-sparse (BlockSparseAttentionWrapper) has its documented example in test_sparse.py.
Everything here needs a CUDA GPU and is skipped, with the reason, without one.
"""

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
HAS_SM90 = HAS_GPU and torch.cuda.get_device_capability(0) == (9, 0)
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
sm90 = pytest.mark.skipif(
    not HAS_SM90,
    reason="no sm_90 GPU: Tessera's MLA kernel (batch_mla_paged) runs only on sm_90, GPU test skipped")

# Relative error (Frobenius norm of the difference over that of the reference), per request.
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}

NUM_LAYERS = 3  # FlashInfer's examples use 32


# --- fp32 references ----------------------------------------------------------------------------


def _attention(q, k, v, causal, sm_scale):
    """Softmax attention of one request in fp32. q ``[n_q, Hq, D]``, k/v ``[n_kv, Hkv, D]`` with
    Hkv dividing Hq (query head h reads KV head h // (Hq / Hkv)); causal masks align the last query
    with the last key (query i sees keys j <= i + n_kv - n_q), as FlashInfer does."""
    n_q, hq, _ = q.shape
    n_kv, hkv, _ = k.shape
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * sm_scale
    if causal:
        rows = torch.arange(n_q, device=q.device)[:, None]
        cols = torch.arange(n_kv, device=q.device)[None, :]
        s = s.masked_fill(~(cols <= rows + (n_kv - n_q))[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vf)


def _paged_tokens(kv_cache, pages, n_tokens):
    """K and V rows ``[n_tokens, H, D]`` of one request from a 5-D NHD cache
    ``[num_pages, 2, page_size, H, D]`` whose pages are ``pages`` (in order)."""
    pages = pages.long()
    h, d = kv_cache.shape[-2:]
    k = kv_cache[pages, 0].reshape(-1, h, d)[:n_tokens]
    v = kv_cache[pages, 1].reshape(-1, h, d)[:n_tokens]
    return k, v


def _kv_lens(indptr, last_page_len, page_size):
    """Tokens per request of a page table (full pages, then last_page_len in the last one)."""
    pages = (indptr[1:] - indptr[:-1]).cpu()
    return (page_size * (pages - 1) + last_page_len.cpu()).tolist()


def _check(out, ref, dtype, segments, what):
    """out against the fp32 reference, one relative error per request (rows ``segments[b]``)."""
    assert out.dtype == dtype, f"{what}: out.dtype = {out.dtype}, expected {dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: out has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    for b, (lo, hi) in enumerate(segments):
        o, r = out[lo:hi].float(), ref[lo:hi]
        rel = ((o - r).norm() / r.norm()).item()
        assert rel <= REL_TOL[dtype], f"{what}, request {b}: relative error {rel:.3g} (NaN = non-finite output)"


def _segments(indptr):
    ip = indptr.cpu().tolist()
    return list(zip(ip[:-1], ip[1:]))


# --- BatchDecodeWithPagedKVCacheWrapper ---------------------------------------------------------


@gpu
def test_batch_decode_paged_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    num_layers = NUM_LAYERS
    num_qo_heads = 64
    num_kv_heads = 8
    head_dim = 128
    max_num_pages = 128
    page_size = 16
    # the 128 MB workspace the example allocates
    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace_buffer, "NHD")
    batch_size = 7
    kv_page_indices = torch.arange(max_num_pages).int().to("cuda:0")
    kv_page_indptr = torch.tensor([0, 17, 29, 44, 48, 66, 100, 128], dtype=torch.int32, device="cuda:0")
    kv_last_page_len = torch.tensor([1, 7, 14, 4, 3, 1, 16], dtype=torch.int32, device="cuda:0")
    kv_cache_at_layer = [
        torch.randn(max_num_pages, 2, page_size, num_kv_heads, head_dim, dtype=torch.float16, device="cuda:0")
        for _ in range(num_layers)
    ]
    # one plan for the step; every layer's run reuses it
    decode_wrapper.plan(
        kv_page_indptr,
        kv_page_indices,
        kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        data_type=torch.float16,
    )
    outputs, queries = [], []
    for i in range(num_layers):
        q = torch.randn(batch_size, num_qo_heads, head_dim).half().to("cuda:0")
        kv_cache = kv_cache_at_layer[i]
        o = decode_wrapper.run(q, kv_cache)
        outputs.append(o)
        queries.append(q)
    assert outputs[0].shape == torch.Size([7, 64, 128])

    kv_lens = _kv_lens(kv_page_indptr, kv_last_page_len, page_size)
    ip = kv_page_indptr.tolist()
    for i in range(num_layers):
        ref = torch.empty(batch_size, num_qo_heads, head_dim, device="cuda:0")
        for b in range(batch_size):
            k, v = _paged_tokens(kv_cache_at_layer[i], kv_page_indices[ip[b]:ip[b + 1]], kv_lens[b])
            ref[b:b + 1] = _attention(queries[i][b:b + 1], k, v, False, head_dim ** -0.5)
        _check(outputs[i], ref, torch.float16, [(b, b + 1) for b in range(batch_size)], f"decode layer {i}")


# --- BatchPrefillWithPagedKVCacheWrapper --------------------------------------------------------


def _paged_prefill_example(flashinfer):
    """The first half of the paged-prefill example (causal plan, a run per layer); returns what the
    checks and the custom-mask half need."""
    num_layers = NUM_LAYERS
    num_qo_heads = 64
    num_kv_heads = 16
    head_dim = 128
    max_num_pages = 128
    page_size = 16
    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace_buffer, "NHD")
    batch_size = 7
    nnz_qo = 100
    qo_indptr = torch.tensor([0, 33, 44, 55, 66, 77, 88, nnz_qo], dtype=torch.int32, device="cuda:0")
    paged_kv_indices = torch.arange(max_num_pages).int().to("cuda:0")
    paged_kv_indptr = torch.tensor([0, 17, 29, 44, 48, 66, 100, 128], dtype=torch.int32, device="cuda:0")
    paged_kv_last_page_len = torch.tensor([1, 7, 14, 4, 3, 1, 16], dtype=torch.int32, device="cuda:0")
    q_at_layer = torch.randn(num_layers, nnz_qo, num_qo_heads, head_dim).half().to("cuda:0")
    kv_cache_at_layer = torch.randn(
        num_layers, max_num_pages, 2, page_size, num_kv_heads, head_dim, dtype=torch.float16, device="cuda:0"
    )
    prefill_wrapper.plan(
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=True,
    )
    outputs = []
    for i in range(num_layers):
        q = q_at_layer[i]
        kv_cache = kv_cache_at_layer[i]
        o = prefill_wrapper.run(q, kv_cache)
        outputs.append(o)
    assert outputs[0].shape == torch.Size([100, 64, 128])
    return dict(
        wrapper=prefill_wrapper, batch_size=batch_size, page_size=page_size, head_dim=head_dim,
        qo_indptr=qo_indptr, paged_kv_indptr=paged_kv_indptr, paged_kv_indices=paged_kv_indices,
        paged_kv_last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
        q_at_layer=q_at_layer, kv_cache_at_layer=kv_cache_at_layer, outputs=outputs,
    )


def _paged_prefill_reference(ex, i):
    """fp32 causal attention of layer i of the paged-prefill example, ``[nnz_qo, Hq, D]``."""
    kv_lens = _kv_lens(ex["paged_kv_indptr"], ex["paged_kv_last_page_len"], ex["page_size"])
    ip = ex["paged_kv_indptr"].tolist()
    q = ex["q_at_layer"][i]
    ref = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, (lo, hi) in enumerate(_segments(ex["qo_indptr"])):
        k, v = _paged_tokens(ex["kv_cache_at_layer"][i], ex["paged_kv_indices"][ip[b]:ip[b + 1]], kv_lens[b])
        ref[lo:hi] = _attention(q[lo:hi], k, v, True, ex["head_dim"] ** -0.5)
    return ref


@gpu
def test_batch_prefill_paged_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    ex = _paged_prefill_example(flashinfer)
    for i in range(NUM_LAYERS):
        _check(ex["outputs"][i], _paged_prefill_reference(ex, i), torch.float16, _segments(ex["qo_indptr"]),
               f"paged prefill layer {i}")


@gpu
def test_batch_prefill_paged_documented_example_custom_mask():
    """The example's second half: plan again with a flattened boolean custom_mask (the causal
    mask, built as the docs build it) and require the outputs of the causal plan."""
    import tessera as flashinfer  # the documented usage with only the import changed

    ex = _paged_prefill_example(flashinfer)
    prefill_wrapper, page_size, batch_size = ex["wrapper"], ex["page_size"], ex["batch_size"]
    qo_indptr, paged_kv_indptr = ex["qo_indptr"], ex["paged_kv_indptr"]
    paged_kv_indices, paged_kv_last_page_len = ex["paged_kv_indices"], ex["paged_kv_last_page_len"]
    num_qo_heads, num_kv_heads, head_dim = ex["num_qo_heads"], ex["num_kv_heads"], ex["head_dim"]
    q_at_layer, kv_cache_at_layer, outputs = ex["q_at_layer"], ex["kv_cache_at_layer"], ex["outputs"]

    mask_arr = []
    qo_len = (qo_indptr[1:] - qo_indptr[:-1]).cpu().tolist()
    kv_len = (page_size * (paged_kv_indptr[1:] - paged_kv_indptr[:-1] - 1) + paged_kv_last_page_len).cpu().tolist()
    for i in range(batch_size):
        mask_i = torch.tril(
            torch.full((qo_len[i], kv_len[i]), True, device="cuda:0"),
            diagonal=(kv_len[i] - qo_len[i]),
        )
        mask_arr.append(mask_i.flatten())
    mask = torch.cat(mask_arr, dim=0)
    prefill_wrapper.plan(
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        custom_mask=mask,
    )
    for i in range(NUM_LAYERS):
        q = q_at_layer[i]
        kv_cache = kv_cache_at_layer[i]
        o_custom = prefill_wrapper.run(q, kv_cache)
        assert torch.allclose(o_custom, outputs[i], rtol=1e-3, atol=1e-3)  # the example's own assertion
        _check(o_custom, _paged_prefill_reference(ex, i), torch.float16, _segments(qo_indptr),
               f"paged prefill (custom mask) layer {i}")


# --- BatchPrefillWithRaggedKVCacheWrapper -------------------------------------------------------


def _ragged_prefill_example(flashinfer):
    """The first half of the ragged-prefill example (causal plan, a run per layer)."""
    num_layers = NUM_LAYERS
    num_qo_heads = 64
    num_kv_heads = 16
    head_dim = 128
    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    prefill_wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace_buffer, "NHD")
    batch_size = 7
    nnz_kv = 100
    nnz_qo = 100
    qo_indptr = torch.tensor([0, 33, 44, 55, 66, 77, 88, nnz_qo], dtype=torch.int32, device="cuda:0")
    kv_indptr = qo_indptr.clone()
    q_at_layer = torch.randn(num_layers, nnz_qo, num_qo_heads, head_dim).half().to("cuda:0")
    k_at_layer = torch.randn(num_layers, nnz_kv, num_kv_heads, head_dim).half().to("cuda:0")
    v_at_layer = torch.randn(num_layers, nnz_kv, num_kv_heads, head_dim).half().to("cuda:0")
    prefill_wrapper.plan(
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        causal=True,
    )
    outputs = []
    for i in range(num_layers):
        q = q_at_layer[i]
        k = k_at_layer[i]
        v = v_at_layer[i]
        o = prefill_wrapper.run(q, k, v)
        outputs.append(o)
    assert outputs[0].shape == torch.Size([100, 64, 128])
    return dict(
        wrapper=prefill_wrapper, batch_size=batch_size, head_dim=head_dim, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, q_at_layer=q_at_layer, k_at_layer=k_at_layer,
        v_at_layer=v_at_layer, outputs=outputs,
    )


def _ragged_prefill_reference(ex, i):
    q = ex["q_at_layer"][i]
    ref = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for (lo, hi), (klo, khi) in zip(_segments(ex["qo_indptr"]), _segments(ex["kv_indptr"])):
        ref[lo:hi] = _attention(q[lo:hi], ex["k_at_layer"][i][klo:khi], ex["v_at_layer"][i][klo:khi], True,
                                ex["head_dim"] ** -0.5)
    return ref


@gpu
def test_batch_prefill_ragged_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    ex = _ragged_prefill_example(flashinfer)
    for i in range(NUM_LAYERS):
        _check(ex["outputs"][i], _ragged_prefill_reference(ex, i), torch.float16, _segments(ex["qo_indptr"]),
               f"ragged prefill layer {i}")


@gpu
def test_batch_prefill_ragged_documented_example_custom_mask():
    """The example's second half: a custom_mask equal to the causal mask, same outputs."""
    import tessera as flashinfer  # the documented usage with only the import changed

    ex = _ragged_prefill_example(flashinfer)
    prefill_wrapper, batch_size = ex["wrapper"], ex["batch_size"]
    qo_indptr, kv_indptr = ex["qo_indptr"], ex["kv_indptr"]
    num_qo_heads, num_kv_heads, head_dim = ex["num_qo_heads"], ex["num_kv_heads"], ex["head_dim"]
    q_at_layer, k_at_layer, v_at_layer, outputs = ex["q_at_layer"], ex["k_at_layer"], ex["v_at_layer"], ex["outputs"]

    mask_arr = []
    qo_len = (qo_indptr[1:] - qo_indptr[:-1]).cpu().tolist()
    kv_len = (kv_indptr[1:] - kv_indptr[:-1]).cpu().tolist()
    for i in range(batch_size):
        mask_i = torch.tril(
            torch.full((qo_len[i], kv_len[i]), True, device="cuda:0"),
            diagonal=(kv_len[i] - qo_len[i]),
        )
        mask_arr.append(mask_i.flatten())
    mask = torch.cat(mask_arr, dim=0)
    prefill_wrapper.plan(
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        custom_mask=mask,
    )
    outputs_custom_mask = []
    for i in range(NUM_LAYERS):
        q = q_at_layer[i]
        k = k_at_layer[i]
        v = v_at_layer[i]
        o_custom = prefill_wrapper.run(q, k, v)
        assert torch.allclose(o_custom, outputs[i], rtol=1e-3, atol=1e-3)  # the example's own assertion
        outputs_custom_mask.append(o_custom)  # (the docs read outputs_custom_mask[0] but never append to it)
        _check(o_custom, _ragged_prefill_reference(ex, i), torch.float16, _segments(qo_indptr),
               f"ragged prefill (custom mask) layer {i}")
    assert outputs_custom_mask[0].shape == torch.Size([100, 64, 128])


# --- MultiLevelCascadeAttentionWrapper ----------------------------------------------------------


@gpu
@pytest.mark.skipif(
    not hasattr(tessera, "MultiLevelCascadeAttentionWrapper"),
    reason="tessera has no MultiLevelCascadeAttentionWrapper (FlashInfer's flashinfer.MultiLevelCascadeAttentionWrapper "
           "/ flashinfer.cascade.MultiLevelCascadeAttentionWrapper): its documented usage cannot run; "
           "tessera.cascade has only merge_state(s)")
def test_multi_level_cascade_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    num_layers = NUM_LAYERS
    num_qo_heads = 64
    num_kv_heads = 8
    head_dim = 128
    page_size = 16
    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace_buffer, "NHD")
    batch_size = 7
    shared_kv_num_pages = 512
    unique_kv_num_pages = 128
    total_num_pages = shared_kv_num_pages + unique_kv_num_pages
    shared_kv_page_indices = torch.arange(shared_kv_num_pages).int().to("cuda:0")
    shared_kv_page_indptr = torch.tensor([0, shared_kv_num_pages], dtype=torch.int32, device="cuda:0")
    unique_kv_page_indices = torch.arange(shared_kv_num_pages, total_num_pages).int().to("cuda:0")
    unique_kv_page_indptr = torch.tensor([0, 17, 29, 44, 48, 66, 100, 128], dtype=torch.int32, device="cuda:0")
    shared_kv_last_page_len = torch.tensor([page_size], dtype=torch.int32, device="cuda:0")
    unique_kv_last_page_len = torch.tensor([1, 7, 14, 4, 3, 1, 16], dtype=torch.int32, device="cuda:0")
    kv_cache_at_layer = [
        torch.randn(total_num_pages, 2, page_size, num_kv_heads, head_dim, dtype=torch.float16, device="cuda:0")
        for _ in range(num_layers)
    ]
    qo_indptr_arr = [
        torch.tensor([0, batch_size], dtype=torch.int32, device="cuda:0"),  # level 0: all 7 queries, shared prefix
        torch.arange(batch_size + 1, dtype=torch.int32, device="cuda:0"),  # level 1: one query per request
    ]
    wrapper.plan(
        qo_indptr_arr,
        [shared_kv_page_indptr, unique_kv_page_indptr],
        [shared_kv_page_indices, unique_kv_page_indices],
        [shared_kv_last_page_len, unique_kv_last_page_len],
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
    )
    outputs, queries = [], []
    for i in range(num_layers):
        q = torch.randn(batch_size, num_qo_heads, head_dim).half().to("cuda:0")
        o = wrapper.run(q, kv_cache_at_layer[i])
        outputs.append(o)
        queries.append(q)
    assert outputs[0].shape == torch.Size([7, 64, 128])

    # Reference: each request attends (not causally: one decode token) to the shared prefix
    # followed by its own pages.
    unique_lens = _kv_lens(unique_kv_page_indptr, unique_kv_last_page_len, page_size)
    shared_len = shared_kv_num_pages * page_size
    ip = unique_kv_page_indptr.tolist()
    for i in range(num_layers):
        cache = kv_cache_at_layer[i]
        k_shared, v_shared = _paged_tokens(cache, shared_kv_page_indices, shared_len)
        ref = torch.empty(batch_size, num_qo_heads, head_dim, device="cuda:0")
        for b in range(batch_size):
            k_own, v_own = _paged_tokens(cache, unique_kv_page_indices[ip[b]:ip[b + 1]], unique_lens[b])
            ref[b:b + 1] = _attention(queries[i][b:b + 1], torch.cat([k_shared, k_own]), torch.cat([v_shared, v_own]),
                                      False, head_dim ** -0.5)
        _check(outputs[i], ref, torch.float16, [(b, b + 1) for b in range(batch_size)], f"cascade layer {i}")


# --- flashinfer.mla.BatchMLAPagedAttentionWrapper ------------------------------------------------


def _mla_reference(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, kv_lens, sm_scale):
    """Absorbed MLA decode in fp32: one query row per request, page size 1; logits
    ``sm_scale * (q_nope . ckv + q_pe . kpe)``, output in latent space ``[rows, heads, 512]``."""
    ip = kv_indptr.tolist()
    ref = torch.empty(q_nope.shape, dtype=torch.float32, device=q_nope.device)
    for b in range(q_nope.shape[0]):
        rows = kv_indices[ip[b]:ip[b + 1]].long()[: int(kv_lens[b])]
        c = ckv[rows, 0].float()  # [kv_len, 512]
        r = kpe[rows, 0].float()  # [kv_len, 64]
        s = (q_nope[b].float() @ c.T + q_pe[b].float() @ r.T) * sm_scale  # [heads, kv_len]
        ref[b] = torch.softmax(s, dim=-1) @ c
    return ref


@sm90
def test_batch_mla_paged_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    num_local_heads = 128
    batch_size = 6  # 114 in the docs
    head_dim_ckv = 512
    head_dim_kpe = 64
    page_size = 1
    mla_wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(
        torch.empty(128 * 1024 * 1024, dtype=torch.int8).to(0),
        backend="fa2",
    )
    q_indptr = torch.arange(0, batch_size + 1).to(0).int()  # decode: one query per request
    kv_lens = torch.full((batch_size,), 999, dtype=torch.int32).to(0)
    kv_indptr = torch.arange(0, batch_size + 1).to(0).int() * 999
    kv_indices = torch.arange(0, batch_size * 999).to(0).int()
    q_nope = torch.randn(batch_size * 1, num_local_heads, head_dim_ckv, dtype=torch.bfloat16, device="cuda")
    q_pe = torch.zeros(batch_size * 1, num_local_heads, head_dim_kpe, dtype=torch.bfloat16, device="cuda")
    ckv = torch.randn(batch_size * 999, 1, head_dim_ckv, dtype=torch.bfloat16, device="cuda")
    kpe = torch.zeros(batch_size * 999, 1, head_dim_kpe, dtype=torch.bfloat16, device="cuda")
    sm_scale = 1.0 / ((128 + 64) ** 0.5)  # the model's head dims before absorption
    mla_wrapper.plan(
        q_indptr,
        kv_indptr,
        kv_indices,
        kv_lens,
        num_local_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        False,  # causal
        sm_scale,
        q_nope.dtype,
        ckv.dtype,
    )
    o = mla_wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=False)
    assert o.shape == torch.Size([batch_size, 128, 512])
    segments = [(b, b + 1) for b in range(batch_size)]
    _check(o, _mla_reference(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, kv_lens, sm_scale), torch.bfloat16,
           segments, "mla (documented inputs)")

    # Beyond the docs: the example's rotary parts are zeros, so they test nothing; run the same
    # plan again with random q_pe / kpe so the rotary half of the logits counts.
    q_pe.normal_()
    kpe.normal_()
    o = mla_wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=False)
    _check(o, _mla_reference(q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, kv_lens, sm_scale), torch.bfloat16,
           segments, "mla (random q_pe, kpe)")
