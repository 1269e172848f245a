// Host dispatch for the attention-state merge kernels (kernels/attention/merge.cuh).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/attention/merge.cuh"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/check.h"
#include "src/merge_launch.h"
#include "src/tensor_checks.h"
#include "tessera/merge.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

/// Checks an output-or-input V tensor of `ndim` dims whose leading dims are `lead` and whose last
/// two are [num_heads, head_dim], with the vector alignment the kernels' 16-byte accesses need.
void check_value_tensor(const TensorView& v, const char* name, int ndim) {
  check_ndim(v, name, ndim);
  check_dtype(v, name, {DType::kF16, DType::kBF16, DType::kF32});
  check_on_cuda(v, name);
  check_last_dim_contiguous(v, name);
  detail::check_vector_aligned(v, name);
}

void check_lse_tensor(const TensorView& s, const char* name, int ndim) {
  check_ndim(s, name, ndim);
  check_dtype(s, name, {DType::kF32});
  check_on_cuda(s, name);
}

void check_same_shape(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name,
                      int dims) {
  for (int d = 0; d < dims; ++d) {
    if (a.shape[d] != b.shape[d]) {
      throw_error(StatusCode::kInvalidArgument, std::string(b_name) + ".shape[" + std::to_string(d) + "] = " + std::to_string(b.shape[d]) +
                    ", expected " + std::to_string(a.shape[d]) + " (" + a_name + ".shape[" + std::to_string(d) +
                    "])");
    }
  }
}

void check_rows_fit_int32(int64_t rows, const char* name) {
  if (rows > INT32_MAX) {
    throw_error(StatusCode::kInvalidArgument, std::string(name) + ".shape[0] = " + std::to_string(rows) + " exceeds 2^31 - 1 rows");
  }
}

}  // namespace

namespace detail {

void merge_state_rows_on_device(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                                const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                                const int32_t* rows_on_device, StreamHandle stream) {
  check_value_tensor(v_a, "v_a", 3);
  check_value_tensor(v_b, "v_b", 3);
  check_value_tensor(v_out, "v_out", 3);
  check_same_shape(v_a, "v_a", v_b, "v_b", 3);
  check_same_shape(v_a, "v_a", v_out, "v_out", 3);
  check_dtype(v_b, "v_b", {v_a.dtype});
  check_dtype(v_out, "v_out", {v_a.dtype});
  check_lse_tensor(s_a, "s_a", 2);
  check_lse_tensor(s_b, "s_b", 2);
  check_same_shape(v_a, "v_a", s_a, "s_a", 2);
  check_same_shape(v_a, "v_a", s_b, "s_b", 2);
  const bool want_lse = s_out.data != nullptr;
  if (want_lse) {
    check_lse_tensor(s_out, "s_out", 2);
    check_same_shape(v_a, "v_a", s_out, "s_out", 2);
    if (s_out.data == s_a.data || s_out.data == s_b.data) {
      throw_error(StatusCode::kInvalidArgument, "s_out aliases " + std::string(s_out.data == s_a.data ? "s_a" : "s_b") +
                    ", expected a separate buffer (in-place LSE merge is not supported)");
    }
  }
  check_rows_fit_int32(v_a.shape[0], "v_a");
  if (v_a.numel() == 0) return;

  TESSERA_DISPATCH_FLOAT_DTYPE(v_a.dtype, "v_a", T, [&] {
    kernels::MergeStatePairParams<T> p{};
    p.v_a = v_a.data_as<const T>();
    p.s_a = s_a.data_as<const float>();
    p.v_b = v_b.data_as<const T>();
    p.s_b = s_b.data_as<const float>();
    p.v_out = v_out.data_as<T>();
    p.s_out = want_lse ? s_out.data_as<float>() : nullptr;
    p.v_a_row_stride = v_a.strides[0];
    p.v_a_head_stride = v_a.strides[1];
    p.v_b_row_stride = v_b.strides[0];
    p.v_b_head_stride = v_b.strides[1];
    p.s_a_row_stride = s_a.strides[0];
    p.s_a_head_stride = s_a.strides[1];
    p.s_b_row_stride = s_b.strides[0];
    p.s_b_head_stride = s_b.strides[1];
    p.out_v_row_stride = v_out.strides[0];
    p.out_v_head_stride = v_out.strides[1];
    p.out_s_row_stride = want_lse ? s_out.strides[0] : 0;
    p.out_s_head_stride = want_lse ? s_out.strides[1] : 0;
    p.rows = static_cast<int32_t>(v_a.shape[0]);
    p.rows_on_device = rows_on_device;
    p.num_heads = static_cast<int32_t>(v_a.shape[1]);
    p.head_dim = static_cast<int32_t>(v_a.shape[2]);
    constexpr int kThreads = kernels::MergeTraits<T>::kThreadsPerBlock;
    const long long threads = v_a.numel() / kernels::MergeTraits<T>::kVecElems;
    kernels::merge_state_pair_kernel<T>
        <<<detail::grid_stride_blocks(threads, kThreads), kThreads, 0, stream>>>(p);
    TESSERA_CHECK_LAUNCH();
  });
}

}  // namespace detail

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, StreamHandle stream) {
  detail::merge_state_rows_on_device(v_a, s_a, v_b, s_b, v_out, s_out, nullptr, stream);
}

