"""Tests of BlockSparseAttentionWrapper (python/tessera/sparse.py), FlashInfer's block-sparse API.

CPU: the signature and argument errors. GPU (skipped without CUDA): random BSR layouts with odd
M, N and block shapes, GQA, causal, soft-cap and ALiBi, against an fp32 reference that expands the
BSR into a dense mask (base-2 LSE; rows that see nothing: 0 and -inf), and FlashInfer's documented
example with only the import changed.
"""

import inspect
import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
W = tessera.BlockSparseAttentionWrapper


def test_signatures_match_flashinfer():
    names = lambda f: [p for p in inspect.signature(f).parameters if p != "self"]  # noqa: E731
    assert names(W.__init__) == ["float_workspace_buffer", "backend"]
    assert names(W.plan) == ["indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads", "head_dim",
                             "mask", "packed_mask", "causal", "pos_encoding_mode", "use_fp16_qk_reduction",
                             "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", "q_data_type",
                             "kv_data_type", "o_data_type", "non_blocking"]
    assert names(W.run) == ["q", "k", "v", "scale_q", "scale_k", "scale_v", "out", "lse", "return_lse", "enable_pdl"]


def test_constructor_needs_a_cuda_workspace():
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        W([0] * 8)
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        W(torch.empty(1024, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="backend"):
        W(torch.empty(1024, dtype=torch.uint8), backend="cudnn")


# --- GPU ---------------------------------------------------------------------------------------

REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _random_bsr(mb, nb, density, gen):
    dense = torch.rand(mb, nb, generator=gen) < density
    indptr = torch.zeros(mb + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(dense.sum(1), 0)
    indices = dense.nonzero()[:, 1].to(torch.int32)
    return dense, indptr, indices


def _reference(q, k, v, dense_blocks, R, C, causal, sm_scale, soft_cap=0.0, alibi=None):
    M, hq, _ = q.shape
    N, hkv, _ = k.shape
    mask = dense_blocks.repeat_interleave(R, 0).repeat_interleave(C, 1)[:M, :N].to(q.device)
    if causal:
        mask &= torch.arange(N, device=q.device)[None, :] <= torch.arange(M, device=q.device)[:, None] + (N - M)
    kf = k.float().repeat_interleave(hq // hkv, dim=1)
    vf = v.float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) * sm_scale
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    if alibi is not None:
        pos_q = torch.arange(M, device=q.device)[:, None] + (N - M)
        s = s + alibi[:, None, None] * (torch.arange(N, device=q.device)[None, :] - pos_q)[None]
    s = s.masked_fill(~mask[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, vf), (lse / math.log(2.0)).transpose(0, 1)


CASES = [  # M, N, R, C, hq, hkv, D, dtype, density, causal, options
    (300, 1000, 16, 16, 4, 1, 128, torch.bfloat16, 0.4, False, {}),
    (577, 2049, 64, 16, 5, 5, 64, torch.float16, 0.7, True, {}),
    (17, 4100, 1, 16, 8, 2, 128, torch.bfloat16, 0.3, False, {"logits_soft_cap": 20.0}),
    (129, 129, 1, 1, 4, 4, 128, torch.float16, 0.5, True, {"pos_encoding_mode": "ALIBI"}),
    (300, 1000, 16, 16, 8, 1, 256, torch.bfloat16, 0.15, True, {}),
]


@gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}_N{}_R{}_C{}_hq{}_hkv{}_d{}".format(*c[:7]))
def test_block_sparse_wrapper_matches_reference(case):
    M, N, R, C, hq, hkv, D, dtype, density, causal, options = case
    gen = torch.Generator().manual_seed(M * 7 + N)
    dense, indptr, indices = _random_bsr(-(-M // R), -(-N // C), density, gen)
    dev = torch.device("cuda")
    q = torch.randn(M, hq, D, dtype=dtype, device=dev)
    k = torch.randn(N, hkv, D, dtype=dtype, device=dev)
    v = torch.randn(N, hkv, D, dtype=dtype, device=dev)
    w = W(torch.empty(1 << 20, dtype=torch.int8, device=dev))
    w.plan(indptr.to(dev), indices.to(dev), M, N, R, C, hq, hkv, D, causal=causal, q_data_type=dtype, **options)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((M, hq), float("nan"), device=dev)
    w.run(q, k, v, out=out, lse=lse, return_lse=True)
    alibi = tessera._utils.alibi_slopes(hq, dev) if options.get("pos_encoding_mode") == "ALIBI" else None
    ref_o, ref_lse = _reference(q, k, v, dense, R, C, causal, D ** -0.5, options.get("logits_soft_cap", 0.0), alibi)
    rel = ((out.float() - ref_o).norm() / ref_o.norm()).item()
    assert rel <= REL_TOL[dtype], f"relative error {rel:.3g}"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out[empty] == 0).all()
    d = (lse[~empty] - ref_lse[~empty]).abs().max().item()
    assert d <= LSE_TOL[dtype], f"lse error {d:.3g}"


@gpu
def test_flashinfer_documented_example():
    import tessera as flashinfer  # the documented usage with only the import changed

    num_qo_heads = 32
    num_kv_heads = 8
    head_dim = 128
    workspace_buffer = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    bsr_wrapper = flashinfer.BlockSparseAttentionWrapper(workspace_buffer)
    # sparse mask: [[0, 0, 1], [1, 0, 1], [0, 1, 1]]
    M = 3
    N = 3
    indptr = torch.tensor([0, 1, 3, 5], dtype=torch.int32, device="cuda:0")
    indices = torch.tensor([2, 0, 2, 1, 2], dtype=torch.int32, device="cuda:0")
    bsr_wrapper.plan(indptr, indices, M, N, 1, 1, num_qo_heads, num_kv_heads, head_dim)
    q = torch.randn((M, num_qo_heads, head_dim), dtype=torch.float16, device="cuda:0")
    k = torch.randn((N, num_kv_heads, head_dim), dtype=torch.float16, device="cuda:0")
    v = torch.randn((N, num_kv_heads, head_dim), dtype=torch.float16, device="cuda:0")
    o = bsr_wrapper.run(q, k, v)
    mask = torch.tensor([[0, 0, 1], [1, 0, 1], [0, 1, 1]], dtype=torch.bool, device="cuda:0")
    ref_o, _ = _reference(q, k, v, mask.cpu(), 1, 1, False, head_dim ** -0.5)
    assert ((o.float() - ref_o).norm() / ref_o.norm()).item() <= REL_TOL[torch.float16]


@gpu
def test_block_sparse_wrapper_errors():
    dev = torch.device("cuda")
    w = W(torch.empty(1024, dtype=torch.uint8, device=dev))
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    indices = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="run\\(\\) before plan\\(\\)"):
        w.run(torch.zeros(1), torch.zeros(1), torch.zeros(1))
    with pytest.raises(NotImplementedError, match="packed_mask"):
        w.plan(indptr, indices, 32, 32, 16, 16, 4, 4, 128, packed_mask=torch.ones(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="indptr has 3 entries, expected 4"):
        w.plan(indptr, indices, 48, 32, 16, 16, 4, 4, 128)
    w.plan(indptr, indices, 32, 32, 16, 16, 4, 4, 128)
    q = torch.randn(32, 4, 128, dtype=torch.float16, device=dev)
    with pytest.raises(ValueError, match=r"k has shape \(31, 4, 128\), expected \(32, 4, 128\)"):
        w.run(q, q[:31], q)
    with pytest.raises(TypeError, match="q.dtype = torch.bfloat16"):
        w.run(q.bfloat16(), q, q)
    with pytest.raises(ValueError, match=r"indices\[1\] = 5 is out of range \[0, 2\)"):
        w.plan(indptr, torch.tensor([0, 5], dtype=torch.int32), 32, 32, 16, 16, 4, 4, 128)
    with pytest.raises(ValueError, match=r"indices\[1\] = 0 does not increase"):
        w.plan(torch.tensor([0, 2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32), 16, 32, 16, 16,
               4, 4, 128)
