// GPU tests of append_paged_mla_kv_cache: after the append, every element of the latent page
// tensors (and of the padding between them, when ckv and kpe share one tensor) must equal, bit for
// bit, a host copy of the cache with the appended rows written where the page table puts them.
// The cache is poisoned (0xFFFF) except for the tokens it already held, so a stray or missed write
// shows up as a mismatch; elements are random 16-bit patterns (NaN payloads included), so a copy
// that went through a float conversion would not pass either.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "tessera/page.h"
#include "tessera/validate.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;

constexpr uint16_t kPoison = 0xFFFF;  // DeviceBuffer::poison(): NaN in f16 and bf16

/// How ckv and kpe are stored: two tensors each, or (as DeepSeek's kv_a projection produces them
/// and as some engines keep the cache) slices of one tensor, [.., ckv_dim + kpe_dim (+ padding)].
enum class LatentStorage { kSeparate, kShared };

struct MlaAppendCase {
  DType dtype;
  int64_t page_size;
  int64_t batch;
  int64_t ckv_dim;  // 16-bit units of the host images (an fp8 case's rows are twice as many elements)
  int64_t kpe_dim;
  LatentStorage storage;
};

std::string describe(const MlaAppendCase& c) {
  return std::string(tessera::dtype_name(c.dtype)) + "_p" + std::to_string(c.page_size) + "_b" +
         std::to_string(c.batch) + "_ckv" + std::to_string(c.ckv_dim) + "_kpe" + std::to_string(c.kpe_dim) +
         (c.storage == LatentStorage::kSeparate ? "_separate" : "_shared");
}

std::string case_name(const ::testing::TestParamInfo<MlaAppendCase>& info) { return describe(info.param); }

/// Readable parameters in failure messages.
void PrintTo(const MlaAppendCase& c, std::ostream* os) { *os << describe(c); }

/// Random 16-bit patterns other than the poison.
std::vector<uint16_t> random_bits(size_t count, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> dist(0, kPoison - 1);
  std::vector<uint16_t> out(count);
  for (uint16_t& x : out) x = static_cast<uint16_t>(dist(rng));
  return out;
}

DeviceBuffer upload_bits(const std::vector<uint16_t>& host) {
  DeviceBuffer buf(host.size() * sizeof(uint16_t));
  buf.upload(host.data(), buf.bytes());
  return buf;
}

std::vector<uint16_t> download_bits(const DeviceBuffer& buf) {
  std::vector<uint16_t> host(buf.bytes() / sizeof(uint16_t));
  buf.download(host.data(), buf.bytes());
  return host;
}

/// Counts the elements of `got` that differ from `expected`, reporting the first few.
size_t count_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& expected, const char* what) {
  EXPECT_EQ(got.size(), expected.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    if (got[i] != expected[i] && mismatches++ < 5) {
      ADD_FAILURE() << what << " element " << i << ": got 0x" << std::hex << got[i] << ", expected 0x" << expected[i]
                    << std::dec;
    }
  }
  return mismatches;
}

/// A paged latent cache in host memory: its page table and where ckv/kpe of (page, slot) live in
/// the host images of one or two device buffers.
struct HostLatentCache {
  int64_t num_pages = 0, page_size = 0, ckv_dim = 0, kpe_dim = 0;
  std::vector<int32_t> indptr, indices, last_page_len;
  // Element offsets: ckv of (page, slot) at ckv_base + page * page_stride + slot * slot_stride in
  // image[ckv_image], likewise kpe.
  int ckv_image = 0, kpe_image = 0;
  int64_t ckv_base = 0, kpe_base = 0;
  int64_t ckv_page_stride = 0, ckv_slot_stride = 0, kpe_page_stride = 0, kpe_slot_stride = 0;
  std::vector<std::vector<uint16_t>> images;

