#include "example_support.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "tessera/version.h"

namespace tessera_examples {

namespace {

// The bf16 tolerances of the GPU tests (tests/gpu: rel_tolerance, lse_tolerance), from the
// accuracy targets of docs/design.md.
constexpr double kRelTolerance = 1e-2;
constexpr double kLseTolerance = 8e-3;

}  // namespace

bool gpu_available(const char* program) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return true;
  const char* reason = "no CUDA GPU on this machine";
  if (err == cudaErrorInsufficientDriver) {
    reason = "no NVIDIA driver, or one older than this CUDA runtime";
  } else if (err != cudaSuccess && err != cudaErrorNoDevice) {
    reason = cudaGetErrorString(err);
  }
  std::printf("%s: %s (cudaGetDeviceCount: %s); it needs an NVIDIA GPU (sm_80 or newer) and ran nothing "
              "[TESSERA-GPU-SKIP]\n",
              program, reason, err == cudaSuccess ? "0 devices" : cudaGetErrorName(err));
  return false;
}

tessera_bench::RunInfo announce(const char* program) {
  tessera_bench::RunInfo info = tessera_bench::make_run_info(0);
  std::printf("%s: Tessera %s on %s (%d SMs)\n", program, tessera::version_string(), info.gpu.c_str(), info.sm_count);
  return info;
}

std::vector<Bf16Bits> download_bf16_bits(const void* device, size_t count) {
  std::vector<Bf16Bits> bits(count);
  BENCH_CUDA(cudaMemcpy(bits.data(), device, count * sizeof(Bf16Bits), cudaMemcpyDeviceToHost));
  return bits;
}

std::vector<double> bf16_bits_to_double(const Bf16Bits* bits, size_t count) {
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) {
    // A bf16 is the upper half of an f32.
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    float f;
    std::memcpy(&f, &word, sizeof f);
    out[i] = f;
  }
  return out;
}

std::vector<double> download_f32(const void* device, size_t count) {
  std::vector<float> host(count);
  BENCH_CUDA(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
  return std::vector<double>(host.begin(), host.end());
}

void OracleComparison::add(const std::vector<double>& o, const std::vector<double>& lse_log2,
                           const tessera_ref::State& ref) {
  if (o.size() != ref.o.size() || (!lse_log2.empty() && lse_log2.size() != ref.lse.size())) {
    throw std::invalid_argument("OracleComparison::add: " + std::to_string(o.size()) + " outputs and " +
                                std::to_string(lse_log2.size()) + " LSEs, expected " + std::to_string(ref.o.size()) +
                                " and " + std::to_string(ref.lse.size()) + " (the oracle's rows)");
  }
  o_.insert(o_.end(), o.begin(), o.end());
  ref_o_.insert(ref_o_.end(), ref.o.begin(), ref.o.end());
  if (!lse_log2.empty()) {
    const std::vector<double> ref_lse = tessera_ref::lse_natural_to_log2(ref.lse);
    lse_.insert(lse_.end(), lse_log2.begin(), lse_log2.end());
    ref_lse_.insert(ref_lse_.end(), ref_lse.begin(), ref_lse.end());
  }
  rows_ += static_cast<size_t>(ref.rows);
}

double OracleComparison::rel_error() const { return tessera_ref::rel_error(o_, ref_o_); }

double OracleComparison::max_abs_error() const { return tessera_ref::max_abs_error(o_, ref_o_); }

double OracleComparison::lse_max_abs_error() const { return tessera_ref::max_abs_error(lse_, ref_lse_); }

bool OracleComparison::ok() const {
  // NaN compares false: an unwritten (poisoned) output fails.
  return rows_ > 0 && rel_error() <= kRelTolerance && lse_max_abs_error() <= kLseTolerance;
}

std::string OracleComparison::summary() const {
  char line[160];
  std::snprintf(line, sizeof line, "rel err %.1e (max abs %.1e), base-2 lse err %.1e -> %s", rel_error(),
                max_abs_error(), lse_max_abs_error(), ok() ? "OK" : "WRONG");
  return line;
}

}  // namespace tessera_examples
