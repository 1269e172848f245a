// GPU tests of append_paged_kv_cache: the cache after the append must equal, bit for bit, the
// oracle's paged cache built from the whole logical sequences, and no other slot may change.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/page.h"
#include "tessera/validate.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::TensorView;
using namespace tessera_test;

// Slots that hold no token keep this value; a stray write shows up as a mismatch.
constexpr double kUnusedSlot = 1234.0;

enum class KVStorage { kSeparate, kCombined };
enum class Targets { kFromIndptr, kExplicit };

struct AppendCase {
  DType dtype;
  tessera::Layout layout;
  KVStorage storage;
  int64_t batch;
  int64_t page_size;
  int64_t heads;
  int64_t dim;
  Targets targets;
};

std::string case_name(const ::testing::TestParamInfo<AppendCase>& info) {
  const AppendCase& c = info.param;
  return std::string(tessera::dtype_name(c.dtype)) + "_" + tessera::layout_name(c.layout) + "_" +
         (c.storage == KVStorage::kSeparate ? "separate" : "combined") + "_b" + std::to_string(c.batch) + "_p" +
         std::to_string(c.page_size) + "_h" + std::to_string(c.heads) + "_d" + std::to_string(c.dim) +
         (c.targets == Targets::kFromIndptr ? "_indptr" : "_explicit");
}

class AppendPagedKVTest : public ::testing::TestWithParam<AppendCase> {};

