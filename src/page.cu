// Host dispatch for appending to a paged KV cache (kernels/page/append.cuh).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/page/append.cuh"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/check.h"
#include "src/kv_scales.h"
#include "src/tensor_checks.h"
#include "tessera/page.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

/// Validates the appended rows and the scales against the cache and returns nnz.
int32_t check_append_rows(const TensorView& append_k, const TensorView& append_v, const PagedKV& cache,
                          const KVScales& scales) {
  validate_paged_kv(cache, "cache");  // also: cache.v has cache.k's dtype, shape and device
  check_on_cuda(cache.k, "cache.k");
  check_dtype(cache.k, "cache.k", {DType::kF16, DType::kBF16, DType::kF32, DType::kE4M3, DType::kE5M2});
  const DType kv_dtype = cache.k.dtype;
  for (const auto& [t, name] : {std::pair<const TensorView&, const char*>{append_k, "append_k"},
                                {append_v, "append_v"}}) {
    check_ndim(t, name, 3);
    check_on_cuda(t, name);
    check_same_device(cache.k, "cache.k", t, name);
    // An fp8 cache quantizes 16-bit rows; any other cache takes a copy of rows of its own dtype.
    if (is_fp8(kv_dtype)) {
      TESSERA_CHECK_ARG(is_half_precision(t.dtype))
          << name << ".dtype = " << t.dtype << ", expected f16 or bf16 (rows quantized into the " << kv_dtype
          << " cache)";
    } else {
      TESSERA_CHECK_ARG(t.dtype == kv_dtype)
          << name << ".dtype = " << t.dtype << ", expected " << kv_dtype << " (the dtype of cache.k)";
    }
    check_last_dim_contiguous(t, name);
    check_size(t, name, 0, append_k.shape[0]);
    check_size(t, name, 1, cache.num_kv_heads());
    check_size(t, name, 2, cache.head_dim());
    detail::check_vector_aligned(t, name);
  }
  // One kernel reads both: K's and V's rows must agree (implied above unless the cache is fp8).
  TESSERA_CHECK_ARG(append_v.dtype == append_k.dtype)
      << "append_v.dtype = " << append_v.dtype << ", expected " << append_k.dtype << " (the dtype of append_k)";
  detail::check_kv_scales(scales, "scales", kv_dtype, cache.num_kv_heads(), cache.k.device);
  detail::check_vector_aligned(cache.k, "cache.k");
  detail::check_vector_aligned(cache.v, "cache.v");
  for (const auto& [t, name] : {std::pair<const TensorView&, const char*>{cache.indptr, "cache.indptr"},
                                {cache.indices, "cache.indices"},
                                {cache.last_page_len, "cache.last_page_len"}}) {
    check_on_cuda(t, name);
  }
  if (append_k.shape[0] > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, "append_k.shape[0] = " + std::to_string(append_k.shape[0]) + " exceeds 2^31 - 1 rows");
  }
  if (cache.num_pages() > INT32_MAX || cache.indices.shape[0] > INT32_MAX || cache.page_size() > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, "cache: num_pages = " + std::to_string(cache.num_pages()) + ", page_size = " +
                  std::to_string(cache.page_size()) + ", expected both < 2^31");
  }
  return static_cast<int32_t>(append_k.shape[0]);
}

template <typename T>
kernels::PagedCacheDesc<T> describe_cache(const PagedKV& cache) {
  kernels::PagedCacheDesc<T> c{};
  c.k = cache.k.data_as<T>();
  c.v = cache.v.data_as<T>();
  c.k_page_stride = cache.k_page_stride();
  c.k_slot_stride = cache.k_slot_stride();
  c.k_head_stride = cache.k_head_stride();
  c.v_page_stride = cache.v_page_stride();
  c.v_slot_stride = cache.v_slot_stride();
  c.v_head_stride = cache.v_head_stride();
  c.page_indptr = cache.indptr.data_as<const int32_t>();
  c.page_indices = cache.indices.data_as<const int32_t>();
  c.last_page_len = cache.last_page_len.data_as<const int32_t>();
  c.batch_size = static_cast<int32_t>(cache.batch_size());
  c.page_size = static_cast<int32_t>(cache.page_size());
  c.num_pages = static_cast<int32_t>(cache.num_pages());
  c.num_indices = static_cast<int32_t>(cache.indices.shape[0]);
  return c;
}

/// Where each mode's rows go: the append indptr, or per-row requests and positions.
struct AppendTargets {
  const int32_t* append_indptr = nullptr;  // kFromIndptr
  const int32_t* batch_indices = nullptr;  // kExplicit
  const int32_t* positions = nullptr;      // kExplicit
};

