// Device-side argument checks for index arrays the host does not read (device-resident, or read by
// a captured CUDA Graph at every replay): tiny kernels that report the first failure they find to
// the host without any synchronisation. The host side, which allocates the report and turns it
// into a tessera::Error at the next call or at check_device_errors(), is src/runtime/device_errors.cu.
//
// Reporting protocol (one DeviceErrorReport per device, in mapped pinned host memory, and one
// claim word per device in device memory):
//   - the host arms the report with a generation g (report.armed = g); the claim word equals g;
//   - a failing thread reads report.armed, and only the thread whose atomicCAS(claim, g, g + 1)
//     succeeds writes the fields, fences (__threadfence_system) and then sets report.reported =
//     g + 1 last, so the host, polling `reported`, never sees half a report;
//   - the host, having read a report, re-arms with g + 1. A failure detected while a report is
//     pending (claim already past `armed`) is dropped: only the first is reported.
//
// The kernels are `static`: this header is meant for one translation unit (device_errors.cu),
// which owns the claim words.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// What failed; the host turns it into a message.
enum class DeviceCheck : int32_t {
  kNone = 0,
  kSegmentTooLong = 1,   ///< indptr[index + 1] - indptr[index] = value > bound
  kIndexOutOfRange = 2,  ///< ids[index] = value is outside [0, bound)
  kNotIncreasing = 3,    ///< ids[index] = value is not > ids[index - 1] = bound (same segment)
  kSegmentsPastEnd = 4,  ///< indptr[segments] = value > bound entries of ids (or indptr[0] != 0, then value < 0)
};

/// The first failure of a device check. The host reads it through its mapped address.
struct DeviceErrorReport {
  unsigned long long armed;     ///< written by the host: the generation a failure may claim
  unsigned long long reported;  ///< written last by the device: armed + 1 once the fields are valid
  int32_t check;                ///< DeviceCheck
  int32_t site;                 ///< which call and argument (a host-side table, src/runtime/device_errors.h)
  int64_t index;
  int64_t value;
  int64_t bound;
  int64_t segment;              ///< the request / block row of `index`, or -1
};

struct DeviceErrorSink {
  unsigned long long* claim;   ///< device memory
  DeviceErrorReport* report;   ///< device address of the mapped host report
};

TESSERA_DEVICE void report_device_error(const DeviceErrorSink& sink, DeviceCheck check, int32_t site, int64_t index,
                                        int64_t value, int64_t bound, int64_t segment) {
  volatile DeviceErrorReport* r = sink.report;
  const unsigned long long generation = r->armed;
  if (atomicCAS(sink.claim, generation, generation + 1) != generation) return;
  r->check = static_cast<int32_t>(check);
  r->site = site;
  r->index = index;
  r->value = value;
  r->bound = bound;
  r->segment = segment;
  __threadfence_system();
  r->reported = generation + 1;
}

/// Segment lengths of an indptr array: indptr[b + 1] - indptr[b] <= max_len for b < num_segments.
/// Grid-stride over the segments.
static __global__ void check_segment_lengths_kernel(const int32_t* indptr, int32_t num_segments, int32_t max_len,
                                             DeviceErrorSink sink, int32_t site) {
  const int32_t stride = static_cast<int32_t>(gridDim.x * blockDim.x);
  for (int32_t b = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); b < num_segments; b += stride) {
    const int64_t len = static_cast<int64_t>(indptr[b + 1]) - indptr[b];
    if (len > max_len) report_device_error(sink, DeviceCheck::kSegmentTooLong, site, b, len, max_len, b);
  }
}

/// Ids of a segmented index array: segment s < *num_segments owns ids[indptr[s] .. indptr[s+1]),
/// each of which must be in [0, bound), and, with `increasing`, greater than the one before it in
/// the segment. indptr and the segment count are read on the device, at execution: a check
/// captured in a CUDA Graph follows the plan that is current at each replay. Blocks stride over
/// segments, threads over a segment's ids.
struct SegmentedIdsCheck {
  const int32_t* ids;           ///< [capacity]
  const int32_t* indptr;        ///< [*num_segments + 1], indptr[0] == 0, non-decreasing (checked by the planner)
  const int32_t* num_segments;  ///< device scalar
  int32_t capacity;             ///< entries of ids
  int32_t bound;                ///< ids in [0, bound)
  bool increasing;
};

static __global__ void check_segmented_ids_kernel(const SegmentedIdsCheck c, DeviceErrorSink sink, int32_t site) {
  const int32_t segments = *c.num_segments;
  if (segments <= 0) return;
  if (blockIdx.x == 0 && threadIdx.x == 0 && c.indptr[segments] > c.capacity) {
    report_device_error(sink, DeviceCheck::kSegmentsPastEnd, site, segments, c.indptr[segments], c.capacity, -1);
  }
  for (int32_t s = static_cast<int32_t>(blockIdx.x); s < segments; s += static_cast<int32_t>(gridDim.x)) {
    const int32_t begin = c.indptr[s];
    const int32_t end = min(c.indptr[s + 1], c.capacity);
    for (int32_t j = begin + static_cast<int32_t>(threadIdx.x); j < end; j += static_cast<int32_t>(blockDim.x)) {
      const int32_t id = c.ids[j];
      if (id < 0 || id >= c.bound) {
        report_device_error(sink, DeviceCheck::kIndexOutOfRange, site, j, id, c.bound, s);
      } else if (c.increasing && j > begin && id <= c.ids[j - 1]) {
        report_device_error(sink, DeviceCheck::kNotIncreasing, site, j, id, c.ids[j - 1], s);
      }
    }
  }
}

}  // namespace kernels
}  // namespace tessera
