// Host dispatch for appending to a paged KV cache and to a paged MLA latent cache
// (kernels/page/append.cuh).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/page/append.cuh"
#include "kernels/page/index_copy.cuh"
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

// ---- MLA latent caches ----

/// A data tensor of the latent append: check_rows_tensor's checks, on a CUDA device.
void check_latent_tensor(const TensorView& t, const char* name, int ndim, const char* shape) {
  detail::check_rows_tensor(t, name, ndim, shape);
  check_on_cuda(t, name);
}

/// ckv/kpe widths: whole 16-byte vectors, at least one.
void check_latent_width(const TensorView& t, const char* name, int dim) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(t.dtype));
  TESSERA_CHECK_ARG(t.shape[dim] >= vec && t.shape[dim] % vec == 0)
      << name << ".shape[" << dim << "] = " << t.shape[dim] << ", expected a positive multiple of " << vec
      << " (whole 16-byte vectors of " << t.dtype << ")";
}

/// A per-row or page-table index array: 1-D i32, contiguous, on the cache's device.
void check_latent_index_array(const TensorView& t, const char* name, const TensorView& cache) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {DType::kI32});
  TESSERA_CHECK_ARG(t.shape[0] <= 1 || t.strides[0] == 1)
      << name << ".strides[0] = " << t.strides[0] << ", expected 1 (index arrays must be contiguous)";
  TESSERA_CHECK_ARG(t.defined()) << name << ".data = null, expected a pointer to " << t.shape[0] << " elements";
  check_on_cuda(t, name);
  check_same_device(cache, "ckv_cache", t, name);
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

