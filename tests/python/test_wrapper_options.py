"""CPU tests of Tessera's own options of the FlashInfer-style functions and wrappers.

Llama 3.1 RoPE (pos_encoding_mode="ROPE_LLAMA31" with its factors), per-request RoPE offsets,
attention sinks, sigmoid attention, user variants (tessera.VariantSpec), the decode wrapper's
q_len_per_req and fast_decode_plan: their signatures (FlashInfer's arguments keep their names and
positions; Tessera's are keyword-only), defaults, what the Python layer hands the bindings, and the
errors that name the argument, all before any GPU work. What needs a GPU (the kernels, CUDA graphs,
the runtime's plans) is in test_wrapper_options_gpu.py.
"""

import inspect
import math

import pytest

import tessera
from tessera import _C
from tessera import _utils as U
from test_cpu import _decode_plan, _i32, _paged_plan, _ragged_plan, _ws  # the CPU plan helpers
from conftest import RecordingRuntime  # the recording runtime stand-in

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

D, P, R = (tessera.BatchDecodeWithPagedKVCacheWrapper, tessera.BatchPrefillWithPagedKVCacheWrapper,
           tessera.BatchPrefillWithRaggedKVCacheWrapper)
WORKSPACE_ON_CPU = "float_workspace_buffer is on cpu, expected a CUDA tensor"
Q_ON_CPU = "q is on cpu, expected a CUDA tensor"

# Tessera's keyword-only options, in order, with their defaults.
TESSERA_OPTIONS = {
    "low_freq_factor": None, "high_freq_factor": None, "old_context_len": None, "q_rope_offset": None,
    "k_rope_offset": None, "num_sink_tokens": 0, "use_sigmoid": False, "sigmoid_bias": None, "variant": None,
}


def _params(f):
    return [p for p in inspect.signature(f).parameters if p != "self"]


def _keyword_only_defaults(f):
    return {name: p.default for name, p in inspect.signature(f).parameters.items()
            if p.kind == inspect.Parameter.KEYWORD_ONLY}


# --- signatures ----------------------------------------------------------------------------------

ENTRY_POINTS = [tessera.single_decode_with_kv_cache, tessera.single_prefill_with_kv_cache, D.plan, P.plan, R.plan]
ENTRY_IDS = ["single_decode", "single_prefill", "decode.plan", "prefill_paged.plan", "prefill_ragged.plan"]


@pytest.mark.parametrize("f", ENTRY_POINTS, ids=ENTRY_IDS)
def test_tessera_options_are_keyword_only_after_flashinfers(f):
    kw = _keyword_only_defaults(f)
    names = list(kw)
    # Tessera's options come last, after FlashInfer's keyword-only ones (o_data_type, split options).
    assert names[-len(TESSERA_OPTIONS):] == list(TESSERA_OPTIONS)
    assert {n: kw[n] for n in TESSERA_OPTIONS} == TESSERA_OPTIONS
    positional = [p for p in _params(f) if p not in kw]
    assert not set(positional) & set(TESSERA_OPTIONS)


def test_decode_plan_q_len_per_req_follows_disable_split_kv():
    # FlashInfer's order: ..., fixed_split_size, disable_split_kv, q_len_per_req.
    params = _params(D.plan)
    i = params.index("disable_split_kv")
    assert params[i - 1:i + 2] == ["fixed_split_size", "disable_split_kv", "q_len_per_req"]
    p = inspect.signature(D.plan).parameters["q_len_per_req"]
    assert p.default == 1 and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_fast_decode_plan_signature_matches_flashinfer():
    assert tessera.fast_decode_plan is tessera.decode.fast_decode_plan
    assert list(inspect.signature(tessera.fast_decode_plan).parameters) == [
        "self", "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
        "pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "data_type",
        "sm_scale", "rope_scale", "rope_theta", "non_blocking", "fixed_split_size", "disable_split_kv",
        "q_len_per_req", "global_override_indptr_cpu"]
    defaults = {n: p.default for n, p in inspect.signature(tessera.fast_decode_plan).parameters.items()
                if p.default is not inspect.Parameter.empty}
    assert defaults == {"pos_encoding_mode": "NONE", "window_left": -1, "logits_soft_cap": None, "q_data_type": None,
                        "kv_data_type": None, "data_type": None, "sm_scale": None, "rope_scale": None,
                        "rope_theta": None, "non_blocking": True, "fixed_split_size": None,
                        "disable_split_kv": False, "q_len_per_req": 1, "global_override_indptr_cpu": None}


