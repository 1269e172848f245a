// Host side of the standalone RoPE kernels (kernels/rope/rope.cuh): argument checks, the launch
// shape and the dispatch over dtype, pair layout, angle source and vector width.
//
// Every check runs on the host before the device is touched, in one order: shapes, dtypes and
// values, then devices, then (checked mode only) the values of the index arrays. A caller without
// a GPU therefore gets the named error of a malformed argument, not a device error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/rope/rope.cuh"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/tensor_checks.h"
#include "tessera/device.h"
#include "tessera/rope.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

using kernels::RopePositionSource;

/// The four [nnz, heads, head_dim] tensors the kernel reads and writes (the cos/sin-cache entry
/// points view their [nnz, heads * head_size] rows this way).
struct RopeTensors {
  TensorView q, k, q_out, k_out;
  const char* q_name = "q";
  const char* k_name = "k";
  const char* q_out_name = "q_rope";
  const char* k_out_name = "k_rope";
};

/// How positions are found: indptr + offsets, or one id per row (pos_ids / positions).
struct RopePositions {
  RopePositionSource source = RopePositionSource::kIndptrOffsets;
  TensorView indptr, offsets, pos_ids;
  const char* pos_ids_name = "pos_ids";
};

/// What the angles are: computed from the frequencies, or read from a cos/sin table.
struct RopeAngles {
  kernels::VariantParams frequencies{};  // computed: rope_kind, rope_log2_theta, rope_rcp_scale, llama31_*
  bool cached = false;
  TensorView cos_sin_cache;  // cached: [max_position, rotary_dim]
};

void check_same_shape(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
  for (int d = 0; d < ref.ndim; ++d) {
    TESSERA_CHECK_ARG(t.shape[d] == ref.shape[d])
        << name << ".shape[" << d << "] = " << t.shape[d] << ", expected " << ref.shape[d] << " (" << ref_name
        << ".shape[" << d << "]; " << name << " must have " << ref_name << "'s shape "
        << detail::join_dims(ref.shape, ref.ndim) << ")";
  }
}

/// An output: the input's shape and dtype; the input itself (in place) or a tensor that does not
/// share its data pointer with other strides.
void check_output(const TensorView& out, const char* name, const TensorView& in, const char* in_name) {
  detail::check_rows_tensor(out, name, in.ndim, "the shape of the input it rotates");
  TESSERA_CHECK_ARG(out.dtype == in.dtype)
      << name << ".dtype = " << out.dtype << ", expected " << in.dtype << " (the dtype of " << in_name << ")";
  check_same_shape(out, name, in, in_name);
  if (out.data == in.data && in.numel() > 0) {
    for (int d = 0; d < in.ndim; ++d) {
      TESSERA_CHECK_ARG(out.shape[d] <= 1 || out.strides[d] == in.strides[d])
          << name << " shares " << in_name << "'s data but has strides " << detail::join_dims(out.strides, out.ndim)
          << ", expected " << detail::join_dims(in.strides, in.ndim) << " (" << in_name
          << "'s strides, in place) or a tensor that does not overlap " << in_name;
    }
  }
}

/// The 16-bit rows of q and k: k has q's dtype, row count and head_dim.
void check_q_k(const TensorView& q, const TensorView& k) {
  detail::check_rows_tensor(q, "q", 3, "[nnz, num_q_heads, head_dim]");
  check_dtype(q, "q", {DType::kF16, DType::kBF16});
  detail::check_rows_tensor(k, "k", 3, "[nnz, num_k_heads, head_dim]");
  TESSERA_CHECK_ARG(k.dtype == q.dtype) << "k.dtype = " << k.dtype << ", expected " << q.dtype << " (the dtype of q)";
  TESSERA_CHECK_ARG(k.shape[0] == q.shape[0])
      << "k.shape[0] = " << k.shape[0] << ", expected " << q.shape[0] << " (nnz: q.shape[0])";
  TESSERA_CHECK_ARG(k.shape[2] == q.shape[2])
      << "k.shape[2] = " << k.shape[2] << ", expected " << q.shape[2] << " (head_dim: q.shape[2])";
}

