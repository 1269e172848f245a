#include "gpu/gpu_test_utils.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "reference/fp8.h"

namespace tessera_test {
namespace {

void cuda_or_throw(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

/// fp8 dtypes go through the reference codec (tests/reference/fp8.h), never CUDA's conversions.
tessera_ref::Fp8Format fp8_format(tessera::DType dtype) {
  return dtype == tessera::DType::kE4M3 ? tessera_ref::Fp8Format::kE4M3 : tessera_ref::Fp8Format::kE5M2;
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) cuda_or_throw(cudaMalloc(&ptr_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) throw std::runtime_error("upload larger than buffer");
  if (bytes > 0) cuda_or_throw(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "upload");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) throw std::runtime_error("download larger than buffer");
  if (bytes > 0) cuda_or_throw(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "download");
}

void DeviceBuffer::poison() {
  if (bytes_ > 0) cuda_or_throw(cudaMemset(ptr_, 0xFF, bytes_), "poison");
}

std::vector<double> round_to(tessera::DType dtype, const std::vector<double>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    switch (dtype) {
      case tessera::DType::kF16: out[i] = __half2float(__float2half_rn(f)); break;
      case tessera::DType::kBF16: out[i] = __bfloat162float(__float2bfloat16_rn(f)); break;
      case tessera::DType::kF32: out[i] = f; break;
      case tessera::DType::kE4M3:
      case tessera::DType::kE5M2: out[i] = tessera_ref::fp8_decode(tessera_ref::fp8_encode(values[i], fp8_format(dtype)), fp8_format(dtype)); break;
      default: throw std::runtime_error("round_to: unsupported dtype");
    }
  }
  return out;
}

DeviceBuffer upload_as(tessera::DType dtype, const std::vector<double>& values) {
  const size_t n = values.size();
  DeviceBuffer buf(n * tessera::dtype_size(dtype));
  switch (dtype) {
    case tessera::DType::kF16: {
      std::vector<__half> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = __float2half_rn(static_cast<float>(values[i]));
      buf.upload(h.data(), n * sizeof(__half));
      break;
    }
    case tessera::DType::kBF16: {
      std::vector<__nv_bfloat16> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = __float2bfloat16_rn(static_cast<float>(values[i]));
      buf.upload(h.data(), n * sizeof(__nv_bfloat16));
      break;
    }
    case tessera::DType::kF32: {
      std::vector<float> h(values.begin(), values.end());
      buf.upload(h.data(), n * sizeof(float));
      break;
    }
    case tessera::DType::kE4M3:
    case tessera::DType::kE5M2: {
      std::vector<uint8_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = tessera_ref::fp8_encode(values[i], fp8_format(dtype));
      buf.upload(h.data(), n);
      break;
    }
    default: throw std::runtime_error("upload_as: unsupported dtype");
  }
  return buf;
}

std::vector<double> download_as(tessera::DType dtype, const void* device_ptr, size_t count) {
  std::vector<double> out(count);
  const size_t bytes = count * tessera::dtype_size(dtype);
  std::vector<unsigned char> raw(bytes);
  if (bytes > 0) cuda_or_throw(cudaMemcpy(raw.data(), device_ptr, bytes, cudaMemcpyDeviceToHost), "download_as");
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case tessera::DType::kF16: { __half h; std::memcpy(&h, &raw[i * 2], 2); out[i] = __half2float(h); break; }
      case tessera::DType::kBF16: { __nv_bfloat16 h; std::memcpy(&h, &raw[i * 2], 2); out[i] = __bfloat162float(h); break; }
      case tessera::DType::kF32: { float f; std::memcpy(&f, &raw[i * 4], 4); out[i] = f; break; }
      case tessera::DType::kI32: { int32_t v; std::memcpy(&v, &raw[i * 4], 4); out[i] = v; break; }
      case tessera::DType::kE4M3:
      case tessera::DType::kE5M2: out[i] = tessera_ref::fp8_decode(raw[i], fp8_format(dtype)); break;
      default: throw std::runtime_error("download_as: unsupported dtype");
    }
  }
  return out;
}

DeviceBuffer upload_i32(const std::vector<int32_t>& values) {
  DeviceBuffer buf(values.size() * sizeof(int32_t));
  buf.upload(values.data(), values.size() * sizeof(int32_t));
  return buf;
}

std::vector<double> random_normal(size_t count, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> v(count);
  for (auto& x : v) x = dist(rng);
  return v;
}

uint64_t test_seed() {
  if (const char* s = std::getenv("TESSERA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
}

double rel_tolerance(tessera::DType dtype) {
  switch (dtype) {
    case tessera::DType::kBF16: return 1e-2;
    case tessera::DType::kF16: return 4e-3;
    default: return 1e-5;
  }
}

}  // namespace tessera_test