  int32_t page_of(int64_t b, int64_t pos) const { return indices[indptr[b] + pos / page_size]; }
  void write(int64_t b, int64_t pos, const uint16_t* ckv, const uint16_t* kpe) {
    const int64_t page = page_of(b, pos), slot = pos % page_size;
    std::copy_n(ckv, ckv_dim, images[ckv_image].begin() + ckv_base + page * ckv_page_stride + slot * ckv_slot_stride);
    std::copy_n(kpe, kpe_dim, images[kpe_image].begin() + kpe_base + page * kpe_page_stride + slot * kpe_slot_stride);
  }
};

class AppendPagedMlaTest : public ::testing::TestWithParam<MlaAppendCase> {};

TEST_P(AppendPagedMlaTest, MatchesHostCopyBitForBit) {
  const MlaAppendCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);

  // Request b held old_len[b] tokens and appends append_len[b] (some none, some start empty); the
  // page table describes the lengths after the append. nnz is made odd.
  std::uniform_int_distribution<int64_t> old_len_dist(0, 3 * c.page_size + 5), append_len_dist(0, 2 * c.page_size + 3);
  std::vector<int64_t> old_len(c.batch), append_len(c.batch), kv_len(c.batch);
  int64_t nnz = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    old_len[b] = old_len_dist(rng);
    append_len[b] = (b % 5 == 3) ? 0 : append_len_dist(rng);
    nnz += append_len[b];
  }
  if (nnz % 2 == 0) {
    ++append_len[0];
    ++nnz;
  }
  HostLatentCache cache;
  cache.page_size = c.page_size;
  cache.ckv_dim = c.ckv_dim;
  cache.kpe_dim = c.kpe_dim;
  cache.indptr = {0};
  for (int64_t b = 0; b < c.batch; ++b) {
    kv_len[b] = old_len[b] + append_len[b];
    const int64_t pages = (kv_len[b] + c.page_size - 1) / c.page_size;
    cache.indptr.push_back(cache.indptr.back() + static_cast<int32_t>(pages));
    cache.last_page_len.push_back(pages == 0 ? 0 : static_cast<int32_t>(kv_len[b] - (pages - 1) * c.page_size));
  }
  // The pages in random order, among 3 that no request owns.
  cache.num_pages = cache.indptr.back() + 3;
  std::vector<int32_t> ids(static_cast<size_t>(cache.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  cache.indices.assign(ids.begin(), ids.begin() + cache.indptr.back());

  // The device layout and its host images, poisoned.
  const int64_t slots = cache.num_pages * c.page_size;
  constexpr int64_t kPadding = 8;  // between a slot's kpe and the next slot's ckv (shared storage)
  if (c.storage == LatentStorage::kSeparate) {
    cache.images = {std::vector<uint16_t>(slots * c.ckv_dim, kPoison), std::vector<uint16_t>(slots * c.kpe_dim, kPoison)};
    cache.kpe_image = 1;
    cache.ckv_slot_stride = c.ckv_dim;
    cache.kpe_slot_stride = c.kpe_dim;
  } else {
    const int64_t row = c.ckv_dim + c.kpe_dim + kPadding;
    cache.images = {std::vector<uint16_t>(slots * row, kPoison)};
    cache.kpe_base = c.ckv_dim;
    cache.ckv_slot_stride = cache.kpe_slot_stride = row;
  }
  cache.ckv_page_stride = c.page_size * cache.ckv_slot_stride;
  cache.kpe_page_stride = c.page_size * cache.kpe_slot_stride;
  // The tokens the cache already holds.
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t pos = 0; pos < old_len[b]; ++pos) {
      const std::vector<uint16_t> ckv = random_bits(c.ckv_dim, rng), kpe = random_bits(c.kpe_dim, rng);
      cache.write(b, pos, ckv.data(), kpe.data());
    }
  }
  std::vector<DeviceBuffer> d_images;
  for (const auto& image : cache.images) d_images.push_back(upload_bits(image));

  // The appended rows, in random order (targets are per row).
  std::vector<int32_t> batch_indices, positions;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t pos = old_len[b]; pos < kv_len[b]; ++pos) {
      batch_indices.push_back(static_cast<int32_t>(b));
      positions.push_back(static_cast<int32_t>(pos));
    }
  }
  std::vector<size_t> order(static_cast<size_t>(nnz));
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  {
    std::vector<int32_t> bi(order.size()), pos(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      bi[i] = batch_indices[order[i]];
      pos[i] = positions[order[i]];
    }
    batch_indices.swap(bi);
    positions.swap(pos);
  }
  // Shared storage: the rows as one [nnz, ckv_dim + kpe_dim] tensor, ckv and kpe its two slices.
  const int64_t append_row = c.storage == LatentStorage::kSeparate ? 0 : c.ckv_dim + c.kpe_dim;
  const std::vector<uint16_t> append_ckv = random_bits(nnz * c.ckv_dim, rng), append_kpe = random_bits(nnz * c.kpe_dim, rng);
  std::vector<DeviceBuffer> d_rows;
  if (c.storage == LatentStorage::kSeparate) {
    d_rows.push_back(upload_bits(append_ckv));
    d_rows.push_back(upload_bits(append_kpe));
  } else {
    std::vector<uint16_t> rows(static_cast<size_t>(nnz * append_row));
    for (int64_t i = 0; i < nnz; ++i) {
      std::copy_n(append_ckv.begin() + i * c.ckv_dim, c.ckv_dim, rows.begin() + i * append_row);
      std::copy_n(append_kpe.begin() + i * c.kpe_dim, c.kpe_dim, rows.begin() + i * append_row + c.ckv_dim);
    }
    d_rows.push_back(upload_bits(rows));
  }

  // What the cache must hold afterwards.
  HostLatentCache expected = cache;
  for (int64_t i = 0; i < nnz; ++i) {
    expected.write(batch_indices[i], positions[i], append_ckv.data() + i * c.ckv_dim, append_kpe.data() + i * c.kpe_dim);
  }

  const Device gpu = Device::cuda(0);
  // The host images count 16-bit units; an fp8 case's views count bytes: twice the elements and
  // strides over the same memory.
  const int64_t k = 2 / static_cast<int64_t>(tessera::dtype_size(c.dtype));
  auto* ckv_base = static_cast<uint16_t*>(d_images[cache.ckv_image].get()) + cache.ckv_base;
  auto* kpe_base = static_cast<uint16_t*>(d_images[cache.kpe_image].get()) + cache.kpe_base;
  const TensorView ckv_cache(ckv_base, c.dtype, {cache.num_pages, c.page_size, k * c.ckv_dim},
                             {k * cache.ckv_page_stride, k * cache.ckv_slot_stride, 1}, gpu);
  const TensorView kpe_cache(kpe_base, c.dtype, {cache.num_pages, c.page_size, k * c.kpe_dim},
                             {k * cache.kpe_page_stride, k * cache.kpe_slot_stride, 1}, gpu);
  TensorView ak, ap;
  if (c.storage == LatentStorage::kSeparate) {
    ak = TensorView(d_rows[0].get(), c.dtype, {nnz, k * c.ckv_dim}, gpu);
    ap = TensorView(d_rows[1].get(), c.dtype, {nnz, k * c.kpe_dim}, gpu);
  } else {
    auto* rows = static_cast<uint16_t*>(d_rows[0].get());
    ak = TensorView(rows, c.dtype, {nnz, k * c.ckv_dim}, {k * append_row, 1}, gpu);
    ap = TensorView(rows + c.ckv_dim, c.dtype, {nnz, k * c.kpe_dim}, {k * append_row, 1}, gpu);
  }
  auto d_bi = upload_i32(batch_indices), d_pos = upload_i32(positions);
  auto d_indptr = upload_i32(cache.indptr), d_indices = upload_i32(cache.indices), d_last = upload_i32(cache.last_page_len);
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  tessera::append_paged_mla_kv_cache(ak, ap, TensorView(d_bi.get(), DType::kI32, {nnz}, gpu),
                                     TensorView(d_pos.get(), DType::kI32, {nnz}, gpu), ckv_cache, kpe_cache,
                                     TensorView(d_indptr.get(), DType::kI32, {c.batch + 1}, gpu),
                                     TensorView(d_indices.get(), DType::kI32, {static_cast<int64_t>(cache.indices.size())}, gpu),
                                     TensorView(d_last.get(), DType::kI32, {c.batch}, gpu), stream);
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));

  for (size_t i = 0; i < d_images.size(); ++i) {
    const std::string what = c.storage == LatentStorage::kShared ? "shared cache" : i == 0 ? "ckv_cache" : "kpe_cache";
    EXPECT_EQ(count_mismatches(download_bits(d_images[i]), expected.images[i], what.c_str()), 0u)
        << what << " elements differing from the host copy (nnz = " << nnz << ")";
  }
  // The appended rows are only read.
  if (c.storage == LatentStorage::kSeparate) {
    EXPECT_EQ(count_mismatches(download_bits(d_rows[0]), append_ckv, "append_ckv"), 0u);
    EXPECT_EQ(count_mismatches(download_bits(d_rows[1]), append_kpe, "append_kpe"), 0u);
  }
}