/// rotary_dim (0: head_dim) -> the checked value: even, in [2, head_dim].
int64_t resolve_rotary_dim(int64_t rotary_dim, int64_t head_dim, const char* name, const char* head_dim_name) {
  const int64_t rd = rotary_dim == 0 ? head_dim : rotary_dim;
  TESSERA_CHECK_ARG(rd >= 2 && rd <= head_dim && rd % 2 == 0)
      << name << " = " << rd << (rotary_dim == 0 ? " (0: head_dim)" : "") << ", expected an even value in [2, "
      << head_dim << "] (" << head_dim_name << " = " << head_dim << ")";
  return rd;
}

void check_positive_finite(double value, const char* name) {
  TESSERA_CHECK_ARG(std::isfinite(value) && value > 0) << name << " = " << value << ", expected a finite value > 0";
}

/// A 1-D index array of one of `dtypes`, `length` entries (-1: any), contiguous.
void check_index_tensor(const TensorView& t, const char* name, std::initializer_list<DType> dtypes, int64_t length,
                        const char* length_meaning) {
  detail::check_view(t, name);
  TESSERA_CHECK_ARG(t.ndim == 1) << name << ".ndim = " << t.ndim << ", expected 1; " << name << " is "
                                 << t.describe();
  check_dtype(t, name, dtypes);
  if (length >= 0) {
    TESSERA_CHECK_ARG(t.shape[0] == length)
        << name << ".shape[0] = " << t.shape[0] << ", expected " << length << " (" << length_meaning << ")";
  }
  TESSERA_CHECK_ARG(t.shape[0] <= 1 || t.strides[0] == 1)
      << name << ".strides[0] = " << t.strides[0] << ", expected 1 (index arrays must be contiguous)";
  TESSERA_CHECK_ARG(t.defined()) << name << ".data = null, expected a pointer to " << t.shape[0] << " elements";
}

/// Shapes, dtypes and lengths of the position arrays of `nnz` rows.
void check_positions(const RopePositions& pos, int64_t nnz) {
  if (pos.source == RopePositionSource::kIndptrOffsets) {
    check_index_tensor(pos.indptr, "indptr", {DType::kI32}, -1, "");
    TESSERA_CHECK_ARG(pos.indptr.shape[0] >= 1 && pos.indptr.shape[0] <= INT32_MAX)
        << "indptr.shape[0] = " << pos.indptr.shape[0] << ", expected in [1, 2^31) (batch_size + 1 entries)";
    check_index_tensor(pos.offsets, "offsets", {DType::kI32}, pos.indptr.shape[0] - 1,
                       "batch_size = indptr.shape[0] - 1");
  } else {
    check_index_tensor(pos.pos_ids, pos.pos_ids_name, {DType::kI32, DType::kI64}, nnz, "nnz: the rows to rotate");
  }
}

/// Every tensor in device memory of q's device (the current one: the kernel runs there). Without
/// a GPU the message says why there is none.
void check_devices(const RopeTensors& t, const RopePositions& pos, const RopeAngles& angles) {
  if (t.q.device.type != DeviceType::kCUDA) {
    const std::string reason = cuda_unavailable_reason();
    TESSERA_FAIL(StatusCode::kInvalidArgument)
        << t.q_name << ".device = " << t.q.device << ", expected a CUDA device"
        << (reason.empty() ? "" : " (" + reason + ")");
  }
  const std::pair<const TensorView*, const char*> others[] = {
      {&t.k, t.k_name},          {&t.q_out, t.q_out_name},       {&t.k_out, t.k_out_name},
      {&pos.indptr, "indptr"},   {&pos.offsets, "offsets"},      {&pos.pos_ids, pos.pos_ids_name},
      {&angles.cos_sin_cache, "cos_sin_cache"}};
  for (const auto& [view, name] : others) {
    if (view->ndim == 0 && view->data == nullptr) continue;  // not used by this entry point
    check_same_device(t.q, t.q_name, *view, name);
  }
}

/// Checked mode: the index arrays' values the kernel would otherwise take as they come.
void check_position_values(const RopePositions& pos, int64_t nnz, int64_t cache_rows) {
  if (!checked_mode()) return;
  if (pos.source == RopePositionSource::kIndptrOffsets) {
    const std::vector<int32_t> indptr = validate_indptr(pos.indptr, "indptr", -1);
    TESSERA_CHECK_ARG(indptr.empty() || indptr.back() == nnz) << "indptr[" << indptr.size() - 1 << "] = " << indptr.back()
                                            << ", expected " << nnz << " (nnz: q.shape[0])";
    return;
  }
  if (cache_rows < 0) return;  // computed angles take any position
  const std::vector<int64_t> ids = detail::read_index_values_i64(pos.pos_ids, pos.pos_ids_name, nnz);
  for (int64_t r = 0; r < nnz; ++r) {
    TESSERA_CHECK_ARG(ids[r] >= 0 && ids[r] < cache_rows)
        << pos.pos_ids_name << "[" << r << "] = " << ids[r] << " is out of range [0, " << cache_rows
        << ") (max_position: cos_sin_cache.shape[0])";
  }
}

