"""Tests of the standalone RoPE functions (python/tessera/rope.py), FlashInfer's flashinfer.rope API.

CPU (no GPU needed): FlashInfer's signatures and defaults, the package and submodule exports, and
argument errors: dtypes raise TypeError here, everything else the C++ library's ValueError naming
the argument, checked before the device (a well-formed call on host tensors fails on the device
alone).

GPU (skipped without CUDA): every function against a torch reference written from the definition
(angles in float64, the rotation in float32), on random inputs with the outputs poisoned with NaN:
ragged batches with offsets, int32 and int64 position ids, Llama 3.1 smoothing, partial rotary
dims, both pair layouts, in place and out of place, q and k as strided slices of one qkv tensor, a
cos/sin table. Tolerance per element: 2 ulp of the dtype at its magnitude (the one rounding of the
float32 result), plus the pair's norm times the float32 error of its angle and rotation, |angle| *
(4 + |log2 f|) * 2^-22 + 2^-20 (2^-22 with a table: no angle computed), the bound of
tests/gpu/rope/rope_test.cpp.
"""

import inspect
import math

import pytest

torch = pytest.importorskip("torch", reason="the functions take torch tensors: pip install torch")

import tessera  # noqa: E402
from tessera import _C  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")

NAMES = [
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]

# --- CPU: signatures, exports, errors -------------------------------------------------------------

ROPE_DEFAULTS = {"rotary_dim": None, "interleave": False, "rope_scale": 1, "rope_theta": 1e4}
LLAMA31_DEFAULTS = {"rotary_dim": None, "interleave": False, "rope_scale": 8, "rope_theta": 5e5, "low_freq_factor": 1,
                    "high_freq_factor": 4, "old_context_len": 8192}
SIGNATURES = {
    "apply_rope": (["q", "k", "indptr", "offsets"], ROPE_DEFAULTS),
    "apply_rope_pos_ids": (["q", "k", "pos_ids"], ROPE_DEFAULTS),
    "apply_llama31_rope": (["q", "k", "indptr", "offsets"], LLAMA31_DEFAULTS),
    "apply_llama31_rope_pos_ids": (["q", "k", "pos_ids"], LLAMA31_DEFAULTS),
    "apply_rope_with_cos_sin_cache": (["positions", "query", "key", "head_size", "cos_sin_cache"], {"is_neox": True}),
}


@pytest.mark.parametrize("name", NAMES)
def test_signatures_match_flashinfer(name):
    required, defaults = SIGNATURES[name.replace("_inplace", "")]
    params = inspect.signature(getattr(tessera, name)).parameters
    assert list(params) == required + list(defaults)
    for p in required:
        assert params[p].default is inspect.Parameter.empty, p
    for p, value in defaults.items():
        assert params[p].default == value and type(params[p].default) is type(value), p


def test_exported_from_the_package_and_the_submodule():
    assert tessera.rope.__all__ == NAMES
    for name in NAMES:
        assert getattr(tessera, name) is getattr(tessera.rope, name)
        assert name in tessera.__all__
    from tessera.rope import apply_rope_with_cos_sin_cache_inplace  # noqa: F401  (FlashInfer's module path)
    assert _C.DType.i64.value == 7


def _host_args(nnz=6, hq=4, hk=2, d=128, dtype=torch.bfloat16):
    q = torch.randn(nnz, hq, d).to(dtype)
    k = torch.randn(nnz, hk, d).to(dtype)
    indptr = torch.tensor([0, 2, nnz], dtype=torch.int32)
    offsets = torch.tensor([0, 5], dtype=torch.int32)
    pos_ids = torch.arange(nnz, dtype=torch.int64)
    return q, k, indptr, offsets, pos_ids


