// tessera-bench harness (docs/design.md §9): checked CUDA calls, device memory, timing, the workload
// registry and the output sink.
//
// Adding a workload: write `void my_bench(BenchContext& ctx)` in a bench/*.cpp file that is listed
// in bench/CMakeLists.txt, allocate inputs with ctx.random_tensor() / ctx.upload(), time the call
// with ctx.measure(), report with ctx.report_gbps() or ctx.report_tflops(), and register it:
//
//   TESSERA_BENCH_WORKLOAD(my_bench, "my_workload", "one-line description", "decode", "quick");
//
// The trailing arguments are the suites the workload belongs to; the first is its own suite (the
// "suite" of its results). The ceilings always run first, so reports can name them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "tessera/dtype.h"
#include "tessera/tensor.h"

namespace tessera_bench {

// ------------------------------------------------------------------------------------------------
// Errors. A failed CUDA or cuBLAS call throws FatalError naming the call and where it was made;
// main() prints it and exits non-zero (RAII owners free their memory on the way out).

class FatalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t err, const char* what, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* what, const char* file, int line);

#define BENCH_CUDA(expr) ::tessera_bench::check_cuda((expr), #expr, __FILE__, __LINE__)
#define BENCH_CUBLAS(expr) ::tessera_bench::check_cublas((expr), #expr, __FILE__, __LINE__)

// ------------------------------------------------------------------------------------------------
// Device memory.

/// Owns one cudaMalloc allocation; frees it on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void reset();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A device tensor: its memory plus a contiguous TensorView of it.
struct DeviceTensor {
  DeviceBuffer buffer;
  tessera::TensorView view;
  int64_t nbytes() const { return static_cast<int64_t>(buffer.bytes()); }
};

/// Fills `count` elements (f16, bf16 or f32) with normal(0, 1) values: a counter-based hash plus
/// Box-Muller, deterministic for a given seed. Queued on `stream` (bench/fill.cu).
void fill_random_normal(void* data, tessera::DType dtype, int64_t count, uint64_t seed,
                        cudaStream_t stream);

