"""GPU tests of FlashInfer's ``jit_args`` in the plan/run wrappers (decode, paged and ragged
prefill): variants written as FlashInfer writes them (its FA2 form: QueryTransform folding the
scale, and the newer AttentionVariantBase / REGISTER_ macros with sm_scale_log2), with additional
scalars and tensors passed to run(), against a PyTorch fp32 reference written here from FlashInfer's
semantics:

- s = QueryTransform(q) . k (raw q . k without one), then LogitsTransform(s) with FlashInfer's
  indices (qo_idx counts the request's new tokens from 0, kv_idx the key's position);
- softmax variants: weights 2^(LogitsTransform(s) * sm_scale_log2) (1 without that member) over
  the keys LogitsMask keeps, normalised; base-2 LSE; softmax-free ones: the transformed logits
  are the weights.

Also: new additional-argument values at every run(), a CUDA Graph capture of a JIT variant's run
(changed values after the capture are refused), and the run()-time errors. Skipped (with the
reason) when torch.cuda.is_available() is False.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False): GPU tests skipped", allow_module_level=True)

import tessera  # noqa: E402
from test_gpu import DEV, Paged, assert_close, poisoned  # noqa: E402

LOG2E = 1.0 / math.log(2.0)

# FlashInfer's FA2 form (as its FlashSigmoid example is written): QueryTransform folds the scale into
# q in log2 units, no softmax, the weights a sigmoid of the logits plus a bias.
FLASH_SIGMOID = r"""
struct FlashSigmoid {
  static constexpr bool use_softmax = false;
  float bias_log2;  // the bias in the logits' log2 units
  template <typename Params>
  __device__ __host__ FlashSigmoid(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr)
      : bias_log2(params.sigmoid_bias * math::log2e) {}
  template <typename Params, typename T>
  __device__ __forceinline__ T QueryTransform(const Params& params, T q) {
    return float(q) * (params.logits_scale * math::log2e);
  }
  template <typename Params, typename T>
  __device__ __forceinline__ T LogitsTransform(const Params& params, T logits, uint32_t batch_idx, uint32_t qo_idx,
                                               uint32_t kv_idx, uint32_t qo_head_idx, uint32_t kv_head_idx) {
    const float e = math::ptx_exp2(-(float(logits) + bias_log2));
    return math::ptx_rcp(1.f + e);
  }
};
"""

# The newer form: AttentionVariantBase, the REGISTER_ macros, sm_scale_log2 applied by the softmax; a
# soft-cap on the raw logits, a per-head bias from an additional tensor, and a causal mask written
# from FlashInfer's indices and lengths (qo_idx from 0 among the new tokens).
CAPPED_CAUSAL = r"""
struct CappedCausal : AttentionVariantBase {
  float sm_scale_log2;
  float cap;
  uint32_t qo_len, kv_len;
  template <typename Params>
  __device__ __host__ CappedCausal(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr) {
    sm_scale_log2 = params.sm_scale * math::log2e;
    cap = params.soft_cap;
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
  }
  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return cap * math::tanh(logits / cap) + params.head_bias[qo_head_idx];
  })
  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return kv_idx + qo_len <= qo_idx + kv_len;
  })
};
"""


def jit_args(name, decl, dtype, head_dim, tensors, scalars, thirteen=False):
    head_dims = (head_dim, head_dim) if thirteen else (head_dim,)
    return (f"test_{name}", dtype, dtype, dtype, torch.int32, *head_dims, [n for n, _ in tensors],
            [t for _, t in tensors], [n for n, _ in scalars], [t for _, t in scalars], name, decl)


def sigmoid_ref(q, k, v, causal, scale, bias):
    """FlashSigmoid over one request: q [qo, Hq, D], k / v [kv, Hkv, D] -> out fp32."""
    q, k, v = q.float(), k.float(), v.float()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    w = torch.sigmoid(torch.einsum("qhd,khd->hqk", q, k) * scale + bias)
    if causal:
        qo, kv = q.shape[0], k.shape[0]
        w = w * (torch.arange(kv, device=DEV)[None, :] <= torch.arange(qo, device=DEV)[:, None] + kv - qo)
    return torch.einsum("hqk,khd->qhd", w, v)


def capped_ref(q, k, v, sm_scale, cap, head_bias):
    """CappedCausal over one request -> (out fp32, base-2 lse)."""
    q, k, v = q.float(), k.float(), v.float()
    qo, kv = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k)
    x = (cap * torch.tanh(s / cap) + head_bias.float()[:, None, None]) * sm_scale
    visible = torch.arange(kv, device=DEV)[None, :] <= torch.arange(qo, device=DEV)[:, None] + kv - qo
    x = x.masked_fill(~visible[None], float("-inf"))
    lse = torch.logsumexp(x, dim=-1)  # natural, [H, qo]
    p = torch.exp(x - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), (lse * LOG2E).transpose(0, 1)


@pytest.fixture(scope="module")
def workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


def rand(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype).to(DEV)


def planned_batch(wrapper, args, workspace, gen, qo_lens, kv_lens, heads, dtype, page_size, layout, causal,
                  **plan_kwargs):
    """One of the three wrappers with jit_args, planned over random K/V of `kv_lens` (ragged, or a
    paged cache of `page_size` in `layout`) -> (wrapper, q, qo_indptr, the cache arguments of run(),
    each request's (k, v) [kv_len, Hkv, D])."""
    hq, hkv, d = heads
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = rand(gen, int(qo_indptr[-1]), hq, d, dtype=dtype)
    if wrapper == "ragged":
        kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        k, v = rand(gen, int(kv_indptr[-1]), hkv, d, dtype=dtype), rand(gen, int(kv_indptr[-1]), hkv, d, dtype=dtype)
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2", jit_args=args)
        w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type=dtype, **plan_kwargs)
        request_kv = [(k[kv_indptr[b]:kv_indptr[b + 1]], v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(len(kv_lens))]
        return w, q, qo_indptr, (k, v), request_kv
    paged = Paged(kv_lens, page_size, hkv, d, dtype, layout, layout == "HND", gen)
    if wrapper == "decode":
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, layout, jit_args=args)
        w.plan(paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, page_size, q_data_type=dtype)
    else:
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace, layout, jit_args=args)
        w.plan(qo_indptr, paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, page_size, causal=causal,
               q_data_type=dtype)
    return w, q, qo_indptr, (paged.cache,), [paged.request_kv(b) for b in range(len(kv_lens))]


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("wrapper", ("decode", "paged", "ragged"))
def test_flash_sigmoid(wrapper, dtype, workspace):
    d = 128
    args = jit_args("FlashSigmoid", FLASH_SIGMOID, dtype, d, [], [("logits_scale", "float"), ("sigmoid_bias", "float")])
    qo_lens = [1] * 4 if wrapper == "decode" else [17, 1, 64, 5]
    causal = wrapper != "decode"
    w, q, qo_indptr, cache, request_kv = planned_batch(
        wrapper, args, workspace, torch.Generator().manual_seed(7 + len(wrapper)), qo_lens, [300, 1, 2100, 77],
        (8, 2, d), dtype, 16, "NHD", causal, **({"fixed_split_size": 256} if wrapper == "ragged" else {}))
    assert w.plan_info()["num_partials"] == 0, "a softmax-free plan must not split KV"
    for scale, bias in ((1 / math.sqrt(d), 0.25), (0.05, -1.0)):  # new values at each run
        out = poisoned(q.shape, dtype)
        w.run(q, *cache, scale, bias, out=out)
        for b in range(4):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            ref = sigmoid_ref(q[rows], *request_kv[b], causal, scale, bias)
            assert_close(out[rows], None, ref, None, dtype, f"{wrapper} FlashSigmoid request {b} bias {bias}")
    with pytest.raises(ValueError, match="return_lse=True with variant=.*use_softmax=False"):
        w.run(q, *cache, 0.1, 0.0, return_lse=True)


