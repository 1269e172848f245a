// GPU tests of build_block_mask (FlexAttention's create_block_mask):
// - the BSR it writes (indptr, indices, flags) equals a CPU classification of the same mask, for
//   causal, sliding window, document (ids in a device tensor), and_masks(causal, document),
//   prefix-LM, or_masks(window, strided globals) and a mask that reads b and h, at odd sizes
//   (q_len != kv_len both ways, lengths not multiples of the blocks) and blocks (128, 64), (64, 64),
//   (16, 1), (5, 3), (1, 1); entries past indptr[last] stay as they were; a second build is bit
//   identical (on another stream);
// - block_sparse_attention over the built BSR with the mask as a flex_variant equals the fp64
//   oracle with the dense mask as custom_mask, with and without block_flags;
// - a compile error in the mask reports the user's line.
//
// The CPU twin of each mask is written separately in C++ (CpuMask); a block counts as full when
// every existing row sees all Bc columns of the block (columns past kv_len count as hidden, rows
// past q_len do not exist), as kernels/attention/block_mask.cuh documents.
//
// compute-sanitizer subset: --gtest_filter='*_sanitize*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/attention/attention_test_utils.h"
#include "gpu/gpu_test_utils.h"
#include "reference/oracle.h"
#include "tessera/attention.h"
#include "tessera/error.h"
#include "tessera/formats.h"
#include "tessera/variant.h"

namespace {

using tessera::DType;
using tessera::MaskMod;
using tessera::StatusCode;
using tessera::TensorView;
using tessera::VariantParam;
using namespace tessera_test;
using namespace tessera_test::attn;

// ---------------------------------------------------------------------------------------------
// Masks: CUDA source, parameters and a C++ twin.

/// visible(b, h, q_idx, kv_idx) on the host.
using CpuMask = std::function<bool(int, int, int, int)>;

enum class MaskKind { kCausal, kWindow, kDocument, kCausalDocument, kPrefixLm, kWindowOrStrided, kBatchHead };

const char* mask_kind_name(MaskKind k) {
  switch (k) {
    case MaskKind::kCausal: return "causal";
    case MaskKind::kWindow: return "window";
    case MaskKind::kDocument: return "document";
    case MaskKind::kCausalDocument: return "causal_and_document";
    case MaskKind::kPrefixLm: return "prefix_lm";
    case MaskKind::kWindowOrStrided: return "window_or_strided";
    case MaskKind::kBatchHead: return "batch_head";
  }
  return "?";
}

const MaskMod kCausal{"bool causal(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                      "  return kv_idx <= q_idx;\n}\n",
                      "causal"};
const MaskMod kWindow{"bool sliding_window(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                      "  return kv_idx <= q_idx && q_idx - kv_idx <= params.window;\n}\n",
                      "sliding_window"};
// Bidirectional within a document; rows before position 0 (q_len > kv_len) see nothing.
const MaskMod kDocument{"bool document(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                        "  return q_idx >= 0 && params.doc_ids[q_idx] == params.doc_ids[kv_idx];\n}\n",
                        "document"};
const MaskMod kPrefixLm{"bool prefix_lm(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                        "  return kv_idx <= q_idx || kv_idx < params.prefix_len;\n}\n",
                        "prefix_lm"};
const MaskMod kStrided{"bool strided_globals(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                       "  return kv_idx <= q_idx && kv_idx % params.stride == 0;\n}\n",
                       "strided_globals"};
const MaskMod kBatchHead{"bool batch_head(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                         "  return b == 2 ? kv_idx <= q_idx : (h == 5 ? kv_idx >= q_idx : kv_idx % 3 != 1);\n}\n",
                         "batch_head"};

/// One mask ready to use: its MaskMod, parameters (device tensors owned here) and CPU twin.
struct TestMask {
  MaskMod mod;
  std::vector<VariantParam> params;
  CpuMask cpu;
  std::vector<std::shared_ptr<DeviceBuffer>> buffers;  // keep parameter tensors alive
};

