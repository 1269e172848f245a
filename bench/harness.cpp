#include "harness.h"

#ifndef TESSERA_GIT_COMMIT
#define TESSERA_GIT_COMMIT "unknown"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>

namespace tessera_bench {

// ------------------------------------------------------------------------------------------------
// Errors

void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::ostringstream msg;
  msg << "CUDA call failed: " << what << " at " << file << ":" << line << ": "
      << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
  throw FatalError(msg.str());
}

void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::ostringstream msg;
  msg << "cuBLAS call failed: " << what << " at " << file << ":" << line << ": "
      << cublasGetStatusName(status) << " (" << cublasGetStatusString(status) << ")";
  throw FatalError(msg.str());
}

// ------------------------------------------------------------------------------------------------
// DeviceBuffer

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t err = cudaMalloc(&ptr_, bytes);
  if (err != cudaSuccess) {
    ptr_ = nullptr;
    std::ostringstream msg;
    msg << "CUDA call failed: cudaMalloc of " << bytes << " bytes: " << cudaGetErrorName(err)
        << " (" << cudaGetErrorString(err) << ")";
    throw FatalError(msg.str());
  }
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) {
    // A destructor cannot throw; a failing cudaFree means the context is already broken and the
    // error that broke it has been (or will be) reported.
    cudaError_t err = cudaFree(ptr_);
    if (err != cudaSuccess) {
      std::fprintf(stderr, "tessera-bench: cudaFree failed: %s\n", cudaGetErrorString(err));
    }
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

// ------------------------------------------------------------------------------------------------
// Timer and Timing

Timer::Timer() {
  BENCH_CUDA(cudaEventCreate(&start_));
  cudaError_t err = cudaEventCreate(&stop_);
  if (err != cudaSuccess) {
    cudaEventDestroy(start_);
    start_ = nullptr;
    BENCH_CUDA(err);
  }
}

Timer::~Timer() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (stop_ != nullptr) cudaEventDestroy(stop_);
}

Timer::Timer(Timer&& other) noexcept : start_(other.start_), stop_(other.stop_) {
  other.start_ = nullptr;
  other.stop_ = nullptr;
}

void Timer::start(cudaStream_t stream) { BENCH_CUDA(cudaEventRecord(start_, stream)); }
void Timer::stop(cudaStream_t stream) { BENCH_CUDA(cudaEventRecord(stop_, stream)); }

double Timer::elapsed_us() const {
  BENCH_CUDA(cudaEventSynchronize(stop_));
  float ms = 0.0f;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
  return static_cast<double>(ms) * 1000.0;
}

Timing summarize(std::vector<double> samples_us) {
  Timing t;
  t.iters = static_cast<int>(samples_us.size());
  t.samples_us = samples_us;
  if (samples_us.empty()) return t;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  t.median_us = n % 2 == 1 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  t.min_us = samples_us.front();
  t.max_us = samples_us.back();
  return t;
}

// ------------------------------------------------------------------------------------------------
// Formatting helpers

namespace {

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += "\"";
  return out;
}

// A JSON number (null when not finite).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string params_text(const Params& params) {
  std::string out;
  for (const auto& [key, value] : params) {
    if (!out.empty()) out += ' ';
    out += key + "=" + value.text();
  }
  return out;
}

}  // namespace

std::string ParamValue::text() const {
  switch (kind_) {
    case Kind::kInt: return std::to_string(int_);
    case Kind::kReal: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", real_);
      return buf;
    }
    case Kind::kString: return str_;
  }
  return {};
}

std::string ParamValue::json() const {
  switch (kind_) {
    case Kind::kInt: return std::to_string(int_);
    case Kind::kReal: return json_number(real_);
    case Kind::kString: return json_escape(str_);
  }
  return "null";
}

// ------------------------------------------------------------------------------------------------
// OutputSink

OutputSink::OutputSink(RunInfo info, const std::string& json_path, bool with_samples)
    : info_(std::move(info)), with_samples_(with_samples) {
  if (json_path == "-") {
    json_stdout_ = true;
  } else if (!json_path.empty()) {
    json_file_ = std::fopen(json_path.c_str(), "a");
    if (json_file_ == nullptr) throw FatalError("cannot open " + json_path + " for appending");
  }
}

OutputSink::~OutputSink() {
  if (json_file_ != nullptr) std::fclose(json_file_);
}

