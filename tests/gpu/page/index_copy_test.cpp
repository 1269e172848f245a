// GPU tests of copy_index_arrays: up to four int32 arrays from host or device memory into device
// buffers in one launch. Destinations are poisoned (-1) beyond the copied entries, so a write past
// `count` or a missed entry shows up; host sources are overwritten right after the call returns,
// so a copy that read them late would see the new values; sizes are odd and random.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "tessera/page.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::IndexArrayCopy;
using tessera::TensorView;
using namespace tessera_test;

TensorView i32_view(void* data, int64_t n, Device device) { return TensorView(data, DType::kI32, {n}, device); }

std::vector<int32_t> random_ids(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> dist(0, 1 << 30);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = dist(rng);
  return out;
}

std::vector<int32_t> download_i32(const DeviceBuffer& b, size_t n) {
  std::vector<int32_t> out(n);
  b.download(out.data(), n * 4);
  return out;
}

TEST(CopyIndexArrays, HostAndDeviceSourcesInOneLaunch) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // A graph-mode decode plan's copies: page ids from the GPU, indptr and last_page_len from the host.
  const int64_t pages = 16385, batch = 65;
  const std::vector<int32_t> ids = random_ids(pages, rng);
  std::vector<int32_t> indptr = random_ids(batch + 1, rng), last = random_ids(batch, rng);
  const DeviceBuffer ids_src = upload_i32(ids);
  DeviceBuffer ids_dst(static_cast<size_t>(pages + 7) * 4), indptr_dst(static_cast<size_t>(batch + 9) * 4),
      last_dst(static_cast<size_t>(batch + 3) * 4);
  for (DeviceBuffer* b : {&ids_dst, &indptr_dst, &last_dst}) b->poison();
  const Device gpu = Device::cuda(0), host = Device::cpu();
  const IndexArrayCopy copies[] = {
      {i32_view(ids_dst.get(), pages + 7, gpu), i32_view(ids_src.get(), pages, gpu), pages},
      {i32_view(indptr_dst.get(), batch + 9, gpu), i32_view(indptr.data(), batch + 1, host), batch + 1},
      {i32_view(last_dst.get(), batch + 3, gpu), i32_view(last.data(), batch, host), batch},
  };
  ASSERT_TRUE(tessera::copy_index_arrays(copies, 3));
  const std::vector<int32_t> indptr_sent = indptr, last_sent = last;
  std::fill(indptr.begin(), indptr.end(), 7);  // the caller's arrays are free once the call returns
  std::fill(last.begin(), last.end(), 7);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<int32_t> want_ids = ids, want_indptr = indptr_sent, want_last = last_sent;
  want_ids.resize(pages + 7, -1);
  want_indptr.resize(batch + 9, -1);
  want_last.resize(batch + 3, -1);
  EXPECT_EQ(download_i32(ids_dst, pages + 7), want_ids);
  EXPECT_EQ(download_i32(indptr_dst, batch + 9), want_indptr);
  EXPECT_EQ(download_i32(last_dst, batch + 3), want_last);
}

TEST(CopyIndexArrays, DeclinesWhatDoesNotFitOneLaunch) {
  const int64_t n = tessera::kMaxIndexArrayHostEntries + 1;
  std::vector<int32_t> big(static_cast<size_t>(n));
  std::iota(big.begin(), big.end(), 0);
  DeviceBuffer dst(static_cast<size_t>(n) * 4);
  dst.poison();
  const IndexArrayCopy copy{i32_view(dst.get(), n, Device::cuda(0)), i32_view(big.data(), n, Device::cpu()), n};
  EXPECT_FALSE(tessera::copy_index_arrays(&copy, 1));  // host entries beyond the launch's parameters
  std::vector<IndexArrayCopy> five;  // one entry each, into distinct slots
  for (int i = 0; i < 5; ++i) {
    five.push_back({i32_view(static_cast<int32_t*>(dst.get()) + i, 1, Device::cuda(0)),
                    i32_view(big.data() + i, 1, Device::cpu()), 1});
  }
  EXPECT_FALSE(tessera::copy_index_arrays(five.data(), 5));  // more copies than one launch takes
  // Inside a stream capture: declined (a replay would write this call's values again).
  cudaStream_t s = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  IndexArrayCopy small = copy;
  small.count = 5;
  EXPECT_FALSE(tessera::copy_index_arrays(&small, 1, reinterpret_cast<tessera::StreamHandle>(s)));
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_CUDA_OK(cudaGraphDestroy(graph));
  ASSERT_CUDA_OK(cudaStreamDestroy(s));
  // Nothing was written by the declined calls.
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  for (int32_t x : download_i32(dst, static_cast<size_t>(n))) ASSERT_EQ(x, -1);
  // And a copy of what fits, the same destination, goes through.
  EXPECT_TRUE(tessera::copy_index_arrays(&small, 1));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int32_t> got = download_i32(dst, 6);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4, -1}));
}

TEST(CopyIndexArrays, BadArgumentsAreNamed) {
  DeviceBuffer a(64 * 4), b(64 * 4);
  std::vector<int32_t> host(64, 1);
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  const TensorView da = i32_view(a.get(), 64, gpu), db = i32_view(b.get(), 64, gpu), h = i32_view(host.data(), 64, cpu);
  IndexArrayCopy c{da, h, 65};
  expect_error([&] { tessera::copy_index_arrays(&c, 1); }, "copies[0].dst is");
  c = {h, da, 8};
  expect_error([&] { tessera::copy_index_arrays(&c, 1); }, "copies[0].dst is on cpu, expected the current GPU");
  c = {da, TensorView(host.data(), DType::kF32, {64}, cpu), 8};
  expect_error([&] { tessera::copy_index_arrays(&c, 1); }, "expected 1-D i32");
  c = {da, h, -1};
  expect_error([&] { tessera::copy_index_arrays(&c, 1); }, "copies[0].count = -1");
  // Overlapping destinations, and a destination over another copy's device source.
  const TensorView da_shift = i32_view(static_cast<int32_t*>(a.get()) + 8, 32, gpu);
  const IndexArrayCopy clash[] = {{da, h, 16}, {da_shift, h, 16}};
  expect_error([&] { tessera::copy_index_arrays(clash, 2); }, "copies[0].dst overlaps copies[1].dst");
  const IndexArrayCopy chain[] = {{db, da, 16}, {da, h, 16}};
  expect_error([&] { tessera::copy_index_arrays(chain, 2); }, "copies[1].dst overlaps copies[0].src");
}

}  // namespace
