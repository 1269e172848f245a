// Host dispatch of multi-head latent attention (kernels/attention/mla/decode.cuh): validation of
// the absorbed queries, the paged latent cache and the outputs, then one launch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/mla/decode.cuh"
#include "kernels/attention/mla/narrow.cuh"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/kv_scales.h"
#include "src/mla_host.h"
#include "src/tensor_checks.h"
#include "tessera/merge.h"
#include "tessera/mla.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

void check_latent_operand(const TensorView& t, const char* name, int64_t width, const char* layout, bool cache) {
  check_view(t, name);
  TESSERA_CHECK_ARG(t.ndim == 3) << name << ".ndim = " << t.ndim << ", expected 3 (" << layout << ")";
  if (cache) {
    check_dtype(t, name, {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2});
  } else {
    check_dtype(t, name, {DType::kF16, DType::kBF16});
  }
  check_on_cuda(t, name);
  check_last_dim_contiguous(t, name);
  TESSERA_CHECK_ARG(t.shape[2] == width)
      << name << ".shape[2] = " << t.shape[2] << ", expected " << width << " (" << layout << ")";
  check_vector_aligned(t, name);
}

void check_latent_matches(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name,
                          int dims) {
  check_dtype(t, name, {ref.dtype});
  check_same_device(ref, ref_name, t, name);
  for (int d = 0; d < dims; ++d) {
    TESSERA_CHECK_ARG(t.shape[d] == ref.shape[d]) << name << ".shape[" << d << "] = " << t.shape[d] << ", expected "
                                                  << ref.shape[d] << " (" << ref_name << ".shape[" << d << "])";
  }
}

void check_latent_cache_dtype(const TensorView& ckv, const char* ckv_name, DType q_dtype) {
  TESSERA_CHECK_ARG(ckv.dtype == q_dtype || is_fp8(ckv.dtype))
      << ckv_name << ".dtype = " << dtype_name(ckv.dtype) << ", expected q_nope.dtype (" << dtype_name(q_dtype)
      << "), e4m3 or e5m2";
}

void check_latent_lse(const TensorView& lse, const TensorView& q, int64_t rows, int64_t num_heads) {
  if (!lse.defined()) return;
  check_view(lse, "lse");
  TESSERA_CHECK_ARG(lse.ndim == 2) << "lse.ndim = " << lse.ndim << ", expected 2 ([rows, num_heads])";
  check_dtype(lse, "lse", {DType::kF32});
  check_same_device(q, "q_nope", lse, "lse");
  check_size(lse, "lse", 0, rows);
  check_size(lse, "lse", 1, num_heads);
  check_contiguous(lse, "lse");
}

}  // namespace detail

