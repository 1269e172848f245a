// GPU tests of append_paged_kv_cache: the cache after the append must equal, bit for bit, the
// oracle's paged cache built from the whole logical sequences, and no other slot may change. fp8
// caches: every stored byte must equal a host quantizer written from the formats' definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_utils.h"
#include "reference/fp8.h"
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

// ------------------------------------------------------------------------------------------------
// fp8 caches: f16/bf16 rows stored as x / scale, rounded to nearest even and saturated.

bool is_fp8_nan(uint8_t byte, DType t) {
  const int magnitude = byte & 0x7F;
  return t == DType::kE4M3 ? magnitude == 0x7F : magnitude > 0x7C;
}

/// The byte storing x in fp8 `t`: the reference codec of tests/reference/fp8.h (written from the
/// formats' definitions, independent of cuda_fp8.h and of the kernel's conversion instruction;
/// its hand-worked encodings are checked in tests/cpu/reference/fp8_test.cpp).
uint8_t quantize_fp8_reference(float x, DType t) {
  return tessera_ref::fp8_encode(x, t == DType::kE4M3 ? tessera_ref::Fp8Format::kE4M3 : tessera_ref::Fp8Format::kE5M2);
}

enum class ScaleKind { kHost, kDevicePerTensor, kDevicePerHead };

const char* scale_kind_name(ScaleKind s) {
  switch (s) {
    case ScaleKind::kHost: return "host";
    case ScaleKind::kDevicePerTensor: return "device_tensor";
    case ScaleKind::kDevicePerHead: return "device_head";
  }
  return "?";
}

struct Fp8AppendCase {
  DType rows;   // f16 or bf16
  DType cache;  // e4m3 or e5m2
  tessera::Layout layout;
  int64_t page_size;
  ScaleKind scales;
  KVStorage storage;
  Targets targets;
};

std::string fp8_case_name(const ::testing::TestParamInfo<Fp8AppendCase>& info) {
  const Fp8AppendCase& c = info.param;
  return std::string(tessera::dtype_name(c.rows)) + "_to_" + tessera::dtype_name(c.cache) + "_" +
         tessera::layout_name(c.layout) + "_p" + std::to_string(c.page_size) + "_" + scale_kind_name(c.scales) +
         (c.storage == KVStorage::kSeparate ? "_separate" : "_combined") +
         (c.targets == Targets::kFromIndptr ? "_indptr" : "_explicit");
}

class AppendPagedKVFp8Test : public ::testing::TestWithParam<Fp8AppendCase> {};

