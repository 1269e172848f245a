// GPU tests of the runtime's stream and thread guarantees (include/tessera/runtime.h, "Streams"
// and "Threads"; docs/threading.md): plan() on one stream while the run() of the previous plan is
// still queued behind a slow kernel on another stream, with and without a captured CUDA Graph,
// many times over; two wrappers driven by two threads at once. Every output is compared with the
// fp64 oracle. Before run() recorded its completion and plan() waited for it, the plan upload
// overwrote the workspace under the queued run, which then computed the other batch's split.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "gpu/runtime/spin.h"
#include "reference/oracle.h"
#include "tessera/runtime.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

constexpr int64_t kHkv = 2, kGroup = 4, kHq = kHkv * kGroup, kD = 128;
constexpr DType kDType = DType::kBF16;
// Long enough that the run queued behind it is certainly still waiting when the host has made the
// next plan (a plan takes microseconds).
constexpr double kSpinMicroseconds = 2000;
constexpr int kIterations = 24;

tessera::PlanShape plan_shape() {
  tessera::PlanShape s;
  s.num_qo_heads = kHq;
  s.num_kv_heads = kHkv;
  s.head_dim = kD;
  s.dtype = kDType;
  s.attention.causal = true;
  return s;
}

/// A causal ragged prefill batch: inputs on the device and the oracle's result.
struct RaggedBatch {
  std::vector<int32_t> qo_indptr, kv_indptr;
  DeviceTensor q, k, v, o;
  tessera_ref::State ref;
};

