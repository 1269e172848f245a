// The MLA GPU tests' inputs (tests/gpu/attention/mla_test.cpp, tests/gpu/runtime/mla_runtime_test.cpp):
// random queries and latent caches in device memory, and the fp64 oracle's result for them.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
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
};

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
};

/// Fresh random inputs of case `c` (values rounded to its dtype), uploaded, and the oracle's
/// result; o and lse poisoned.
MlaRun prepare(const MlaCase& c, std::mt19937_64& rng, double sm_scale);
/// The case in one line, for failure messages.
std::string describe(const MlaCase& c);

}  // namespace mla
}  // namespace tessera_test
