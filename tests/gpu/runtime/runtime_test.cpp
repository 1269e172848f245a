// GPU tests of the plan/run runtime (include/tessera/runtime.h): every wrapper against the fp64
// oracle with split-KV on, off and fixed; bit-identical repeated runs; agreement with the
// one-shot kernels; batch invariance of fixed splits; a CUDA Graph captured once and replayed
// after re-plans; argument errors. Inputs are fresh random values, outputs poisoned (NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"
#include "tessera/runtime.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::QueryTile;
using tessera::SplitKV;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

enum class Wrapper { kDecode, kPrefillPaged, kPrefillRagged, kBlockSparse };

const char* wrapper_name(Wrapper w) {
  switch (w) {
    case Wrapper::kDecode: return "decode";
    case Wrapper::kPrefillPaged: return "paged";
    case Wrapper::kPrefillRagged: return "ragged";
    case Wrapper::kBlockSparse: return "bsr";
  }
  return "?";
}

/// Whether head_dim 128 prefill runs the wgmma tile here: an sm_90 device, and not kept on
/// mma.sync by TESSERA_PREFILL_WGMMA=0 (gpu-check reruns the suites that way).
bool wgmma_tile_in_use() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  const char* wgmma = std::getenv("TESSERA_PREFILL_WGMMA");
  return major == 9 && !(wgmma != nullptr && std::string(wgmma) == "0");
}

/// Whether the device is sm_90 (FP8 attention's tile runs there whatever TESSERA_PREFILL_WGMMA says).
bool device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

enum class SoftmaxFree { kNone, kSigmoid, kUserWeights };
constexpr double kSigmoidBias = -1.5;

/// A user variant without softmax whose weights are the built-in sigmoid's with kSigmoidBias.
const tessera::VariantSpec& sigmoid_weights_variant() {
  static const tessera::VariantSpec spec = [] {
    tessera::VariantSpec v;
    v.name = "test_runtime_sigmoid_weights";
    v.source = "float logits_transform(const Params& params, float logits, int batch, int qo_idx, int kv_idx,\n"
               "                       int qo_head, int kv_head) { return 1.f / (1.f + expf(-(logits - 1.5f))); }\n";
    v.use_softmax = false;
    return v;
  }();
  return spec;
}

struct RuntimeCase {
  Wrapper wrapper = Wrapper::kDecode;
  DType dtype = DType::kBF16;
  Layout layout = Layout::kNHD;
  std::vector<int64_t> qo, kv;  // per request (decode: qo all 1; BSR: rows M, cols N in qo[0], kv[0])
  int64_t page_size = 16;
  int64_t block_rows = 1, block_cols = 1;  // BSR
  int64_t num_kv_heads = 2, group = 4, head_dim = 128;
  int64_t head_dim_vo = 0;  // prefill: v's and o's head dim (0: head_dim)
  bool causal = false;
  bool with_lse = true;
  SplitKV split = SplitKV::kAuto;
  int64_t fixed_split = 0;
  QueryTile tile = QueryTile::kAuto;
  int64_t sm_budget = 0;
  /// Where the wgmma tile runs, the plan groups KV heads per CTA (RuntimeOptions::sm_budget chosen
  /// so that num_kv_heads does not divide the CTA slots of the wgmma tile's persistent grid).
  bool head_groups_with_wgmma = false;
  /// fp8 K/V: codes N(0, 16^2) rounded to the format, per-tensor host scales kFp8KScale /
  /// kFp8VScale; the oracle sees code x scale.
  Fp8KV fp8 = Fp8KV::kNone;
  /// FP8 attention (with fp8 e4m3): q codes too (scale kFp8QScale), o in `dtype`, compared at the
  /// FP8 attention tolerances (docs/kernels.md: P is rounded to e4m3).
  bool fp8_q = false;
  /// Prefill: a random tree mask per request (attn::tree_masks: the prefix, the query's ancestors
  /// among the new tokens, itself), given to plan() as a custom mask.
  bool tree_mask = false;
  /// Prefill: a custom mask that hides whole KV tiles (hidden_tile_masks), so the runtime's mask
  /// tile lists skip them; the K/V rows it hides from every query of a request of <= 8192 keys are
  /// NaN on the GPU (the oracle sees finite values), which reach the output only if a tile of them
  /// is visited.
  bool hidden_tiles = false;
  /// Softmax-free attention: the built-in sigmoid (bias kSigmoidBias), or a user variant with
  /// use_softmax = false whose logits_transform computes the same weights (the oracle's sigmoid).
  SoftmaxFree softmax_free = SoftmaxFree::kNone;
  std::string name;

  DType kv_dtype() const { return fp8 == Fp8KV::kE4M3 ? DType::kE4M3 : fp8 == Fp8KV::kE5M2 ? DType::kE5M2 : dtype; }

  int64_t num_qo_heads() const { return num_kv_heads * group; }
  int64_t value_dim() const { return head_dim_vo == 0 ? head_dim : head_dim_vo; }
};

void PrintTo(const RuntimeCase& c, std::ostream* os) { *os << c.name; }

constexpr double kFp8KScale = 5.0 / 64, kFp8VScale = 3.0 / 64, kFp8QScale = 1.0 / 16;
constexpr double kFp8AttentionRelTolerance = 4e-2, kFp8AttentionLseTolerance = 8e-3;  // as fp8_attention_test.cpp

/// K or V of `count` elements: 16-bit values, or for fp8 cases the codes to upload (`stored`)
/// and what they stand for (the returned values, which the oracle sees).
std::vector<double> draw_kv(const RuntimeCase& c, int64_t count, double scale, std::mt19937_64& rng,
                            std::vector<double>& stored) {
  if (c.fp8 == Fp8KV::kNone) {
    stored = round_to(c.dtype, random_normal(count, rng));
    return stored;
  }
  stored = round_to(c.kv_dtype(), random_normal(count, rng, 16.0));
  std::vector<double> values = stored;
  for (double& x : values) x *= scale;
  return values;
}

/// Inputs of one case, their oracle result, and the device copies.
struct Prepared {
  tessera_ref::State ref;
  std::vector<int32_t> qo_indptr, kv_indptr, last_page_len, bsr_indptr;
  DeviceTensor q, o, lse, k, v;
  DevicePaged paged;
  DeviceBuffer indices;
  tessera::PagedKVCache cache;
  int64_t rows = 0;
  DeviceBuffer mask;                 // tree_mask / hidden_tiles: the packed bits
  std::vector<int32_t> mask_indptr;  // byte offsets per request (host, as plan() takes them); empty: no mask
};

/// Masks that hide whole KV tiles, per request (qo_len m, kv_len n; 1 = visible): key j is
/// visible to query i at most up to the causal diagonal j <= n - m + i (so a long query's upper
/// triangle hides whole tiles even in a non-causal plan), never in the request's hole (keys
/// [512, 1536) when n >= 2048, [1024, 4096) when n >= 4608: hidden from every query, aligned to
/// 512 keys so that any KV tile is inside it or outside it), nothing at all for a request whose n
/// is 700; otherwise with probability 0.8, but for query 2 of a request with n < 4608 (a query
/// that sees nothing) and the solid run of a request with n >= 4608: the 16384 keys after its
/// hole (up to the diagonal of its first query) are visible to every query but its pinholes,
/// a key every 2048 hidden from every query, so most of the run's tiles are shown whole (the
/// kernel need not mask them) and a few tiles, or the groups of tiles a long item's mask tile
/// list records together, are not. `hole[b]`: request b's hole, [first, end); `pinholes[b]`:
/// its pinhole keys.
std::vector<std::vector<uint8_t>> hidden_tile_masks(const std::vector<int64_t>& qo_len,
                                                     const std::vector<int64_t>& kv_len, std::mt19937_64& rng,
                                                     std::vector<std::pair<int64_t, int64_t>>& hole,
                                                     std::vector<std::vector<int64_t>>& pinholes) {
  std::vector<std::vector<uint8_t>> masks(qo_len.size());
  std::bernoulli_distribution shown(0.8);
  hole.assign(qo_len.size(), {0, 0});
  pinholes.assign(qo_len.size(), {});
  for (size_t b = 0; b < qo_len.size(); ++b) {
    const int64_t m = qo_len[b], n = kv_len[b];
    std::pair<int64_t, int64_t> solid{0, 0};
    if (n == 700) {
      hole[b] = {0, n};
    } else if (n >= 4608) {
      hole[b] = {1024, 4096};
      solid = {4096, std::min<int64_t>(4096 + 16384, n - m + 1)};
      for (int64_t j = solid.first + 300; j < solid.second; j += 2048) pinholes[b].push_back(j);
    } else if (n >= 2048) {
      hole[b] = {512, 1536};
    }
    masks[b].assign(static_cast<size_t>(m * n), 0);
    for (int64_t i = 0; i < m; ++i) {
      if (i == 2 && n < 4608) continue;
      for (int64_t j = 0; j <= n - m + i && j < n; ++j) {
        if (j >= hole[b].first && j < hole[b].second) continue;
        const bool in_solid = j >= solid.first && j < solid.second;
        const bool pinhole = in_solid && (j - solid.first) % 2048 == 300;
        masks[b][static_cast<size_t>(i * n + j)] = in_solid ? !pinhole : shown(rng) ? 1 : 0;
      }
    }
  }
  return masks;
}

/// NaN in the rows [first, end) of a request's K or V ([kv_len, heads * dim] row-major).
void poison_rows(std::vector<double>& values, std::pair<int64_t, int64_t> rows, int64_t row_elems) {
  for (int64_t r = rows.first; r < rows.second; ++r)
    std::fill_n(values.begin() + r * row_elems, row_elems, std::numeric_limits<double>::quiet_NaN());
}

