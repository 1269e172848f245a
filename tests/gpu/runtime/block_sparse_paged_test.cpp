// GPU tests of BatchBlockSparsePagedWrapper (include/tessera/runtime.h): block masks at logical
// positions over a paged KV cache, against the fp64 oracle (paged attention with the block mask
// expanded into a per-request custom mask); page sizes 1 and 16, block shapes down to single
// rows and columns, empty block rows and requests, full-block flags, causal and windowed masks, a
// user mask that reads the request index; CUDA Graph replay after re-plans; named errors. Inputs
// are fresh random values, outputs poisoned (NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "gpu/runtime/runtime_test_utils.h"
#include "reference/oracle.h"
#include "tessera/runtime.h"
#include "tessera/variant.h"

namespace {

using tessera::Device;
using tessera::DType;
using tessera::Layout;
using tessera::SplitKV;
using tessera::StatusCode;
using tessera::TensorView;
using namespace tessera_test;
using namespace tessera_test::attn;

struct MaskCase {
  const char* name;
  int64_t page_size;
  int64_t block_rows, block_cols;  // Br, Bc
  int64_t group;                   // query heads per KV head
  int64_t head_dim;
  bool causal;
  int64_t window_left;  // -1: none
  bool flags;           // flag the blocks every mask leaves whole
  bool user_mask;       // a JIT mask that reads the request index
  SplitKV split;
  DType dtype;
  Layout layout;
};

void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

// A mask_mod that depends on the request (b) and on logical positions: drops every key whose
// position is congruent to the request index modulo 5 (the query's own key stays visible).
constexpr const char* kRequestMaskSource = R"(// block-sparse paged test: mask_mod
bool drop_request_residue(const Params& params, int b, int h, int q_idx, int kv_idx) {
  return kv_idx == q_idx || kv_idx % 5 != b % 5;
}
)";

/// A batch of requests, its paged cache and its block mask, with the oracle's answer.
struct MaskedBatch {
  std::vector<int64_t> qo, kv;
  Packed q;
  tessera_ref::PagedCache cache;
  std::vector<int32_t> mask_indptr{0}, mask_indices;
  std::vector<uint8_t> mask_flags;
  tessera_ref::State ref;
  int64_t rows() const { return q.indptr.back(); }
  int64_t block_rows_total() const { return static_cast<int64_t>(mask_indptr.size()) - 1; }
};

/// Whether key `j` is visible to query `i` of a request (qo x kv) under the case's element masks
/// (not the block set).
bool element_visible(const MaskCase& c, int64_t b, int64_t qo, int64_t kv, int64_t i, int64_t j) {
  const int64_t pos = kv - qo + i;
  if (c.causal && j > pos) return false;
  if (c.window_left >= 0 && j < pos - c.window_left) return false;
  if (c.user_mask && !(j == pos || j % 5 != b % 5)) return false;
  return true;
}

