"""CPU tests of FlashInfer's ``jit_args`` in the plan/run wrappers (tessera._jit_args): the two
tuple forms, the checks that name the entry, the refused variant forms, and the hooks generated
from a variant (what the GPU tests in test_jit_args_gpu.py compile and run)."""

import pytest

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

import tessera  # noqa: E402
from tessera._jit_args import JitVariant  # noqa: E402
from test_cpu import _ws  # noqa: E402

SIGMOID = r"""
struct FlashSigmoid {
  static constexpr bool use_softmax = false;
  template <typename Params>
  __device__ __host__ FlashSigmoid(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr) {}
  template <typename Params, typename T>
  __device__ __forceinline__ T QueryTransform(const Params& params, T q) { return float(q) * params.s; }
  template <typename Params, typename T>
  __device__ __forceinline__ T LogitsTransform(const Params& params, T logits, uint32_t batch_idx, uint32_t qo_idx,
                                               uint32_t kv_idx, uint32_t qo_head_idx, uint32_t kv_head_idx) {
    return logits;
  }
};
"""

MASKED = r"""
struct Masked : AttentionVariantBase {
  float sm_scale_log2;
  template <typename Params>
  __device__ __host__ Masked(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr) {
    sm_scale_log2 = params.sm_scale * math::log2e;
  }
  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return ((params.mask[kv_idx / 8] >> (kv_idx % 8)) & 1) != 0;
  })
};
"""


def args12(decl=SIGMOID, name="FlashSigmoid", tensors=(), scalars=(("s", "float"),), dtype=torch.float16):
    return ("uri_x", dtype, dtype, dtype, torch.int32, 128, [n for n, _ in tensors], [t for _, t in tensors],
            [n for n, _ in scalars], [t for _, t in scalars], name, decl)


def test_both_tuple_forms_and_what_they_generate():
    v = JitVariant(args12(), "W")
    assert (v.head_dim_qk, v.head_dim_vo, v.use_softmax, v.num_args) == (128, 128, False, 1)
    # Softmax-free with QueryTransform and LogitsTransform: those two hooks, no mask, no scaling.
    assert "float2 query_transform(" in v.source and "float logits_transform(" in v.source
    assert "bool logits_mask(" not in v.source and "math::loge2" not in v.source.split("struct TesseraJitParams")[1]
    assert '#line 1 "jit_args variant_decl"' in v.source
    thirteen = list(args12(MASKED, "Masked", (("mask", "uint8_t"),), (("sm_scale", "double"),)))
    thirteen.insert(6, 128)
    m = JitVariant(tuple(thirteen), "W")
    assert (m.use_softmax, m.num_args, m.tensors, m.scalars) == (True, 2, [("mask", "uint8_t")],
                                                                  [("sm_scale", "double")])
    # A softmax variant always gets the logits hook (the scale to natural units); the macro's mask.
    assert "bool logits_mask(" in m.source and "float logits_transform(" in m.source
    assert "query_transform" not in m.source
    assert "  uint8_t* mask;" in m.source and "  double sm_scale;" in m.source


@pytest.mark.parametrize("bad,error,message", [
    (("x",), TypeError, "jit_args must be FlashInfer's tuple of 12 or 13 entries"),
    ({"idtype": torch.int64}, NotImplementedError, r"jit_args idtype=torch.int64 is not supported .*torch.int32"),
    ({"dtype_o": torch.float32}, NotImplementedError, "dtype_o = torch.float32 differs from dtype_q"),
    ({"dtype_q": 3}, TypeError, "jit_args dtype_q = 3, expected a torch.dtype"),
    ({"scalars": (("s", "float"), ("s", "int"))}, ValueError, "'s' is declared twice"),
    ({"scalars": (("s", "int64_t"),)}, NotImplementedError, "additional scalar 's' has dtype 'int64_t'"),
    ({"tensors": (("t", "double"),)}, NotImplementedError, "additional tensor 't' has dtype 'double'"),
    ({"tensors": (("tessera_x", "float"),)}, ValueError, "'tessera_x' is not a C identifier"),
    ({"name": "Other"}, ValueError, "declares no struct Other"),
    ({"decl": SIGMOID.replace("QueryTransform", "OutputTransform")}, NotImplementedError, "an output transform"),
    ({"decl": "struct FlashSigmoid { template <typename MainloopParams, typename BlockCoord> "
              "FlashSigmoid(const MainloopParams& p, const BlockCoord& c) {} };"},
     NotImplementedError, r"FA3 \(sm90\) variant form"),
])
def test_bad_jit_args_are_named(bad, error, message):
    if isinstance(bad, tuple):
        args = bad
    else:
        base = dict(decl=SIGMOID, name="FlashSigmoid", tensors=(), scalars=(("s", "float"),))
        base.update({k: v for k, v in bad.items() if k in base})
        args = list(args12(**base))
        for key, index in (("dtype_q", 1), ("dtype_o", 3), ("idtype", 4)):
            if key in bad:
                args[index] = bad[key]
    with pytest.raises(error, match=message):
        JitVariant(args, "W")