Prepared prepare(const RuntimeCase& c, std::mt19937_64& rng) {
  Prepared p;
  const int64_t hq = c.num_qo_heads(), hkv = c.num_kv_heads, d = c.head_dim, dv = c.value_dim();
  const tessera_ref::HeadConfig heads{hq, hkv, d, dv};
  tessera_ref::Options opts;
  opts.causal = c.causal;
  if (c.softmax_free != SoftmaxFree::kNone) {
    opts.use_softmax = false;
    opts.sigmoid_bias = kSigmoidBias;
  }
  const size_t batch = c.qo.size();
  if (c.wrapper == Wrapper::kBlockSparse) {
    const int64_t m = c.qo[0], n = c.kv[0];
    tessera_ref::BlockSparse bsr;
    bsr.block_rows = c.block_rows;
    bsr.block_cols = c.block_cols;
    const int64_t row_blocks = (m + c.block_rows - 1) / c.block_rows, col_blocks = (n + c.block_cols - 1) / c.block_cols;
    bsr.indptr.push_back(0);
    std::bernoulli_distribution keep(0.6);
    for (int64_t r = 0; r < row_blocks; ++r) {
      for (int64_t cb = 0; cb < col_blocks; ++cb)
        if (keep(rng)) bsr.indices.push_back(static_cast<int32_t>(cb));
      bsr.indptr.push_back(static_cast<int32_t>(bsr.indices.size()));
    }
    const auto q = round_to(c.dtype, random_normal(m * hq * d, rng));
    std::vector<double> k_store, v_store;
    const auto k = draw_kv(c, n * hkv * d, kFp8KScale, rng, k_store);
    const auto v = draw_kv(c, n * hkv * d, kFp8VScale, rng, v_store);
    p.ref = tessera_ref::attention_block_sparse(q, k, v, m, n, bsr, heads, opts);
    p.q = upload_tensor(c.dtype, q, {m, hq, d});
    p.k = upload_tensor(c.kv_dtype(), k_store, {n, hkv, d});
    p.v = upload_tensor(c.kv_dtype(), v_store, {n, hkv, d});
    p.bsr_indptr = bsr.indptr;
    p.indices = upload_i32(bsr.indices.empty() ? std::vector<int32_t>{0} : bsr.indices);
    p.rows = m;
  } else {
    std::vector<std::pair<int64_t, int64_t>> holes;
    std::vector<std::vector<int64_t>> pinholes;
    if (c.tree_mask || c.hidden_tiles) {
      const std::vector<std::vector<uint8_t>> masks =
          c.tree_mask ? attn::tree_masks(c.qo, c.kv, rng) : hidden_tile_masks(c.qo, c.kv, rng, holes, pinholes);
      const attn::PackedMasks packed = attn::pack_masks(masks, rng);
      p.mask = DeviceBuffer(std::max<size_t>(1, packed.bytes.size()));
      p.mask.upload(packed.bytes.data(), packed.bytes.size());
      p.mask_indptr = packed.byte_indptr;
      opts.custom_mask_indptr = {0};
      for (const std::vector<uint8_t>& m : masks) {
        opts.custom_mask.insert(opts.custom_mask.end(), m.begin(), m.end());
        opts.custom_mask_indptr.push_back(static_cast<int64_t>(opts.custom_mask.size()));
      }
    }
    std::vector<std::vector<double>> qs(batch), ks(batch), vs(batch), q_store(batch), k_store(batch), v_store(batch);
    for (size_t b = 0; b < batch; ++b) {
      if (c.fp8_q) {
        q_store[b] = round_to(DType::kE4M3, random_normal(c.qo[b] * hq * d, rng, 16.0));
        qs[b] = q_store[b];
        for (double& x : qs[b]) x *= kFp8QScale;
      } else {
        qs[b] = round_to(c.dtype, random_normal(c.qo[b] * hq * d, rng));
      }
      ks[b] = draw_kv(c, c.kv[b] * hkv * d, kFp8KScale, rng, k_store[b]);
      vs[b] = draw_kv(c, c.kv[b] * hkv * dv, kFp8VScale, rng, v_store[b]);
      // Up to 8192 keys an item has at most 256 tiles, an entry of its mask tile list per tile,
      // so a tile of the hole is skipped whatever the planner's chunks; a longer request's entries
      // cover a few tiles each, which may straddle the hole's ends.
      if (!holes.empty() && c.kv[b] <= 8192) {
        poison_rows(k_store[b], holes[b], hkv * d);
        poison_rows(v_store[b], holes[b], hkv * dv);
      }
      // A pinhole's tile is visited and must be masked: a NaN key there reaches the output only
      // through a tile taken for shown whole (its value stays finite: P V multiplies it by 0).
      if (!pinholes.empty()) {
        for (const int64_t key : pinholes[b]) poison_rows(k_store[b], {key, key + 1}, hkv * d);
      }
    }
    const Packed q = pack_rows(qs, hq * d);
    p.qo_indptr = q.indptr;
    p.rows = q.indptr.back();
    p.q = c.fp8_q ? upload_tensor(DType::kE4M3, pack_rows(q_store, hq * d).values, {p.rows, hq, d})
                  : upload_tensor(c.dtype, q.values, {p.rows, hq, d});
    if (c.wrapper == Wrapper::kPrefillRagged) {
      const Packed k = pack_rows(ks, hkv * d), v = pack_rows(vs, hkv * dv);
      p.kv_indptr = k.indptr;
      p.ref = tessera_ref::attention_ragged(q.values, q.indptr, k.values, v.values, k.indptr, heads, opts);
      const Packed ku = pack_rows(k_store, hkv * d), vu = pack_rows(v_store, hkv * dv);
      p.k = upload_tensor(c.kv_dtype(), ku.values, {k.indptr.back(), hkv, d});
      p.v = upload_tensor(c.kv_dtype(), vu.values, {v.indptr.back(), hkv, dv});
    } else {
      // The same page layout (seed) for the uploaded codes and the oracle's values.
      const uint64_t page_seed = rng() | 1;
      const tessera_ref::PagedCache cache =
          tessera_ref::build_paged(ks, vs, c.kv, hkv, d, c.page_size, attn::ref_layout(c.layout), page_seed, 3, 0.0, dv);
      p.ref = tessera_ref::attention_paged(q.values, q.indptr, cache, heads, opts);
      const tessera_ref::PagedCache stored = tessera_ref::build_paged(
          k_store, v_store, c.kv, hkv, d, c.page_size, attn::ref_layout(c.layout), page_seed, 3, 0.0, dv);
      p.paged = upload_paged(c.kv_dtype(), stored, c.layout, /*combined=*/c.page_size % 2 == 1 && dv == d);
      p.kv_indptr = cache.indptr;
      p.last_page_len = cache.last_page_len;
      p.cache.k = p.paged.view.k;
      p.cache.v = p.paged.view.v;
      p.cache.layout = c.layout;
      p.cache.indices = p.paged.view.indices;
    }
  }
  p.o = make_output(c.dtype, {p.rows, hq, dv});
  p.lse = make_output(DType::kF32, {p.rows, hq});
  return p;
}

tessera::RuntimeBounds bounds_for(const RuntimeCase& c, int64_t rows) {
  tessera::RuntimeBounds b;
  b.max_batch_size = c.wrapper == Wrapper::kBlockSparse ? (c.qo[0] + c.block_rows - 1) / c.block_rows + 1
                                                        : static_cast<int64_t>(c.qo.size()) + 1;
  b.max_total_qo_tokens = rows + 1;
  b.num_qo_heads = c.num_qo_heads();
  b.num_kv_heads = c.num_kv_heads;
  b.head_dim = c.head_dim;
  b.head_dim_vo = c.head_dim_vo;
  return b;
}

tessera::RuntimeOptions options_for(const RuntimeCase& c) {
  tessera::RuntimeOptions o;
  o.split_kv = c.split;
  o.fixed_split_size = c.fixed_split;
  o.q_tile = c.tile;
  o.sm_budget = c.sm_budget;
  return o;
}

tessera::PlanShape shape_for(const RuntimeCase& c) {
  tessera::PlanShape s;
  s.num_qo_heads = c.num_qo_heads();
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.head_dim_vo = c.head_dim_vo;
  s.dtype = c.fp8_q ? DType::kE4M3 : c.dtype;
  s.attention.causal = c.causal;
  if (c.fp8 != Fp8KV::kNone) {
    s.kv_dtype = c.kv_dtype();
    s.attention.kv_scales.k = kFp8KScale;
    s.attention.kv_scales.v = kFp8VScale;
  }
  if (c.fp8_q) s.attention.kv_scales.q = kFp8QScale;
  if (c.softmax_free == SoftmaxFree::kSigmoid) {
    s.attention.variant.sigmoid = true;
    s.attention.variant.sigmoid_bias = kSigmoidBias;
  } else if (c.softmax_free == SoftmaxFree::kUserWeights) {
    s.attention.variant.user = &sigmoid_weights_variant();
  }
  return s;
}

/// The plan shape of a case with its tree mask (the bits on the device, the offsets on the host).
tessera::PlanShape shape_for(const RuntimeCase& c, const Prepared& p) {
  tessera::PlanShape s = shape_for(c);
  if (!p.mask_indptr.empty()) {
    s.attention.variant.custom_mask =
        TensorView(p.mask.get(), DType::kU8, {static_cast<int64_t>(p.mask.bytes())}, tessera::Device::cuda(0));
    s.attention.variant.custom_mask_indptr = host_i32(p.mask_indptr);
  }
  return s;
}