/// Reads `bytes` (a multiple of 16) of device memory, e.g. to fill L2 with clean lines (bench/fill.cu).
void read_all(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// Timing.

/// A CUDA event pair recorded on one stream.
class Timer {
 public:
  Timer();
  ~Timer();
  Timer(Timer&& other) noexcept;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  Timer& operator=(Timer&&) = delete;

  void start(cudaStream_t stream);
  void stop(cudaStream_t stream);
  /// Microseconds between start and stop; waits for the stop event.
  double elapsed_us() const;

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

/// Timed runs of one workload, in microseconds.
struct Timing {
  int iters = 0;
  int cooldown_ms = 0;  ///< idle time before the warm-up runs
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  std::vector<double> samples_us;  ///< in run order
};

/// Median (mean of the two middle values for an even count), min and max of `samples_us`.
Timing summarize(std::vector<double> samples_us);

// ------------------------------------------------------------------------------------------------
// Results and output.

/// A parameter value: an integer, a real number or a string (JSON number or string).
class ParamValue {
 public:
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  ParamValue(T v) : kind_(Kind::kInt), int_(static_cast<int64_t>(v)) {}
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  ParamValue(T v) : kind_(Kind::kReal), real_(static_cast<double>(v)) {}
  ParamValue(const char* s) : kind_(Kind::kString), str_(s) {}
  ParamValue(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}

  std::string text() const;  ///< for the table: 32768, 0.5, bf16
  std::string json() const;  ///< 32768, 0.5, "bf16"

 private:
  enum class Kind { kInt, kReal, kString };
  Kind kind_;
  int64_t int_ = 0;
  double real_ = 0;
  std::string str_;
};

/// Ordered key/value parameters of a result, e.g. {{"rows", 32768}, {"dtype", "bf16"}}.
using Params = std::vector<std::pair<std::string, ParamValue>>;

/// Names of the ceilings measured at the start of every run (bench/ceilings.cpp); results are
/// reported as fractions of one of them.
inline constexpr const char* kCopyCeiling = "copy_d2d";   ///< GB/s, bytes read + written
inline constexpr const char* kGemmCeiling = "gemm_bf16";  ///< TFLOP/s, 8192^3 bf16, fp32 accumulation

inline constexpr const char* kGBps = "GB/s";
inline constexpr const char* kTFlops = "TFLOP/s";
/// Wall-time metrics (no ceiling): the value is the median in that unit.
inline constexpr const char* kMicroseconds = "us";
inline constexpr const char* kMilliseconds = "ms";

struct Result {
  std::string workload;
  std::string suite;
  std::string impl;  ///< "tessera", "cublas", "cudaMemcpy", ...
  Params params;
  Timing timing;
  std::string metric;  ///< kGBps, kTFlops, kMicroseconds or kMilliseconds
  double value = 0;
  std::string ceiling_name;  ///< empty: no ceiling
  double ceiling_value = 0;  ///< NaN when the ceiling was not measured
};

/// Facts about the run that every JSON line repeats.
struct RunInfo {
  std::string gpu;
  int sm_count = 0;
  std::string date;    ///< UTC ISO-8601 of the start of the run
  std::string commit;  ///< TESSERA_GIT_COMMIT
};

/// Prints each result as a table row as it arrives, and as one JSON line: appended (and flushed)
/// to a file, or collected and printed to stdout after the table when the path is "-".
class OutputSink {
 public:
  /// json_path: "" for no JSON, "-" for stdout, otherwise a file opened for appending.
  /// with_samples: each JSON line also carries "samples_us", every timed run in run order (to see
  /// how a cell's runs spread and drift within a measurement).
  OutputSink(RunInfo info, const std::string& json_path, bool with_samples = false);
  ~OutputSink();
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  void add(const Result& r);
  /// Prints the collected stdout JSON lines (with --json -).
  void finish();
  const RunInfo& info() const { return info_; }

  static std::string to_json(const Result& r, const RunInfo& info, bool with_samples = false);

 private:
  void print_table_header();
  RunInfo info_;
  FILE* json_file_ = nullptr;
  bool json_stdout_ = false;
  bool with_samples_ = false;
  bool header_printed_ = false;
  std::vector<std::string> stdout_json_;
};

// ------------------------------------------------------------------------------------------------
// The context handed to each workload.

struct Workload;

class BenchContext {
 public:
  /// `cooldown_ms`: the GPU idles this long before each measurement's warm-up (see measure()).
  BenchContext(int device, int iters, int warmup, int cooldown_ms, OutputSink& sink);
  ~BenchContext();
  BenchContext(const BenchContext&) = delete;
  BenchContext& operator=(const BenchContext&) = delete;

  int device() const { return device_; }
  tessera::Device tensor_device() const { return tessera::Device::cuda(device_); }
  const cudaDeviceProp& props() const { return props_; }
  /// The dedicated (non-blocking) stream every workload runs on.
  cudaStream_t stream() const { return stream_; }
  int iters() const { return iters_; }
  int warmup() const { return warmup_; }

  // Inputs. All work is queued on stream(), so it is ordered before measure().
  /// Uninitialised contiguous tensor.
  DeviceTensor empty_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape);
  /// Contiguous tensor zeroed with cudaMemsetAsync.
  DeviceTensor zero_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape);
  /// Contiguous f16/bf16/f32 tensor of normal(0, 1) values; each call uses a new seed of a
  /// deterministic sequence.
  DeviceTensor random_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape);
  /// 1-D i32 tensor holding a copy of `host`.
  DeviceTensor upload_i32(const std::vector<int32_t>& host);
  void synchronize();

  /// Idles the GPU for the cool-down, runs fn(stream()) warmup() times, then iters() times, each
  /// timed run preceded by an L2 flush (cudaMemsetAsync over >= 2x the L2 size, outside the timed
  /// region) and timed with a CUDA event pair. `fn` must queue all its work on the stream it is
  /// given.
  Timing measure(const std::function<void(cudaStream_t)>& fn);

  // Ceilings.
  void set_ceiling(const std::string& name, double value);
  /// The ceiling measured in this run, or NaN.
  double ceiling(const std::string& name) const;

  // Reporting. `workload` defaults to the running workload's name, the suite is its first suite.
  void report(Result r);
  /// value = bytes / median time in GB/s (1e9), as a fraction of the copy ceiling.
  void report_gbps(const Timing& t, double bytes, Params params,
                   const std::string& impl = "tessera", const std::string& workload = "");
  /// value = flops / median time in TFLOP/s (1e12), as a fraction of the GEMM ceiling.
  void report_tflops(const Timing& t, double flops, Params params,
                     const std::string& impl = "tessera", const std::string& workload = "");

  /// A wall time, not a rate: value = the median of `t` in `unit` (kMicroseconds or
  /// kMilliseconds), no ceiling. `t` holds microseconds as every Timing does (host-clock
  /// samples, e.g. from summarize(), are fine).
  void report_time(const Timing& t, const char* unit, Params params, const std::string& impl = "tessera",
                   const std::string& workload = "");

  /// Called by main() before each workload.
  void begin_workload(const Workload& w) { current_ = &w; }

 private:
  void flush_l2();

  int device_;
  int iters_;
  int cooldown_ms_;
  int warmup_;
  OutputSink& sink_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  DeviceBuffer l2_flush_;
  // TESSERA_BENCH_L2_FLUSH=clean (a diagnostic, not the default): after the memset, a read of a
  // second buffer evicts its dirty lines, so timed runs start from a clean L2 (see flush_l2()).
  DeviceBuffer l2_clean_;
  uint64_t next_seed_ = 0x7e55e7a2026ull;
  std::map<std::string, double> ceilings_;
  const Workload* current_ = nullptr;
};