std::vector<MlaAppendCase> mla_append_cases() {
  std::vector<MlaAppendCase> cases;
  int n = 0;
  // DeepSeek's widths (ckv 512, kpe 64) at page sizes 1, 16 and 64, one request and several.
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int64_t page_size : {1, 16, 64})
      for (int64_t batch : {1, 7}) {
        const auto storage = n++ % 2 ? LatentStorage::kShared : LatentStorage::kSeparate;
        cases.push_back({dtype, page_size, batch, 512, 64, storage});
      }
  // Other widths (any whole 16-byte vectors, the smallest one included) and an odd page size.
  cases.push_back({DType::kBF16, 3, 5, 256, 32, LatentStorage::kShared});
  cases.push_back({DType::kF16, 16, 33, 128, 8, LatentStorage::kSeparate});
  cases.push_back({DType::kBF16, 64, 3, 8, 8, LatentStorage::kShared});
  // fp8 caches, DeepSeek's widths (256 + 32 16-bit units: 512 + 64 bytes).
  cases.push_back({DType::kE4M3, 16, 7, 256, 32, LatentStorage::kShared});
  cases.push_back({DType::kE5M2, 1, 3, 256, 32, LatentStorage::kSeparate});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, AppendPagedMlaTest, ::testing::ValuesIn(mla_append_cases()), case_name);

