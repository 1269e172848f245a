// The MLA GPU tests' inputs (tests/gpu/attention/mla_test.cpp, tests/gpu/runtime/mla_runtime_test.cpp):
// random queries and latent caches in device memory, and the fp64 oracle's result for them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/mla.h"
#include "reference/oracle.h"
#include "tessera/mla.h"

namespace tessera_test {
namespace mla {

constexpr int64_t kDc = tessera::kMlaLatentDim;
constexpr int64_t kDr = tessera::kMlaRopeDim;

/// Whether the current device runs the MLA kernels (sm_90).
bool device_has_wgmma();

/// How the latent cache and the queries are laid out in device memory.
enum class Storage {
  kSeparate,  ///< ckv, kpe, q_nope, q_pe each its own contiguous tensor
  kCombined,  ///< ckv/kpe slices of one [pages, page_size, 576]; q_nope/q_pe of one [total_q, H, 576]; o padded
};

/// How an fp8 case passes its dequantization scales (tessera::PagedLatentCache::scales).
enum class Fp8Scales {
  kHost,    ///< scales.k / scales.v
  kDevice,  ///< scales.k_device / v_device (one element each) times host factors of 2
};

struct MlaCase {
  tessera::DType dtype;
  int64_t heads;
  int64_t qo_len;  // tokens per request (every request); 1 without qo_indptr
  int64_t page_size;
  bool causal;
  std::vector<int64_t> kv_lens;
  Storage storage = Storage::kSeparate;
  bool with_indptr = true;
  int64_t num_kv_splits = 1;
  /// The latent cache's dtype when it is fp8 (e4m3 / e5m2): stored codes drawn as N(0, 16^2)
  /// rounded to the format, key scale 1.1 / 16 and value scale 0.9 / 16 (different, so that a
  /// kernel that swaps them fails). Unset (the case's dtype): values N(0, 1) in that dtype.
  std::optional<tessera::DType> fp8;
  Fp8Scales fp8_scales = Fp8Scales::kHost;
  tessera::DType kv_dtype() const { return fp8.value_or(dtype); }
};

/// An fp8 case's scales (MlaCase::fp8): of the key (ckv and kpe) and of the value (ckv).
constexpr double kFp8KeyScale = 1.1 / 16;
constexpr double kFp8ValueScale = 0.9 / 16;

/// Device copy of one case's inputs, and the oracle's result.
struct MlaRun {
  attn::DeviceTensor q_nope, q_pe, q_combined, ckv, kpe, kv_combined, o;
  DeviceBuffer qo_indptr, kv_indptr, kv_indices, kv_last;
  DeviceBuffer lse, workspace;
  tessera::PagedLatentCache cache;
  tessera::TensorView q_nope_view, q_pe_view, qo_indptr_view, lse_view;
  tessera_ref::State ref;
  int64_t total_q = 0;
  // The page table's host copies (the runtime's plan() reads them).
  std::vector<int32_t> qo_indptr_host, kv_indptr_host, last_page_len_host;
  // An fp8 case's device scales (Fp8Scales::kDevice): f32 [1] each.
  DeviceBuffer k_scale, v_scale;
  // What the oracle read: the queries and the stored cache (for oracle_with_scales).
  std::vector<double> q_nope_values, q_pe_values;
  tessera_ref::MlaPagedCache stored;
};

/// Fresh random inputs of case `c` (values rounded to its dtype), uploaded, and the oracle's
/// result; o and lse poisoned.
MlaRun prepare(const MlaCase& c, std::mt19937_64& rng, double sm_scale);
/// The oracle's result for run's inputs with an fp8 cache dequantized by key scale k and value
/// scale v (prepare() used kFp8KeyScale and kFp8ValueScale).
tessera_ref::State oracle_with_scales(const MlaCase& c, const MlaRun& run, double sm_scale, double k, double v);
/// Sets the device scales of an fp8 case with Fp8Scales::kDevice (on the stream, asynchronously
/// with respect to the host): the dequantization becomes k and v (host factors included).
void set_device_scales(MlaRun& run, double k, double v, cudaStream_t stream = nullptr);
/// The case in one line, for failure messages.
std::string describe(const MlaCase& c);

}  // namespace mla
}  // namespace tessera_test