MaskedBatch make_batch(const MaskCase& c, const std::vector<int64_t>& qo, const std::vector<int64_t>& kv,
                       int64_t hkv, std::mt19937_64& rng, double keep) {
  const int64_t hq = hkv * c.group, d = c.head_dim, br = c.block_rows, bc = c.block_cols;
  MaskedBatch m;
  m.qo = qo;
  m.kv = kv;
  const size_t batch = qo.size();
  std::vector<std::vector<double>> qs(batch), ks(batch), vs(batch);
  for (size_t b = 0; b < batch; ++b) {
    qs[b] = round_to(c.dtype, random_normal(qo[b] * hq * d, rng));
    ks[b] = round_to(c.dtype, random_normal(kv[b] * hkv * d, rng));
    vs[b] = round_to(c.dtype, random_normal(kv[b] * hkv * d, rng));
  }
  m.q = pack_rows(qs, hq * d);
  m.cache = tessera_ref::build_paged(ks, vs, kv, hkv, d, c.page_size, ref_layout(c.layout), rng() | 1, 3, 0.0);
  tessera_ref::Options opts;
  opts.causal = c.causal;
  opts.window_left = c.window_left;
  opts.custom_mask_indptr = {0};
  std::bernoulli_distribution listed(keep), flag(0.7);
  for (size_t b = 0; b < batch; ++b) {
    std::vector<uint8_t> visible(static_cast<size_t>(qo[b] * kv[b]), 0);  // [qo, kv]: the block set
    const int64_t col_blocks = (kv[b] + bc - 1) / bc;
    for (int64_t r0 = 0; r0 < qo[b]; r0 += br) {
      const int64_t r1 = std::min(qo[b], r0 + br);
      for (int64_t cb = 0; cb < col_blocks; ++cb) {
        if (!listed(rng)) continue;
        const int64_t c0 = cb * bc, c1 = std::min(kv[b], c0 + bc);
        bool whole = c0 + bc <= kv[b];
        for (int64_t i = r0; i < r1; ++i) {
          for (int64_t j = c0; j < c1; ++j) {
            visible[static_cast<size_t>(i * kv[b] + j)] = 1;
            whole = whole && element_visible(c, static_cast<int64_t>(b), qo[b], kv[b], i, j);
          }
        }
        m.mask_indices.push_back(static_cast<int32_t>(cb));
        m.mask_flags.push_back(c.flags && whole && flag(rng) ? 1 : 0);
      }
      m.mask_indptr.push_back(static_cast<int32_t>(m.mask_indices.size()));
    }
    // The user mask is an element mask of the oracle's custom mask; causal and the window are its
    // own options.
    for (int64_t i = 0; i < qo[b]; ++i) {
      for (int64_t j = 0; j < kv[b]; ++j) {
        uint8_t& bit = visible[static_cast<size_t>(i * kv[b] + j)];
        if (c.user_mask && !(j == kv[b] - qo[b] + i || j % 5 != static_cast<int64_t>(b) % 5)) bit = 0;
      }
    }
    opts.custom_mask.insert(opts.custom_mask.end(), visible.begin(), visible.end());
    opts.custom_mask_indptr.push_back(static_cast<int64_t>(opts.custom_mask.size()));
  }
  m.ref = tessera_ref::attention_paged(m.q.values, m.q.indptr, m.cache, {hq, hkv, d}, opts);
  return m;
}

/// The case's plan shape (its user variant, when it has one, in `spec`).
tessera::PlanShape plan_shape(const MaskCase& c, int64_t hkv, tessera::VariantSpec* spec, tessera::MaskMod* mod) {
  tessera::PlanShape shape{hkv * c.group, hkv, c.head_dim, c.dtype, {}};
  shape.attention.causal = c.causal;
  shape.attention.variant.window_left = c.window_left;
  if (c.user_mask) {
    *mod = tessera::MaskMod{kRequestMaskSource, "drop_request_residue"};
    *spec = tessera::flex_variant("test_bsr_paged_request_mask", mod, nullptr, {});
    shape.attention.variant.user = spec;
  }
  return shape;
}

class BlockSparsePaged : public ::testing::TestWithParam<MaskCase> {};