/// Document ids for positions [0, kv_len): runs alternating short ([1, 40]) and long ([300, 500]),
/// so every window of 600 positions holds >= 255 consecutive positions of one document (a full
/// (128, 64) block) as well as document boundaries (partial blocks).
std::vector<int32_t> random_documents(int64_t kv_len, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> short_run(1, 40), long_run(300, 500);
  std::vector<int32_t> ids(static_cast<size_t>(kv_len));
  int32_t doc = 0;
  for (int64_t i = 0; i < kv_len;) {
    const int run = doc % 2 == 0 ? short_run(rng) : long_run(rng);
    const int64_t end = std::min<int64_t>(kv_len, i + run);
    for (; i < end; ++i) ids[static_cast<size_t>(i)] = doc;
    ++doc;
  }
  return ids;
}

/// `min_window`: the sliding window is drawn from [min_window, min_window + 180].
TestMask make_mask(MaskKind kind, int64_t kv_len, std::mt19937_64& rng, int min_window = 20) {
  TestMask m;
  auto causal = [](int, int, int q, int kv) { return kv <= q; };
  const int window = std::uniform_int_distribution<int>(min_window, min_window + 180)(rng);
  auto in_window = [window](int, int, int q, int kv) { return kv <= q && q - kv <= window; };
  switch (kind) {
    case MaskKind::kCausal:
      m.mod = kCausal;
      m.cpu = causal;
      break;
    case MaskKind::kWindow:
      m.mod = kWindow;
      m.params = {VariantParam::scalar_i32("window", window)};
      m.cpu = in_window;
      break;
    case MaskKind::kDocument:
    case MaskKind::kCausalDocument: {
      const std::vector<int32_t> ids = random_documents(kv_len, rng);
      auto buf = std::make_shared<DeviceBuffer>(upload_i32(ids));
      m.params = {VariantParam::device_tensor("doc_ids", i32_view(*buf, kv_len))};
      m.buffers.push_back(buf);
      auto same_doc = [ids](int, int, int q, int kv) { return q >= 0 && ids[q] == ids[kv]; };
      if (kind == MaskKind::kDocument) {
        m.mod = kDocument;
        m.cpu = same_doc;
      } else {
        m.mod = tessera::and_masks(kCausal, kDocument);
        m.cpu = [=](int b, int h, int q, int kv) { return causal(b, h, q, kv) && same_doc(b, h, q, kv); };
      }
      break;
    }
    case MaskKind::kPrefixLm: {
      const int prefix = static_cast<int>(kv_len / 3);
      m.mod = kPrefixLm;
      m.params = {VariantParam::scalar_i32("prefix_len", prefix)};
      m.cpu = [prefix](int, int, int q, int kv) { return kv <= q || kv < prefix; };
      break;
    }
    case MaskKind::kWindowOrStrided: {
      const int stride = std::uniform_int_distribution<int>(5, 90)(rng);
      m.mod = tessera::or_masks(kWindow, kStrided);
      m.params = {VariantParam::scalar_i32("window", window), VariantParam::scalar_i32("stride", stride)};
      m.cpu = [=](int b, int h, int q, int kv) { return in_window(b, h, q, kv) || (kv <= q && kv % stride == 0); };
      break;
    }
    case MaskKind::kBatchHead:
      m.mod = kBatchHead;
      m.cpu = [](int b, int h, int q, int kv) { return b == 2 ? kv <= q : (h == 5 ? kv >= q : kv % 3 != 1); };
      break;
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// The CPU classification and the device build.

struct HostBsr {
  std::vector<int32_t> indptr;   // [num_row_blocks + 1]
  std::vector<int32_t> indices;  // [indptr.back()]
  std::vector<uint8_t> flags;    // [indptr.back()]
  int64_t full = 0, partial = 0;
};

HostBsr classify_on_cpu(const CpuMask& visible, int64_t q_len, int64_t kv_len, int64_t br, int64_t bc, int b,
                        int h) {
  HostBsr out;
  const int64_t row_blocks = (q_len + br - 1) / br, col_blocks = (kv_len + bc - 1) / bc;
  out.indptr.push_back(0);
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    const int64_t rows = std::min(br, q_len - rb * br);
    for (int64_t cb = 0; cb < col_blocks; ++cb) {
      const int64_t cols = std::min(bc, kv_len - cb * bc);
      int64_t seen = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int q_idx = static_cast<int>(kv_len - q_len + rb * br + r);
        for (int64_t c = 0; c < cols; ++c) seen += visible(b, h, q_idx, static_cast<int>(cb * bc + c)) ? 1 : 0;
      }
      if (seen == 0) continue;
      const bool full = cols == bc && seen == rows * cols;
      out.indices.push_back(static_cast<int32_t>(cb));
      out.flags.push_back(full ? 1 : 0);
      ++(full ? out.full : out.partial);
    }
    out.indptr.push_back(static_cast<int32_t>(out.indices.size()));
  }
  return out;
}