def test_dtype_errors_are_type_errors():
    q, k, indptr, offsets, pos_ids = _host_args()
    with pytest.raises(TypeError, match=r"q.dtype = torch.float32, expected torch.float16 or torch.bfloat16"):
        tessera.apply_rope(q.float(), k, indptr, offsets)
    with pytest.raises(TypeError, match=r"k.dtype = torch.float16, expected torch.bfloat16 \(the dtype of q\)"):
        tessera.apply_rope_inplace(q, k.half(), indptr, offsets)
    with pytest.raises(TypeError, match=r"indptr.dtype = torch.int64, expected torch.int32"):
        tessera.apply_llama31_rope(q, k, indptr.long(), offsets)
    with pytest.raises(TypeError, match=r"offsets.dtype = torch.float32"):
        tessera.apply_rope(q, k, indptr, offsets.float())
    with pytest.raises(TypeError, match=r"pos_ids.dtype = torch.float32, expected torch.int32 or torch.int64"):
        tessera.apply_rope_pos_ids(q, k, pos_ids.float())
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got list"):
        tessera.apply_rope_pos_ids([1.0], k, pos_ids)
    with pytest.raises(TypeError, match=r"rope_theta must be a float, got str"):
        tessera.apply_rope_pos_ids(q, k, pos_ids, rope_theta="1e4")
    with pytest.raises(TypeError, match=r"rotary_dim must be an int, got float"):
        tessera.apply_rope_pos_ids(q, k, pos_ids, rotary_dim=64.0)
    flat_q, flat_k = q.view(6, -1), k.view(6, -1)
    with pytest.raises(TypeError, match=r"cos_sin_cache.dtype = torch.bfloat16, expected torch.float32"):
        tessera.apply_rope_with_cos_sin_cache(pos_ids, flat_q, flat_k, 128, torch.zeros(64, 128).bfloat16())
    with pytest.raises(TypeError, match=r"positions.dtype = torch.float32"):
        tessera.apply_rope_with_cos_sin_cache(pos_ids.float(), flat_q, flat_k, 128, torch.zeros(64, 128))
    with pytest.raises(TypeError, match=r"head_size must be an int, got float"):
        tessera.apply_rope_with_cos_sin_cache(pos_ids, flat_q, flat_k, 128.0, torch.zeros(64, 128))


@pytest.mark.parametrize("call, message", [
    (lambda a: tessera.apply_rope(*a[:4], rotary_dim=63),
     r"rotary_dim = 63, expected an even value in \[2, 128\] \(head_dim: q.shape\[2\] = 128\)"),
    (lambda a: tessera.apply_rope_inplace(*a[:4], rotary_dim=130), r"rotary_dim = 130, expected an even value"),
    (lambda a: tessera.apply_rope(*a[:4], rotary_dim=0), r"rotary_dim = 0, expected an even value >= 2"),
    (lambda a: tessera.apply_rope(*a[:4], rope_scale=0.0), r"rope_scale = 0, expected a finite value > 0"),
    (lambda a: tessera.apply_rope_pos_ids(a[0], a[1], a[4], rope_theta=-1), r"rope_theta = -1, expected a finite"),
    (lambda a: tessera.apply_rope_pos_ids(a[0], a[1], a[4], rope_theta=math.nan), r"rope_theta = nan"),
    (lambda a: tessera.apply_llama31_rope(*a[:4], high_freq_factor=0.5),
     r"high_freq_factor = 0.5, expected a finite value > low_freq_factor = 1"),
    (lambda a: tessera.apply_llama31_rope_pos_ids(a[0], a[1], a[4], old_context_len=0),
     r"old_context_len = 0, expected a finite value > 0"),
    (lambda a: tessera.apply_rope(a[0], a[1], a[2], a[3][:1]),
     r"offsets.shape\[0\] = 1, expected 2 \(batch_size = indptr.shape\[0\] - 1\)"),
    (lambda a: tessera.apply_rope_pos_ids(a[0], a[1], a[4][:5]), r"pos_ids.shape\[0\] = 5, expected 6"),
    (lambda a: tessera.apply_rope_pos_ids(a[0], a[1][:5], a[4]), r"k.shape\[0\] = 5, expected 6 \(nnz: q.shape\[0\]\)"),
    (lambda a: tessera.apply_rope_pos_ids(a[0], a[1][..., :64], a[4]), r"k.shape\[2\] = 64, expected 128"),
    (lambda a: tessera.apply_rope_pos_ids(a[0][0], a[1], a[4]), r"q.ndim = 2, expected 3"),
    (lambda a: tessera.apply_rope_pos_ids(a[0][..., ::2], a[1][..., ::2], a[4]), r"q.strides\[2\] = 2, expected 1"),
    (lambda a: tessera.apply_rope_with_cos_sin_cache(a[4], a[0].view(6, -1), a[1].view(6, -1), 96,
                                                     torch.zeros(64, 64)),
     r"query.shape\[1\] = 512 is not a multiple of head_size = 96"),
    (lambda a: tessera.apply_rope_with_cos_sin_cache(a[4], a[0].view(6, -1), a[1].view(6, -1), 128,
                                                     torch.zeros(64, 130)),
     r"cos_sin_cache.shape\[1\] = 130, expected an even rotary_dim in \[2, 128\] \(head_size\)"),
    (lambda a: tessera.apply_rope_with_cos_sin_cache_inplace(a[4][:3], a[0].view(6, -1), a[1].view(6, -1), 128,
                                                             torch.zeros(64, 128)),
     r"positions.shape\[0\] = 3, expected 6"),
])
def test_value_errors_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call(_host_args())