/// Vectors need every pointer and row/head stride 16-byte aligned and rotary_dim / 2 a whole
/// number of vectors; anything else takes the element-wise path (same results).
bool vectorizable(const RopeTensors& t, int64_t rotary_dim) {
  constexpr int64_t kVecElems = kernels::kRopeCopyElems;
  if (rotary_dim % (2 * kernels::kRopePairsPerThread) != 0 || t.q.shape[2] % kVecElems != 0) return false;
  for (const TensorView* v : {&t.q, &t.k, &t.q_out, &t.k_out}) {
    if (reinterpret_cast<uintptr_t>(v->data) % 16 != 0) return false;
    for (int d = 0; d < 2; ++d) {
      if (v->shape[d] > 1 && v->strides[d] % kVecElems != 0) return false;  // a size-1 dim is never stepped
    }
  }
  return true;
}

/// The launch shape: units per row and head groups (kernels/rope/rope.cuh).
struct RopeWork {
  int32_t num_rotary_units = 0;
  int32_t num_copy_units = 0;
  int32_t heads_per_group = 1;
  int32_t num_head_groups = 0;
};

RopeWork plan_work(const RopeTensors& t, int64_t rotary_dim) {
  const int64_t nnz = t.q.shape[0], total_heads = t.q.shape[1] + t.k.shape[1], head_dim = t.q.shape[2];
  RopeWork w;
  w.num_rotary_units = static_cast<int32_t>(kernels::ceil_div<int64_t>(rotary_dim / 2, kernels::kRopePairsPerThread));
  // In place the dims past rotary_dim already hold their values. (With only one of q and k in
  // place, that one is copied onto itself: harmless.)
  const bool in_place = t.q_out.data == t.q.data && t.k_out.data == t.k.data;
  w.num_copy_units =
      in_place ? 0 : static_cast<int32_t>(kernels::ceil_div<int64_t>(head_dim - rotary_dim, kernels::kRopeCopyElems));
  // Heads share a row's angles, so a thread walks several of them; with few rows it walks fewer,
  // so that the grid still covers every SM's resident threads (2048 on sm_80 / sm_90).
  const int64_t units_per_row = w.num_rotary_units + w.num_copy_units;
  const int64_t resident_threads = 2048LL * detail::current_device_sm_count();
  const int64_t groups_wanted =
      std::clamp<int64_t>(resident_threads / std::max<int64_t>(1, nnz * units_per_row), 1, total_heads);
  w.heads_per_group = static_cast<int32_t>(kernels::ceil_div<int64_t>(total_heads, groups_wanted));
  w.num_head_groups = static_cast<int32_t>(kernels::ceil_div<int64_t>(total_heads, w.heads_per_group));
  return w;
}

template <typename T>
kernels::RopeParams<T> make_params(const RopeTensors& t, const RopePositions& pos, const RopeAngles& angles,
                                   int64_t rotary_dim, const RopeWork& w) {
  kernels::RopeParams<T> p{};
  p.q = t.q.data_as<const T>();
  p.k = t.k.data_as<const T>();
  p.q_out = t.q_out.data_as<T>();
  p.k_out = t.k_out.data_as<T>();
  p.q_row_stride = t.q.strides[0];
  p.q_head_stride = t.q.strides[1];
  p.k_row_stride = t.k.strides[0];
  p.k_head_stride = t.k.strides[1];
  p.q_out_row_stride = t.q_out.strides[0];
  p.q_out_head_stride = t.q_out.strides[1];
  p.k_out_row_stride = t.k_out.strides[0];
  p.k_out_head_stride = t.k_out.strides[1];
  p.nnz = static_cast<int32_t>(t.q.shape[0]);
  p.num_q_heads = static_cast<int32_t>(t.q.shape[1]);
  p.num_k_heads = static_cast<int32_t>(t.k.shape[1]);
  p.head_dim = static_cast<int32_t>(t.q.shape[2]);
  p.rotary_dim = static_cast<int32_t>(rotary_dim);
  p.num_rotary_units = w.num_rotary_units;
  p.num_copy_units = w.num_copy_units;
  p.heads_per_group = w.heads_per_group;
  p.num_head_groups = w.num_head_groups;
  p.position_source = pos.source;
  if (pos.source == RopePositionSource::kIndptrOffsets) {
    p.indptr = pos.indptr.data_as<const int32_t>();
    p.offsets = pos.offsets.data_as<const int32_t>();
    p.batch_size = static_cast<int32_t>(pos.indptr.shape[0] - 1);
  } else {
    p.pos_ids = pos.pos_ids.data;
  }
  p.frequencies = angles.frequencies;
  if (angles.cached) {
    p.cos_sin_cache = angles.cos_sin_cache.data_as<const float>();
    p.cache_row_stride = angles.cos_sin_cache.strides[0];
    p.cache_rows = angles.cos_sin_cache.shape[0];
  }
  return p;
}