TEST_P(BlockSparsePaged, MatchesOracle) {
  const MaskCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t hkv = 2;
  // Odd lengths, an empty request, a request without KV, a long one that the planner splits.
  const std::vector<int64_t> qo = {37, 0, 1, 200, 129, 0, 64};
  const std::vector<int64_t> kv = {300, 0, 777, 1500, 129, 45, 2100};
  const MaskedBatch m = make_batch(c, qo, kv, hkv, rng, 0.6);
  const int64_t hq = hkv * c.group, rows = m.rows();
  DeviceTensor q = upload_tensor(c.dtype, m.q.values, {rows, hq, c.head_dim});
  DeviceTensor o = make_output(c.dtype, {rows, hq, c.head_dim}), lse = make_output(DType::kF32, {rows, hq});
  DevicePaged paged = upload_paged(c.dtype, m.cache, c.layout, /*combined=*/false);
  const tessera::PagedKVCache cache{paged.view.k, paged.view.v, c.layout, paged.view.indices};
  DeviceBuffer indices = upload_i32(m.mask_indices);
  DeviceBuffer flags(std::max<size_t>(m.mask_flags.size(), 1));
  if (!m.mask_flags.empty()) flags.upload(m.mask_flags.data(), m.mask_flags.size());
  const int64_t entries = static_cast<int64_t>(m.mask_indices.size());
  const TensorView flags_view =
      c.flags ? TensorView(flags.get(), DType::kU8, {entries}, Device::cuda(0)) : TensorView{};

  tessera::VariantSpec spec;
  tessera::MaskMod mod;
  const tessera::PlanShape shape = plan_shape(c, hkv, &spec, &mod);
  const tessera::RuntimeBounds bounds{std::max<int64_t>(m.block_rows_total(), 8), rows, hq, hkv, c.head_dim};
  tessera::RuntimeOptions options;
  options.split_kv = c.split;
  options.fixed_split_size = c.split == SplitKV::kFixed ? 256 : 0;
  Workspace ws(tessera::BatchBlockSparsePagedWrapper::workspace_size(bounds, options));
  tessera::BatchBlockSparsePagedWrapper w(ws.view, bounds, options);
  std::vector<int32_t> qo_indptr = m.q.indptr;
  w.plan(host_i32(qo_indptr), host_i32(m.cache.indptr), host_i32(m.cache.last_page_len), c.page_size,
         host_i32(m.mask_indptr), c.block_rows, c.block_cols, shape);
  w.run(q.view, cache, i32_view(indices, entries), flags_view, o.view, lse.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const tessera::PlanInfo& info = w.plan_info();
  SCOPED_TRACE(std::string(c.name) + ": " + std::to_string(m.block_rows_total()) + " block rows, " +
               std::to_string(entries) + " listed blocks, split chunks " + std::to_string(info.num_partials));
  if (c.split == SplitKV::kFixed) EXPECT_GT(info.num_partials, 0) << "the case must split a tile";
  const std::vector<double> o_host = read_tensor(o), lse_host = read_tensor(lse);
  expect_matches_oracle(c.dtype, o_host, &lse_host, m.ref, c.name);
}

MaskCase base_case(const char* name) {
  return MaskCase{name, 16, 64, 64, 4, 128, true, -1, false, false, SplitKV::kAuto, DType::kBF16, Layout::kNHD};
}

std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases;
  MaskCase c = base_case("page16_b64x64_causal");
  cases.push_back(c);
  c = base_case("page16_b64x64_causal_flags");
  c.flags = true;
  cases.push_back(c);
  c = base_case("page1_b64x64_causal_flags_f16");
  c.page_size = 1;
  c.flags = true;
  c.dtype = DType::kF16;
  cases.push_back(c);
  c = base_case("page16_b16x48_noncausal_hnd_group1");
  c.block_rows = 16;
  c.block_cols = 48;
  c.causal = false;
  c.layout = Layout::kHND;
  c.group = 1;
  cases.push_back(c);
  c = base_case("page1_b1x1_causal_group8");  // single query rows and single KV columns
  c.page_size = 1;
  c.block_rows = 1;
  c.block_cols = 1;
  c.group = 8;
  cases.push_back(c);
  c = base_case("page16_b128x128_window100_flags");
  c.block_rows = 128;
  c.block_cols = 128;
  c.window_left = 100;
  c.flags = true;
  cases.push_back(c);
  c = base_case("page16_b64x32_user_mask");
  c.block_cols = 32;
  c.user_mask = true;
  cases.push_back(c);
  c = base_case("page16_b64x64_fixed_split");
  c.split = SplitKV::kFixed;
  c.flags = true;
  cases.push_back(c);
  c = base_case("page16_b64x64_no_split_d64");
  c.split = SplitKV::kNone;
  c.head_dim = 64;
  cases.push_back(c);
  c = base_case("page16_b32x64_causal_d256");
  c.block_rows = 32;
  c.head_dim = 256;
  c.flags = true;
  cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, BlockSparsePaged, ::testing::ValuesIn(mask_cases()),
                         [](const ::testing::TestParamInfo<MaskCase>& info) { return std::string(info.param.name); });