namespace {
constexpr const char* kRowFormat = "%-22s %-10s %-46s %11s %10s %-7s %8s  %s\n";
}

void OutputSink::print_table_header() {
  std::printf(kRowFormat, "workload", "impl", "params", "median_us", "value", "unit", "fraction",
              "ceiling");
  header_printed_ = true;
}

void OutputSink::add(const Result& r) {
  if (!header_printed_) print_table_header();
  const double fraction = r.ceiling_name.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                 : r.value / r.ceiling_value;
  std::printf(kRowFormat, r.workload.c_str(), r.impl.c_str(), params_text(r.params).c_str(),
              fixed(r.timing.median_us, 2).c_str(), fixed(r.value, 1).c_str(), r.metric.c_str(),
              fixed(fraction, 3).c_str(), r.ceiling_name.empty() ? "-" : r.ceiling_name.c_str());
  std::fflush(stdout);

  const std::string line = to_json(r, info_, with_samples_);
  if (json_file_ != nullptr) {
    std::fprintf(json_file_, "%s\n", line.c_str());
    std::fflush(json_file_);
  }
  if (json_stdout_) stdout_json_.push_back(line);
}

void OutputSink::finish() {
  for (const std::string& line : stdout_json_) std::printf("%s\n", line.c_str());
  stdout_json_.clear();
  std::fflush(stdout);
}

std::string OutputSink::to_json(const Result& r, const RunInfo& info, bool with_samples) {
  const bool has_ceiling = !r.ceiling_name.empty();
  const double fraction =
      has_ceiling ? r.value / r.ceiling_value : std::numeric_limits<double>::quiet_NaN();
  std::string params = "{";
  for (size_t i = 0; i < r.params.size(); ++i) {
    if (i > 0) params += ", ";
    params += json_escape(r.params[i].first) + ": " + r.params[i].second.json();
  }
  params += "}";

  std::ostringstream o;
  o << "{\"workload\": " << json_escape(r.workload)           //
    << ", \"suite\": " << json_escape(r.suite)                 //
    << ", \"impl\": " << json_escape(r.impl)                   //
    << ", \"params\": " << params                              //
    << ", \"median_us\": " << json_number(r.timing.median_us)  //
    << ", \"min_us\": " << json_number(r.timing.min_us)        //
    << ", \"max_us\": " << json_number(r.timing.max_us)        //
    << ", \"iters\": " << r.timing.iters                       //
    << ", \"cooldown_ms\": " << r.timing.cooldown_ms           //
    << ", \"metric\": " << json_escape(r.metric)               //
    << ", \"value\": " << json_number(r.value)                 //
    << ", \"ceiling_name\": " << (has_ceiling ? json_escape(r.ceiling_name) : "null")
    << ", \"ceiling_value\": " << (has_ceiling ? json_number(r.ceiling_value) : "null")
    << ", \"fraction_of_ceiling\": " << json_number(fraction)  //
    << ", \"gpu\": " << json_escape(info.gpu)                  //
    << ", \"sm_count\": " << info.sm_count                     //
    << ", \"date\": " << json_escape(info.date)                //
    << ", \"commit\": " << json_escape(info.commit);
  if (with_samples) {
    o << ", \"samples_us\": [";
    for (size_t i = 0; i < r.timing.samples_us.size(); ++i) {
      o << (i > 0 ? ", " : "") << json_number(r.timing.samples_us[i]);
    }
    o << "]";
  }
  o << "}";
  return o.str();
}

// ------------------------------------------------------------------------------------------------
// BenchContext

