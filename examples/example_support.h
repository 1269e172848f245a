// What the C++ examples share: the one line they print on a machine that cannot run them, bf16
// transfers between the device and fp64 host vectors, and the comparison of attention outputs
// with the fp64 oracle (tests/reference) under the bf16 tolerances of the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"
#include "reference/oracle.h"

namespace tessera_examples {

/// Whether this machine has a CUDA device to run on. When it has none (no GPU, or no usable
/// driver), prints ONE line saying so, naming `program` and the reason, and returns false; the
/// caller then exits 0. The line carries the marker TESSERA-GPU-SKIP, which CTest turns into
/// "skipped" (SKIP_REGULAR_EXPRESSION), as for the GPU tests.
bool gpu_available(const char* program);

/// Prints "<program>: Tessera <version> on <GPU> (<SMs> SMs)" and returns what it printed for
/// the benchmark harness (device 0).
tessera_bench::RunInfo announce(const char* program);

/// bf16 bits as the device stores them; host copies stay in this form until the oracle needs
/// doubles (a quarter of the memory).
using Bf16Bits = uint16_t;

/// Copies `count` bf16 elements from device memory (synchronous).
std::vector<Bf16Bits> download_bf16_bits(const void* device, size_t count);
/// `count` bf16 elements as doubles (exact).
std::vector<double> bf16_bits_to_double(const Bf16Bits* bits, size_t count);
/// Copies `count` f32 elements from device memory and widens them (synchronous).
std::vector<double> download_f32(const void* device, size_t count);

/// Outputs of a kernel next to the oracle's for the same rows, accumulated over several calls
/// (e.g. the sampled rows of every request of one layer) and compared at once.
class OracleComparison {
 public:
  /// o: [rows, Hq, D] from the kernel; lse_log2: [rows, Hq] base-2 from the kernel (empty: not
  /// compared); ref: the oracle's State of the same rows (natural-log LSE, as the oracle gives it).
  void add(const std::vector<double>& o, const std::vector<double>& lse_log2, const tessera_ref::State& ref);
  size_t rows() const { return rows_; }
  /// ||o - ref|| / ||ref|| over everything added.
  double rel_error() const;
  double max_abs_error() const;
  /// Largest |lse - ref| in base 2 over the added LSEs (0 when none were compared).
  double lse_max_abs_error() const;
  /// Within the bf16 tolerances of the GPU tests: relative error <= 1e-2, base-2 LSE <= 8e-3.
  bool ok() const;
  /// "rel err 2.9e-03 (max abs 1.1e-02), lse err 1.2e-03 -> OK"
  std::string summary() const;

 private:
  std::vector<double> o_, ref_o_, lse_, ref_lse_;
  size_t rows_ = 0;
};

}  // namespace tessera_examples