@pytest.mark.parametrize("wrapper", ("decode", "paged", "ragged"))
def test_register_macros_tensor_parameter_and_lengths(wrapper, workspace):
    dtype, hq, d = torch.bfloat16, 8, 64
    args = jit_args("CappedCausal", CAPPED_CAUSAL, dtype, d, [("head_bias", "float")],
                    [("sm_scale", "double"), ("soft_cap", "float")], thirteen=True)
    qo_lens = [1, 1, 1] if wrapper == "decode" else [33, 40, 7]
    # The mask of the variant is the causal one: plan non-causal, so only the variant masks.
    w, q, qo_indptr, cache, request_kv = planned_batch(
        wrapper, args, workspace, torch.Generator().manual_seed(31 + len(wrapper)), qo_lens, [513, 40, 3000],
        (hq, 1, d), dtype, 1, "HND", False)
    for seed in range(2):  # a new bias tensor and new scalars at each run
        head_bias = torch.linspace(-2.0, 2.0, hq, device=DEV) * (1 - 2 * seed)
        sm_scale, cap = (1 / math.sqrt(d), 30.0) if seed == 0 else (0.3, 5.0)
        out, lse = w.run(q, *cache, head_bias, sm_scale, cap, return_lse=True)
        for b in range(3):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            ref_o, ref_lse = capped_ref(q[rows], *request_kv[b], sm_scale, cap, head_bias)
            assert_close(out[rows], lse[rows], ref_o, ref_lse, dtype, f"{wrapper} CappedCausal request {b} run {seed}")


