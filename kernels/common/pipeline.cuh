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

/// Turns in a fixed rotation among kParties groups of kGroupThreads threads (whole warps), through
/// named barriers kFirstBarrier .. kFirstBarrier + kParties - 1: party i begins a turn once party
/// i - 1 has ended its turn of the same round (party 0: the last party's turn of the previous
/// round), so the parties' sections never overlap and follow one another in order. A round of
/// turns opens with open() (the last party's arrival that lets party 0 begin) and closes with
/// close() (party 0 consumes the last party's final arrival), so every barrier is balanced again
/// and the next round, or the CTA's exit, finds none half-complete. Every party takes the same
/// number of turns between open() and close().
template <int kParties, int kGroupThreads, uint32_t kFirstBarrier>
struct TurnRotation {
  static_assert(kParties >= 2 && kFirstBarrier + kParties <= 16, "named barriers 1-15");
  int party;  // this thread's group, 0 .. kParties - 1

  TESSERA_DEVICE void open() const {
    if (party == kParties - 1) named_barrier_arrive(kFirstBarrier, 2 * kGroupThreads);
  }
  TESSERA_DEVICE void begin_turn() const { named_barrier_sync(kFirstBarrier + party, 2 * kGroupThreads); }
  TESSERA_DEVICE void end_turn() const {
    named_barrier_arrive(kFirstBarrier + (party + 1) % kParties, 2 * kGroupThreads);
  }
  TESSERA_DEVICE void close() const {
    if (party == 0) named_barrier_sync(kFirstBarrier, 2 * kGroupThreads);
  }
};

}  // namespace kernels
}  // namespace tessera