// ------------------------------------------------------------------------------------------------
// Bad arguments and out-of-range rows.

/// A small bf16 latent cache (4 pages of 16 slots, ckv 512, kpe 64) and 4 rows appended to one
/// request of 2 pages holding 21 tokens, in device buffers; each test edits what it breaks.
struct SmallMlaCall {
  static constexpr int64_t kPages = 4, kPageSize = 16, kCkv = 512, kKpe = 64, kRows = 4;
  Device gpu = Device::cuda(0);
  DeviceBuffer buf{1 << 22};
  DeviceBuffer d_bi = upload_i32({0, 0, 0, 0}), d_pos = upload_i32({17, 18, 19, 20});
  DeviceBuffer d_indptr = upload_i32({0, 2}), d_indices = upload_i32({3, 1}), d_last = upload_i32({5});
  char* base = static_cast<char*>(buf.get());
  TensorView append_ckv{base, DType::kBF16, {kRows, kCkv}, gpu};
  TensorView append_kpe{base + (1 << 20), DType::kBF16, {kRows, kKpe}, gpu};
  TensorView batch_indices{d_bi.get(), DType::kI32, {kRows}, gpu};
  TensorView positions{d_pos.get(), DType::kI32, {kRows}, gpu};
  TensorView ckv_cache{base + (2 << 20), DType::kBF16, {kPages, kPageSize, kCkv}, gpu};
  TensorView kpe_cache{base + (3 << 20), DType::kBF16, {kPages, kPageSize, kKpe}, gpu};
  TensorView kv_indptr{d_indptr.get(), DType::kI32, {2}, gpu};
  TensorView kv_indices{d_indices.get(), DType::kI32, {2}, gpu};
  TensorView kv_last_page_len{d_last.get(), DType::kI32, {1}, gpu};