TEST_P(AppendPagedKVTest, MatchesOracleCacheExactly) {
  const AppendCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> old_len_dist(0, 3 * c.page_size + 5), append_len_dist(0, 2 * c.page_size + 3);

  // Logical sequences: old tokens followed by the appended ones (some requests append nothing,
  // some start empty).
  const int64_t row = c.heads * c.dim;
  std::vector<int64_t> old_len(c.batch), append_len(c.batch), kv_len(c.batch);
  std::vector<std::vector<double>> k_seq(c.batch), v_seq(c.batch);
  for (int64_t b = 0; b < c.batch; ++b) {
    old_len[b] = old_len_dist(rng);
    append_len[b] = (b % 5 == 3) ? 0 : append_len_dist(rng);
    kv_len[b] = old_len[b] + append_len[b];
    k_seq[b] = round_to(c.dtype, random_normal(kv_len[b] * row, rng));
    v_seq[b] = round_to(c.dtype, random_normal(kv_len[b] * row, rng));
  }
  const auto ref_layout = c.layout == tessera::Layout::kNHD ? tessera_ref::Layout::NHD : tessera_ref::Layout::HND;
  const tessera_ref::PagedCache expected = tessera_ref::build_paged(
      k_seq, v_seq, kv_len, c.heads, c.dim, c.page_size, ref_layout, seed | 1, /*extra_pages=*/3,
      round_to(c.dtype, {kUnusedSlot})[0]);

  // The cache before the append: the same pages, with the appended positions poisoned.
  tessera_ref::PagedCache before = expected;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t pos = old_len[b]; pos < kv_len[b]; ++pos) {
      const int64_t page = expected.indices[expected.indptr[b] + pos / c.page_size], slot = pos % c.page_size;
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < c.dim; ++d) {
          const int64_t off = c.layout == tessera::Layout::kNHD
                                  ? ((page * c.page_size + slot) * c.heads + h) * c.dim + d
                                  : ((page * c.heads + h) * c.page_size + slot) * c.dim + d;
          before.k_pages[off] = before.v_pages[off] = -777.0;
        }
    }
  }

  // Appended rows, packed request by request.
  std::vector<int32_t> append_indptr = {0}, batch_indices, positions;
  std::vector<double> append_k, append_v;
  for (int64_t b = 0; b < c.batch; ++b) {
    append_indptr.push_back(append_indptr.back() + static_cast<int32_t>(append_len[b]));
    for (int64_t pos = old_len[b]; pos < kv_len[b]; ++pos) {
      append_k.insert(append_k.end(), k_seq[b].begin() + pos * row, k_seq[b].begin() + (pos + 1) * row);
      append_v.insert(append_v.end(), v_seq[b].begin() + pos * row, v_seq[b].begin() + (pos + 1) * row);
      batch_indices.push_back(static_cast<int32_t>(b));
      positions.push_back(static_cast<int32_t>(pos));
    }
  }
  const int64_t nnz = append_indptr.back();

  const Device gpu = Device::cuda(0);
  const int64_t num_pages = expected.num_pages, page_elems = c.page_size * row;
  const bool nhd = c.layout == tessera::Layout::kNHD;
  auto page_view = [&](void* data) {
    return nhd ? TensorView(data, c.dtype, {num_pages, c.page_size, c.heads, c.dim}, gpu)
               : TensorView(data, c.dtype, {num_pages, c.heads, c.page_size, c.dim}, gpu);
  };
  auto d_indptr = upload_i32(expected.indptr), d_indices = upload_i32(expected.indices),
       d_last = upload_i32(expected.last_page_len);
  const TensorView indptr(d_indptr.get(), DType::kI32, {c.batch + 1}, gpu);
  const TensorView indices(d_indices.get(), DType::kI32, {static_cast<int64_t>(expected.indices.size())}, gpu);
  const TensorView last(d_last.get(), DType::kI32, {c.batch}, gpu);

  DeviceBuffer d_k, d_v, d_kv;
  tessera::PagedKV cache;
  if (c.storage == KVStorage::kSeparate) {
    d_k = upload_as(c.dtype, before.k_pages);
    d_v = upload_as(c.dtype, before.v_pages);
    cache.k = page_view(d_k.get());
    cache.v = page_view(d_v.get());
    cache.layout = c.layout;
    cache.indptr = indptr;
    cache.indices = indices;
    cache.last_page_len = last;
  } else {
    std::vector<double> combined(2 * num_pages * page_elems);
    for (int64_t p = 0; p < num_pages; ++p) {
      std::copy_n(before.k_pages.begin() + p * page_elems, page_elems, combined.begin() + (2 * p) * page_elems);
      std::copy_n(before.v_pages.begin() + p * page_elems, page_elems, combined.begin() + (2 * p + 1) * page_elems);
    }
    d_kv = upload_as(c.dtype, combined);
    const TensorView kv = nhd ? TensorView(d_kv.get(), c.dtype, {num_pages, 2, c.page_size, c.heads, c.dim}, gpu)
                              : TensorView(d_kv.get(), c.dtype, {num_pages, 2, c.heads, c.page_size, c.dim}, gpu);
    cache = tessera::PagedKV::from_combined(kv, c.layout, indptr, indices, last);
  }

  auto d_ak = upload_as(c.dtype, append_k), d_av = upload_as(c.dtype, append_v);
  const TensorView ak(d_ak.get(), c.dtype, {nnz, c.heads, c.dim}, gpu), av(d_av.get(), c.dtype, {nnz, c.heads, c.dim}, gpu);
  if (c.targets == Targets::kFromIndptr) {
    auto d_aindptr = upload_i32(append_indptr);
    tessera::append_paged_kv_cache(ak, av, TensorView(d_aindptr.get(), DType::kI32, {c.batch + 1}, gpu), cache);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  } else {
    auto d_bi = upload_i32(batch_indices), d_pos = upload_i32(positions);
    tessera::append_paged_kv_cache_at(ak, av, TensorView(d_bi.get(), DType::kI32, {nnz}, gpu),
                                      TensorView(d_pos.get(), DType::kI32, {nnz}, gpu), cache);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  }

  std::vector<double> got_k, got_v;
  if (c.storage == KVStorage::kSeparate) {
    got_k = download_as(c.dtype, d_k.get(), num_pages * page_elems);
    got_v = download_as(c.dtype, d_v.get(), num_pages * page_elems);
  } else {
    const auto combined = download_as(c.dtype, d_kv.get(), 2 * num_pages * page_elems);
    for (int64_t p = 0; p < num_pages; ++p) {
      got_k.insert(got_k.end(), combined.begin() + (2 * p) * page_elems, combined.begin() + (2 * p + 1) * page_elems);
      got_v.insert(got_v.end(), combined.begin() + (2 * p + 1) * page_elems, combined.begin() + (2 * p + 2) * page_elems);
    }
  }
  // A copy: exact equality, everywhere (unused slots must still hold kUnusedSlot).
  size_t k_mismatch = 0, v_mismatch = 0;
  for (size_t i = 0; i < got_k.size(); ++i) {
    k_mismatch += got_k[i] != expected.k_pages[i];
    v_mismatch += got_v[i] != expected.v_pages[i];
  }
  EXPECT_EQ(k_mismatch, 0u) << "K elements differing from the oracle cache";
  EXPECT_EQ(v_mismatch, 0u) << "V elements differing from the oracle cache";
}