template <typename T, bool kInterleave, bool kCosSinCache, bool kVectorized>
void launch_rope(const kernels::RopeParams<T>& p, StreamHandle stream) {
  constexpr int kThreads = kernels::kRopeThreadsPerBlock;
  const long long threads =
      static_cast<long long>(p.nnz) * p.num_head_groups * (p.num_rotary_units + p.num_copy_units);
  kernels::apply_rope_kernel<T, kInterleave, kCosSinCache, kVectorized>
      <<<detail::grid_stride_blocks(threads, kThreads), kThreads, 0, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

/// f(BoolConstant<value>{}): a runtime flag as a template argument.
template <typename F>
void with_flag(bool value, F&& f) {
  if (value) {
    f(kernels::BoolConstant<true>{});
  } else {
    f(kernels::BoolConstant<false>{});
  }
}

/// Checks the positions, the sizes and the devices, then launches. The tensors and rotary_dim are
/// already checked (rotary_dim against head_dim and, for the table, its width).
void run_rope(const RopeTensors& t, const RopePositions& pos, const RopeAngles& angles, int64_t rotary_dim,
              bool interleave, StreamHandle stream) {
  const int64_t nnz = t.q.shape[0], total_heads = t.q.shape[1] + t.k.shape[1], head_dim = t.q.shape[2];
  check_positions(pos, nnz);
  TESSERA_CHECK_ARG(nnz <= INT32_MAX) << t.q_name << ".shape[0] = " << nnz << " exceeds 2^31 - 1 rows";
  TESSERA_CHECK_ARG(total_heads <= INT32_MAX && head_dim <= INT32_MAX)
      << t.q_name << ", " << t.k_name << ": " << t.q.shape[1] << " + " << t.k.shape[1] << " heads of " << head_dim
      << " elements, expected fewer than 2^31 each";
  check_devices(t, pos, angles);
  check_position_values(pos, nnz, angles.cached ? angles.cos_sin_cache.shape[0] : -1);
  if (nnz == 0 || total_heads == 0) return;

  const RopeWork work = plan_work(t, rotary_dim);
  const bool vectorized = vectorizable(t, rotary_dim);
  TESSERA_DISPATCH_HALF_DTYPE(t.q.dtype, t.q_name, T, [&] {
    const kernels::RopeParams<T> p = make_params<T>(t, pos, angles, rotary_dim, work);
    with_flag(interleave, [&](auto interleave_c) {
      with_flag(angles.cached, [&](auto cached_c) {
        with_flag(vectorized, [&](auto vectorized_c) {
          launch_rope<T, decltype(interleave_c)::value, decltype(cached_c)::value, decltype(vectorized_c)::value>(
              p, stream);
        });
      });
    });
  });
}

/// Frequencies of apply_rope: theta^(-2i / rotary_dim), positions divided by rope_scale.
RopeAngles rope_angles(double rope_scale, double rope_theta) {
  check_positive_finite(rope_scale, "rope_scale");
  check_positive_finite(rope_theta, "rope_theta");
  RopeAngles a;
  a.frequencies.rope_kind = static_cast<int32_t>(kernels::RopeKind::kLlama);
  a.frequencies.rope_rcp_scale = static_cast<float>(1.0 / rope_scale);
  a.frequencies.rope_log2_theta = static_cast<float>(std::log2(rope_theta));
  return a;
}

/// Frequencies of apply_llama31_rope: smoothed by rope_scale (the Llama 3.1 factor), positions as
/// they are. The same parameter block as the fused RoPE (src/variant/variant_config.cpp).
RopeAngles llama31_angles(const ApplyLlama31RopeOptions& o) {
  check_positive_finite(o.rope_scale, "rope_scale");
  check_positive_finite(o.rope_theta, "rope_theta");
  check_positive_finite(o.low_freq_factor, "low_freq_factor");
  check_positive_finite(o.old_context_len, "old_context_len");
  TESSERA_CHECK_ARG(std::isfinite(o.high_freq_factor) && o.high_freq_factor > o.low_freq_factor)
      << "high_freq_factor = " << o.high_freq_factor << ", expected a finite value > low_freq_factor = "
      << o.low_freq_factor;
  RopeAngles a;
  a.frequencies.rope_kind = static_cast<int32_t>(kernels::RopeKind::kLlama31);
  a.frequencies.rope_rcp_scale = 1.f;
  a.frequencies.rope_log2_theta = static_cast<float>(std::log2(o.rope_theta));
  const double lo = o.low_freq_factor, hi = o.high_freq_factor, orig = o.old_context_len;
  a.frequencies.llama31_factor = static_cast<float>(o.rope_scale);
  a.frequencies.llama31_low_freq_wavelen = static_cast<float>(orig / lo);
  a.frequencies.llama31_high_freq_wavelen = static_cast<float>(orig / hi);
  a.frequencies.llama31_smooth_scale = static_cast<float>(orig / (hi - lo));
  a.frequencies.llama31_smooth_bias = static_cast<float>(lo / (hi - lo));
  return a;
}

/// The q/k entry points: checks q, k, the outputs and rotary_dim, then run_rope.
void apply_q_k(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
               const RopePositions& pos, int64_t rotary_dim_arg, bool interleave, const RopeAngles& angles,
               StreamHandle stream) {
  check_q_k(q, k);
  const int64_t rotary_dim = resolve_rotary_dim(rotary_dim_arg, q.shape[2], "rotary_dim", "head_dim: q.shape[2]");
  check_output(q_rope, "q_rope", q, "q");
  check_output(k_rope, "k_rope", k, "k");
  RopeTensors t;
  t.q = q;
  t.k = k;
  t.q_out = q_rope;
  t.k_out = k_rope;
  run_rope(t, pos, angles, rotary_dim, interleave, stream);
}

RopePositions from_indptr(const TensorView& indptr, const TensorView& offsets) {
  RopePositions p;
  p.source = RopePositionSource::kIndptrOffsets;
  p.indptr = indptr;
  p.offsets = offsets;
  return p;
}

RopePositions from_ids(const TensorView& pos_ids, const char* name) {
  RopePositions p;
  p.source = pos_ids.dtype == DType::kI64 ? RopePositionSource::kPosIdsI64 : RopePositionSource::kPosIdsI32;
  p.pos_ids = pos_ids;
  p.pos_ids_name = name;
  return p;
}

/// [nnz, heads * head_size] as [nnz, heads, head_size] (the heads head_size elements apart).
TensorView as_heads(const TensorView& t, int64_t head_size) {
  TensorView v = t;
  v.ndim = 3;
  v.shape[1] = t.shape[1] / head_size;
  v.shape[2] = head_size;
  v.strides[0] = t.strides[0];
  v.strides[1] = head_size;
  v.strides[2] = 1;
  return v;
}

}  // namespace

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                const TensorView& indptr, const TensorView& offsets, const ApplyRopeOptions& options,
                StreamHandle stream) {
  apply_q_k(q, k, q_rope, k_rope, from_indptr(indptr, offsets), options.rotary_dim, options.interleave,
            rope_angles(options.rope_scale, options.rope_theta), stream);
}