@pytest.mark.parametrize("obj", [tessera.VariantSpec, tessera.fast_decode_plan], ids=lambda o: o.__name__)
def test_new_public_names_are_documented(obj):
    assert inspect.getdoc(obj)
    if inspect.isclass(obj):
        for name, member in inspect.getmembers(obj):
            if (not name.startswith("_") or name == "__init__") and (callable(member) or isinstance(member, property)):
                assert inspect.getdoc(member), f"{obj.__name__}.{name} has no docstring"
    assert "VariantSpec" in tessera.__all__ and "fast_decode_plan" in tessera.__all__


# --- what reaches the bindings -------------------------------------------------------------------


def test_variant_args_defaults_match_the_cpp_defaults():
    # tessera::VariantOptions / RopeOptions defaults (include/tessera/variant.h).
    a = _C.VariantArgs()
    assert (a.window_left, a.num_sink_tokens, a.logits_soft_cap, a.pos_encoding) == (-1, 0, 0.0, _C.PosEncoding.none)
    assert (a.rope_scale, a.rope_theta) == (1.0, 1e4)
    assert (a.llama31_factor, a.llama31_low_freq_factor, a.llama31_high_freq_factor,
            a.llama31_original_max_position) == (8.0, 1.0, 4.0, 8192.0)
    assert (a.sigmoid, a.sigmoid_bias, a.user_name, a.user_use_softmax) == (False, 0.0, "", True)
    with pytest.raises(TypeError):
        _C.VariantArgs(3)  # keyword-only


def _variant_args(**options):
    """The tessera._C.VariantArgs the Python layer builds for these options (None: the default
    variant, no VariantArgs at all)."""
    flashinfer = {k: options.pop(k, d) for k, d in (("pos_encoding_mode", "NONE"), ("window_left", -1),
                                                    ("logits_soft_cap", None), ("rope_scale", None),
                                                    ("rope_theta", None))}
    variant = U.resolve_variant(flashinfer["pos_encoding_mode"], flashinfer["window_left"],
                                flashinfer["logits_soft_cap"], flashinfer["rope_scale"], flashinfer["rope_theta"],
                                **options)
    return variant.kwargs(None).get("variant")


def test_default_variant_passes_no_variant_args():
    # The prebuilt (ahead-of-time) kernels run: nothing JIT-specific reaches the bindings.
    assert _variant_args() is None
    assert _variant_args(rope_scale=3.0) is None  # rope_* without RoPE are ignored, as in FlashInfer


def test_llama31_defaults_and_mapping():
    # FlashInfer's apply_llama31_rope convention: rope_scale is the frequency factor (default 8),
    # rope_theta defaults to 5e5, positions are not divided (the C++ rope.scale stays 1).
    a = _variant_args(pos_encoding_mode="ROPE_LLAMA31")
    assert a.pos_encoding == _C.PosEncoding.rope_llama31
    assert (a.llama31_factor, a.rope_theta, a.rope_scale) == (8.0, 5e5, 1.0)
    assert (a.llama31_low_freq_factor, a.llama31_high_freq_factor, a.llama31_original_max_position) == (1.0, 4.0, 8192.0)
    a = _variant_args(pos_encoding_mode="ROPE_LLAMA31", rope_scale=32.0, rope_theta=1e6, low_freq_factor=2,
                      high_freq_factor=8.0, old_context_len=4096)
    assert (a.llama31_factor, a.rope_theta, a.rope_scale) == (32.0, 1e6, 1.0)
    assert (a.llama31_low_freq_factor, a.llama31_high_freq_factor, a.llama31_original_max_position) == (2.0, 8.0, 4096.0)
    # ROPE_LLAMA keeps FlashInfer's attention convention: positions divided by rope_scale.
    a = _variant_args(pos_encoding_mode="ROPE_LLAMA", rope_scale=4.0)
    assert (a.pos_encoding, a.rope_scale, a.rope_theta) == (_C.PosEncoding.rope_llama, 4.0, 1e4)


def test_sinks_and_sigmoid_reach_the_bindings():
    a = _variant_args(window_left=64, num_sink_tokens=4)
    assert (a.window_left, a.num_sink_tokens, a.sigmoid) == (64, 4, False)
    a = _variant_args(use_sigmoid=True, sigmoid_bias=-1.5)
    assert (a.sigmoid, a.sigmoid_bias, a.window_left) == (True, -1.5, -1)
    assert _variant_args(use_sigmoid=True).sigmoid_bias == 0.0


def test_variant_spec_reaches_the_bindings():
    spec = tessera.VariantSpec("doc_mask", "// hooks", params={"n": 3, "x": 0.5, "big": 2**40}, use_softmax=False)
    a = _variant_args(variant=spec)
    assert (a.user_name, a.user_use_softmax) == ("doc_mask", False)
    assert spec._variant_args()["user_params"] == [("n", 3), ("x", 0.5), ("big", 2**40)]
    assert spec._variant_args()["user_source"] == "// hooks"


# --- option errors, named, before any GPU work ---------------------------------------------------


