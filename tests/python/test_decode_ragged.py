"""tessera.batch_decode_with_ragged_kv_cache (tessera::batch_decode_ragged from Python).

CPU: the argument errors named before any GPU work. GPU (skipped without CUDA): random batches
with empty and long requests, GQA groups 1, 4 and 8 (both decode kernel families), a sliding
window with sinks, ALiBi and an fp8 e4m3 cache, against an fp32 reference written from the
definition (each request's one query against its rows of k and v; rows without keys 0 / -inf;
base-2 LSE). Tolerances as in test_gpu.py.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the functions take torch tensors: pip install torch")

import tessera  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")
LN2 = math.log(2.0)
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
f = tessera.batch_decode_with_ragged_kv_cache


def test_errors_name_the_argument():
    q = torch.zeros(3, 8, 128, dtype=torch.float16)
    k = torch.zeros(40, 2, 128, dtype=torch.float16)
    indptr = torch.tensor([0, 10, 20, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_indptr has 3 entries, expected 4"):
        f(q, k, k, indptr[:3])
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] = 40 exceeds the 30 rows of k"):
        f(q, k[:30], k[:30], indptr)
    with pytest.raises(ValueError, match="v has shape"):
        f(q, k, k[:20], indptr)
    with pytest.raises(ValueError, match="num_qo_heads = 6 is not a multiple of num_kv_heads = 4"):
        f(torch.zeros(3, 6, 128, dtype=torch.float16), torch.zeros(40, 4, 128, dtype=torch.float16),
          torch.zeros(40, 4, 128, dtype=torch.float16), indptr)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        f(q, k, k, indptr)  # every check passes; q on the CPU is the first device-side refusal


def _reference(q, k, v, indptr, sm_scale, window_left=-1, sinks=0, alibi=False):
    """q [B, Hq, D], k/v [rows, Hkv, D] -> (o fp32 [B, Hq, D], base-2 lse [B, Hq])."""
    q, k, v = q.float(), k.float(), v.float()
    batch, hq = q.shape[0], q.shape[1]
    group = hq // k.shape[1]
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], device=q.device) if alibi else None
    o = torch.zeros(batch, hq, v.shape[2], device=q.device)
    lse = torch.full((batch, hq), float("-inf"), device=q.device)
    for b in range(batch):
        lo, hi = int(indptr[b]), int(indptr[b + 1])
        n = hi - lo
        if n == 0:
            continue
        kb = k[lo:hi].repeat_interleave(group, dim=1)
        vb = v[lo:hi].repeat_interleave(group, dim=1)
        s = torch.einsum("hd,khd->hk", q[b], kb) * sm_scale
        j = torch.arange(n, device=q.device)
        if alibi:
            s = s + slopes[:, None] * (j - (n - 1))[None, :].float()
        if window_left >= 0:
            visible = (j >= n - 1 - window_left) | (j < sinks)
            s = s.masked_fill(~visible[None, :], float("-inf"))
        l = torch.logsumexp(s, dim=-1)
        o[b] = torch.einsum("hk,khd->hd", torch.exp(s - l[:, None]), vb)
        lse[b] = l / LN2
    return o, lse


def _check(out, lse, ref_o, ref_lse, dtype, what):
    o = out.float()
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf"
    err = (o - ref_o).norm().item() / max(ref_o.norm().item(), 1e-30)
    assert err <= REL_TOL[dtype], f"{what}: relative error {err:.3g}"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: -inf LSE exactly for requests without keys"
    assert (o[empty] == 0).all(), f"{what}: requests without keys give 0"
    if (~empty).any():
        d = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert d <= LSE_TOL[dtype], f"{what}: lse error {d:.3g}"


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("variant", ["none", "window_sinks", "alibi"])
def test_matches_reference(dtype, group, variant):
    gen = torch.Generator().manual_seed(100 * group + len(variant))
    lens = [0, 1, 15, 513, 2049, 7, 300]
    hkv, d = 2, 128
    hq = hkv * group
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(len(lens), hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(int(indptr[-1]) + 5, hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(int(indptr[-1]) + 5, hkv, d, generator=gen).to(dtype).cuda()
    opts = {}
    if variant == "window_sinks":
        opts = dict(window_left=40, num_sink_tokens=4)
    elif variant == "alibi":
        opts = dict(pos_encoding_mode="ALIBI")
    out, lse = f(q, k, v, indptr.cuda() if group == 4 else indptr, return_lse=True, **opts)
    ref_o, ref_lse = _reference(q, k, v, indptr, 1 / math.sqrt(d), opts.get("window_left", -1),
                                opts.get("num_sink_tokens", 0), variant == "alibi")
    _check(out, lse, ref_o, ref_lse, dtype, f"ragged decode g{group} {variant}")


@gpu
def test_fp8_cache():
    gen = torch.Generator().manual_seed(5)
    lens = [33, 0, 700]
    hkv, group, d = 2, 4, 128
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(len(lens), hkv * group, d, generator=gen).to(torch.bfloat16).cuda()
    k8 = (torch.randn(int(indptr[-1]), hkv, d, generator=gen) * 16).to(torch.float8_e4m3fn).cuda()
    v8 = (torch.randn(int(indptr[-1]), hkv, d, generator=gen) * 16).to(torch.float8_e4m3fn).cuda()
    k_scale, v_scale = 1 / 16, 1 / 32
    out, lse = f(q, k8, v8, indptr, return_lse=True, k_scale=k_scale, v_scale=v_scale)
    ref_o, ref_lse = _reference(q, k8.float() * k_scale, v8.float() * v_scale, indptr, 1 / math.sqrt(d))
    _check(out, lse, ref_o, ref_lse, torch.bfloat16, "ragged decode fp8 e4m3")