void apply_rope_inplace(const TensorView& q, const TensorView& k, const TensorView& indptr, const TensorView& offsets,
                        const ApplyRopeOptions& options, StreamHandle stream) {
  apply_rope(q, k, q, k, indptr, offsets, options, stream);
}

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                        const TensorView& pos_ids, const ApplyRopeOptions& options, StreamHandle stream) {
  apply_q_k(q, k, q_rope, k_rope, from_ids(pos_ids, "pos_ids"), options.rotary_dim, options.interleave,
            rope_angles(options.rope_scale, options.rope_theta), stream);
}

void apply_rope_pos_ids_inplace(const TensorView& q, const TensorView& k, const TensorView& pos_ids,
                                const ApplyRopeOptions& options, StreamHandle stream) {
  apply_rope_pos_ids(q, k, q, k, pos_ids, options, stream);
}

void apply_llama31_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                        const TensorView& indptr, const TensorView& offsets, const ApplyLlama31RopeOptions& options,
                        StreamHandle stream) {
  apply_q_k(q, k, q_rope, k_rope, from_indptr(indptr, offsets), options.rotary_dim, options.interleave,
            llama31_angles(options), stream);
}

void apply_llama31_rope_inplace(const TensorView& q, const TensorView& k, const TensorView& indptr,
                                const TensorView& offsets, const ApplyLlama31RopeOptions& options,
                                StreamHandle stream) {
  apply_llama31_rope(q, k, q, k, indptr, offsets, options, stream);
}