def _single_decode(**options):
    q = torch.zeros(8, 128, dtype=torch.float16)
    k = torch.zeros(10, 2, 128, dtype=torch.float16)
    tessera.single_decode_with_kv_cache(q, k, k, **options)


def _single_prefill(**options):
    q = torch.zeros(3, 8, 128, dtype=torch.float16)
    k = torch.zeros(10, 2, 128, dtype=torch.float16)
    tessera.single_prefill_with_kv_cache(q, k, k, **options)


# (name, call, the error of a call whose options all pass: the first GPU step)
ENTRIES = [
    ("single_decode", _single_decode, Q_ON_CPU),
    ("single_prefill", _single_prefill, Q_ON_CPU),
    ("decode.plan", lambda **o: _decode_plan(D(_ws()), **o), WORKSPACE_ON_CPU),
    ("prefill_paged.plan", lambda **o: _paged_plan(P(_ws()), **o), WORKSPACE_ON_CPU),
    ("prefill_ragged.plan", lambda **o: _ragged_plan(R(_ws()), **o), WORKSPACE_ON_CPU),
]
SINGLE = ENTRIES[:2]
WRAPPERS = ENTRIES[2:]

ACCEPTED = [
    {"pos_encoding_mode": "ROPE_LLAMA31"},
    {"pos_encoding_mode": "ROPE_LLAMA31", "rope_scale": 16.0, "rope_theta": 1e6, "low_freq_factor": 0.5,
     "high_freq_factor": 2.0, "old_context_len": 2048},
    {"pos_encoding_mode": "ROPE_LLAMA31", "window_left": 32, "num_sink_tokens": 4, "logits_soft_cap": 30.0},
    {"window_left": 0, "num_sink_tokens": 1},
    {"window_left": 100, "num_sink_tokens": 2**31 - 1, "pos_encoding_mode": "ALIBI"},
]


def _id(opts):
    return ",".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
@pytest.mark.parametrize("opts", ACCEPTED, ids=_id)
def test_options_accepted(entry, opts):
    _, call, first_gpu_step = entry
    with pytest.raises(ValueError, match=first_gpu_step):
        call(**opts)


OPTION_ERRORS = [
    ({"pos_encoding_mode": "ROPE_LLAMA_31"}, ValueError, r"pos_encoding_mode = 'ROPE_LLAMA_31', expected one of .*'ROPE_LLAMA31'"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "rope_scale": 0.0}, ValueError, r"rope_scale = 0.0, expected None \(8.0\)"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "rope_theta": 1.0}, ValueError, r"rope_theta = 1.0, expected None \(500000"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "low_freq_factor": 0.0}, ValueError, r"low_freq_factor = 0.0, expected None \(1\)"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "high_freq_factor": float("nan")}, ValueError, "high_freq_factor = nan"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "old_context_len": -8192}, ValueError, "old_context_len = -8192"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "old_context_len": "8k"}, TypeError, "old_context_len must be a float"),
    ({"pos_encoding_mode": "ROPE_LLAMA31", "low_freq_factor": 4.0, "high_freq_factor": 4.0}, ValueError,
     "high_freq_factor = 4 must be greater than low_freq_factor = 4"),
    ({"low_freq_factor": 1.0}, ValueError, r"low_freq_factor = 1.0 is used only with pos_encoding_mode='ROPE_LLAMA31' "
     r"\(got pos_encoding_mode='NONE'\)"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "old_context_len": 8192}, ValueError, "old_context_len = 8192 is used only"),
    ({"num_sink_tokens": 4}, ValueError, "num_sink_tokens = 4 needs a sliding window, but window_left = -1"),
    ({"num_sink_tokens": -1, "window_left": 8}, ValueError, r"num_sink_tokens = -1, expected 0 \(off\)"),
    ({"num_sink_tokens": 2**31, "window_left": 8}, ValueError, "num_sink_tokens = 2147483648"),
    ({"num_sink_tokens": 2.0, "window_left": 8}, TypeError, "num_sink_tokens must be an int, got float"),
    ({"num_sink_tokens": True, "window_left": 8}, TypeError, "num_sink_tokens must be an int, got bool"),
    ({"sigmoid_bias": 0.5}, ValueError, r"sigmoid_bias = 0.5 is used only with use_sigmoid=True"),
    ({"use_sigmoid": 1}, TypeError, "use_sigmoid must be a bool, got int"),
    ({"use_sigmoid": True, "sigmoid_bias": float("inf")}, ValueError, "sigmoid_bias = inf, expected"),
    ({"variant": "my_variant"}, TypeError, "variant must be None or a tessera.VariantSpec, got str"),
    ({"q_rope_offset": _i32([0])}, ValueError, r"q_rope_offset is given, but pos_encoding_mode = 'NONE'; RoPE"),
    ({"k_rope_offset": 3, "pos_encoding_mode": "ALIBI"}, ValueError, "k_rope_offset is given, but pos_encoding_mode = 'ALIBI'"),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