TEST(BlockSparsePagedDeterminism, TenRunsAreBitIdentical) {
  std::mt19937_64 rng(test_seed());
  MaskCase c = base_case("determinism");
  c.flags = true;
  const int64_t hkv = 2, hq = hkv * c.group;
  const MaskedBatch m = make_batch(c, {300, 5, 1000}, {4000, 800, 1000}, hkv, rng, 0.7);
  DeviceTensor q = upload_tensor(c.dtype, m.q.values, {m.rows(), hq, c.head_dim});
  DeviceTensor o = make_output(c.dtype, {m.rows(), hq, c.head_dim});
  DevicePaged paged = upload_paged(c.dtype, m.cache, c.layout, false);
  const tessera::PagedKVCache cache{paged.view.k, paged.view.v, c.layout, paged.view.indices};
  DeviceBuffer indices = upload_i32(m.mask_indices), flags(m.mask_flags.size());
  flags.upload(m.mask_flags.data(), m.mask_flags.size());
  const int64_t entries = static_cast<int64_t>(m.mask_indices.size());
  const tessera::RuntimeBounds bounds{64, m.rows(), hq, hkv, c.head_dim};
  tessera::RuntimeOptions options;  // a fixed split size: the case must split, whatever the device
  options.split_kv = SplitKV::kFixed;
  options.fixed_split_size = 512;
  Workspace ws(tessera::BatchBlockSparsePagedWrapper::workspace_size(bounds, options));
  tessera::BatchBlockSparsePagedWrapper w(ws.view, bounds, options);
  std::vector<int32_t> qo_indptr = m.q.indptr;
  w.plan(host_i32(qo_indptr), host_i32(m.cache.indptr), host_i32(m.cache.last_page_len), c.page_size,
         host_i32(m.mask_indptr), c.block_rows, c.block_cols, tessera::PlanShape{hq, hkv, c.head_dim, c.dtype, {}});
  const TensorView flags_view(flags.get(), DType::kU8, {entries}, Device::cuda(0));
  std::vector<unsigned char> first;
  for (int run = 0; run < 10; ++run) {
    ASSERT_CUDA_OK(cudaMemset(o.buf.get(), 0xFF, o.buf.bytes()));
    w.run(q.view, cache, i32_view(indices, entries), flags_view, o.view);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    if (run == 0) {
      first = read_bytes(o);
      EXPECT_GT(w.plan_info().num_partials, 0) << "the case must split a tile";
    } else {
      ASSERT_EQ(read_bytes(o), first) << "run " << run << " differs from run 0";
    }
  }
}

