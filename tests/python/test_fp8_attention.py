"""FP8 attention through single_prefill_with_kv_cache: q, k and v torch.float8_e4m3fn, output
float16/bfloat16 (``o_dtype``; default bfloat16), ``scale_q`` / ``scale_k`` / ``scale_v`` as
FlashInfer's arguments (a float, or a float32 tensor of 1 or num_kv_heads elements).

CPU: the named errors before any GPU work (e5m2 q, k of another dtype, an fp8 or float32 o_dtype,
a variant option, scale_q with a 16-bit q). GPU (skipped without CUDA; on a GPU without wgmma the
call is a NotImplementedError naming sm_90a): random requests against an fp32 reference on the
dequantized inputs (codes x scales), written from the definition; o within 4e-2 relative error (P
is rounded to e4m3 for the fp8 P V), the base-2 LSE within 8e-3 (the fp8 MMAs accumulate the
logits with fewer bits than fp32), as the C++ tests bound them (docs/kernels.md, "FP8 attention").
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the functions take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
E4M3 = torch.float8_e4m3fn
LN2 = math.log(2.0)
REL_TOL, LSE_TOL = 4e-2, 8e-3


def _fp8(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=E4M3, device=device)


def test_errors_before_gpu_work():
    q, k, v = _fp8(4, 8, 128), _fp8(64, 2, 128), _fp8(64, 2, 128)
    with pytest.raises(NotImplementedError, match="q.dtype"):
        tessera.single_prefill_with_kv_cache(q.to(torch.float8_e5m2), k.to(torch.float8_e5m2),
                                             v.to(torch.float8_e5m2))
    with pytest.raises(TypeError, match="k.dtype"):
        tessera.single_prefill_with_kv_cache(q, k.to(torch.bfloat16), v)
    with pytest.raises(TypeError, match="v.dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v.to(torch.float8_e5m2))
    with pytest.raises(NotImplementedError, match="o_dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v, o_dtype=E4M3)
    with pytest.raises(NotImplementedError, match="o_dtype"):
        tessera.single_prefill_with_kv_cache(q, k, v, o_dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="FP8 attention"):
        tessera.single_prefill_with_kv_cache(q, k, v, window_left=16)
    with pytest.raises(NotImplementedError, match="FP8 attention"):
        tessera.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI")
    # A q scale needs an fp8 q.
    with pytest.raises(NotImplementedError, match="scale_q"):
        tessera.single_prefill_with_kv_cache(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16),
                                             scale_q=0.5)
    # Everything checked: the call stops at its first GPU step (CPU tensors).
    with pytest.raises(ValueError, match="cpu"):
        tessera.single_prefill_with_kv_cache(q, k, v, scale_q=0.5, scale_k=0.25, o_dtype=torch.float16)


# --- GPU -------------------------------------------------------------------------------------------

def _has_wgmma():
    return HAS_GPU and torch.cuda.get_device_capability() == (9, 0)


def _quantized(shape, scale, device):
    """(codes e4m3, what they stand for in fp32) for N(0, 1) values over `scale` (per tensor, or
    per KV head along dim 1 for a [H] tensor)."""
    x = torch.randn(*shape, device=device)
    s = scale if not isinstance(scale, torch.Tensor) else scale.view(1, -1, 1)
    codes = (x / s).to(E4M3)
    return codes, codes.float() * s


def _reference(q, k, v, causal, sm_scale):
    """fp32 q [qo, Hq, D], k, v [kv, Hkv, D] -> (o [qo, Hq, D], base-2 lse [qo, Hq])."""
    qo, hq, kv, hkv = q.shape[0], q.shape[1], k.shape[0], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if causal:
        pos_q = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
        s = s.masked_fill(torch.arange(kv, device=q.device)[None, :] > pos_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, v), (lse / LN2).transpose(0, 1).contiguous()


@gpu
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("o_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_head", [False, True])
def test_matches_reference_on_dequantized_inputs(head_dim, causal, o_dtype, per_head):
    torch.manual_seed(head_dim + 2 * causal + 4 * per_head)
    dev = "cuda"
    qo, kv, hq, hkv = 301, 517, 8, 2
    if per_head:
        sq = torch.tensor([1 / 16, 3 / 32], device=dev)
        sk = torch.tensor([3 / 64, 1 / 16], device=dev)
    else:
        sq, sk = 1 / 16, 3 / 64
    sv = 1 / 32
    # q's scale per KV head applies to the group's query heads: expand it over them for the codes.
    sq_rows = sq.repeat_interleave(hq // hkv) if per_head else sq
    q8, qf = _quantized((qo, hq, head_dim), sq_rows, dev)
    k8, kf = _quantized((kv, hkv, head_dim), sk, dev)
    v8, vf = _quantized((kv, hkv, head_dim), sv, dev)
    call = lambda: tessera.single_prefill_with_kv_cache(  # noqa: E731
        q8, k8, v8, scale_q=sq, scale_k=sk, scale_v=sv, o_dtype=o_dtype, causal=causal, return_lse=True)
    if not _has_wgmma():
        with pytest.raises(NotImplementedError, match="sm_90a"):
            call()
        return
    out, lse = call()
    torch.cuda.synchronize()
    assert out.dtype == o_dtype and out.shape == (qo, hq, head_dim)
    ref_o, ref_lse = _reference(qf, kf, vf, causal, 1.0 / math.sqrt(head_dim))
    o = out.float()
    assert torch.isfinite(o).all()
    rel = ((o - ref_o).norm() / ref_o.norm()).item()
    assert rel <= REL_TOL, f"relative error {rel:.3g} > {REL_TOL}"
    finite = ~torch.isneginf(ref_lse)
    d = (lse[finite] - ref_lse[finite]).abs().max().item()
    assert d <= LSE_TOL, f"base-2 lse max abs error {d:.3g} > {LSE_TOL}"
    empty = ~finite
    assert (o[empty] == 0).all() and torch.isneginf(lse[empty]).all()


@gpu
def test_default_output_is_bfloat16():
    if not _has_wgmma():
        pytest.skip("FP8 attention runs on sm_90 only")
    q8, _ = _quantized((16, 4, 128), 1 / 16, "cuda")
    k8, _ = _quantized((40, 4, 128), 1 / 16, "cuda")
    out = tessera.single_prefill_with_kv_cache(q8, k8, k8)
    assert out.dtype == torch.bfloat16