@pytest.mark.parametrize("opts,error,message", OPTION_ERRORS, ids=[_id(c[0]) for c in OPTION_ERRORS])
def test_option_errors(entry, opts, error, message):
    with pytest.raises(error, match=message):
        entry[1](**opts)


@pytest.mark.parametrize("entry", WRAPPERS, ids=[e[0] for e in WRAPPERS])
def test_plans_without_softmax_reach_the_runtime(entry):
    # Sigmoid attention and user variants without softmax run through the runtime (which never splits
    # their KV: there is no log-sum-exp to merge by); their plans get as far as the first GPU step.
    _, call, first_gpu_step = entry
    for opts in ({"use_sigmoid": True, "sigmoid_bias": 1.0}, {"variant": tessera.VariantSpec("weights", "",
                                                                                             use_softmax=False)},
                 {"variant": tessera.VariantSpec("mine", "")}):
        with pytest.raises(ValueError, match=first_gpu_step):
            call(**opts)


def test_plan_dicts_refuse_lse_without_softmax():
    # run(return_lse=True) of such a plan is a ValueError before any device work (the plan dict keeps
    # the reason; the C++ runtime would write NaN).
    from tessera import _utils as U
    sig = U.resolve_variant("NONE", -1, None, None, None, use_sigmoid=True)
    assert sig.no_lse_reason() == ("return_lse=True with use_sigmoid=True: attention without softmax has no "
                                   "log-sum-exp (pass return_lse=False)")
    weights = U.resolve_variant("NONE", -1, None, None, None, variant=tessera.VariantSpec("w", "", use_softmax=False))
    assert "(use_softmax=False): attention without softmax" in weights.no_lse_reason()
    assert U.resolve_variant("NONE", -1, None, None, None).no_lse_reason() is None
    from tessera.decode import _check_run_queries
    with pytest.raises(ValueError, match=r"^return_lse=True with use_sigmoid=True"):
        _check_run_queries(None, None, None, True, {"no_lse": sig.no_lse_reason()})


@pytest.mark.parametrize("entry", SINGLE, ids=[e[0] for e in SINGLE])
def test_single_functions_accept_sigmoid_and_user_variants(entry):
    for opts in ({"use_sigmoid": True}, {"use_sigmoid": True, "sigmoid_bias": -2.0, "window_left": 5},
                 {"variant": tessera.VariantSpec("mine", "", {"x": 1.0})},
                 {"variant": tessera.VariantSpec("mine", "", use_softmax=False)}):
        with pytest.raises(ValueError, match=Q_ON_CPU):
            entry[1](**opts)


@pytest.mark.parametrize("entry", SINGLE, ids=[e[0] for e in SINGLE])
def test_no_lse_without_softmax(entry):
    with pytest.raises(ValueError, match=r"return_lse=True with use_sigmoid=True: attention without softmax has no "
                       "log-sum-exp"):
        entry[1](use_sigmoid=True, return_lse=True)
    spec = tessera.VariantSpec("weights", "", use_softmax=False)
    with pytest.raises(ValueError, match=r"return_lse=True with variant=VariantSpec\('weights'.*use_softmax=False"):
        entry[1](variant=spec, return_lse=True)
    with pytest.raises(ValueError, match=Q_ON_CPU):  # a softmax user variant has an LSE
        entry[1](variant=tessera.VariantSpec("softmax", ""), return_lse=True)


# --- per-request RoPE offsets ----------------------------------------------------------------------

ROPE = {"pos_encoding_mode": "ROPE_LLAMA"}


@pytest.mark.parametrize("entry", SINGLE, ids=[e[0] for e in SINGLE])
def test_single_rope_offsets(entry):
    for value in (7, -3, _i32([5])):
        with pytest.raises(ValueError, match=Q_ON_CPU):
            entry[1](q_rope_offset=value, k_rope_offset=value, **ROPE)
    with pytest.raises(ValueError, match="q_rope_offset has 2 entries, expected 1"):
        entry[1](q_rope_offset=_i32([1, 2]), **ROPE)
    with pytest.raises(TypeError, match=r"k_rope_offset.dtype = torch.int64, expected torch.int32"):
        entry[1](k_rope_offset=torch.tensor([1]), **ROPE)
    with pytest.raises(ValueError, match=r"q_rope_offset = 2147483648, expected a 32-bit integer"):
        entry[1](q_rope_offset=2**31, **ROPE)
    with pytest.raises(TypeError, match="q_rope_offset must be an int32 tensor of 1 elements .*got bool"):
        entry[1](q_rope_offset=True, **ROPE)
    with pytest.raises(TypeError, match="q_rope_offset must be an int or an int32 tensor, got float"):
        entry[1](q_rope_offset=1.0, **ROPE)


