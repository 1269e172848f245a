// The two hardware ceilings every result is reported against, measured at the start of every run
// (bench/README.md): device-to-device copy bandwidth and cuBLAS bf16 GEMM throughput.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "harness.h"

namespace tessera_bench {
namespace {

using tessera::DType;

// Device-to-device cudaMemcpyAsync of 1 GiB; bandwidth counts bytes read + bytes written.
void bench_copy_d2d(BenchContext& ctx) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  DeviceTensor src = ctx.random_tensor(DType::kF32, {kBytes / 4});
  DeviceTensor dst = ctx.empty_tensor(DType::kF32, {kBytes / 4});
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    BENCH_CUDA(cudaMemcpyAsync(dst.buffer.get(), src.buffer.get(), kBytes,
                               cudaMemcpyDeviceToDevice, stream));
  });
  const double bytes = 2.0 * static_cast<double>(kBytes);
  ctx.set_ceiling(kCopyCeiling, bytes / (t.median_us * 1e-6) / 1e9);
  ctx.report_gbps(t, bytes, {{"bytes", kBytes}}, "cudaMemcpy");
}

class CublasHandle {
 public:
  CublasHandle() { BENCH_CUBLAS(cublasCreate(&handle_)); }
  ~CublasHandle() { cublasDestroy(handle_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// bf16 GEMM M = N = K = 8192 with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F), random
// inputs, bf16 output; TFLOP/s = 2 * M * N * K / time.
void bench_gemm_bf16(BenchContext& ctx) {
  constexpr int kM = 8192, kN = 8192, kK = 8192;
  DeviceTensor a = ctx.random_tensor(DType::kBF16, {kK, kM});  // column-major M x K
  DeviceTensor b = ctx.random_tensor(DType::kBF16, {kN, kK});  // column-major K x N
  DeviceTensor c = ctx.zero_tensor(DType::kBF16, {kN, kM});    // column-major M x N
  CublasHandle handle;
  const float alpha = 1.0f, beta = 0.0f;
  const Timing t = ctx.measure([&](cudaStream_t stream) {
    BENCH_CUBLAS(cublasSetStream(handle.get(), stream));
    BENCH_CUBLAS(cublasGemmEx(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, kM, kN, kK, &alpha,
                              a.buffer.get(), CUDA_R_16BF, kM, b.buffer.get(), CUDA_R_16BF, kK,
                              &beta, c.buffer.get(), CUDA_R_16BF, kM, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  });
  const double flops = 2.0 * kM * static_cast<double>(kN) * kK;
  ctx.set_ceiling(kGemmCeiling, flops / (t.median_us * 1e-6) / 1e12);
  ctx.report_tflops(t, flops, {{"M", kM}, {"N", kN}, {"K", kK}, {"dtype", "bf16"}, {"accum", "f32"}},
                    "cublas");
}

}  // namespace

TESSERA_BENCH_WORKLOAD(bench_copy_d2d, kCopyCeiling, "device-to-device cudaMemcpyAsync of 1 GiB",
                       kCeilingsSuite);
TESSERA_BENCH_WORKLOAD(bench_gemm_bf16, kGemmCeiling,
                       "cuBLAS bf16 GEMM 8192^3, fp32 accumulation", kCeilingsSuite);

}  // namespace tessera_bench
