"""GPU tests of Tessera's own options of the FlashInfer-style functions and wrappers, against a
PyTorch fp32 reference written here from the definitions, and against each other.

Covered: Llama 3.1 RoPE (pos_encoding_mode="ROPE_LLAMA31"), per-request RoPE offsets, attention
sinks with a sliding window, sigmoid attention, user variants (tessera.VariantSpec), the decode
wrapper's q_len_per_req and fast_decode_plan, and CUDA Graph replay of the wrappers with these
options. Skipped (with the reason) when torch.cuda.is_available() is False. The tolerances, the
paged cache, the NaN-poisoned outputs and the checks of empty rows come from test_gpu.py.

The reference, for query row i of a request at position p = kv_len - qo_len + i and key j:
- RoPE: q rotated at p + q_rope_offset[b] and k at j + k_rope_offset[b] ("rotate half"), angle
  (pos / pos_scale) * f_d with f_d = theta^(-2d / D); Llama 3.1 rescales f_d from its definition
  (wavelength 2 pi / f_d above old_context_len / low_freq_factor: f_d / factor; below
  old_context_len / high_freq_factor: f_d; in between the smooth blend) and divides no
  positions; the rotated operands are rounded to the dtype, as the kernels' tiles hold them;
- s = sm_scale * q.k, then a user variant's logits transform;
- visible: causal (j <= p), window (j >= p - window_left) or sink (j < num_sink_tokens), a user
  variant's mask;
- softmax: out = softmax(s) v over visible keys, base-2 LSE; sigmoid: out = sum_j
  sigmoid(s_j + bias) v_j; a user variant without softmax: out = sum_j x_j v_j.
Every case also checks that its option changes the result by far more than the tolerance.
"""

import math
import random

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False): GPU tests skipped", allow_module_level=True)

import tessera  # noqa: E402
from test_gpu import DEV, LN2, REL_TOL, Paged, alibi_slopes_ref, assert_close, poisoned  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16)
LLAMA31 = {"pos_encoding_mode": "ROPE_LLAMA31", "rope_theta": 5e5, "rope_scale": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "old_context_len": 512}  # a short context: most frequencies rescaled


@pytest.fixture(scope="module")
def workspace():
    """One 128 MiB float workspace shared by the tests (stream-ordered reuse is safe)."""
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


# --- reference -------------------------------------------------------------------------------------


def rope_frequencies(head_dim, theta, llama31=None):
    """float64 [head_dim / 2]: theta^(-2d / D), with llama31 = (factor, low_freq_factor,
    high_freq_factor, old_context_len) Llama 3.1's rescaling, from its definition."""
    d = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * d / head_dim)
    if llama31 is None:
        return freq
    factor, low, high, old = llama31
    wavelength = 2.0 * math.pi / freq
    smooth = (old / wavelength - low) / (high - low)
    blended = (1.0 - smooth) * freq / factor + smooth * freq
    return torch.where(wavelength < old / high, freq, torch.where(wavelength > old / low, freq / factor, blended))


def rotate(x, positions, freqs, pos_scale, dtype):
    """x [n, H, D] fp32 rotated ("rotate half") at integer positions [n], rounded to dtype."""
    half = x.shape[-1] // 2
    angle = (positions.to(torch.float64)[:, None] / pos_scale) * freqs.to(x.device)[None, :]
    cos, sin = angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype).float()


def rope_of(options, head_dim):
    """(frequencies, position scale) of a FlashInfer/Tessera option dict, or None without RoPE."""
    mode = options.get("pos_encoding_mode", "NONE")
    if mode == "ROPE_LLAMA":
        return rope_frequencies(head_dim, options.get("rope_theta", 1e4)), options.get("rope_scale", 1.0)
    if mode == "ROPE_LLAMA31":
        llama31 = (options.get("rope_scale", 8.0), options.get("low_freq_factor", 1.0),
                   options.get("high_freq_factor", 4.0), options.get("old_context_len", 8192))
        return rope_frequencies(head_dim, options.get("rope_theta", 5e5), llama31), 1.0
    return None


