"""Tests of the FlexAttention-compatible front end (python/tessera/flex.py, _mod_trace.py).

CPU tests: the tracer's generated code and its errors (with the user's line), the mask
combinators against FlexAttention's create_mask, and the block-set conversions against
FlexAttention's BlockMask (built on the CPU). GPU tests (skipped without CUDA): flex_attention
against torch.nn.attention.flex_attention on the same inputs (outputs and natural-log LSE within
the bf16/fp16 thresholds of tests/python/test_gpu.py) and against an fp32 reference written from
the mathematics, and create_block_mask's block sets against FlexAttention's.
"""

import math
import os
import types

import pytest

torch = pytest.importorskip("torch", reason="the flex front end takes torch tensors: pip install torch")
flex_mod = pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch has no FlexAttention")

import tessera  # noqa: E402
from tessera import _mod_trace as T  # noqa: E402
from tessera import flex as F  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU (torch.cuda.is_available() is False): GPU test skipped")


def trace(fn, is_score, captures=None):
    return T.trace_function(fn, is_score, "f", [] if captures is None else captures, 14)


@pytest.fixture
def host_captures(monkeypatch):
    """Lets CPU tensors be captured, to inspect the generated code on a machine without a GPU."""
    monkeypatch.setattr(T, "_ALLOW_HOST_CAPTURES", True)


# --- tracer --------------------------------------------------------------------------------------


def test_score_mod_source_is_single_assignment_float_code():
    src = trace(lambda score, b, h, q, kv: 30.0 * torch.tanh(score / 30.0), True).source
    assert "float f(const Params& params, float score, int batch, int h, int qo_idx, int kv_idx)" in src
    assert "const float t0 = score * 0.03333333333333333f;" in src  # by a constant: the reciprocal
    assert "const float t1 = tessera_tanh((t0));" in src
    assert "return t2;" in src
    # q_idx is FlexAttention's (0-based in the query), b the request: both from the parameters.
    assert "const int q_idx = qo_idx - params.tessera_q_offset;" in src
    assert "const int b = params.tessera_b;" in src