BenchContext::BenchContext(int device, int iters, int warmup, int cooldown_ms, OutputSink& sink)
    : device_(device), iters_(iters), cooldown_ms_(cooldown_ms), warmup_(warmup), sink_(sink) {
  BENCH_CUDA(cudaGetDeviceProperties(&props_, device_));
  // >= 2x the L2 size, so a memset over it evicts everything a previous run left in L2.
  constexpr size_t kMiB = size_t{1} << 20;
  size_t flush_bytes = std::max<size_t>(2 * static_cast<size_t>(props_.l2CacheSize), 64 * kMiB);
  flush_bytes = (flush_bytes + kMiB - 1) / kMiB * kMiB;
  l2_flush_ = DeviceBuffer(flush_bytes);
  if (const char* mode = std::getenv("TESSERA_BENCH_L2_FLUSH")) {
    const std::string m = mode;
    if (m == "clean") {
      l2_clean_ = DeviceBuffer(flush_bytes + 16);
      BENCH_CUDA(cudaMemset(l2_clean_.get(), 0, l2_clean_.bytes()));
      std::printf("L2 flush: memset, then a read of %zu MiB (TESSERA_BENCH_L2_FLUSH=clean)\n", flush_bytes / kMiB);
    } else if (m != "memset") {
      throw FatalError("TESSERA_BENCH_L2_FLUSH='" + m + "': expected 'memset' (the default) or 'clean'");
    }
  }
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

BenchContext::~BenchContext() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

namespace {
int64_t shape_numel(std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw FatalError("negative tensor dimension in a benchmark shape");
    n *= d;
  }
  return n;
}
}  // namespace

DeviceTensor BenchContext::empty_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape) {
  const int64_t numel = shape_numel(shape);
  DeviceTensor t;
  t.buffer = DeviceBuffer(static_cast<size_t>(numel) * tessera::dtype_size(dtype));
  t.view = tessera::TensorView(t.buffer.get(), dtype, shape, tensor_device());
  return t;
}

DeviceTensor BenchContext::zero_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape) {
  DeviceTensor t = empty_tensor(dtype, shape);
  if (t.buffer.bytes() > 0) {
    BENCH_CUDA(cudaMemsetAsync(t.buffer.get(), 0, t.buffer.bytes(), stream_));
  }
  return t;
}

DeviceTensor BenchContext::random_tensor(tessera::DType dtype, std::initializer_list<int64_t> shape) {
  DeviceTensor t = empty_tensor(dtype, shape);
  fill_random_normal(t.buffer.get(), dtype, shape_numel(shape), next_seed_, stream_);
  next_seed_ += 0x9e3779b97f4a7c15ull;
  return t;
}