namespace {

/// append_paged_mla_kv_cache's cache: two page tensors of one 16-bit or fp8 dtype, the same pages
/// and page size.
void check_mla_cache(const TensorView& ckv_cache, const TensorView& kpe_cache) {
  check_latent_tensor(ckv_cache, "ckv_cache", 3, "[num_pages, page_size, ckv_dim]");
  check_dtype(ckv_cache, "ckv_cache", {DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2});
  TESSERA_CHECK_ARG(ckv_cache.shape[1] >= 1)
      << "ckv_cache.shape[1] = " << ckv_cache.shape[1] << ", expected >= 1 (page_size)";
  check_latent_width(ckv_cache, "ckv_cache", 2);
  detail::check_vector_aligned(ckv_cache, "ckv_cache");
  check_latent_tensor(kpe_cache, "kpe_cache", 3, "[num_pages, page_size, kpe_dim]");
  TESSERA_CHECK_ARG(kpe_cache.dtype == ckv_cache.dtype)
      << "kpe_cache.dtype = " << kpe_cache.dtype << ", expected " << ckv_cache.dtype << " (the dtype of ckv_cache)";
  check_same_device(ckv_cache, "ckv_cache", kpe_cache, "kpe_cache");
  TESSERA_CHECK_ARG(kpe_cache.shape[0] == ckv_cache.shape[0])
      << "kpe_cache.shape[0] = " << kpe_cache.shape[0] << ", expected " << ckv_cache.shape[0]
      << " (num_pages: ckv_cache.shape[0])";
  TESSERA_CHECK_ARG(kpe_cache.shape[1] == ckv_cache.shape[1])
      << "kpe_cache.shape[1] = " << kpe_cache.shape[1] << ", expected " << ckv_cache.shape[1]
      << " (page_size: ckv_cache.shape[1])";
  check_latent_width(kpe_cache, "kpe_cache", 2);
  detail::check_vector_aligned(kpe_cache, "kpe_cache");
}

/// The appended rows: the cache's dtype and widths, one row count.
void check_mla_rows(const TensorView& append_ckv, const TensorView& append_kpe, const TensorView& ckv_cache,
                    const TensorView& kpe_cache) {
  check_latent_tensor(append_ckv, "append_ckv", 2, "[nnz, ckv_dim]");
  check_latent_tensor(append_kpe, "append_kpe", 2, "[nnz, kpe_dim]");
  for (const auto& [t, name] : {std::pair<const TensorView&, const char*>{append_ckv, "append_ckv"},
                                {append_kpe, "append_kpe"}}) {
    TESSERA_CHECK_ARG(t.dtype == ckv_cache.dtype)
        << name << ".dtype = " << t.dtype << ", expected " << ckv_cache.dtype << " (the dtype of ckv_cache)";
    check_same_device(ckv_cache, "ckv_cache", t, name);
  }
  const int64_t nnz = append_ckv.shape[0];
  TESSERA_CHECK_ARG(append_ckv.shape[1] == ckv_cache.shape[2])
      << "append_ckv.shape[1] = " << append_ckv.shape[1] << ", expected " << ckv_cache.shape[2]
      << " (ckv_dim: ckv_cache.shape[2])";
  TESSERA_CHECK_ARG(append_kpe.shape[0] == nnz)
      << "append_kpe.shape[0] = " << append_kpe.shape[0] << ", expected " << nnz << " (nnz: append_ckv.shape[0])";
  TESSERA_CHECK_ARG(append_kpe.shape[1] == kpe_cache.shape[2])
      << "append_kpe.shape[1] = " << append_kpe.shape[1] << ", expected " << kpe_cache.shape[2]
      << " (kpe_dim: kpe_cache.shape[2])";
  detail::check_vector_aligned(append_ckv, "append_ckv");
  detail::check_vector_aligned(append_kpe, "append_kpe");
}

/// Checked mode (tessera/validate.h; host_indptr is empty otherwise): the page table's values and
/// every row's target, which the kernel would otherwise skip silently.
void check_mla_targets(const std::vector<int32_t>& host_indptr, const TensorView& kv_indices,
                       const TensorView& kv_last_page_len, const TensorView& batch_indices,
                       const TensorView& positions, int64_t num_pages, int64_t page_size, int64_t nnz) {
  if (host_indptr.empty()) return;
  const int64_t batch_size = static_cast<int64_t>(host_indptr.size()) - 1;
  const std::vector<int32_t> ids = detail::read_index_values(kv_indices, "kv_indices", host_indptr.back());
  detail::check_page_ids(host_indptr, ids.data(), num_pages, "kv_indices");
  const std::vector<int32_t> last = detail::read_index_values(kv_last_page_len, "kv_last_page_len", batch_size);
  std::vector<int64_t> kv_len(static_cast<size_t>(batch_size), 0);
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t pages = host_indptr[b + 1] - host_indptr[b];
    if (pages == 0) continue;  // an empty request's last_page_len is ignored
    TESSERA_CHECK_ARG(last[b] >= 1 && last[b] <= page_size)
        << "kv_last_page_len[" << b << "] = " << last[b] << " is out of range [1, " << page_size
        << "] for a request with " << pages << (pages == 1 ? " page" : " pages");
    kv_len[b] = (pages - 1) * page_size + last[b];
  }
  const std::vector<int32_t> rows_b = detail::read_index_values(batch_indices, "batch_indices", nnz);
  const std::vector<int32_t> rows_pos = detail::read_index_values(positions, "positions", nnz);
  for (int64_t i = 0; i < nnz; ++i) {
    const int32_t b = rows_b[i];
    TESSERA_CHECK_ARG(b >= 0 && b < batch_size)
        << "batch_indices[" << i << "] = " << b << " is out of range [0, " << batch_size
        << ") (batch_size = kv_indptr.shape[0] - 1)";
    TESSERA_CHECK_ARG(rows_pos[i] >= 0 && rows_pos[i] < kv_len[b])
        << "positions[" << i << "] = " << rows_pos[i] << " is out of range [0, " << kv_len[b]
        << ") (the KV length of request " << b
        << " from kv_indptr and kv_last_page_len: the page table must include the appended rows)";
  }
}

/// The append kernel over checked arguments (nnz >= 1 rows).
template <typename T>
void launch_append_mla(const TensorView& append_ckv, const TensorView& append_kpe, const TensorView& batch_indices,
                       const TensorView& positions, const TensorView& ckv_cache, const TensorView& kpe_cache,
                       const TensorView& kv_indptr, const TensorView& kv_indices, const TensorView& kv_last_page_len,
                       StreamHandle stream) {
  kernels::AppendMlaParams<T> p{};
  p.append_ckv = append_ckv.data_as<const T>();
  p.append_kpe = append_kpe.data_as<const T>();
  p.ckv_row_stride = append_ckv.strides[0];
  p.kpe_row_stride = append_kpe.strides[0];
  p.batch_indices = batch_indices.data_as<const int32_t>();
  p.positions = positions.data_as<const int32_t>();
  kernels::AppendMlaCacheDesc<T>& c = p.cache;
  c.ckv = ckv_cache.data_as<T>();
  c.kpe = kpe_cache.data_as<T>();
  c.ckv_page_stride = ckv_cache.strides[0];
  c.ckv_slot_stride = ckv_cache.strides[1];
  c.kpe_page_stride = kpe_cache.strides[0];
  c.kpe_slot_stride = kpe_cache.strides[1];
  c.page_indptr = kv_indptr.data_as<const int32_t>();
  c.page_indices = kv_indices.data_as<const int32_t>();
  c.last_page_len = kv_last_page_len.data_as<const int32_t>();
  c.batch_size = static_cast<int32_t>(kv_indptr.shape[0] - 1);
  c.page_size = static_cast<int32_t>(ckv_cache.shape[1]);
  c.num_pages = static_cast<int32_t>(ckv_cache.shape[0]);
  c.num_indices = static_cast<int32_t>(kv_indices.shape[0]);
  p.nnz = static_cast<int32_t>(append_ckv.shape[0]);
  p.ckv_vecs = static_cast<int32_t>(ckv_cache.shape[2] / kernels::vec_elems<T>());
  p.kpe_vecs = static_cast<int32_t>(kpe_cache.shape[2] / kernels::vec_elems<T>());
  constexpr int kThreads = kernels::AppendMlaTraits::kThreadsPerBlock;
  const long long threads = static_cast<long long>(p.nnz) * (p.ckv_vecs + p.kpe_vecs);
  kernels::append_paged_mla_kv_cache_kernel<T>
      <<<detail::grid_stride_blocks(threads, kThreads), kThreads, 0, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

}  // namespace

