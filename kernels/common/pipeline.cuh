// Pipelines between the warps that fill a ring of shared-memory stages and the warps that read
// them. A stage/phase state walks the ring; the mbarrier pipeline gives each stage a `full`
// barrier (the stage's data has landed) and an `empty` barrier (its readers are done), so a
// producer and its consumers each run ahead of the other by the depth of the ring and never meet
// at a CTA-wide barrier. The phase parity of a stage's barriers is the state's `phase`.
#pragma once

#include "kernels/common/cp_async.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// A position in a ring of kStages buffers: the stage and the parity of the passes over the ring
/// (the mbarrier phase a wait on that stage expects).
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  TESSERA_DEVICE void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

/// The mbarriers of a kStages ring: `full` (the data of a stage is there) and `empty` (every
/// consumer is done with it). Producers acquire a stage (wait until it is empty), fill it and
/// commit it; consumers wait until it is full, read it and release it. Each side keeps its own
/// PipelineState and advances it once per stage it passes.
template <int kStages>
struct MbarrierPipeline {
  uint64_t* full;   // [kStages]
  uint64_t* empty;  // [kStages]

  /// One thread initialises; a CTA barrier must follow before any other thread uses the pipeline.
  /// `producer_arrivals`: the arrivals that complete a full phase; `consumer_arrivals`: those that
  /// complete an empty phase.
  TESSERA_DEVICE void init(uint32_t producer_arrivals, uint32_t consumer_arrivals) const {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(full + st, producer_arrivals);
      mbarrier_init(empty + st, consumer_arrivals);
    }
  }
  /// Producer: waits until the stage's previous contents have been released (a fresh pipeline's
  /// stages count as released: the wait for the phase before phase 0 returns at once).
  TESSERA_DEVICE void producer_acquire(const PipelineState<kStages>& s) const {
    mbarrier_wait(empty + s.stage, s.phase ^ 1u);
  }
  /// Producer: one arrival of this thread on the stage's full barrier (its data is visible, or,
  /// with producer_arrive_on_copies too, whatever else it guards, such as a row table, is written).
  TESSERA_DEVICE void producer_arrive(const PipelineState<kStages>& s) const { mbarrier_arrive(full + s.stage); }
  /// Producer: an arrival on the stage's full barrier that happens when this thread's earlier
  /// cp.async copies land, so the producer need not wait for them. The copies are generic-proxy
  /// writes: a consumer whose wgmma reads the stage fences the async proxy after its wait.
  TESSERA_DEVICE void producer_arrive_on_copies(const PipelineState<kStages>& s) const {
    cp_async_mbarrier_arrive(full + s.stage);
  }
  /// Consumer: waits until the stage is full.
  TESSERA_DEVICE void consumer_wait(const PipelineState<kStages>& s) const { mbarrier_wait(full + s.stage, s.phase); }
  /// Consumer: this thread is done reading the stage.
  TESSERA_DEVICE void consumer_release(const PipelineState<kStages>& s) const { mbarrier_arrive(empty + s.stage); }
};

}  // namespace kernels
}  // namespace tessera
