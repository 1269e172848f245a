// Helpers shared by GPU tests: device buffers, host-side conversion of f16/bf16, poisoning.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tessera/error.h"
#include "tessera/tensor.h"

namespace tessera {
/// Readable test parameter names ("bf16" rather than "4-byte object <01-00 00-00>").
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace tessera

namespace tessera_test {

#define ASSERT_CUDA_OK(expr)                                                      \
  do {                                                                            \
    cudaError_t err_ = (expr);                                                    \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);    \
  } while (0)

/// Owns device memory; filled and read back through host vectors.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  /// Fills every byte with 0xFF: NaN for f16, bf16 and f32, -1 for integers, so an element a
  /// kernel forgot to write cannot pass a comparison.
  void poison();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A device tensor of `dtype` holding `values` converted (rounded to nearest) from double; fp8
/// dtypes (e4m3, e5m2) through tests/reference/fp8.h, saturating.
DeviceBuffer upload_as(tessera::DType dtype, const std::vector<double>& values);
/// Reads `count` elements of `dtype` from device memory and widens them to double.
std::vector<double> download_as(tessera::DType dtype, const void* device_ptr, size_t count);
/// Host rounding of doubles to `dtype` and back (what the kernel actually sees as input).
std::vector<double> round_to(tessera::DType dtype, const std::vector<double>& values);
DeviceBuffer upload_i32(const std::vector<int32_t>& values);

/// Normal(0, 1) values from a fresh seed (tests print the seed on failure).
std::vector<double> random_normal(size_t count, std::mt19937_64& rng, double stddev = 1.0);
/// A seed that differs per run unless TESSERA_TEST_SEED is set.
uint64_t test_seed();

/// Runs `f` and expects a tessera::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

/// Tolerances of docs/design.md §8 for outputs stored in `dtype`.
double rel_tolerance(tessera::DType dtype);

}  // namespace tessera_test
