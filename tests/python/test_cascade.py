"""tessera.MultiLevelCascadeAttentionWrapper: shared-prefix attention in 1 to 3 levels.

CPU: the constructor's and plan()'s named errors. GPU (skipped without CUDA): random batches over
one paged cache with a random page permutation: level 0 a prefix shared by every request (lengths
0, 100, 2049), an optional middle level shared by pairs of requests, the last level each
request's own pages with 1-5 query tokens (causal on and off); against an fp32 reference that
attends each request's queries to the concatenation of its levels' keys (the shared levels fully
visible, causal within the last level). Tolerances as in test_gpu.py.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
W = tessera.MultiLevelCascadeAttentionWrapper
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}


def _i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def test_errors_name_the_argument():
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    with pytest.raises(ValueError, match="num_levels"):
        W(0, ws)
    with pytest.raises(NotImplementedError, match="use_cuda_graph"):
        W(2, ws, "NHD", True)
    with pytest.raises(TypeError, match="float_workspace_buffer.dtype"):
        W(2, torch.empty(1024, dtype=torch.float32))
    w = W(2, ws)
    one = [_i32([0, 1])]
    with pytest.raises(ValueError, match="qo_indptr_arr has 1 entries, expected a list of num_levels = 2"):
        w.plan(one, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16)
    with pytest.raises(ValueError, match="expected equal"):
        w.plan([_i32([0, 3]), _i32([0, 1, 2])], [_i32([0, 1]), _i32([0, 1, 2])], [_i32([0]), _i32([1, 2])],
               [_i32([4]), _i32([4, 4])], 8, 2, 128, 16)
    with pytest.raises(NotImplementedError, match="window_left"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, window_left=8)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        w.plan(one * 2, one * 2, one * 2, [_i32([1])] * 2, 8, 2, 128, 16, pos_encoding_mode="ALIBI")


class _Pool:
    """One paged cache ([pages, 2, page_size, Hkv, D], NHD) filled segment by segment, in a random
    page order."""

    def __init__(self, num_pages, page_size, hkv, d, dtype, gen):
        self.page_size = page_size
        self.cache = torch.randn(num_pages, 2, page_size, hkv, d, generator=gen).to(dtype).cuda()
        self.free = torch.randperm(num_pages, generator=gen).tolist()

    def segment(self, length):
        """A new KV segment of `length` tokens: (page ids, last page length, k [len, Hkv, D], v)."""
        n = (length + self.page_size - 1) // self.page_size
        pages = [self.free.pop() for _ in range(n)]
        if n:
            kv = self.cache[pages].transpose(0, 1).reshape(2, n * self.page_size, *self.cache.shape[3:])[:, :length]
        else:
            kv = self.cache.new_zeros(2, 0, *self.cache.shape[3:])
        return pages, (length - (n - 1) * self.page_size) if n else 0, kv[0].float(), kv[1].float()


def _attention(q, k, v, causal, scale):
    """q [qo, Hq, D], k/v [kv, Hkv, D] fp32, causal over the last `causal_len` keys."""
    hq = q.shape[1]
    k = k.repeat_interleave(hq // k.shape[1], dim=1)
    v = v.repeat_interleave(hq // v.shape[1], dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal is not None:  # (own_len): query i sees every shared key and own keys <= own_len - qo + i
        own = causal
        qo, kv = q.shape[0], k.shape[0]
        j = torch.arange(kv, device=q.device)[None, :] - (kv - own)
        limit = torch.arange(qo, device=q.device)[:, None] + (own - qo)
        s = s.masked_fill(j > limit, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


@gpu
@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("prefix", [0, 100, 2049])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(levels, prefix, causal):
    gen = torch.Generator().manual_seed(levels * 1000 + prefix + causal)
    dtype = torch.bfloat16 if causal else torch.float16
    hq, hkv, d, page_size, batch = 16, 4, 128, 16, 6
    pool = _Pool(400, page_size, hkv, d, dtype, gen)
    qo_lens = [int(x) for x in torch.randint(1, 6, (batch,), generator=gen)]
    own_lens = [max(qo, int(x)) for qo, x in zip(qo_lens, torch.randint(0, 300, (batch,), generator=gen))]
    qo_indptr = [0]
    for n in qo_lens:
        qo_indptr.append(qo_indptr[-1] + n)
    # Levels: groups of requests and their segment lengths.
    groups_per_level = []
    if levels >= 2:
        groups_per_level.append(([list(range(batch))], [prefix]))
    if levels == 3:
        groups_per_level.append(([[0, 1], [2, 3], [4, 5]], [37, 0, 260]))
    groups_per_level.append(([[b] for b in range(batch)], own_lens))
    plan_arrays = [[], [], [], []]
    keys = [[] for _ in range(batch)]  # per request: list of (k, v) segments in level order
    for groups, lens in groups_per_level:
        g_qo, g_kv, g_idx, g_last = [0], [0], [], []
        for members, length in zip(groups, lens):
            pages, last, k, v = pool.segment(length)
            g_qo.append(g_qo[-1] + sum(qo_lens[b] for b in members))
            g_idx += pages
            g_kv.append(len(g_idx))
            g_last.append(last)
            for b in members:
                keys[b].append((k, v))
        plan_arrays[0].append(_i32(g_qo))
        plan_arrays[1].append(_i32(g_kv))
        plan_arrays[2].append(_i32(g_idx or [0], "cuda"))
        plan_arrays[3].append(_i32(g_last))
    q = torch.randn(qo_indptr[-1], hq, d, generator=gen).to(dtype).cuda()
    w = W(levels, torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(*plan_arrays, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
    out = w.run(q, pool.cache)
    assert out.shape == q.shape and torch.isfinite(out.float()).all()
    scale = 1 / math.sqrt(d)
    for b in range(batch):
        k = torch.cat([seg[0] for seg in keys[b]])
        v = torch.cat([seg[1] for seg in keys[b]])
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        ref = _attention(q[rows], k, v, own_lens[b] if causal else None, scale)
        err = (out[rows].float() - ref).norm().item() / max(ref.norm().item(), 1e-30)
        assert err <= REL_TOL[dtype], f"levels {levels} prefix {prefix} causal {causal} request {b}: {err:.3g}"