def reference(q, k, v, causal, sm_scale, options, q_offset=0, k_offset=0, batch=0, user=None):
    """One request: q [qo, Hq, D], k / v [kv, Hkv, D] (NHD), the options as passed to Tessera, the
    RoPE offsets of the request, a user variant's reference (UserRef) -> (out fp32, base-2 lse or
    None without softmax)."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    qo, hq, d = q.shape
    kv, hkv = k.shape[0], k.shape[1]
    pos_q = torch.arange(qo, device=q.device) + (kv - qo)
    pos_k = torch.arange(kv, device=q.device)
    rope = rope_of(options, d)
    if rope is not None:
        q = rotate(q, pos_q + q_offset, rope[0], rope[1], dtype)
        k = rotate(k, pos_k + k_offset, rope[0], rope[1], dtype)
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if options.get("pos_encoding_mode") == "ALIBI":
        slopes = torch.tensor(alibi_slopes_ref(hq), dtype=torch.float32, device=q.device)
        s = s + slopes[:, None, None] * (pos_k[None, None, :] - pos_q[None, :, None]).float()
    cap = options.get("logits_soft_cap") or 0.0
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    visible = torch.ones(qo, kv, dtype=torch.bool, device=q.device)
    if causal:
        visible &= pos_k[None, :] <= pos_q[:, None]
    window = options.get("window_left", -1)
    if window >= 0:
        in_window = pos_k[None, :] >= pos_q[:, None] - window
        sink = pos_k[None, :] < options.get("num_sink_tokens", 0)
        visible &= in_window | sink
    visible = visible[None].expand(hq, qo, kv)
    if user is not None:
        s = user.logits(s, batch, pos_q, pos_k)
        visible = visible & user.mask(batch, pos_q, pos_k)[None]
    if options.get("use_sigmoid", False):
        weights = torch.sigmoid(s + options.get("sigmoid_bias", 0.0)) * visible
        return torch.einsum("hqk,khd->qhd", weights, v), None
    if user is not None and not user.softmax:
        return torch.einsum("hqk,khd->qhd", s * visible, v), None
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, v), (lse / LN2).transpose(0, 1).contiguous()


# --- the entry points, one harness -------------------------------------------------------------------

ENTRIES = ("single_decode", "single_prefill", "batch_decode", "batch_prefill_paged", "batch_prefill_ragged")


def run_entry(entry, options, dtype, head_dim, group, seed, workspace, offsets=False, causal=True,
              return_lse=True):
    """Runs one entry point with `options` (and, with `offsets`, random per-request RoPE offsets)
    -> a list of (out, lse, reference inputs) per request; the reference inputs are the keyword
    arguments of `reference` but the options."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    hkv = 2
    hq = hkv * group
    sm_scale = 1 / math.sqrt(head_dim)
    layout = ("NHD", "HND")[seed % 2]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEV)

    def offsets_of(batch):
        if not offsets:
            return [0] * batch, [0] * batch
        # Large offsets (a request deep into its sequence): every frequency turns many times.
        return ([rng.randrange(0, 3000) for _ in range(batch)], [rng.randrange(-200, 3000) for _ in range(batch)])

    results = []
    if entry in ("single_decode", "single_prefill"):
        decode = entry == "single_decode"
        qo = 1 if decode else 37
        q, k, v = rand(qo, hq, head_dim), rand(300, hkv, head_dim), rand(300, hkv, head_dim)
        kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
        qo_off, k_off = offsets_of(1)
        extra = {"q_rope_offset": qo_off[0], "k_rope_offset": k_off[0]} if offsets else {}
        if decode:
            res = tessera.single_decode_with_kv_cache(q[0], kk, vv, kv_layout=layout, return_lse=return_lse,
                                                      **options, **extra)
        else:
            res = tessera.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=layout,
                                                       return_lse=return_lse, **options, **extra)
        out, lse = res if return_lse else (res, None)
        if decode:
            out, lse = out[None], (lse[None] if lse is not None else None)
        results.append((out, lse, dict(q=q, k=k, v=v, causal=causal and not decode, sm_scale=sm_scale,
                                       q_offset=qo_off[0], k_offset=k_off[0])))
        return results
    if entry in ("batch_decode", "batch_prefill_paged"):
        decode = entry == "batch_decode"
        kv_lens = [300, 1, 77, 0, 129] if decode else [300, 17, 3, 64, 0]
        qo_lens = [1] * len(kv_lens) if decode else [37, 1, 3, 16, 0]
        ps = (16, 1)[rng.randrange(2)]
        cache = Paged(kv_lens, ps, hkv, head_dim, dtype, layout, seed % 3 == 0, gen)
        qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
        qo_off, k_off = offsets_of(len(kv_lens))
        extra = {}
        if offsets:  # host offsets for one, device offsets (used in place) for the other
            extra = {"q_rope_offset": torch.tensor(qo_off, dtype=torch.int32),
                     "k_rope_offset": torch.tensor(k_off, dtype=torch.int32).to(DEV)}
        # Split the long request's KV in every other case: the states are merged by their LSE.
        split = {"fixed_split_size": 128 // ps if decode else 128} if seed % 4 < 2 else {}
        if decode:
            w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
            w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, head_dim, ps, q_data_type=dtype,
                   **split, **options, **extra)
        else:
            w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, layout)
            w.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, hq, hkv, head_dim, ps, causal=causal,
                   q_data_type=dtype, **split, **options, **extra)
        total = int(qo_indptr[-1])
        q = rand(total, hq, head_dim)
        out, lse = poisoned(q.shape, dtype), poisoned((total, hq), torch.float32)
        w.run(q, cache.cache, out=out, lse=lse, return_lse=return_lse)
        for b in range(len(kv_lens)):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            k, v = cache.request_kv(b)
            results.append((out[rows], lse[rows] if return_lse else None,
                            dict(q=q[rows], k=k, v=v, causal=causal and not decode, sm_scale=sm_scale,
                                 q_offset=qo_off[b], k_offset=k_off[b], batch=b)))
        return results
    assert entry == "batch_prefill_ragged"
    qo_lens, kv_lens = [37, 1, 5, 16], [300, 17, 3, 64]
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    total_q, total_kv = int(qo_indptr[-1]), int(kv_indptr[-1])
    q, k, v = rand(total_q, hq, head_dim), rand(total_kv, hkv, head_dim), rand(total_kv, hkv, head_dim)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    qo_off, k_off = offsets_of(len(kv_lens))
    extra = {}
    if offsets:
        extra = {"q_rope_offset": torch.tensor(qo_off, dtype=torch.int32).to(DEV),
                 "k_rope_offset": torch.tensor(k_off, dtype=torch.int32)}
    split = {"fixed_split_size": 128} if seed % 4 < 2 else {}
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, layout)
    w.plan(qo_indptr, kv_indptr, hq, hkv, head_dim, causal=causal, q_data_type=dtype, **split, **options, **extra)
    out, lse = poisoned(q.shape, dtype), poisoned((q.shape[0], hq), torch.float32)
    w.run(q, kk, vv, out=out, lse=lse, return_lse=return_lse)
    for b in range(len(kv_lens)):
        qs, ks = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        results.append((out[qs], lse[qs] if return_lse else None,
                        dict(q=q[qs], k=k[ks], v=v[ks], causal=causal, sm_scale=sm_scale, q_offset=qo_off[b],
                             k_offset=k_off[b], batch=b)))
    return results