/// Any of the four wrappers behind one interface, for the tests.
class AnyWrapper {
 public:
  AnyWrapper(const RuntimeCase& c, const TensorView& ws, const tessera::RuntimeBounds& b,
             const tessera::RuntimeOptions& o)
      : c_(c) {
    switch (c.wrapper) {
      case Wrapper::kDecode: decode_ = std::make_unique<tessera::BatchDecodeWrapper>(ws, b, o); break;
      case Wrapper::kPrefillPaged: paged_ = std::make_unique<tessera::BatchPrefillPagedWrapper>(ws, b, o); break;
      case Wrapper::kPrefillRagged: ragged_ = std::make_unique<tessera::BatchPrefillRaggedWrapper>(ws, b, o); break;
      case Wrapper::kBlockSparse: bsr_ = std::make_unique<tessera::BlockSparseWrapper>(ws, b, o); break;
    }
  }
  static int64_t workspace_size(const RuntimeCase& c, const tessera::RuntimeBounds& b,
                                const tessera::RuntimeOptions& o) {
    switch (c.wrapper) {
      case Wrapper::kDecode: return tessera::BatchDecodeWrapper::workspace_size(b, o);
      case Wrapper::kPrefillPaged: return tessera::BatchPrefillPagedWrapper::workspace_size(b, o);
      case Wrapper::kPrefillRagged: return tessera::BatchPrefillRaggedWrapper::workspace_size(b, o);
      case Wrapper::kBlockSparse: return tessera::BlockSparseWrapper::workspace_size(b, o);
    }
    return 0;
  }
  static int64_t min_workspace_size(const RuntimeCase& c, const tessera::RuntimeBounds& b,
                                    const tessera::RuntimeOptions& o) {
    switch (c.wrapper) {
      case Wrapper::kDecode: return tessera::BatchDecodeWrapper::min_workspace_size(b, o);
      case Wrapper::kPrefillPaged: return tessera::BatchPrefillPagedWrapper::min_workspace_size(b, o);
      case Wrapper::kPrefillRagged: return tessera::BatchPrefillRaggedWrapper::min_workspace_size(b, o);
      case Wrapper::kBlockSparse: return tessera::BlockSparseWrapper::min_workspace_size(b, o);
    }
    return 0;
  }
  void plan(const Prepared& p, const tessera::PlanShape& shape, cudaStream_t s = nullptr) {
    switch (c_.wrapper) {
      case Wrapper::kDecode:
        return decode_->plan(host_i32(p.kv_indptr), host_i32(p.last_page_len), c_.page_size, shape, s);
      case Wrapper::kPrefillPaged:
        return paged_->plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), c_.page_size,
                            shape, s);
      case Wrapper::kPrefillRagged: return ragged_->plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), shape, s);
      case Wrapper::kBlockSparse:
        return bsr_->plan(host_i32(p.bsr_indptr), c_.block_rows, c_.block_cols, c_.qo[0], c_.kv[0], shape, s);
    }
  }
  void run(const Prepared& p, bool with_lse, cudaStream_t s = nullptr) {
    const TensorView lse = with_lse ? p.lse.view : TensorView{};
    switch (c_.wrapper) {
      case Wrapper::kDecode: return decode_->run(p.q.view, p.cache, p.o.view, lse, s);
      case Wrapper::kPrefillPaged: return paged_->run(p.q.view, p.cache, p.o.view, lse, s);
      case Wrapper::kPrefillRagged: return ragged_->run(p.q.view, p.k.view, p.v.view, p.o.view, lse, s);
      case Wrapper::kBlockSparse: {
        const TensorView idx = i32_view(p.indices, static_cast<int64_t>(p.indices.bytes() / 4));
        return bsr_->run(p.q.view, p.k.view, p.v.view, idx, p.o.view, lse, s);
      }
    }
  }
  const tessera::PlanInfo& info() const {
    switch (c_.wrapper) {
      case Wrapper::kDecode: return decode_->plan_info();
      case Wrapper::kPrefillPaged: return paged_->plan_info();
      case Wrapper::kPrefillRagged: return ragged_->plan_info();
      default: return bsr_->plan_info();
    }
  }

 private:
  RuntimeCase c_;
  std::unique_ptr<tessera::BatchDecodeWrapper> decode_;
  std::unique_ptr<tessera::BatchPrefillPagedWrapper> paged_;
  std::unique_ptr<tessera::BatchPrefillRaggedWrapper> ragged_;
  std::unique_ptr<tessera::BlockSparseWrapper> bsr_;
};

void check_against_oracle(const RuntimeCase& c, const Prepared& p, const std::string& what) {
  const std::vector<double> o = read_tensor(p.o);
  const std::vector<double> lse = read_tensor(p.lse);
  expect_matches_oracle(c.dtype, o, c.with_lse ? &lse : nullptr, p.ref, what,
                        c.fp8_q ? kFp8AttentionRelTolerance : 0.0, c.fp8_q ? kFp8AttentionLseTolerance : 0.0);
}

// ---------------------------------------------------------------------------------------------
// The case grid.

RuntimeCase named(RuntimeCase c, const std::string& tag) {
  c.name = std::string(wrapper_name(c.wrapper)) + "_" + tessera::dtype_name(c.dtype) + "_" +
           (c.fp8_q ? std::string("fp8q_") : std::string()) +
           (c.fp8 != Fp8KV::kNone ? std::string("kv") + tessera::dtype_name(c.kv_dtype()) + "_" : std::string()) +
           tessera::layout_name(c.layout) + "_B" + std::to_string(c.qo.size()) + "_hkv" +
           std::to_string(c.num_kv_heads) + "_g" + std::to_string(c.group) + "_d" + std::to_string(c.head_dim) +
           (c.value_dim() != c.head_dim ? "x" + std::to_string(c.value_dim()) : std::string()) +
           (c.causal ? "_causal" : "") +
           (c.split == SplitKV::kAuto ? "_auto" : c.split == SplitKV::kFixed ? "_fixed" : "_nosplit") + "_" + tag;
  return c;
}