def test_well_formed_call_on_host_tensors_fails_on_the_device_only():
    q, k, indptr, offsets, pos_ids = _host_args()
    for call in (lambda: tessera.apply_rope(q, k, indptr, offsets),
                 lambda: tessera.apply_llama31_rope_pos_ids_inplace(q, k, pos_ids.int()),
                 lambda: tessera.apply_rope_with_cos_sin_cache(pos_ids, q, k, 128, torch.zeros(16, 64))):
        with pytest.raises(ValueError, match=r"^(q|query).device = cpu, expected a CUDA device") as e:
            call()
        assert e.value.status_code == _C.StatusCode.invalid_argument
        if not HAS_GPU:
            assert "no CUDA" in str(e.value)  # and why there is none


def test_cos_sin_cache_query_must_view_without_a_copy():
    _, _, _, _, pos_ids = _host_args()
    query = torch.randn(6, 128, 4).bfloat16().transpose(1, 2)  # [6, 4, 128] with a non-contiguous head dim
    with pytest.raises(ValueError, match=r"query has shape \(6, 4, 128\) and strides \(512, 1, 4\), expected a tensor"):
        tessera.apply_rope_with_cos_sin_cache_inplace(pos_ids, query, torch.randn(6, 128).bfloat16(), 128,
                                                      torch.zeros(16, 64))


# --- GPU ------------------------------------------------------------------------------------------

DTYPES = (torch.float16, torch.bfloat16)
MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
MIN_EXPONENT = {torch.float16: -14, torch.bfloat16: -126}