TEST_P(AppendPagedKVFp8Test, StoresTheReferenceQuantizationByteForByte) {
  const Fp8AppendCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int64_t kBatch = 7;
  constexpr int64_t kHeads = 4;
  const int64_t dim = c.page_size == 1 ? 64 : 128;
  const int64_t row = kHeads * dim;
  const bool nhd = c.layout == tessera::Layout::kNHD;

  // Request b holds old_len[b] tokens and appends append_len[b] (some none, some start empty); the
  // oracle only lays out the page table, whose pages are shuffled among 3 unused ones.
  std::uniform_int_distribution<int64_t> old_len_dist(0, 3 * c.page_size + 5), append_len_dist(0, 2 * c.page_size + 3);
  std::vector<int64_t> old_len(kBatch), append_len(kBatch), kv_len(kBatch);
  std::vector<std::vector<double>> zeros(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    old_len[b] = old_len_dist(rng);
    append_len[b] = (b % 5 == 3) ? 0 : append_len_dist(rng);
    kv_len[b] = old_len[b] + append_len[b];
    zeros[b].assign(kv_len[b] * row, 0.0);
  }
  const tessera_ref::PagedCache table =
      tessera_ref::build_paged(zeros, zeros, kv_len, kHeads, dim, c.page_size,
                               nhd ? tessera_ref::Layout::NHD : tessera_ref::Layout::HND, seed | 1, /*extra_pages=*/3);
  std::vector<int32_t> append_indptr = {0}, batch_indices, positions;
  for (int64_t b = 0; b < kBatch; ++b) {
    append_indptr.push_back(append_indptr.back() + static_cast<int32_t>(append_len[b]));
    for (int64_t pos = old_len[b]; pos < kv_len[b]; ++pos) {
      batch_indices.push_back(static_cast<int32_t>(b));
      positions.push_back(static_cast<int32_t>(pos));
    }
  }
  const int64_t nnz = append_indptr.back();

  // Normal values times 2^-24 .. 2^12: x / scale spans the fp8 subnormals, the normals and, for
  // the largest, beyond the largest finite value (saturated); both signs; a few infinities and NaNs.
  auto random_rows = [&] {
    std::uniform_int_distribution<int> exponent(-24, 12);
    std::vector<double> x = random_normal(static_cast<size_t>(nnz * row), rng);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::ldexp(x[i], exponent(rng));
      if (i % 101 == 7) x[i] = std::numeric_limits<double>::infinity();
      if (i % 101 == 29) x[i] = -std::numeric_limits<double>::infinity();
      if (i % 101 == 53) x[i] = std::numeric_limits<double>::quiet_NaN();
    }
    return round_to(c.rows, x);  // what the kernel reads
  };
  const std::vector<double> append_k = random_rows(), append_v = random_rows();

  // Scales: non-powers of two, so that the reciprocal and the product round; device cases with a
  // host factor other than 1, as the kernel multiplies the two.
  const Device gpu = Device::cuda(0);
  tessera::KVScales scales;
  std::vector<double> k_device, v_device;  // f32 values; empty: no device tensor
  switch (c.scales) {
    case ScaleKind::kHost:
      scales.k = 0.0173;
      scales.v = 0.0291;
      break;
    case ScaleKind::kDevicePerTensor:
      scales.k = 1.5;
      scales.v = 0.75;
      k_device = {0.0117f};
      v_device = {0.043f};
      break;
    case ScaleKind::kDevicePerHead:
      scales.v = 2.0;
      for (int64_t h = 0; h < kHeads; ++h) {
        k_device.push_back(static_cast<float>(0.005 * (1.0 + 0.7 * h)));
        v_device.push_back(static_cast<float>(0.0031 * (1.0 + 1.3 * h)));
      }
      break;
  }
  DeviceBuffer d_k_scale, d_v_scale;
  if (!k_device.empty()) {
    d_k_scale = upload_as(DType::kF32, k_device);
    d_v_scale = upload_as(DType::kF32, v_device);
    scales.k_device = TensorView(d_k_scale.get(), DType::kF32, {static_cast<int64_t>(k_device.size())}, gpu);
    scales.v_device = TensorView(d_v_scale.get(), DType::kF32, {static_cast<int64_t>(v_device.size())}, gpu);
  }
  // Head h's scale as the kernel forms it: f32 host factor times the device value, in f32.
  auto scale_of = [](double host, const std::vector<double>& device, int64_t h) {
    const float factor = static_cast<float>(host);
    if (device.empty()) return factor;
    return factor * static_cast<float>(device[device.size() == 1 ? 0 : h]);
  };

  // Expected bytes: the poison everywhere but at the appended positions.
  constexpr uint8_t kPoison = 0xFF;  // DeviceBuffer::poison(); NaN in both formats
  const int64_t num_pages = table.num_pages, page_elems = c.page_size * row;
  std::vector<uint8_t> expected_k(num_pages * page_elems, kPoison), expected_v(num_pages * page_elems, kPoison);
  const double max_finite = tessera_ref::fp8_max(c.cache == DType::kE4M3 ? tessera_ref::Fp8Format::kE4M3 : tessera_ref::Fp8Format::kE5M2);
  size_t saturated = 0;  // finite inputs beyond the largest finite value after scaling
  int64_t i = 0;         // appended row
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t pos = old_len[b]; pos < kv_len[b]; ++pos, ++i) {
      const int64_t page = table.indices[table.indptr[b] + pos / c.page_size], slot = pos % c.page_size;
      for (int64_t h = 0; h < kHeads; ++h) {
        const float k_inv = 1.0f / scale_of(scales.k, k_device, h);
        const float v_inv = 1.0f / scale_of(scales.v, v_device, h);
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t off = nhd ? ((page * c.page_size + slot) * kHeads + h) * dim + d
                                  : ((page * kHeads + h) * c.page_size + slot) * dim + d;
          const size_t src = static_cast<size_t>((i * kHeads + h) * dim + d);
          const float k = static_cast<float>(append_k[src]) * k_inv;
          const float v = static_cast<float>(append_v[src]) * v_inv;
          expected_k[off] = quantize_fp8_reference(k, c.cache);
          expected_v[off] = quantize_fp8_reference(v, c.cache);
          saturated += (std::isfinite(k) && std::fabs(k) > max_finite) + (std::isfinite(v) && std::fabs(v) > max_finite);
        }
      }
    }
  }
  EXPECT_GT(saturated, 0u) << "no appended value needed saturation: the test does not cover it";

  auto d_indptr = upload_i32(table.indptr), d_indices = upload_i32(table.indices), d_last = upload_i32(table.last_page_len);
  const TensorView indptr(d_indptr.get(), DType::kI32, {kBatch + 1}, gpu);
  const TensorView indices(d_indices.get(), DType::kI32, {static_cast<int64_t>(table.indices.size())}, gpu);
  const TensorView last(d_last.get(), DType::kI32, {kBatch}, gpu);
  const size_t cache_bytes = static_cast<size_t>(num_pages * page_elems);  // one byte per element
  DeviceBuffer d_k, d_v, d_kv;
  tessera::PagedKV cache;
  if (c.storage == KVStorage::kSeparate) {
    d_k = DeviceBuffer(cache_bytes);
    d_v = DeviceBuffer(cache_bytes);
    d_k.poison();
    d_v.poison();
    auto page_view = [&](void* data) {
      return nhd ? TensorView(data, c.cache, {num_pages, c.page_size, kHeads, dim}, gpu)
                 : TensorView(data, c.cache, {num_pages, kHeads, c.page_size, dim}, gpu);
    };
    cache.k = page_view(d_k.get());
    cache.v = page_view(d_v.get());
    cache.layout = c.layout;
    cache.indptr = indptr;
    cache.indices = indices;
    cache.last_page_len = last;
  } else {
    d_kv = DeviceBuffer(2 * cache_bytes);
    d_kv.poison();
    const TensorView kv = nhd ? TensorView(d_kv.get(), c.cache, {num_pages, 2, c.page_size, kHeads, dim}, gpu)
                              : TensorView(d_kv.get(), c.cache, {num_pages, 2, kHeads, c.page_size, dim}, gpu);
    cache = tessera::PagedKV::from_combined(kv, c.layout, indptr, indices, last);
  }

  auto d_ak = upload_as(c.rows, append_k), d_av = upload_as(c.rows, append_v);
  const TensorView ak(d_ak.get(), c.rows, {nnz, kHeads, dim}, gpu), av(d_av.get(), c.rows, {nnz, kHeads, dim}, gpu);
  if (c.targets == Targets::kFromIndptr) {
    auto d_aindptr = upload_i32(append_indptr);
    tessera::append_paged_kv_cache(ak, av, TensorView(d_aindptr.get(), DType::kI32, {kBatch + 1}, gpu), cache,
                                   nullptr, scales);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  } else {
    auto d_bi = upload_i32(batch_indices), d_pos = upload_i32(positions);
    tessera::append_paged_kv_cache_at(ak, av, TensorView(d_bi.get(), DType::kI32, {nnz}, gpu),
                                      TensorView(d_pos.get(), DType::kI32, {nnz}, gpu), cache, nullptr, scales);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
  }

  std::vector<uint8_t> got_k(cache_bytes), got_v(cache_bytes);
  if (c.storage == KVStorage::kSeparate) {
    d_k.download(got_k.data(), cache_bytes);
    d_v.download(got_v.data(), cache_bytes);
  } else {
    std::vector<uint8_t> combined(2 * cache_bytes);
    d_kv.download(combined.data(), combined.size());
    for (int64_t p = 0; p < num_pages; ++p) {
      std::copy_n(combined.begin() + (2 * p) * page_elems, page_elems, got_k.begin() + p * page_elems);
      std::copy_n(combined.begin() + (2 * p + 1) * page_elems, page_elems, got_v.begin() + p * page_elems);
    }
  }
  // Every byte: untouched slots still hold the poison, appended ones the reference's byte. A NaN
  // input may come out as any NaN encoding; a write missed there would still show, as the other
  // 15 elements of its 16-byte vector are finite.
  auto compare = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& expected, const char* what) {
    size_t mismatches = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      const bool nan_expected = expected[j] != kPoison && is_fp8_nan(expected[j], c.cache);
      const bool ok = nan_expected ? is_fp8_nan(got[j], c.cache) : got[j] == expected[j];
      if (!ok && mismatches++ < 5) {
        ADD_FAILURE() << what << " byte " << j << ": got 0x" << std::hex << int{got[j]} << ", expected 0x"
                      << int{expected[j]} << std::dec;
      }
    }
    EXPECT_EQ(mismatches, 0u) << what << " bytes differing from the reference";
  };
  compare(got_k, expected_k, "K");
  compare(got_v, expected_v, "V");
}

