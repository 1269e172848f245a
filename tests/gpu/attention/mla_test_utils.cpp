#include "gpu/attention/mla_test_utils.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>

#include "gpu/attention/attention_test_utils.h"
#include "reference/mla.h"

namespace tessera_test {
namespace mla {

using tessera::DType;
using tessera::TensorView;
using namespace tessera_test::attn;

bool device_has_wgmma() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

namespace {

std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

/// Interleaves [rows, a] and [rows, b] into [rows, a + b].
std::vector<double> concat_rows(const std::vector<double>& x, int64_t a, const std::vector<double>& y, int64_t b) {
  const int64_t rows = static_cast<int64_t>(x.size()) / a;
  std::vector<double> out(static_cast<size_t>(rows * (a + b)));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(x.begin() + r * a, x.begin() + (r + 1) * a, out.begin() + r * (a + b));
    std::copy(y.begin() + r * b, y.begin() + (r + 1) * b, out.begin() + r * (a + b) + a);
  }
  return out;
}

}  // namespace

MlaRun prepare(const MlaCase& c, std::mt19937_64& rng, double sm_scale) {
  MlaRun run;
  const int64_t B = static_cast<int64_t>(c.kv_lens.size());
  const int64_t H = c.heads;
  std::vector<int32_t> qo_indptr = {0};
  std::vector<std::vector<double>> ckv(B), kpe(B);
  const DType kv = c.kv_dtype();
  const double stored_stddev = c.fp8 ? 16.0 : 1.0;  // fp8 codes use the format's range
  for (int64_t b = 0; b < B; ++b) {
    ckv[b] = round_to(kv, random_normal(c.kv_lens[b] * kDc, rng, stored_stddev));
    kpe[b] = round_to(kv, random_normal(c.kv_lens[b] * kDr, rng, stored_stddev));
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(c.qo_len));
  }
  run.total_q = qo_indptr.back();
  run.q_nope_values = round_to(c.dtype, random_normal(run.total_q * H * kDc, rng));
  run.q_pe_values = round_to(c.dtype, random_normal(run.total_q * H * kDr, rng));
  const std::vector<double>& q_nope = run.q_nope_values;
  const std::vector<double>& q_pe = run.q_pe_values;
  const tessera_ref::MlaShape shape{H, kDc, kDr};
  run.stored = tessera_ref::build_mla_paged(ckv, kpe, c.kv_lens, shape, c.page_size, test_seed() | 1);
  const tessera_ref::MlaPagedCache& cache = run.stored;
  run.qo_indptr_host = qo_indptr;
  run.ref = c.fp8 ? oracle_with_scales(c, run, sm_scale, kFp8KeyScale, kFp8ValueScale)
                  : oracle_with_scales(c, run, sm_scale, 1.0, 1.0);
  if (c.fp8 && c.fp8_scales == Fp8Scales::kDevice) {
    run.k_scale = DeviceBuffer(sizeof(float));
    run.v_scale = DeviceBuffer(sizeof(float));
    run.cache.scales.k = 2.0;
    run.cache.scales.v = 2.0;
    run.cache.scales.k_device = make_view(run.k_scale.get(), DType::kF32, {1}, {1});
    run.cache.scales.v_device = make_view(run.v_scale.get(), DType::kF32, {1}, {1});
    set_device_scales(run, kFp8KeyScale, kFp8ValueScale);
  } else if (c.fp8) {
    run.cache.scales.k = kFp8KeyScale;
    run.cache.scales.v = kFp8ValueScale;
  }

