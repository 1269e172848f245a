"""
Tessera's C++ API (low level; use the functions and classes of the `tessera` package).
"""

# Type stub of the extension module tessera._C, generated from the bindings by
# scripts/gen-python-stub.py (nanobind.stubgen, then NDArray made a protocol instead of numpy's:
# the arrays are any object with __dlpack__, in practice torch tensors). Do not edit by hand;
# tests/python/test_cpu.py::test_stub_matches_the_bindings checks it where the same nanobind and
# Python run.
# nanobind 3.1.0, python 3.11

import enum
from typing import Any, Protocol


class NDArray(Protocol):
    """Any DLPack-exporting tensor (torch.Tensor)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...



class StatusCode(enum.Enum):
    """
    tessera::StatusCode, the `status_code` of every exception the library raises (invalid_argument: ValueError, unsupported: NotImplementedError, cuda_error and internal: RuntimeError).
    """

    ok = 0

    invalid_argument = 1

    unsupported = 2

    cuda_error = 3

    internal = 4

class DType(enum.Enum):
    """Element types (tessera/dtype.h)."""

    f16 = 0

    bf16 = 1

    f32 = 2

    e4m3 = 3

    e5m2 = 4

    i32 = 5

    u8 = 6

    i64 = 7

class Layout(enum.Enum):
    """
    Paged KV layouts: NHD [pages, slot, head, dim], HND [pages, head, slot, dim].
    """

    NHD = 0

    HND = 1

class SplitKV(enum.Enum):
    """How the runtime splits long KV ranges (tessera/runtime.h)."""

    auto = 0

    fixed = 1

    none = 2

class QueryTile(enum.Enum):
    """Query tile of the runtime's kernels (tessera/runtime.h)."""

    auto = 0

    t16 = 16

    t64 = 64

    t128 = 128

class PosEncoding(enum.Enum):
    """
    Rotary position embedding fused into the attention kernels (tessera/variant.h).
    """

    none = 0

    rope_llama = 1

    rope_llama31 = 2

class VariantArgs:
    """
    The variant of one call or plan (tessera::VariantOptions with an optional user tessera::VariantSpec), the `variant` keyword of the attention entry points; the C++ library checks the values. Tensors: alibi_slopes f32 [Hq], rope_q_offset / rope_k_offset i32 [batch], on the device of q; user_params (name, int | float | device tensor) pairs. Empty user_name: no user variant.
    """

    def __init__(self, *, window_left: int = -1, num_sink_tokens: int = 0, logits_soft_cap: float = 0.0, pos_encoding: PosEncoding = PosEncoding.none, rope_scale: float = 1.0, rope_theta: float = 10000.0, llama31_factor: float = 8.0, llama31_low_freq_factor: float = 1.0, llama31_high_freq_factor: float = 4.0, llama31_original_max_position: float = 8192.0, sigmoid: bool = False, sigmoid_bias: float = 0.0, alibi_slopes: NDArray | None = None, rope_q_offset: NDArray | None = None, rope_k_offset: NDArray | None = None, user_name: str = '', user_source: str = '', user_params: Sequence[tuple[str, object]] = [], user_use_softmax: bool = True) -> None: ...

    @property
    def window_left(self) -> int: ...

    @property
    def num_sink_tokens(self) -> int: ...

    @property
    def logits_soft_cap(self) -> float: ...

    @property
    def pos_encoding(self) -> PosEncoding: ...

    @property
    def rope_scale(self) -> float: ...

    @property
    def rope_theta(self) -> float: ...

    @property
    def llama31_factor(self) -> float: ...

    @property
    def llama31_low_freq_factor(self) -> float: ...

    @property
    def llama31_high_freq_factor(self) -> float: ...

    @property
    def llama31_original_max_position(self) -> float: ...

    @property
    def sigmoid(self) -> bool: ...

    @property
    def sigmoid_bias(self) -> float: ...

    @property
    def user_name(self) -> str: ...

    @property
    def user_use_softmax(self) -> bool: ...