@pytest.mark.parametrize("entry", WRAPPERS, ids=[e[0] for e in WRAPPERS])
def test_plan_rope_offsets(entry):
    # Two requests in every plan above: int32 [2] on the CPU (or the workspace's GPU).
    with pytest.raises(ValueError, match=WORKSPACE_ON_CPU):
        entry[1](q_rope_offset=_i32([3, 0]), k_rope_offset=_i32([-2, 9]), pos_encoding_mode="ROPE_LLAMA31")
    with pytest.raises(ValueError, match="k_rope_offset has 3 entries, expected 2"):
        entry[1](k_rope_offset=_i32([1, 2, 3]), **ROPE)
    with pytest.raises(TypeError, match="q_rope_offset must be an int32 tensor of 2 elements .*got int"):
        entry[1](q_rope_offset=4, **ROPE)
    with pytest.raises(ValueError, match="k_rope_offset has shape"):
        entry[1](k_rope_offset=_i32([[1, 2]]), **ROPE)


def test_rope_offset_tensor():
    assert U.rope_offset_tensor(None, torch.device("cpu")) is None
    t = U.rope_offset_tensor(-5, torch.device("cpu"))
    assert t.dtype == torch.int32 and t.tolist() == [-5]
    host = _i32([1, 2])
    assert torch.equal(U.rope_offset_tensor(host, torch.device("cpu")), host)


def test_graph_mode_rope_offsets_keep_one_address():
    # With use_cuda_graph the plan's offsets live in rows of one buffer the wrapper made (a captured
    # run() has the address baked in); values are copied in at every plan. The CPU stands in for the
    # device here: the mechanism is device-independent.
    from tessera._runtime import _RopeOffsets

    cpu = torch.device("cpu")
    offsets = _RopeOffsets(use_cuda_graph=True, max_batch=4)
    q1, k1 = offsets.plan_tensors(_i32([1, 2, 3]), _i32([7, 8, 9]), 3, cpu)
    q2, k2 = offsets.plan_tensors(_i32([4, 5]), _i32([0, -1]), 2, cpu)
    assert q1.data_ptr() == q2.data_ptr() and k1.data_ptr() == k2.data_ptr() != q1.data_ptr()
    assert q2.tolist() == [4, 5] and k2.tolist() == [0, -1] and list(q2.shape) == [2]
    assert offsets.kept == (q2, k2)
    assert offsets.plan_tensors(None, None, 2, cpu) == (None, None)
    eager = _RopeOffsets(use_cuda_graph=False, max_batch=None)
    t = _i32([1, 2])
    assert eager.plan_tensors(t, None, 2, cpu)[0] is t  # used as given, kept for the plan's runs


# --- q_len_per_req and fast_decode_plan ------------------------------------------------------------


@pytest.mark.parametrize("value,error,message", [
    (0, ValueError, "q_len_per_req = 0, expected >= 1"),
    (-2, ValueError, "q_len_per_req = -2, expected >= 1"),
    (2.0, TypeError, "q_len_per_req must be an int, got float"),
    (True, TypeError, "q_len_per_req must be an int, got bool"),
])
def test_q_len_per_req_errors(value, error, message):
    with pytest.raises(error, match=message):
        _decode_plan(D(_ws()), q_len_per_req=value)


def test_q_len_per_req_needs_the_tokens_in_the_cache():
    # kv_lens 21 and 16 (page size 16): up to 16 query tokens per request are planned.
    for n in (1, 2, 16):
        with pytest.raises(ValueError, match=WORKSPACE_ON_CPU):
            _decode_plan(D(_ws()), q_len_per_req=n)
    with pytest.raises(ValueError, match=r"q_len_per_req = 17 needs kv_len >= 17 for every request .* request 1 has "
                       r"kv_len = 16"):
        _decode_plan(D(_ws()), q_len_per_req=17)
    # A request without pages has kv_len 0 (its last_page_len is ignored).
    with pytest.raises(ValueError, match="request 0 has kv_len = 0"):
        _decode_plan(D(_ws()), indptr=_i32([0, 0, 3]), last_page_len=_i32([9, 1]), q_len_per_req=2)


def test_kv_lens_cover_queries():
    from tessera.decode import _check_kv_lens_cover_queries as check

    # pages [3, 0, 1], last pages [5, 7 (ignored), 1], page size 4: kv_lens [13, 0, 1]
    indptr, last = _i32([0, 3, 3, 4]), _i32([5, 7, 1])
    with pytest.raises(ValueError, match="request 1 has kv_len = 0"):
        check(indptr, last, 4, 1)
    check(_i32([0, 3, 4]), _i32([1, 4]), 4, 4)  # kv_lens 9 and 4
    with pytest.raises(ValueError, match="request 1 has kv_len = 4"):
        check(_i32([0, 3, 4]), _i32([1, 4]), 4, 5)