std::vector<AppendCase> append_cases() {
  std::vector<AppendCase> cases;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (auto layout : {tessera::Layout::kNHD, tessera::Layout::kHND})
      for (int64_t page_size : {1, 3, 16, 64})
        for (int64_t batch : {1, 7, 64}) {
          const auto storage = (page_size + batch) % 2 ? KVStorage::kCombined : KVStorage::kSeparate;
          const auto targets = batch == 7 ? Targets::kExplicit : Targets::kFromIndptr;
          const int64_t heads = batch == 1 ? 1 : 8;
          const int64_t dim = page_size == 3 ? 64 : 128;
          cases.push_back({dtype, layout, storage, batch, page_size, heads, dim, targets});
        }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, AppendPagedKVTest, ::testing::ValuesIn(append_cases()), case_name);

TEST(AppendPagedKVErrors, BadArgumentsAreNamed) {
  const Device gpu = Device::cuda(0);
  DeviceBuffer buf(1 << 22);
  auto* base = static_cast<char*>(buf.get());
  auto d_indptr = upload_i32({0, 2}), d_indices = upload_i32({0, 9}), d_last = upload_i32({5});
  auto d_aindptr = upload_i32({0, 4});
  tessera::PagedKV cache;
  cache.k = TensorView(base, DType::kBF16, {4, 16, 2, 64}, gpu);
  cache.v = TensorView(base + (1 << 20), DType::kBF16, {4, 16, 2, 64}, gpu);
  cache.indptr = TensorView(d_indptr.get(), DType::kI32, {2}, gpu);
  cache.indices = TensorView(d_indices.get(), DType::kI32, {2}, gpu);
  cache.last_page_len = TensorView(d_last.get(), DType::kI32, {1}, gpu);
  const TensorView ak(base + (2 << 20), DType::kBF16, {4, 2, 64}, gpu);
  const TensorView aindptr(d_aindptr.get(), DType::kI32, {2}, gpu);

  expect_error([&] { tessera::append_paged_kv_cache(TensorView(base, DType::kF16, {4, 2, 64}, gpu), ak, aindptr, cache); },
               "append_k.dtype = f16");
  expect_error([&] { tessera::append_paged_kv_cache(ak, TensorView(base, DType::kBF16, {4, 3, 64}, gpu), aindptr, cache); },
               "append_v.shape[1] = 3");
  // Page 9 of 4, found only by checked mode for device arrays.
  tessera::set_checked_mode(true);
  expect_error([&] { tessera::append_paged_kv_cache(ak, ak, aindptr, cache); }, "cache.indices[1] = 9");
  tessera::set_checked_mode(false);
  // Unchecked: the kernel skips rows whose page is out of range instead of writing out of bounds.
  tessera::append_paged_kv_cache(ak, ak, aindptr, cache);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
