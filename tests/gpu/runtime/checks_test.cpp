// GPU tests of the checks that keep bad index arrays from giving silently wrong results
// (include/tessera/validate.h, "Device-side checks"; include/tessera/runtime.h, "Validation"):
//   - the runtime's run() checks device page ids (and block-sparse column blocks) in checked mode,
//     pinned host page ids on every run, and both at every replay of a captured run;
//   - batch_prefill_ragged / batch_prefill_paged report a max_qo_len below the longest query of a
//     device-resident qo_indptr through a device-side check (next call or check_device_errors).
// Before these checks the runtime never looked at page ids (out-of-range ones were skipped, the
// output wrong), rejected pinned host page ids, and a short max_qo_len left rows unwritten.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"
#include "tessera/runtime.h"
#include "tessera/validate.h"

namespace {

using tessera::Device;
using tessera::DeviceType;
using tessera::DType;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

constexpr int64_t kHkv = 2, kGroup = 4, kHq = kHkv * kGroup, kD = 128, kPage = 16;
constexpr DType kDType = DType::kBF16;

/// Checked mode and device-check reports are process-wide: every test starts and ends with checked
/// mode off and no report pending.
class Checks : public ::testing::Test {
 protected:
  void SetUp() override {
    tessera::set_checked_mode(false);
    drain();
  }
  void TearDown() override {
    tessera::set_checked_mode(false);
    drain();
  }
  static void drain() {
    cudaDeviceSynchronize();
    try {
      tessera::check_device_errors();
    } catch (const tessera::Error&) {
    }
  }
};

/// A decode batch over a paged cache: three requests of 100, 200 and 300 keys (7, 13 and 19
/// pages of 16), page ids shuffled over a pool with spare pages.
struct PagedDecode {
  tessera_ref::PagedCache cache;
  tessera_ref::State ref;
  DeviceTensor q, o, k, v;
  DeviceBuffer indices;
  tessera::PagedKVCache view;
  std::vector<int32_t> qo_indptr = {0, 1, 2, 3};