template <typename In, typename Cache, kernels::AppendTargetMode kMode>
void launch_append(const AppendTargets& targets, const TensorView& append_k, const TensorView& append_v,
                   const PagedKV& cache, const KVScales& scales, StreamHandle stream) {
  kernels::AppendParams<In, Cache> p{};
  p.append_k = append_k.data_as<const In>();
  p.append_v = append_v.data_as<const In>();
  p.k_row_stride = append_k.strides[0];
  p.k_head_stride = append_k.strides[1];
  p.v_row_stride = append_v.strides[0];
  p.v_head_stride = append_v.strides[1];
  p.append_indptr = targets.append_indptr;
  p.batch_indices = targets.batch_indices;
  p.positions = targets.positions;
  p.cache = describe_cache<Cache>(cache);
  p.scales = detail::kv_scale_params(scales);
  p.nnz = static_cast<int32_t>(append_k.shape[0]);
  p.num_heads = static_cast<int32_t>(append_k.shape[1]);
  p.head_dim = static_cast<int32_t>(append_k.shape[2]);
  using Traits = kernels::AppendTraits<In, Cache>;
  constexpr int kThreads = Traits::kThreadsPerBlock;
  const long long threads = append_k.numel() / Traits::kVecElems;
  kernels::append_paged_kv_cache_kernel<In, Cache, kMode>
      <<<detail::grid_stride_blocks(threads, kThreads), kThreads, 0, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

/// The kernel for the (rows, cache) dtype pair that check_append_rows accepted: a copy for a cache
/// of the rows' dtype, f16/bf16 rows quantized for an fp8 cache.
template <kernels::AppendTargetMode kMode>
void dispatch_append(const AppendTargets& targets, const TensorView& append_k, const TensorView& append_v,
                     const PagedKV& cache, const KVScales& scales, StreamHandle stream) {
  const DType kv_dtype = cache.k.dtype;
  if (!is_fp8(kv_dtype)) {
    TESSERA_DISPATCH_FLOAT_DTYPE(kv_dtype, "cache.k", T, [&] {
      launch_append<T, T, kMode>(targets, append_k, append_v, cache, scales, stream);
    });
    return;
  }
  TESSERA_DISPATCH_HALF_DTYPE(append_k.dtype, "append_k", In, [&] {
    if (kv_dtype == DType::kE4M3) {
      launch_append<In, __nv_fp8_e4m3, kMode>(targets, append_k, append_v, cache, scales, stream);
    } else {
      launch_append<In, __nv_fp8_e5m2, kMode>(targets, append_k, append_v, cache, scales, stream);
    }
  });
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                           const TensorView& append_indptr, const PagedKV& cache, StreamHandle stream,
                           const KVScales& scales) {
  const int32_t nnz = check_append_rows(append_k, append_v, cache, scales);
  check_on_cuda(append_indptr, "append_indptr");
  check_same_device(cache.k, "cache.k", append_indptr, "append_indptr");
  const std::vector<int32_t> host_indptr = validate_indptr(append_indptr, "append_indptr", nnz);
  check_size(append_indptr, "append_indptr", 0, cache.batch_size() + 1);
  if (!host_indptr.empty() && host_indptr.back() != nnz) {
    throw_error(StatusCode::kInvalidArgument, "append_indptr[" + std::to_string(host_indptr.size() - 1) + "] = " +
                  std::to_string(host_indptr.back()) + ", expected " + std::to_string(nnz) + " (append_k.shape[0])");
  }
  if (nnz == 0 || append_k.numel() == 0) return;
  AppendTargets targets;
  targets.append_indptr = append_indptr.data_as<const int32_t>();
  dispatch_append<kernels::AppendTargetMode::kFromIndptr>(targets, append_k, append_v, cache, scales, stream);
}

void append_paged_kv_cache_at(const TensorView& append_k, const TensorView& append_v,
                              const TensorView& batch_indices, const TensorView& positions, const PagedKV& cache,
                              StreamHandle stream, const KVScales& scales) {
  const int32_t nnz = check_append_rows(append_k, append_v, cache, scales);
  for (const auto& [t, name] : {std::pair<const TensorView&, const char*>{batch_indices, "batch_indices"},
                                {positions, "positions"}}) {
    check_ndim(t, name, 1);
    check_dtype(t, name, {DType::kI32});
    check_on_cuda(t, name);
    check_same_device(cache.k, "cache.k", t, name);
    check_size(t, name, 0, nnz);
  }
  if (nnz == 0 || append_k.numel() == 0) return;
  AppendTargets targets;
  targets.batch_indices = batch_indices.data_as<const int32_t>();
  targets.positions = positions.data_as<const int32_t>();
  dispatch_append<kernels::AppendTargetMode::kExplicit>(targets, append_k, append_v, cache, scales, stream);
}

}  // namespace tessera