  const int64_t pages = cache.ckv.num_pages;
  if (c.storage == Storage::kSeparate) {
    run.ckv = upload_tensor(kv, cache.ckv.k_pages, {pages, c.page_size, kDc});
    run.kpe = upload_tensor(kv, cache.kpe.k_pages, {pages, c.page_size, kDr});
    run.cache.ckv = run.ckv.view;
    run.cache.kpe = run.kpe.view;
    run.q_nope = upload_tensor(c.dtype, q_nope, {run.total_q, H, kDc});
    run.q_pe = upload_tensor(c.dtype, q_pe, {run.total_q, H, kDr});
    run.q_nope_view = run.q_nope.view;
    run.q_pe_view = run.q_pe.view;
    run.o = make_output(c.dtype, {run.total_q, H, kDc});
  } else {
    // One [pages, page_size, 576] cache with a padded page stride; ckv and kpe are its slices.
    const std::vector<int64_t> kv_shape = {pages, c.page_size, kDc + kDr};
    std::vector<int64_t> kv_strides = row_major(kv_shape);
    kv_strides[0] += 64;
    run.kv_combined = upload_tensor(kv, concat_rows(cache.ckv.k_pages, kDc, cache.kpe.k_pages, kDr), kv_shape,
                                    kv_strides);
    char* base = static_cast<char*>(run.kv_combined.view.data);
    run.cache.ckv = make_view(base, kv, {pages, c.page_size, kDc}, kv_strides);
    run.cache.kpe = make_view(base + kDc * tessera::dtype_size(kv), kv, {pages, c.page_size, kDr}, kv_strides);
    const size_t elem = tessera::dtype_size(c.dtype);
    const std::vector<int64_t> q_shape = {run.total_q, H, kDc + kDr};
    std::vector<int64_t> q_strides = row_major(q_shape);
    q_strides[0] += 8 * 3;
    run.q_combined = upload_tensor(c.dtype, concat_rows(q_nope, kDc, q_pe, kDr), q_shape, q_strides);
    char* q_base = static_cast<char*>(run.q_combined.view.data);
    run.q_nope_view = make_view(q_base, c.dtype, {run.total_q, H, kDc}, q_strides);
    run.q_pe_view = make_view(q_base + kDc * elem, c.dtype, {run.total_q, H, kDr}, q_strides);
    run.o = make_output(c.dtype, {run.total_q, H, kDc}, padded_strides({run.total_q, H, kDc}, 8, 16));
  }
  run.kv_indptr_host = cache.ckv.indptr;
  run.last_page_len_host = cache.ckv.last_page_len;
  run.kv_indptr = upload_i32(cache.ckv.indptr);
  run.kv_indices = upload_i32(cache.ckv.indices.empty() ? std::vector<int32_t>{0} : cache.ckv.indices);
  run.kv_last = upload_i32(cache.ckv.last_page_len);
  run.cache.indptr = i32_view(run.kv_indptr, B + 1);
  run.cache.indices = i32_view(run.kv_indices, static_cast<int64_t>(cache.ckv.indices.size()));
  run.cache.last_page_len = i32_view(run.kv_last, B);
  if (c.with_indptr) {
    run.qo_indptr = upload_i32(qo_indptr);
    run.qo_indptr_view = i32_view(run.qo_indptr, B + 1);
  }
  run.lse = DeviceBuffer(static_cast<size_t>(std::max<int64_t>(run.total_q * H, 1)) * sizeof(float));
  run.lse.poison();
  run.lse_view = make_view(run.lse.get(), DType::kF32, {run.total_q, H}, {H, 1});
  return run;
}

tessera_ref::State oracle_with_scales(const MlaCase& c, const MlaRun& run, double sm_scale, double k, double v) {
  // A latent row is the key (dequantized by k) and the value (by v): the output is linear in the
  // value, so the oracle runs on the key-dequantized cache and its output is scaled by v / k.
  tessera_ref::MlaPagedCache keys = run.stored;
  for (double& x : keys.ckv.k_pages) x *= k;
  for (double& x : keys.kpe.k_pages) x *= k;
  const tessera_ref::MlaShape shape{c.heads, kDc, kDr};
  tessera_ref::State st = tessera_ref::mla_attention_paged(run.q_nope_values, run.q_pe_values, run.qo_indptr_host,
                                                           keys, shape, sm_scale, c.causal);
  for (double& x : st.o) x *= v / k;
  return st;
}

void set_device_scales(MlaRun& run, double k, double v, cudaStream_t stream) {
  // The device values times the host factors (2, prepare()) give k and v.
  const float host[2] = {static_cast<float>(k / run.cache.scales.k), static_cast<float>(v / run.cache.scales.v)};
  if (cudaMemcpyAsync(run.k_scale.get(), &host[0], sizeof(float), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaMemcpyAsync(run.v_scale.get(), &host[1], sizeof(float), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    throw std::runtime_error("set_device_scales: a CUDA copy failed");
  }
}

std::string describe(const MlaCase& c) {
  std::string lens;
  for (int64_t l : c.kv_lens) lens += (lens.empty() ? "" : ",") + std::to_string(l);
  return std::string(tessera::dtype_name(c.dtype)) + " H" + std::to_string(c.heads) + " q" + std::to_string(c.qo_len) +
         " page" + std::to_string(c.page_size) + (c.causal ? " causal" : "") + " kv[" + lens + "]" +
         (c.storage == Storage::kCombined ? " combined" : "") + " splits " + std::to_string(c.num_kv_splits) +
         (c.fp8 ? std::string(" ") + tessera::dtype_name(*c.fp8) +
                      (c.fp8_scales == Fp8Scales::kDevice ? " device scales" : " host scales")
                : std::string());
}


}  // namespace mla
}  // namespace tessera_test