def test_run_arguments_are_checked(workspace):
    dtype, hq, hkv, d = torch.float16, 4, 4, 128
    args = jit_args("CappedCausal", CAPPED_CAUSAL, dtype, d, [("head_bias", "float")],
                    [("sm_scale", "float"), ("soft_cap", "float")])
    paged = Paged([40, 9], 16, hkv, d, dtype, "NHD", False, torch.Generator().manual_seed(3))
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", jit_args=args)
    with pytest.raises(ValueError, match=r"sm_scale = 0.1 with jit_args"):
        w.plan(paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, 16, q_data_type=dtype, sm_scale=0.1)
    with pytest.raises(ValueError, match=r"q_data_type = torch.bfloat16, but jit_args declares torch.float16"):
        w.plan(paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, 16, q_data_type=torch.bfloat16)
    w.plan(paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, 16, q_data_type=dtype)
    q = torch.randn(2, hq, d, dtype=dtype, device=DEV)
    bias = torch.zeros(hq, device=DEV)
    with pytest.raises(TypeError, match=r"got 0 additional argument\(s\) after the KV cache, expected 3 "
                                        r"\(head_bias, sm_scale, soft_cap\)"):
        w.run(q, paged.cache)
    with pytest.raises(ValueError, match=r"additional tensor 'head_bias' is torch.float16 on cuda:0, expected "
                                         r"torch.float32"):
        w.run(q, paged.cache, bias.half(), 0.1, 30.0)
    with pytest.raises(TypeError, match=r"additional scalar 'soft_cap' = 'x', expected a Python number"):
        w.run(q, paged.cache, bias, 0.1, "x")
    with pytest.raises(ValueError, match=r"variant param soft_cap"):  # the C++ layer's check: finite
        w.run(q, paged.cache, bias, 0.1, float("inf"))
    assert torch.isfinite(w.run(q, paged.cache, bias, 0.1, 30.0)).all()