def check(results, options, baseline, dtype, what, user=None):
    """Each request against the reference of `options`; the reference of `baseline` (the options
    without the one under test) must differ from it by far more than the tolerance."""
    changes = []
    for b, (out, lse, inputs) in enumerate(results):
        ref_o, ref_lse = reference(**inputs, options=options, user=user)
        assert_close(out, lse, ref_o, ref_lse, dtype, f"{what} request {b}")
        base_o, _ = reference(**inputs, options=baseline)
        if ref_o.norm().item() > 0:
            changes.append((ref_o - base_o).norm().item() / ref_o.norm().item())
    assert max(changes) > 10 * REL_TOL[dtype], f"{what}: the option barely changes the result (test not sensitive)"


def cases(name, entries=ENTRIES):
    """One case per entry point, dtypes, head dims and GQA groups spread over them."""
    return [{"name": name, "entry": e, "dtype": DTYPES[(i + len(name)) % 2], "head_dim": (128, 64)[i % 2],
             "group": (1, 4, 5)[i % 3], "seed": 1000 * len(name) + i} for i, e in enumerate(entries)]


def case_id(c):
    return f"{c['name']}-{c['entry']}-{str(c['dtype']).replace('torch.', '')}-d{c['head_dim']}-g{c['group']}"


# --- Llama 3.1 RoPE and RoPE offsets ----------------------------------------------------------------


@pytest.mark.parametrize("c", cases("llama31"), ids=case_id)
def test_llama31_rope(c, workspace):
    results = run_entry(c["entry"], LLAMA31, c["dtype"], c["head_dim"], c["group"], c["seed"], workspace)
    # Baseline: the same theta without the Llama 3.1 rescaling.
    check(results, LLAMA31, {"pos_encoding_mode": "ROPE_LLAMA", "rope_theta": 5e5}, c["dtype"],
          f"{c['entry']} ROPE_LLAMA31")