/// A graph captured once replays correctly after re-plans that change the batch, the lengths and
/// the block mask (fixed buffers whose contents change, as a serving engine keeps them).
TEST(BlockSparsePagedCudaGraph, ReplaysCorrectlyAfterReplans_sanitize) {
  const MaskCase c = base_case("graph");
  const int64_t hkv = 2, hq = hkv * c.group, d = c.head_dim, max_rows = 2048, max_pages = 1024;
  const int64_t max_entries = 8192;
  tessera::RuntimeBounds bounds{64, max_rows, hq, hkv, d};
  tessera::RuntimeOptions options;
  options.cuda_graph = true;
  options.dtype = c.dtype;
  Workspace ws(tessera::BatchBlockSparsePagedWrapper::workspace_size(bounds, options));
  tessera::BatchBlockSparsePagedWrapper w(ws.view, bounds, options);
  DeviceBuffer q_buf(max_rows * hq * d * 2), o_buf(max_rows * hq * d * 2), lse_buf(max_rows * hq * 4);
  DeviceBuffer k_buf(max_pages * c.page_size * hkv * d * 2), v_buf(max_pages * c.page_size * hkv * d * 2);
  DeviceBuffer page_buf(max_pages * 4), block_buf(max_entries * 4), flag_buf(max_entries);
  const TensorView q(q_buf.get(), c.dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView o(o_buf.get(), c.dtype, {max_rows, hq, d}, Device::cuda(0));
  const TensorView lse(lse_buf.get(), DType::kF32, {max_rows, hq}, Device::cuda(0));
  tessera::PagedKVCache cache;
  cache.k = TensorView(k_buf.get(), c.dtype, {max_pages, c.page_size, hkv, d}, Device::cuda(0));
  cache.v = TensorView(v_buf.get(), c.dtype, {max_pages, c.page_size, hkv, d}, Device::cuda(0));
  cache.indices = TensorView(page_buf.get(), DType::kI32, {max_pages}, Device::cuda(0));
  const TensorView blocks(block_buf.get(), DType::kI32, {max_entries}, Device::cuda(0));
  const TensorView flags(flag_buf.get(), DType::kU8, {max_entries}, Device::cuda(0));
  Stream stream;
  std::mt19937_64 rng(test_seed());
  cudaGraphExec_t exec = nullptr;
  const std::vector<std::vector<int64_t>> qos = {{100, 7}, {1, 300, 0, 64, 33}, {900}, {5, 5, 5, 200}};
  for (size_t step = 0; step < qos.size(); ++step) {
    std::vector<int64_t> qo = qos[step], kv(qo.size());
    for (size_t b = 0; b < qo.size(); ++b) kv[b] = qo[b] + std::uniform_int_distribution<int64_t>(0, 3000)(rng);
    MaskCase cs = c;
    cs.flags = step % 2 == 1;
    const MaskedBatch m = make_batch(cs, qo, kv, hkv, rng, step == 2 ? 0.3 : 0.8);
    ASSERT_LE(m.cache.num_pages, max_pages);
    ASSERT_LE(static_cast<int64_t>(m.mask_indices.size()), max_entries);
    DeviceBuffer q_dev = upload_as(c.dtype, m.q.values), k_dev = upload_as(c.dtype, m.cache.k_pages),
                 v_dev = upload_as(c.dtype, m.cache.v_pages);
    ASSERT_CUDA_OK(cudaMemcpy(q_buf.get(), q_dev.get(), q_dev.bytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(k_buf.get(), k_dev.get(), k_dev.bytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(v_buf.get(), v_dev.get(), v_dev.bytes(), cudaMemcpyDeviceToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(page_buf.get(), m.cache.indices.data(), m.cache.indices.size() * 4,
                              cudaMemcpyHostToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(block_buf.get(), m.mask_indices.data(), m.mask_indices.size() * 4,
                              cudaMemcpyHostToDevice));
    ASSERT_CUDA_OK(cudaMemcpy(flag_buf.get(), m.mask_flags.data(), m.mask_flags.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA_OK(cudaMemset(o_buf.get(), 0xFF, o_buf.bytes()));
    ASSERT_CUDA_OK(cudaMemset(lse_buf.get(), 0xFF, lse_buf.bytes()));
    std::vector<int32_t> qo_indptr = m.q.indptr;
    w.plan(host_i32(qo_indptr), host_i32(m.cache.indptr), host_i32(m.cache.last_page_len), c.page_size,
           host_i32(m.mask_indptr), c.block_rows, c.block_cols, plan_shape(c, hkv, nullptr, nullptr), stream.s);
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_CUDA_OK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
      w.run(q, cache, blocks, flags, o, lse, stream.s);
      ASSERT_CUDA_OK(cudaStreamEndCapture(stream.s, &graph));
      ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      ASSERT_CUDA_OK(cudaGraphDestroy(graph));
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream.s));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream.s));
    const int64_t rows = m.rows();
    const auto o_host = download_as(c.dtype, o_buf.get(), rows * hq * d);
    const auto lse_host = download_as(DType::kF32, lse_buf.get(), rows * hq);
    SCOPED_TRACE("step " + std::to_string(step) + ", " + std::to_string(m.block_rows_total()) + " block rows, partials " +
                 std::to_string(w.plan_info().num_partials));
    expect_matches_oracle(c.dtype, o_host, &lse_host, m.ref, "graph replay");
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
}

TEST(BlockSparsePagedErrors, NameTheArgument) {
  std::mt19937_64 rng(test_seed());
  const MaskCase c = base_case("errors");
  const int64_t hkv = 2, hq = hkv * c.group;
  const MaskedBatch m = make_batch(c, {70, 3}, {300, 100}, hkv, rng, 1.0);
  DeviceTensor q = upload_tensor(c.dtype, m.q.values, {m.rows(), hq, c.head_dim});
  DeviceTensor o = make_output(c.dtype, {m.rows(), hq, c.head_dim});
  DevicePaged paged = upload_paged(c.dtype, m.cache, c.layout, false);
  const tessera::PagedKVCache cache{paged.view.k, paged.view.v, c.layout, paged.view.indices};
  const tessera::RuntimeBounds bounds{8, 256, hq, hkv, c.head_dim};
  Workspace ws(tessera::BatchBlockSparsePagedWrapper::workspace_size(bounds));
  tessera::BatchBlockSparsePagedWrapper w(ws.view, bounds);
  std::vector<int32_t> qo_indptr = m.q.indptr;
  const tessera::PlanShape shape = plan_shape(c, hkv, nullptr, nullptr);
  auto plan = [&](const std::vector<int32_t>& mask_indptr, int64_t br, int64_t bc) {
    w.plan(host_i32(qo_indptr), host_i32(m.cache.indptr), host_i32(m.cache.last_page_len), c.page_size,
           host_i32(mask_indptr), br, bc, shape);
  };
  expect_error_any([&] { plan(m.mask_indptr, 0, 64); }, {"block_rows = 0"}, StatusCode::kInvalidArgument);
  expect_error_any([&] { plan(m.mask_indptr, 64, -1); }, {"block_cols = -1"}, StatusCode::kInvalidArgument);
  // Requests of 70 and 3 queries in rows of 64: 3 block rows, so 4 entries.
  std::vector<int32_t> short_indptr(m.mask_indptr.begin(), m.mask_indptr.end() - 1);
  expect_error_any([&] { plan(short_indptr, 64, 64); }, {"mask_indptr has 3 entries, expected 4"},
                   StatusCode::kInvalidArgument);
  expect_error_any([&] { w.run(q.view, cache, TensorView{}, TensorView{}, o.view); }, {"run() before plan()"},
                   StatusCode::kInvalidArgument);
  plan(m.mask_indptr, c.block_rows, c.block_cols);
  // Column blocks past their own request's KV (request 1 has 100 positions: 2 blocks of 64), out
  // of order, and flags of the wrong length, in pinned host memory (checked at every run).
  PinnedI32 pinned(m.mask_indices);
  const int64_t entries = static_cast<int64_t>(m.mask_indices.size());
  ASSERT_EQ(m.mask_indptr, (std::vector<int32_t>{0, 5, 10, 12}));  // every block listed (keep = 1)
  pinned.ptr[11] = 2;
  expect_error_any([&] { w.run(q.view, cache, pinned.view(), TensorView{}, o.view); },
                   {"mask_indices[11] = 2 is out of range [0, 2) (block row 2; ceil(kv_len / block_cols) of its "
                    "request = 2)"},
                   StatusCode::kInvalidArgument);
  pinned.ptr[11] = 1;
  pinned.ptr[3] = 1;
  expect_error_any([&] { w.run(q.view, cache, pinned.view(), TensorView{}, o.view); },
                   {"mask_indices[3] = 1, expected > 2"}, StatusCode::kInvalidArgument);
  pinned.ptr[3] = 3;
  DeviceBuffer flags(entries);
  const TensorView short_flags(flags.get(), DType::kU8, {entries - 1}, Device::cuda(0));
  expect_error_any([&] { w.run(q.view, cache, pinned.view(), short_flags, o.view); },
                   {"mask_flags has 11 entries"}, StatusCode::kInvalidArgument);
  const TensorView i32_flags(flags.get(), DType::kI32, {entries / 4}, Device::cuda(0));
  expect_error_any([&] { w.run(q.view, cache, pinned.view(), i32_flags, o.view); }, {"mask_flags"},
                   StatusCode::kInvalidArgument);
  // The page size is the plan's, not the column blocks'.
  expect_error_any(
      [&] {
        w.plan(host_i32(qo_indptr), host_i32(m.cache.indptr), host_i32(m.cache.last_page_len), c.page_size * 2,
               host_i32(m.mask_indptr), c.block_rows, c.block_cols, shape);
        w.run(q.view, cache, pinned.view(), TensorView{}, o.view);
      },
      {"last_page_len", "page size"}, StatusCode::kInvalidArgument);
  plan(m.mask_indptr, c.block_rows, c.block_cols);
  w.run(q.view, cache, pinned.view(), TensorView{}, o.view);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_matches_oracle(c.dtype, read_tensor(o), nullptr, m.ref, "after the errors");
}

}  // namespace