std::vector<RuntimeCase> runtime_cases() {
  std::vector<RuntimeCase> cases;
  std::mt19937_64 rng(20261122);  // fixed: the case list must be the same in every process
  auto lengths = [&](size_t n, int64_t lo, int64_t hi) {
    std::vector<int64_t> v(n);
    std::uniform_int_distribution<int64_t> dist(lo, hi);
    for (auto& x : v) x = dist(rng);
    return v;
  };
  // Decode: one long request (every SM gets a chunk), odd batches with empty and tiny requests,
  // group sizes 1, 4, 5, 8, page sizes 1, 3, 16, 64, every head dim.
  {
    RuntimeCase c;
    c.wrapper = Wrapper::kDecode;
    c.qo = {1};
    c.kv = {16384};
    cases.push_back(named(c, "long_sanitize"));
    c.kv = {2049};
    c.dtype = DType::kF16;
    c.layout = Layout::kHND;
    c.page_size = 3;
    c.group = 5;
    cases.push_back(named(c, "p3"));
    c = RuntimeCase{};
    c.wrapper = Wrapper::kDecode;
    c.qo.assign(7, 1);
    c.kv = {0, 1, 15, 512, 2049, 7, 4000};
    for (int64_t g : {1, 4, 5, 8}) {
      c.group = g;
      c.page_size = g == 1 ? 1 : g == 5 ? 64 : 16;
      c.layout = g % 2 ? Layout::kHND : Layout::kNHD;
      cases.push_back(named(c, "odd_p" + std::to_string(c.page_size)));
    }
    c.group = 4;
    c.page_size = 16;
    for (int64_t d : {64, 96, 256}) {
      c.head_dim = d;
      cases.push_back(named(c, "odd"));
    }
    c.head_dim = 128;
    c.split = SplitKV::kNone;
    cases.push_back(named(c, "odd"));
    c.split = SplitKV::kFixed;
    c.fixed_split = 256;
    cases.push_back(named(c, "odd_sanitize"));
    // Auto split of a small batch takes the wide 16-row tile (8 warps, KV128); the 4-warp tile
    // also runs under the sanitizer through an explicit q_tile.
    c.split = SplitKV::kAuto;
    c.tile = QueryTile::k16;
    cases.push_back(named(c, "odd_tile16_sanitize"));
    c.tile = QueryTile::kAuto;
    c = RuntimeCase{};
    c.wrapper = Wrapper::kDecode;
    c.qo.assign(64, 1);
    c.kv = lengths(64, 0, 3000);
    c.num_kv_heads = 8;
    cases.push_back(named(c, "b64"));
    c.sm_budget = 7;
    cases.push_back(named(c, "b64_budget7"));
  }
  // Prefill over paged and ragged KV: query lengths 1, 3, 17, 128, 577 in one batch, causal on
  // and off, every head dim, every query tile.
  for (Wrapper w : {Wrapper::kPrefillPaged, Wrapper::kPrefillRagged}) {
    RuntimeCase c;
    c.wrapper = w;
    c.qo = {1, 3, 17, 128, 577, 0, 40};
    c.kv = {15, 3, 2049, 512, 1200, 9, 0};
    c.page_size = w == Wrapper::kPrefillPaged ? 16 : 1;
    for (bool causal : {false, true}) {
      c.causal = causal;
      cases.push_back(named(c, "mixed"));
    }
    c.causal = true;
    c.dtype = DType::kF16;
    for (int64_t d : {64, 96, 256}) {
      c.head_dim = d;
      cases.push_back(named(c, "mixed"));
    }
    c.head_dim = 128;
    for (QueryTile t : {QueryTile::k16, QueryTile::k64, QueryTile::k128}) {
      c.tile = t;
      cases.push_back(named(c, "tile" + std::to_string(static_cast<int>(t))));
    }
    c.tile = QueryTile::kAuto;
    // Heads grouped per CTA (wgmma tile, one CTA per SM): 7 slots over 2 KV heads run 7 columns
    // of both heads; 13 slots over 8 heads run 13 columns of all 8.
    c.head_groups_with_wgmma = true;
    c.sm_budget = 7;
    cases.push_back(named(c, "heads2_budget7"));
    c.num_kv_heads = 8;
    c.group = 2;
    c.sm_budget = 13;
    cases.push_back(named(c, "heads8_budget13"));
    c.head_groups_with_wgmma = false;
    c.sm_budget = 0;
    c.group = 1;
    c.num_kv_heads = 3;
    c.split = SplitKV::kFixed;
    c.fixed_split = 384;
    cases.push_back(named(c, w == Wrapper::kPrefillPaged ? "g1_sanitize" : "g1"));
    c = RuntimeCase{};
    c.wrapper = w;
    c.qo = {577};
    c.kv = {16384};
    c.causal = true;
    c.page_size = 64;
    c.with_lse = false;
    cases.push_back(named(c, "append_long"));
  }
  // Pages that hold whole KV tiles (the wgmma tiles copy those by TMA): pages of 128 slots, and
  // of 192 (96 at head dim 256), where every other tile would cross a page and takes cp.async;
  // auto splits and fixed ones (chunks of 384 keys: beginning at a page boundary, or inside one).
  for (int64_t page : {128, 192}) {
    RuntimeCase c;
    c.wrapper = Wrapper::kPrefillPaged;
    c.qo = {1, 130, 577, 0, 40};
    c.kv = {300, 2049, 1200, 9, 700};
    c.page_size = page;
    c.causal = page == 128;
    cases.push_back(named(c, "pages" + std::to_string(page)));
    c.split = SplitKV::kFixed;
    c.fixed_split = 384;
    cases.push_back(named(c, "pages" + std::to_string(page) + "_split384"));
    c.split = SplitKV::kAuto;
    c.head_dim = 256;
    c.page_size = page / 2;
    c.layout = Layout::kHND;
    cases.push_back(named(c, "pages" + std::to_string(c.page_size)));
  }
  // Split head dims (q/k 192, v/o 128: non-absorbed MLA prefill) over paged (page sizes 1, 16) and
  // ragged KV: mixed query lengths, causal on and off, every query tile, a long request split over
  // the grid (the contraction at head_dim_vo), fixed splits and none.
  for (Wrapper w : {Wrapper::kPrefillPaged, Wrapper::kPrefillRagged}) {
    RuntimeCase c;
    c.wrapper = w;
    c.head_dim = 192;
    c.head_dim_vo = 128;
    c.qo = {1, 3, 17, 128, 577, 0, 40};
    c.kv = {15, 3, 2049, 512, 1200, 9, 0};
    c.page_size = 16;
    for (bool causal : {false, true}) {
      c.causal = causal;
      cases.push_back(named(c, "mixed"));
    }
    c.dtype = DType::kF16;
    c.page_size = 1;
    c.group = 1;
    c.num_kv_heads = 3;
    for (QueryTile t : {QueryTile::k16, QueryTile::k64, QueryTile::k128}) {
      c.tile = t;
      cases.push_back(named(c, "tile" + std::to_string(static_cast<int>(t))));
    }
    c.tile = QueryTile::kAuto;
    c.split = SplitKV::kFixed;
    c.fixed_split = 256;
    cases.push_back(named(c, w == Wrapper::kPrefillPaged ? "fixed_sanitize" : "fixed"));
    c.split = SplitKV::kNone;
    cases.push_back(named(c, "nosplit"));
    c = RuntimeCase{};
    c.wrapper = w;
    c.head_dim = 192;
    c.head_dim_vo = 128;
    c.qo = {64};
    c.kv = {16384};
    c.causal = true;
    c.page_size = 64;
    cases.push_back(named(c, "append_long"));
  }
  // fp8 K/V through every wrapper: decode (one long request split over the grid, an odd batch),
  // prefill paged and ragged with mixed query lengths, every query tile, block-sparse.
  {
    RuntimeCase c;
    c.wrapper = Wrapper::kDecode;
    c.fp8 = Fp8KV::kE4M3;
    c.qo = {1};
    c.kv = {16384};
    cases.push_back(named(c, "long"));
    c.qo.assign(7, 1);
    c.kv = {0, 1, 15, 512, 2049, 7, 4000};
    c.fp8 = Fp8KV::kE5M2;
    c.dtype = DType::kF16;
    c.page_size = 1;
    c.group = 5;
    c.head_dim = 64;
    cases.push_back(named(c, "odd_p1_sanitize"));
    for (Wrapper w : {Wrapper::kPrefillPaged, Wrapper::kPrefillRagged}) {
      RuntimeCase pc;
      pc.wrapper = w;
      pc.fp8 = w == Wrapper::kPrefillPaged ? Fp8KV::kE4M3 : Fp8KV::kE5M2;
      pc.qo = {1, 3, 17, 128, 577, 0, 40};
      pc.kv = {15, 3, 2049, 512, 1200, 9, 0};
      pc.page_size = 16;
      pc.causal = true;
      cases.push_back(named(pc, "mixed"));
      pc.head_dim = 256;
      pc.dtype = DType::kF16;
      cases.push_back(named(pc, "mixed"));
      pc.head_dim = 128;
      for (QueryTile t : {QueryTile::k16, QueryTile::k64, QueryTile::k128}) {
        pc.tile = t;
        cases.push_back(named(pc, "tile" + std::to_string(static_cast<int>(t))));
      }
      // The 128-row tile with bf16 queries (on Hopper the wgmma tile, whose producer converts each
      // stage) under the sanitizers.
      RuntimeCase sc = pc;
      sc.dtype = DType::kBF16;
      sc.qo = {3, 130, 0, 40};
      sc.kv = {15, 300, 9, 200};
      cases.push_back(named(sc, "tile128_bf16_sanitize"));
    }
    // FP8 attention (e4m3 q too): paged and ragged, mixed lengths, causal or not, D128 and D256,
    // split over the grid (sm_budget 8) and not (kNone).
    for (Wrapper w : {Wrapper::kPrefillPaged, Wrapper::kPrefillRagged}) {
      RuntimeCase fc;
      fc.wrapper = w;
      fc.fp8 = Fp8KV::kE4M3;
      fc.fp8_q = true;
      fc.qo = {1, 3, 17, 128, 577, 0, 40};
      fc.kv = {15, 3, 2049, 512, 1200, 9, 0};
      fc.page_size = w == Wrapper::kPrefillPaged ? 16 : 1;
      fc.causal = w == Wrapper::kPrefillPaged;
      cases.push_back(named(fc, "fp8attn_mixed"));
      fc.head_dim = 256;
      fc.dtype = DType::kF16;
      fc.sm_budget = 8;
      cases.push_back(named(fc, "fp8attn_split"));
      fc.head_dim = 128;
      fc.split = SplitKV::kNone;
      fc.sm_budget = 0;
      cases.push_back(named(fc, "fp8attn_nosplit_sanitize"));
    }
    RuntimeCase bc;
    bc.wrapper = Wrapper::kBlockSparse;
    bc.fp8 = Fp8KV::kE4M3;
    bc.qo = {300};
    bc.kv = {2100};
    bc.block_rows = 16;
    bc.block_cols = 64;
    cases.push_back(named(bc, "b16x64"));
  }
  // Tree masks (speculative verification: a token tree of 1-40 tokens after a long prefix), paged
  // and ragged, with and without causal, split over the KV (sm_budget 8) and on every tile.
  for (const QueryTile tile : {QueryTile::kAuto, QueryTile::k16, QueryTile::k128}) {
    RuntimeCase c;
    c.wrapper = tile == QueryTile::k16 ? Wrapper::kPrefillRagged : Wrapper::kPrefillPaged;
    c.tree_mask = true;
    c.tile = tile;
    c.qo = {8, 1, 40, 5};
    c.kv = {3000, 6, 300, 1029};
    c.causal = tile == QueryTile::k16;
    cases.push_back(named(c, std::string("tree_") + (tile == QueryTile::kAuto ? "auto" : tile == QueryTile::k16 ? "t16" : "t128") +
                                 (tile == QueryTile::kAuto ? "_sanitize" : "")));
    c.sm_budget = 8;
    c.dtype = DType::kF16;
    cases.push_back(named(c, std::string("tree_split_") + (tile == QueryTile::kAuto ? "auto" : tile == QueryTile::k16 ? "t16" : "t128")));
  }
  // Masks that hide whole KV tiles (the runtime's mask tile lists skip them; the hidden K/V rows
  // are NaN): every tile, paged and ragged, causal or not, split by the planner (auto), at fixed
  // 256-key chunks (items inside a request's hole visit no tile) and not at all. A request of
  // 40000 keys gives items of more tiles than the flags have bits (a bit per few tiles).
  for (const QueryTile tile : {QueryTile::kAuto, QueryTile::k16, QueryTile::k64, QueryTile::k128}) {
    for (const bool causal : {false, true}) {
      RuntimeCase c;
      c.wrapper = causal ? Wrapper::kPrefillRagged : Wrapper::kPrefillPaged;
      c.hidden_tiles = true;
      c.tile = tile;
      c.causal = causal;
      c.qo = {300, 40, 7, 4, 3};
      c.kv = {2100, 5000, 300, 700, 40000};
      const int mode = static_cast<int>(tile) + (causal ? 1 : 0);
      c.split = mode % 3 == 0 ? SplitKV::kAuto : mode % 3 == 1 ? SplitKV::kFixed : SplitKV::kNone;
      c.fixed_split = c.split == SplitKV::kFixed ? 256 : 0;
      if (causal) c.dtype = DType::kF16;
      const char* tile_name = tile == QueryTile::kAuto ? "auto" : tile == QueryTile::k16 ? "t16"
                              : tile == QueryTile::k64 ? "t64" : "t128";
      cases.push_back(named(c, std::string("hidden_tiles_") + tile_name + (causal ? "_causal" : "") +
                                   (tile == QueryTile::k128 && !causal ? "_sanitize" : "")));
    }
  }
  // Short trees (<= 32 packed rows a request): the auto tile is then the 16-row one.
  {
    RuntimeCase c;
    c.wrapper = Wrapper::kPrefillPaged;
    c.tree_mask = true;
    c.qo = {2, 8, 4, 1, 8};
    c.kv = {4000, 70, 1500, 3, 2200};
    cases.push_back(named(c, "tree_short"));
  }
  // Block-sparse, including vector sparsity (Bc = 1).
  {
    RuntimeCase c;
    c.wrapper = Wrapper::kBlockSparse;
    c.qo = {300};
    c.kv = {2100};
    c.block_rows = 16;
    c.block_cols = 64;
    cases.push_back(named(c, "b16x64_sanitize"));
    c.block_rows = 5;
    c.block_cols = 1;
    c.causal = true;
    c.dtype = DType::kF16;
    cases.push_back(named(c, "b5x1"));
  }
  return cases;
}

class RuntimeTest : public ::testing::TestWithParam<RuntimeCase> {};