void append_paged_mla_kv_cache(const TensorView& append_ckv, const TensorView& append_kpe,
                               const TensorView& batch_indices, const TensorView& positions,
                               const TensorView& ckv_cache, const TensorView& kpe_cache, const TensorView& kv_indptr,
                               const TensorView& kv_indices, const TensorView& kv_last_page_len, StreamHandle stream) {
  check_mla_cache(ckv_cache, kpe_cache);
  check_mla_rows(append_ckv, append_kpe, ckv_cache, kpe_cache);
  const int64_t num_pages = ckv_cache.shape[0], page_size = ckv_cache.shape[1];
  const int64_t nnz = append_ckv.shape[0];

  // Per-row targets and the page table, all on the cache's device.
  check_latent_index_array(batch_indices, "batch_indices", ckv_cache);
  check_size(batch_indices, "batch_indices", 0, nnz);
  check_latent_index_array(positions, "positions", ckv_cache);
  check_size(positions, "positions", 0, nnz);
  check_latent_index_array(kv_indptr, "kv_indptr", ckv_cache);
  check_latent_index_array(kv_indices, "kv_indices", ckv_cache);
  check_latent_index_array(kv_last_page_len, "kv_last_page_len", ckv_cache);
  // [0] == 0, non-decreasing, last <= the length of kv_indices; the values only in checked mode.
  const std::vector<int32_t> host_indptr = validate_indptr(kv_indptr, "kv_indptr", kv_indices.shape[0]);
  const int64_t batch_size = kv_indptr.shape[0] - 1;
  TESSERA_CHECK_ARG(kv_last_page_len.shape[0] == batch_size)
      << "kv_last_page_len.shape[0] = " << kv_last_page_len.shape[0] << ", expected " << batch_size
      << " (batch_size = kv_indptr.shape[0] - 1)";
  const int64_t ckv_dim = ckv_cache.shape[2], kpe_dim = kpe_cache.shape[2];
  if (nnz > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, "append_ckv.shape[0] = " + std::to_string(nnz) + " exceeds 2^31 - 1 rows");
  }
  if (ckv_dim + kpe_dim > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, "ckv_cache.shape[2] + kpe_cache.shape[2] = " + std::to_string(ckv_dim + kpe_dim) +
                  ", expected < 2^31 elements per row");
  }
  if (num_pages > INT32_MAX || page_size > INT32_MAX || kv_indices.shape[0] > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, "ckv_cache: num_pages = " + std::to_string(num_pages) + ", page_size = " +
                  std::to_string(page_size) + ", kv_indices.shape[0] = " + std::to_string(kv_indices.shape[0]) +
                  ", expected each < 2^31");
  }
  check_mla_targets(host_indptr, kv_indices, kv_last_page_len, batch_indices, positions, num_pages, page_size, nnz);
  if (nnz == 0) return;
  // A bit copy: the kernel only needs the element size (an fp8 row is bytes, copied as such).
  if (is_fp8(ckv_cache.dtype)) {
    launch_append_mla<uint8_t>(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indptr,
                               kv_indices, kv_last_page_len, stream);
    return;
  }
  TESSERA_DISPATCH_HALF_DTYPE(ckv_cache.dtype, "ckv_cache", T, [&] {
    launch_append_mla<T>(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indptr,
                         kv_indices, kv_last_page_len, stream);
  });
}