def frequencies(rotary_dim, rope_theta, llama31=None):
    """float64 [rotary_dim / 2]: theta^(-2i / rotary_dim), Llama 3.1-smoothed when llama31 is
    (factor, low_freq_factor, high_freq_factor, old_context_len)."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    f = rope_theta ** (-2.0 * i / rotary_dim)
    if llama31 is not None:
        factor, low, high, old = llama31
        wavelen = 2 * math.pi / f
        smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)
        f = torch.where(wavelen < old / high, f,
                        torch.where(wavelen > old / low, f / factor, (1 - smooth) * f / factor + smooth * f))
    return f


def pair_index(rotary_dim, interleave):
    """Element indices (x_i, y_i) of pair i."""
    i = torch.arange(rotary_dim // 2)
    return (2 * i, 2 * i + 1) if interleave else (i, i + rotary_dim // 2)


def ref_rope(x, cos, sin, rotary_dim, interleave, angle_error):
    """x [nnz, H, D] rotated with cos/sin [nnz, rotary_dim / 2] (float64) in float32; returns the
    result and the per-element tolerance (angle_error [nnz, rotary_dim / 2]: radians)."""
    xf = x.float().cpu()
    out = xf.clone()
    a, b = pair_index(rotary_dim, interleave)
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    xa, xb = xf[..., a], xf[..., b]
    out[..., a] = xa * c - xb * s
    out[..., b] = xb * c + xa * s
    tol = torch.zeros_like(out, dtype=torch.float64)
    norm = torch.hypot(xa.double(), xb.double())
    tol[..., a] = norm * angle_error[:, None, :]
    tol[..., b] = norm * angle_error[:, None, :]
    return out, tol


def assert_rope_close(got, ref, tol, dtype, what):
    """|got - ref| <= 2 ulp(dtype, |ref|) + tol element-wise (tol 0 outside the rotary dims:
    copies must be exact)."""
    got = got.double().cpu()
    ref = ref.double()
    mag = torch.maximum(ref.abs(), got.abs()).clamp(min=2.0 ** MIN_EXPONENT[dtype])
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - MANTISSA_BITS[dtype])
    bound = torch.where(tol > 0, 2 * ulp + tol, torch.zeros_like(tol))
    bad = ~((got - ref).abs() <= bound)  # NaN fails
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements outside tolerance, worst at "
                           f"{tuple(int(v) for v in torch.nonzero(bad)[0])}: got {got[bad][0].item()}, "
                           f"expected {ref[bad][0].item()}")


def angle_tables(positions, rotary_dim, rope_scale, rope_theta, llama31):
    """cos, sin (float64 [nnz, rotary_dim / 2]) and the float32 angle error bound of each pair."""
    f = frequencies(rotary_dim, rope_theta, llama31)
    if llama31 is None:
        f = f / rope_scale
    angle = positions.double().cpu()[:, None] * f[None, :]
    error = angle.abs() * (4 + f.log2().abs()) * 2.0 ** -22 + 2.0 ** -20
    return angle.cos(), angle.sin(), error


def poisoned_like(t):
    return torch.full_like(t, float("nan"))


def random_batch(nnz, gen):
    """indptr (some requests empty) and offsets for nnz rows, and each row's position."""
    lens = []
    while sum(lens) < nnz:
        lens.append(min(int(torch.randint(0, max(2, nnz // 3), (1,), generator=gen)), nnz - sum(lens)))
    indptr = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    offsets = torch.randint(0, 2000, (len(lens),), generator=gen, dtype=torch.int32)
    positions = torch.cat([offsets[b] + torch.arange(n) for b, n in enumerate(lens)]) if nnz else torch.zeros(0)
    return indptr, offsets, positions.long()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("llama31", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("nnz, hq, hk, d, rotary_dim", [(1, 1, 1, 64, None), (7, 3, 1, 128, 64),
                                                       (300, 32, 8, 128, None), (7, 4, 4, 256, 48)])
def test_apply_rope_indptr(dtype, interleave, llama31, inplace, nnz, hq, hk, d, rotary_dim):
    gen = torch.Generator().manual_seed(nnz * 31 + d)
    q = torch.randn(nnz, hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(nnz, hk, d, generator=gen).to(dtype).cuda()
    indptr, offsets, positions = random_batch(nnz, gen)
    rd = rotary_dim or d
    if llama31:
        kw = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0,
                  high_freq_factor=4.0, old_context_len=8192)
        cos, sin, err = angle_tables(positions, rd, 8.0, 5e5, (8.0, 1.0, 4.0, 8192.0))
    else:
        kw = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=2.0, rope_theta=1e4)
        cos, sin, err = angle_tables(positions, rd, 2.0, 1e4, None)
    q_ref, q_tol = ref_rope(q, cos, sin, rd, interleave, err)
    k_ref, k_tol = ref_rope(k, cos, sin, rd, interleave, err)
    args = (indptr.cuda(), offsets.cuda())
    if inplace:
        fn = tessera.apply_llama31_rope_inplace if llama31 else tessera.apply_rope_inplace
        assert fn(q, k, *args, **kw) is None
        q_out, k_out = q, k
    else:
        q_in, k_in = q.clone(), k.clone()
        fn = tessera.apply_llama31_rope if llama31 else tessera.apply_rope
        q_out, k_out = fn(q, k, *args, **kw)
        assert torch.equal(q, q_in) and torch.equal(k, k_in)  # inputs untouched
        assert q_out.shape == q.shape and q_out.dtype == dtype
    assert_rope_close(q_out, q_ref, q_tol, dtype, "q")
    assert_rope_close(k_out, k_ref, k_tol, dtype, "k")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("llama31", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rope_pos_ids(dtype, pos_dtype, interleave, llama31, inplace):
    gen = torch.Generator().manual_seed(7)
    nnz, hq, hk, d = 1000, 8, 2, 128
    q = torch.randn(nnz, hq, d, generator=gen).to(dtype).cuda()
    k = torch.randn(nnz, hk, d, generator=gen).to(dtype).cuda()
    positions = torch.randint(0, 4096, (nnz,), generator=gen)
    if llama31:
        cos, sin, err = angle_tables(positions, d, 8.0, 5e5, (8.0, 1.0, 4.0, 8192.0))
        fn = tessera.apply_llama31_rope_pos_ids_inplace if inplace else tessera.apply_llama31_rope_pos_ids
        kw = dict(interleave=interleave)  # FlashInfer's defaults: 8, 5e5, 1, 4, 8192
    else:
        cos, sin, err = angle_tables(positions, d, 1.0, 1e4, None)
        fn = tessera.apply_rope_pos_ids_inplace if inplace else tessera.apply_rope_pos_ids
        kw = dict(interleave=interleave)
    q_ref, q_tol = ref_rope(q, cos, sin, d, interleave, err)
    k_ref, k_tol = ref_rope(k, cos, sin, d, interleave, err)
    result = fn(q, k, positions.to(pos_dtype).cuda(), **kw)
    q_out, k_out = (q, k) if inplace else result
    assert_rope_close(q_out, q_ref, q_tol, dtype, "q")
    assert_rope_close(k_out, k_ref, k_tol, dtype, "k")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
def test_strided_qkv_slices_in_place(dtype, interleave):
    # FlashInfer's example: q and k are slices of one packed qkv projection; v must stay as it was.
    gen = torch.Generator().manual_seed(3)
    nnz, hq, hkv, d = 37, 8, 2, 128
    qkv = torch.randn(nnz, (hq + 2 * hkv) * d, generator=gen).to(dtype).cuda()
    before = qkv.clone()
    q = qkv[:, : hq * d].view(nnz, hq, d)  # views: the in-place call must write qkv
    k = qkv[:, hq * d: (hq + hkv) * d].view(nnz, hkv, d)
    indptr = torch.tensor([0, 10, 37], dtype=torch.int32, device="cuda")
    offsets = torch.tensor([10, 100], dtype=torch.int32, device="cuda")
    positions = torch.cat([10 + torch.arange(10), 100 + torch.arange(27)])
    cos, sin, err = angle_tables(positions, d, 1.0, 1e4, None)
    q_ref, q_tol = ref_rope(before[:, : hq * d].reshape(nnz, hq, d), cos, sin, d, interleave, err)
    k_ref, k_tol = ref_rope(before[:, hq * d: (hq + hkv) * d].reshape(nnz, hkv, d), cos, sin, d, interleave, err)
    tessera.apply_rope_inplace(q, k, indptr, offsets, interleave=interleave)
    assert_rope_close(q, q_ref, q_tol, dtype, "q")
    assert_rope_close(k, k_ref, k_tol, dtype, "k")
    assert torch.equal(qkv[:, (hq + hkv) * d:], before[:, (hq + hkv) * d:]), "v changed"
    # Out of place from the same strided views: new tensors, qkv untouched.
    q_rope, k_rope = tessera.apply_rope(q, k, indptr, offsets, interleave=interleave)
    assert q_rope.shape == q.shape and k_rope.shape == k.shape


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("head_size, rotary_dim, three_d", [(128, 128, False), (128, 64, True), (64, 32, False)])
def test_apply_rope_with_cos_sin_cache(dtype, is_neox, inplace, pos_dtype, head_size, rotary_dim, three_d):
    gen = torch.Generator().manual_seed(head_size + rotary_dim)
    nnz, hq, hk, max_pos = 129, 4, 1, 512
    # A vLLM-style table, cos in the first half of each row and sin in the second.
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    table = torch.cat([angles.cos(), angles.sin()], dim=-1).float()
    positions = torch.randint(0, max_pos, (nnz,), generator=gen)
    query = torch.randn(nnz, hq * head_size, generator=gen).to(dtype).cuda()
    key = torch.randn(nnz, hk * head_size, generator=gen).to(dtype).cuda()
    cos, sin = table[positions, : rotary_dim // 2].double(), table[positions, rotary_dim // 2:].double()
    no_angle_error = torch.full_like(cos, 2.0 ** -22)
    q_ref, q_tol = ref_rope(query.view(nnz, hq, head_size), cos, sin, rotary_dim, not is_neox, no_angle_error)
    k_ref, k_tol = ref_rope(key.view(nnz, hk, head_size), cos, sin, rotary_dim, not is_neox, no_angle_error)
    q_arg = query.view(nnz, hq, head_size) if three_d else query
    args = (positions.to(pos_dtype).cuda(), q_arg, key, head_size, table.cuda(), is_neox)
    if inplace:
        assert tessera.apply_rope_with_cos_sin_cache_inplace(*args) is None
        q_out, k_out = query, key
    else:
        q_out, k_out = tessera.apply_rope_with_cos_sin_cache(*args)
        assert q_out.shape == q_arg.shape and k_out.shape == key.shape
    assert_rope_close(q_out.reshape(nnz, hq, head_size), q_ref, q_tol, dtype, "query")
    assert_rope_close(k_out.reshape(nnz, hk, head_size), k_ref, k_tol, dtype, "key")


@gpu
def test_out_of_place_writes_every_element():
    # The outputs torch.empty_like allocates hold garbage; poisoning the memory they will reuse
    # makes an element the kernel skipped (e.g. a dim past rotary_dim) show up as NaN.
    q = torch.randn(5, 3, 64, device="cuda").half()
    k = torch.randn(5, 1, 64, device="cuda").half()
    pos = torch.arange(5, device="cuda")
    for _ in range(3):
        poisoned_like(torch.empty(1 << 20, device="cuda"))
        q_rope, k_rope = tessera.apply_rope_pos_ids(q, k, pos, rotary_dim=16)
        assert not q_rope.isnan().any() and not k_rope.isnan().any()
        assert torch.equal(q_rope[..., 16:], q[..., 16:]) and torch.equal(k_rope[..., 16:], k[..., 16:])


@gpu
def test_runs_on_the_current_stream():
    q = torch.randn(64, 8, 128, device="cuda").bfloat16()
    k = torch.randn(64, 2, 128, device="cuda").bfloat16()
    pos = torch.arange(64, device="cuda", dtype=torch.int32)
    expected = tessera.apply_rope_pos_ids(q, k, pos)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = tessera.apply_rope_pos_ids(q, k, pos)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