RaggedBatch make_ragged(const std::vector<int64_t>& qo, const std::vector<int64_t>& kv, std::mt19937_64& rng) {
  RaggedBatch b;
  std::vector<std::vector<double>> qs(qo.size()), ks(qo.size()), vs(qo.size());
  for (size_t r = 0; r < qo.size(); ++r) {
    qs[r] = round_to(kDType, random_normal(qo[r] * kHq * kD, rng));
    ks[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
    vs[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
  }
  const Packed q = pack_rows(qs, kHq * kD), k = pack_rows(ks, kHkv * kD), v = pack_rows(vs, kHkv * kD);
  tessera_ref::Options opts;
  opts.causal = true;
  b.ref = tessera_ref::attention_ragged(q.values, q.indptr, k.values, v.values, k.indptr, {kHq, kHkv, kD}, opts);
  b.qo_indptr = q.indptr;
  b.kv_indptr = k.indptr;
  b.q = upload_tensor(kDType, q.values, {q.indptr.back(), kHq, kD});
  b.k = upload_tensor(kDType, k.values, {k.indptr.back(), kHkv, kD});
  b.v = upload_tensor(kDType, v.values, {v.indptr.back(), kHkv, kD});
  b.o = make_output(kDType, {q.indptr.back(), kHq, kD});
  return b;
}

/// Two batches with the same query and KV totals but different splits: a run that read the other
/// batch's plan would stay inside its tensors and compute wrong rows.
struct BatchPair {
  RaggedBatch x, y;
  explicit BatchPair(std::mt19937_64& rng)
      : x(make_ragged({64, 64, 1}, {3000, 700, 300}, rng)), y(make_ragged({1, 127, 1}, {300, 3000, 700}, rng)) {}
};

const tessera::RuntimeBounds kRaggedBounds{4, 256, kHq, kHkv, kD};

void poison(const RaggedBatch& b, cudaStream_t s) {
  ASSERT_CUDA_OK(cudaMemsetAsync(b.o.buf.get(), 0xFF, b.o.buf.bytes(), s));
}

void run(tessera::BatchPrefillRaggedWrapper& w, const RaggedBatch& b, cudaStream_t s) {
  w.run(b.q.view, b.k.view, b.v.view, b.o.view, TensorView{}, s);
}

TEST(RuntimeStreams, PlanOnOneStreamWhileRunOnAnotherIsInFlight_sanitize) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  BatchPair pair(rng);
  Workspace ws(tessera::BatchPrefillRaggedWrapper::workspace_size(kRaggedBounds));
  tessera::BatchPrefillRaggedWrapper w(ws.view, kRaggedBounds);
  Stream a, b;
  for (int it = 0; it < kIterations; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    // run(Y) alternates between the plan's stream and the other one.
    const cudaStream_t y_stream = it % 2 ? b.s : a.s;
    poison(pair.x, b.s);
    w.plan(host_i32(pair.x.qo_indptr), host_i32(pair.x.kv_indptr), plan_shape(), a.s);
    spin_on_stream(b.s, kSpinMicroseconds);
    run(w, pair.x, b.s);
    // run(X) is queued behind the spin: this plan's upload must wait for it.
    poison(pair.y, y_stream);
    w.plan(host_i32(pair.y.qo_indptr), host_i32(pair.y.kv_indptr), plan_shape(), a.s);
    run(w, pair.y, y_stream);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    expect_matches_oracle(kDType, read_tensor(pair.x.o), nullptr, pair.x.ref, "X (run on B behind the spin)");
    expect_matches_oracle(kDType, read_tensor(pair.y.o), nullptr, pair.y.ref, "Y (planned while X was queued)");
    if (HasFailure()) break;
  }
}

/// A CUDA Graph captured once on stream B, replayed behind a spin on B after plans made on stream
/// A: each replay must read its own plan, and the plan after it must wait for it.
TEST(RuntimeStreams, CapturedRunReplayedOnAnotherStreamThanThePlans) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  constexpr int64_t kPage = 16, kMaxBatch = 8;
  // One page pool: requests 0-3 are batch X, 4-6 batch Y.
  const std::vector<int64_t> kv = {3000, 17, 900, 1, 5, 2500, 1300};
  const size_t x_count = 4;
  std::vector<std::vector<double>> qs(kv.size()), ks(kv.size()), vs(kv.size());
  for (size_t r = 0; r < kv.size(); ++r) {
    qs[r] = round_to(kDType, random_normal(kHq * kD, rng));
    ks[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
    vs[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
  }
  const tessera_ref::PagedCache pool =
      tessera_ref::build_paged(ks, vs, kv, kHkv, kD, kPage, tessera_ref::Layout::NHD, rng() | 1, 0, 0.0);

  struct Step {
    std::vector<int32_t> indptr, indices, last_page_len;
    tessera_ref::State ref;
    DeviceBuffer q, indices_dev, out;
    int64_t batch = 0;
  };
  auto make_step = [&](size_t first, size_t count) {
    Step st;
    st.batch = static_cast<int64_t>(count);
    st.indptr.push_back(0);
    std::vector<std::vector<double>> q_parts;
    for (size_t r = first; r < first + count; ++r) {
      st.indices.insert(st.indices.end(), pool.indices.begin() + pool.indptr[r], pool.indices.begin() + pool.indptr[r + 1]);
      st.indptr.push_back(static_cast<int32_t>(st.indices.size()));
      st.last_page_len.push_back(pool.last_page_len[r]);
      q_parts.push_back(qs[r]);
    }
    tessera_ref::PagedCache cache = pool;
    cache.indptr = st.indptr;
    cache.indices = st.indices;
    cache.last_page_len = st.last_page_len;
    const Packed q = pack_rows(q_parts, kHq * kD);
    st.ref = tessera_ref::attention_paged(q.values, q.indptr, cache, {kHq, kHkv, kD}, {});
    st.q = upload_as(kDType, q.values);
    st.indices_dev = upload_i32(st.indices);
    st.out = DeviceBuffer(static_cast<size_t>(st.batch * kHq * kD * 2));
    return st;
  };
  Step steps[2] = {make_step(0, x_count), make_step(x_count, kv.size() - x_count)};

  tessera::RuntimeBounds bounds{kMaxBatch, kMaxBatch, kHq, kHkv, kD};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = kDType;
  Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
  tessera::BatchDecodeWrapper wrapper(ws.view, bounds, options);
  const DeviceTensor pages_k = upload_tensor(kDType, pool.k_pages, {pool.num_pages, kPage, kHkv, kD});
  const DeviceTensor pages_v = upload_tensor(kDType, pool.v_pages, {pool.num_pages, kPage, kHkv, kD});
  DeviceBuffer q_buf(kMaxBatch * kHq * kD * 2), o_buf(kMaxBatch * kHq * kD * 2);
  DeviceBuffer idx_buf(pool.indices.size() * sizeof(int32_t));
  const TensorView q(q_buf.get(), kDType, {kMaxBatch, kHq, kD}, Device::cuda(0));
  const TensorView o(o_buf.get(), kDType, {kMaxBatch, kHq, kD}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = pages_k.view;
  cache.v = pages_v.view;
  cache.indices = TensorView(idx_buf.get(), DType::kI32, {static_cast<int64_t>(pool.indices.size())}, Device::cuda(0));

  Stream a, b;
  tessera::PlanShape shape{kHq, kHkv, kD, kDType, {}};
  wrapper.plan(host_i32(steps[0].indptr), host_i32(steps[0].last_page_len), kPage, shape, a.s);
  cudaGraph_t graph;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeThreadLocal));
  wrapper.run(q, cache, o, TensorView{}, b.s);
  ASSERT_CUDA_OK(cudaStreamEndCapture(b.s, &graph));
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA_OK(cudaGraphDestroy(graph));

  for (int it = 0; it < kIterations; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    for (Step& st : steps) {
      wrapper.plan(host_i32(st.indptr), host_i32(st.last_page_len), kPage, shape, a.s);
      spin_on_stream(b.s, kSpinMicroseconds);
      // The fixed buffers get this step's contents on the replay's stream, after the previous replay.
      ASSERT_CUDA_OK(cudaMemcpyAsync(q_buf.get(), st.q.get(), st.q.bytes(), cudaMemcpyDeviceToDevice, b.s));
      ASSERT_CUDA_OK(cudaMemcpyAsync(idx_buf.get(), st.indices_dev.get(), st.indices_dev.bytes(),
                                     cudaMemcpyDeviceToDevice, b.s));
      ASSERT_CUDA_OK(cudaMemsetAsync(o_buf.get(), 0xFF, o_buf.bytes(), b.s));
      ASSERT_CUDA_OK(cudaGraphLaunch(exec, b.s));
      ASSERT_CUDA_OK(cudaMemcpyAsync(st.out.get(), o_buf.get(), st.out.bytes(), cudaMemcpyDeviceToDevice, b.s));
    }
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<double> out = download_as(kDType, steps[i].out.get(), steps[i].batch * kHq * kD);
      expect_matches_oracle(kDType, out, nullptr, steps[i].ref, i == 0 ? "replay of X" : "replay of Y");
    }
    if (HasFailure()) break;
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
}

/// Wrappers are independent: two threads, each with its own wrapper, workspace and stream, plan
/// and run at the same time (a wrapper itself is not shared: runtime.h, "Threads").
TEST(RuntimeThreads, TwoWrappersOnTwoThreadsAreIndependent) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  BatchPair pairs[2] = {BatchPair(rng), BatchPair(rng)};
  auto work = [&](int t) {
    ASSERT_CUDA_OK(cudaSetDevice(0));  // the current device is per thread
    Workspace ws(tessera::BatchPrefillRaggedWrapper::workspace_size(kRaggedBounds));
    tessera::BatchPrefillRaggedWrapper w(ws.view, kRaggedBounds);
    Stream s;
    BatchPair& p = pairs[t];
    for (int it = 0; it < kIterations; ++it) {
      for (const RaggedBatch* batch : {&p.x, &p.y}) {
        poison(*batch, s.s);
        w.plan(host_i32(batch->qo_indptr), host_i32(batch->kv_indptr), plan_shape(), s.s);
        run(w, *batch, s.s);
        ASSERT_CUDA_OK(cudaStreamSynchronize(s.s));
        expect_matches_oracle(kDType, read_tensor(batch->o), nullptr, batch->ref,
                              "thread " + std::to_string(t) + ", iteration " + std::to_string(it));
      }
    }
  };
  // An exception must not leave its thread (std::terminate): it becomes a test failure.
  auto worker = [&](int t) {
    try {
      work(t);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "thread " << t << ": " << e.what();
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
}

}  // namespace