namespace {

/// Shared by the fixed-count and ragged entry points: `v`/`s` already validated, `p` has the
/// input description filled in.
template <typename T>
void launch_merge_states(kernels::MergeStatesParams<T> p, const TensorView& v_out, const TensorView& s_out,
                         StreamHandle stream) {
  p.v_out = v_out.data_as<T>();
  p.s_out = s_out.data != nullptr ? s_out.data_as<float>() : nullptr;
  p.out_v_row_stride = v_out.strides[0];
  p.out_v_head_stride = v_out.strides[1];
  p.out_s_row_stride = s_out.data != nullptr ? s_out.strides[0] : 0;
  p.out_s_head_stride = s_out.data != nullptr ? s_out.strides[1] : 0;
  p.rows = static_cast<int32_t>(v_out.shape[0]);
  p.num_heads = static_cast<int32_t>(v_out.shape[1]);
  p.head_dim = static_cast<int32_t>(v_out.shape[2]);
  constexpr int kThreads = kernels::MergeTraits<T>::kThreadsPerBlock;
  const long long threads = v_out.numel() / kernels::MergeTraits<T>::kVecElems;
  kernels::merge_states_kernel<T><<<detail::grid_stride_blocks(threads, kThreads), kThreads, 0, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

void check_merge_outputs(const TensorView& v_out, const TensorView& s_out, DType dtype, int64_t rows,
                         int64_t heads, int64_t dim) {
  check_value_tensor(v_out, "v_out", 3);
  check_dtype(v_out, "v_out", {dtype});
  check_size(v_out, "v_out", 0, rows);
  check_size(v_out, "v_out", 1, heads);
  check_size(v_out, "v_out", 2, dim);
  check_rows_fit_int32(rows, "v_out");
  if (s_out.data != nullptr) {
    check_lse_tensor(s_out, "s_out", 2);
    check_size(s_out, "s_out", 0, rows);
    check_size(s_out, "s_out", 1, heads);
  }
}

}  // namespace

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  StreamHandle stream) {
  check_value_tensor(v, "v", 4);
  check_lse_tensor(s, "s", 3);
  check_same_shape(v, "v", s, "s", 3);
  check_merge_outputs(v_out, s_out, v.dtype, v.shape[0], v.shape[2], v.shape[3]);
  if (v.shape[1] > INT32_MAX) throw_error(StatusCode::kInvalidArgument, "v.shape[1] = " + std::to_string(v.shape[1]) + " exceeds 2^31 - 1 states");
  if (v_out.numel() == 0) return;
  TESSERA_DISPATCH_FLOAT_DTYPE(v.dtype, "v", T, [&] {
    kernels::MergeStatesParams<T> p{};
    p.v = v.data_as<const T>();
    p.s = s.data_as<const float>();
    p.in = {v.strides[0], v.strides[1], v.strides[2], s.strides[0], s.strides[1], s.strides[2]};
    p.indptr = nullptr;
    p.num_states = static_cast<int32_t>(v.shape[1]);
    launch_merge_states<T>(p, v_out, s_out, stream);
  });
}

void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out, StreamHandle stream) {
  check_value_tensor(v, "v", 3);
  check_lse_tensor(s, "s", 2);
  check_same_shape(v, "v", s, "s", 2);
  check_on_cuda(indptr, "indptr");
  check_same_device(v, "v", indptr, "indptr");
  if (v.shape[0] > INT32_MAX) throw_error(StatusCode::kInvalidArgument, "v.shape[0] = " + std::to_string(v.shape[0]) + " exceeds 2^31 - 1 states");
  // Shape, dtype and (in checked mode) the values: starts at 0, non-decreasing, ends <= total.
  validate_indptr(indptr, "indptr", v.shape[0]);
  const int64_t rows = indptr.shape[0] - 1;
  check_merge_outputs(v_out, s_out, v.dtype, rows, v.shape[1], v.shape[2]);
  if (v_out.numel() == 0) return;
  TESSERA_DISPATCH_FLOAT_DTYPE(v.dtype, "v", T, [&] {
    kernels::MergeStatesParams<T> p{};
    p.v = v.data_as<const T>();
    p.s = s.data_as<const float>();
    p.in = {0, v.strides[0], v.strides[1], 0, s.strides[0], s.strides[1]};
    p.indptr = indptr.data_as<const int32_t>();
    p.total_states = static_cast<int32_t>(v.shape[0]);
    launch_merge_states<T>(p, v_out, s_out, stream);
  });
}

}  // namespace tessera