TEST_P(RuntimeTest, MatchesOracle) {
  const RuntimeCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  Prepared p = prepare(c, rng);
  const auto bounds = bounds_for(c, p.rows);
  const auto options = options_for(c);
  Workspace ws(AnyWrapper::workspace_size(c, bounds, options));
  AnyWrapper w(c, ws.view, bounds, options);
  if (c.fp8_q && !device_is_sm90()) {
    // FP8 attention runs on sm_90a only: elsewhere its plan is a named error, never a fallback.
    expect_error_any([&] { w.plan(p, shape_for(c, p)); }, {"sm_90a"}, tessera::StatusCode::kUnsupported);
    return;
  }
  w.plan(p, shape_for(c, p));
  w.run(p, c.with_lse);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  check_against_oracle(c, p, c.name);
  EXPECT_EQ(padding_changes(p.o), 0u);
  const tessera::PlanInfo& info = w.info();
  if (c.split == SplitKV::kNone) EXPECT_EQ(info.num_partials, 0);
  ASSERT_GE(info.heads_per_cta, 1);
  EXPECT_EQ(c.num_kv_heads % info.heads_per_cta, 0);
  if (c.head_groups_with_wgmma && wgmma_tile_in_use()) EXPECT_GT(info.heads_per_cta, 1) << "grid " << info.grid_cols;
  // A long single request must be split over the grid (that is the point of split-KV).
  if (c.wrapper == Wrapper::kDecode && c.qo.size() == 1 && c.kv[0] >= 16384 && c.split == SplitKV::kAuto) {
    EXPECT_GT(info.num_partials, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, RuntimeTest, ::testing::ValuesIn(runtime_cases()),
                         [](const ::testing::TestParamInfo<RuntimeCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// User variants (a FlexAttention-style mask_mod and score_mod, as the Python front end traces them)
// through the runtime: a document mask from a captured tensor and an ALiBi bias from a captured
// slope table, against the oracle's custom mask and ALiBi; paged prefill with every split mode, and
// decode.

constexpr const char* kRuntimeDocMaskSource = R"(// runtime user variant: mask_mod (runtime tests)
bool same_doc(const Params& params, int b, int h, int q_idx, int kv_idx) {
  const int32_t* docs = params.docs + params.doc_offset[b];
  return docs[q_idx] == docs[kv_idx];
}
)";
constexpr const char* kRuntimeAlibiSource = R"(// runtime user variant: score_mod (runtime tests)
float alibi_bias(const Params& params, float score, int b, int h, int q_idx, int kv_idx) {
  return score + params.slopes[h] * static_cast<float>(kv_idx - q_idx);
}
)";

void run_user_variant_case(bool decode, SplitKV split, std::mt19937_64& rng) {
  const int64_t hkv = 2, g = 4, hq = hkv * g, d = 128, page = 16;
  const DType dtype = DType::kBF16;
  const std::vector<int64_t> kv = decode ? std::vector<int64_t>{300, 4100, 64, 1000}
                                         : std::vector<int64_t>{300, 1000, 4100, 64};
  const std::vector<int64_t> qo = decode ? std::vector<int64_t>{1, 1, 1, 1} : std::vector<int64_t>{1, 7, 40, 3};
  const size_t batch = kv.size();
  // Documents: runs of 1-400 positions per request.
  std::vector<int32_t> docs, doc_offset;
  for (size_t b = 0; b < batch; ++b) {
    doc_offset.push_back(static_cast<int32_t>(docs.size()));
    int32_t doc = 0;
    for (int64_t j = 0; j < kv[b];) {
      const int64_t run = 1 + static_cast<int64_t>(rng() % 400);
      for (int64_t t = 0; t < run && j < kv[b]; ++t, ++j) docs.push_back(doc);
      ++doc;
    }
  }
  const std::vector<float> slopes = tessera::alibi_slopes(hq);
  tessera_ref::Options opts;
  opts.causal = true;
  opts.alibi_slopes.assign(slopes.begin(), slopes.end());
  opts.custom_mask_indptr = {0};
  for (size_t b = 0; b < batch; ++b) {
    const int32_t* doc = docs.data() + doc_offset[b];
    for (int64_t i = 0; i < qo[b]; ++i) {
      const int64_t pos = kv[b] - qo[b] + i;
      for (int64_t j = 0; j < kv[b]; ++j) opts.custom_mask.push_back(doc[pos] == doc[j] ? 1 : 0);
    }
    opts.custom_mask_indptr.push_back(static_cast<int64_t>(opts.custom_mask.size()));
  }
  std::vector<std::vector<double>> qs(batch), ks(batch), vs(batch);
  for (size_t b = 0; b < batch; ++b) {
    qs[b] = round_to(dtype, random_normal(qo[b] * hq * d, rng));
    ks[b] = round_to(dtype, random_normal(kv[b] * hkv * d, rng));
    vs[b] = round_to(dtype, random_normal(kv[b] * hkv * d, rng));
  }
  const Packed q = pack_rows(qs, hq * d);
  const auto cache = tessera_ref::build_paged(ks, vs, kv, hkv, d, page, tessera_ref::Layout::NHD, rng() | 1, 2, 0.0);
  const tessera_ref::State ref = tessera_ref::attention_paged(q.values, q.indptr, cache, {hq, hkv, d}, opts);
  const int64_t rows = q.indptr.back();
  DeviceTensor dq = upload_tensor(dtype, q.values, {rows, hq, d});
  DeviceTensor o = make_output(dtype, {rows, hq, d}), lse = make_output(DType::kF32, {rows, hq});
  DevicePaged paged = upload_paged(dtype, cache, Layout::kNHD, /*combined=*/false);
  DeviceBuffer d_docs = upload_i32(docs), d_offset = upload_i32(doc_offset);
  DeviceBuffer d_slopes(slopes.size() * sizeof(float));
  d_slopes.upload(slopes.data(), slopes.size() * sizeof(float));

  const tessera::MaskMod mask{kRuntimeDocMaskSource, "same_doc"};
  const tessera::ScoreMod score{kRuntimeAlibiSource, "alibi_bias"};
  const tessera::VariantSpec spec = tessera::flex_variant(
      "test_runtime_doc_alibi", &mask, &score,
      {tessera::VariantParam::device_tensor("docs", i32_view(d_docs, static_cast<int64_t>(docs.size()))),
       tessera::VariantParam::device_tensor("doc_offset", i32_view(d_offset, static_cast<int64_t>(batch))),
       tessera::VariantParam::device_tensor(
           "slopes", TensorView(d_slopes.get(), DType::kF32, {hq}, Device::cuda(0)))});
  tessera::PlanShape shape{hq, hkv, d, dtype, {}};
  shape.attention.causal = true;
  shape.attention.variant.user = &spec;
  const tessera::RuntimeBounds bounds{static_cast<int64_t>(batch), rows, hq, hkv, d};
  tessera::RuntimeOptions options;
  options.split_kv = split;
  options.fixed_split_size = split == SplitKV::kFixed ? 256 : 0;
  const tessera::PagedKVCache kvc{paged.view.k, paged.view.v, Layout::kNHD, paged.view.indices};
  tessera::PlanInfo info;
  if (decode) {
    Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
    tessera::BatchDecodeWrapper w(ws.view, bounds, options);
    w.plan(host_i32(cache.indptr), host_i32(cache.last_page_len), page, shape);
    w.run(dq.view, kvc, o.view, lse.view);
    info = w.plan_info();
  } else {
    Workspace ws(tessera::BatchPrefillPagedWrapper::workspace_size(bounds, options));
    tessera::BatchPrefillPagedWrapper w(ws.view, bounds, options);
    w.plan(host_i32(q.indptr), host_i32(cache.indptr), host_i32(cache.last_page_len), page, shape);
    w.run(dq.view, kvc, o.view, lse.view);
    info = w.plan_info();
  }
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  SCOPED_TRACE(std::string(decode ? "decode" : "prefill") + ", split chunks " + std::to_string(info.num_partials));
  if (split == SplitKV::kFixed) EXPECT_GT(info.num_partials, 0) << "the case must split a tile";
  const std::vector<double> o_host = read_tensor(o), lse_host = read_tensor(lse);
  expect_matches_oracle(dtype, o_host, &lse_host, ref, "runtime user variant");
}

TEST(RuntimeUserVariant, FlexMaskAndScoreModMatchOracle_sanitize) {
  std::mt19937_64 rng(test_seed());
  for (const SplitKV split : {SplitKV::kAuto, SplitKV::kFixed, SplitKV::kNone}) {
    SCOPED_TRACE("split_kv " + std::to_string(static_cast<int>(split)));
    run_user_variant_case(false, split, rng);
  }
  run_user_variant_case(true, SplitKV::kAuto, rng);
}

// ---------------------------------------------------------------------------------------------
// Softmax-free attention (sigmoid, user variants with use_softmax = false) has no log-sum-exp to
// merge split chunks by: its plans never split, whatever options.split_kv asks, and match the
// oracle. Each case is long enough that the same plan with softmax splits (checked first).

TEST(RuntimeSoftmaxFree, SigmoidAndUserWeightsNeverSplitAndMatchOracle_sanitize) {
  std::mt19937_64 rng(test_seed());
  std::vector<RuntimeCase> cases;
  RuntimeCase c;
  c.with_lse = false;
  c.wrapper = Wrapper::kDecode;
  c.qo = {1, 1, 1};
  c.kv = {20000, 3, 1500};
  cases.push_back(named(c, "sigmoid_free"));
  c.wrapper = Wrapper::kPrefillPaged;
  c.qo = {5, 1, 33};
  c.kv = {17000, 1, 700};
  c.page_size = 1;
  c.causal = true;
  c.dtype = DType::kF16;
  cases.push_back(named(c, "sigmoid_free"));
  c.wrapper = Wrapper::kPrefillRagged;
  c.qo = {3, 70};
  c.kv = {18000, 300};
  c.num_kv_heads = 1;
  c.group = 5;
  c.head_dim = 64;
  cases.push_back(named(c, "sigmoid_free"));
  for (const SplitKV split : {SplitKV::kAuto, SplitKV::kFixed}) {
    for (RuntimeCase base : cases) {
      base.split = split;
      base.fixed_split = split == SplitKV::kFixed ? 1024 : 0;
      for (const SoftmaxFree kind : {SoftmaxFree::kSigmoid, SoftmaxFree::kUserWeights}) {
        RuntimeCase k = base;
        k.softmax_free = kind;
        SCOPED_TRACE(k.name + (kind == SoftmaxFree::kSigmoid ? " sigmoid" : " user weights") +
                     (split == SplitKV::kFixed ? " fixed split" : " auto split"));
        Prepared p = prepare(k, rng);
        const auto bounds = bounds_for(k, p.rows);
        const auto options = options_for(k);
        Workspace ws(AnyWrapper::workspace_size(k, bounds, options));
        AnyWrapper w(k, ws.view, bounds, options);
        w.plan(p, shape_for(base));  // the same batch with softmax: split
        ASSERT_GT(w.info().num_partials, 0) << "the case must split with softmax";
        w.plan(p, shape_for(k));
        EXPECT_EQ(w.info().num_partials, 0);
        EXPECT_EQ(w.info().num_merges, 0);
        w.run(p, false);
        ASSERT_CUDA_OK(cudaDeviceSynchronize());
        check_against_oracle(k, p, k.name);
        EXPECT_EQ(padding_changes(p.o), 0u);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism, agreement with the one-shot kernels, batch invariance.

std::vector<unsigned char> run_bytes(AnyWrapper& w, Prepared& p, bool lse) {
  cudaMemset(p.o.buf.get(), 0xFF, p.o.buf.bytes());
  w.run(p, lse);
  cudaDeviceSynchronize();
  return read_bytes(p.o);
}

TEST(RuntimeDeterminism, TenRunsAreBitIdentical_sanitize) {
  RuntimeCase c;
  c.wrapper = Wrapper::kDecode;
  c.qo.assign(5, 1);
  c.kv = {20000, 3, 9000, 1, 40000};
  c.num_kv_heads = 8;
  std::mt19937_64 rng(test_seed());
  Prepared p = prepare(c, rng);
  const auto bounds = bounds_for(c, p.rows);
  Workspace ws(AnyWrapper::workspace_size(c, bounds, {}));
  AnyWrapper w(c, ws.view, bounds, {});
  w.plan(p, shape_for(c));
  ASSERT_GT(w.info().num_merges, 0) << "the case must exercise the merge";
  const auto first = run_bytes(w, p, true);
  for (int i = 1; i < 10; ++i) EXPECT_EQ(run_bytes(w, p, true), first) << "run " << i;
}

TEST(RuntimeAgreement, MatchesOneShotKernels) {
  RuntimeCase c;
  c.wrapper = Wrapper::kDecode;
  c.qo.assign(9, 1);
  c.kv = {30000, 1, 4000, 0, 777, 12000, 64, 65, 3};
  c.num_kv_heads = 4;
  std::mt19937_64 rng(test_seed());
  Prepared p = prepare(c, rng);
  const auto bounds = bounds_for(c, p.rows);
  Workspace ws(AnyWrapper::workspace_size(c, bounds, {}));
  AnyWrapper w(c, ws.view, bounds, {});
  w.plan(p, shape_for(c));
  w.run(p, true);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> split = read_tensor(p.o);
  tessera::batch_decode_paged(p.q.view, p.paged.view, p.o.view, p.lse.view, {}, nullptr,
                              tessera::DecodeKernel::kTensorCores);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<double> whole = read_tensor(p.o);
  double num = 0, den = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    num += (split[i] - whole[i]) * (split[i] - whole[i]);
    den += whole[i] * whole[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), rel_tolerance(c.dtype));
  check_against_oracle(c, p, "one-shot");
}

/// A workspace between min_workspace_size and workspace_size holds fewer split states: plan() splits
/// less (none at the minimum) and the results still match the oracle; below the minimum the
/// constructor names the size. Head dim 256 (whose workspace_size is the largest) over ragged and
/// paged KV, and decode.
TEST(RuntimeWorkspace, SmallerWorkspacesSplitLessAndStayCorrect) {
  for (const Wrapper kind : {Wrapper::kPrefillRagged, Wrapper::kPrefillPaged, Wrapper::kDecode}) {
    RuntimeCase c;
    c.wrapper = kind;
    c.head_dim = kind == Wrapper::kDecode ? 128 : 256;
    c.num_kv_heads = 2;
    c.group = 4;
    c.qo = kind == Wrapper::kDecode ? std::vector<int64_t>{1, 1, 1} : std::vector<int64_t>{37, 1, 300};
    c.kv = {9000, 3000, 12000};
    c.causal = kind != Wrapper::kDecode;
    std::mt19937_64 rng(test_seed());
    Prepared p = prepare(c, rng);
    const auto bounds = bounds_for(c, p.rows);
    const int64_t full = AnyWrapper::workspace_size(c, bounds, {});
    const int64_t min = AnyWrapper::min_workspace_size(c, bounds, {});
    ASSERT_GT(min, 0);
    ASSERT_LT(min, full);
    int32_t partials_full = 0;
    for (const int64_t bytes : {full, min + (full - min) / 8, min}) {
      SCOPED_TRACE(std::string(wrapper_name(kind)) + ", workspace " + std::to_string(bytes) + " of " +
                   std::to_string(full) + " bytes");
      Workspace ws(bytes);
      AnyWrapper w(c, ws.view, bounds, {});
      w.plan(p, shape_for(c));
      w.run(p, true);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      check_against_oracle(c, p, "a workspace of " + std::to_string(bytes) + " bytes");
      const int32_t partials = w.info().num_partials;
      if (bytes == full) {
        partials_full = partials;
        EXPECT_GT(partials, 0) << "the case must split at the full size";
      } else {
        EXPECT_LE(partials, partials_full);
      }
      if (bytes == min) EXPECT_EQ(partials, 0) << "no room for a split state's output";
    }
    Workspace small(min - 256);
    expect_error_any([&] { AnyWrapper w(c, small.view, bounds, {}); },
                     {("expected >= " + std::to_string(min) + " (min_workspace_size").c_str()},
                     StatusCode::kInvalidArgument);
  }
}

/// With a fixed split size a request's output bits do not depend on the rest of the batch.
TEST(RuntimeBatchInvariance, FixedSplitGivesTheSameBitsInAnyBatch) {
  std::mt19937_64 rng(test_seed());
  const int64_t hkv = 2, g = 4, d = 128;
  RuntimeCase c;
  c.wrapper = Wrapper::kPrefillRagged;
  c.split = SplitKV::kFixed;
  c.fixed_split = 512;
  c.tile = QueryTile::k64;
  c.causal = true;
  c.num_kv_heads = hkv;
  c.group = g;
  c.head_dim = d;
  // Request X (qo 70, kv 5000) alone, then as request 2 of a batch of 4.
  const int64_t x_qo = 70, x_kv = 5000;
  const auto q_x = round_to(c.dtype, random_normal(x_qo * hkv * g * d, rng));
  const auto k_x = round_to(c.dtype, random_normal(x_kv * hkv * d, rng));
  const auto v_x = round_to(c.dtype, random_normal(x_kv * hkv * d, rng));
  auto run_batch = [&](const std::vector<int64_t>& qo, const std::vector<int64_t>& kv, size_t x_index) {
    std::vector<std::vector<double>> qs, ks, vs;
    for (size_t b = 0; b < qo.size(); ++b) {
      if (b == x_index) {
        qs.push_back(q_x), ks.push_back(k_x), vs.push_back(v_x);
      } else {
        qs.push_back(random_normal(qo[b] * hkv * g * d, rng));
        ks.push_back(random_normal(kv[b] * hkv * d, rng));
        vs.push_back(random_normal(kv[b] * hkv * d, rng));
      }
    }
    const Packed q = pack_rows(qs, hkv * g * d), k = pack_rows(ks, hkv * d), v = pack_rows(vs, hkv * d);
    DeviceTensor qd = upload_tensor(c.dtype, q.values, {q.indptr.back(), hkv * g, d});
    DeviceTensor kd = upload_tensor(c.dtype, k.values, {k.indptr.back(), hkv, d});
    DeviceTensor vd = upload_tensor(c.dtype, v.values, {v.indptr.back(), hkv, d});
    DeviceTensor od = make_output(c.dtype, {q.indptr.back(), hkv * g, d});
    tessera::RuntimeBounds b{8, 8192, hkv * g, hkv, d};
    Workspace ws(tessera::BatchPrefillRaggedWrapper::workspace_size(b, options_for(c)));
    tessera::BatchPrefillRaggedWrapper w(ws.view, b, options_for(c));
    w.plan(host_i32(q.indptr), host_i32(k.indptr), shape_for(c));
    w.run(qd.view, kd.view, vd.view, od.view);
    cudaDeviceSynchronize();
    const auto bytes = read_bytes(od);
    const size_t row_bytes = static_cast<size_t>(hkv * g * d * 2);
    return std::vector<unsigned char>(bytes.begin() + q.indptr[x_index] * row_bytes,
                                      bytes.begin() + q.indptr[x_index + 1] * row_bytes);
  };
  const auto alone = run_batch({x_qo}, {x_kv}, 0);
  const auto in_batch = run_batch({30, 5, x_qo, 100}, {7000, 5, x_kv, 9000}, 2);
  EXPECT_EQ(alone, in_batch);
}

// ---------------------------------------------------------------------------------------------
// CUDA Graphs: capture run() once, re-plan 5 times with different batches, replay.

TEST(RuntimeCudaGraph, ReplaysCorrectlyAfterReplans) {
  const int64_t hkv = 4, g = 4, d = 128, page = 16, max_batch = 32, max_pages = 8192;
  const DType dtype = DType::kBF16;
  tessera::RuntimeBounds bounds{max_batch, max_batch, hkv * g, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = dtype;
  Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
  tessera::BatchDecodeWrapper wrapper(ws.view, bounds, options);
  // Fixed buffers, as a serving engine keeps them.
  DeviceBuffer q_buf(max_batch * hkv * g * d * 2), o_buf(max_batch * hkv * g * d * 2), lse_buf(max_batch * hkv * g * 4);
  DeviceBuffer k_buf(max_pages * page * hkv * d * 2), v_buf(max_pages * page * hkv * d * 2), idx_buf(max_pages * 4);
  const TensorView q(q_buf.get(), dtype, {max_batch, hkv * g, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), dtype, {max_batch, hkv * g, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_batch, hkv * g}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = TensorView(k_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.v = TensorView(v_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.indices = TensorView(idx_buf.get(), DType::kI32, {max_pages}, Device::cuda(0));

  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<int64_t> batches = {3, 17, 32, 1, 9, 25};
  for (size_t step = 0; step < batches.size(); ++step) {
    const int64_t batch = batches[step];
    std::vector<int64_t> kv(batch);
    std::uniform_int_distribution<int64_t> len(0, step % 2 ? 3000 : 60000 / batch);
    for (auto& x : kv) x = len(rng);
    if (step == 3) kv[0] = 40000;  // one long request: split over the grid
    std::vector<std::vector<double>> ks(batch), vs(batch), qs(batch);
    for (int64_t b = 0; b < batch; ++b) {
      qs[b] = round_to(dtype, random_normal(hkv * g * d, rng));
      ks[b] = round_to(dtype, random_normal(kv[b] * hkv * d, rng));
      vs[b] = round_to(dtype, random_normal(kv[b] * hkv * d, rng));
    }
    const auto ref_cache = tessera_ref::build_paged(ks, vs, kv, hkv, d, page, tessera_ref::Layout::NHD, rng() | 1, 0, 0.0);
    ASSERT_LE(ref_cache.num_pages, max_pages);
    const Packed qp = pack_rows(qs, hkv * g * d);
    const auto ref = tessera_ref::attention_paged(qp.values, qp.indptr, ref_cache, {hkv * g, hkv, d}, {});
    // Update the fixed buffers' contents, then plan (outside the capture) and replay.
    DeviceBuffer qs_dev = upload_as(dtype, qp.values), k_dev = upload_as(dtype, ref_cache.k_pages),
                 v_dev = upload_as(dtype, ref_cache.v_pages);
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), qs_dev.get(), qs_dev.bytes(), cudaMemcpyDeviceToDevice));
    if (ref_cache.num_pages > 0) {
      ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), k_dev.get(), k_dev.bytes(), cudaMemcpyDeviceToDevice));
      ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), v_dev.get(), v_dev.bytes(), cudaMemcpyDeviceToDevice));
      ASSERT_CUDA_OK(cudaMemcpy(idx_buf.get(), ref_cache.indices.data(), ref_cache.indices.size() * 4,
                                cudaMemcpyHostToDevice));
    }
    ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
    ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
    tessera::PlanShape shape{hkv * g, hkv, d, dtype, {}};
    wrapper.plan(host_i32(ref_cache.indptr), host_i32(ref_cache.last_page_len), page, shape, stream);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      wrapper.run(q, cache, o, lse, stream);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_CUDA_OK(cudaGraphDestroy(graph));
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    const auto o_host = download_as(dtype, o_buf.get(), batch * hkv * g * d);
    const auto lse_host = download_as(DType::kF32, lse_buf.get(), batch * hkv * g);
    SCOPED_TRACE("step " + std::to_string(step) + ", batch " + std::to_string(batch) + ", partials " +
                 std::to_string(wrapper.plan_info().num_partials));
    expect_matches_oracle(dtype, o_host, &lse_host, ref, "graph replay");
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

/// fp8 K/V under a captured decode: per-KV-head device scales change between replays (and the
/// cache between re-plans); every replay matches the oracle on the codes times the current scales.
/// Custom masks under CUDA graphs: the mask bits live in a fixed buffer whose contents change, the
/// byte offsets come with each plan (host arrays, uploaded into the workspace); re-plans change the
/// batch size, the masks (trees, and masks that hide whole KV tiles) and the split.
TEST(RuntimeCudaGraph, TreeMaskReplaysAfterReplans_sanitize) {
  const int64_t hkv = 2, g = 4, d = 128, page = 16, max_batch = 6, max_rows = 64, max_pages = 1024;
  const int64_t hq = hkv * g;
  const DType dtype = DType::kBF16;
  tessera::RuntimeBounds bounds{max_batch, max_rows, hq, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = dtype;
  Workspace ws(tessera::BatchPrefillPagedWrapper::workspace_size(bounds, options));
  tessera::BatchPrefillPagedWrapper wrapper(ws.view, bounds, options);
  DeviceBuffer q_buf(max_rows * hq * d * 2), o_buf(max_rows * hq * d * 2), lse_buf(max_rows * hq * 4);
  DeviceBuffer k_buf(max_pages * page * hkv * d * 2), v_buf(max_pages * page * hkv * d * 2), idx_buf(max_pages * 4);
  DeviceBuffer mask_buf(1 << 20);
  const TensorView q(q_buf.get(), dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_rows, hq}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = TensorView(k_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.v = TensorView(v_buf.get(), dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.indices = TensorView(idx_buf.get(), DType::kI32, {max_pages}, Device::cuda(0));
  Stream stream;
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<std::vector<int64_t>> qos = {{8, 3}, {1, 16, 7, 8, 2, 9}, {40}, {5, 5, 5}};
  const std::vector<std::vector<int64_t>> kvs = {{2000, 40}, {9, 4000, 100, 8, 700, 64}, {5000}, {5, 300, 1200}};
  for (size_t step = 0; step < qos.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    RuntimeCase c;
    c.wrapper = Wrapper::kPrefillPaged;
    // Steps 1 and 2 hide whole KV tiles (NaN K/V there): the captured flags kernel reads each
    // plan's items and mask.
    c.hidden_tiles = step == 1 || step == 2;
    c.tree_mask = !c.hidden_tiles;
    c.qo = qos[step];
    c.kv = kvs[step];
    c.num_kv_heads = hkv;
    c.group = g;
    c.head_dim = d;
    c.page_size = page;
    Prepared p = prepare(c, rng);
    ASSERT_LE(p.rows, max_rows);
    ASSERT_LE(p.paged.k.view.shape[0], max_pages);
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), p.q.view.data, p.q.view.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), p.paged.k.view.data, p.paged.k.view.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), p.paged.v.view.data, p.paged.v.view.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(idx_buf.get(), p.cache.indices.data, p.cache.indices.nbytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(mask_buf.get(), p.mask.get(), p.mask.bytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
    ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
    tessera::PlanShape shape = shape_for(c);
    shape.attention.variant.custom_mask =
        TensorView(mask_buf.get(), DType::kU8, {static_cast<int64_t>(mask_buf.bytes())}, Device::cuda(0));
    shape.attention.variant.custom_mask_indptr = host_i32(p.mask_indptr);
    wrapper.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), host_i32(p.last_page_len), page, shape, stream.s);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
      wrapper.run(q, cache, o, lse, stream.s);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream.s, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream.s));
    const size_t rows = static_cast<size_t>(p.rows * hq);
    const std::vector<double> out = download_as(dtype, o_buf.get(), rows * d);
    const std::vector<double> out_lse = download_as(DType::kF32, lse_buf.get(), rows);
    expect_matches_oracle(dtype, out, &out_lse, p.ref, "tree mask replay");
    if (step == 1) EXPECT_GT(wrapper.plan_info().num_merges, 0) << "step 1's long request was not split";
  }
  cudaGraphExecDestroy(exec);
}