def test_integer_division_and_modulo_round_like_python():
    src = trace(lambda b, h, q, kv: (q // 3) == (kv % 5), False).source
    assert "tessera_floordiv(q_idx, 3)" in src and "tessera_remainder(kv_idx, 5)" in src
    # The helpers themselves: -7 // 2 == -4 and -7 % 2 == 1 in Python; C's / and % truncate.
    assert "(q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q" in src
    assert "(r != 0 && ((r < 0) != (b < 0))) ? r + b : r" in src


def test_where_logical_ops_and_type_promotion():
    src = trace(lambda b, h, q, kv: torch.where(q >= kv, (q - kv) <= 4, ~(kv > 2) | (b == h)), False).source
    assert "const bool t0 = q_idx >= kv_idx;" in src
    assert "!t" in src and "||" in src and "?" in src
    src = trace(lambda s, b, h, q, kv: s + (kv - q), True).source
    assert "(float)(t0)" in src  # int promoted to float, as torch promotes int32 + float32


def test_mask_combinators_trace_to_one_function():
    mod = F.and_masks(lambda b, h, q, kv: q >= kv, F.or_masks(lambda b, h, q, kv: kv < 4, lambda b, h, q, kv: h == 1))
    src = trace(mod, False).source
    assert "&&" in src and "||" in src


def test_captured_tensors_become_parameters_read_at_their_strides(host_captures):
    table = torch.zeros(5, 7, dtype=torch.bfloat16)
    docs = torch.zeros(9, dtype=torch.int64)
    caps = []
    src = trace(lambda s, b, h, q, kv: s + table[h, kv] * (docs[q] == docs[kv]), True, caps).source
    assert [c.name for c in caps] == ["cap0", "cap1"]  # the same tensor twice is one parameter
    assert "reinterpret_cast<const __nv_bfloat16*>(params.cap0)" in src
    assert "tessera_clamp_index(h, 5) * 7LL" in src and "tessera_clamp_index(kv_idx, 7) * 1LL" in src
    assert "reinterpret_cast<const long long*>(params.cap1)" in src
    assert caps[1].byte_view().dtype == torch.uint8 and caps[1].byte_view().numel() == 9 * 8
    # A transposed table is read through a contiguous copy, at the copy's strides.
    caps = []
    tt = table.t()
    trace(lambda s, b, h, q, kv: s + tt[kv, h], True, caps)
    assert caps[0].original is tt and caps[0].tensor.is_contiguous()


def test_partial_indexing_then_full_indexing(host_captures):
    table = torch.zeros(3, 4)
    src = trace(lambda s, b, h, q, kv: s + table[h][kv], True).source
    assert "tessera_clamp_index(h, 3) * 4LL" in src


def _line_of(fn, needle):
    import inspect

    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if needle in line:
            return start + i
    raise AssertionError(needle)


def test_python_control_flow_is_an_error_naming_the_line():
    def mod(b, h, q, kv):
        if q > kv:  # not traceable
            return q >= 0
        return kv >= 0

    with pytest.raises(tessera.ModTraceError) as e:
        trace(mod, False)
    msg = str(e.value)
    assert "Python control flow" in msg
    assert f"{__file__}:{_line_of(mod, 'if q > kv')}" in msg and "if q > kv:" in msg


def test_unsupported_torch_function_is_named():
    def mod(score, b, h, q, kv):
        return torch.cumsum(score, 0)

    with pytest.raises(tessera.ModTraceError, match=r"torch\.cumsum .*test_flex\.py:\d+: +return torch.cumsum"):
        trace(mod, True)


@pytest.mark.parametrize(
    "fn, what",
    [
        (lambda b, h, q, kv: [1, 2, 3][q] > 0, "used as a Python index"),
        (lambda b, h, q, kv: float(q) > 0, r"float\(\) of a traced value"),
        (lambda b, h, q, kv: q.sum() > 0, r"\.sum\(\)"),
        (lambda b, h, q, kv: (q > 0) and (kv > 0), "Python control flow"),
        (lambda b, h, q, kv: -(q > kv), "negation"),
        (lambda b, h, q, kv: q + 1, "returns a value of kind int, expected a boolean"),
        (lambda b, h, q, kv: q > 2**40, "integer constant"),
    ],
)
def test_untraceable_constructs(fn, what):
    with pytest.raises(tessera.ModTraceError, match=what):
        trace(fn, False)


def test_captured_tensor_errors(host_captures):
    table = torch.zeros(3, 4)
    with pytest.raises(tessera.ModTraceError, match="indexed with 1 indices, then used as a value"):
        trace(lambda s, b, h, q, kv: s + table[h], True)
    with pytest.raises(tessera.ModTraceError, match=r"shape \(3, 4\) used as a value"):
        trace(lambda s, b, h, q, kv: s + table, True)
    with pytest.raises(tessera.ModTraceError, match="3 indices into a captured tensor of 2 dimensions"):
        trace(lambda s, b, h, q, kv: s + table[h, q, kv], True)
    with pytest.raises(tessera.ModTraceError, match="floating-point value"):
        trace(lambda s, b, h, q, kv: s + table[h, s], True)
    many = [torch.zeros(2) for _ in range(15)]
    with pytest.raises(tessera.ModTraceError, match="more than 14 captured tensors"):
        trace(lambda s, b, h, q, kv: sum((t[h] for t in many), s), True)


def test_host_tensor_captures_are_rejected_for_attention():
    table = torch.zeros(3)
    with pytest.raises(tessera.ModTraceError, match="captured tensor on cpu"):
        trace(lambda s, b, h, q, kv: s + table[h], True)


def test_arity_is_checked():
    with pytest.raises(TypeError, match=r"does not take 5 positional arguments"):
        trace(lambda b, h, q, kv: q >= kv, True)


def test_signatures_follow_flexattention():
    import inspect

    def names(f):
        return list(inspect.signature(f).parameters)

    assert names(tessera.flex_attention)[:9] == names(flex_mod.flex_attention)[:9]
    assert names(tessera.create_block_mask)[:8] == names(flex_mod.create_block_mask)[:8]
    assert names(tessera.create_mask)[:6] == names(flex_mod.create_mask)[:6]


# --- masks and block sets on the CPU ---------------------------------------------------------------


def _causal(b, h, q, kv):
    return q >= kv


def _window(b, h, q, kv):
    return q - kv <= 7


def _prefix(b, h, q, kv):
    return kv < 5


@pytest.mark.parametrize(
    "mod",
    [
        tessera.and_masks(_causal, _window),
        tessera.or_masks(_prefix, _causal),
        tessera.noop_mask,
        tessera.and_masks(tessera.or_masks(_prefix, _causal), _window),
    ],
)
def test_mask_combinators_match_flexattention_on_tensors(mod):
    ours = tessera.create_mask(mod, 2, 3, 19, 23, device="cpu")
    theirs = flex_mod.create_mask(mod, 2, 3, 19, 23, device="cpu")
    assert torch.equal(ours, theirs)


def _states_of_dense(mask, qb, kb):
    """0/1/2 block states of a dense bool [B, H, Q, KV] mask with FlexAttention's padding."""
    B, H, Q, KV = mask.shape
    pad = torch.nn.functional.pad(mask, (0, (-KV) % kb, 0, (-Q) % qb))
    blocks = pad.view(B, H, pad.shape[2] // qb, qb, pad.shape[3] // kb, kb).permute(0, 1, 2, 4, 3, 5)
    s = blocks.sum(dim=(-1, -2))
    return torch.where(s == qb * kb, 2, torch.where(s > 0, 1, 0)).to(torch.int8)


@pytest.mark.parametrize("q_len, kv_len, block", [(300, 300, 128), (129, 257, 64), (100, 1000, (32, 128))])
def test_block_states_of_a_torch_block_mask(q_len, kv_len, block):
    mod = flex_mod.and_masks(_causal, lambda b, h, q, kv: (q - kv <= 150) | (h == 1))
    bm = flex_mod.create_block_mask(mod, 2, 2, q_len, kv_len, device="cpu", BLOCK_SIZE=block)
    qb, kb = (block, block) if isinstance(block, int) else block
    expected = _states_of_dense(flex_mod.create_mask(mod, 2, 2, q_len, kv_len, device="cpu"), qb, kb)
    states = F._block_states(bm)
    assert torch.equal(states, expected)
    # The ordering Tessera's BlockMask stores equals FlexAttention's.
    num, idx = F._ordered(states == 1)
    assert torch.equal(num, bm.kv_num_blocks.to(torch.int32))
    for b in range(2):
        for h in range(2):
            for r in range(num.shape[-1]):
                n = int(num[b, h, r])
                assert torch.equal(idx[b, h, r, :n], bm.kv_indices[b, h, r, :n].to(torch.int32))


def test_bsr_of_states_is_the_union_over_heads():
    states = torch.tensor(
        [[[2, 0, 1], [0, 0, 0]],   # head 0
         [[2, 1, 0], [0, 0, 2]]],  # head 1
        dtype=torch.int8)
    indptr, indices, flags = F._bsr_of_states(states)
    assert indptr.tolist() == [0, 3, 4]
    assert indices.tolist() == [0, 1, 2, 2]
    # Full only where every head's block is full: (0, 0) yes; (1, 2) is absent in head 0.
    assert flags.tolist() == [1, 0, 0, 0]


def test_kernel_states_demote_a_last_kv_block_past_the_end():
    bm = flex_mod.create_block_mask(flex_mod.noop_mask, 1, 1, 256, 200, device="cpu", BLOCK_SIZE=128)
    states = F._block_states_for_kernel(bm)
    assert states[0, 0].tolist() == [[2, 1], [2, 1]]


def test_flex_attention_argument_errors():
    q = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query is on cpu, expected a CUDA tensor"):
        tessera.flex_attention(q, q, q)
    with pytest.raises(TypeError, match=r"query.dtype = torch.float32"):
        tessera.flex_attention(q.float(), q, q)
    with pytest.raises(ValueError, match=r"query.shape = \(2, 8, 128\), expected 4 dims"):
        tessera.flex_attention(q[0], q, q)
    with pytest.raises(ValueError, match="create_block_mask: device = cpu"):
        tessera.create_block_mask(_causal, 1, 1, 8, 8, device="cpu")
    with pytest.raises(ValueError, match="Q_LEN = 0"):
        tessera.create_block_mask(_causal, 1, 1, 0, 8)


# --- GPU -------------------------------------------------------------------------------------------

DEV = torch.device("cuda") if HAS_GPU else None
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float16: 1e-3 * math.log(2), torch.bfloat16: 8e-3 * math.log(2)}  # natural log


def _reference(q, k, v, score_mod, mask, scale):
    """fp32 attention from the definition: out, natural-log lse; rows that see nothing: 0, -inf."""
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    kf = k.float().repeat_interleave(Hq // Hkv, dim=1)
    vf = v.float().repeat_interleave(Hq // Hkv, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), kf) * scale
    if score_mod is not None:
        b = torch.arange(B, device=q.device).view(B, 1, 1, 1)
        h = torch.arange(Hq, device=q.device).view(1, Hq, 1, 1)
        qi = torch.arange(L, device=q.device).view(1, 1, L, 1)
        ki = torch.arange(S, device=q.device).view(1, 1, 1, S)
        s = score_mod(s, b, h, qi, ki)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("bhqk,bhkd->bhqd", p, vf), lse


def _check(out, lse, ref_o, ref_lse, dtype, what):
    o = out.float()
    assert torch.isfinite(o).all(), f"{what}: out has NaN/inf"
    rel = ((o - ref_o).norm() / ref_o.norm()).item()
    assert rel <= REL_TOL[dtype], f"{what}: relative error {rel:.3g} > {REL_TOL[dtype]}"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{what}: lse -inf exactly where a row sees no key"
    if (~empty).any():
        d = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert d <= LSE_TOL[dtype], f"{what}: lse max abs error {d:.3g} > {LSE_TOL[dtype]}"


def _inputs(B, Hq, Hkv, L, S, E, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, L, E, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, S, E, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, S, E, device=DEV, dtype=dtype, generator=g)
    return q, k, v


def _cases():
    """(name, score_mod factory, mask_mod factory): factories take (B, H, L, S) and return mods
    that may capture device tensors."""

    def causal(B, H, L, S):
        return lambda b, h, q, kv: q + (S - L) >= kv

    def window(B, H, L, S):
        return lambda b, h, q, kv: (q + (S - L) >= kv) & (q + (S - L) - kv < 37)

    def prefix_lm(B, H, L, S):
        return tessera.or_masks(lambda b, h, q, kv: kv < 45, causal(B, H, L, S))

    def documents(B, H, L, S):
        # Per request, random document boundaries; queries are the last L positions.
        doc = torch.stack([torch.sort(torch.randint(0, 6, (S,), device=DEV))[0] for _ in range(B)]).to(torch.int32)

        def mask(b, h, q, kv):
            return (doc[b, q + (S - L)] == doc[b, kv]) & (q + (S - L) >= kv)

        return mask

    def alibi(B, H, L, S):
        slopes = torch.tensor(tessera._C.alibi_slopes(H), device=DEV)
        return lambda score, b, h, q, kv: score + slopes[h] * (kv - q - (S - L)).float()

    def softcap(B, H, L, S):
        return lambda score, b, h, q, kv: 20.0 * torch.tanh(score / 20.0)

    def relbias(B, H, L, S):
        table = torch.randn(H, L + S, device=DEV)
        return lambda score, b, h, q, kv: score + table[h, q - kv + S]

    def combined(B, H, L, S):
        return tessera.and_masks(tessera.or_masks(lambda b, h, q, kv: kv < 16, window(B, H, L, S)),
                                 lambda b, h, q, kv: (h % 2 == 0) | (kv % 3 != 1))

    return [
        ("causal", None, causal), ("window", None, window), ("prefix_lm", None, prefix_lm),
        ("documents", None, documents), ("alibi_causal", alibi, causal), ("softcap", softcap, None),
        ("relbias_causal", relbias, causal), ("and_or", softcap, combined),
    ]


CASES = _cases()
SHAPES = [  # B, Hq, Hkv, L, S, E, dtype
    (2, 4, 2, 300, 300, 128, torch.bfloat16),
    (1, 8, 1, 77, 333, 64, torch.float16),
]


@gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_hq{}_hkv{}_L{}_S{}_E{}_{}".format(*s[:6], str(s[6])[6:]))
@pytest.mark.parametrize("name, score_factory, mask_factory", CASES, ids=[c[0] for c in CASES])
def test_flex_attention_matches_torch_flex_and_reference(shape, name, score_factory, mask_factory):
    B, Hq, Hkv, L, S, E, dtype = shape
    torch.manual_seed(hash((name, shape[:6])) % 2**31)
    q, k, v = _inputs(B, Hq, Hkv, L, S, E, dtype, seed=len(name) * 7 + L)
    score_mod = score_factory(B, Hq, L, S) if score_factory else None
    mask_mod = mask_factory(B, Hq, L, S) if mask_factory else None
    bm = tessera.create_block_mask(mask_mod, B, Hq, L, S, device=DEV) if mask_mod else None
    out, lse = tessera.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=Hq != Hkv,
                                      return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, Hq, L) and lse.dtype == torch.float32
    dense = flex_mod.create_mask(mask_mod, B, Hq, L, S, device=DEV) if mask_mod else None
    ref_o, ref_lse = _reference(q, k, v, score_mod, dense, 1.0 / math.sqrt(E))
    _check(out, lse, ref_o, ref_lse, dtype, f"{name} vs fp32 reference")
    # FlexAttention itself on the same inputs (its eager implementation).
    tbm = flex_mod.create_block_mask(mask_mod, B, Hq, L, S, device=DEV) if mask_mod else None
    t_out, t_lse = flex_mod.flex_attention(q, k, v, score_mod=score_mod, block_mask=tbm, enable_gqa=Hq != Hkv,
                                           return_lse=True)
    _check(out, lse, t_out.float(), t_lse.float(), dtype, f"{name} vs torch flex_attention")
    # Tessera accepts FlexAttention's BlockMask too. Its block lists are not known to follow from
    # the mask, so a lowered mask runs the block-sparse kernel with them (Tessera's own mask runs
    # the dense kernel then): the two paths checked against the reference each.
    if tbm is not None:
        out2, lse2 = tessera.flex_attention(q, k, v, score_mod=score_mod, block_mask=tbm, enable_gqa=Hq != Hkv,
                                            return_lse=True)
        _check(out2, lse2, ref_o, ref_lse, dtype, f"{name} with torch's BlockMask vs fp32 reference")


@gpu
@pytest.mark.parametrize("name, score_factory, mask_factory", [c for c in CASES if c[2] is not None],
                         ids=[c[0] for c in CASES if c[2] is not None])
@pytest.mark.parametrize("L, S, block", [(300, 300, 128), (77, 333, 64), (1000, 1000, (128, 64))])
def test_create_block_mask_equals_flexattention(name, score_factory, mask_factory, L, S, block):
    B, H = 2, 4
    mask_mod = mask_factory(B, H, L, S)
    ours = tessera.create_block_mask(mask_mod, B, H, L, S, device=DEV, BLOCK_SIZE=block)
    theirs = flex_mod.create_block_mask(mask_mod, B, H, L, S, device=DEV, BLOCK_SIZE=block)
    assert torch.equal(F._block_states(ours), F._block_states(theirs))
    assert torch.equal(ours.kv_num_blocks, theirs.kv_num_blocks.to(torch.int32))
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks.to(torch.int32))
    assert torch.equal(ours.to_dense(), theirs.to_dense().to(torch.int32))


@gpu
def test_flex_attention_rows_without_keys_and_broadcast_block_mask():
    B, H, L, S, E = 2, 2, 130, 130, 128
    q, k, v = _inputs(B, H, H, L, S, E, torch.bfloat16, seed=5)
    mask_mod = lambda b, h, q, kv: (q >= 64) & (kv <= q)  # rows < 64 see nothing
    bm = tessera.create_block_mask(mask_mod, None, None, L, S, device=DEV)
    assert bm.shape[:2] == (1, 1)
    out, lse = tessera.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    assert (out[:, :, :64] == 0).all() and torch.isneginf(lse[:, :, :64]).all()
    ref_o, ref_lse = _reference(q, k, v, None, flex_mod.create_mask(mask_mod, B, H, L, S, device=DEV), E ** -0.5)
    _check(out, lse, ref_o, ref_lse, torch.bfloat16, "rows without keys")
    if hasattr(flex_mod, "AuxRequest"):  # FlexAttention's newer way to ask for the LSE
        out2, aux = tessera.flex_attention(q, k, v, block_mask=bm, return_aux=flex_mod.AuxRequest(lse=True))
        assert torch.equal(out2, out) and torch.equal(aux.lse, lse) and aux.max_scores is None


@gpu
def test_flex_attention_errors_on_gpu():
    q, k, v = _inputs(1, 4, 2, 16, 16, 128, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        tessera.flex_attention(q, k, v)
    bm = tessera.create_block_mask(_causal, 1, 1, 32, 32, device=DEV)
    with pytest.raises(ValueError, match=r"seq_lengths = \(32, 32\), expected \(16, 16\)"):
        tessera.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    with pytest.raises(NotImplementedError, match="head dim E = 40"):
        tessera.flex_attention(q[..., :40], k[..., :40], v[..., :40], enable_gqa=True)
    with pytest.raises(tessera.ModTraceError, match="cumsum"):
        tessera.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: torch.cumsum(s, 0), enable_gqa=True)


@gpu
def test_readme_flex_example():
    import torch  # noqa: F811 - the example's own names
    from tessera import create_block_mask, flex_attention
    q, k, v = (torch.randn(2, 16, 4096, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    window = lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= 1024)  # noqa: E731
    softcap = lambda score, b, h, q_idx, kv_idx: 30 * torch.tanh(score / 30)  # noqa: E731
    mask = create_block_mask(window, None, None, 4096, 4096)           # blocks outside the window skipped
    out = flex_attention(q, k, v, score_mod=softcap, block_mask=mask)  # [2, 16, 4096, 128]

    assert out.shape == (2, 16, 4096, 128)
    assert mask.sparsity() > 60  # 1024-key window of 4096: most blocks skipped
    # Spot-check the first request's last 256 rows against the definition.
    qs = q[:1, :, -256:]
    ref_o, _ = _reference(qs, k[:1], v[:1], lambda s, b, h, qi, kv: softcap(s, b, h, qi + 4096 - 256, kv),
                          window(0, 0, torch.arange(4096 - 256, 4096, device="cuda")[:, None],
                                 torch.arange(4096, device="cuda")[None, :]).view(1, 1, 256, 4096), 128 ** -0.5)
    rel = ((out[:1, :, -256:].float() - ref_o).norm() / ref_o.norm()).item()
    assert rel <= REL_TOL[torch.bfloat16], f"README example: relative error {rel:.3g}"


def test_small_integer_conversions_use_the_short_form():
    """Integers whose range the trace knows within 2^22 convert to float with two ALU operations;
    unknown or large ranges keep the exact cast."""
    fn = lambda s, b, h, q, kv: s + (kv - q)  # noqa: E731
    assert "tessera_i2f(t0)" in T.trace_function(fn, True, "f", [], 14, (1, 1, 4096, 4096)).source
    assert "(float)(t0)" in T.trace_function(fn, True, "f", [], 14).source
    assert "(float)(t0)" in T.trace_function(fn, True, "f", [], 14, (1, 1, 1 << 23, 1 << 23)).source
    # The helper itself is exact over its range (checked here in Python with the same bit trick).
    import struct

    def i2f(x):
        return struct.unpack("<f", struct.pack("<I", (0x4B400000 + x) & 0xFFFFFFFF))[0] - 12582912.0

    for x in (-(1 << 22), -(1 << 22) + 1, -12345, -1, 0, 1, 777, (1 << 22) - 1, 1 << 22):
        assert i2f(x) == float(x)


def _lowering(fn, heads=8, captures=None):
    return T.trace_function(fn, True, "f", [] if captures is None else captures, 14, (1, heads, 512, 512)).lowering


def test_builtin_score_mods_are_recognized(host_captures):
    """Soft-cap and ALiBi written the usual ways lower to the kernels' built-in forms; near misses
    (another constant, another index, another dtype or size of the table, an extra term) stay
    traced."""
    slopes = torch.rand(8)
    assert _lowering(lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0)) == ("soft_cap", 30.0)
    assert _lowering(lambda s, b, h, q, kv: torch.tanh(s * 0.05) * 20) == ("soft_cap", 20.0)
    assert _lowering(lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 30.0)) is None
    assert _lowering(lambda s, b, h, q, kv: -30.0 * torch.tanh(s / -30.0)) is None
    assert _lowering(lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0) + 1.0) is None
    caps = []
    assert _lowering(lambda s, b, h, q, kv: s + slopes[h] * (kv - q), captures=caps) == ("alibi", "cap0")
    assert caps[0].original is slopes
    for fn in (lambda s, b, h, q, kv: s + (kv - q) * slopes[h],
               lambda s, b, h, q, kv: slopes[h] * (kv - q - 0).float() + s,
               lambda s, b, h, q, kv: s - slopes[h] * (q - kv)):
        assert _lowering(fn) == ("alibi", "cap0")
    for fn in (lambda s, b, h, q, kv: s + slopes[h] * (q - kv),   # the opposite sign
               lambda s, b, h, q, kv: s + slopes[b] * (kv - q),   # per request
               lambda s, b, h, q, kv: s + slopes[h] * (kv - q - 3),
               lambda s, b, h, q, kv: s + 2.0 * slopes[h] * (kv - q),
               lambda s, b, h, q, kv: s + slopes[h] * (kv - q) + 1.0,
               lambda s, b, h, q, kv: s + slopes.double()[h] * (kv - q),
               lambda s, b, h, q, kv: s + slopes[h] * (kv - q) * (kv - q)):
        assert _lowering(fn) is None
    assert _lowering(lambda s, b, h, q, kv: s + slopes[h] * (kv - q), heads=4) is None  # table size != Hq
    # flex_variant (the wrappers) keeps the traced code whatever the lowering says.
    assert "tessera_tanh" in T.trace_function(lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0), True, "f", [],
                                              14, None, hook_indices=True).source