  void run() const {
    tessera::append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache,
                                       kv_indptr, kv_indices, kv_last_page_len);
  }
};

/// Restores unchecked mode when a test that turned checked mode on ends, however it ends.
struct CheckedModeScope {
  CheckedModeScope() { tessera::set_checked_mode(true); }
  ~CheckedModeScope() { tessera::set_checked_mode(false); }
};

TEST(AppendPagedMlaErrors, BadArgumentsAreNamed) {
  auto expect = [](auto edit, const std::string& needle) {
    SmallMlaCall call;
    edit(call);
    expect_error([&] { call.run(); }, needle);
  };
  using C = SmallMlaCall;
  // Widths: the cache's, whole 16-byte vectors.
  expect([](C& c) { c.append_ckv.shape[1] = 256; }, "append_ckv.shape[1] = 256, expected 512 (ckv_dim");
  expect([](C& c) { c.append_kpe.shape[1] = 32; }, "append_kpe.shape[1] = 32, expected 64 (kpe_dim");
  expect([](C& c) { c.append_kpe.shape[0] = 3; }, "append_kpe.shape[0] = 3, expected 4 (nnz");
  expect([](C& c) { c.kpe_cache = TensorView(c.base + (3 << 20), DType::kBF16, {C::kPages, C::kPageSize, 60}, c.gpu); },
         "kpe_cache.shape[2] = 60, expected a positive multiple of 8");
  expect([](C& c) { c.ckv_cache = TensorView(c.base + (2 << 20), DType::kBF16, {C::kPages, C::kPageSize, 0}, c.gpu); },
         "ckv_cache.shape[2] = 0, expected a positive multiple of 8");
  expect([](C& c) { c.kpe_cache.shape[0] = 3; }, "kpe_cache.shape[0] = 3, expected 4 (num_pages");
  expect([](C& c) { c.kpe_cache.shape[1] = 8; }, "kpe_cache.shape[1] = 8, expected 16 (page_size");
  expect([](C& c) { c.ckv_cache = TensorView(c.base, DType::kBF16, {C::kPages, C::kPageSize, 2, C::kCkv}, c.gpu); },
         "ckv_cache.ndim = 4, expected 3 ([num_pages, page_size, ckv_dim])");
  expect([](C& c) { c.append_kpe = TensorView(c.base, DType::kBF16, {C::kRows, 1, C::kKpe}, c.gpu); },
         "append_kpe.ndim = 3, expected 2 ([nnz, kpe_dim])");
  // Dtypes: f16, bf16, e4m3 or e5m2, one for all four tensors.
  expect([](C& c) { c.ckv_cache.dtype = c.kpe_cache.dtype = c.append_ckv.dtype = c.append_kpe.dtype = DType::kF32; },
         "ckv_cache.dtype = f32, expected one of {f16, bf16, e4m3, e5m2}");
  expect([](C& c) { c.ckv_cache.dtype = DType::kI32; }, "ckv_cache.dtype = i32, expected one of {f16, bf16, e4m3, e5m2}");
  expect([](C& c) { c.kpe_cache.dtype = DType::kE4M3; }, "kpe_cache.dtype = e4m3, expected bf16 (the dtype of ckv_cache)");
  expect([](C& c) { c.kpe_cache.dtype = DType::kF16; }, "kpe_cache.dtype = f16, expected bf16 (the dtype of ckv_cache)");
  expect([](C& c) { c.append_ckv.dtype = DType::kF16; }, "append_ckv.dtype = f16, expected bf16 (the dtype of ckv_cache)");
  expect([](C& c) { c.append_kpe.dtype = DType::kF16; }, "append_kpe.dtype = f16, expected bf16 (the dtype of ckv_cache)");
  // Layout: contiguous last dim, 16-byte aligned rows.
  expect([](C& c) { c.append_ckv.strides[1] = 2; }, "append_ckv.strides[1] = 2, expected 1");
  expect([](C& c) { c.append_ckv = TensorView(c.base, DType::kBF16, {C::kRows, C::kCkv}, {C::kCkv + 4, 1}, c.gpu); },
         "append_ckv.strides[0] = 516, expected a multiple of 8 elements (16 bytes)");
  expect([](C& c) { c.append_kpe.data = c.base + (1 << 20) + 2; }, "is not 16-byte aligned");
  expect([](C& c) { c.kpe_cache.strides[1] = 68; }, "kpe_cache.strides[1] = 68, expected a multiple of 8");
  // Index arrays: i32, contiguous, [nnz] or the page table's lengths, on the cache's device.
  expect([](C& c) { c.batch_indices.shape[0] = 3; }, "batch_indices.shape[0] = 3, expected 4");
  expect([](C& c) { c.positions.dtype = DType::kF32; }, "positions.dtype = f32, expected i32");
  expect([](C& c) { c.positions.strides[0] = 2; }, "positions.strides[0] = 2, expected 1");
  expect([](C& c) { c.batch_indices.device = Device::cpu(); }, "batch_indices.device = cpu, expected a CUDA device");
  expect([](C& c) { c.kv_last_page_len.shape[0] = 2; }, "kv_last_page_len.shape[0] = 2, expected 1 (batch_size");
  expect([](C& c) { c.kv_indptr.shape[0] = 0; }, "kv_indptr.shape[0] = 0, expected >= 1");
  expect([](C& c) { c.ckv_cache.device = Device::cuda(1); }, "kpe_cache.device = cuda:0, expected cuda:1");
  // No rows: nothing to do, even without data pointers.
  SmallMlaCall empty;
  empty.append_ckv = TensorView(nullptr, DType::kBF16, {0, C::kCkv}, empty.gpu);
  empty.append_kpe = TensorView(nullptr, DType::kBF16, {0, C::kKpe}, empty.gpu);
  empty.batch_indices = empty.positions = TensorView(nullptr, DType::kI32, {0}, empty.gpu);
  EXPECT_NO_THROW(empty.run());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

// Rows whose target is out of range are skipped, never written (unchecked mode); checked mode
// reports them, and page ids out of range, before anything is written.
TEST(AppendPagedMlaErrors, OutOfRangeRowsAreSkippedOrReported) {
  constexpr int64_t kPages = 4, kPageSize = 4, kCkv = 16, kKpe = 8;
  const Device gpu = Device::cuda(0);
  // Request 0 owns pages 2, 0 and holds 7 tokens; request 1 owns "page 9" (out of range), 2 tokens.
  const std::vector<int32_t> indptr = {0, 2, 3}, indices = {2, 0, 9}, last = {3, 2};
  const std::vector<int32_t> batch_indices = {0, 0, -1, 2, 0, 1, 0, 0};
  const std::vector<int32_t> positions = {6, 7, 0, 0, -1, 0, 0x7FFFFFFF, 0};
  const int64_t nnz = static_cast<int64_t>(batch_indices.size());
  std::mt19937_64 rng(test_seed());
  const std::vector<uint16_t> append_ckv = random_bits(nnz * kCkv, rng), append_kpe = random_bits(nnz * kKpe, rng);
  DeviceBuffer d_ckv(kPages * kPageSize * kCkv * 2), d_kpe(kPages * kPageSize * kKpe * 2);
  d_ckv.poison();
  d_kpe.poison();
  auto d_ack = upload_bits(append_ckv), d_akp = upload_bits(append_kpe);
  auto d_bi = upload_i32(batch_indices), d_pos = upload_i32(positions);
  auto d_indptr = upload_i32(indptr), d_indices = upload_i32(indices), d_last = upload_i32(last);
  auto d_good_indices = upload_i32({2, 0, 1});
  const TensorView ckv_cache(d_ckv.get(), DType::kF16, {kPages, kPageSize, kCkv}, gpu);
  const TensorView kpe_cache(d_kpe.get(), DType::kF16, {kPages, kPageSize, kKpe}, gpu);
  const TensorView ak(d_ack.get(), DType::kF16, {nnz, kCkv}, gpu), ap(d_akp.get(), DType::kF16, {nnz, kKpe}, gpu);
  const TensorView bi(d_bi.get(), DType::kI32, {nnz}, gpu), pos(d_pos.get(), DType::kI32, {nnz}, gpu);
  const TensorView kv_indptr(d_indptr.get(), DType::kI32, {3}, gpu), kv_last(d_last.get(), DType::kI32, {2}, gpu);
  const TensorView bad_indices(d_indices.get(), DType::kI32, {3}, gpu), good_indices(d_good_indices.get(), DType::kI32, {3}, gpu);
  auto append = [&](const TensorView& b, const TensorView& p, const TensorView& kv_indices) {
    tessera::append_paged_mla_kv_cache(ak, ap, b, p, ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_last);
  };
  const std::vector<uint16_t> poisoned_ckv(kPages * kPageSize * kCkv, kPoison), poisoned_kpe(kPages * kPageSize * kKpe, kPoison);

  {
    const CheckedModeScope checked;
    expect_error([&] { append(bi, pos, bad_indices); }, "kv_indices[2] = 9 is out of range [0, 4) (page 0 of request 1)");
    expect_error([&] { append(bi, pos, good_indices); }, "positions[1] = 7 is out of range [0, 7) (the KV length of request 0");
    // Only the rows after the first bad one are wrong: batch_indices[2] comes next.
    auto d_pos_ok = upload_i32({6, 5, 0, 0, 0, 0, 0, 0});
    const TensorView pos_ok(d_pos_ok.get(), DType::kI32, {nnz}, gpu);
    expect_error([&] { append(bi, pos_ok, good_indices); }, "batch_indices[2] = -1 is out of range [0, 2)");
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(count_mismatches(download_bits(d_ckv), poisoned_ckv, "ckv_cache after checked-mode errors"), 0u);
    EXPECT_EQ(count_mismatches(download_bits(d_kpe), poisoned_kpe, "kpe_cache after checked-mode errors"), 0u);
  }

  // Unchecked: rows 0 (request 0, position 6: page 0, slot 2) and 7 (position 0: page 2, slot 0)
  // are written; the others target a position outside the request (1, 4, 6), a request outside
  // the batch (2, 3) or page 9 of 4 (5).
  append(bi, pos, bad_indices);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> expected_ckv = poisoned_ckv, expected_kpe = poisoned_kpe;
  for (const auto& [row, page, slot] : {std::tuple<int64_t, int64_t, int64_t>{0, 0, 2}, {7, 2, 0}}) {
    std::copy_n(append_ckv.begin() + row * kCkv, kCkv, expected_ckv.begin() + (page * kPageSize + slot) * kCkv);
    std::copy_n(append_kpe.begin() + row * kKpe, kKpe, expected_kpe.begin() + (page * kPageSize + slot) * kKpe);
  }
  EXPECT_EQ(count_mismatches(download_bits(d_ckv), expected_ckv, "ckv_cache"), 0u);
  EXPECT_EQ(count_mismatches(download_bits(d_kpe), expected_kpe, "kpe_cache"), 0u);
}

}  // namespace