def test_cuda_graph_capture_of_a_jit_variant(workspace):
    dtype, hq, hkv, d, ps, batch = torch.float16, 8, 2, 128, 16, 4
    gen = torch.Generator().manual_seed(11)
    args = jit_args("FlashSigmoid", FLASH_SIGMOID, dtype, d, [], [("logits_scale", "float"), ("sigmoid_bias", "float")])
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
                paged_kv_indices_buffer=torch.zeros(256, dtype=torch.int32, device=DEV),
                paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32, device=DEV))
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True, jit_args=args, **bufs)
    paged = Paged([100, 7, 300, 33], ps, hkv, d, dtype, "NHD", False, gen)
    w.plan(paged.indptr, paged.indices, paged.last_page_len, hq, hkv, d, ps, q_data_type=dtype)
    q = rand(gen, batch, hq, d, dtype=dtype)
    out = torch.empty_like(q)
    scale, bias = 1 / math.sqrt(d), 0.5
    w.run(q, paged.cache, scale, bias, out=out)  # warm-up: compiles the variant outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, paged.cache, scale, bias, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for b in range(batch):
        ref = sigmoid_ref(q[b:b + 1], *paged.request_kv(b), False, scale, bias)
        assert_close(out[b:b + 1], None, ref, None, dtype, f"graph replay request {b}")
    # A re-plan (another batch over the same pool) keeps the run's values: the replay reads it.
    lens = [40, 300, 1, 16]
    pages = [math.ceil(n / ps) for n in lens]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    indices = paged.indices.flip(0)[: int(indptr[-1])].contiguous()
    last = torch.tensor([n - (p - 1) * ps for n, p in zip(lens, pages)], dtype=torch.int32)
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dtype)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    k_pool, v_pool = paged.cache
    for b in range(batch):
        ids = indices[int(indptr[b]):int(indptr[b + 1])].long()
        k, v = (t[ids].reshape(-1, hkv, d)[: lens[b]] for t in (k_pool, v_pool))
        ref = sigmoid_ref(q[b:b + 1], k, v, False, scale, bias)
        assert_close(out[b:b + 1], None, ref, None, dtype, f"graph replay after a re-plan, request {b}")
    # The captured launch has the values baked in: other values are refused, the same ones run.
    with pytest.raises(ValueError, match=r"cuda_graph: set_variant_params\(\) changes the values"):
        w.run(q, paged.cache, scale, bias + 1.0, out=out)
    w.run(q, paged.cache, scale, bias, out=out)
    torch.cuda.synchronize()


# --- FlashInfer's single-request functions with customized modules --------------------------------

# Softmax with the scale folded into q, a mask from a packed bit tensor over the keys, and the
# logits written out through an additional tensor (FlashInfer's tensors are writable).
BITMASK_DUMP = r"""
struct BitmaskDump {
  static constexpr bool use_softmax = true;
  uint32_t rows, keys;
  template <typename Params>
  __device__ __host__ BitmaskDump(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr)
      : rows(params.get_qo_len(batch_idx)), keys(params.get_kv_len(batch_idx)) {}
  template <typename Params, typename T>
  __device__ __forceinline__ T QueryTransform(const Params& params, T q) {
    return float(q) * params.scale * math::log2e;
  }
  template <typename Params, typename T>
  __device__ __forceinline__ T LogitsTransform(const Params& params, T logits, uint32_t batch_idx, uint32_t qo_idx,
                                               uint32_t kv_idx, uint32_t qo_head_idx, uint32_t kv_head_idx) {
    if (qo_idx < rows && kv_idx < keys) {
      params.logits_out[(qo_head_idx * rows + qo_idx) * keys + kv_idx] = float(logits) * math::loge2;
    }
    return logits;
  }
  template <typename Params>
  __device__ __forceinline__ bool LogitsMask(const Params& params, uint32_t batch_idx, uint32_t qo_idx,
                                             uint32_t kv_idx, uint32_t qo_head_idx, uint32_t kv_head_idx) {
    return (params.keep[kv_idx >> 3] >> (kv_idx & 7)) & 1;
  }
};
"""