def _mask_lowering(fn):
    return T.trace_function(fn, False, "f", [], 14, (1, 8, 512, 512)).lowering


def test_builtin_masks_are_recognized():
    """Causal masks and causal sliding windows, written the usual ways, lower to the kernels'
    causal mask and window_left; other distance constraints and other masks stay traced."""
    for fn in (lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: kv <= q, lambda b, h, q, kv: q - kv >= 0,
               lambda b, h, q, kv: kv - q <= 0, lambda b, h, q, kv: q + 1 > kv, lambda b, h, q, kv: q + (7 - 7) >= kv):
        assert _mask_lowering(fn) == ("causal", -1)
    for fn, w in ((lambda b, h, q, kv: (q >= kv) & (q - kv <= 1024), 1024),
                  (lambda b, h, q, kv: (q - kv < 37) & (q >= kv), 36),
                  (lambda b, h, q, kv: torch.logical_and(kv <= q, kv >= q - 5), 5),
                  (tessera.and_masks(lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: q - kv <= 9), 9),
                  (lambda b, h, q, kv: (q >= kv) & (q - kv <= 0), 0)):
        assert _mask_lowering(fn) == ("causal", w)
    for fn in (lambda b, h, q, kv: q > kv,                          # strictly causal: distance >= 1
               lambda b, h, q, kv: q >= kv - 1,                     # distance >= -1
               lambda b, h, q, kv: q - kv <= 10,                    # a window without causal
               lambda b, h, q, kv: (q >= kv) | (kv < 4),            # prefix-LM
               lambda b, h, q, kv: (q >= kv) & (h == 0),
               lambda b, h, q, kv: 2 * q >= 2 * kv,
               lambda b, h, q, kv: (q >= kv) & (q - kv <= -1)):      # nothing visible
        assert _mask_lowering(fn) is None