DeviceTensor BenchContext::upload_i32(const std::vector<int32_t>& host) {
  DeviceTensor t = empty_tensor(tessera::DType::kI32, {static_cast<int64_t>(host.size())});
  if (!host.empty()) {
    BENCH_CUDA(cudaMemcpyAsync(t.buffer.get(), host.data(), host.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
    // `host` is pageable and may die with the caller's frame: finish the copy now.
    BENCH_CUDA(cudaStreamSynchronize(stream_));
  }
  return t;
}

void BenchContext::synchronize() { BENCH_CUDA(cudaStreamSynchronize(stream_)); }

// The memset leaves up to an L2's worth of dirty lines, whose write-back the next run pays while
// it streams its own inputs. Triton's do_bench and the Python benchmarks built on it flush with a
// zero fill as well, so the default keeps our figures comparable with the anchors. The clean mode reads another buffer
// afterwards so that write-back happens here, outside the event pair.
void BenchContext::flush_l2() {
  BENCH_CUDA(cudaMemsetAsync(l2_flush_.get(), 0, l2_flush_.bytes(), stream_));
  if (l2_clean_.get() != nullptr) {
    read_all(l2_clean_.get(), l2_flush_.bytes(), static_cast<unsigned*>(l2_clean_.get()) + l2_flush_.bytes() / 4,
             stream_);
  }
}

Timing BenchContext::measure(const std::function<void(cudaStream_t)>& fn) {
  // Each measurement starts from the same power state, whatever ran before it. Seconds of dense
  // kernels at the 700 W software power cap leave the H100's clocks low for a while after
  // (bench/results/LOG.md); nvbench pauses on throttling for the same reason.
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  if (cooldown_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cooldown_ms_));

  for (int i = 0; i < warmup_; ++i) {
    flush_l2();
    fn(stream_);
  }
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  BENCH_CUDA(cudaGetLastError());

  std::vector<Timer> timers;
  timers.reserve(static_cast<size_t>(iters_));
  for (int i = 0; i < iters_; ++i) timers.emplace_back();
  // The flush before each run is outside its event pair; it also keeps the GPU busy while the
  // host queues the run, so host launch overhead does not show up in the timing.
  for (Timer& timer : timers) {
    flush_l2();
    timer.start(stream_);
    fn(stream_);
    timer.stop(stream_);
  }
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  BENCH_CUDA(cudaGetLastError());

  std::vector<double> samples;
  samples.reserve(timers.size());
  for (const Timer& timer : timers) samples.push_back(timer.elapsed_us());
  Timing t = summarize(std::move(samples));
  t.cooldown_ms = cooldown_ms_;
  return t;
}

void BenchContext::set_ceiling(const std::string& name, double value) { ceilings_[name] = value; }

double BenchContext::ceiling(const std::string& name) const {
  auto it = ceilings_.find(name);
  return it == ceilings_.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
}

void BenchContext::report(Result r) {
  if (r.workload.empty() && current_ != nullptr) r.workload = current_->name;
  if (r.suite.empty() && current_ != nullptr) r.suite = current_->suite();
  if (!r.ceiling_name.empty()) r.ceiling_value = ceiling(r.ceiling_name);
  sink_.add(r);
}

namespace {
/// A rate (`amount` per second / `unit_scale`) against the ceiling of the same unit.
Result rate_result(const Timing& t, double amount, double unit_scale, const char* metric, const char* ceiling,
                   Params params, const std::string& impl, const std::string& workload) {
  Result r;
  r.workload = workload;
  r.impl = impl;
  r.params = std::move(params);
  r.timing = t;
  r.metric = metric;
  r.value = amount / (t.median_us * 1e-6) / unit_scale;
  r.ceiling_name = ceiling;
  return r;
}
}  // namespace

void BenchContext::report_gbps(const Timing& t, double bytes, Params params,
                               const std::string& impl, const std::string& workload) {
  report(rate_result(t, bytes, 1e9, kGBps, kCopyCeiling, std::move(params), impl, workload));
}

void BenchContext::report_tflops(const Timing& t, double flops, Params params,
                                 const std::string& impl, const std::string& workload) {
  report(rate_result(t, flops, 1e12, kTFlops, kGemmCeiling, std::move(params), impl, workload));
}

void BenchContext::report_time(const Timing& t, const char* unit, Params params, const std::string& impl,
                               const std::string& workload) {
  const std::string u = unit;
  if (u != kMicroseconds && u != kMilliseconds) {
    throw FatalError("report_time: unit '" + u + "', expected \"us\" or \"ms\"");
  }
  Result r;
  r.workload = workload;
  r.impl = impl;
  r.params = std::move(params);
  r.timing = t;
  r.metric = u;
  r.value = u == kMilliseconds ? t.median_us * 1e-3 : t.median_us;
  report(std::move(r));
}

// ------------------------------------------------------------------------------------------------
// Registry

namespace {
std::vector<Workload>& registry() {
  static std::vector<Workload> workloads;
  return workloads;
}
}  // namespace

bool register_workload(Workload w) {
  if (w.suites.empty() || w.fn == nullptr) {
    std::fprintf(stderr, "tessera-bench: workload '%s' registered without a suite or function\n",
                 w.name.c_str());
    std::abort();
  }
  for (const Workload& existing : registry()) {
    if (existing.name == w.name) {
      std::fprintf(stderr, "tessera-bench: workload '%s' registered twice\n", w.name.c_str());
      std::abort();
    }
  }
  registry().push_back(std::move(w));
  return true;
}

const std::vector<Workload>& registered_workloads() { return registry(); }

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<int32_t> random_permutation(int64_t n, uint64_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

RunInfo make_run_info(int device) {
  cudaDeviceProp props{};
  BENCH_CUDA(cudaGetDeviceProperties(&props, device));
  RunInfo info;
  info.gpu = props.name;
  info.sm_count = props.multiProcessorCount;
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  info.date = buf;
  // The configure-time commit goes stale in a build directory reused across revisions; a
  // TESSERA_GIT_COMMIT set at run time (scripts/ab-bench.sh, gpu-check.sh) names the tree measured.
  const char* commit = std::getenv("TESSERA_GIT_COMMIT");
  info.commit = commit != nullptr && *commit != '\0' ? commit : TESSERA_GIT_COMMIT;
  return info;
}

void run_workloads(BenchContext& ctx, const std::vector<std::string>& names) {
  for (const Workload& w : registered_workloads()) {
    const bool ceiling = std::find(w.suites.begin(), w.suites.end(), kCeilingsSuite) != w.suites.end();
    if (ceiling || std::find(names.begin(), names.end(), w.name) != names.end()) {
      ctx.begin_workload(w);
      w.fn(ctx);
    }
  }
}

}  // namespace tessera_bench