namespace {

using detail::check_latent_matches;
using detail::check_latent_operand;

void validate_latent_cache(const PagedLatentCache& kv) {
  check_latent_operand(kv.ckv, "kv.ckv", kMlaLatentDim, "[num_pages, page_size, 512]", true);
  check_latent_operand(kv.kpe, "kv.kpe", kMlaRopeDim, "[num_pages, page_size, 64]", true);
  check_latent_matches(kv.kpe, "kv.kpe", kv.ckv, "kv.ckv", 2);
  detail::check_kv_scales(kv.scales, "kv.scales", kv.ckv.dtype, 1, kv.ckv.device);
  TESSERA_CHECK_ARG(kv.ckv.shape[1] >= 1 && kv.ckv.shape[1] < (int64_t{1} << 31))
      << "kv.ckv.shape[1] (page_size) = " << kv.ckv.shape[1] << ", expected in [1, 2^31)";
  // The page table is a paged cache's: validate it through a one-head PagedKV view of ckv.
  PagedKV view;
  view.layout = Layout::kNHD;
  view.k = kv.ckv;
  view.k.ndim = 4;
  view.k.shape[3] = kv.ckv.shape[2];
  view.k.strides[3] = 1;
  view.k.shape[2] = 1;
  view.k.strides[2] = kv.ckv.shape[2];
  view.v = view.k;
  view.indptr = kv.indptr;
  view.indices = kv.indices;
  view.last_page_len = kv.last_page_len;
  validate_paged_kv(view, "kv");
}

/// The split states' layout in the workspace: output [total_q, splits, heads, 512] in the queries'
/// dtype, then (256-byte aligned) the f32 LSE [total_q, splits, heads].
struct SplitStates {
  int64_t o_bytes;
  int64_t lse_offset;
  int64_t total_bytes;
  static SplitStates of(int64_t total_q, int64_t heads, int64_t splits, DType dtype) {
    SplitStates st;
    const int64_t states = total_q * splits * heads;
    st.o_bytes = states * kMlaLatentDim * static_cast<int64_t>(dtype_size(dtype));
    st.lse_offset = (st.o_bytes + 255) / 256 * 256;
    st.total_bytes = st.lse_offset + states * 4;
    return st;
  }
};

constexpr int64_t kMaxKvSplits = 256;

/// The one-shot kernel for a batch whose requests have up to grid_rows packed rows: the narrow
/// tile (the rows as the MMAs' N) when they fit its 16 rows, else the 64-row tile.
template <typename T, typename KVT>
void launch_mla_tile(const kernels::MlaParams<T, KVT>& p, int64_t grid_rows, dim3 grid, StreamHandle stream) {
  using Narrow = kernels::MlaNarrowTraits<T, KVT>;
  if (grid_rows <= Narrow::CTA_TILE_Q) {
    using Schedule = kernels::MlaSplitGridSchedule<Narrow>;
    const auto kernel = kernels::mla_paged_narrow_kernel<Narrow, Schedule>;
    detail::ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Narrow::kSmemBytes);
    kernel<<<dim3(1, grid.y, grid.z), Narrow::kThreads, Narrow::kSmemBytes, stream>>>(p, typename Schedule::Args{});
    TESSERA_CHECK_LAUNCH();
    return;
  }
  using Traits = kernels::MlaTraits<T, KVT>;
  using Schedule = kernels::MlaSplitGridSchedule<Traits>;
  const auto kernel = kernels::mla_paged_kernel<Traits, Schedule>;
  detail::ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p, typename Schedule::Args{});
  TESSERA_CHECK_LAUNCH();
}

}  // namespace

int64_t batch_mla_paged_workspace_bytes(int64_t total_q, int64_t num_heads, int64_t num_kv_splits, DType dtype) {
  TESSERA_CHECK_ARG(total_q >= 0 && total_q < (int64_t{1} << 31)) << "total_q = " << total_q << ", expected in [0, 2^31)";
  TESSERA_CHECK_ARG(num_heads >= 1 && num_heads <= 4096) << "num_heads = " << num_heads << ", expected in [1, 4096]";
  TESSERA_CHECK_ARG(num_kv_splits >= 1 && num_kv_splits <= kMaxKvSplits)
      << "num_kv_splits = " << num_kv_splits << ", expected in [1, " << kMaxKvSplits << "]";
  TESSERA_CHECK_ARG(dtype == DType::kF16 || dtype == DType::kBF16)
      << "dtype = " << dtype << ", expected f16 or bf16 (the queries' dtype)";
  return num_kv_splits == 1 ? 0 : SplitStates::of(total_q, num_heads, num_kv_splits, dtype).total_bytes;
}

int64_t batch_mla_paged_num_kv_splits(int64_t batch_size, int64_t max_qo_len, int64_t num_heads, int64_t max_kv_len,
                                      int64_t sm_count) {
  TESSERA_CHECK_ARG(batch_size >= 0) << "batch_size = " << batch_size << ", expected >= 0";
  TESSERA_CHECK_ARG(max_qo_len >= 1 && max_qo_len < (int64_t{1} << 31))
      << "max_qo_len = " << max_qo_len << ", expected in [1, 2^31)";
  TESSERA_CHECK_ARG(num_heads >= 1 && num_heads <= 4096) << "num_heads = " << num_heads << ", expected in [1, 4096]";
  TESSERA_CHECK_ARG(max_kv_len >= 0) << "max_kv_len = " << max_kv_len << ", expected >= 0";
  TESSERA_CHECK_ARG(sm_count >= 1) << "sm_count = " << sm_count << ", expected >= 1";
  // A split shorter than four tiles spends more on its ramp and its state's merge than it saves.
  constexpr int64_t kMinTilesPerSplit = 4;
  const int64_t row_tiles = (max_qo_len * num_heads + 63) / 64;
  const int64_t ctas = std::max<int64_t>(1, batch_size * row_tiles);
  const int64_t by_sms = sm_count / ctas;
  const int64_t by_length = max_kv_len / 64 / kMinTilesPerSplit;
  return std::max<int64_t>(1, std::min({by_sms, by_length, kMaxKvSplits}));
}