@pytest.mark.parametrize("c", cases("offsets"), ids=case_id)
def test_rope_offsets(c, workspace):
    options = LLAMA31 if c["seed"] % 2 else {"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 2.0}
    results = run_entry(c["entry"], options, c["dtype"], c["head_dim"], c["group"], c["seed"], workspace,
                        offsets=True)
    changes = []
    for out, lse, inputs in results:
        ref_o, ref_lse = reference(**inputs, options=options)
        what = f"{c['entry']} offsets q {inputs['q_offset']}, k {inputs['k_offset']}"
        assert_close(out, lse, ref_o, ref_lse, c["dtype"], what)
        # Baseline: the same RoPE without offsets.
        base_o, _ = reference(**dict(inputs, q_offset=0, k_offset=0), options=options)
        if ref_o.norm().item() > 0 and (inputs["q_offset"] or inputs["k_offset"]):
            changes.append((ref_o - base_o).norm().item() / ref_o.norm().item())
    assert max(changes) > 10 * REL_TOL[c["dtype"]], "the offsets barely change the result (test not sensitive)"


# --- attention sinks -----------------------------------------------------------------------------------

SINKS = {"window_left": 24, "num_sink_tokens": 4}


@pytest.mark.parametrize("c", cases("sinks"), ids=case_id)
def test_sinks(c, workspace):
    results = run_entry(c["entry"], SINKS, c["dtype"], c["head_dim"], c["group"], c["seed"], workspace)
    check(results, SINKS, {"window_left": 24}, c["dtype"], f"{c['entry']} sinks")


def test_sinks_with_rope_and_alibi(workspace):
    # The built-in options combine: sinks + window + Llama 3.1 RoPE with offsets, and ALiBi.
    options = dict(LLAMA31, **SINKS)
    results = run_entry("batch_decode", options, torch.float16, 128, 4, 7, workspace, offsets=True)
    check(results, options, dict(LLAMA31, window_left=24), torch.float16, "decode sinks + RoPE")
    # Many sinks: ALiBi fades the far keys, so a few would barely count.
    options = {"window_left": 40, "num_sink_tokens": 64, "pos_encoding_mode": "ALIBI"}
    results = run_entry("single_prefill", options, torch.bfloat16, 128, 4, 8, workspace)
    check(results, options, {"window_left": 40, "pos_encoding_mode": "ALIBI"}, torch.bfloat16,
          "single_prefill sinks + ALiBi")


# --- sigmoid attention ----------------------------------------------------------------------------------
# Every entry point; the plan/run wrappers never split KV for it (no log-sum-exp to merge by), even
# in the cases that ask for a fixed split.


@pytest.mark.parametrize("c", cases("sigmoid") + cases("sigmoid_window", ENTRIES[:2]), ids=case_id)
def test_sigmoid(c, workspace):
    options = {"use_sigmoid": True, "sigmoid_bias": -1.5}
    if c["name"] == "sigmoid_window":
        options.update(window_left=50, logits_soft_cap=5.0)
    results = run_entry(c["entry"], options, c["dtype"], c["head_dim"], c["group"], c["seed"], workspace,
                        return_lse=False)
    # Baseline: the same bias-free weights (the bias matters) ...
    check(results, options, dict(options, sigmoid_bias=0.0), c["dtype"], f"{c['entry']} sigmoid")
    # ... and the output is not softmax attention's.
    for out, _, inputs in results:
        soft, _ = reference(**inputs, options={k: v for k, v in options.items() if "sigmoid" not in k})
        if soft.norm() > 0:  # requests without keys: both are 0
            assert (out.float() - soft).norm() > 10 * REL_TOL[c["dtype"]] * soft.norm()


# --- user variants (tessera.VariantSpec; without softmax in every entry point) -------------------------

BIAS_MASK_SOURCE = r"""
// a temperature, a per-head linear position bias from a tensor, and a periodic key mask
float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head) {
  return logits * params.temperature + params.slopes[qo_head] * (float)(kv_idx - qo_idx);
}
bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head) {
  return kv_idx % params.period != params.hidden_phase;
}
"""

WEIGHTS_SOURCE = r"""
// no softmax: the weights are a bounded function of the logits
float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx, int qo_head,
                       int kv_head) {
  return params.weight_scale * tanhf(logits);
}
"""


class UserRef:
    """The torch reference of the two variants above: logits [H, qo, kv] -> transformed logits;
    mask [qo, kv] (or [H, qo, kv])."""

    def __init__(self, kind, slopes=None):
        self.kind, self.slopes = kind, slopes
        self.softmax = kind == "bias_mask"

    def logits(self, s, batch, pos_q, pos_k):
        if self.kind == "bias_mask":
            rel = (pos_k[None, :] - pos_q[:, None]).float()
            return s * 0.75 + self.slopes.float()[:, None, None] * rel[None]
        return 0.125 * torch.tanh(s)

    def mask(self, batch, pos_q, pos_k):
        if self.kind == "bias_mask":
            return (pos_k % 3 != 1)[None, :].expand(pos_q.shape[0], -1)
        return torch.ones(pos_q.shape[0], pos_k.shape[0], dtype=torch.bool, device=pos_q.device)


@pytest.mark.parametrize("c", cases("user", ENTRIES[:2]) + cases("user_weights"), ids=case_id)
def test_user_variant(c, workspace):
    hq = 2 * c["group"]
    softmax = c["name"] == "user"
    if softmax:
        slopes = torch.linspace(-0.05, 0.05, hq, dtype=torch.float32, device=DEV)
        spec = tessera.VariantSpec("bias_mask", BIAS_MASK_SOURCE,
                                   {"temperature": 0.75, "slopes": slopes, "period": 3, "hidden_phase": 1})
        user = UserRef("bias_mask", slopes)
    else:
        spec = tessera.VariantSpec("tanh_weights", WEIGHTS_SOURCE, {"weight_scale": 0.125}, use_softmax=False)
        user = UserRef("tanh_weights")
    options = {"variant": spec}
    results = run_entry(c["entry"], options, c["dtype"], c["head_dim"], c["group"], c["seed"], workspace,
                        return_lse=softmax)
    changes = []
    for out, lse, inputs in results:
        ref_o, ref_lse = reference(**inputs, options={}, user=user)
        assert_close(out, lse, ref_o, ref_lse, c["dtype"], f"{c['entry']} {spec.name}")
        plain, _ = reference(**inputs, options={})
        if ref_o.norm().item() > 0:  # requests without keys: both are 0
            changes.append((ref_o - plain).norm().item() / ref_o.norm().item())
    assert max(changes) > 10 * REL_TOL[c["dtype"]], f"{spec.name}: the variant barely changes the result"


def test_user_variant_compile_error_names_the_line():
    q = torch.randn(8, 128, dtype=torch.float16, device=DEV)
    k = torch.randn(40, 2, 128, dtype=torch.float16, device=DEV)
    bad = tessera.VariantSpec("broken", "float logits_transform(const Params& params, float logits, int b, int q, "
                                        "int kv, int qh, int kh) {\n  return logits + undeclared_name;\n}\n")
    # kInvalidArgument with NVRTC's log, lines numbered in the user's source.
    with pytest.raises(ValueError, match=r"user_snippet line 2: error: .*undeclared_name"):
        tessera.single_decode_with_kv_cache(q, k, k, variant=bad)
    elsewhere = tessera.VariantSpec("p", "", {"t": torch.ones(2, device=DEV)})
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match=r"params\['t'\] is on cuda:0, expected cuda:1"):
            tessera.single_decode_with_kv_cache(q.to("cuda:1"), k.to("cuda:1"), k.to("cuda:1"), variant=elsewhere)