void apply_llama31_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                const TensorView& k_rope, const TensorView& pos_ids,
                                const ApplyLlama31RopeOptions& options, StreamHandle stream) {
  apply_q_k(q, k, q_rope, k_rope, from_ids(pos_ids, "pos_ids"), options.rotary_dim, options.interleave,
            llama31_angles(options), stream);
}

void apply_llama31_rope_pos_ids_inplace(const TensorView& q, const TensorView& k, const TensorView& pos_ids,
                                        const ApplyLlama31RopeOptions& options, StreamHandle stream) {
  apply_llama31_rope_pos_ids(q, k, q, k, pos_ids, options, stream);
}

void apply_rope_with_cos_sin_cache(const TensorView& positions, const TensorView& query, const TensorView& key,
                                   int64_t head_size, const TensorView& cos_sin_cache, bool is_neox,
                                   const TensorView& query_out, const TensorView& key_out, StreamHandle stream) {
  detail::check_rows_tensor(query, "query", 2, "[nnz, num_q_heads * head_size]");
  check_dtype(query, "query", {DType::kF16, DType::kBF16});
  detail::check_rows_tensor(key, "key", 2, "[nnz, num_k_heads * head_size]");
  TESSERA_CHECK_ARG(key.dtype == query.dtype)
      << "key.dtype = " << key.dtype << ", expected " << query.dtype << " (the dtype of query)";
  TESSERA_CHECK_ARG(key.shape[0] == query.shape[0])
      << "key.shape[0] = " << key.shape[0] << ", expected " << query.shape[0] << " (nnz: query.shape[0])";
  TESSERA_CHECK_ARG(head_size >= 2) << "head_size = " << head_size << ", expected >= 2";
  TESSERA_CHECK_ARG(query.shape[1] % head_size == 0)
      << "query.shape[1] = " << query.shape[1] << " is not a multiple of head_size = " << head_size
      << " (query is [nnz, num_q_heads * head_size])";
  TESSERA_CHECK_ARG(key.shape[1] % head_size == 0)
      << "key.shape[1] = " << key.shape[1] << " is not a multiple of head_size = " << head_size
      << " (key is [nnz, num_k_heads * head_size])";
  detail::check_rows_tensor(cos_sin_cache, "cos_sin_cache", 2, "[max_position, rotary_dim]");
  check_dtype(cos_sin_cache, "cos_sin_cache", {DType::kF32});
  const int64_t rotary_dim = cos_sin_cache.shape[1];
  TESSERA_CHECK_ARG(rotary_dim >= 2 && rotary_dim <= head_size && rotary_dim % 2 == 0)
      << "cos_sin_cache.shape[1] = " << rotary_dim << ", expected an even rotary_dim in [2, " << head_size
      << "] (head_size)";
  check_output(query_out, "query_out", query, "query");
  check_output(key_out, "key_out", key, "key");

  RopeTensors t;
  t.q = as_heads(query, head_size);
  t.k = as_heads(key, head_size);
  t.q_out = as_heads(query_out, head_size);
  t.k_out = as_heads(key_out, head_size);
  t.q_name = "query";
  t.k_name = "key";
  t.q_out_name = "query_out";
  t.k_out_name = "key_out";
  RopeAngles angles;
  angles.cached = true;
  angles.cos_sin_cache = cos_sin_cache;
  run_rope(t, from_ids(positions, "positions"), angles, rotary_dim, !is_neox, stream);
}

void apply_rope_with_cos_sin_cache_inplace(const TensorView& positions, const TensorView& query, const TensorView& key,
                                           int64_t head_size, const TensorView& cos_sin_cache, bool is_neox,
                                           StreamHandle stream) {
  apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, query, key, stream);
}

}  // namespace tessera
