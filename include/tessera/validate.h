// Host-side validation of tensors and KV formats. Each function throws tessera::Error
// (StatusCode::kInvalidArgument; kUnsupported for a head_dim outside `supported_dims`) naming the
// argument, its value and what was expected.
//
// Index arrays are contiguous 1-D i32 (u8 for block flags) in host memory (kCPU, kCUDAHost) or on
// the device of the data they index.
//
// Index arrays (indptr, indices, last_page_len) are checked element by element when they live in
// host memory. When they live only on the GPU they are checked element by element only in checked
// mode (set_checked_mode(true) or TESSERA_CHECKED=1 in the environment), which copies them to the
// host and synchronises the device; otherwise only their shape and dtype are checked, and kernels
// skip (never dereference) out-of-range entries.
//
// Device-side checks. Where the host cannot see an array's values without synchronising, and a
// wrong value would otherwise go unreported, a small check kernel is queued on the call's stream
// next to the work it guards; its first failure is reported into pinned host memory and raised as
// a tessera::Error (kInvalidArgument, naming the call, the argument, the index and the value)
//   - by the next call that looks: batch_prefill_ragged, batch_prefill_paged and every plan() and
//     run() of the plan/run runtime (tessera/runtime.h) on the same device, without
//     synchronising, so it sees checks that have finished by then; or
//   - by check_device_errors(stream), which waits for `stream` first.
// Each failure is raised once. Only the first failure is kept until it is raised: treat every
// result since the last clean check_device_errors as suspect when one is raised. The checks:
//   - batch_prefill_ragged / batch_prefill_paged with qo_indptr in device memory: a request longer
//     than max_qo_len (its rows past max_qo_len would stay unwritten). In checked mode the host
//     also checks it before the launch.
//   - the plan/run runtime's run() inside a CUDA Graph capture: page ids (and block-sparse column
//     blocks) in checked mode or in pinned host memory, at every replay (outside a capture they are
//     checked on the host before the launch).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tessera/export.h"
#include "tessera/formats.h"
#include "tessera/stream.h"

namespace tessera {

/// Process-wide checked mode for device-resident index arrays (default: TESSERA_CHECKED env var).
/// May be toggled from any thread; a call reads it once or more while it validates, so toggle it
/// between calls.
TESSERA_API void set_checked_mode(bool enabled);
TESSERA_API bool checked_mode();

/// Waits for `stream` (work queued on the current device), then throws the first device-side
/// check failure on the current device that has not been raised yet (see the top of the file).
/// Throws kCudaError if waiting fails.
TESSERA_API void check_device_errors(StreamHandle stream = nullptr);

/// Head configuration of an attention call.
struct HeadConfig {
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

/// num_qo_heads, num_kv_heads >= 1, num_qo_heads % num_kv_heads == 0, head_dim in `supported_dims`
/// (an empty list accepts any head_dim >= 1).
TESSERA_API void validate_heads(const HeadConfig& heads, std::initializer_list<int64_t> supported_dims);

/// Generic tensor checks; `name` is the argument's name in messages.
TESSERA_API void check_ndim(const TensorView& t, const char* name, int ndim);
TESSERA_API void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
TESSERA_API void check_on_cuda(const TensorView& t, const char* name);
TESSERA_API void check_last_dim_contiguous(const TensorView& t, const char* name);
TESSERA_API void check_contiguous(const TensorView& t, const char* name);
/// Requires t.shape[dim] == expected.
TESSERA_API void check_size(const TensorView& t, const char* name, int dim, int64_t expected);
TESSERA_API void check_same_device(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name);

/// An indptr array: i32, 1-D, length >= 1, [0] == 0, non-decreasing, last <= max_total (if >= 0).
/// Returns the host copy of its values when they could be read (host memory or checked mode),
/// otherwise an empty vector.
TESSERA_API std::vector<int32_t> validate_indptr(const TensorView& indptr, const char* name, int64_t max_total);

TESSERA_API void validate_ragged(const Ragged& r, const char* name);
TESSERA_API void validate_paged_kv(const PagedKV& kv, const char* name);
TESSERA_API void validate_block_sparse(const BlockSparse& bs, const char* name);
TESSERA_API void validate_composable(const Composable& c, const char* name);

}  // namespace tessera