def test_fast_decode_plan_checks():
    with pytest.raises(TypeError, match="fast_decode_plan: self must be a BatchDecodeWithPagedKVCacheWrapper, got "
                       "BatchPrefillWithPagedKVCacheWrapper"):
        tessera.fast_decode_plan(P(_ws()), _i32([0, 1]), _i32([0]), _i32([1]), 8, 2, 128, 16)
    w = D(_ws())
    args = (_i32([0, 2, 3]), _i32([0, 1, 2]), _i32([5, 16]), 8, 2, 128, 16)
    # Everything passes; the plan stops at its first GPU step, as plan() does.
    with pytest.raises(ValueError, match=WORKSPACE_ON_CPU):
        tessera.fast_decode_plan(w, *args)
    with pytest.raises(ValueError, match=WORKSPACE_ON_CPU):
        tessera.fast_decode_plan(w, *args, global_override_indptr_cpu=_i32([0, 2, 3]), q_len_per_req=2,
                                 data_type="bfloat16")
    # The options are checked as plan()'s, the override as an indptr.
    with pytest.raises(ValueError, match="window_left = -3"):
        tessera.fast_decode_plan(w, *args, window_left=-3)
    with pytest.raises(TypeError, match=r"global_override_indptr_cpu.dtype = torch.int64, expected torch.int32"):
        tessera.fast_decode_plan(w, *args, global_override_indptr_cpu=torch.tensor([0, 2, 3]))
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1, expected >= 2"):
        tessera.fast_decode_plan(w, *args, global_override_indptr_cpu=_i32([0, 2, 1]))
    with pytest.raises(ValueError, match="q_len_per_req = 0"):
        tessera.fast_decode_plan(w, *args, q_len_per_req=0)


def test_fast_decode_plan_page_size_1_does_not_read_last_page_len():
    # Every last page of a page-size-1 cache holds one token: last_page_len is not copied or read
    # (None passes); plan() itself needs it.
    w = D(_ws())
    with pytest.raises(ValueError, match=WORKSPACE_ON_CPU):
        tessera.fast_decode_plan(w, _i32([0, 2, 3]), _i32([0, 1, 2]), None, 8, 2, 128, 1)
    with pytest.raises(TypeError, match="last_page_len must be a torch.Tensor"):
        w.plan(_i32([0, 2, 3]), _i32([0, 1, 2]), None, 8, 2, 128, 1)


# --- tessera.VariantSpec -----------------------------------------------------------------------------


def test_variant_spec_attributes():
    bias = torch.zeros(4)
    spec = tessera.VariantSpec("alibi_like", "float logits_transform(...);", {"slope": 0.5, "n": 2})
    assert (spec.name, spec.source, spec.use_softmax) == ("alibi_like", "float logits_transform(...);", True)
    assert spec.params == {"slope": 0.5, "n": 2}
    spec.params["slope"] = 9.0  # a copy
    assert spec.params["slope"] == 0.5
    assert repr(spec) == "VariantSpec('alibi_like', <28 characters of source>, params={slope=0.5, n=2}, use_softmax=True)"
    assert tessera.VariantSpec("empty", "").params == {}
    with pytest.raises(AttributeError):
        spec.name = "other"
    with pytest.raises(ValueError, match=r"params\['b'\] is on cpu, expected a CUDA tensor"):
        tessera.VariantSpec("v", "", {"b": bias})


@pytest.mark.parametrize("args,kwargs,error,message", [
    ((None, ""), {}, TypeError, "name must be a str, got NoneType"),
    (("", ""), {}, ValueError, "name is empty"),
    (("v", b"float x;"), {}, TypeError, r"source must be a str \(CUDA C\+\+ code\), got bytes"),
    (("v", ""), {"use_softmax": 0}, TypeError, "use_softmax must be a bool, got int"),
    (("v", "", [("a", 1)]), {}, TypeError, "params must be a mapping of name to value, got list"),
    (("v", "", {f"p{i}": i for i in range(17)}), {}, ValueError, "17 params, expected at most 16"),
    (("v", "", {"2x": 1}), {}, ValueError, r"params\['2x'\]: the name is not a C identifier"),
    (("v", "", {"a-b": 1}), {}, ValueError, "not a C identifier"),
    (("v", "", {3: 1}), {}, TypeError, "params has a key of type int, expected str"),
    (("v", "", {"flag": False}), {}, TypeError, r"params\['flag'\] is a bool, expected an int, a float or a tensor"),
    (("v", "", {"x": float("nan")}), {}, ValueError, r"params\['x'\] = nan, expected a finite value"),
    (("v", "", {"x": 2**63}), {}, ValueError, r"params\['x'\] = 9223372036854775808 does not fit in 64 bits"),
    (("v", "", {"x": "1"}), {}, TypeError, r"params\['x'\] is a str, expected an int, a float or a torch.Tensor"),
    (("v", "", {"t": torch.zeros(2, dtype=torch.float64)}), {}, TypeError, r"params\['t'\].dtype = torch.float64"),
    (("v", "", {"t": torch.zeros(2, dtype=torch.int64)}), {}, TypeError, r"params\['t'\].dtype = torch.int64"),
])
def test_variant_spec_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        tessera.VariantSpec(*args, **kwargs)