namespace {

/// One copy of copy_index_arrays, checked: `name` is "copies[i]".
void check_index_copy(const IndexArrayCopy& c, const std::string& name, int device) {
  TESSERA_CHECK_ARG(c.count >= 0 && c.count < (int64_t{1} << 31))
      << name << ".count = " << c.count << ", expected 0 <= count < 2^31";
  for (const auto& [t, which] : {std::pair<const TensorView*, const char*>{&c.dst, ".dst"}, {&c.src, ".src"}}) {
    TESSERA_CHECK_ARG(t->ndim == 1 && t->dtype == DType::kI32 && t->shape[0] >= c.count)
        << name << which << " is " << t->describe() << ", expected 1-D i32 with at least " << c.count << " entries";
    TESSERA_CHECK_ARG(c.count <= 1 || t->strides[0] == 1)
        << name << which << " has stride " << t->strides[0] << ", expected contiguous entries (stride 1)";
    TESSERA_CHECK_ARG(c.count == 0 || t->data != nullptr) << name << which << " has no data";
  }
  TESSERA_CHECK_ARG(c.dst.device.type == DeviceType::kCUDA && c.dst.device.id == device)
      << name << ".dst is on " << c.dst.device << ", expected the current GPU (cuda:" << device << ")";
  TESSERA_CHECK_ARG(c.src.device.is_host() || c.src.device.id == device)
      << name << ".src is on " << c.src.device << ", expected host memory or the current GPU (cuda:" << device << ")";
}

/// [begin, end) of `count` i32 entries at `data`.
std::pair<uintptr_t, uintptr_t> index_range(const void* data, int64_t count) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  return {begin, begin + static_cast<uintptr_t>(count) * 4};
}

bool ranges_overlap(std::pair<uintptr_t, uintptr_t> a, std::pair<uintptr_t, uintptr_t> b) {
  return a.first < b.second && b.first < a.second;
}

}  // namespace

bool copy_index_arrays(const IndexArrayCopy* copies, int num_copies, StreamHandle stream) {
  TESSERA_CHECK_ARG(num_copies >= 0 && (num_copies == 0 || copies != nullptr))
      << "num_copies = " << num_copies << ", expected >= 0 (and copies not null)";
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  int64_t host_entries = 0;
  for (int i = 0; i < num_copies; ++i) {
    const IndexArrayCopy& c = copies[i];
    check_index_copy(c, str_cat("copies[", i, "]"), device);
    if (c.count == 0 || c.dst.data == c.src.data) continue;
    if (c.src.device.is_host()) host_entries += c.count;
    for (int j = 0; j < num_copies; ++j) {
      const IndexArrayCopy& o = copies[j];
      const bool dst_clash = j != i && o.count > 0 && o.dst.data != o.src.data &&
                             ranges_overlap(index_range(c.dst.data, c.count), index_range(o.dst.data, o.count));
      const bool src_clash = o.count > 0 && o.src.device.type == DeviceType::kCUDA &&
                             ranges_overlap(index_range(c.dst.data, c.count), index_range(o.src.data, o.count));
      TESSERA_CHECK_ARG(!dst_clash && !src_clash)
          << "copies[" << i << "].dst overlaps copies[" << j << (dst_clash ? "].dst" : "].src")
          << ": destinations must not overlap each other or another copy's source";
    }
  }
  using Traits = kernels::IndexCopyTraits;
  if (num_copies > Traits::kMaxCopies || host_entries > Traits::kMaxHostEntries) return false;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) return false;

  kernels::IndexCopyParams p{};
  int64_t longest = 0;
  int32_t host_used = 0;
  for (int i = 0; i < num_copies; ++i) {
    const IndexArrayCopy& c = copies[i];
    if (c.count == 0 || c.dst.data == c.src.data) continue;
    const int n = p.num_copies++;
    p.dst[n] = c.dst.data_as<int32_t>();
    p.count[n] = static_cast<int32_t>(c.count);
    if (c.src.device.is_host()) {
      std::memcpy(p.host + host_used, c.src.data, static_cast<size_t>(c.count) * 4);
      p.host_offset[n] = host_used;
      host_used += static_cast<int32_t>(c.count);
    } else {
      p.src[n] = c.src.data_as<const int32_t>();
    }
    longest = std::max(longest, c.count);
  }
  if (p.num_copies == 0) return true;
  constexpr int kThreads = Traits::kThreadsPerBlock;
  kernels::copy_index_arrays_kernel<<<detail::grid_stride_blocks(longest, kThreads), kThreads, 0, s>>>(p);
  TESSERA_CHECK_LAUNCH();
  return true;
}

}  // namespace tessera
