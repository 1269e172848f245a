// How a runtime wrapper's plans reach its workspace and how its runs are ordered against them
// (include/tessera/runtime.h's "Streams" and "CUDA Graphs" rules), shared by every wrapper.
//
// A plan is staged in a pinned host buffer and uploaded with one cudaMemcpyAsync into the front
// of the workspace; runs read it there. The upload waits (on the GPU) for the last run, which may
// still read the plan it overwrites; a run waits for the last upload and the last run (runs of one
// wrapper share the workspace's partial states). Inside a stream capture the waits and the run's
// record become external event nodes, so every replay is ordered against the plan and the run
// that are the latest when it is launched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera {
namespace detail {

class PlanChannel {
 public:
  /// workspace: the device address plans are uploaded to; plan_capacity: the most bytes a plan
  /// takes (the pinned buffer's size).
  PlanChannel(char* workspace, int64_t plan_capacity);
  /// Waits for the last upload (it reads the pinned buffer) and the last run (a new wrapper over
  /// the same workspace must not overwrite a plan that a run still reads).
  ~PlanChannel();
  PlanChannel(const PlanChannel&) = delete;
  PlanChannel& operator=(const PlanChannel&) = delete;

  /// The pinned buffer to stage the next plan in, once the last upload has left it (blocks the
  /// host until then).
  char* staging();
  /// Uploads staging()[0, bytes) to the workspace on `s`, after the last run.
  void upload(int64_t bytes, cudaStream_t s);

  /// Whether `s` is capturing a graph.
  static bool capturing(cudaStream_t s);
  /// Orders a run about to be enqueued on `s` after the last upload and the last run (as external
  /// event waits when `capturing`).
  void order_run(cudaStream_t s, bool capturing);
  /// Records the run just enqueued on `s` (in a capture: recorded by every replay).
  void record_run(cudaStream_t s, bool capturing);

 private:
  void wait_for_last_run(cudaStream_t s);

  char* workspace_;
  void* pinned_ = nullptr;
  cudaEvent_t copy_done_ = nullptr;  // the last plan upload
  cudaEvent_t run_done_ = nullptr;   // the last run (for a captured run: recorded by every replay)
  bool run_recorded_ = false;
  bool run_captured_ = false;          // run_done_ may be recorded by replays, on any stream
  cudaStream_t run_stream_ = nullptr;  // of the last run outside a capture
  cudaStream_t plan_stream_ = nullptr;
};

}  // namespace detail
}  // namespace tessera