# --- the wrappers against the one-shot C++ path ----------------------------------------------------------


def test_decode_wrapper_matches_single_decode(workspace):
    """The runtime's plan (split KV, merged by LSE) and the one-shot single_decode agree per request
    with Llama 3.1 RoPE, offsets and sinks."""
    gen = torch.Generator().manual_seed(31)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.bfloat16
    kv_lens = [700, 33, 129]
    cache = Paged(kv_lens, ps, hkv, d, dtype, "NHD", False, gen)
    q_off, k_off = [5, 1000, 0], [0, 77, 2048]
    options = dict(LLAMA31, window_left=200, num_sink_tokens=3)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, fixed_split_size=8,
           q_rope_offset=torch.tensor(q_off, dtype=torch.int32), k_rope_offset=torch.tensor(k_off, dtype=torch.int32),
           **options)
    q = torch.randn(3, hq, d, generator=gen).to(dtype).to(DEV)
    out, lse = w.run(q, cache.cache, return_lse=True)
    assert w.plan_info()["num_partials"] > 0, "the plan should split the long request"
    for b in range(3):
        k, v = cache.request_kv(b)
        single, single_lse = tessera.single_decode_with_kv_cache(q[b], k, v, return_lse=True, q_rope_offset=q_off[b],
                                                                 k_rope_offset=k_off[b], **options)
        assert_close(out[b], lse[b], single.float(), single_lse, dtype, f"wrapper vs single_decode request {b}")


def test_ragged_wrapper_matches_single_prefill(workspace):
    gen = torch.Generator().manual_seed(32)
    hq, hkv, d, dtype = 4, 2, 64, torch.float16
    q_off, k_off = [3, 900], [12, 0]
    options = dict(LLAMA31, window_left=64, num_sink_tokens=8)
    qo_indptr = torch.tensor([0, 40, 47], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 500, 590], dtype=torch.int32)
    q = torch.randn(47, hq, d, generator=gen).to(dtype).to(DEV)
    k = torch.randn(590, hkv, d, generator=gen).to(dtype).to(DEV)
    v = torch.randn(590, hkv, d, generator=gen).to(dtype).to(DEV)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, q_data_type=dtype, fixed_split_size=128,
           q_rope_offset=torch.tensor(q_off, dtype=torch.int32), k_rope_offset=torch.tensor(k_off, dtype=torch.int32),
           **options)
    out, lse = w.run(q, k, v, return_lse=True)
    for b in range(2):
        qs, ks = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        single, single_lse = tessera.single_prefill_with_kv_cache(q[qs], k[ks], v[ks], causal=True, return_lse=True,
                                                                  q_rope_offset=q_off[b], k_rope_offset=k_off[b],
                                                                  **options)
        assert_close(out[qs], lse[qs], single.float(), single_lse, dtype, f"ragged wrapper vs single_prefill {b}")