class RuntimeBounds:
    """Upper bounds a runtime wrapper is built for."""

    def __init__(self) -> None: ...

    @property
    def max_batch_size(self) -> int: ...

    @max_batch_size.setter
    def max_batch_size(self, arg: int, /) -> None: ...

    @property
    def max_total_qo_tokens(self) -> int: ...

    @max_total_qo_tokens.setter
    def max_total_qo_tokens(self, arg: int, /) -> None: ...

    @property
    def num_qo_heads(self) -> int: ...

    @num_qo_heads.setter
    def num_qo_heads(self, arg: int, /) -> None: ...

    @property
    def num_kv_heads(self) -> int: ...

    @num_kv_heads.setter
    def num_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def head_dim_vo(self) -> int: ...

    @head_dim_vo.setter
    def head_dim_vo(self, arg: int, /) -> None: ...

class RuntimeOptions:
    """Options of a runtime wrapper, fixed at construction."""

    def __init__(self) -> None: ...

    @property
    def cuda_graph(self) -> bool: ...

    @cuda_graph.setter
    def cuda_graph(self, arg: bool, /) -> None: ...

    @property
    def split_kv(self) -> SplitKV: ...

    @split_kv.setter
    def split_kv(self, arg: SplitKV, /) -> None: ...

    @property
    def fixed_split_size(self) -> int: ...

    @fixed_split_size.setter
    def fixed_split_size(self, arg: int, /) -> None: ...

    @property
    def sm_budget(self) -> int: ...

    @sm_budget.setter
    def sm_budget(self, arg: int, /) -> None: ...

    @property
    def q_tile(self) -> QueryTile: ...

    @q_tile.setter
    def q_tile(self, arg: QueryTile, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def kv_dtype(self) -> DType | None: ...

    @kv_dtype.setter
    def kv_dtype(self, arg: DType | None, /) -> None: ...

class PodOptions:
    """
    Options of a BatchPODPagedWrapper, fixed at construction (decode_sms 0: chosen per plan).
    """

    def __init__(self) -> None: ...

    @property
    def cuda_graph(self) -> bool: ...

    @cuda_graph.setter
    def cuda_graph(self, arg: bool, /) -> None: ...

    @property
    def dtype(self) -> DType: ...

    @dtype.setter
    def dtype(self, arg: DType, /) -> None: ...

    @property
    def decode_sms(self) -> int: ...

    @decode_sms.setter
    def decode_sms(self, arg: int, /) -> None: ...

    @property
    def split_kv(self) -> SplitKV: ...

    @split_kv.setter
    def split_kv(self, arg: SplitKV, /) -> None: ...

    @property
    def fixed_split_size(self) -> int: ...

    @fixed_split_size.setter
    def fixed_split_size(self, arg: int, /) -> None: ...

class PodPlanInfo:
    """
    What the last BatchPODPagedWrapper.plan() decided (read-only): the requests and CTAs of each side, and each side's plan as the dict the other wrappers' plan_info() returns (grid_cols 0: no CTAs on that side).
    """

    @property
    def num_prefill_requests(self) -> int: ...

    @property
    def num_decode_requests(self) -> int: ...

    @property
    def prefill_ctas(self) -> int: ...

    @property
    def decode_ctas(self) -> int: ...

    @property
    def decode_copies(self) -> int: ...

    @property
    def prefill(self) -> dict: ...

    @property
    def decode(self) -> dict: ...

def version() -> str:
    """Version of the linked libtessera (MAJOR.MINOR.PATCH)."""

def cuda_archs() -> str:
    """
    Comma-separated GPU architectures the kernels were compiled for (TESSERA_CUDA_ARCHS).
    """

def supported_head_dims() -> list[int]:
    """Head dimensions with compiled attention kernels."""

def supported_prefill_split_head_dims() -> list[tuple[int, int]]:
    """
    (head_dim_qk, head_dim_vo) pairs of different head dims that prefill is built for.
    """

def cuda_runtime_version() -> int:
    """Version of the CUDA runtime in use (1000 * major + 10 * minor)."""

def cuda_driver_version() -> int:
    """
    CUDA version the installed driver supports (0 when there is no driver).
    """

def cuda_device_count() -> int:
    """Number of CUDA GPUs visible (0 when there is none or no driver)."""

def cuda_unavailable_reason() -> str:
    """
    '' when a CUDA GPU is usable; otherwise why not and what to do ("no CUDA driver: ..." or "no CUDA device: ..."), the message every GPU entry point raises on such a machine.
    """

def cuda_device_properties(device: int) -> dict:
    """
    name, compute capability (major, minor), SM count and memory of GPU `device`.
    """

def alibi_slopes(num_heads: int) -> list[float]:
    """
    tessera::alibi_slopes: the standard ALiBi slopes of `num_heads` heads (host values).
    """

def single_decode(q: NDArray, k: NDArray, v: NDArray, layout: Layout, o: NDArray, lse: NDArray | None, sm_scale: float, stream: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
    """
    tessera::single_decode: q [Hq, D], k/v [kv_len, Hkv, D] (NHD) or [Hkv, kv_len, D] (HND). Keyword options: variant, a VariantArgs (None: the default variant); fp8 K/V: k and v as uint8 views with kv_dtype e4m3/e5m2, scales k_scale/v_scale (host) times the optional f32 k_scale_device/v_scale_device ([1] or [Hkv]).
    """

def batch_decode_ragged(q: NDArray, k: NDArray, v: NDArray, kv_indptr: NDArray, o: NDArray, lse: NDArray | None, sm_scale: float, stream: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
    """
    tessera::batch_decode_ragged: q [B, Hq, D], k/v [total_kv, Hkv, D] (request b's rows kv_indptr[b] .. kv_indptr[b+1]-1, kv_indptr i32 [B + 1] on q's device). Keyword options as for single_decode.
    """

def single_prefill(q: NDArray, k: NDArray, v: NDArray, layout: Layout, o: NDArray, lse: NDArray | None, sm_scale: float, causal: bool, stream: int, *, variant: VariantArgs | None = None, custom_mask: NDArray | None = None, custom_mask_indptr: NDArray | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None, q_dtype: DType | None = None, q_scale: float = 1.0, q_scale_device: NDArray | None = None) -> None:
    """
    tessera::single_prefill: q [qo_len, Hq, D], k/v as for single_decode. Keyword options as for single_decode, plus custom_mask: u8 packed bits (little bit order) of a row-major [qo_len, kv_len] mask (1 = visible) with custom_mask_indptr: i32 [0, bytes] on q's device (both or neither); FP8 attention: q as u8 with q_dtype e4m3, k/v likewise (kv_dtype), o f16/bf16, q_scale / q_scale_device as k_scale.
    """

def merge_state(v_a: NDArray, s_a: NDArray, v_b: NDArray, s_b: NDArray, v_out: NDArray, s_out: NDArray | None, stream: int) -> None:
    """tessera::merge_state (base-2 LSE)."""

def merge_states(v: NDArray, s: NDArray, v_out: NDArray, s_out: NDArray | None, stream: int) -> None:
    """tessera::merge_states (base-2 LSE)."""

def merge_states_ragged(v: NDArray, s: NDArray, indptr: NDArray, v_out: NDArray, s_out: NDArray | None, stream: int) -> None:
    """tessera::merge_states_ragged (base-2 LSE)."""

def append_paged_kv_cache_at(append_k: NDArray, append_v: NDArray, batch_indices: NDArray, positions: NDArray, k_cache: NDArray | None, v_cache: NDArray | None, kv_cache: NDArray | None, layout: Layout, indptr: NDArray, indices: NDArray, last_page_len: NDArray, stream: int, *, cache_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
    """
    tessera::append_paged_kv_cache_at: row i goes to request batch_indices[i] at positions[i]. An fp8 cache comes as uint8 views with cache_dtype e4m3/e5m2; rows are stored as x / scale.
    """

def append_paged_mla_kv_cache(append_ckv: NDArray, append_kpe: NDArray, batch_indices: NDArray, positions: NDArray, ckv_cache: NDArray, kpe_cache: NDArray, indptr: NDArray, indices: NDArray, last_page_len: NDArray, stream: int, *, cache_dtype: DType | None = None) -> None:
    """
    tessera::append_paged_mla_kv_cache: MLA latent rows append_ckv [nnz, ckv_dim] and append_kpe [nnz, kpe_dim] into ckv_cache [num_pages, page_size, ckv_dim] and kpe_cache [num_pages, page_size, kpe_dim]; row i goes to request batch_indices[i] at positions[i]. An fp8 cache: all four as uint8 views with cache_dtype e4m3 / e5m2 (a bit copy).
    """

def apply_rope(q: NDArray, k: NDArray, q_rope: NDArray, k_rope: NDArray, indptr: NDArray, offsets: NDArray, rotary_dim: int, interleave: bool, rope_scale: float, rope_theta: float, stream: int) -> None:
    """
    tessera::apply_rope: q [nnz, Hq, D], k [nnz, Hk, D] rotated into q_rope, k_rope at the positions of a ragged batch (row indptr[b] + j at offsets[b] + j); rotary_dim 0 means D.
    """

def apply_rope_pos_ids(q: NDArray, k: NDArray, q_rope: NDArray, k_rope: NDArray, pos_ids: NDArray, rotary_dim: int, interleave: bool, rope_scale: float, rope_theta: float, stream: int) -> None:
    """
    tessera::apply_rope_pos_ids: row r of q and k rotated at pos_ids[r] (i32 or i64); rotary_dim 0 means D.
    """

def apply_llama31_rope(q: NDArray, k: NDArray, q_rope: NDArray, k_rope: NDArray, indptr: NDArray, offsets: NDArray, rotary_dim: int, interleave: bool, rope_scale: float, rope_theta: float, low_freq_factor: float, high_freq_factor: float, old_context_len: float, stream: int) -> None:
    """
    tessera::apply_llama31_rope: apply_rope with Llama 3.1 frequencies (rope_scale is the smoothing factor).
    """

def apply_llama31_rope_pos_ids(q: NDArray, k: NDArray, q_rope: NDArray, k_rope: NDArray, pos_ids: NDArray, rotary_dim: int, interleave: bool, rope_scale: float, rope_theta: float, low_freq_factor: float, high_freq_factor: float, old_context_len: float, stream: int) -> None:
    """
    tessera::apply_llama31_rope_pos_ids: apply_rope_pos_ids with Llama 3.1 frequencies.
    """

def apply_rope_with_cos_sin_cache(positions: NDArray, query: NDArray, key: NDArray, head_size: int, cos_sin_cache: NDArray, is_neox: bool, query_out: NDArray, key_out: NDArray, stream: int) -> None:
    """
    tessera::apply_rope_with_cos_sin_cache: query [nnz, Hq * head_size], key [nnz, Hk * head_size] rotated with cos/sin read from cos_sin_cache f32 [max_position, rotary_dim] at row positions[r].
    """

def batch_mla_paged(q_nope: NDArray, q_pe: NDArray, qo_indptr: NDArray | None, max_qo_len: int, ckv: NDArray, kpe: NDArray, kv_indptr: NDArray, kv_indices: NDArray, kv_last_page_len: NDArray, o: NDArray, lse: NDArray | None, sm_scale: float, causal: bool, num_kv_splits: int, workspace: NDArray | None, stream: int, *, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
    """
    tessera::batch_mla_paged: MLA (absorbed) over a paged latent cache; q_nope [total_q, H, 512], q_pe [total_q, H, 64], ckv [num_pages, page_size, 512], kpe [num_pages, page_size, 64], o [total_q, H, 512], lse f32 [total_q, H] base 2 or None; num_kv_splits > 1 needs a workspace of batch_mla_paged_workspace_bytes bytes. An fp8 latent cache: ckv and kpe as u8 with kv_dtype e4m3 / e5m2, its key and value scales as k_scale / v_scale (host) and k_scale_device / v_scale_device (f32 [1]).
    """

def batch_mla_paged_num_kv_splits(batch_size: int, max_qo_len: int, num_heads: int, max_kv_len: int, sm_count: int) -> int:
    """
    tessera::batch_mla_paged_num_kv_splits: the KV split count for a batch (the SMs its CTAs leave idle, at least 256 tokens a split).
    """

def batch_mla_paged_workspace_bytes(total_q: int, num_heads: int, num_kv_splits: int, dtype: DType) -> int:
    """
    tessera::batch_mla_paged_workspace_bytes: bytes of the split states (0 for one split); dtype DType.f16 or bf16.
    """

def block_sparse_attention(q: NDArray, k: NDArray, v: NDArray, indptr: NDArray, indices: NDArray, block_flags: NDArray | None, block_rows: int, block_cols: int, o: NDArray, lse: NDArray | None, sm_scale: float, causal: bool, stream: int, *, variant_name: str = 'flex', mask_source: str = '', mask_function: str = '', score_source: str = '', score_function: str = '', params: Sequence[tuple[str, object]] = [], window_left: int = -1, logits_soft_cap: float = 0.0, alibi_slopes: NDArray | None = None) -> None:
    """
    tessera::block_sparse_attention: q [M, Hq, D], k/v [N, Hkv, D], the BSR indptr (i32 [ceil(M / block_rows) + 1]) and indices (i32 column blocks) with optional u8 block_flags (1 = full) -> o [M, Hq, D], lse [M, Hq] (base 2). Keyword options: a user variant given as a mask function and/or a score function (tessera::flex_variant: mask_source defines bool mask_function(params, b, h, q_idx, kv_idx), score_source float score_function(params, score, b, h, q_idx, kv_idx)) with params: (name, int | float | device tensor) pairs; built-in window_left, logits_soft_cap, alibi_slopes.
    """

def build_block_mask(mask_source: str, mask_function: str, params: Sequence[tuple[str, object]], q_len: int, kv_len: int, block_rows: int, block_cols: int, batch: int, head: int, indptr: NDArray, indices: NDArray, block_flags: NDArray, stream: int) -> None:
    """
    tessera::build_block_mask: evaluates the mask function on the GPU over a q_len x kv_len grid cut into (block_rows, block_cols) blocks and writes the BSR of the blocks with a visible pair (indptr i32 [row blocks + 1], indices i32, block_flags u8 1 = full).
    """

class PagedFastRun:
    """
    Private: a paged plan's run(q, paged_kv_cache[, out]) in one call (W12); made by a paged wrapper's fast_run().
    """

    def __call__(self, q: object, paged_kv_cache: object, out: object | None = None) -> object:
        """
        Runs the plan and returns out (allocated when None), or None with nothing done when an argument is not the plan's common case (exact torch.Tensors of its dtypes, shapes and GPU).
        """

class DecodeFastPlan:
    """
    Private: BatchDecodeWrapper.fast_plan()'s object; call it with (indptr, indices, last_page_len) -> (batch, pages), or None for the full plan() path.
    """

    def __call__(self, indptr: object, indices: object, last_page_len: object) -> object:
        """
        Plans the step (copying the page table into the graph buffers first, when given) and returns (batch, pages), or None with nothing done when an argument is not the common case.
        """

class BatchDecodeWrapper:
    """tessera::BatchDecodeWrapper (paged KV, one query per request)."""

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least min_workspace_size(bounds, options) bytes (below workspace_size it splits KV less; needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    @staticmethod
    def min_workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        The smallest workspace a wrapper with these bounds takes on GPU `device` (below workspace_size it splits KV less).
        """

    def plan_info(self) -> dict:
        """
        What the last plan() decided, as a dict (for tests, benchmarks and logs).
        """

    def set_variant_params(self, params: Sequence[tuple[str, object]]) -> None:
        """
        New values of the plan's user-variant parameters ((name, int | float | device array) pairs, the plan's names and kinds in its order) for the runs until the next plan().
        """

    def fast_run(self, indices: object, host_ids: object | None, device: int, dtype: DType, kv_dtype: DType, num_qo_heads: int, head_dim: int, head_dim_vo: int, q_rows: int, k_page: Sequence[int], v_page: Sequence[int], layout: Layout, empty_like: object, contiguous_format: object) -> PagedFastRun:
        """
        Private (python/tessera/decode.py): the PagedFastRun of this plan: run(q, paged_kv_cache[, out]) in one call for 16-bit q and K/V of these dtypes and shapes (q_rows -1: any), the page ids `indices` (kept alive), host_ids (an object whose check(num_pages) checks page ids given on the host) or None; outputs from empty_like(q, memory_format=contiguous_format) (torch's).
        """

    def fast_plan(self, device: int, max_batch: int, page_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, graph_indptr: object | None, graph_indices: object | None, graph_last_page_len: object | None) -> DecodeFastPlan:
        """
        Private (python/tessera/decode.py): a DecodeFastPlan of this configuration (the default variant, K/V of dtype): plan(indptr, indices, last_page_len) in one call, -> (batch, pages) or None; with the graph buffers (int32 on GPU `device`) it also copies the page table into them.
        """

    def plan(self, kv_indptr: NDArray, last_page_len: NDArray, page_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 kv_indptr [B + 1] and last_page_len [B]. Keyword options: variant, a VariantArgs of the built-in softmax variants (its tensors on GPU `device`, kept alive while the plan is used).
        """

    def run(self, q: NDArray, k: NDArray | None, v: NDArray | None, kv: NDArray | None, layout: Layout, indices: NDArray, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [B, Hq, D] -> o [B, Hq, D], lse [B, Hq] (base 2).
        """

class BatchPrefillPagedWrapper:
    """tessera::BatchPrefillPagedWrapper (paged KV, any query length)."""

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least min_workspace_size(bounds, options) bytes (below workspace_size it splits KV less; needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    @staticmethod
    def min_workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        The smallest workspace a wrapper with these bounds takes on GPU `device` (below workspace_size it splits KV less).
        """

    def plan_info(self) -> dict:
        """
        What the last plan() decided, as a dict (for tests, benchmarks and logs).
        """

    def set_variant_params(self, params: Sequence[tuple[str, object]]) -> None:
        """
        New values of the plan's user-variant parameters ((name, int | float | device array) pairs, the plan's names and kinds in its order) for the runs until the next plan().
        """

    def plan(self, qo_indptr: NDArray, kv_indptr: NDArray, last_page_len: NDArray, page_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None, head_dim_vo: int = 0, custom_mask: NDArray | None = None, custom_mask_indptr: NDArray | None = None, q_scale: float = 1.0, q_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 qo_indptr, kv_indptr [B + 1] and last_page_len [B]. Keyword options as for BatchDecodeWrapper.plan; head_dim_vo: v's and o's head dim (0: head_dim); custom_mask: u8 packed bits on the device with custom_mask_indptr, HOST int32 [B + 1] byte offsets; FP8 attention (dtype and kv_dtype e4m3): q_scale / q_scale_device, q's scale, as k_scale.
        """

    def run(self, q: NDArray, k: NDArray | None, v: NDArray | None, kv: NDArray | None, layout: Layout, indices: NDArray, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None, q_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [rows, Hq, D] -> o, lse [rows, Hq] (base 2). FP8 attention: q as u8 with q_dtype e4m3, o f16/bf16.
        """

    def fast_run(self, indices: object, host_ids: object | None, device: int, dtype: DType, kv_dtype: DType, num_qo_heads: int, head_dim: int, head_dim_vo: int, q_rows: int, k_page: Sequence[int], v_page: Sequence[int], layout: Layout, empty_like: object, contiguous_format: object) -> PagedFastRun:
        """
        Private (python/tessera/decode.py): the PagedFastRun of this plan: run(q, paged_kv_cache[, out]) in one call for 16-bit q and K/V of these dtypes and shapes (q_rows -1: any), the page ids `indices` (kept alive), host_ids (an object whose check(num_pages) checks page ids given on the host) or None; outputs from empty_like(q, memory_format=contiguous_format) (torch's).
        """

class BatchPODPagedWrapper:
    """
    tessera::BatchPODPagedWrapper (paged KV, a batch mixing prefill chunks and decode requests in one launch whose CTAs are divided between the two; the default variant, 16-bit K/V of q's dtype, equal head dims).
    """

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: PodOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least workspace_size(bounds, options) bytes (needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: PodOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    def plan_info(self) -> PodPlanInfo:
        """
        What the last plan() decided, as a PodPlanInfo (a copy; for tests, benchmarks and logs).
        """

    def plan(self, qo_indptr: NDArray, kv_indptr: NDArray, last_page_len: NDArray, page_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None, head_dim_vo: int = 0, custom_mask: NDArray | None = None, custom_mask_indptr: NDArray | None = None, q_scale: float = 1.0, q_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 qo_indptr, kv_indptr [B + 1] and last_page_len [B]. Keyword options as for BatchDecodeWrapper.plan; head_dim_vo: v's and o's head dim (0: head_dim); custom_mask: u8 packed bits on the device with custom_mask_indptr, HOST int32 [B + 1] byte offsets; FP8 attention (dtype and kv_dtype e4m3): q_scale / q_scale_device, q's scale, as k_scale.
        """

    def run(self, q: NDArray, k: NDArray | None, v: NDArray | None, kv: NDArray | None, layout: Layout, indices: NDArray, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None, q_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [rows, Hq, D] -> o, lse [rows, Hq] (base 2). FP8 attention: q as u8 with q_dtype e4m3, o f16/bf16.
        """

    def fast_run(self, indices: object, host_ids: object | None, device: int, dtype: DType, kv_dtype: DType, num_qo_heads: int, head_dim: int, head_dim_vo: int, q_rows: int, k_page: Sequence[int], v_page: Sequence[int], layout: Layout, empty_like: object, contiguous_format: object) -> PagedFastRun:
        """
        Private (python/tessera/decode.py): the PagedFastRun of this plan: run(q, paged_kv_cache[, out]) in one call for 16-bit q and K/V of these dtypes and shapes (q_rows -1: any), the page ids `indices` (kept alive), host_ids (an object whose check(num_pages) checks page ids given on the host) or None; outputs from empty_like(q, memory_format=contiguous_format) (torch's).
        """

class BatchPrefillRaggedWrapper:
    """tessera::BatchPrefillRaggedWrapper (ragged KV, any query length)."""

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least min_workspace_size(bounds, options) bytes (below workspace_size it splits KV less; needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    @staticmethod
    def min_workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        The smallest workspace a wrapper with these bounds takes on GPU `device` (below workspace_size it splits KV less).
        """

    def plan_info(self) -> dict:
        """
        What the last plan() decided, as a dict (for tests, benchmarks and logs).
        """

    def set_variant_params(self, params: Sequence[tuple[str, object]]) -> None:
        """
        New values of the plan's user-variant parameters ((name, int | float | device array) pairs, the plan's names and kinds in its order) for the runs until the next plan().
        """

    def plan(self, qo_indptr: NDArray, kv_indptr: NDArray, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None, head_dim_vo: int = 0, custom_mask: NDArray | None = None, custom_mask_indptr: NDArray | None = None, q_scale: float = 1.0, q_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 qo_indptr and kv_indptr [B + 1]. Keyword options as for BatchDecodeWrapper.plan; head_dim_vo: v's and o's head dim (0: head_dim); custom_mask, custom_mask_indptr, q_scale and q_scale_device as for BatchPrefillPagedWrapper.plan.
        """

    def run(self, q: NDArray, k: NDArray, v: NDArray, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None, q_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [rows, Hq, D], k/v [kv_rows, Hkv, D] -> o, lse (base 2). FP8 attention: q as u8 with q_dtype e4m3, o f16/bf16.
        """

class BatchMLAPagedWrapper:
    """
    tessera::BatchMLAPagedWrapper (MLA over a paged latent cache through the plan/run runtime; bounds: max_batch_size, max_total_qo_tokens and num_qo_heads = its heads).
    """

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least workspace_size(bounds, options) bytes (needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    def plan_info(self) -> dict:
        """
        What the last plan() decided, as a dict (for tests, benchmarks and logs).
        """

    def plan(self, qo_indptr: NDArray, kv_indptr: NDArray, last_page_len: NDArray, page_size: int, num_heads: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 qo_indptr (query tokens), kv_indptr (pages) [B + 1] and last_page_len [B]; an fp8 latent cache: kv_dtype e4m3 / e5m2 and its key / value scales (host factors, one-element f32 device tensors).
        """

    def run(self, q_nope: NDArray, q_pe: NDArray, ckv: NDArray, kpe: NDArray, kv_indices: NDArray, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q_nope [rows, H, 512], q_pe [rows, H, 64] over ckv [pages, page_size, 512], kpe [pages, page_size, 64] -> o [rows, H, 512], lse [rows, H] (base 2). An fp8 cache: ckv and kpe as u8 with kv_dtype e4m3 / e5m2.
        """

class BatchCascadePagedWrapper:
    """
    tessera::BatchCascadePagedWrapper (shared-prefix attention over a paged KV cache in num_levels levels, one workspace, levels merged in level order; bounds.max_batch_size bounds the groups of any level).
    """

    def __init__(self, workspace: NDArray, num_levels: int, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least workspace_size(num_levels, bounds, options) bytes (needs a GPU).
        """

    @staticmethod
    def workspace_size(num_levels: int, bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these levels and bounds needs on GPU `device`.
        """

    def num_levels(self) -> int:
        """The number of levels the wrapper was built for."""

    def plan_info(self, level: int) -> dict:
        """
        What the last plan() decided for level `level` (0 <= level < num_levels), as a dict.
        """

    def plan(self, qo_indptr: Sequence[NDArray], kv_indptr: Sequence[NDArray], last_page_len: Sequence[NDArray], page_size: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None, head_dim_vo: int = 0) -> None:
        """
        Plans a step from one entry per level (outermost first) of HOST int32 qo_indptr [groups + 1] (every level ending at the batch's rows), kv_indptr [groups + 1] (pages) and last_page_len [groups]. causal applies to the last level only. Keyword options as for BatchPrefillPagedWrapper.plan, of which the variant may set logits_soft_cap only (anything position-dependent is NotImplementedError).
        """

    def run(self, q: NDArray, kv: Sequence[tuple[NDArray | None, NDArray | None, NDArray | None, Layout, NDArray]], o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [rows, Hq, D] over one paged cache per level, each a tuple (k, v, kv, layout, indices) with (k, v) or kv given as for BatchPrefillPagedWrapper.run and indices that level's page ids -> o [rows, Hq, D], lse [rows, Hq] (base 2).
        """

class BatchBlockSparsePagedWrapper:
    """
    tessera::BatchBlockSparsePagedWrapper (paged KV under a block mask at each request's logical positions; bounds.max_batch_size bounds both the requests and the block rows).
    """

    def __init__(self, workspace: NDArray, bounds: RuntimeBounds, options: RuntimeOptions = ...) -> None:
        """
        Builds the wrapper over a caller-owned device workspace of at least min_workspace_size(bounds, options) bytes (below workspace_size it splits KV less; needs a GPU).
        """

    @staticmethod
    def workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        Bytes of device workspace a wrapper with these bounds needs on GPU `device`.
        """

    @staticmethod
    def min_workspace_size(bounds: RuntimeBounds, options: RuntimeOptions = ..., device: int = 0) -> int:
        """
        The smallest workspace a wrapper with these bounds takes on GPU `device` (below workspace_size it splits KV less).
        """

    def plan_info(self) -> dict:
        """
        What the last plan() decided, as a dict (for tests, benchmarks and logs).
        """

    def plan(self, qo_indptr: NDArray, kv_indptr: NDArray, last_page_len: NDArray, page_size: int, mask_indptr: NDArray, block_rows: int, block_cols: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, dtype: DType, sm_scale: float, causal: bool, stream: int, device: int, *, variant: VariantArgs | None = None, kv_dtype: DType | None = None, k_scale: float = 1.0, v_scale: float = 1.0, k_scale_device: NDArray | None = None, v_scale_device: NDArray | None = None) -> None:
        """
        Plans a step from HOST int32 qo_indptr, kv_indptr [B + 1] (pages), last_page_len [B] and mask_indptr [R + 1] (column blocks per block row; R = sum over requests of ceil(qo_len / block_rows)). Keyword options as for BatchDecodeWrapper.plan.
        """

    def run(self, q: NDArray, k: NDArray | None, v: NDArray | None, kv: NDArray | None, layout: Layout, indices: NDArray, mask_indices: NDArray, mask_flags: NDArray | None, o: NDArray, lse: NDArray | None, stream: int, *, kv_dtype: DType | None = None) -> None:
        """
        Runs the planned step: q [rows, Hq, D] over the paged cache ((k, v) or kv, and indices, the page ids, as for BatchPrefillPagedWrapper.run) under the block mask: mask_indices, int32 [>= mask_indptr[R]] column blocks (device or pinned host memory), mask_flags, u8 of as many entries on q's device (1: the block is fully visible) or None -> o [rows, Hq, D], lse [rows, Hq] (base 2).
        """