/// Device outputs of one build, sized for every block plus a poisoned tail.
struct DeviceBsr {
  static constexpr int64_t kTail = 7;  // extra entries that must stay untouched
  int64_t row_blocks = 0, capacity = 0;
  DeviceBuffer indptr, indices, flags;

  DeviceBsr(int64_t q_len, int64_t kv_len, int64_t br, int64_t bc) {
    row_blocks = (q_len + br - 1) / br;
    capacity = row_blocks * ((kv_len + bc - 1) / bc) + kTail;
    indptr = DeviceBuffer(static_cast<size_t>(row_blocks + 1) * sizeof(int32_t));
    indices = DeviceBuffer(static_cast<size_t>(capacity) * sizeof(int32_t));
    flags = DeviceBuffer(static_cast<size_t>(capacity));
    indptr.poison();
    indices.poison();
    flags.poison();
  }
  TensorView indptr_view() const { return i32_view(indptr, row_blocks + 1); }
  TensorView indices_view() const { return i32_view(indices, capacity); }
  TensorView flags_view() const { return TensorView(flags.get(), DType::kU8, {capacity}, tessera::Device::cuda(0)); }

  std::vector<int32_t> read_indptr() const {
    std::vector<int32_t> v(static_cast<size_t>(row_blocks + 1));
    indptr.download(v.data(), v.size() * sizeof(int32_t));
    return v;
  }
  std::vector<int32_t> read_indices() const {
    std::vector<int32_t> v(static_cast<size_t>(capacity));
    indices.download(v.data(), v.size() * sizeof(int32_t));
    return v;
  }
  std::vector<uint8_t> read_flags() const {
    std::vector<uint8_t> v(static_cast<size_t>(capacity));
    flags.download(v.data(), v.size());
    return v;
  }
};

void build(const TestMask& m, int64_t q_len, int64_t kv_len, int64_t br, int64_t bc, int b, int h, const DeviceBsr& out,
           cudaStream_t stream = nullptr) {
  tessera::build_block_mask(m.mod, m.params, q_len, kv_len, br, bc, b, h, out.indptr_view(), out.indices_view(),
                            out.flags_view(), stream);
}

/// Expects the device build in `out` (poisoned before) to equal `ref`, with the tail untouched.
void expect_bsr_equal(const DeviceBsr& out, const HostBsr& ref, const std::string& what) {
  const std::vector<int32_t> indptr = out.read_indptr();
  ASSERT_EQ(indptr, ref.indptr) << what << ": indptr";
  const std::vector<int32_t> indices = out.read_indices();
  const std::vector<uint8_t> flags = out.read_flags();
  const size_t total = ref.indices.size();
  EXPECT_EQ(std::vector<int32_t>(indices.begin(), indices.begin() + total), ref.indices) << what << ": indices";
  EXPECT_EQ(std::vector<uint8_t>(flags.begin(), flags.begin() + total), ref.flags) << what << ": block_flags";
  size_t tail_changes = 0;
  for (size_t j = total; j < indices.size(); ++j) tail_changes += (indices[j] != -1) + (flags[j] != 0xFF);
  EXPECT_EQ(tail_changes, 0u) << what << ": entries past indptr[last] were written";
}