def test_trace_variant_passes_lowered_mods_as_builtins(host_captures):
    slopes = torch.rand(8)
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    extents = (2, 8, 512, 512)
    v = F._trace_variant(lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0), causal, extents, True)
    assert v[:5] == ("", "", "", "", "") and float(v[6]) == 30.0 and v[7] == "" and v[8] == "-1"
    docs = torch.zeros(512, dtype=torch.int32)
    v = F._trace_variant(None, lambda b, h, q, kv: (q >= kv) & (docs[q] == docs[kv]), extents, True)
    assert v[2] == "tessera_mask_mod" and v[8] == "-2"  # a document mask stays traced
    v = F._trace_variant(None, causal, extents, False)
    assert v[2] == "tessera_mask_mod" and v[8] == "-2"  # L != S: traced
    alibi = lambda s, b, h, q, kv: s + slopes[h] * (kv - q)  # noqa: E731
    v = F._trace_variant(alibi, causal, extents, True)
    assert v[4] == "" and float(v[6]) == 0.0 and v[7] == "cap0" and v[8] == "-1"
    names, views = F._CAPTURES[v[5]]
    assert names == "cap0" and torch.equal(views[0].view(torch.float32), slopes)
    # Unequal query and key lengths: ALiBi stays traced (the kernels count query positions from S - L).
    v = F._trace_variant(alibi, causal, extents, False)
    assert v[4] == "tessera_score_mod" and v[7] == ""
    # A lowered mod without a mask leaves no user variant at all.
    v = F._trace_variant(alibi, None, extents, True)
    assert v[:5] == ("", "", "", "", "") and v[7] == "cap0"