# --- q_len_per_req ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", (2, 5))
def test_q_len_per_req(n, workspace):
    """Several query tokens per request through the decode wrapper: causal among them, against the
    reference and bit for bit against the paged prefill wrapper with the same plan (what runs)."""
    gen = torch.Generator().manual_seed(40 + n)
    hq, hkv, d, ps, dtype = 16, 2, 128, 16, torch.bfloat16
    kv_lens = [300, n, 17, 1025]
    batch = len(kv_lens)
    cache = Paged(kv_lens, ps, hkv, d, dtype, "HND", True, gen)
    options = {"pos_encoding_mode": "ROPE_LLAMA31", "window_left": 100, "num_sink_tokens": 2}
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND", use_tensor_cores=True)
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, q_len_per_req=n,
           **options)
    q = torch.randn(batch * n, hq, d, generator=gen).to(dtype).to(DEV)
    out, lse = poisoned(q.shape, dtype), poisoned((batch * n, hq), torch.float32)
    w.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    for b in range(batch):
        rows = slice(b * n, (b + 1) * n)
        k, v = cache.request_kv(b)
        ref_o, ref_lse = reference(q[rows], k, v, True, 1 / math.sqrt(d), options)
        assert_close(out[rows], lse[rows], ref_o, ref_lse, dtype, f"q_len_per_req={n} request {b}")
    prefill = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND")
    prefill.plan(torch.arange(batch + 1, dtype=torch.int32) * n, cache.indptr, cache.indices, cache.last_page_len,
                 hq, hkv, d, ps, causal=True, q_data_type=dtype, **options)
    p_out, p_lse = prefill.run(q, cache.cache, return_lse=True)
    assert torch.equal(p_out, out) and torch.equal(p_lse, lse), "the decode wrapper runs the prefill runtime's plan"
    with pytest.raises(ValueError, match=rf"q has {batch} rows, expected {batch * n}: the plan has q_len_per_req"):
        w.run(q[:batch], cache.cache)
    # Back to one token per request: the wrapper rebuilds its decode runtime.
    w.plan(cache.indptr, cache.indices, cache.last_page_len, hq, hkv, d, ps, q_data_type=dtype, **options)
    one = w.run(q[:batch], cache.cache)
    for b in (0, 3):
        k, v = cache.request_kv(b)
        assert_close(one[b], None, reference(q[b:b + 1], k, v, False, 1 / math.sqrt(d), options)[0][0], None, dtype,
                     f"q_len_per_req=1 after {n}, request {b}")


# --- fast_decode_plan -------------------------------------------------------------------------------------


def test_fast_decode_plan_equals_plan(workspace):
    gen = torch.Generator().manual_seed(50)
    hq, hkv, d, dtype = 8, 2, 64, torch.float16
    for ps in (16, 1):
        kv_lens = [300, 9, 1]
        cache = Paged(kv_lens, ps, hkv, d, dtype, "NHD", False, gen)
        q = torch.randn(3, hq, d, generator=gen).to(dtype).to(DEV)
        a = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace)
        a.plan(cache.indptr.to(DEV), cache.indices, cache.last_page_len.to(DEV), hq, hkv, d, ps, q_data_type=dtype,
               window_left=50)
        expected = a.run(q, cache.cache)
        b = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace)
        # The host indptr replaces the device-to-host copy; with page size 1 last_page_len is not read.
        tessera.fast_decode_plan(b, cache.indptr.to(DEV), cache.indices, None if ps == 1 else cache.last_page_len,
                                 hq, hkv, d, ps, window_left=50, q_data_type=dtype,
                                 global_override_indptr_cpu=cache.indptr)
        assert torch.equal(b.run(q, cache.cache), expected), f"page size {ps}"