// ---------------------------------------------------------------------------------------------
// BSR against the CPU classification.

struct BlockShape {
  int64_t br, bc;
};
struct Lengths2 {
  int64_t q_len, kv_len;
};

// q_len < kv_len, q_len > kv_len (rows before position 0), equal, a single query row.
const Lengths2 kLengths[] = {{300, 1000}, {513, 129}, {777, 777}, {1, 77}};
const BlockShape kBlocks[] = {{128, 64}, {64, 64}, {16, 1}, {5, 3}, {1, 1}};

struct BsrCase {
  MaskKind mask;
  BlockShape block;
};

std::string bsr_case_name(const BsrCase& c) {
  return std::string(mask_kind_name(c.mask)) + "_b" + std::to_string(c.block.br) + "x" + std::to_string(c.block.bc);
}

std::vector<BsrCase> bsr_cases() {
  std::vector<BsrCase> cases;
  for (MaskKind k : {MaskKind::kCausal, MaskKind::kWindow, MaskKind::kDocument, MaskKind::kCausalDocument,
                     MaskKind::kPrefixLm, MaskKind::kWindowOrStrided}) {
    for (const BlockShape& b : kBlocks) cases.push_back({k, b});
  }
  return cases;
}

class BlockMaskBsrTest : public ::testing::TestWithParam<BsrCase> {};

TEST_P(BlockMaskBsrTest, MatchesCpuClassification) {
  const BsrCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const Lengths2& len : kLengths) {
    const std::string what = bsr_case_name(c) + " q_len " + std::to_string(len.q_len) + " kv_len " +
                             std::to_string(len.kv_len);
    const TestMask m = make_mask(c.mask, len.kv_len, rng);
    const HostBsr ref = classify_on_cpu(m.cpu, len.q_len, len.kv_len, c.block.br, c.block.bc, 0, 0);
    DeviceBsr out(len.q_len, len.kv_len, c.block.br, c.block.bc);
    build(m, len.q_len, len.kv_len, c.block.br, c.block.bc, 0, 0, out);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    expect_bsr_equal(out, ref, what);

    // Again on a non-blocking stream over the first result: bit identical.
    const std::vector<int32_t> first_indices = out.read_indices();
    const std::vector<uint8_t> first_flags = out.read_flags();
    build(m, len.q_len, len.kv_len, c.block.br, c.block.bc, 0, 0, out, stream);
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(out.read_indptr(), ref.indptr) << what << ": second build, indptr";
    EXPECT_TRUE(out.read_indices() == first_indices && out.read_flags() == first_flags)
        << what << ": a second build differs from the first";
  }
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Grid, BlockMaskBsrTest, ::testing::ValuesIn(bsr_cases()),
                         [](const ::testing::TestParamInfo<BsrCase>& info) { return bsr_case_name(info.param); });

// b and h reach the mask: three (b, h) pairs give three different block sets.
TEST(BlockMaskBsr, BatchAndHeadArePassed) {
  std::mt19937_64 rng(1);
  const TestMask m = make_mask(MaskKind::kBatchHead, 200, rng);
  for (const std::pair<int, int>& bh : {std::make_pair(2, 0), std::make_pair(0, 5), std::make_pair(0, 0)}) {
    for (const BlockShape& blk : {BlockShape{16, 16}, BlockShape{5, 3}}) {
      const std::string what = "b " + std::to_string(bh.first) + " h " + std::to_string(bh.second) + " blocks " +
                               std::to_string(blk.br) + "x" + std::to_string(blk.bc);
      const HostBsr ref = classify_on_cpu(m.cpu, 150, 200, blk.br, blk.bc, bh.first, bh.second);
      DeviceBsr out(150, 200, blk.br, blk.bc);
      build(m, 150, 200, blk.br, blk.bc, bh.first, bh.second, out);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      expect_bsr_equal(out, ref, what);
    }
  }
}