def test_variant_spec_limits_match_cpp():
    from tessera import variant

    assert variant.MAX_PARAMS == 16  # tessera::kMaxVariantParams
    tessera.VariantSpec("v", "", {f"p{i}": float(i) for i in range(16)})
    tessera.VariantSpec("v", "", {"lo": -(2**63), "hi": 2**63 - 1, "f": math.pi})


# --- what the wrappers hand the C++ runtime (stand-ins for the runtime classes) ---------------------


class _RuntimeStandIn(RecordingRuntime):
    """Records what a wrapper passes to a C++ runtime class, each instance listed in its class's
    `instances`."""

    def __init__(self, workspace, bounds, options):
        super().__init__(workspace, bounds, options)
        type(self).instances.append(self)


@pytest.fixture
def runtime_stand_ins(monkeypatch, install_runtime_stand_ins):
    """The three runtime classes replaced by recorders, _C.VariantArgs by the dict of its keywords,
    and the device checks lifted, so a plan on the CPU goes through to the runtime call."""
    monkeypatch.setattr(_C, "VariantArgs", lambda **kwargs: kwargs)
    return install_runtime_stand_ins(("BatchDecodeWrapper", "BatchPrefillPagedWrapper", "BatchPrefillRaggedWrapper"),
                                     _RuntimeStandIn, lambda: {"instances": []})


def test_q_len_per_req_runs_the_prefill_runtime(runtime_stand_ins):
    decode, prefill = runtime_stand_ins["BatchDecodeWrapper"], runtime_stand_ins["BatchPrefillPagedWrapper"]
    w = D(_ws())
    _decode_plan(w, q_len_per_req=3, pos_encoding_mode="ROPE_LLAMA31", q_rope_offset=_i32([5, 6]))
    assert not decode.instances and len(prefill.instances) == 1
    runtime = prefill.instances[0]
    args, kwargs = runtime.plans[-1]
    qo_indptr, kv_indptr, last_page_len, page_size, hq, hkv, d = args[:7]
    assert qo_indptr.tolist() == [0, 3, 6] and kv_indptr.tolist() == [0, 2, 3] and last_page_len.tolist() == [5, 16]
    assert (page_size, hq, hkv, d) == (16, 8, 2, 128)
    assert args[9] is True  # causal among a request's tokens
    assert runtime.bounds.max_total_qo_tokens >= 6 and runtime.bounds.max_batch_size >= 2
    variant = kwargs["variant"]
    assert variant["pos_encoding"] == _C.PosEncoding.rope_llama31 and variant["rope_q_offset"].tolist() == [5, 6]
    assert variant["rope_k_offset"] is None
    # run(): batch_size * q_len_per_req rows.
    kv = torch.zeros(3, 2, 16, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"q has 2 rows, expected 6: the plan has q_len_per_req = 3"):
        w.run(torch.zeros(2, 8, 128, dtype=torch.float16), kv)
    w.run(torch.zeros(6, 8, 128, dtype=torch.float16), kv)
    assert len(runtime.runs) == 1 and runtime.runs[0][0][0].shape[0] == 6
    # One token per request again: the decode runtime, built after the prefill one is dropped.
    _decode_plan(w)
    assert len(decode.instances) == 1 and w._holder.cpp is decode.instances[0]
    assert decode.instances[0].plans[-1][1] == {"kv_dtype": None}  # the default variant: no VariantArgs