class GraphCache:
    """A paged NHD cache whose requests own fixed pages, the serving loop of a CUDA-graph test:
    page_table(kv_lens) -> (indptr, indices, last_page_len) of the requests' first pages,
    request_kv(...) their K / V as [kv_len, Hkv, D]."""

    def __init__(self, batch, max_pages, hkv, d, ps, dtype, gen):
        num_pages = batch * max_pages
        self.batch, self.hkv, self.d, self.ps, self.num_pages = batch, hkv, d, ps, num_pages
        self.k = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
        self.v = torch.randn(num_pages, ps, hkv, d, generator=gen).to(dtype).to(DEV)
        self.owned = torch.randperm(num_pages, generator=gen).view(batch, max_pages).to(torch.int32)

    def page_table(self, kv_lens):
        pages = [math.ceil(n / self.ps) for n in kv_lens]
        indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
        indices = torch.cat([self.owned[b, : pages[b]] for b in range(self.batch)]).to(DEV)
        last = torch.tensor([n - (p - 1) * self.ps for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        return indptr, indices, last

    def request_kv(self, indptr, indices, kv_lens, b):
        ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
        return [t[ids].reshape(-1, self.hkv, self.d)[: kv_lens[b]] for t in (self.k, self.v)]


def _capture(run):
    """run() once on a side stream (warm-up, JIT), then captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph


def _graph_decode_wrapper(cache, workspace_dtype=torch.uint8, fill=0):
    """A use_cuda_graph decode wrapper over `cache`'s sizes, its preallocated buffers filled with `fill`.
    128 MiB of workspace: with q_len_per_req > 1 it runs the prefill runtime, whose graph-mode
    workspace for these bounds is ~75 MiB."""
    batch = cache.batch
    return tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=workspace_dtype, device=DEV),
        torch.full((batch + 1,), fill, dtype=torch.int32, device=DEV),
        torch.zeros(cache.num_pages, dtype=torch.int32, device=DEV),
        torch.full((batch,), fill, dtype=torch.int32, device=DEV))


def test_fast_decode_plan_cuda_graph():
    """fast_decode_plan as a graph wrapper's plan: the captured run replays the new plan; the
    preallocated indptr / last_page_len buffers are left to the caller (FlashInfer's contract)."""
    gen = torch.Generator().manual_seed(51)
    hq, d, dtype = 8, 128, torch.bfloat16
    cache = GraphCache(3, 30, 2, d, 16, dtype, gen)
    w = _graph_decode_wrapper(cache, torch.int8, fill=-7)  # FlashInfer's examples allocate int8 workspaces
    indptr_buf, last_buf = w._paged_kv_indptr_buf, w._paged_kv_last_page_len_buf
    q_buf = torch.zeros(3, hq, d, dtype=dtype, device=DEV)
    out_buf = torch.zeros(3, hq, d, dtype=dtype, device=DEV)

    def fast_plan(kv_lens):
        indptr, indices, last = cache.page_table(kv_lens)
        tessera.fast_decode_plan(w, indptr.to(DEV), indices, last.to(DEV), hq, 2, d, 16, data_type=dtype,
                                 global_override_indptr_cpu=indptr)
        return indptr, indices, last

    fast_plan([100, 7, 300])
    graph = _capture(lambda: w.run(q_buf, (cache.k, cache.v), out=out_buf))
    for kv_lens in ([100, 7, 300], [129, 1, 470]):
        indptr, indices, last = fast_plan(kv_lens)
        assert indptr_buf.tolist() == [-7] * 4 and last_buf.tolist() == [-7] * 3
        q_buf.copy_(torch.randn(3, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        for b in range(3):
            k, v = cache.request_kv(indptr, indices, kv_lens, b)
            ref_o, _ = reference(q_buf[b:b + 1], k, v, False, 1 / math.sqrt(d), {})
            assert_close(out_buf[b], None, ref_o[0], None, dtype, f"fast plan replay {kv_lens} request {b}")
    # plan() writes the buffers, as FlashInfer's does.
    w.plan(indptr, indices, last, hq, 2, d, 16, q_data_type=dtype)
    assert indptr_buf.tolist() == indptr.tolist() and last_buf.tolist() == last.tolist()
    assert w._holder.builds == 1


# --- CUDA graphs with the new options ----------------------------------------------------------------------


def test_decode_cuda_graph_llama31_offsets_sinks():
    """A captured run() with Llama 3.1 RoPE, per-request offsets and sinks replays correctly after
    re-planning with new page tables and new offsets (copied into the wrapper's fixed buffers)."""
    gen = torch.Generator().manual_seed(60)
    hq, hkv, d, ps, dtype = 8, 2, 128, 16, torch.float16
    cache = GraphCache(3, 40, hkv, d, ps, dtype, gen)
    w = _graph_decode_wrapper(cache)
    q_buf = torch.zeros(3, hq, d, dtype=dtype, device=DEV)
    out_buf = torch.zeros(3, hq, d, dtype=dtype, device=DEV)
    options = dict(LLAMA31, window_left=64, num_sink_tokens=4)

    def plan(kv_lens, q_off, k_off):
        indptr, indices, last = cache.page_table(kv_lens)
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype,
               q_rope_offset=torch.tensor(q_off, dtype=torch.int32),
               k_rope_offset=torch.tensor(k_off, dtype=torch.int32).to(DEV), **options)
        return indptr, indices

    plan([100, 7, 300], [0, 0, 0], [0, 0, 0])
    graph = _capture(lambda: w.run(q_buf, (cache.k, cache.v), out=out_buf))
    for kv_lens, q_off, k_off in (([100, 7, 300], [10, 2000, 3], [0, 1999, 700]),
                                  ([129, 1, 600], [0, 5, 4096], [64, 5, 0])):
        indptr, indices = plan(kv_lens, q_off, k_off)
        q_buf.copy_(torch.randn(3, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        for b in range(3):
            k, v = cache.request_kv(indptr, indices, kv_lens, b)
            ref_o, _ = reference(q_buf[b:b + 1], k, v, False, 1 / math.sqrt(d), options, q_off[b], k_off[b])
            assert_close(out_buf[b], None, ref_o[0], None, dtype, f"graph replay {kv_lens} request {b}")
    assert w._holder.builds == 1
    # The variant is baked into the capture: another one is refused by the C++ runtime.
    with pytest.raises(ValueError, match="variant"):
        w.plan(*cache.page_table([100, 7, 300]), hq, hkv, d, ps, q_data_type=dtype,
               **dict(options, num_sink_tokens=5))


def test_decode_cuda_graph_q_len_per_req():
    gen = torch.Generator().manual_seed(61)
    batch, n, hq, hkv, d, ps, dtype = 3, 3, 8, 2, 128, 16, torch.float16
    cache = GraphCache(batch, 40, hkv, d, ps, dtype, gen)
    w = _graph_decode_wrapper(cache)
    q_buf = torch.zeros(batch * n, hq, d, dtype=dtype, device=DEV)  # max_batch * q_len_per_req rows
    out_buf = torch.zeros(batch * n, hq, d, dtype=dtype, device=DEV)
    options = {"pos_encoding_mode": "ROPE_LLAMA", "window_left": 30}
    w.plan(*cache.page_table([100, 7, 300]), hq, hkv, d, ps, q_data_type=dtype, q_len_per_req=n, **options)
    graph = _capture(lambda: w.run(q_buf, (cache.k, cache.v), out=out_buf))
    for kv_lens in ([100, 7, 300], [33, 3, 640]):
        indptr, indices, last = cache.page_table(kv_lens)
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype, q_len_per_req=n, **options)
        q_buf.copy_(torch.randn(batch * n, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        for b in range(batch):
            k, v = cache.request_kv(indptr, indices, kv_lens, b)
            rows = slice(b * n, (b + 1) * n)
            ref_o, _ = reference(q_buf[rows], k, v, True, 1 / math.sqrt(d), options)
            assert_close(out_buf[rows], None, ref_o, None, dtype, f"q_len_per_req graph {kv_lens} request {b}")
    with pytest.raises(ValueError, match="q_len_per_req = 2, but this use_cuda_graph wrapper was planned with 3"):
        w.plan(*cache.page_table([100, 7, 300]), hq, hkv, d, ps, q_data_type=dtype, q_len_per_req=2, **options)
    assert w._holder.builds == 1


def test_prefill_cuda_graph_llama31_offsets():
    gen = torch.Generator().manual_seed(62)
    batch, hq, hkv, d, ps, dtype, rows = 2, 8, 2, 64, 16, torch.bfloat16, 64
    cache = GraphCache(batch, 40, hkv, d, ps, dtype, gen)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device=DEV), "NHD", use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
        paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
        paged_kv_indices_buf=torch.zeros(cache.num_pages, dtype=torch.int32, device=DEV),
        paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device=DEV))
    options = dict(LLAMA31, window_left=100, num_sink_tokens=1)
    q_buf = torch.zeros(rows, hq, d, dtype=dtype, device=DEV)
    out_buf = torch.zeros(rows, hq, d, dtype=dtype, device=DEV)

    def plan(qo_lens, kv_lens, q_off, k_off):
        indptr, indices, last = cache.page_table(kv_lens)
        qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
        w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=True, q_data_type=dtype,
               q_rope_offset=torch.tensor(q_off, dtype=torch.int32), k_rope_offset=torch.tensor(k_off, dtype=torch.int32),
               **options)
        return qo_indptr, indptr, indices

    plan([40, 24], [300, 24], [0, 0], [0, 0])  # the first plan fixes the 64 query rows
    graph = _capture(lambda: w.run(q_buf, (cache.k, cache.v), out=out_buf))
    for qo_lens, kv_lens, q_off, k_off in (([40, 24], [300, 24], [7, 1500], [0, 900]),
                                          ([1, 50], [17, 600], [3000, 0], [2, 3])):
        qo_indptr, indptr, indices = plan(qo_lens, kv_lens, q_off, k_off)
        q_buf.copy_(torch.randn(rows, hq, d, generator=gen).to(dtype))
        out_buf.fill_(float("nan"))
        graph.replay()
        for b in range(batch):
            k, v = cache.request_kv(indptr, indices, kv_lens, b)
            qs = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            ref_o, _ = reference(q_buf[qs], k, v, True, 1 / math.sqrt(d), options, q_off[b], k_off[b])
            assert_close(out_buf[qs], None, ref_o, None, dtype, f"prefill graph replay {kv_lens} request {b}")
    assert w._holder.builds == 1
