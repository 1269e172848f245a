// Device-check reports (src/runtime/device_errors.h): one report per device in mapped pinned host
// memory and one claim word per device in device memory (the protocol is in
// kernels/checks/device_checks.cuh). Both live for the whole process, like the JIT caches: a
// report must stay readable by kernels still in flight at exit.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/checks/device_checks.cuh"
#include "src/check.h"
#include "src/cuda_utils.h"
#include "src/runtime/device_errors.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {
namespace {

using kernels::DeviceCheck;
using kernels::DeviceErrorReport;
using kernels::DeviceErrorSink;

// One claim word per device: module globals are per device context.
__device__ unsigned long long g_claim = 0;

constexpr int kMaxDevices = 64;

struct DeviceState {
  DeviceErrorReport* report = nullptr;  // host address
  DeviceErrorSink sink{};
};

std::mutex g_mutex;                                // creates states and consumes reports
std::atomic<DeviceState*> g_states[kMaxDevices] = {};

int current_device() {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CHECK(device >= 0 && device < kMaxDevices, StatusCode::kUnsupported)
      << "device checks support CUDA devices 0 to " << kMaxDevices - 1 << ", the current device is " << device;
  return device;
}

/// Lets this thread allocate while a stream capture is under way (a first check may be queued
/// inside a capture): the allocations are not stream work, and relaxed mode only lifts the
/// capture's ban on such calls for this thread, restored on scope exit.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { TESSERA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

/// The sink of the current device, created on first use.
DeviceErrorSink current_sink() {
  const int device = current_device();
  if (DeviceState* state = g_states[device].load(std::memory_order_acquire)) return state->sink;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (DeviceState* state = g_states[device].load(std::memory_order_acquire)) return state->sink;
  const RelaxedCaptureMode relaxed;
  auto state = std::make_unique<DeviceState>();
  void* host = nullptr;
  TESSERA_CUDA_CHECK(cudaHostAlloc(&host, sizeof(DeviceErrorReport), cudaHostAllocMapped | cudaHostAllocPortable))
      << " (the device-check report)";
  state->report = static_cast<DeviceErrorReport*>(host);
  *state->report = DeviceErrorReport{};  // armed = reported = 0, matching the claim word's 0
  void* device_report = nullptr;
  TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(&device_report, host, 0));
  void* claim = nullptr;
  TESSERA_CUDA_CHECK(cudaGetSymbolAddress(&claim, g_claim));
  state->sink = DeviceErrorSink{static_cast<unsigned long long*>(claim), static_cast<DeviceErrorReport*>(device_report)};
  const DeviceErrorSink sink = state->sink;
  g_states[device].store(state.release(), std::memory_order_release);  // never freed (see the top)
  return sink;
}

std::string site_call(int32_t site) {
  switch (static_cast<DeviceCheckSite>(site)) {
    case DeviceCheckSite::kBatchPrefillRaggedQoIndptr: return "batch_prefill_ragged";
    case DeviceCheckSite::kBatchPrefillPagedQoIndptr: return "batch_prefill_paged";
    case DeviceCheckSite::kRuntimePageIds: return "run() of a paged plan/run wrapper";
    case DeviceCheckSite::kRuntimeColumnBlocks: return "BlockSparseWrapper::run";
  }
  return "an unknown call (site " + std::to_string(site) + ")";
}

std::string site_argument(int32_t site) {
  switch (static_cast<DeviceCheckSite>(site)) {
    case DeviceCheckSite::kBatchPrefillRaggedQoIndptr:
    case DeviceCheckSite::kBatchPrefillPagedQoIndptr: return "qo_indptr";
    case DeviceCheckSite::kRuntimePageIds: return "kv.indices";
    case DeviceCheckSite::kRuntimeColumnBlocks: return "indices";
  }
  return "an argument";
}