def test_fast_decode_plan_host_shortcuts(runtime_stand_ins):
    decode = runtime_stand_ins["BatchDecodeWrapper"]
    indptr_buf, indices_buf, last_buf = _i32([-7] * 3), _i32([0] * 8), _i32([-7] * 2)
    w = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(_ws(), indptr_buf, indices_buf, last_buf)
    # The host indptr replaces indptr (never read here), page size 1 replaces last_page_len.
    unread = _i32([0, 9, 9])
    tessera.fast_decode_plan(w, unread, _i32([4, 1, 6]), None, 8, 2, 128, 1,
                             global_override_indptr_cpu=_i32([0, 2, 3]), data_type="bfloat16")
    args, _ = decode.instances[0].plans[-1]
    assert args[0].tolist() == [0, 2, 3] and args[1].tolist() == [1, 1] and args[2] == 1
    assert args[6] == _C.DType.bf16
    # The page ids reach the preallocated buffer run() reads; indptr / last_page_len buffers are the caller's.
    assert indices_buf[:3].tolist() == [4, 1, 6]
    assert indptr_buf.tolist() == [-7] * 3 and last_buf.tolist() == [-7] * 2
    w.plan(_i32([0, 2, 3]), _i32([4, 1, 6]), _i32([1, 1]), 8, 2, 128, 1, q_data_type="bfloat16")
    assert indptr_buf.tolist() == [0, 2, 3] and last_buf.tolist() == [1, 1]
    assert len(decode.instances) == 1  # one runtime for the graph's life


def test_graph_plans_point_at_fixed_offset_rows(runtime_stand_ins):
    prefill = runtime_stand_ins["BatchPrefillPagedWrapper"]
    w = P(_ws(), "NHD", True, _i32([0] * 3), _i32([0] * 3), _i32([0] * 8), _i32([0] * 2))
    pointers = set()
    for offsets in ([1, 2], [30, -4]):
        _paged_plan(w, pos_encoding_mode="ROPE_LLAMA", k_rope_offset=_i32(offsets))
        variant = prefill.instances[0].plans[-1][1]["variant"]
        assert variant["rope_k_offset"].tolist() == offsets and variant["rope_q_offset"] is None
        pointers.add(variant["rope_k_offset"].data_ptr())
    assert len(pointers) == 1, "a captured run() reads the offsets at one address"


def test_jit_args_plan_and_run_reach_the_runtime(runtime_stand_ins):
    decode = runtime_stand_ins["BatchDecodeWrapper"]
    from test_jit_args import SIGMOID

    jit = ("sigmoid_uri", torch.float16, torch.float16, torch.float16, torch.int32, 128, [], [],
           ["s", "sigmoid_bias"], ["float", "double"], "FlashSigmoid", SIGMOID)
    w = D(_ws(), jit_args=jit)
    _decode_plan(w)
    runtime = decode.instances[0]
    args, kwargs = runtime.plans[-1]
    assert args[7] == 1.0  # sm_scale: the variant scales its logits itself
    variant = kwargs["variant"]
    assert variant["user_name"] == "FlashSigmoid (jit_args sigmoid_uri)" and variant["user_use_softmax"] is False
    assert variant["user_params"] == [("s", 0.0), ("sigmoid_bias", 0.0)]  # placeholders until a run
    assert "float logits_transform(" in variant["user_source"] and SIGMOID in variant["user_source"]
    q, kv = torch.zeros(2, 8, 128, dtype=torch.float16), torch.zeros(3, 2, 16, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"return_lse=True with variant=.*use_softmax=False"):
        w.run(q, kv, 0.1, 0.0, return_lse=True)
    w.run(q, kv, 0.125, 1)  # an int for a float scalar is converted
    assert runtime.variant_params[-1] == [("s", 0.125), ("sigmoid_bias", 1.0)]
    assert isinstance(runtime.variant_params[-1][1][1], float) and len(runtime.runs) == 1
    with pytest.raises(TypeError, match=r"got 1 additional argument\(s\) after the KV cache, expected 2 "
                                        r"\(s, sigmoid_bias\)"):
        w.run(q, kv, 0.1)
    with pytest.raises(TypeError, match=r"additional scalar 'sigmoid_bias' = True, expected a Python number"):
        w.run(q, kv, 0.1, True)
    # A plan after runs keeps their values (a CUDA-graph wrapper's captured run has them baked in).
    _decode_plan(w)
    assert runtime.plans[-1][1]["variant"]["user_params"] == [("s", 0.125), ("sigmoid_bias", 1.0)]
    with pytest.raises(ValueError, match=r"sm_scale = 0.5 with jit_args"):
        _decode_plan(w, sm_scale=0.5)
    with pytest.raises(ValueError, match=r"variant=.* with jit_args"):
        _decode_plan(w, variant=tessera.VariantSpec("mine", ""))
    with pytest.raises(NotImplementedError, match=r"with jit_args the variant is the JIT module's"):
        _decode_plan(w, window_left=3)
    with pytest.raises(ValueError, match=r"head_dim_qk = 64, but jit_args declares 128"):
        _decode_plan(w, head_dim=64)
    with pytest.raises(NotImplementedError, match=r"fast_decode_plan of a wrapper with jit_args"):
        tessera.fast_decode_plan(w, _i32([0, 2, 3]), _i32([0, 1, 2]), _i32([5, 16]), 8, 2, 128, 16)