void batch_mla_paged(const TensorView& q_nope, const TensorView& q_pe, const TensorView& qo_indptr,
                     int64_t max_qo_len, const PagedLatentCache& kv, const TensorView& o, const TensorView& lse,
                     const MlaOptions& options, StreamHandle stream) {
  validate_latent_cache(kv);
  const int64_t batch = kv.batch_size();
  check_latent_operand(q_nope, "q_nope", kMlaLatentDim, "[total_q, num_heads, 512]");
  check_latent_operand(q_pe, "q_pe", kMlaRopeDim, "[total_q, num_heads, 64]");
  detail::check_latent_cache_dtype(kv.ckv, "kv.ckv", q_nope.dtype);
  check_same_device(kv.ckv, "kv.ckv", q_nope, "q_nope");
  check_latent_matches(q_pe, "q_pe", q_nope, "q_nope", 2);
  check_latent_operand(o, "o", kMlaLatentDim, "[total_q, num_heads, 512]");
  check_latent_matches(o, "o", q_nope, "q_nope", 2);
  const int64_t total_q = q_nope.shape[0];
  const int64_t heads = q_nope.shape[1];
  TESSERA_CHECK_ARG(heads >= 1 && heads <= 4096)
      << "q_nope.shape[1] (num_heads) = " << heads << ", expected in [1, 4096]";
  TESSERA_CHECK_ARG(std::isfinite(options.sm_scale) && options.sm_scale > 0)
      << "options.sm_scale = " << options.sm_scale << ", expected finite and > 0 (MLA has no default scale)";
  detail::check_latent_lse(lse, q_nope, total_q, heads);
  int64_t grid_rows = heads;  // packed (token, head) rows of the longest request
  int64_t covered_q = total_q;  // query rows some request owns (known when qo_indptr is readable)
  if (qo_indptr.defined()) {
    check_same_device(q_nope, "q_nope", qo_indptr, "qo_indptr");
    const std::vector<int32_t> indptr = validate_indptr(qo_indptr, "qo_indptr", total_q);
    TESSERA_CHECK_ARG(qo_indptr.shape[0] == batch + 1)
        << "qo_indptr.shape[0] = " << qo_indptr.shape[0] << ", expected " << batch + 1
        << " (kv.batch_size() + 1)";
    TESSERA_CHECK_ARG(max_qo_len >= 1 && max_qo_len <= total_q + 1)
        << "max_qo_len = " << max_qo_len << ", expected in [1, total_q + 1 = " << total_q + 1 << "]";
    for (size_t b = 0; b + 1 < indptr.size(); ++b) {
      TESSERA_CHECK_ARG(indptr[b + 1] - indptr[b] <= max_qo_len)
          << "qo_indptr gives request " << b << " " << indptr[b + 1] - indptr[b] << " tokens, more than max_qo_len = "
          << max_qo_len;
    }
    grid_rows = max_qo_len * heads;
    if (!indptr.empty()) covered_q = indptr.back();
  } else {
    TESSERA_CHECK_ARG(total_q == batch) << "q_nope.shape[0] = " << total_q << ", expected " << batch
                                        << " (one token per request without qo_indptr)";
  }
  TESSERA_CHECK_ARG(grid_rows < (int64_t{1} << 31))
      << "max_qo_len * num_heads = " << grid_rows << ", expected < 2^31 (rows of one request)";
  TESSERA_CHECK_ARG(batch <= INT32_MAX) << "kv.batch_size() = " << batch << ", expected < 2^31";
  const int64_t splits = options.num_kv_splits;
  TESSERA_CHECK_ARG(splits >= 1 && splits <= kMaxKvSplits)
      << "options.num_kv_splits = " << splits << ", expected in [1, " << kMaxKvSplits << "]";
  const SplitStates states = SplitStates::of(total_q, heads, splits, q_nope.dtype);
  if (splits > 1) {
    // The merge writes every row of o: each must belong to a request.
    TESSERA_CHECK_ARG(covered_q == total_q)
        << "qo_indptr[batch_size] = " << covered_q << ", expected q_nope.shape[0] = " << total_q
        << " with options.num_kv_splits > 1 (every query row in a request)";
    const TensorView& ws = options.workspace;
    TESSERA_CHECK_ARG(ws.defined() && ws.data != nullptr)
        << "options.workspace is undefined, expected " << states.total_bytes << " bytes of device memory for "
        << splits << " KV splits (batch_mla_paged_workspace_bytes)";
    detail::check_view(ws, "options.workspace");
    check_on_cuda(ws, "options.workspace");
    check_same_device(q_nope, "q_nope", ws, "options.workspace");
    check_contiguous(ws, "options.workspace");
    const int64_t bytes = ws.numel() * static_cast<int64_t>(dtype_size(ws.dtype));
    TESSERA_CHECK_ARG(bytes >= states.total_bytes)
        << "options.workspace holds " << bytes << " bytes, expected >= " << states.total_bytes << " for " << splits
        << " KV splits of " << total_q << " x " << heads << " rows";
    TESSERA_CHECK_ARG(reinterpret_cast<uintptr_t>(ws.data) % 256 == 0)
        << "options.workspace.data = " << ws.data << ", expected 256-byte aligned";
  }
  if (batch == 0 || total_q == 0) return;
  if (!detail::current_device_has_wgmma()) {
    TESSERA_FAIL(StatusCode::kUnsupported)
        << "batch_mla_paged runs on sm_90 GPUs (wgmma) in a library built with sm_90a kernels; this device "
           "or build has none (no sm_80-class MLA kernel yet)";
  }
  TESSERA_DISPATCH_HALF_DTYPE(q_nope.dtype, "q_nope", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(kv.ckv.dtype, T, "kv.ckv", KVT, [&] {
      using Traits = kernels::MlaTraits<T, KVT>;
      kernels::MlaParams<T, KVT> p{};
      detail::set_mla_tensor_params(p, q_nope, q_pe, kv.ckv, kv.kpe, o, lse);
      p.scales = detail::kv_scale_params(kv.scales);
      p.qo_indptr = qo_indptr.defined() ? qo_indptr.data_as<const int32_t>() : nullptr;
      p.kv_indptr = kv.indptr.data_as<const int32_t>();
      p.kv_indices = kv.indices.data_as<const int32_t>();
      p.kv_last_page_len = kv.last_page_len.data_as<const int32_t>();
      p.num_kv_splits = static_cast<int32_t>(splits);
      unsigned char* ws = splits > 1 ? static_cast<unsigned char*>(options.workspace.data) : nullptr;
      p.partial_o = splits > 1 ? reinterpret_cast<T*>(ws) : nullptr;
      p.partial_lse = splits > 1 ? reinterpret_cast<float*>(ws + states.lse_offset) : nullptr;
      p.batch_size = static_cast<int32_t>(batch);
      p.sm_scale_log2 = static_cast<float>(options.sm_scale * 1.4426950408889634);
      p.causal = options.causal;
      const dim3 grid(static_cast<unsigned>((grid_rows + Traits::CTA_TILE_Q - 1) / Traits::CTA_TILE_Q),
                      static_cast<unsigned>(batch), static_cast<unsigned>(splits));
      TESSERA_CHECK(grid.y <= 65535, StatusCode::kInvalidArgument)
          << "kv.batch_size() = " << batch << ", expected <= 65535 (one grid row per request)";
      launch_mla_tile<T, KVT>(p, grid_rows, grid, stream);
      if (splits > 1) {
        // The split states, in split order, into o and lse.
        const TensorView v(p.partial_o, q_nope.dtype, {total_q, splits, heads, kMlaLatentDim}, q_nope.device);
        const TensorView s(p.partial_lse, DType::kF32, {total_q, splits, heads}, q_nope.device);
        merge_states(v, s, o, lse, stream);
      }
    });
  });
}

}  // namespace tessera