// ------------------------------------------------------------------------------------------------
// The workload registry.

using WorkloadFn = void (*)(BenchContext&);

struct Workload {
  std::string name;                 ///< unique, e.g. "merge_state"
  std::vector<std::string> suites;  ///< first = the workload's own suite; more, e.g. "quick"
  std::string description;
  WorkloadFn fn = nullptr;
  const std::string& suite() const { return suites.front(); }
};

/// Adds a workload (aborts on a duplicate name or no suite). Returns true, for static registration.
bool register_workload(Workload w);
/// Every registered workload, in registration order.
const std::vector<Workload>& registered_workloads();

/// GPU name, SM count, the current UTC time and the commit (TESSERA_GIT_COMMIT) for `device`.
RunInfo make_run_info(int device);
/// Runs every ceiling, then the workloads named in `names`, in registration order (for programs
/// other than tessera-bench, such as the demo). Errors propagate.
void run_workloads(BenchContext& ctx, const std::vector<std::string>& names);

/// A permutation of 0 .. n-1 that is the same on every platform (std::shuffle is not), e.g.
/// the page order of a benchmark's paged KV cache.
std::vector<int32_t> random_permutation(int64_t n, uint64_t seed);

/// The suite of the ceilings; its workloads run first in every run.
inline constexpr const char* kCeilingsSuite = "ceilings";

/// Registers `fn` as workload `name` in the suites given as the trailing string arguments.
#define TESSERA_BENCH_WORKLOAD(fn, name, description, ...)                     \
  [[maybe_unused]] static const bool tessera_bench_registered_##fn =           \
      ::tessera_bench::register_workload(                                      \
          ::tessera_bench::Workload{name, {__VA_ARGS__}, description, &fn})

}  // namespace tessera_bench