def test_flashinfer_single_functions_with_customized_modules():
    import tessera as flashinfer  # FlashInfer's module paths, only the import changed
    from tessera.decode import single_decode_with_kv_cache_with_jit_module
    from tessera.jit.attention import gen_customize_single_decode_module, gen_customize_single_prefill_module
    from tessera.prefill import single_prefill_with_kv_cache_with_jit_module
    from tessera.utils import MaskMode

    gen = torch.Generator().manual_seed(5)
    h, d = 8, 128
    # Decode: the bitmask and a logit dump (one query row per head).
    module = gen_customize_single_decode_module(
        "test_single_decode_bitmask", torch.float16, torch.float16, torch.float16, d, ["logits_out", "keep"],
        ["float", "uint8_t"], ["scale"], ["float"], "BitmaskDump", BITMASK_DUMP)
    kv_len = 254
    q = rand(gen, h, d, dtype=torch.float16)
    k, v = rand(gen, kv_len, h, d, dtype=torch.float16), rand(gen, kv_len, h, d, dtype=torch.float16)
    keep = torch.randint(0, 2, (kv_len,), generator=gen).to(DEV)
    keep[0] = 1
    packed = flashinfer.packbits(keep.to(torch.uint8), bitorder="little")
    logits = torch.full((h, 1, kv_len), float("nan"), device=DEV)
    scale = 1 / math.sqrt(d)
    out, lse = single_decode_with_kv_cache_with_jit_module(module, q, k, v, logits, packed, scale, return_lse=True)
    s = torch.einsum("hd,nhd->hn", q.float(), k.float()) * scale
    torch.testing.assert_close(logits[:, 0], s, rtol=2e-2, atol=2e-2)
    x = s.masked_fill(~keep.bool()[None], float("-inf"))
    ref_lse = torch.logsumexp(x, -1)
    ref = torch.einsum("hn,nhd->hd", torch.exp(x - ref_lse[:, None]), v.float())
    assert_close(out[None], lse[None], ref[None], (ref_lse / math.log(2.0))[None], torch.float16, "single decode")
    # Prefill: FlashSigmoid, causal and not (MaskMode), against the sigmoid reference.
    module = gen_customize_single_prefill_module(
        "fa2", "test_single_prefill_sigmoid", torch.bfloat16, torch.bfloat16, torch.bfloat16, d, [], [],
        ["logits_scale", "sigmoid_bias"], ["float", "float"], "FlashSigmoid", FLASH_SIGMOID).build_and_load()
    q = rand(gen, 100, h, d, dtype=torch.bfloat16)
    k, v = rand(gen, 1027, 2, d, dtype=torch.bfloat16), rand(gen, 1027, 2, d, dtype=torch.bfloat16)
    for mode in (MaskMode.NON_CAUSAL, MaskMode.CAUSAL):
        out = single_prefill_with_kv_cache_with_jit_module(module, q, k, v, scale, 0.25, mask_mode=mode.value)
        ref = sigmoid_ref(q, k, v, mode == MaskMode.CAUSAL, scale, 0.25)
        assert_close(out, None, ref, None, torch.bfloat16, f"single prefill sigmoid {mode.name}")
    with pytest.raises(NotImplementedError, match=r"mask_mode=2 is not supported"):
        single_prefill_with_kv_cache_with_jit_module(module, q, k, v, scale, 0.25, mask_mode=MaskMode.CUSTOM.value)
    with pytest.raises(ValueError, match=r"q is torch.float16 with head dim 128, but the module declares "
                                         r"torch.bfloat16"):
        single_prefill_with_kv_cache_with_jit_module(module, q.half(), k, v, scale, 0.25)
    with pytest.raises(ValueError, match=r"return_lse=True with variant="):
        single_prefill_with_kv_cache_with_jit_module(module, q, k, v, scale, 0.25, return_lse=True)
