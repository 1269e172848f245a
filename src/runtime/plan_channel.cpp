#include "src/runtime/plan_channel.h"

#include "src/check.h"

namespace tessera {
namespace detail {

PlanChannel::PlanChannel(char* workspace, int64_t plan_capacity) : workspace_(workspace) {
  TESSERA_CUDA_CHECK(cudaHostAlloc(&pinned_, static_cast<size_t>(plan_capacity), cudaHostAllocDefault))
      << " (pinned plan buffer of " << plan_capacity << " bytes)";
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&run_done_, cudaEventDisableTiming));
}

PlanChannel::~PlanChannel() {
  if (copy_done_ != nullptr) cudaEventSynchronize(copy_done_), cudaEventDestroy(copy_done_);
  if (run_done_ != nullptr) cudaEventSynchronize(run_done_), cudaEventDestroy(run_done_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

char* PlanChannel::staging() {
  TESSERA_CUDA_CHECK(cudaEventSynchronize(copy_done_));
  return static_cast<char*>(pinned_);
}

void PlanChannel::upload(int64_t bytes, cudaStream_t s) {
  // Double-buffering the plan instead would let the upload start at once, but a captured run has
  // the plan's addresses baked in and must find every later plan at the same place; and runs of
  // one wrapper are ordered anyway (they share the partial states), so waiting for the run before
  // costs no overlap that run order allows.
  wait_for_last_run(s);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(workspace_, pinned_, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, s))
      << " (plan upload)";
  TESSERA_CUDA_CHECK(cudaEventRecord(copy_done_, s));
  plan_stream_ = s;
}

bool PlanChannel::capturing(cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

void PlanChannel::order_run(cudaStream_t s, bool capturing) {
  if (capturing) {
    // A replay may come after any later plan() and on any stream, so the graph itself waits for
    // the plan upload and the run that are the latest when it is launched (external event wait
    // nodes; a plain cudaStreamWaitEvent inside a capture only orders captured work).
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, copy_done_, cudaEventWaitExternal));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, run_done_, cudaEventWaitExternal));
  } else {
    if (s != plan_stream_) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, copy_done_, 0));
    wait_for_last_run(s);
  }
}

void PlanChannel::record_run(cudaStream_t s, bool capturing) {
  if (capturing) {
    // Recorded by every replay (an external event record node), so that the next plan() and run()
    // wait for the latest replay.
    TESSERA_CUDA_CHECK(cudaEventRecordWithFlags(run_done_, s, cudaEventRecordExternal));
    run_captured_ = true;
  } else {
    TESSERA_CUDA_CHECK(cudaEventRecord(run_done_, s));
    run_stream_ = s;
  }
  run_recorded_ = true;
}

void PlanChannel::wait_for_last_run(cudaStream_t s) {
  if (run_recorded_ && (run_captured_ || s != run_stream_)) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, run_done_, 0));
}

}  // namespace detail
}  // namespace tessera
