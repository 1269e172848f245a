// Host dispatch of multi-head latent attention (kernels/attention/mla/decode.cuh): validation of
// the absorbed queries, the paged latent cache and the outputs, then one launch.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/mla/decode.cuh"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/tensor_checks.h"
#include "tessera/mla.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

/// A 3-D operand of the MLA kernels: f16/bf16 on CUDA, last dim `width`, 16-byte vectors.
void check_latent_operand(const TensorView& t, const char* name, int64_t width, const char* layout) {
  detail::check_view(t, name);
  TESSERA_CHECK_ARG(t.ndim == 3) << name << ".ndim = " << t.ndim << ", expected 3 (" << layout << ")";
  check_dtype(t, name, {DType::kF16, DType::kBF16});
  check_on_cuda(t, name);
  check_last_dim_contiguous(t, name);
  TESSERA_CHECK_ARG(t.shape[2] == width)
      << name << ".shape[2] = " << t.shape[2] << ", expected " << width << " (" << layout << ")";
  detail::check_vector_aligned(t, name);
}

void check_matches(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name, int dims) {
  check_dtype(t, name, {ref.dtype});
  check_same_device(ref, ref_name, t, name);
  for (int d = 0; d < dims; ++d) {
    TESSERA_CHECK_ARG(t.shape[d] == ref.shape[d]) << name << ".shape[" << d << "] = " << t.shape[d] << ", expected "
                                                  << ref.shape[d] << " (" << ref_name << ".shape[" << d << "])";
  }
}

void validate_latent_cache(const PagedLatentCache& kv) {
  check_latent_operand(kv.ckv, "kv.ckv", kMlaLatentDim, "[num_pages, page_size, 512]");
  check_latent_operand(kv.kpe, "kv.kpe", kMlaRopeDim, "[num_pages, page_size, 64]");
  check_matches(kv.kpe, "kv.kpe", kv.ckv, "kv.ckv", 2);
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

}  // namespace

void batch_mla_paged(const TensorView& q_nope, const TensorView& q_pe, const TensorView& qo_indptr,
                     int64_t max_qo_len, const PagedLatentCache& kv, const TensorView& o, const TensorView& lse,
                     const MlaOptions& options, StreamHandle stream) {
  validate_latent_cache(kv);
  const int64_t batch = kv.batch_size();
  check_latent_operand(q_nope, "q_nope", kMlaLatentDim, "[total_q, num_heads, 512]");
  check_latent_operand(q_pe, "q_pe", kMlaRopeDim, "[total_q, num_heads, 64]");
  check_matches(q_nope, "q_nope", kv.ckv, "kv.ckv", 0);
  check_matches(q_pe, "q_pe", q_nope, "q_nope", 2);
  check_latent_operand(o, "o", kMlaLatentDim, "[total_q, num_heads, 512]");
  check_matches(o, "o", q_nope, "q_nope", 2);
  const int64_t total_q = q_nope.shape[0];
  const int64_t heads = q_nope.shape[1];
  TESSERA_CHECK_ARG(heads >= 1 && heads <= 4096)
      << "q_nope.shape[1] (num_heads) = " << heads << ", expected in [1, 4096]";
  TESSERA_CHECK_ARG(std::isfinite(options.sm_scale) && options.sm_scale > 0)
      << "options.sm_scale = " << options.sm_scale << ", expected finite and > 0 (MLA has no default scale)";
  if (lse.defined()) {
    detail::check_view(lse, "lse");
    TESSERA_CHECK_ARG(lse.ndim == 2) << "lse.ndim = " << lse.ndim << ", expected 2 ([total_q, num_heads])";
    check_dtype(lse, "lse", {DType::kF32});
    check_same_device(q_nope, "q_nope", lse, "lse");
    check_size(lse, "lse", 0, total_q);
    check_size(lse, "lse", 1, heads);
    check_contiguous(lse, "lse");
  }
  int64_t grid_rows = heads;  // packed (token, head) rows of the longest request
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
  } else {
    TESSERA_CHECK_ARG(total_q == batch) << "q_nope.shape[0] = " << total_q << ", expected " << batch
                                        << " (one token per request without qo_indptr)";
  }
  TESSERA_CHECK_ARG(grid_rows < (int64_t{1} << 31))
      << "max_qo_len * num_heads = " << grid_rows << ", expected < 2^31 (rows of one request)";
  TESSERA_CHECK_ARG(batch <= INT32_MAX) << "kv.batch_size() = " << batch << ", expected < 2^31";
  if (batch == 0 || total_q == 0) return;
  if (!detail::current_device_has_wgmma()) {
    TESSERA_FAIL(StatusCode::kUnsupported)
        << "batch_mla_paged runs on sm_90 GPUs (wgmma) in a library built with sm_90a kernels; this device "
           "or build has none (no sm_80-class MLA kernel yet)";
  }
  TESSERA_DISPATCH_HALF_DTYPE(q_nope.dtype, "q_nope", T, [&] {
    using Traits = kernels::MlaTraits<T>;
    kernels::MlaParams<T> p{};
    p.q_nope = q_nope.data_as<const T>();
    p.q_pe = q_pe.data_as<const T>();
    p.q_nope_stride_token = q_nope.strides[0];
    p.q_nope_stride_head = q_nope.strides[1];
    p.q_pe_stride_token = q_pe.strides[0];
    p.q_pe_stride_head = q_pe.strides[1];
    p.qo_indptr = qo_indptr.defined() ? qo_indptr.data_as<const int32_t>() : nullptr;
    p.ckv = kv.ckv.data_as<const T>();
    p.kpe = kv.kpe.data_as<const T>();
    p.ckv_stride_page = kv.ckv.strides[0];
    p.ckv_stride_slot = kv.ckv.strides[1];
    p.kpe_stride_page = kv.kpe.strides[0];
    p.kpe_stride_slot = kv.kpe.strides[1];
    p.kv_indptr = kv.indptr.data_as<const int32_t>();
    p.kv_indices = kv.indices.data_as<const int32_t>();
    p.kv_last_page_len = kv.last_page_len.data_as<const int32_t>();
    p.page_size = static_cast<int32_t>(kv.page_size());
    p.page_div = kernels::FastDivisor::make(kv.page_size());
    p.o = o.data_as<T>();
    p.o_stride_token = o.strides[0];
    p.o_stride_head = o.strides[1];
    p.lse = lse.defined() ? lse.data_as<float>() : nullptr;
    p.batch_size = static_cast<int32_t>(batch);
    p.num_heads = static_cast<int32_t>(heads);
    p.sm_scale_log2 = static_cast<float>(options.sm_scale * 1.4426950408889634);
    p.causal = options.causal;
    const dim3 grid(static_cast<unsigned>((grid_rows + Traits::CTA_TILE_Q - 1) / Traits::CTA_TILE_Q),
                    static_cast<unsigned>(batch));
    TESSERA_CHECK(grid.y <= 65535, StatusCode::kInvalidArgument)
        << "kv.batch_size() = " << batch << ", expected <= 65535 (one grid row per request)";
    const auto kernel = kernels::mla_paged_kernel<Traits>;
    detail::ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
    kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
    TESSERA_CHECK_LAUNCH();
  });
}

}  // namespace tessera