// Blocks larger than the whole grid, and a long single row (many column blocks per CTA chunk).
TEST(BlockMaskBsr, ExtremeShapes) {
  std::mt19937_64 rng(2);
  const TestMask window = make_mask(MaskKind::kWindow, 5000, rng);
  const struct {
    int64_t q_len, kv_len, br, bc;
  } shapes[] = {{3, 5, 64, 64}, {70, 33, 256, 512}, {2, 5000, 1, 1}, {1, 5000, 1, 2}, {2000, 3, 1, 1}};
  for (const auto& s : shapes) {
    const std::string what = "q_len " + std::to_string(s.q_len) + " kv_len " + std::to_string(s.kv_len) + " blocks " +
                             std::to_string(s.br) + "x" + std::to_string(s.bc);
    const HostBsr ref = classify_on_cpu(window.cpu, s.q_len, s.kv_len, s.br, s.bc, 0, 0);
    DeviceBsr out(s.q_len, s.kv_len, s.br, s.bc);
    build(window, s.q_len, s.kv_len, s.br, s.bc, 0, 0, out);
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    expect_bsr_equal(out, ref, what);
  }
}

// ---------------------------------------------------------------------------------------------
// block_sparse_attention over the built BSR against the oracle with the dense mask.

struct AttnCase {
  MaskKind mask;
  BlockShape block;
  int64_t q_len, kv_len;
  DType dtype;
  int64_t head_dim, num_kv_heads, group;
  bool sanitize = false;
};

std::string attn_case_name(const AttnCase& c) {
  std::string s = std::string(mask_kind_name(c.mask)) + "_b" + std::to_string(c.block.br) + "x" +
                  std::to_string(c.block.bc) + "_q" + std::to_string(c.q_len) + "_kv" + std::to_string(c.kv_len) +
                  "_" + tessera::dtype_name(c.dtype) + "_d" + std::to_string(c.head_dim) + "_h" +
                  std::to_string(c.num_kv_heads) + "x" + std::to_string(c.group);
  return c.sanitize ? "small_" + s + "_sanitize" : s;
}

std::vector<AttnCase> attn_cases() {
  return {
      {MaskKind::kWindow, {64, 64}, 300, 1000, DType::kBF16, 128, 2, 2},
      {MaskKind::kDocument, {128, 64}, 600, 2049, DType::kF16, 128, 1, 4},
      {MaskKind::kCausalDocument, {16, 1}, 130, 512, DType::kBF16, 64, 2, 1},
      {MaskKind::kPrefixLm, {5, 3}, 128, 515, DType::kBF16, 128, 1, 5},
      {MaskKind::kCausal, {64, 64}, 513, 129, DType::kF16, 128, 2, 2},
      {MaskKind::kCausal, {128, 64}, 777, 777, DType::kBF16, 128, 1, 2},
      {MaskKind::kWindowOrStrided, {64, 64}, 1000, 1000, DType::kBF16, 128, 1, 4},
      {MaskKind::kWindow, {5, 3}, 37, 50, DType::kF16, 64, 1, 2, true},
      {MaskKind::kWindowOrStrided, {16, 1}, 20, 33, DType::kBF16, 128, 1, 1, true},
  };
}

class BlockMaskAttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(BlockMaskAttentionTest, MatchesOracle) {
  const AttnCase c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with TESSERA_TEST_SEED=" + std::to_string(seed) + ")");
  std::mt19937_64 rng(seed);
  const int64_t M = c.q_len, N = c.kv_len, Hkv = c.num_kv_heads, Hq = Hkv * c.group, D = c.head_dim;
  const std::string what = attn_case_name(c) + " (seed " + std::to_string(seed) + ")";

  // A window of 2 (Br + Bc) holds full blocks next to the diagonal whatever the offset N - M.
  const TestMask m = make_mask(c.mask, N, rng, static_cast<int>(2 * (c.block.br + c.block.bc)));
  const HostBsr ref_bsr = classify_on_cpu(m.cpu, M, N, c.block.br, c.block.bc, 0, 0);
  // The case list is chosen so the flags matter: both kinds of blocks occur.
  EXPECT_GT(ref_bsr.full, 0) << what << ": no full block, the flags are not exercised";
  EXPECT_GT(ref_bsr.partial, 0) << what << ": no partial block";
  DeviceBsr bsr(M, N, c.block.br, c.block.bc);
  build(m, M, N, c.block.br, c.block.bc, 0, 0, bsr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  expect_bsr_equal(bsr, ref_bsr, what);

  const auto q = round_to(c.dtype, random_normal(M * Hq * D, rng));
  const auto k = round_to(c.dtype, random_normal(N * Hkv * D, rng));
  const auto v = round_to(c.dtype, random_normal(N * Hkv * D, rng));
  DeviceTensor dq = upload_tensor(c.dtype, q, {M, Hq, D});
  DeviceTensor dk = upload_tensor(c.dtype, k, {N, Hkv, D});
  DeviceTensor dv = upload_tensor(c.dtype, v, {N, Hkv, D});

  // The oracle sees the mask only as a dense [M, N] custom mask of one request.
  tessera_ref::Options ropt;
  ropt.custom_mask.resize(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      ropt.custom_mask[static_cast<size_t>(i * N + j)] = m.cpu(0, 0, static_cast<int>(N - M + i), static_cast<int>(j));
  ropt.custom_mask_indptr = {0, M * N};
  const tessera_ref::State ref = tessera_ref::attention_single(q, k, v, M, N, {Hq, Hkv, D}, ropt);

  const tessera::VariantSpec spec = tessera::flex_variant("block_mask_test", &m.mod, nullptr, m.params);
  tessera::AttentionOptions opt;
  opt.variant.user = &spec;
  for (bool with_flags : {true, false}) {
    tessera::BlockSparse bs;
    bs.block_rows = c.block.br;
    bs.block_cols = c.block.bc;
    bs.num_rows = M;
    bs.k = dk.view;
    bs.v = dv.view;
    bs.indptr = bsr.indptr_view();
    bs.indices = bsr.indices_view();
    if (with_flags) bs.block_flags = bsr.flags_view();
    DeviceTensor dout = make_output(c.dtype, {M, Hq, D});
    DeviceTensor dlse = make_output(DType::kF32, {M, Hq});
    tessera::block_sparse_attention(dq.view, bs, dout.view, dlse.view, opt);
    ASSERT_CUDA_OK(cudaGetLastError());
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    const auto o = read_tensor(dout);
    const auto lse = read_tensor(dlse);
    expect_matches_oracle(c.dtype, o, &lse, ref, what + (with_flags ? " with block_flags" : " without block_flags"));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BlockMaskAttentionTest, ::testing::ValuesIn(attn_cases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) { return attn_case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// Errors that need the device (the argument checks run on the CPU: tests/cpu/variant).

TEST(BlockMaskErrors, SnippetErrorCarriesUserLine) {
  const MaskMod broken{"bool broken(const Params& params, int b, int h, int q_idx, int kv_idx) {\n"
                       "  return kv_idx <= q_idx\n"  // line 2: missing semicolon, reported on line 3
                       "}\n",
                       "broken"};
  DeviceBsr out(10, 10, 4, 4);
  expect_error_any(
      [&] {
        tessera::build_block_mask(broken, {}, 10, 10, 4, 4, 0, 0, out.indptr_view(), out.indices_view(),
                                  out.flags_view());
      },
      {"user_snippet line 3"}, StatusCode::kInvalidArgument);
  // Nothing was queued: the outputs keep their poison.
  const std::vector<int32_t> indptr = out.read_indptr();
  EXPECT_TRUE(std::all_of(indptr.begin(), indptr.end(), [](int32_t x) { return x == -1; }));
}

}  // namespace
