"""Tests of the Python package that need no GPU (they also pass on a machine with one).

They cover the import, the version, `python -m tessera`, FlashInfer-compatible signatures, the
argument checks that happen before any GPU work, the mapping of C++ errors onto Python
exceptions, the DLPack conversion of host tensors, and the pure-PyTorch page helpers. What needs
the GPU (building the C++ runtime in plan(), every kernel) is in test_gpu.py.
"""

import inspect
import os
import re
import subprocess
import sys

import pytest

import tessera
from tessera import _C

torch = pytest.importorskip("torch", reason="the wrappers take torch tensors: pip install torch")

HAS_GPU = _C.cuda_device_count() > 0


def _run_python(code_or_args, **kw):
    args = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, **kw)


def _ws():
    """A workspace on the CPU: enough to construct wrappers, never enough to plan."""
    return torch.empty(1 << 20, dtype=torch.uint8)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


# --- import, version, python -m tessera ----------------------------------------------------------


def test_import_does_not_import_torch():
    r = _run_python("import sys, tessera; print('torch' in sys.modules, tessera.__version__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "False"


def test_version_matches_header(repo_root):
    text = open(os.path.join(repo_root, "include", "tessera", "version.h")).read()
    parts = [re.search(rf"TESSERA_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert tessera.__version__ == ".".join(parts)
    assert _C.version() == tessera.__version__


def test_python_m_tessera():
    r = _run_python(["-m", "tessera"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"tessera {tessera.__version__}\n")
    if HAS_GPU:
        assert re.search(r"^GPU 0: .+ \(sm_\d+", out, re.M), out
    else:
        assert re.search(r"^GPU: none \(no CUDA (driver|device): .*nvidia-smi", out, re.M), out
    assert "kernels compiled for: sm_" in out
    for family in ("decode", "prefill (FA2-class)", "runtime", "merge", "append"):
        assert re.search(rf"^  {re.escape(family)} ", out, re.M), f"{family} missing from:\n{out}"
    assert "head_dim 64, 96, 128, 256; float16, bfloat16" in out
    assert "float16, bfloat16, float32" in out


def test_build_info():
    info = tessera.build_info()
    assert info["version"] == tessera.__version__
    assert info["cuda_archs"] and all(re.fullmatch(r"\d+a?", a) for a in info["cuda_archs"])
    assert list(_C.supported_head_dims()) == [64, 96, 128, 256]
    assert len(info["gpus"]) == _C.cuda_device_count()
    assert {k["family"] for k in info["kernels"]} == {"decode", "prefill (FA2-class)", "runtime", "mla", "merge", "append",
                                                       "rope"}


def test_typing_files_are_shipped():
    pkg = os.path.dirname(tessera.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    stub = open(os.path.join(pkg, "_C.pyi")).read()
    declared = set(re.findall(r"^(?:def|class) (\w+)", stub, re.M))
    public = {n for n in dir(_C) if not n.startswith("_")}
    assert public <= declared, f"_C.pyi lacks {sorted(public - declared)} (regenerate it, see its header)"


def test_stub_matches_the_bindings():
    # The stub is generated (scripts/gen-python-stub.py); stubgen's format is its nanobind
    # version's, so the comparison runs where the stub's nanobind runs (CI).
    nanobind = pytest.importorskip("nanobind", reason="nanobind generates the stub")
    pkg = os.path.dirname(tessera.__file__)
    generated_with = re.search(r"^# nanobind (\S+), python (\S+)$", open(os.path.join(pkg, "_C.pyi")).read(), re.M)
    assert generated_with, "_C.pyi has no '# nanobind <v>, python <v>' line: regenerate it (scripts/gen-python-stub.py)"
    here = (nanobind.__version__, f"{sys.version_info.major}.{sys.version_info.minor}")
    if generated_with.groups() != here:
        pytest.skip(f"_C.pyi was generated with nanobind {generated_with.group(1)} on python {generated_with.group(2)}, "
                    f"this is nanobind {here[0]} on python {here[1]}")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gen-python-stub.py")
    result = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert result.returncode == 0, (
        f"_C.pyi is stale: run PYTHONPATH=<build>/python python3 scripts/gen-python-stub.py\n{result.stdout}{result.stderr}")


PUBLIC = [
    tessera.BatchDecodeWithPagedKVCacheWrapper,
    tessera.BatchPrefillWithPagedKVCacheWrapper,
    tessera.BatchPrefillWithRaggedKVCacheWrapper,
    tessera.single_decode_with_kv_cache,
    tessera.single_prefill_with_kv_cache,
    tessera.single_prefill_with_kv_cache_return_lse,
    tessera.merge_state,
    tessera.merge_state_in_place,
    tessera.merge_states,
    tessera.append_paged_kv_cache,
    tessera.append_paged_mla_kv_cache,
    tessera.get_batch_indices_positions,
    tessera.get_seq_lens,
    tessera.build_info,
    tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    tessera.BlockSparseAttentionWrapper,
    tessera.merge_states_ragged,
    tessera.flex_attention,
    tessera.create_block_mask,
    tessera.create_mask,
    tessera.and_masks,
    tessera.or_masks,
    tessera.noop_mask,
    tessera.BlockMask,
]


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_docstrings(obj):
    assert inspect.getdoc(obj), f"{obj.__name__} has no docstring"
    if inspect.isclass(obj):
        for name, member in inspect.getmembers(obj):
            if name.startswith("_") and name != "__init__":
                continue
            if callable(member) or isinstance(member, property):
                assert inspect.getdoc(member), f"{obj.__name__}.{name} has no docstring"


# --- FlashInfer-compatible signatures ------------------------------------------------------------


def _params(f):
    return [p for p in inspect.signature(f).parameters if p != "self"]


def test_cuda_graph_decode_wrapper_signature_matches_flashinfer():
    assert _params(tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__) == [
        "workspace_buffer", "indptr_buffer", "indices_buffer", "last_page_len_buffer", "kv_layout",
        "use_tensor_cores"]


def test_signatures_match_flashinfer():
    D, P, R = (tessera.BatchDecodeWithPagedKVCacheWrapper, tessera.BatchPrefillWithPagedKVCacheWrapper,
               tessera.BatchPrefillWithRaggedKVCacheWrapper)
    assert _params(D.__init__) == [
        "float_workspace_buffer", "kv_layout", "use_cuda_graph", "use_tensor_cores", "paged_kv_indptr_buffer",
        "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer", "backend", "jit_args"]
    assert _params(D.plan)[:17] == [
        "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
        "pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "data_type",
        "sm_scale", "rope_scale", "rope_theta", "non_blocking"]
    assert _params(D.run)[:2] == ["q", "paged_kv_cache"]
    for name in ("out", "lse", "return_lse", "q_scale", "k_scale", "v_scale", "enable_pdl", "window_left"):
        assert inspect.signature(D.run).parameters[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert _params(P.__init__) == [
        "float_workspace_buffer", "kv_layout", "use_cuda_graph", "qo_indptr_buf", "paged_kv_indptr_buf",
        "paged_kv_indices_buf", "paged_kv_last_page_len_buf", "custom_mask_buf", "mask_indptr_buf", "backend",
        "jit_args", "jit_kwargs"]
    assert _params(P.plan)[:22] == [
        "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads", "num_kv_heads",
        "head_dim_qk", "page_size", "head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
        "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap", "rope_scale", "rope_theta",
        "q_data_type", "kv_data_type", "non_blocking"]
    assert _params(P.run)[:2] == ["q", "paged_kv_cache"]
    assert _params(R.__init__) == [
        "float_workspace_buffer", "kv_layout", "use_cuda_graph", "qo_indptr_buf", "kv_indptr_buf", "custom_mask_buf",
        "mask_indptr_buf", "backend", "jit_args", "jit_kwargs"]
    assert _params(R.plan)[:19] == [
        "qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "custom_mask",
        "packed_custom_mask", "causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left", "logits_soft_cap",
        "sm_scale", "rope_scale", "rope_theta", "q_data_type", "kv_data_type", "non_blocking"]
    assert _params(R.run)[:3] == ["q", "k", "v"]
    # FlashInfer's arguments first (Tessera's own follow as keyword-only: test_wrapper_options.py).
    assert _params(tessera.single_decode_with_kv_cache)[:15] == [
        "q", "k", "v", "kv_layout", "pos_encoding_mode", "use_tensor_cores", "q_scale", "k_scale", "v_scale",
        "window_left", "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", "return_lse"]
    assert _params(tessera.single_prefill_with_kv_cache)[:20] == [
        "q", "k", "v", "scale_q", "scale_k", "scale_v", "o_dtype", "custom_mask", "packed_custom_mask", "causal",
        "kv_layout", "pos_encoding_mode", "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap",
        "rope_scale", "rope_theta", "backend", "return_lse"]
    assert _params(tessera.merge_state) == ["v_a", "s_a", "v_b", "s_b"]
    assert _params(tessera.merge_states) == ["v", "s"]
    assert _params(tessera.merge_state_in_place) == ["v", "s", "v_other", "s_other", "mask"]
    assert _params(tessera.append_paged_kv_cache) == [
        "append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "kv_indices", "kv_indptr",
        "kv_last_page_len", "kv_layout"]
    assert _params(tessera.append_paged_mla_kv_cache) == [
        "append_ckv", "append_kpe", "batch_indices", "positions", "ckv_cache", "kpe_cache", "kv_indices", "kv_indptr",
        "kv_last_page_len"]
    assert _params(tessera.packbits) == ["x", "bitorder"]
    assert _params(tessera.segment_packbits) == ["x", "indptr", "bitorder"]


# --- constructor checks --------------------------------------------------------------------------

WRAPPERS = [
    tessera.BatchDecodeWithPagedKVCacheWrapper,
    tessera.BatchPrefillWithPagedKVCacheWrapper,
    tessera.BatchPrefillWithRaggedKVCacheWrapper,
]


@pytest.mark.parametrize("cls", WRAPPERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("layout", ["nhd", "NDH", "", None, 0])
def test_bad_kv_layout(cls, layout):
    with pytest.raises(ValueError, match="kv_layout"):
        cls(_ws(), layout)


@pytest.mark.parametrize("cls", WRAPPERS, ids=lambda c: c.__name__)
def test_constructor_checks(cls):
    with pytest.raises(TypeError, match="float_workspace_buffer must be a torch.Tensor"):
        cls([0] * 16)
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        cls(torch.empty(4, 4, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="backend"):
        cls(_ws(), "NHD", backend="cudnn")
    for backend in ("auto", "fa2", "fa3"):  # FlashInfer's names, each mapped to Tessera's kernels
        cls(_ws(), "NHD", backend=backend)
    with pytest.raises(TypeError, match="jit_args must be FlashInfer's tuple of 12 or 13 entries"):
        cls(_ws(), "HND", jit_args=["x"])
    with pytest.raises(ValueError, match="use_cuda_graph=True needs"):
        cls(_ws(), "NHD", use_cuda_graph=True)
    w = cls(_ws(), "HND")
    q = torch.zeros(1, 8, 64, dtype=torch.float16)
    kv = torch.zeros(1, 2, 4, 16, 64, dtype=torch.float16)
    args = (q, kv[:, 0], kv[:, 1]) if cls is tessera.BatchPrefillWithRaggedKVCacheWrapper else (q, kv)
    with pytest.raises(RuntimeError, match="run\\(\\) before plan\\(\\)"):
        w.run(*args)
    with pytest.raises(NotImplementedError, match="extra positional argument.*built without jit_args"):
        w.run(*args, 1.0)


def test_prefill_constructor_mask_buffers():
    for cls in WRAPPERS[1:]:
        with pytest.raises(ValueError, match="custom_mask_buf is on cpu"):
            cls(_ws(), custom_mask_buf=torch.zeros(8, dtype=torch.uint8))
        with pytest.raises(TypeError, match="custom_mask_buf"):
            cls(_ws(), custom_mask_buf=torch.zeros(8, dtype=torch.int32))
        cls(_ws(), mask_indptr_buf=_i32([0, 1]))  # accepted: the plan uploads its own offsets


@pytest.mark.parametrize("cls,plan", [(tessera.BatchPrefillWithPagedKVCacheWrapper, "paged"),
                                      (tessera.BatchPrefillWithRaggedKVCacheWrapper, "ragged")], ids=["paged", "ragged"])
def test_plan_custom_mask_checks(cls, plan):
    """The batch custom mask's shape, dtype and size are checked in plan() before any GPU work."""
    plan_fn = _paged_plan if plan == "paged" else _ragged_plan
    w = cls(_ws())
    with pytest.raises(ValueError, match=r"custom_mask has shape \(2, 2\), expected 1 dimension"):
        plan_fn(w, custom_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="custom_mask"):
        plan_fn(w, custom_mask=torch.ones(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"custom_mask has 4 elements, expected sum\(qo_len \* kv_len\)"):
        plan_fn(w, custom_mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"packed_custom_mask has 1 bytes, expected >= "):
        plan_fn(w, packed_custom_mask=torch.ones(1, dtype=torch.uint8))


def test_cuda_graph_buffer_checks():
    D = tessera.BatchDecodeWithPagedKVCacheWrapper
    with pytest.raises(ValueError, match="paged_kv_indices_buffer"):
        D(_ws(), "NHD", True, False, _i32([0] * 5), None, _i32([1] * 4))
    with pytest.raises(TypeError, match="paged_kv_indptr_buffer.dtype"):
        D(_ws(), "NHD", True, False, torch.zeros(5, dtype=torch.int64), _i32([0] * 9), _i32([1] * 4))
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer has 4 entries, expected 5"):
        D(_ws(), "NHD", True, False, _i32([0] * 4), _i32([0] * 9), _i32([1] * 4))
    w = D(_ws(), "NHD", True, False, _i32([0] * 5), _i32([0] * 9), _i32([1] * 4))
    assert w.is_cuda_graph_enabled
    P = tessera.BatchPrefillWithPagedKVCacheWrapper
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buf has 5 entries, expected 4"):
        P(_ws(), "NHD", True, _i32([0] * 5), _i32([0] * 5), _i32([0] * 9), _i32([1] * 5))
    R = tessera.BatchPrefillWithRaggedKVCacheWrapper
    with pytest.raises(ValueError, match="kv_indptr_buf"):
        R(_ws(), "NHD", True, _i32([0] * 5))


# --- plan() checks (all before any GPU work) -------------------------------------------------------


def _decode_plan(w, **overrides):
    args = dict(indptr=_i32([0, 2, 3]), indices=_i32([0, 1, 2]), last_page_len=_i32([5, 16]), num_qo_heads=8,
                num_kv_heads=2, head_dim=128, page_size=16)
    args.update(overrides)
    w.plan(**args)


def _paged_plan(w, **overrides):
    args = dict(qo_indptr=_i32([0, 3, 4]), paged_kv_indptr=_i32([0, 2, 3]), paged_kv_indices=_i32([0, 1, 2]),
                paged_kv_last_page_len=_i32([5, 16]), num_qo_heads=8, num_kv_heads=2, head_dim_qk=128, page_size=16)
    args.update(overrides)
    w.plan(**args)


def _ragged_plan(w, **overrides):
    args = dict(qo_indptr=_i32([0, 3, 4]), kv_indptr=_i32([0, 20, 37]), num_qo_heads=8, num_kv_heads=2,
                head_dim_qk=128)
    args.update(overrides)
    w.plan(**args)


PLANS = [
    (tessera.BatchDecodeWithPagedKVCacheWrapper, _decode_plan),
    (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan),
    (tessera.BatchPrefillWithRaggedKVCacheWrapper, _ragged_plan),
]
PLAN_IDS = ["decode", "prefill_paged", "prefill_ragged"]


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("value", [torch.float8_e4m3fn, "float8_e5m2", "e4m3"])
def test_plan_accepts_fp8_kv_data_type(cls, plan, value):
    # An fp8 cache passes every check; the plan stops at its first GPU step.
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        plan(cls(_ws()), kv_data_type=value)


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize(
    "value,error,message",
    [
        (torch.float8_e4m3fnuz, NotImplementedError, r"kv_data_type=torch.float8_e4m3fnuz is not supported .*torch.float8_e4m3fn or"),
        (torch.float32, TypeError, "kv_data_type"),
        (torch.bfloat16, NotImplementedError, "mixed q/kv dtypes"),  # q_data_type is float16
    ],
)
def test_plan_rejects_kv_data_type(cls, plan, value, error, message):
    with pytest.raises(error, match=message):
        plan(cls(_ws()), kv_data_type=value)


# FlashInfer's variant options that Tessera implements: they pass every check, and the plan stops
# only at its first GPU step (the host workspace).
VARIANT_OPTIONS = [
    {"pos_encoding_mode": "ROPE_LLAMA"},
    {"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 8.0, "rope_theta": 5e5},
    {"pos_encoding_mode": "ALIBI"},
    {"window_left": 128},
    {"window_left": 0},
    {"logits_soft_cap": 30.0},
    {"logits_soft_cap": 0},
    {"logits_soft_cap": None},
    {"window_left": 7, "logits_soft_cap": 5.0, "pos_encoding_mode": "ALIBI"},
    {"pos_encoding_mode": "NONE", "rope_theta": 0.5},  # rope_* are ignored without RoPE (as FlashInfer)
]


def _variant_id(opts):
    return ",".join(f"{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("opts", VARIANT_OPTIONS, ids=_variant_id)
def test_plan_variant_options_accepted(cls, plan, opts):
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        plan(cls(_ws()), **opts)


# Wrong values of the variant options: the error names the option (before any GPU work).
VARIANT_ERRORS = [
    ({"window_left": -5}, ValueError, r"window_left = -5, expected -1"),
    ({"window_left": -2}, ValueError, "window_left"),
    ({"window_left": 2**31}, ValueError, "window_left"),
    ({"window_left": 1.5}, TypeError, "window_left must be an int, got float"),
    ({"window_left": True}, TypeError, "window_left must be an int, got bool"),
    ({"window_left": "8"}, TypeError, "window_left must be an int"),
    ({"logits_soft_cap": -1.0}, ValueError, r"logits_soft_cap = -1.0, expected"),
    ({"logits_soft_cap": float("inf")}, ValueError, "logits_soft_cap"),
    ({"logits_soft_cap": float("nan")}, ValueError, "logits_soft_cap"),
    ({"logits_soft_cap": "30"}, TypeError, "logits_soft_cap must be a float"),
    ({"pos_encoding_mode": "FOO"}, ValueError, r"pos_encoding_mode = 'FOO', expected one of 'NONE', 'ROPE_LLAMA', 'ALIBI'"),
    ({"pos_encoding_mode": "rope_llama"}, ValueError, "pos_encoding_mode"),
    ({"pos_encoding_mode": None}, ValueError, "pos_encoding_mode"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "rope_theta": 1.0}, ValueError, r"rope_theta = 1.0, expected"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 0.0}, ValueError, r"rope_scale = 0.0, expected"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": -2}, ValueError, "rope_scale"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "rope_theta": float("inf")}, ValueError, "rope_theta"),
    ({"pos_encoding_mode": "ROPE_LLAMA", "rope_scale": "x"}, TypeError, "rope_scale must be a float"),
]


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
@pytest.mark.parametrize("opts,error,message", VARIANT_ERRORS, ids=[_variant_id(c[0]) for c in VARIANT_ERRORS])
def test_plan_variant_option_errors(cls, plan, opts, error, message):
    with pytest.raises(error, match=message):
        plan(cls(_ws()), **opts)


def test_run_window_left_check():
    from tessera import _utils as U

    U.check_run_window_left(None, 16)
    U.check_run_window_left(16, 16)
    U.check_run_window_left(-1, -1)
    with pytest.raises(NotImplementedError, match=r"window_left=8 in run\(\) differs from the plan's window_left=16"):
        U.check_run_window_left(8, 16)
    with pytest.raises(NotImplementedError, match="window_left"):
        U.check_run_window_left(4, -1)
    with pytest.raises(ValueError, match="window_left = -3"):
        U.check_run_window_left(-3, -1)
    with pytest.raises(TypeError, match="window_left must be an int"):
        U.check_run_window_left(2.0, -1)


def test_alibi_slopes():
    # The standard slopes (Press et al.): 2^(-8k/n) for the largest power of two n <= heads, then
    # the odd powers of 2^(-4/n) for the remaining heads.
    assert _C.alibi_slopes(8) == [2.0 ** -k for k in range(1, 9)]
    assert _C.alibi_slopes(1) == [2.0 ** -8]
    s12 = _C.alibi_slopes(12)
    assert s12[:8] == [2.0 ** -k for k in range(1, 9)]
    assert s12[8:] == pytest.approx([2.0 ** (-(2 * k - 1) / 2) for k in range(1, 5)], rel=1e-6)
    with pytest.raises(ValueError, match="num_heads = 0"):
        _C.alibi_slopes(0)


def test_packbits_little():
    from tessera import _utils as U

    gen = torch.Generator().manual_seed(3)
    for shape in ((1, 1), (3, 5), (7, 8), (37, 300)):
        mask = torch.rand(shape, generator=gen) < 0.4
        packed = U.packbits_little(mask)
        flat = mask.flatten().tolist()
        expected = [0] * ((len(flat) + 7) // 8)
        for i, bit in enumerate(flat):
            if bit:
                expected[i >> 3] |= 1 << (i & 7)
        assert packed.dtype == torch.uint8 and packed.tolist() == expected, shape


@pytest.mark.parametrize(
    "cls,plan,option,value",
    [
        (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan, "use_fp16_qk_reduction", True),
        (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan, "head_dim_vo", 64),
        (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan, "block_tables", _i32([0])),
        (tessera.BatchPrefillWithPagedKVCacheWrapper, _paged_plan, "prefix_len_ptr", _i32([0])),
        (tessera.BatchPrefillWithRaggedKVCacheWrapper, _ragged_plan, "head_dim_vo", 64),
        (tessera.BatchPrefillWithRaggedKVCacheWrapper, _ragged_plan, "token_pos_in_items_len", 3),
        (tessera.BatchDecodeWithPagedKVCacheWrapper, _decode_plan, "block_tables", _i32([0])),
        (tessera.BatchDecodeWithPagedKVCacheWrapper, _decode_plan, "seq_lens", _i32([0])),
        (tessera.BatchDecodeWithPagedKVCacheWrapper, _decode_plan, "o_data_type", torch.float32),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_plan_unsupported_options_specific(cls, plan, option, value):
    with pytest.raises(NotImplementedError, match=option):
        plan(cls(_ws()), **{option: value})


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
def test_plan_argument_checks(cls, plan):
    w = cls(_ws())
    hd = "head_dim" if cls is tessera.BatchDecodeWithPagedKVCacheWrapper else "head_dim_qk"
    with pytest.raises(TypeError, match="q_data_type"):
        plan(w, q_data_type=torch.float32)
    with pytest.raises(TypeError, match="q_data_type"):
        plan(w, q_data_type="int7")
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        plan(w, q_data_type="float16", kv_data_type="bfloat16")
    with pytest.raises(ValueError, match="num_qo_heads = 6 is not a multiple of num_kv_heads = 4"):
        plan(w, num_qo_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads = 0"):
        plan(w, num_kv_heads=0)
    with pytest.raises(NotImplementedError, match=hd):
        plan(w, **{hd: 80})
    with pytest.raises(TypeError, match="num_qo_heads must be an int"):
        plan(w, num_qo_heads=8.0)
    with pytest.raises(ValueError, match="sm_scale"):
        plan(w, sm_scale=-0.5)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        plan(w, pos_encoding_mode="ROPE")


def test_decode_plan_index_checks():
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(_ws())
    with pytest.raises(TypeError, match=r"indptr.dtype = torch.int64, expected torch.int32"):
        _decode_plan(w, indptr=torch.tensor([0, 2, 3]))
    with pytest.raises(TypeError, match="last_page_len.dtype"):
        _decode_plan(w, last_page_len=torch.tensor([5.0, 16.0]))
    with pytest.raises(ValueError, match=r"indptr has shape \(1, 3\), expected 1 dimensions"):
        _decode_plan(w, indptr=_i32([[0, 2, 3]]))
    with pytest.raises(ValueError, match=r"last_page_len has 3 entries, expected 2"):
        _decode_plan(w, last_page_len=_i32([1, 2, 3]))
    with pytest.raises(ValueError, match=r"indptr\[0\] = 1, expected 0"):
        _decode_plan(w, indptr=_i32([1, 2, 3]))
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1, expected >= 2"):
        _decode_plan(w, indptr=_i32([0, 2, 1]))
    with pytest.raises(ValueError, match=r"indices has 2 entries, expected >= indptr\[-1\] = 3"):
        _decode_plan(w, indices=_i32([0, 1]))
    with pytest.raises(ValueError, match="page_size = 0"):
        _decode_plan(w, page_size=0)
    with pytest.raises(TypeError, match="indices must be a torch.Tensor"):
        _decode_plan(w, indices=[0, 1, 2])
    with pytest.raises(ValueError, match="fixed_split_size"):
        _decode_plan(w, fixed_split_size=3)  # 3 pages * 16 = 48 tokens: not a multiple of 128


def test_prefill_plan_index_checks():
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(_ws())
    with pytest.raises(ValueError, match=r"paged_kv_indptr has 2 entries, expected 3"):
        _paged_plan(w, paged_kv_indptr=_i32([0, 2]))
    with pytest.raises(ValueError, match=r"qo_indptr\[2\] = 3, expected >= 4"):
        _paged_plan(w, qo_indptr=_i32([0, 4, 3]))
    with pytest.raises(TypeError, match="causal must be a bool"):
        _paged_plan(w, causal=1)
    r = tessera.BatchPrefillWithRaggedKVCacheWrapper(_ws())
    with pytest.raises(ValueError, match=r"kv_indptr has 4 entries, expected 3"):
        _ragged_plan(r, kv_indptr=_i32([0, 1, 2, 3]))


@pytest.mark.parametrize("cls,plan", PLANS, ids=PLAN_IDS)
def test_plan_reaches_gpu_work_only_with_a_cuda_workspace(cls, plan):
    # Every check above passes; the first GPU step (building the C++ runtime over the
    # workspace) refuses a host workspace, naming it.
    with pytest.raises(ValueError, match="float_workspace_buffer is on cpu, expected a CUDA tensor"):
        plan(cls(_ws()))


def test_cuda_graph_plan_bounds_checked_before_gpu_work():
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", True, False, _i32([0] * 2), _i32([0] * 2),
                                                   _i32([1]))
    with pytest.raises(ValueError, match="batch_size 2 exceeds the 1 requests"):
        _decode_plan(w)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(_ws(), "NHD", True, False, _i32([0] * 3), _i32([0] * 2),
                                                   _i32([1] * 2))
    with pytest.raises(ValueError, match="exceed the 2 entries of paged_kv_indices_buffer"):
        _decode_plan(w)


NO_GPU_MESSAGE = r"^no CUDA (driver|device): .*nvidia-smi"


@pytest.mark.skipif(HAS_GPU, reason="checks the behaviour without a GPU")
def test_cpp_plan_needs_a_gpu():
    # The library says what is missing and what to do, not a bare CUDA error name.
    b = _C.RuntimeBounds()
    b.max_batch_size, b.max_total_qo_tokens, b.num_qo_heads, b.num_kv_heads, b.head_dim = 4, 4, 8, 2, 128
    with pytest.raises(RuntimeError, match=NO_GPU_MESSAGE) as e:
        _C.BatchDecodeWrapper.workspace_size(b, _C.RuntimeOptions(), 0)
    assert e.value.status_code == _C.StatusCode.cuda_error
    assert re.match(NO_GPU_MESSAGE, _C.cuda_unavailable_reason())


@pytest.mark.skipif(HAS_GPU, reason="checks the behaviour without a GPU")
def test_host_tensor_error_says_why_there_is_no_gpu():
    v = torch.randn(4, 2, 64).half()
    s = torch.randn(4, 2)
    with pytest.raises(ValueError, match=r"v_a is on cpu, expected a CUDA tensor \(no CUDA (driver|device): "):
        tessera.merge_state(v, s, v, s)


@pytest.mark.skipif(not HAS_GPU, reason="checks the behaviour with a GPU")
def test_cuda_available():
    assert _C.cuda_unavailable_reason() == ""


# --- single-request functions, merge, append: checks before GPU work ------------------------------


def _qkv(qo=None, hq=8, hkv=2, d=128, kv=33, dtype=torch.float16, layout="NHD"):
    q = torch.randn((hq, d) if qo is None else (qo, hq, d)).to(dtype)
    shape = (kv, hkv, d) if layout == "NHD" else (hkv, kv, d)
    return q, torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def test_single_decode_checks():
    f = tessera.single_decode_with_kv_cache
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="kv_layout"):
        f(q, k, v, kv_layout="NDH")
    for option, value in [("k_scale", 0.5), ("q_scale", 2.0)]:
        with pytest.raises(NotImplementedError, match=option):
            f(q, k, v, **{option: value})
    for opts, error, message in VARIANT_ERRORS:
        with pytest.raises(error, match=message):
            f(q, k, v, **opts)
    for opts in VARIANT_OPTIONS:  # valid: only the device stops them
        with pytest.raises(ValueError, match="q is on cpu, expected a CUDA tensor"):
            f(q, k, v, **opts)
    with pytest.raises(TypeError, match=r"q.dtype = torch.float32"):
        f(q.float(), k, v)
    with pytest.raises(TypeError, match=r"k.dtype = torch.bfloat16, expected torch.float16"):
        f(q, k.bfloat16(), v)
    # fp8 K/V: both of one fp8 dtype; scales None, a float > 0 or a float32 tensor of 1 or
    # num_kv_heads elements; the e4m3fnuz variants are not read.
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"v.dtype = torch.float16, expected torch.float8_e4m3fn"):
        f(q, k8, v)
    with pytest.raises(NotImplementedError, match="k.dtype"):
        f(q, k.to(torch.float8_e4m3fnuz), v.to(torch.float8_e4m3fnuz))
    for option, value, error, message in [
        ("k_scale", 0.0, ValueError, r"k_scale = 0.0, expected a finite scale > 0"),
        ("v_scale", float("nan"), ValueError, "v_scale"),
        ("k_scale", -2, ValueError, "k_scale"),
        ("k_scale", "1", TypeError, "k_scale must be None, a float or a float32 tensor"),
        ("v_scale", torch.ones(3), ValueError, r"v_scale has 3 elements, expected 1 \(per tensor\) or num_kv_heads = 2"),
        ("k_scale", torch.ones(1, dtype=torch.float16), TypeError, r"k_scale.dtype = torch.float16, expected torch.float32"),
        ("q_scale", 2.0, NotImplementedError, "q_scale"),
    ]:
        with pytest.raises(error, match=message):
            f(q, k8, v8, **{option: value})
    for opts in [{}, {"k_scale": 0.5, "v_scale": 2}, {"k_scale": torch.ones(1), "v_scale": torch.ones(2)}]:
        with pytest.raises(ValueError, match="q is on cpu, expected a CUDA tensor"):
            f(q, k8, v8, **opts)
    with pytest.raises(ValueError, match=r"q has shape \(1, 8, 128\), expected 2 dimensions"):
        f(q[None], k, v)
    with pytest.raises(ValueError, match=r"v has shape"):
        f(q, k, v[:5])
    with pytest.raises(ValueError, match="num_qo_heads = 8 is not a multiple of num_kv_heads = 3"):
        f(q, torch.randn(4, 3, 128).half(), torch.randn(4, 3, 128).half())
    with pytest.raises(NotImplementedError, match="head_dim=80"):
        f(q[:, :80], k[..., :80], v[..., :80])
    with pytest.raises(ValueError, match="q is on cpu, expected a CUDA tensor"):
        f(q, k, v)  # everything else is valid: the device is what stops it


def test_single_prefill_checks():
    f = tessera.single_prefill_with_kv_cache
    q, k, v = _qkv(qo=5, layout="HND")
    for option, value in [("use_fp16_qk_reduction", True), ("backend", "trtllm-gen"), ("scale_k", torch.ones(1)),
                          ("o_dtype", torch.float32)]:
        with pytest.raises(NotImplementedError, match=option):
            f(q, k, v, kv_layout="HND", **{option: value})
    for opts, error, message in VARIANT_ERRORS:
        with pytest.raises(error, match=message):
            f(q, k, v, kv_layout="HND", **opts)
    # Valid variant options and custom masks (qo_len 5, kv_len 33: 165 bits, 21 bytes) pass every
    # check; the device is what stops them.
    for opts in VARIANT_OPTIONS + [{"custom_mask": torch.ones(5, 33, dtype=torch.bool)},
                                   {"packed_custom_mask": torch.ones(21, dtype=torch.uint8)},
                                   {"packed_custom_mask": torch.ones(64, dtype=torch.uint8), "causal": True},
                                   {"custom_mask": torch.ones(5, 33, dtype=torch.bool), "window_left": 3,
                                    "pos_encoding_mode": "ROPE_LLAMA"}]:
        with pytest.raises(ValueError, match="q is on cpu"):
            f(q, k, v, kv_layout="HND", **opts)
    with pytest.raises(ValueError, match=r"custom_mask has shape \(5, 32\), expected \(5, 33\) \(\[qo_len, kv_len\]\)"):
        f(q, k, v, kv_layout="HND", custom_mask=torch.ones(5, 32, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"custom_mask has shape \(165,\), expected 2 dimensions"):
        f(q, k, v, kv_layout="HND", custom_mask=torch.ones(165, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"custom_mask.dtype = torch.uint8, expected torch.bool"):
        f(q, k, v, kv_layout="HND", custom_mask=torch.ones(5, 33, dtype=torch.uint8))
    with pytest.raises(TypeError, match="custom_mask must be a torch.Tensor"):
        f(q, k, v, kv_layout="HND", custom_mask=[[True] * 33] * 5)
    with pytest.raises(ValueError, match=r"packed_custom_mask has 20 bytes, expected >= ceil\(qo_len \* kv_len / 8\) = 21"):
        f(q, k, v, kv_layout="HND", packed_custom_mask=torch.ones(20, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"packed_custom_mask.dtype = torch.bool, expected torch.uint8"):
        f(q, k, v, kv_layout="HND", packed_custom_mask=torch.ones(21, dtype=torch.bool))
    with pytest.raises(ValueError, match="packed_custom_mask has shape"):
        f(q, k, v, kv_layout="HND", packed_custom_mask=torch.ones(3, 7, dtype=torch.uint8))
    with pytest.raises(ValueError, match="kv_layout"):
        f(q, k, v, kv_layout="hnd")
    with pytest.raises(TypeError, match="causal must be a bool"):
        f(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="q is on cpu"):
        f(q, k, v, kv_layout="HND", causal=True)


def test_merge_checks():
    v = torch.randn(4, 2, 64).half()
    s = torch.randn(4, 2)
    with pytest.raises(TypeError, match=r"s_a.dtype = torch.float16, expected torch.float32"):
        tessera.merge_state(v, s.half(), v, s)
    with pytest.raises(ValueError, match=r"s_b has shape \(4, 3\), expected \(4, 2\)"):
        tessera.merge_state(v, s, v, torch.randn(4, 3))
    with pytest.raises(TypeError, match="v_b.dtype"):
        tessera.merge_state(v, s, v.bfloat16(), s)
    with pytest.raises(TypeError, match=r"v_a.dtype = torch.int32"):
        tessera.merge_state(v.int(), s, v.int(), s)
    with pytest.raises(ValueError, match="v_a is on cpu"):
        tessera.merge_state(v, s, v, s)
    with pytest.raises(NotImplementedError, match="mask"):
        tessera.merge_state_in_place(v, s, v, s, mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"v has shape \(4, 2, 64\), expected 4 dimensions"):
        tessera.merge_states(v, s)
    with pytest.raises(ValueError, match="v is on cpu"):
        tessera.merge_states(v[:, None].expand(4, 3, 2, 64), s[:, None].expand(4, 3, 2))


def test_append_checks():
    k = torch.randn(5, 2, 64).half()
    cache = torch.zeros(4, 2, 16, 2, 64).half()
    ip, ix, lp = _i32([0, 1, 3]), _i32([0, 1, 2]), _i32([3, 2])
    bi, pos = _i32([0, 0, 1, 1, 1]), _i32([0, 1, 2, 16, 17])
    f = tessera.append_paged_kv_cache
    with pytest.raises(ValueError, match="kv_layout"):
        f(k, k, bi, pos, cache, ix, ip, lp, "XYZ")
    with pytest.raises(TypeError, match="batch_indices.dtype = torch.int64"):
        f(k, k, bi.long(), pos, cache, ix, ip, lp)
    with pytest.raises(ValueError, match="positions has 4 entries, expected 5"):
        f(k, k, bi, pos[:4], cache, ix, ip, lp)
    with pytest.raises(TypeError, match="paged_kv_cache.dtype = torch.bfloat16"):
        f(k, k, bi, pos, cache.bfloat16(), ix, ip, lp)
    with pytest.raises(ValueError, match=r"append_key has shape \(5, 2, 64\), expected \[nnz, 16, 64\]"):
        f(k, k, bi, pos, cache, ix, ip, lp, "HND")
    with pytest.raises(ValueError, match="paged_kv_cache has shape"):
        f(k, k, bi, pos, cache[:, 0], ix, ip, lp)
    with pytest.raises(ValueError, match="append_key is on cpu"):
        f(k, k, bi, pos, cache, ix, ip, lp)
    with pytest.raises(ValueError, match="append_key is on cpu"):
        f(k, k, bi, pos, (cache[:, 0], cache[:, 1]), ix, ip, lp)


def test_append_mla_checks():
    ckv, kpe = torch.randn(5, 512).half(), torch.randn(5, 64).half()
    ckv_cache, kpe_cache = torch.zeros(4, 16, 512).half(), torch.zeros(4, 16, 64).half()
    ip, ix, lp = _i32([0, 1, 3]), _i32([0, 1, 2]), _i32([3, 2])
    bi, pos = _i32([0, 0, 1, 1, 1]), _i32([0, 1, 2, 16, 17])
    f = tessera.append_paged_mla_kv_cache
    with pytest.raises(ValueError, match=r"append_ckv has shape \(5, 1, 512\), expected 2 dimensions"):
        f(ckv[:, None], kpe, bi, pos, ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(ValueError, match=r"ckv_cache has shape \(4, 16, 1, 512\), expected 3 dimensions"):
        f(ckv, kpe, bi, pos, ckv_cache[:, :, None], kpe_cache, ix, ip, lp)
    with pytest.raises(TypeError, match="ckv_cache must be a torch.Tensor, got NoneType"):
        f(ckv, kpe, bi, pos, None, kpe_cache, ix, ip, lp)
    with pytest.raises(TypeError, match=r"ckv_cache.dtype = torch.float32, expected torch.float16 or torch.bfloat16 or "
                                        r"torch.float8_e4m3fn or torch.float8_e5m2"):
        f(ckv.float(), kpe.float(), bi, pos, ckv_cache.float(), kpe_cache.float(), ix, ip, lp)
    with pytest.raises(TypeError, match=r"kpe_cache.dtype = torch.bfloat16, expected torch.float16 \(the dtype of ckv_cache\)"):
        f(ckv, kpe, bi, pos, ckv_cache, kpe_cache.bfloat16(), ix, ip, lp)
    with pytest.raises(TypeError, match=r"append_kpe.dtype = torch.bfloat16, expected torch.float16"):
        f(ckv, kpe.bfloat16(), bi, pos, ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(ValueError, match=r"kpe_cache has shape \(4, 8, 64\), expected \(4, 16, 64\)"):
        f(ckv, kpe, bi, pos, ckv_cache, kpe_cache[:, :8], ix, ip, lp)
    with pytest.raises(ValueError, match=r"append_ckv has shape \(5, 256\), expected \(5, 512\)"):
        f(ckv[:, :256], kpe, bi, pos, ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(ValueError, match=r"append_kpe has shape \(4, 64\), expected \(5, 64\)"):
        f(ckv, kpe[:4], bi, pos, ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(TypeError, match="batch_indices.dtype = torch.int64"):
        f(ckv, kpe, bi.long(), pos, ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(ValueError, match="positions has 4 entries, expected 5"):
        f(ckv, kpe, bi, pos[:4], ckv_cache, kpe_cache, ix, ip, lp)
    with pytest.raises(ValueError, match="kv_last_page_len has 1 entries, expected 2"):
        f(ckv, kpe, bi, pos, ckv_cache, kpe_cache, ix, ip, lp[:1])
    with pytest.raises(ValueError, match="ckv_cache is on cpu"):
        f(ckv, kpe, bi, pos, ckv_cache, kpe_cache, ix, ip, lp)
    # The binding reaches the C++ checks (which refuse host tensors too).
    with pytest.raises(ValueError, match=r"^ckv_cache.device = cpu, expected a CUDA device$"):
        _C.append_paged_mla_kv_cache(ckv, kpe, bi, pos, ckv_cache, kpe_cache, ip, ix, lp, 0)


# --- the C++ layer: DLPack conversion and error mapping ----------------------------------------------


def test_cpp_errors_map_to_python_exceptions():
    q = torch.randn(8, 128).to(torch.bfloat16)
    k = torch.randn(10, 2, 128).to(torch.bfloat16)[:, :, :]  # strided views convert too
    NHD = _C.Layout.NHD
    # The type comes from the StatusCode alone, which the exception carries as status_code.
    # kInvalidArgument -> ValueError, with the library's message.
    with pytest.raises(ValueError, match=r"^q.device = cpu, expected a CUDA device$") as e:
        _C.single_decode(q, k, k, NHD, q, None, 0.1, 0)
    assert e.value.status_code == _C.StatusCode.invalid_argument
    # ... also when the message is about a dtype (the library has no dtype code).
    with pytest.raises(ValueError, match=r"q.dtype = f32, expected one of \{f16, bf16\}") as e:
        _C.single_decode(q.float(), k, k, NHD, q, None, 0.1, 0)
    assert type(e.value) is ValueError and e.value.status_code == _C.StatusCode.invalid_argument
    # kUnsupported -> NotImplementedError (checked before the device is queried).
    b = _C.RuntimeBounds()
    b.max_batch_size, b.max_total_qo_tokens, b.num_qo_heads, b.num_kv_heads, b.head_dim = 4, 4, 8, 2, 80
    with pytest.raises(NotImplementedError, match="head_dim") as e:
        _C.BatchDecodeWrapper.workspace_size(b, _C.RuntimeOptions(), 0)
    assert e.value.status_code == _C.StatusCode.unsupported
    b.head_dim, b.max_batch_size = 128, 0
    with pytest.raises(ValueError, match=r"bounds.max_batch_size = 0, expected in \[1, 2\^31 - 1\)"):
        _C.BatchDecodeWrapper.workspace_size(b, _C.RuntimeOptions(), 0)
    assert [c.name for c in _C.StatusCode] == ["ok", "invalid_argument", "unsupported", "cuda_error", "internal"]


def test_cpp_variant_keywords():
    # The variant is the keyword-only argument `variant` of the attention entry points (the
    # positional order is unchanged), a VariantArgs; it converts, and the call then fails on the device.
    q = torch.randn(8, 128).to(torch.bfloat16)
    k = torch.randn(10, 2, 128).to(torch.bfloat16)
    NHD = _C.Layout.NHD
    variant = _C.VariantArgs(window_left=3, num_sink_tokens=2, logits_soft_cap=2.0,
                             pos_encoding=_C.PosEncoding.rope_llama31, rope_scale=2.0, rope_theta=5e5,
                             llama31_factor=8.0, alibi_slopes=torch.ones(8),
                             rope_q_offset=torch.zeros(1, dtype=torch.int32), user_name="v",
                             user_source="", user_params=[("n", 1), ("x", 0.5), ("t", torch.ones(2))])
    assert (variant.window_left, variant.num_sink_tokens, variant.pos_encoding) == (3, 2, _C.PosEncoding.rope_llama31)
    with pytest.raises(ValueError, match=r"^q.device = cpu, expected a CUDA device$"):
        _C.single_decode(q, k, k, NHD, q, None, 0.1, 0, variant=variant)
    mask = dict(custom_mask=torch.ones(4, dtype=torch.uint8), custom_mask_indptr=torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^q.device = cpu, expected a CUDA device$"):
        _C.single_prefill(q[None], k, k, NHD, q[None], None, 0.1, True, 0, variant=variant, **mask)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        _C.single_decode(q, k, k, NHD, q, None, 0.1, 0, variant)  # variant is keyword-only
    with pytest.raises(TypeError, match="incompatible function arguments"):
        _C.single_decode(q, k, k, NHD, q, None, 0.1, 0, window_left=3)  # the options travel in a VariantArgs
    with pytest.raises(TypeError, match="incompatible function arguments"):
        _C.single_decode(q, k, k, NHD, q, None, 0.1, 0, **mask)  # custom masks: single_prefill only
    assert [e.name for e in _C.PosEncoding] == ["none", "rope_llama", "rope_llama31"]


def test_unsupported_dlpack_dtype_is_a_value_error():
    # kInvalidArgument from the DLPack conversion: ValueError, like every invalid argument.
    q = torch.randn(8, 128).to(torch.bfloat16)
    k = torch.randn(10, 2, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^q: DLTensor.dtype = \(code 5, bits 64\) is not supported"):
        _C.single_decode(torch.zeros(3, dtype=torch.complex64), k, k, _C.Layout.NHD, q, None, 0.1, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.uint8])
def test_dlpack_dtypes_reach_cpp(dtype):
    # Every dtype Tessera knows converts; the call then fails on the device, not on the dtype.
    x = torch.zeros(4, 2, 64, dtype=dtype)[:, :, ::1]
    s = torch.zeros(4, 2, dtype=torch.float32)
    with pytest.raises((ValueError, TypeError)) as e:
        _C.merge_state(x, s, x, s, x, None, 0)
    assert "DLTensor" not in str(e.value)


# --- pure-PyTorch page helpers (run on the CPU) -----------------------------------------------------


def test_get_seq_lens():
    lens = tessera.get_seq_lens(_i32([0, 2, 2, 5]), _i32([3, 7, 16]), 16)
    assert lens.dtype == torch.int32
    assert lens.tolist() == [16 + 3, 0, 2 * 16 + 16]


def test_get_batch_indices_positions():
    append_indptr = _i32([0, 2, 2, 5])
    seq_lens = _i32([10, 4, 3])
    bi, pos = tessera.get_batch_indices_positions(append_indptr, seq_lens, 5)
    assert bi.dtype == torch.int32 and pos.dtype == torch.int32
    assert bi.tolist() == [0, 0, 2, 2, 2]
    assert pos.tolist() == [8, 9, 0, 1, 2]
    bi, pos = tessera.get_batch_indices_positions(_i32([0, 0]), _i32([4]), 0)
    assert bi.numel() == 0 and pos.numel() == 0


def test_kernels_run_on():
    f = tessera._kernels_run_on
    assert f(9, 0, ["80", "90a"])        # sm_90a SASS on an H100
    assert f(8, 9, ["80", "90a"])        # sm_80 SASS runs on 8.x
    assert not f(12, 0, ["80", "90a"])   # no PTX when the last entry is an "a" target
    assert f(12, 0, ["80", "90"])        # PTX of compute_90 is JIT-compiled
    assert not f(8, 0, ["90a"])
    assert not f(9, 0, [])


@pytest.mark.skipif(HAS_GPU, reason="with a GPU the example runs in full (test_gpu.py::test_example_decode_loop)")
def test_example_decode_loop_without_gpu(repo_root):
    r = _run_python([os.path.join(repo_root, "examples", "python", "decode_loop.py")])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "ran nothing" in lines[0], r.stdout


def test_host_page_ids_are_checked_against_the_cache_once_per_page_count():
    from tessera import _utils as U

    ids = U.HostPageIds("indices", _i32([3, 7, 0, 99]), 3)  # only the first indptr[-1] = 3 count
    ids.check(8)
    ids.check(8)  # once per page count
    with pytest.raises(ValueError, match=r"indices\[1\] = 7 is out of range \[0, 7\)"):
        ids.check(7)
    with pytest.raises(ValueError, match=r"indices\[0\] = -2 is out of range"):
        U.HostPageIds("indices", _i32([-2, 1]), 2).check(8)
    assert U.HostPageIds("indices", torch.zeros(0, dtype=torch.int32), 0).ids.numel() == 0


# --- packbits / segment_packbits (torch operations: they run on the CPU too) ----------------------


def _packbits_ref(bits, bitorder):
    """Byte i holds elements 8i .. 8i+7, from the most significant bit (big) or the least (little)."""
    out = []
    for i in range(0, len(bits), 8):
        byte = 0
        for k, bit in enumerate(bits[i : i + 8]):
            if bit:
                byte |= 1 << (7 - k if bitorder == "big" else k)
        out.append(byte)
    return out


@pytest.mark.parametrize("bitorder", ("big", "little"))
@pytest.mark.parametrize("n", (0, 1, 7, 8, 9, 64, 1001))
def test_packbits(bitorder, n):
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, generator=g) < 0.5
    got = tessera.packbits(x, bitorder)
    assert got.dtype == torch.uint8 and got.tolist() == _packbits_ref(x.tolist(), bitorder)
    # Any dtype reads as booleans (nonzero = 1); a 2-D mask is flattened row-major.
    assert tessera.packbits(x.to(torch.float32).reshape(1, -1) * 3, bitorder).tolist() == got.tolist()


@pytest.mark.parametrize("bitorder", ("big", "little"))
def test_segment_packbits(bitorder):
    g = torch.Generator().manual_seed(5)
    lens = [0, 1, 8, 13, 0, 30, 7]
    x = torch.rand(sum(lens), generator=g) < 0.4
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    packed, packed_indptr = tessera.segment_packbits(x, indptr, bitorder)
    expected, expected_indptr, start = [], [0], 0
    for n in lens:
        seg = _packbits_ref(x[start : start + n].tolist(), bitorder)
        expected += seg
        expected_indptr.append(expected_indptr[-1] + len(seg))
        start += n
    assert packed.tolist() == expected and packed_indptr.tolist() == expected_indptr
    assert packed_indptr.dtype == torch.int32
    # The little-endian single-segment case is what packed_custom_mask takes.
    one, _ = tessera.segment_packbits(x, torch.tensor([0, x.numel()]), "little")
    assert one.tolist() == tessera.packbits(x, "little").tolist()


def test_packbits_errors():
    x = torch.ones(10, dtype=torch.bool)
    with pytest.raises(ValueError, match="bitorder = 'middle', expected 'big' or 'little'"):
        tessera.packbits(x, "middle")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        tessera.packbits([1, 0, 1])
    with pytest.raises(ValueError, match="end at x.numel"):
        tessera.segment_packbits(x, torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="non-decreasing"):
        tessera.segment_packbits(x, torch.tensor([0, 6, 4, 10]))
    with pytest.raises(TypeError, match="indptr.dtype = torch.float32"):
        tessera.segment_packbits(x, torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match="x must be a 1-D"):
        tessera.segment_packbits(x.view(2, 5), torch.tensor([0, 10]))