def test_dense_kernel_only_where_the_block_lists_follow_from_the_mask(host_captures):
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    extents = (1, 8, 512, 512)
    lowered = F._trace_variant(None, causal, extents, True)
    assert lowered[8] == "-1"
    ours = types.SimpleNamespace(_lists_of=causal)  # create_block_mask's lists of this mask
    assert F._runs_dense(lowered, ours, causal)
    assert F._runs_dense(F._trace_variant(None, None, extents, True), None, None)  # no mask at all
    # Lists from elsewhere (torch's BlockMask, one built from parts, another mask's) can drop blocks.
    for bm in (types.SimpleNamespace(), types.SimpleNamespace(_lists_of=None),
               types.SimpleNamespace(_lists_of=lambda b, h, q, kv: q >= kv)):
        assert not F._runs_dense(lowered, bm, causal)
    # Traced code left: the block-sparse kernel, which runs it.
    docs = torch.zeros(512, dtype=torch.int32)
    doc_mask = lambda b, h, q, kv: (q >= kv) & (docs[q] == docs[kv])  # noqa: E731
    traced = F._trace_variant(None, doc_mask, extents, True)
    assert not F._runs_dense(traced, types.SimpleNamespace(_lists_of=doc_mask), doc_mask)
    # A mask with full blocks only is not passed to the kernels (needs_mask False); then the lists
    # are the mask, unless it is noop_mask.
    kv_prefix = lambda b, h, q, kv: kv < 256  # noqa: E731
    untraced = F._trace_variant(None, None, extents, True)
    assert not F._runs_dense(untraced, types.SimpleNamespace(_lists_of=kv_prefix), kv_prefix)
    assert F._runs_dense(untraced, types.SimpleNamespace(_lists_of=tessera.noop_mask), tessera.noop_mask)
    with pytest.raises(ValueError, match="dense = True with traced mods"):
        F.run_flex_attention(torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1, 64), [], [], [],
                             128, 128, 1.0, False, traced[0], traced[1], traced[2], traced[3], traced[4], [], "",
                             dense=True)