@pytest.mark.parametrize("cls", [tessera.BatchDecodeWithPagedKVCacheWrapper, tessera.BatchPrefillWithPagedKVCacheWrapper,
                                 tessera.BatchPrefillWithRaggedKVCacheWrapper], ids=lambda c: c.__name__)
def test_wrappers_take_jit_args(cls):
    w = cls(_ws(), "NHD", jit_args=args12())
    assert w._jit is not None and w._jit.name == "FlashSigmoid"
    # run() before plan() is named as such, with or without the variant's arguments.
    q = torch.zeros(1, 8, 128, dtype=torch.float16)
    kv = torch.zeros(1, 2, 16, 2, 128, dtype=torch.float16)
    run = (q, kv[:, 0], kv[:, 1]) if cls is tessera.BatchPrefillWithRaggedKVCacheWrapper else (q, kv)
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        w.run(*run, 0.5)


def test_pod_refuses_jit_args():
    with pytest.raises(NotImplementedError, match="jit_args"):
        tessera.PODWithPagedKVCacheWrapper(_ws(), "NHD", jit_args=args12())


def test_customized_single_modules():
    from tessera.decode import single_decode_with_kv_cache_with_jit_module
    from tessera.jit.attention import JitModule, gen_customize_single_decode_module, gen_customize_single_prefill_module
    from tessera.utils import MaskMode

    assert (MaskMode.NON_CAUSAL.value, MaskMode.CAUSAL.value, MaskMode.CUSTOM.value) == (0, 1, 2)
    f16 = torch.float16
    # One head dim (FlashInfer's older signature) or head_dim_qk and head_dim_vo.
    m = gen_customize_single_decode_module("u", f16, f16, f16, 128, [], [], ["s"], ["float"], "FlashSigmoid", SIGMOID)
    assert isinstance(m, JitModule) and m.build_and_load() is m and m.kind == "decode"
    assert (m.variant.head_dim_qk, m.variant.head_dim_vo, m.variant.num_args) == (128, 128, 1)
    p = gen_customize_single_prefill_module("fa2", "u", f16, f16, f16, 192, 128, [], [], ["s"], ["float"],
                                            "FlashSigmoid", SIGMOID)
    assert (p.kind, p.variant.head_dim_qk, p.variant.head_dim_vo) == ("prefill", 192, 128)
    with pytest.raises(NotImplementedError, match=r"\['use_sliding_window'\]=True is not supported"):
        gen_customize_single_decode_module("u", f16, f16, f16, 128, [], [], [], [], "FlashSigmoid", SIGMOID,
                                           use_sliding_window=True)
    with pytest.raises(NotImplementedError, match=r"backend='cutlass' is not supported"):
        gen_customize_single_prefill_module("cutlass", "u", f16, f16, f16, 128, [], [], [], [], "FlashSigmoid", SIGMOID)
    q, kv = torch.zeros(8, 128, dtype=f16), torch.zeros(10, 8, 128, dtype=f16)
    with pytest.raises(TypeError, match=r"jit_module must come from tessera.jit.attention."
                                        r"gen_customize_single_decode_module"):
        single_decode_with_kv_cache_with_jit_module(p, q, kv, kv, 1.0)
    with pytest.raises(NotImplementedError, match=r"window_left=5 is not supported"):
        single_decode_with_kv_cache_with_jit_module(m, q, kv, kv, 1.0, window_left=5)
    with pytest.raises(TypeError, match=r"got 0 additional argument"):
        single_decode_with_kv_cache_with_jit_module(m, q, kv, kv)


def test_prefill_wrappers_take_flashinfers_jit_kwargs():
    for cls in (tessera.BatchPrefillWithPagedKVCacheWrapper, tessera.BatchPrefillWithRaggedKVCacheWrapper):
        cls(_ws(), "NHD", jit_args=args12(), jit_kwargs={"pos_encoding_mode": 0, "use_sliding_window": False})
        cls(_ws(), "NHD", jit_kwargs={})  # without jit_args, as FlashInfer: nothing to apply them to
        with pytest.raises(NotImplementedError, match=r"jit_kwargs\['use_logits_soft_cap'\]=True is not supported"):
            cls(_ws(), "NHD", jit_args=args12(), jit_kwargs={"use_logits_soft_cap": True})
        with pytest.raises(TypeError, match=r"jit_kwargs: unknown option 'fp8_enabled'"):
            cls(_ws(), "NHD", jit_args=args12(), jit_kwargs={"fp8_enabled": False})
        with pytest.raises(TypeError, match=r"jit_kwargs must be a dict of keyword options or None, got list"):
            cls(_ws(), "NHD", jit_kwargs=[])

