// Device-side argument checks and their reports (kernels/checks/device_checks.cuh): for index
// arrays the host cannot read without synchronising (device memory) or whose values change at
// every replay of a captured CUDA Graph. A check kernel queued next to the work it guards reports
// its first failure into pinned host memory; the host turns that report into a tessera::Error,
// without synchronising, at the next call that looks (raise_device_error) or at
// check_device_errors (tessera/validate.h), which waits for a stream first.
//
// Used by the one-shot prefill entry points (qo_indptr against max_qo_len) and by the plan/run
// runtime (page ids and column blocks in checked mode or in pinned host memory under capture).
#pragma once

#include <cstdint>

#include "tessera/stream.h"

namespace tessera {
namespace detail {

/// Which call and argument a report is about (kernels::DeviceErrorReport::site).
enum class DeviceCheckSite : int32_t {
  kBatchPrefillRaggedQoIndptr = 1,  ///< batch_prefill_ragged: qo_indptr against max_qo_len
  kBatchPrefillPagedQoIndptr = 2,   ///< batch_prefill_paged: qo_indptr against max_qo_len
  kRuntimePageIds = 3,              ///< run() of a paged wrapper: kv.indices
  kRuntimeColumnBlocks = 4,         ///< BlockSparseWrapper::run: indices
};

/// Throws (kInvalidArgument) the first failure a device check on `device` reported that no call
/// has raised yet. Only reads pinned host memory: a check still queued or running is seen by a
/// later call. A no-op on a device that never ran a check.
void raise_device_error(int device);

/// Queues on `stream` (current device) a check that indptr[b + 1] - indptr[b] <= max_len for every
/// b < num_segments; indptr is device memory of num_segments + 1 entries, max_len <= INT32_MAX.
void enqueue_segment_length_check(const int32_t* indptr, int64_t num_segments, int64_t max_len, DeviceCheckSite site,
                                  StreamHandle stream);

/// A segmented index array whose values and segments are read on the device when the check runs.
struct SegmentedIds {
  const int32_t* ids = nullptr;           ///< [capacity], device-readable
  const int32_t* indptr = nullptr;        ///< device [*num_segments + 1]
  const int32_t* num_segments = nullptr;  ///< device scalar, <= max_segments
  int64_t max_segments = 0;               ///< sizes the grid (fixed in a captured launch)
  int64_t capacity = 0;                   ///< entries of ids
  int64_t bound = 0;                      ///< ids in [0, bound)
  bool increasing = false;                ///< strictly increasing within a segment
};

/// Queues on `stream` (current device) a check of every id that a segment lists.
void enqueue_segmented_ids_check(const SegmentedIds& ids, DeviceCheckSite site, StreamHandle stream);

}  // namespace detail
}  // namespace tessera