@gpu
def test_dense_route_plans_once_and_runs_under_graph_capture():
    """Lowered mods with Tessera's block mask run the ragged runtime: one plan per configuration,
    reused; a capture that would have to plan runs the one-shot ragged kernel instead."""
    B, H, L, E = 2, 4, 383, 128
    q, k, v = _inputs(B, H, H, L, L, E, torch.bfloat16, seed=11)
    causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
    softcap = lambda score, b, h, q_idx, kv_idx: 25.0 * torch.tanh(score / 25.0)  # noqa: E731
    bm = tessera.create_block_mask(causal, None, None, L, L, device=DEV, BLOCK_SIZE=64)
    dense_mask = flex_mod.create_mask(causal, B, H, L, L, device=DEV)
    F._DENSE_PLANS.clear()
    out, lse = tessera.flex_attention(q, k, v, score_mod=softcap, block_mask=bm, return_lse=True)
    assert len(F._DENSE_PLANS) == 1
    ref_o, ref_lse = _reference(q, k, v, softcap, dense_mask, 1.0 / math.sqrt(E))
    _check(out, lse, ref_o, ref_lse, torch.bfloat16, "dense route")
    out_again = tessera.flex_attention(q, k, v, score_mod=softcap, block_mask=bm)
    assert len(F._DENSE_PLANS) == 1 and torch.equal(out_again, out)
    # Another scale is another plan, which a capture cannot make: the one-shot kernel runs (its JIT
    # kernel compiled first, outside the capture, through single_prefill_with_kv_cache).
    tessera.single_prefill_with_kv_cache(*(t[0].transpose(0, 1).contiguous() for t in (q, k, v)),
                                         causal=True, logits_soft_cap=25.0)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = tessera.flex_attention(q, k, v, score_mod=softcap, block_mask=bm, scale=0.07, return_lse=True)
    assert len(F._DENSE_PLANS) == 1
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = _reference(q, k, v, softcap, dense_mask, 0.07)
    _check(captured[0], captured[1], ref_o, ref_lse, torch.bfloat16, "dense route under graph capture")


@gpu
def test_flex_attention_under_torch_compile():
    """A step calling flex_attention compiles as one graph (the mods traced while Dynamo traces,
    the kernels one custom op), gives the eager result, and reads captured tensors at each call."""
    import torch._dynamo

    B, H, L, E = 2, 4, 256, 128
    q, k, v = _inputs(B, H, H, L, L, E, torch.bfloat16, seed=3)
    table = torch.randn(H, 2 * L, device=DEV)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + L]

    bm = tessera.create_block_mask(causal, None, None, L, L, device=DEV)

    def step(q, k, v):
        out, lse = tessera.flex_attention(q, k, v, score_mod=bias, block_mask=bm, return_lse=True)
        return out * 2, lse

    eager = step(q, k, v)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(step, fullgraph=True)
    out, lse = compiled(q, k, v)
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    table.mul_(0.5)  # an in-place update of a captured tensor reaches the compiled step
    out2, _ = compiled(q, k, v)
    assert torch.equal(out2, step(q, k, v)[0]) and not torch.equal(out2, out)