TEST(RuntimeCudaGraph, Fp8ReplaysReadTheCurrentDeviceScales) {
  const int64_t hkv = 2, g = 4, d = 128, page = 16, max_batch = 8, max_pages = 4096;
  const DType dtype = DType::kBF16, kv_dtype = DType::kE4M3;
  tessera::RuntimeBounds bounds{max_batch, max_batch, hkv * g, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = dtype;
  options.kv_dtype = kv_dtype;
  Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
  tessera::BatchDecodeWrapper wrapper(ws.view, bounds, options);
  DeviceBuffer q_buf(max_batch * hkv * g * d * 2), o_buf(max_batch * hkv * g * d * 2), lse_buf(max_batch * hkv * g * 4);
  DeviceBuffer k_buf(max_pages * page * hkv * d), v_buf(max_pages * page * hkv * d), idx_buf(max_pages * 4);
  DeviceBuffer k_scale(hkv * 4), v_scale(hkv * 4);
  const TensorView q(q_buf.get(), dtype, {max_batch, hkv * g, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), dtype, {max_batch, hkv * g, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_batch, hkv * g}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = TensorView(k_buf.get(), kv_dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.v = TensorView(v_buf.get(), kv_dtype, {max_pages, page, hkv, d}, Device::cuda(0));
  cache.indices = TensorView(idx_buf.get(), DType::kI32, {max_pages}, Device::cuda(0));
  tessera::PlanShape shape{hkv * g, hkv, d, dtype, kv_dtype, {}};
  shape.attention.kv_scales.k = 0.5;
  shape.attention.kv_scales.v = 0.25;
  shape.attention.kv_scales.k_device = TensorView(k_scale.get(), DType::kF32, {hkv}, Device::cuda(0));
  shape.attention.kv_scales.v_device = TensorView(v_scale.get(), DType::kF32, {hkv}, Device::cuda(0));

  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<int64_t> batches = {3, 8, 1};
  for (size_t step = 0; step < batches.size(); ++step) {
    const int64_t batch = batches[step];
    std::vector<int64_t> kv(batch);
    std::uniform_int_distribution<int64_t> len(0, 5000);
    for (auto& x : kv) x = len(rng);
    std::vector<std::vector<double>> k_codes(batch), v_codes(batch), qs(batch);
    for (int64_t b = 0; b < batch; ++b) {
      qs[b] = round_to(dtype, random_normal(hkv * g * d, rng));
      k_codes[b] = round_to(kv_dtype, random_normal(kv[b] * hkv * d, rng, 16.0));
      v_codes[b] = round_to(kv_dtype, random_normal(kv[b] * hkv * d, rng, 16.0));
    }
    const uint64_t page_seed = rng() | 1;
    const auto codes = tessera_ref::build_paged(k_codes, v_codes, kv, hkv, d, page, tessera_ref::Layout::NHD,
                                                page_seed, 0, 0.0);
    ASSERT_LE(codes.num_pages, max_pages);
    const Packed qp = pack_rows(qs, hkv * g * d);
    DeviceBuffer q_dev = upload_as(dtype, qp.values), k_dev = upload_as(kv_dtype, codes.k_pages),
                 v_dev = upload_as(kv_dtype, codes.v_pages);
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), q_dev.get(), q_dev.bytes(), cudaMemcpyDeviceToDevice));
    if (codes.num_pages > 0) {
      ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), k_dev.get(), k_dev.bytes(), cudaMemcpyDeviceToDevice));
      ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), v_dev.get(), v_dev.bytes(), cudaMemcpyDeviceToDevice));
      ASSERT_CUDA_OK(cudaMemcpy(idx_buf.get(), codes.indices.data(), codes.indices.size() * 4, cudaMemcpyHostToDevice));
    }
    wrapper.plan(host_i32(codes.indptr), host_i32(codes.last_page_len), page, shape, stream);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      wrapper.run(q, cache, o, lse, stream);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_CUDA_OK(cudaGraphDestroy(graph));
    }
    // Two replays per plan, each with new device scales (per KV head).
    for (int replay = 0; replay < 2; ++replay) {
      std::uniform_int_distribution<int> factor(4, 12);
      const std::vector<float> ks = {factor(rng) / 64.0f, factor(rng) / 64.0f};
      const std::vector<float> vs = {factor(rng) / 32.0f, factor(rng) / 32.0f};
      ASSERT_CUDA_OK(cudaMemcpy(k_scale.get(), ks.data(), 8, cudaMemcpyHostToDevice));
      ASSERT_CUDA_OK(cudaMemcpy(v_scale.get(), vs.data(), 8, cudaMemcpyHostToDevice));
      ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
      ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
      ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
      tessera_ref::PagedCache values = codes;
      for (size_t i = 0; i < values.k_pages.size(); ++i) {
        const size_t h = (i / d) % hkv;  // NHD pages: [page, slot, head, d]
        values.k_pages[i] *= 0.5 * ks[h];
        values.v_pages[i] *= 0.25 * vs[h];
      }
      const auto ref = tessera_ref::attention_paged(qp.values, qp.indptr, values, {hkv * g, hkv, d}, {});
      const auto o_host = download_as(dtype, o_buf.get(), batch * hkv * g * d);
      const auto lse_host = download_as(DType::kF32, lse_buf.get(), batch * hkv * g);
      SCOPED_TRACE("step " + std::to_string(step) + ", replay " + std::to_string(replay));
      expect_matches_oracle(dtype, o_host, &lse_host, ref, "fp8 graph replay");
    }
  }
  // A plan that changes the host factors is an error under cuda_graph (the capture has them).
  tessera::PlanShape changed = shape;
  changed.attention.kv_scales.k = 1.0;
  const std::vector<int32_t> one_page_indptr = {0, 1}, one_len = {1};
  expect_error_any([&] { wrapper.plan(host_i32(one_page_indptr), host_i32(one_len), page, changed, stream); },
                   {"kv_scales"}, StatusCode::kInvalidArgument);
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(RuntimeErrors, BoundsWorkspaceAndPlanOrder) {
  RuntimeCase c;
  c.wrapper = Wrapper::kDecode;
  c.qo.assign(3, 1);
  c.kv = {100, 200, 300};
  std::mt19937_64 rng(test_seed());
  Prepared p = prepare(c, rng);
  tessera::RuntimeBounds bounds{2, 2, c.num_qo_heads(), c.num_kv_heads, c.head_dim};  // batch 3 > 2
  const int64_t bytes = tessera::BatchDecodeWrapper::workspace_size(bounds);
  Workspace ws(bytes);
  Workspace small(tessera::BatchDecodeWrapper::min_workspace_size(bounds) - 256);
  expect_error_any([&] { tessera::BatchDecodeWrapper w(small.view, bounds); }, {"workspace has"},
                   StatusCode::kInvalidArgument);
  tessera::BatchDecodeWrapper w(ws.view, bounds);
  expect_error_any([&] { w.run(p.q.view, p.cache, p.o.view); }, {"before plan"}, StatusCode::kInvalidArgument);
  expect_error_any(
      [&] { w.plan(host_i32(p.kv_indptr), host_i32(p.last_page_len), c.page_size, shape_for(c)); },
      {"max_batch_size"}, StatusCode::kInvalidArgument);
  // Host arrays must be on the host; last_page_len in range; page size positive.
  DeviceBuffer dev_indptr = upload_i32(p.kv_indptr);
  const std::vector<int32_t> two_indptr(p.kv_indptr.begin(), p.kv_indptr.begin() + 3);
  const std::vector<int32_t> two_last(p.last_page_len.begin(), p.last_page_len.begin() + 2);
  expect_error_any([&] { w.plan(i32_view(dev_indptr, 3), host_i32(two_last), c.page_size, shape_for(c)); },
                   {"kv_indptr"}, StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_last = two_last;
  bad_last[1] = static_cast<int32_t>(c.page_size + 1);
  expect_error_any([&] { w.plan(host_i32(two_indptr), host_i32(bad_last), c.page_size, shape_for(c)); },
                   {"last_page_len[1]"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { w.plan(host_i32(two_indptr), host_i32(two_last), 0, shape_for(c)); }, {"page_size"},
                   StatusCode::kInvalidArgument);
  tessera::PlanShape big = shape_for(c);
  big.head_dim = 256;
  expect_error_any([&] { w.plan(host_i32(two_indptr), host_i32(two_last), c.page_size, big); }, {"head_dim"},
                   StatusCode::kInvalidArgument);
  // A valid plan, then run() with tensors that disagree with it.
  w.plan(host_i32(two_indptr), host_i32(two_last), c.page_size, shape_for(c));
  tessera::PagedKVCache wrong = p.cache;
  wrong.indices = i32_view(p.paged.indices, 1);
  expect_error_any([&] { w.run(p.q.view, wrong, p.o.view); }, {"kv.indices"}, StatusCode::kInvalidArgument);
  const TensorView q_f16(p.q.view.data, DType::kF16, {3, c.num_qo_heads(), c.head_dim}, Device::cuda(0));
  expect_error_any([&] { w.run(q_f16, p.cache, p.o.view); }, {"q.dtype"}, StatusCode::kInvalidArgument);
  // Options.
  tessera::RuntimeOptions fixed;
  fixed.split_kv = SplitKV::kFixed;
  fixed.fixed_split_size = 100;
  expect_error_any([&] { tessera::BatchDecodeWrapper x(ws.view, bounds, fixed); }, {"fixed_split_size"},
                   StatusCode::kInvalidArgument);
  tessera::RuntimeBounds zero = bounds;
  zero.max_batch_size = 0;
  expect_error_any([&] { tessera::BatchDecodeWrapper::workspace_size(zero); }, {"max_batch_size"},
                   StatusCode::kInvalidArgument);
}

TEST(RuntimeErrors, SplitHeadDimsNameTheArgument) {
  RuntimeCase c;
  c.wrapper = Wrapper::kPrefillRagged;
  c.head_dim = 192;
  c.head_dim_vo = 128;
  c.qo = {3, 5};
  c.kv = {40, 70};
  std::mt19937_64 rng(test_seed());
  Prepared p = prepare(c, rng);
  const tessera::RuntimeBounds bounds = bounds_for(c, p.rows);
  // A pair the table does not build; decode and block-sparse wrappers take equal head dims.
  tessera::RuntimeBounds odd = bounds;
  odd.head_dim_vo = 64;
  expect_error_any([&] { tessera::BatchPrefillRaggedWrapper::workspace_size(odd); }, {"bounds.head_dim_vo"},
                   StatusCode::kUnsupported);
  Workspace ws(tessera::BatchPrefillRaggedWrapper::workspace_size(bounds));
  expect_error_any([&] { tessera::BatchDecodeWrapper w(ws.view, bounds); }, {"bounds.head_dim_vo"},
                   StatusCode::kUnsupported);
  expect_error_any([&] { tessera::BlockSparseWrapper w(ws.view, bounds); }, {"bounds.head_dim_vo"},
                   StatusCode::kUnsupported);
  tessera::BatchPrefillRaggedWrapper w(ws.view, bounds);
  // A plan at other head dims than the bounds' pair, with a variant, or with fp8 K/V.
  tessera::PlanShape equal = shape_for(c);
  equal.head_dim_vo = 0;  // 192 / 192: no such head dim
  expect_error_any([&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), equal); }, {"head_dim"},
                   StatusCode::kUnsupported);
  tessera::PlanShape windowed = shape_for(c);
  windowed.attention.variant.window_left = 8;
  expect_error_any([&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), windowed); }, {"variant"},
                   StatusCode::kUnsupported);
  tessera::PlanShape fp8 = shape_for(c);
  fp8.kv_dtype = DType::kE4M3;
  expect_error_any([&] { w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), fp8); }, {"kv_dtype"},
                   StatusCode::kUnsupported);
  // A valid plan, then v or o of q's head dim.
  w.plan(host_i32(p.qo_indptr), host_i32(p.kv_indptr), shape_for(c));
  const TensorView v_wide(p.k.view.data, c.dtype, {p.k.view.shape[0], c.num_kv_heads, 192}, Device::cuda(0));
  expect_error_any([&] { w.run(p.q.view, p.k.view, v_wide, p.o.view); }, {"v.shape"}, StatusCode::kInvalidArgument);
  const TensorView o_wide(p.q.view.data, c.dtype, {p.rows, c.num_qo_heads(), 192}, Device::cuda(0));
  expect_error_any([&] { w.run(p.q.view, p.k.view, p.v.view, o_wide); }, {"o.shape"}, StatusCode::kInvalidArgument);
  w.run(p.q.view, p.k.view, p.v.view, p.o.view, p.lse.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  check_against_oracle(c, p, "split head dims after the errors");
}