  explicit PagedDecode(std::mt19937_64& rng) {
    const std::vector<int64_t> kv = {100, 200, 300};
    std::vector<std::vector<double>> qs(3), ks(3), vs(3);
    for (size_t r = 0; r < 3; ++r) {
      qs[r] = round_to(kDType, random_normal(kHq * kD, rng));
      ks[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
      vs[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
    }
    cache = tessera_ref::build_paged(ks, vs, kv, kHkv, kD, kPage, tessera_ref::Layout::NHD, rng() | 1, 5, 0.0);
    const Packed qp = pack_rows(qs, kHq * kD);
    ref = tessera_ref::attention_paged(qp.values, qp.indptr, cache, {kHq, kHkv, kD}, {});
    q = upload_tensor(kDType, qp.values, {3, kHq, kD});
    o = make_output(kDType, {3, kHq, kD});
    k = upload_tensor(kDType, cache.k_pages, {cache.num_pages, kPage, kHkv, kD});
    v = upload_tensor(kDType, cache.v_pages, {cache.num_pages, kPage, kHkv, kD});
    indices = upload_i32(cache.indices);
    view.k = k.view;
    view.v = v.view;
    view.indices = i32_view(indices, static_cast<int64_t>(cache.indices.size()));
  }
  int64_t num_pages() const { return cache.num_pages; }
  /// The page table with entry `j` replaced.
  std::vector<int32_t> indices_with(size_t j, int32_t value) const {
    std::vector<int32_t> bad = cache.indices;
    bad[j] = value;
    return bad;
  }
  void expect_correct(const std::string& what) const {
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    expect_matches_oracle(kDType, read_tensor(o), nullptr, ref, what);
  }
};

tessera::PlanShape decode_shape() { return tessera::PlanShape{kHq, kHkv, kD, kDType, {}}; }

tessera::RuntimeBounds decode_bounds() { return tessera::RuntimeBounds{4, 4, kHq, kHkv, kD}; }

/// A decode wrapper (no CUDA Graph) planned for a PagedDecode batch.
struct PlannedDecode {
  Workspace ws{tessera::BatchDecodeWrapper::workspace_size(decode_bounds())};
  tessera::BatchDecodeWrapper w{ws.view, decode_bounds()};
  explicit PlannedDecode(const PagedDecode& d) {
    w.plan(host_i32(d.cache.indptr), host_i32(d.cache.last_page_len), kPage, decode_shape());
  }
};

std::string out_of_range(const std::string& name, size_t j, int64_t value, int64_t bound) {
  return name + "[" + std::to_string(j) + "] = " + std::to_string(value) + " is out of range [0, " +
         std::to_string(bound) + ")";
}

TEST_F(Checks, RuntimeCheckedModeRejectsOutOfRangeDevicePageIds_sanitize) {
  std::mt19937_64 rng(test_seed());
  PagedDecode d(rng);
  PlannedDecode planned(d);
  tessera::BatchDecodeWrapper& w = planned.w;
  const int32_t bad_id = static_cast<int32_t>(d.num_pages());
  const std::vector<int32_t> bad = d.indices_with(5, bad_id);  // page 5 of request 0
  DeviceBuffer bad_dev = upload_i32(bad);
  tessera::PagedKVCache bad_cache = d.view;
  bad_cache.indices = i32_view(bad_dev, static_cast<int64_t>(bad.size()));
  // Outside checked mode device page ids are not read on the host (runtime.h): the kernels skip
  // the bad page. Documented, not silent: checked mode is the way to find it.
  EXPECT_NO_THROW(w.run(d.q.view, bad_cache, d.o.view));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  tessera::set_checked_mode(true);
  expect_error_any([&] { w.run(d.q.view, bad_cache, d.o.view); },
                   {(out_of_range("kv.indices", 5, bad_id, bad_id) + " (page 5 of request 0)").c_str()},
                   StatusCode::kInvalidArgument);
  const std::vector<int32_t> negative = d.indices_with(30, -3);  // page 10 of request 2
  DeviceBuffer negative_dev = upload_i32(negative);
  bad_cache.indices = i32_view(negative_dev, static_cast<int64_t>(negative.size()));
  expect_error_any([&] { w.run(d.q.view, bad_cache, d.o.view); },
                   {(out_of_range("kv.indices", 30, -3, bad_id) + " (page 10 of request 2)").c_str()},
                   StatusCode::kInvalidArgument);
  // The valid table passes checked mode and gives the right result.
  ASSERT_CUDA_OK(cudaMemset(d.o.buf.get(), 0xFF, d.o.buf.bytes()));
  w.run(d.q.view, d.view, d.o.view);
  d.expect_correct("checked mode, valid page ids");
}

TEST_F(Checks, RuntimeCheckedModeRejectsBadBlockSparseColumns) {
  std::mt19937_64 rng(test_seed());
  const int64_t m = 40, n = 300, br = 8, bc = 64, col_blocks = (n + bc - 1) / bc;
  const std::vector<int32_t> indptr = {0, 2, 3, 5, 5, 7};  // 5 block rows
  const std::vector<int32_t> ok = {0, 3, 1, 2, 4, 0, 4};
  const auto q = round_to(kDType, random_normal(m * kHq * kD, rng));
  const auto k = round_to(kDType, random_normal(n * kHkv * kD, rng));
  const auto v = round_to(kDType, random_normal(n * kHkv * kD, rng));
  tessera_ref::BlockSparse bsr;
  bsr.block_rows = br;
  bsr.block_cols = bc;
  bsr.indptr = indptr;
  bsr.indices = ok;
  const tessera_ref::State ref = tessera_ref::attention_block_sparse(q, k, v, m, n, bsr, {kHq, kHkv, kD}, {});
  DeviceTensor qd = upload_tensor(kDType, q, {m, kHq, kD}), kd = upload_tensor(kDType, k, {n, kHkv, kD}),
               vd = upload_tensor(kDType, v, {n, kHkv, kD}), od = make_output(kDType, {m, kHq, kD});
  tessera::RuntimeBounds bounds{8, m, kHq, kHkv, kD};
  Workspace ws(tessera::BlockSparseWrapper::workspace_size(bounds));
  tessera::BlockSparseWrapper w(ws.view, bounds);
  w.plan(host_i32(indptr), br, bc, m, n, decode_shape());
  tessera::set_checked_mode(true);
  std::vector<int32_t> past_end = ok;
  past_end[3] = static_cast<int32_t>(col_blocks);
  DeviceBuffer past_end_dev = upload_i32(past_end);
  expect_error_any(
      [&] { w.run(qd.view, kd.view, vd.view, i32_view(past_end_dev, 7), od.view); },
      {(out_of_range("indices", 3, col_blocks, col_blocks) + " (block row 2").c_str()}, StatusCode::kInvalidArgument);
  std::vector<int32_t> repeated = ok;
  repeated[1] = 0;  // block row 0 lists column block 0 twice
  DeviceBuffer repeated_dev = upload_i32(repeated);
  expect_error_any([&] { w.run(qd.view, kd.view, vd.view, i32_view(repeated_dev, 7), od.view); },
                   {"indices[1] = 0, expected > 0 (indices[0]; column blocks must be strictly increasing"},
                   StatusCode::kInvalidArgument);
  DeviceBuffer ok_dev = upload_i32(ok);
  w.run(qd.view, kd.view, vd.view, i32_view(ok_dev, 7), od.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_matches_oracle(kDType, read_tensor(od), nullptr, ref, "checked mode, valid column blocks");
}

TEST_F(Checks, RuntimeReadsAndChecksPinnedHostPageIdsOnEveryRun) {
  std::mt19937_64 rng(test_seed());
  PagedDecode d(rng);
  PlannedDecode planned(d);
  tessera::BatchDecodeWrapper& w = planned.w;
  PinnedI32 pinned(d.cache.indices);
  tessera::PagedKVCache host_cache = d.view;
  host_cache.indices = pinned.view();
  w.run(d.q.view, host_cache, d.o.view);  // the kernels read the page table through its mapping
  d.expect_correct("pinned host page ids");
  // Not in checked mode: host page ids are checked on every run.
  ASSERT_FALSE(tessera::checked_mode());
  pinned.ptr[12] = static_cast<int32_t>(d.num_pages()) + 7;  // page 5 of request 1
  expect_error_any([&] { w.run(d.q.view, host_cache, d.o.view); },
                   {(out_of_range("kv.indices", 12, d.num_pages() + 7, d.num_pages()) + " (page 5 of request 1)").c_str()},
                   StatusCode::kInvalidArgument);
  // Pageable host memory cannot be read by the kernels: named, not silently copied.
  std::vector<int32_t> pageable = d.cache.indices;
  tessera::PagedKVCache pageable_cache = d.view;
  pageable_cache.indices = host_i32(pageable);
  expect_error_any([&] { w.run(d.q.view, pageable_cache, d.o.view); }, {"kv.indices.device = cpu"},
                   StatusCode::kInvalidArgument);
}

/// A captured run() cannot check on the host what its replays will read: the check is captured too,
/// runs at every replay, and is raised by check_device_errors or by the next plan()/run().
void captured_run_reports_bad_page_ids(bool pinned_ids) {
  std::mt19937_64 rng(test_seed());
  PagedDecode d(rng);
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = kDType;
  const tessera::RuntimeBounds bounds{3, 3, kHq, kHkv, kD};
  Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
  tessera::BatchDecodeWrapper w(ws.view, bounds, options);
  PinnedI32 pinned(d.cache.indices);
  tessera::PagedKVCache cache = d.view;
  if (pinned_ids) cache.indices = pinned.view();
  auto set_page = [&](size_t j, int32_t value) {
    if (pinned_ids) {
      pinned.ptr[j] = value;
    } else {
      ASSERT_CUDA_OK(cudaMemcpy(static_cast<int32_t*>(d.indices.get()) + j, &value, sizeof(value),
                                cudaMemcpyHostToDevice));
    }
  };
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  w.plan(host_i32(d.cache.indptr), host_i32(d.cache.last_page_len), kPage, decode_shape(), stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  w.run(d.q.view, cache, d.o.view, TensorView{}, stream);
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA_OK(cudaGraphDestroy(graph));

  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  EXPECT_NO_THROW(tessera::check_device_errors(stream));
  d.expect_correct("replay with valid page ids");

  const int32_t bad_id = static_cast<int32_t>(d.num_pages());
  set_page(19, bad_id);  // the last page of request 1
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  expect_error_any([&] { tessera::check_device_errors(stream); },
                   {(out_of_range("kv.indices", 19, bad_id, bad_id) + " (request 1)").c_str()},
                   StatusCode::kInvalidArgument);
  EXPECT_NO_THROW(tessera::check_device_errors(stream)) << "a report is raised once";

  // Reported by the next call too, without an explicit check.
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  expect_error_any(
      [&] { w.plan(host_i32(d.cache.indptr), host_i32(d.cache.last_page_len), kPage, decode_shape(), stream); },
      {out_of_range("kv.indices", 19, bad_id, bad_id).c_str()}, StatusCode::kInvalidArgument);

  // Fixed table: clean again, and the next failure is reported too (the report is re-armed).
  set_page(19, d.cache.indices[19]);
  w.plan(host_i32(d.cache.indptr), host_i32(d.cache.last_page_len), kPage, decode_shape(), stream);
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  EXPECT_NO_THROW(tessera::check_device_errors(stream));
  d.expect_correct("replay after the fix");
  set_page(0, -1);
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  expect_error_any([&] { tessera::check_device_errors(stream); }, {out_of_range("kv.indices", 0, -1, bad_id).c_str()},
                   StatusCode::kInvalidArgument);
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(Checks, CapturedRunChecksDevicePageIdsAtEveryReplayInCheckedMode) {
  tessera::set_checked_mode(true);
  captured_run_reports_bad_page_ids(false);
}

TEST_F(Checks, CapturedRunChecksPinnedHostPageIdsAtEveryReplay_sanitize) { captured_run_reports_bad_page_ids(true); }

// --- max_qo_len of the one-shot prefill entry points ---------------------------------------------

/// Three requests of 16, 40 and 8 queries over 64 keys each, in ragged and paged form.
struct PrefillBatch {
  std::vector<int32_t> qo_indptr;
  tessera_ref::State ref;
  DeviceTensor q, o, k, v;
  DeviceBuffer qo_indptr_dev, kv_indptr_dev;
  DevicePaged paged;

  explicit PrefillBatch(std::mt19937_64& rng) {
    const std::vector<int64_t> qo = {16, 40, 8}, kv = {64, 64, 64};
    std::vector<std::vector<double>> qs(3), ks(3), vs(3);
    for (size_t r = 0; r < 3; ++r) {
      qs[r] = round_to(kDType, random_normal(qo[r] * kHq * kD, rng));
      ks[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
      vs[r] = round_to(kDType, random_normal(kv[r] * kHkv * kD, rng));
    }
    const Packed qp = pack_rows(qs, kHq * kD), kp = pack_rows(ks, kHkv * kD), vp = pack_rows(vs, kHkv * kD);
    qo_indptr = qp.indptr;
    ref = tessera_ref::attention_ragged(qp.values, qp.indptr, kp.values, vp.values, kp.indptr, {kHq, kHkv, kD}, {});
    q = upload_tensor(kDType, qp.values, {qp.indptr.back(), kHq, kD});
    o = make_output(kDType, {qp.indptr.back(), kHq, kD});
    k = upload_tensor(kDType, kp.values, {kp.indptr.back(), kHkv, kD});
    v = upload_tensor(kDType, vp.values, {kp.indptr.back(), kHkv, kD});
    qo_indptr_dev = upload_i32(qp.indptr);
    kv_indptr_dev = upload_i32(kp.indptr);
    const tessera_ref::PagedCache cache =
        tessera_ref::build_paged(ks, vs, kv, kHkv, kD, kPage, tessera_ref::Layout::NHD, rng() | 1, 2, 0.0);
    paged = upload_paged(kDType, cache, tessera::Layout::kNHD, false);
  }
  TensorView qo_view() const { return i32_view(qo_indptr_dev, 4); }
  void ragged(int64_t max_qo_len, cudaStream_t s) const {
    tessera::batch_prefill_ragged(q.view, qo_view(), max_qo_len, k.view, v.view, i32_view(kv_indptr_dev, 4), o.view,
                                  TensorView{}, {}, s);
  }
  void paged_call(int64_t max_qo_len, cudaStream_t s) const {
    tessera::batch_prefill_paged(q.view, qo_view(), max_qo_len, paged.view, o.view, TensorView{}, {}, s);
  }
};

constexpr const char* kTooShort = "qo_indptr[2] - qo_indptr[1] = 40 exceeds max_qo_len = 32";

TEST_F(Checks, TooSmallMaxQoLenWithDeviceQoIndptrIsReported_sanitize) {
  std::mt19937_64 rng(test_seed());
  PrefillBatch b(rng);
  cudaStream_t s;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Ragged: reported by check_device_errors, naming the call, the request and both values.
  EXPECT_NO_THROW(b.ragged(32, s));
  expect_error_any([&] { tessera::check_device_errors(s); }, {kTooShort}, StatusCode::kInvalidArgument);
  expect_error_any(
      [&] {
        b.ragged(32, s);
        tessera::check_device_errors(s);
      },
      {"batch_prefill_ragged: qo_indptr[2]"});
  // Paged: reported by the next call (here a correct one, which then raises instead of running).
  EXPECT_NO_THROW(b.paged_call(32, s));
  ASSERT_CUDA_OK(cudaStreamSynchronize(s));
  expect_error_any([&] { b.paged_call(40, s); }, {kTooShort}, StatusCode::kInvalidArgument);
  expect_error_any(
      [&] {
        b.paged_call(32, s);
        tessera::check_device_errors(s);
      },
      {"batch_prefill_paged: qo_indptr[2]"});
  // A sufficient max_qo_len (exact or larger) reports nothing and writes every row.
  for (int64_t max_qo_len : {40, 41}) {
    ASSERT_CUDA_OK(cudaMemsetAsync(b.o.buf.get(), 0xFF, b.o.buf.bytes(), s));
    b.ragged(max_qo_len, s);
    EXPECT_NO_THROW(tessera::check_device_errors(s));
    expect_matches_oracle(kDType, read_tensor(b.o), nullptr, b.ref, "max_qo_len " + std::to_string(max_qo_len));
  }
  // Checked mode reads qo_indptr on the host and rejects the call itself.
  tessera::set_checked_mode(true);
  expect_error_any([&] { b.ragged(32, s); }, {"qo_indptr[2] - qo_indptr[1] = 40 exceeds max_qo_len = 32"},
                   StatusCode::kInvalidArgument);
  ASSERT_CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