std::vector<Fp8AppendCase> fp8_append_cases() {
  std::vector<Fp8AppendCase> cases;
  int n = 0;
  for (DType rows : {DType::kF16, DType::kBF16})
    for (DType cache : {DType::kE4M3, DType::kE5M2})
      for (auto layout : {tessera::Layout::kNHD, tessera::Layout::kHND})
        for (int64_t page_size : {1, 16})
          for (ScaleKind scales : {ScaleKind::kHost, ScaleKind::kDevicePerTensor, ScaleKind::kDevicePerHead}) {
            // Storage and targets alternate, each paired with every other parameter somewhere.
            const auto storage = n % 2 ? KVStorage::kCombined : KVStorage::kSeparate;
            const auto targets = (n / 2) % 2 ? Targets::kExplicit : Targets::kFromIndptr;
            cases.push_back({rows, cache, layout, page_size, scales, storage, targets});
            ++n;
          }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, AppendPagedKVFp8Test, ::testing::ValuesIn(fp8_append_cases()), fp8_case_name);

// Device scales are read when the kernel runs: a captured append replays with the value the scale
// tensor holds at replay time.
TEST(AppendPagedKVFp8, GraphReplayReadsTheDeviceScale) {
  const Device gpu = Device::cuda(0);
  constexpr int64_t kRows = 16, kHeads = 2, kDim = 64;
  auto d_indptr = upload_i32({0, 1}), d_indices = upload_i32({0}), d_last = upload_i32({kRows});
  auto d_aindptr = upload_i32({0, kRows});
  DeviceBuffer d_k(kRows * kHeads * kDim), d_v(kRows * kHeads * kDim);
  d_k.poison();
  d_v.poison();
  tessera::PagedKV cache;
  cache.k = TensorView(d_k.get(), DType::kE4M3, {1, kRows, kHeads, kDim}, gpu);
  cache.v = TensorView(d_v.get(), DType::kE4M3, {1, kRows, kHeads, kDim}, gpu);
  cache.indptr = TensorView(d_indptr.get(), DType::kI32, {2}, gpu);
  cache.indices = TensorView(d_indices.get(), DType::kI32, {1}, gpu);
  cache.last_page_len = TensorView(d_last.get(), DType::kI32, {1}, gpu);
  auto d_rows = upload_as(DType::kBF16, std::vector<double>(kRows * kHeads * kDim, 3.0));
  const TensorView rows(d_rows.get(), DType::kBF16, {kRows, kHeads, kDim}, gpu);
  auto d_scale = upload_as(DType::kF32, {0.5});
  tessera::KVScales scales;
  scales.k_device = TensorView(d_scale.get(), DType::kF32, {1}, gpu);
  scales.v = 0.25;  // host only: V = 3 / 0.25 = 12 at every replay

  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  tessera::append_paged_kv_cache(rows, rows, TensorView(d_aindptr.get(), DType::kI32, {2}, gpu), cache, stream, scales);
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA_OK(cudaGraphDestroy(graph));

  auto expect_all = [&](const DeviceBuffer& buf, uint8_t want, const char* what) {
    std::vector<uint8_t> got(buf.bytes());
    buf.download(got.data(), got.size());
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<long>(got.size()))
        << what << ": expected every byte 0x" << std::hex << int{want};
  };
  // K: 3 / 0.5 = 6 = 1.5 * 2^2, 0.1001.100; V: 3 / 0.25 = 12 = 1.5 * 2^3, 0.1010.100.
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  expect_all(d_k, 0x4C, "K, scale 0.5");
  expect_all(d_v, 0x54, "V, scale 0.25");
  const float new_scale = 0.01f;
  ASSERT_CUDA_OK(cudaMemcpy(d_scale.get(), &new_scale, sizeof(new_scale), cudaMemcpyHostToDevice));
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  // About 300: 288 = 1.125 * 2^8 (0.1111.001), V unchanged.
  expect_all(d_k, quantize_fp8_reference(3.0f * (1.0f / new_scale), DType::kE4M3), "K, scale 0.01 at replay");
  expect_all(d_v, 0x54, "V, scale 0.25 at replay");
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(AppendPagedKVFp8Errors, BadScalesAndDtypesAreNamed) {
  const Device gpu = Device::cuda(0);
  DeviceBuffer buf(1 << 22);
  auto* base = static_cast<char*>(buf.get());
  auto d_indptr = upload_i32({0, 2}), d_indices = upload_i32({0, 1}), d_last = upload_i32({5});
  auto d_aindptr = upload_i32({0, 4});
  const TensorView aindptr(d_aindptr.get(), DType::kI32, {2}, gpu);
  auto paged = [&](DType k_dtype, DType v_dtype, int64_t dim) {
    tessera::PagedKV cache;
    cache.k = TensorView(base, k_dtype, {4, 16, 2, dim}, gpu);
    cache.v = TensorView(base + (1 << 20), v_dtype, {4, 16, 2, dim}, gpu);
    cache.indptr = TensorView(d_indptr.get(), DType::kI32, {2}, gpu);
    cache.indices = TensorView(d_indices.get(), DType::kI32, {2}, gpu);
    cache.last_page_len = TensorView(d_last.get(), DType::kI32, {1}, gpu);
    return cache;
  };
  const tessera::PagedKV e4m3 = paged(DType::kE4M3, DType::kE4M3, 64);
  auto rows = [&](DType dtype, int64_t dim = 64) { return TensorView(base + (2 << 20), dtype, {4, 2, dim}, gpu); };
  const TensorView bf16_rows = rows(DType::kBF16);
  auto append = [&](const TensorView& k, const TensorView& v, const tessera::PagedKV& cache,
                    const tessera::KVScales& scales) {
    tessera::append_paged_kv_cache(k, v, aindptr, cache, nullptr, scales);
  };
  auto with = [](double k, double v) {
    tessera::KVScales s;
    s.k = k;
    s.v = v;
    return s;
  };
  const double inf = std::numeric_limits<double>::infinity();

  // Host scales: finite and > 0.
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, with(0.0, 1.0)); }, "scales.k = 0");
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, with(1.0, -2.0)); }, "scales.v = -2");
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, with(std::nan(""), 1.0)); }, "scales.k = nan");
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, with(1.0, inf)); }, "scales.v = inf");
  // Device scales: f32 with 1 or num_kv_heads (2) elements.
  tessera::KVScales three;
  three.k_device = TensorView(base + (3 << 20), DType::kF32, {3}, gpu);
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, three); }, "scales.k_device has 3 elements");
  tessera::KVScales f16_scale;
  f16_scale.v_device = TensorView(base + (3 << 20), DType::kF16, {2}, gpu);
  expect_error([&] { append(bf16_rows, bf16_rows, e4m3, f16_scale); }, "scales.v_device.dtype = f16");
  // Rows: f16 or bf16 into fp8, K and V alike.
  expect_error([&] { append(rows(DType::kF32), rows(DType::kF32), e4m3, {}); }, "append_k.dtype = f32, expected f16 or bf16");
  expect_error([&] { append(rows(DType::kE4M3), rows(DType::kE4M3), e4m3, {}); }, "append_k.dtype = e4m3");
  expect_error([&] { append(rows(DType::kF16), bf16_rows, e4m3, {}); }, "append_v.dtype = bf16, expected f16");
  // The cache: K and V of one dtype; an fp8 head dim fills whole 16-byte vectors.
  expect_error([&] { append(bf16_rows, bf16_rows, paged(DType::kE4M3, DType::kE5M2, 64), {}); },
               "cache.v.dtype = e5m2, expected e4m3");
  expect_error([&] { append(rows(DType::kBF16, 8), rows(DType::kBF16, 8), paged(DType::kE5M2, DType::kE5M2, 8), {}); },
               "cache.k.shape[3] = 8, expected a multiple of 16");
  // Scales belong to fp8 caches only.
  const tessera::PagedKV bf16_cache = paged(DType::kBF16, DType::kBF16, 64);
  expect_error([&] { append(bf16_rows, bf16_rows, bf16_cache, with(2.0, 1.0)); }, "scales apply to fp8");
  const TensorView per_row(d_indices.get(), DType::kI32, {4}, gpu);
  expect_error([&] { tessera::append_paged_kv_cache_at(bf16_rows, bf16_rows, per_row, per_row, e4m3, nullptr, with(0.0, 1.0)); },
               "scales.k = 0");
}

}  // namespace