TEST(RuntimeErrors, CudaGraphModeRejectsChangesTheCaptureBakedIn) {
  const int64_t hkv = 2, g = 4, d = 128;
  tessera::RuntimeBounds bounds{4, 4, hkv * g, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  Workspace ws(tessera::BatchDecodeWrapper::workspace_size(bounds, options));
  tessera::BatchDecodeWrapper w(ws.view, bounds, options);
  const std::vector<int32_t> indptr = {0, 1, 2}, last = {5, 7};
  tessera::PlanShape shape{hkv * g, hkv, d, DType::kBF16, {}};
  w.plan(host_i32(indptr), host_i32(last), 16, shape);
  expect_error_any([&] { w.plan(host_i32(indptr), host_i32(last), 32, shape); }, {"cuda_graph"},
                   StatusCode::kInvalidArgument);
  tessera::PlanShape causal = shape;
  causal.attention.causal = true;
  expect_error_any([&] { w.plan(host_i32(indptr), host_i32(last), 16, causal); }, {"cuda_graph"},
                   StatusCode::kInvalidArgument);
  tessera::PlanShape f16 = shape;
  f16.dtype = DType::kF16;
  expect_error_any([&] { w.plan(host_i32(indptr), host_i32(last), 16, f16); }, {"dtype"},
                   StatusCode::kInvalidArgument);
}

}  // namespace