std::string describe(const DeviceErrorReport& r) {
  const std::string name = site_argument(r.site);
  const bool column_blocks = static_cast<DeviceCheckSite>(r.site) == DeviceCheckSite::kRuntimeColumnBlocks;
  const char* segment = column_blocks ? "block row " : "request ";
  std::string what;
  switch (static_cast<DeviceCheck>(r.check)) {
    case DeviceCheck::kSegmentTooLong:
      what = str_cat(name, "[", r.index + 1, "] - ", name, "[", r.index, "] = ", r.value, " exceeds max_qo_len = ",
                     r.bound, ": query rows of request ", r.index, " past the first ", r.bound, " were not written");
      break;
    case DeviceCheck::kIndexOutOfRange:
      what = str_cat(name, "[", r.index, "] = ", r.value, " is out of range [0, ", r.bound, ") (", segment, r.segment,
                     "): the outputs of that call are wrong");
      break;
    case DeviceCheck::kNotIncreasing:
      what = str_cat(name, "[", r.index, "] = ", r.value, ", expected > ", r.bound, " (", name, "[", r.index - 1,
                     "]; column blocks must be strictly increasing within ", segment, r.segment,
                     "): the outputs of that call are wrong");
      break;
    case DeviceCheck::kSegmentsPastEnd:
      what = str_cat("the plan's page ranges end at entry ", r.value, ", past the ", r.bound, " entries of ", name,
                     ": the outputs of that call are wrong");
      break;
    default: what = str_cat("unknown failure ", r.check, " of ", name);
  }
  return str_cat(site_call(r.site), ": ", what,
                 " (found on the device by a check queued with an earlier call; reported at the next call or by "
                 "check_device_errors)");
}

int blocks_for(int64_t work, int per_block, int max_blocks) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + per_block - 1) / per_block, max_blocks)));
}

}  // namespace

void raise_device_error(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  DeviceState* state = g_states[device].load(std::memory_order_acquire);
  if (state == nullptr) return;
  volatile DeviceErrorReport* r = state->report;
  if (r->reported == r->armed) return;  // the hot path: one read of host memory
  DeviceErrorReport taken;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const unsigned long long armed = r->armed;
    const unsigned long long reported = r->reported;
    if (reported != armed + 1) return;  // another thread raised it
    // The device wrote the fields before `reported` (__threadfence_system).
    std::atomic_thread_fence(std::memory_order_acquire);
    taken.check = r->check;
    taken.site = r->site;
    taken.index = r->index;
    taken.value = r->value;
    taken.bound = r->bound;
    taken.segment = r->segment;
    r->armed = reported;  // the claim word is `reported` now: the next failure may claim it
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument) << describe(taken);
}

void enqueue_segment_length_check(const int32_t* indptr, int64_t num_segments, int64_t max_len, DeviceCheckSite site,
                                  StreamHandle stream) {
  if (num_segments <= 0) return;
  TESSERA_CHECK(num_segments < INT32_MAX && max_len >= 0 && max_len <= INT32_MAX, StatusCode::kInternal)
      << "segment length check of " << num_segments << " segments, max_len " << max_len;
  constexpr int kThreads = 256;
  const DeviceErrorSink sink = current_sink();
  kernels::check_segment_lengths_kernel<<<blocks_for(num_segments, kThreads, 1024), kThreads, 0,
                                          reinterpret_cast<cudaStream_t>(stream)>>>(
      indptr, static_cast<int32_t>(num_segments), static_cast<int32_t>(max_len), sink, static_cast<int32_t>(site));
  TESSERA_CHECK_LAUNCH();
}

void enqueue_segmented_ids_check(const SegmentedIds& ids, DeviceCheckSite site, StreamHandle stream) {
  TESSERA_CHECK(ids.max_segments < INT32_MAX && ids.capacity < INT32_MAX && ids.bound <= INT32_MAX,
                StatusCode::kInternal)
      << "segmented ids check of " << ids.max_segments << " segments, " << ids.capacity << " ids";
  if (ids.max_segments <= 0) return;
  kernels::SegmentedIdsCheck c;
  c.ids = ids.ids;
  c.indptr = ids.indptr;
  c.num_segments = ids.num_segments;
  c.capacity = static_cast<int32_t>(ids.capacity);
  c.bound = static_cast<int32_t>(ids.bound);
  c.increasing = ids.increasing;
  constexpr int kThreads = 128;
  const DeviceErrorSink sink = current_sink();
  kernels::check_segmented_ids_kernel<<<blocks_for(ids.max_segments, 1, 1024), kThreads, 0,
                                        reinterpret_cast<cudaStream_t>(stream)>>>(c, sink, static_cast<int32_t>(site));
  TESSERA_CHECK_LAUNCH();
}

}  // namespace detail

void check_device_errors(StreamHandle stream) {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)))
      << " (check_device_errors waits for the stream before reading the device-check report)";
  detail::raise_device_error(device);
}

}  // namespace tessera
