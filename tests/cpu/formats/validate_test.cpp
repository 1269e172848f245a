// Validation of heads, tensors and KV formats on host memory. Every rejection is checked for its
// status code and for a message that names the argument, the offending value and the expectation.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/tessera.h"

namespace tessera {
namespace {

template <typename F>
::testing::AssertionResult Rejects(F&& f, StatusCode code, const std::string& argument,
                                   const std::string& value, const std::string& expectation) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (e.code() != code) {
      return ::testing::AssertionFailure() << "code " << status_code_name(e.code())
                                           << ", expected " << status_code_name(code) << ": "
                                           << message;
    }
    const std::pair<const char*, const std::string*> parts[] = {
        {"argument", &argument}, {"value", &value}, {"expectation", &expectation}};
    for (const auto& [what, part] : parts) {
      if (message.find(*part) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "message \"" << message << "\" lacks the " << what << " \"" << *part << "\"";
      }
    }
    return ::testing::AssertionSuccess() << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-tessera exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted; expected " << status_code_name(code)
                                       << " naming " << argument;
}

template <typename F>
::testing::AssertionResult Accepts(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "rejected: " << e.what();
  }
  return ::testing::AssertionSuccess();
}

// The statement comes last (variadic) so that braces with commas inside it survive the macro.
#define EXPECT_REJECTED(code, argument, value, expectation, ...)                                  \
  do {                                                                                            \
    const ::testing::AssertionResult tessera_result_ =                                            \
        Rejects([&] { __VA_ARGS__; }, code, argument, value, expectation);                        \
    EXPECT_TRUE(tessera_result_);                                                                 \
  } while (0)
#define EXPECT_INVALID(argument, value, expectation, ...) \
  EXPECT_REJECTED(StatusCode::kInvalidArgument, argument, value, expectation, __VA_ARGS__)
#define EXPECT_ACCEPTED(...)                                                       \
  do {                                                                             \
    const ::testing::AssertionResult tessera_result_ = Accepts([&] { __VA_ARGS__; }); \
    EXPECT_TRUE(tessera_result_);                                                  \
  } while (0)

TensorView host_i32(std::vector<int32_t>& values, Device device = Device::cpu()) {
  return TensorView(values.data(), DType::kI32, {static_cast<int64_t>(values.size())}, device);
}

TensorView host_u8(std::vector<uint8_t>& values) {
  return TensorView(values.data(), DType::kU8, {static_cast<int64_t>(values.size())},
                    Device::cpu());
}

// Checked mode is process-wide; every test starts with it off so that TESSERA_CHECKED in the
// environment does not change what is expected.
class Validate : public ::testing::Test {
 protected:
  void SetUp() override { set_checked_mode(false); }
  void TearDown() override { set_checked_mode(false); }
};

// A paged cache in host memory. K/V are never read by validation, but they point at real storage
// so the views are honest. head_pad/page_pad make the strides non-packed.
struct PagedFixture {
  Layout layout = Layout::kNHD;
  int64_t num_pages = 8;
  int64_t page_size = 16;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 8;
  bool combined = false;
  int64_t head_pad = 0;
  int64_t page_pad = 0;
  DType dtype = DType::kF16;
  // Three requests: two pages, none, three pages.
  std::vector<int32_t> indptr = {0, 2, 2, 5};
  std::vector<int32_t> indices = {0, 3, 1, 4, 7};
  std::vector<int32_t> last_page_len = {5, 0, 16};
  std::vector<uint16_t> storage;

  PagedKV build() {
    const bool nhd = layout == Layout::kNHD;
    const int64_t head_stride_packed = head_dim + head_pad;
    const int64_t one_page = page_size * num_kv_heads * head_stride_packed;
    const int64_t page_stride = (combined ? 2 * one_page : one_page) + page_pad;
    storage.assign(static_cast<size_t>(2 * (num_pages + 1) * page_stride), 0);
    const int64_t slot_stride = nhd ? num_kv_heads * head_stride_packed : head_stride_packed;
    const int64_t head_stride = nhd ? head_stride_packed : page_size * head_stride_packed;
    const int64_t d1 = nhd ? page_size : num_kv_heads;
    const int64_t d2 = nhd ? num_kv_heads : page_size;
    const int64_t s1 = nhd ? slot_stride : head_stride;
    const int64_t s2 = nhd ? head_stride : slot_stride;
    if (combined) {
      TensorView kv(storage.data(), dtype, {num_pages, 2, d1, d2, head_dim},
                    {page_stride, one_page, s1, s2, 1}, Device::cpu());
      return PagedKV::from_combined(kv, layout, host_i32(indptr), host_i32(indices),
                                    host_i32(last_page_len));
    }
    PagedKV kv;
    kv.k = TensorView(storage.data(), dtype, {num_pages, d1, d2, head_dim},
                      {page_stride, s1, s2, 1}, Device::cpu());
    kv.v = TensorView(storage.data() + num_pages * page_stride, dtype,
                      {num_pages, d1, d2, head_dim}, {page_stride, s1, s2, 1}, Device::cpu());
    kv.layout = layout;
    kv.indptr = host_i32(indptr);
    kv.indices = host_i32(indices);
    kv.last_page_len = host_i32(last_page_len);
    return kv;
  }
};

// Four block rows of Br = 2 over num_rows = 7 and three column blocks of Bc = 4 over num_cols = 10
// (the last one clipped).
struct BlockSparseFixture {
  int64_t block_rows = 2;
  int64_t block_cols = 4;
  int64_t num_rows = 7;
  int64_t num_cols = 10;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 8;
  std::vector<int32_t> indptr = {0, 2, 2, 5, 6};
  std::vector<int32_t> indices = {0, 2, 0, 1, 2, 1};
  std::vector<uint8_t> flags = {1, 0, 1, 1, 0, 1};
  bool with_flags = true;
  std::vector<uint16_t> storage;

  BlockSparse build() {
    storage.assign(static_cast<size_t>(2 * num_cols * num_kv_heads * head_dim), 0);
    BlockSparse bs;
    bs.block_rows = block_rows;
    bs.block_cols = block_cols;
    bs.num_rows = num_rows;
    bs.k = TensorView(storage.data(), DType::kBF16, {num_cols, num_kv_heads, head_dim},
                      Device::cpu());
    bs.v = TensorView(storage.data() + num_cols * num_kv_heads * head_dim, DType::kBF16,
                      {num_cols, num_kv_heads, head_dim}, Device::cpu());
    bs.indptr = host_i32(indptr);
    bs.indices = host_i32(indices);
    if (with_flags) bs.block_flags = host_u8(flags);
    return bs;
  }
};

// Three requests over 10 packed rows: 3, 0 and 7 rows.
struct RaggedFixture {
  int64_t total_rows = 10;
  int64_t num_heads = 2;
  int64_t head_dim = 8;
  int64_t row_pad = 0;
  DType dtype = DType::kF16;
  std::vector<int32_t> indptr = {0, 3, 3, 10};
  std::vector<uint16_t> storage;

  Ragged build() {
    const int64_t row_stride = num_heads * head_dim + row_pad;
    storage.assign(static_cast<size_t>(total_rows * row_stride + 1), 0);
    Ragged r;
    r.data = TensorView(storage.data(), dtype, {total_rows, num_heads, head_dim},
                        {row_stride, head_dim, 1}, Device::cpu());
    r.indptr = host_i32(indptr);
    return r;
  }
};

// =============================== heads and generic tensors ===============================

TEST_F(Validate, HeadsAcceptsValidConfigs) {
  EXPECT_ACCEPTED(validate_heads({32, 8, 128}, {64, 128, 256}));
  EXPECT_ACCEPTED(validate_heads({28, 4, 64}, {64, 128, 256}));
  EXPECT_ACCEPTED(validate_heads({7, 7, 256}, {64, 128, 256}));
  EXPECT_ACCEPTED(validate_heads({5, 1, 96}, {}));  // empty list: any positive head_dim
}

TEST_F(Validate, HeadsRejectsZeroQoHeads) {
  EXPECT_INVALID("num_qo_heads", "= 0", "expected >= 1", validate_heads({0, 8, 128}, {128}));
}

TEST_F(Validate, HeadsRejectsNegativeKvHeads) {
  EXPECT_INVALID("num_kv_heads", "= -2", "expected >= 1", validate_heads({8, -2, 128}, {128}));
}

TEST_F(Validate, HeadsRejectsGroupThatDoesNotDivide) {
  EXPECT_INVALID("num_qo_heads", "= 30", "is not a multiple of num_kv_heads = 8",
                 validate_heads({30, 8, 128}, {64, 128, 256}));
}

TEST_F(Validate, HeadsRejectsUnsupportedHeadDimAsUnsupported) {
  EXPECT_REJECTED(StatusCode::kUnsupported, "head_dim", "= 96",
                  "is not supported (supported: 64, 128, 256)",
                  validate_heads({32, 8, 96}, {64, 128, 256}));
}

TEST_F(Validate, HeadsRejectsZeroHeadDim) {
  EXPECT_INVALID("head_dim", "= 0", "expected >= 1", validate_heads({32, 8, 0}, {64, 128}));
}

TEST_F(Validate, CheckNdim) {
  TensorView q(nullptr, DType::kF16, {2, 3, 4, 5}, Device::cpu());
  EXPECT_ACCEPTED(check_ndim(q, "q", 4));
  EXPECT_INVALID("q.ndim", "= 4", "expected 3", check_ndim(q, "q", 3));
}

TEST_F(Validate, CheckDtypeOneOf) {
  TensorView append_k(nullptr, DType::kF32, {4, 2, 64}, Device::cpu());
  EXPECT_ACCEPTED(check_dtype(append_k, "append_k", {DType::kF16, DType::kF32}));
  EXPECT_INVALID("append_k.dtype", "= f32", "expected one of {f16, bf16}",
                 check_dtype(append_k, "append_k", {DType::kF16, DType::kBF16}));
}

TEST_F(Validate, CheckDtypeSingle) {
  TensorView lse(nullptr, DType::kBF16, {4, 2}, Device::cpu());
  EXPECT_INVALID("lse.dtype", "= bf16", "expected f32", check_dtype(lse, "lse", {DType::kF32}));
}

TEST_F(Validate, CheckOnCuda) {
  TensorView q(nullptr, DType::kF16, {4, 2, 64}, Device::cpu());
  EXPECT_INVALID("q.device", "= cpu", "expected a CUDA device", check_on_cuda(q, "q"));
  TensorView pinned(nullptr, DType::kF16, {4, 2, 64}, Device{DeviceType::kCUDAHost, 0});
  EXPECT_INVALID("q.device", "= cuda_host", "expected a CUDA device", check_on_cuda(pinned, "q"));
  TensorView on_gpu(nullptr, DType::kF16, {4, 2, 64}, Device::cuda(1));
  EXPECT_ACCEPTED(check_on_cuda(on_gpu, "q"));
}

TEST_F(Validate, CheckLastDimContiguous) {
  TensorView k(nullptr, DType::kF16, {4, 2, 64}, {256, 128, 2}, Device::cpu());
  EXPECT_INVALID("k.strides[2]", "= 2", "expected 1 (last dimension must be contiguous)",
                 check_last_dim_contiguous(k, "k"));
  // A size-1 last dim is never stepped through; its stride does not matter.
  TensorView column(nullptr, DType::kF16, {4, 1}, {1, 4}, Device::cpu());
  EXPECT_ACCEPTED(check_last_dim_contiguous(column, "column"));
}

TEST_F(Validate, CheckContiguous) {
  TensorView o(nullptr, DType::kF32, {4, 8}, {1, 4}, Device::cpu());
  EXPECT_INVALID("o.strides", "= [1, 4]", "expected [8, 1]", check_contiguous(o, "o"));
  TensorView packed(nullptr, DType::kF32, {4, 8}, Device::cpu());
  EXPECT_ACCEPTED(check_contiguous(packed, "o"));
}

TEST_F(Validate, CheckSize) {
  TensorView q(nullptr, DType::kF16, {16, 4, 128}, Device::cpu());
  EXPECT_ACCEPTED(check_size(q, "q", 1, 4));
  EXPECT_INVALID("q.shape[1]", "= 4", "expected 8", check_size(q, "q", 1, 8));
  EXPECT_INVALID("q.ndim", "= 3", "expected more than 3", check_size(q, "q", 3, 1));
}

TEST_F(Validate, CheckSameDevice) {
  TensorView k(nullptr, DType::kF16, {4}, Device::cuda(0));
  TensorView v(nullptr, DType::kF16, {4}, Device::cuda(1));
  EXPECT_INVALID("v.device", "= cuda:1", "expected cuda:0 (the device of k)",
                 check_same_device(k, "k", v, "v"));
  EXPECT_ACCEPTED(check_same_device(k, "k", k, "k2"));
}

TEST_F(Validate, RejectsCorruptHandBuiltView) {
  TensorView t(nullptr, DType::kF16, {4}, Device::cpu());
  t.ndim = 9;
  EXPECT_INVALID("t.ndim", "= 9", "out of range [0, 6]", check_ndim(t, "t", 1));
}

// A hand-built view whose element count or byte extent overflows int64 is a named error before
// any null-pointer check: 2^32 x 2^32 x 1 elements used to wrap to a count of 0, so a null data
// pointer passed as "an empty tensor".
TensorView overflowing_view(DType dtype = DType::kF16) {
  TensorView t;
  t.dtype = dtype;
  t.ndim = 3;
  t.shape[0] = t.shape[1] = int64_t{1} << 32;
  t.shape[2] = 1;
  t.strides[0] = t.strides[1] = t.strides[2] = 1;
  return t;
}

TEST_F(Validate, ElementCountOverflowIsNamedBeforeTheNullCheck) {
  const TensorView t = overflowing_view();
  EXPECT_INVALID("q.shape", "[4294967296, 4294967296, 1]", "overflows int64", check_ndim(t, "q", 3));
  EXPECT_INVALID("q.shape", "[4294967296, 4294967296, 1]", "overflows int64", check_contiguous(t, "q"));
  EXPECT_INVALID("q.shape", "[4294967296, 4294967296, 1]", "overflows int64", check_last_dim_contiguous(t, "q"));
  EXPECT_INVALID("q.shape", "[4294967296, 4294967296, 1]", "overflows int64", check_size(t, "q", 2, 1));
  Ragged r;
  r.data = t;
  std::vector<int32_t> indptr = {0, 1};
  r.indptr = host_i32(indptr);
  EXPECT_INVALID("ragged.data.shape", "[4294967296, 4294967296, 1]", "overflows int64",
                 validate_ragged(r, "ragged"));
}

TEST_F(Validate, ByteExtentOverflowIsNamed) {
  // Three f32 elements with a stride of 2^62 - 1: the element count is small, the last element
  // lies 2^64 bytes past the first.
  TensorView t;
  t.dtype = DType::kF32;
  t.ndim = 1;
  t.shape[0] = 3;
  t.strides[0] = INT64_MAX / 2;
  std::vector<float> storage(1);
  t.data = storage.data();
  EXPECT_INVALID("x", "strides [4611686018427387903]", "bytes, which overflows int64", check_ndim(t, "x", 1));
  // The same through an index array of a format, and through K of a paged cache.
  std::vector<int32_t> indptr = {0, 1};
  TensorView bad_indptr = host_i32(indptr);
  bad_indptr.strides[0] = INT64_MAX / 4;
  bad_indptr.shape[0] = 5;
  EXPECT_INVALID("indptr", "strides [2305843009213693951]", "overflows int64",
                 validate_indptr(bad_indptr, "indptr", -1));
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.strides[0] = INT64_MAX / 4;
  EXPECT_INVALID("paged_kv.k", "strides [2305843009213693951", "overflows int64", validate_paged_kv(kv, "paged_kv"));
}

// =============================== indptr ===============================

TEST_F(Validate, IndptrReturnsHostValues) {
  std::vector<int32_t> indptr = {0, 3, 3, 10};
  EXPECT_EQ(validate_indptr(host_i32(indptr), "indptr", 10), indptr);
  EXPECT_EQ(validate_indptr(host_i32(indptr), "indptr", -1), indptr);  // no bound
}

TEST_F(Validate, IndptrOnDeviceIsShapeCheckedOnly) {
  // Deliberately invalid values in an array labelled as device memory: without checked mode they
  // must not be read (here they are host bytes, so reading them would not crash; it would fail).
  std::vector<int32_t> indptr = {5, 1, 99};
  EXPECT_TRUE(validate_indptr(host_i32(indptr, Device::cuda(0)), "indptr", 10).empty());
}

TEST_F(Validate, IndptrRejectsNonZeroStart) {
  std::vector<int32_t> indptr = {2, 3, 5};
  EXPECT_INVALID("indptr[0]", "= 2", "expected 0", validate_indptr(host_i32(indptr), "indptr", 10));
}

TEST_F(Validate, IndptrRejectsDecrease) {
  std::vector<int32_t> indptr = {0, 5, 3, 6};
  EXPECT_INVALID("indptr[2]", "= 3", "expected >= 5", validate_indptr(host_i32(indptr), "indptr", 10));
}

TEST_F(Validate, IndptrRejectsTotalAboveBound) {
  std::vector<int32_t> indptr = {0, 5, 6, 12};
  EXPECT_INVALID("indptr[3]", "= 12", "expected <= 10",
                 validate_indptr(host_i32(indptr), "indptr", 10));
}

TEST_F(Validate, IndptrRejects2D) {
  std::vector<int32_t> values(4);
  TensorView indptr(values.data(), DType::kI32, {2, 2}, Device::cpu());
  EXPECT_INVALID("indptr.ndim", "= 2", "expected 1", validate_indptr(indptr, "indptr", 10));
}

TEST_F(Validate, IndptrRejectsEmpty) {
  std::vector<int32_t> values;
  EXPECT_INVALID("indptr.shape[0]", "= 0", "expected >= 1",
                 validate_indptr(host_i32(values), "indptr", 10));
}

TEST_F(Validate, IndptrRejectsStrided) {
  std::vector<int32_t> values = {0, 9, 1, 9, 2};
  TensorView indptr(values.data(), DType::kI32, {3}, {2}, Device::cpu());
  EXPECT_INVALID("indptr.strides[0]", "= 2", "expected 1 (index arrays must be contiguous)",
                 validate_indptr(indptr, "indptr", 10));
}

TEST_F(Validate, IndptrRejectsFloat) {
  std::vector<float> values = {0, 1};
  TensorView indptr(values.data(), DType::kF32, {2}, Device::cpu());
  EXPECT_INVALID("indptr.dtype", "= f32", "expected i32", validate_indptr(indptr, "indptr", 10));
}

// =============================== Ragged ===============================

TEST_F(Validate, RaggedAcceptsValid) {
  RaggedFixture f;
  EXPECT_ACCEPTED(validate_ragged(f.build(), "ragged"));
  RaggedFixture strided;
  strided.row_pad = 24;
  strided.dtype = DType::kE4M3;
  EXPECT_ACCEPTED(validate_ragged(strided.build(), "ragged"));
  RaggedFixture no_requests;
  no_requests.indptr = {0};
  EXPECT_ACCEPTED(validate_ragged(no_requests.build(), "ragged"));
  RaggedFixture unused_tail;
  unused_tail.indptr = {0, 2, 4};  // rows 4..9 unused
  EXPECT_ACCEPTED(validate_ragged(unused_tail.build(), "ragged"));
}

TEST_F(Validate, RaggedRejects2DData) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data = TensorView(f.storage.data(), DType::kF16, {10, 16}, Device::cpu());
  EXPECT_INVALID("ragged.data.ndim", "= 2", "expected 3 ([total_rows, num_heads, head_dim])",
                 validate_ragged(r, "ragged"));
}

TEST_F(Validate, RaggedRejectsIndptrBeyondRows) {
  RaggedFixture f;
  f.indptr = {0, 3, 11};
  EXPECT_INVALID("ragged.indptr[2]", "= 11", "expected <= 10 (the number of rows of ragged.data)",
                 validate_ragged(f.build(), "ragged"));
}

TEST_F(Validate, RaggedRejectsIndexDtype) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data.dtype = DType::kI32;
  EXPECT_INVALID("ragged.data.dtype", "= i32", "expected one of {f16, bf16, f32, e4m3, e5m2}",
                 validate_ragged(r, "ragged"));
}

TEST_F(Validate, RaggedRejectsStridedLastDim) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data.strides[2] = 2;
  EXPECT_INVALID("ragged.data.strides[2]", "= 2", "expected 1 (last dimension must be contiguous)",
                 validate_ragged(r, "ragged"));
}

TEST_F(Validate, RaggedRejectsIndptrOnAnotherGpu) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data.device = Device::cuda(0);
  r.indptr.device = Device::cuda(1);
  EXPECT_INVALID("ragged.indptr.device", "= cuda:1", "expected cuda:0 (the device of ragged.data) or host memory",
                 validate_ragged(r, "ragged"));
}

TEST_F(Validate, RaggedRejectsMissingData) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data = TensorView();
  EXPECT_INVALID("ragged.data", "is missing", "expected a tensor", validate_ragged(r, "ragged"));
}

TEST_F(Validate, RaggedRejectsNullDataWithElements) {
  RaggedFixture f;
  Ragged r = f.build();
  r.data.data = nullptr;
  EXPECT_INVALID("ragged.data.data", "= null", "expected a pointer to 160 elements",
                 validate_ragged(r, "ragged"));
}

// =============================== PagedKV ===============================

std::string paged_case_name(int64_t page_size, Layout layout, bool combined, bool strided) {
  return "page_size " + std::to_string(page_size) + ", " + layout_name(layout) +
         (combined ? ", combined K/V" : ", separate K/V") + (strided ? ", strided" : ", packed");
}

TEST_F(Validate, PagedAcceptsEveryPageSizeLayoutAndStorage) {
  for (int64_t page_size : {1, 3, 16}) {
    for (Layout layout : {Layout::kNHD, Layout::kHND}) {
      for (bool combined : {false, true}) {
        for (bool strided : {false, true}) {
          SCOPED_TRACE(paged_case_name(page_size, layout, combined, strided));
          PagedFixture f;
          f.page_size = page_size;
          f.layout = layout;
          f.combined = combined;
          f.head_pad = strided ? 8 : 0;
          f.page_pad = strided ? 40 : 0;
          f.last_page_len = {static_cast<int32_t>(page_size), 0, 1};
          const PagedKV kv = f.build();
          EXPECT_EQ(kv.page_size(), page_size);
          EXPECT_EQ(kv.num_kv_heads(), 2);
          EXPECT_ACCEPTED(validate_paged_kv(kv, "paged_kv"));
        }
      }
    }
  }
}

TEST_F(Validate, PagedStridedViewsReportTheirStrides) {
  PagedFixture f;
  f.layout = Layout::kHND;
  f.head_pad = 8;
  f.page_pad = 40;
  const PagedKV kv = f.build();
  EXPECT_FALSE(kv.k.is_contiguous());
  EXPECT_EQ(kv.k_head_stride(), 16 * 16);
  EXPECT_EQ(kv.k_slot_stride(), 16);
  EXPECT_EQ(kv.k_page_stride(), 2 * 16 * 16 + 40);
  EXPECT_ACCEPTED(validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedAcceptsEmptyRequestsAndIgnoresTheirLastPageLen) {
  PagedFixture f;
  f.indptr = {0, 0, 2, 2, 2};
  f.indices = {6, 2};
  f.last_page_len = {0, 7, -5, 1000};  // only request 1 has pages
  EXPECT_ACCEPTED(validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedAcceptsAllEmptyAndZeroBatch) {
  PagedFixture all_empty;
  all_empty.indptr = {0, 0, 0};
  all_empty.indices = {};
  all_empty.last_page_len = {0, 0};
  EXPECT_ACCEPTED(validate_paged_kv(all_empty.build(), "paged_kv"));
  PagedFixture no_requests;
  no_requests.indptr = {0};
  no_requests.indices = {};
  no_requests.last_page_len = {};
  EXPECT_ACCEPTED(validate_paged_kv(no_requests.build(), "paged_kv"));
  PagedFixture no_pages;
  no_pages.num_pages = 0;
  no_pages.indptr = {0, 0};
  no_pages.indices = {};
  no_pages.last_page_len = {3};
  EXPECT_ACCEPTED(validate_paged_kv(no_pages.build(), "paged_kv"));
}

TEST_F(Validate, PagedIgnoresUnusedIndicesTail) {
  PagedFixture f;
  f.indices = {0, 3, 1, 4, 7, -1, 12345};  // a preallocated page table, tail unused
  EXPECT_ACCEPTED(validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedAcceptsPinnedHostIndexArraysWithDeviceData) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.device = kv.v.device = Device::cuda(0);
  kv.indptr.device = kv.indices.device = Device{DeviceType::kCUDAHost, 0};
  EXPECT_ACCEPTED(validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedChecksPinnedHostIndexArraysFully) {
  PagedFixture f;
  f.indices = {0, 3, 1, 8, 7};
  PagedKV kv = f.build();
  kv.k.device = kv.v.device = Device::cuda(0);
  kv.indices.device = Device{DeviceType::kCUDAHost, 0};
  EXPECT_INVALID("paged_kv.indices[3]", "= 8", "is out of range [0, 8)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedSkipsValuesOfDeviceIndexArraysOutsideCheckedMode) {
  PagedFixture f;
  f.indices = {0, 3, 1, 4096, 7};
  f.last_page_len = {0, 0, 99};
  PagedKV kv = f.build();
  kv.k.device = kv.v.device = Device::cuda(0);
  kv.indices.device = kv.last_page_len.device = Device::cuda(0);
  EXPECT_ACCEPTED(validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, CheckedModeReadsDeviceIndexArrays) {
  set_checked_mode(true);
  EXPECT_TRUE(checked_mode());
  PagedFixture f;
  f.indices = {0, 3, 1, 4096, 7};
  PagedKV kv = f.build();
  kv.k.device = kv.v.device = Device::cuda(0);
  kv.indices.device = Device::cuda(0);
  // The array is really host memory: without a GPU (or a driver that refuses it) the copy fails
  // with a CUDA error naming the array; where the driver can read pageable memory the bad value
  // is found instead. Either way it is never accepted.
  try {
    validate_paged_kv(kv, "paged_kv");
    ADD_FAILURE() << "accepted an out-of-range page id in checked mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged_kv.indices"), std::string::npos) << e.what();
    if (e.code() == StatusCode::kCudaError) {
      EXPECT_NE(std::string(e.what()).find("checked mode"), std::string::npos) << e.what();
    } else {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("= 4096"), std::string::npos) << e.what();
    }
  }
  set_checked_mode(false);
  EXPECT_FALSE(checked_mode());
}

TEST_F(Validate, PagedRejectsPageIdPastTheEnd) {
  PagedFixture f;
  f.num_pages = 4096;
  f.page_size = 1;
  f.num_kv_heads = 1;
  f.head_dim = 1;
  f.indptr = {0, 10, 20};
  f.indices.assign(20, 0);
  for (int i = 0; i < 20; ++i) f.indices[i] = i;
  f.indices[17] = 4096;
  f.last_page_len = {1, 1};
  EXPECT_INVALID("paged_kv.indices[17]", "= 4096", "is out of range [0, 4096)",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsNegativePageId) {
  PagedFixture f;
  f.indices = {0, -1, 1, 4, 7};
  EXPECT_INVALID("paged_kv.indices[1]", "= -1", "is out of range [0, 8)",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsZeroLastPageLen) {
  PagedFixture f;
  f.indptr = {0, 1, 1, 3, 5};
  f.indices = {0, 1, 2, 3, 4};
  f.last_page_len = {1, 0, 16, 0};
  EXPECT_INVALID("paged_kv.last_page_len[3]", "= 0",
                 "is out of range [1, 16] for a request with 2 pages",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsLastPageLenAbovePageSize) {
  PagedFixture f;
  f.last_page_len = {17, 0, 16};
  EXPECT_INVALID("paged_kv.last_page_len[0]", "= 17",
                 "is out of range [1, 16] for a request with 2 pages",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsLastPageLenAbovePageSizeOne) {
  PagedFixture f;
  f.page_size = 1;
  f.layout = Layout::kHND;
  f.indptr = {0, 1};
  f.indices = {5};
  f.last_page_len = {2};
  EXPECT_INVALID("paged_kv.last_page_len[0]", "= 2",
                 "is out of range [1, 1] for a request with 1 page",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsLastPageLenOfWrongLength) {
  PagedFixture f;
  f.last_page_len = {5, 0};
  EXPECT_INVALID("paged_kv.last_page_len.shape[0]", "= 2", "expected 3 (batch_size",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsIndptrNotStartingAtZero) {
  PagedFixture f;
  f.indptr = {1, 2, 2, 5};
  EXPECT_INVALID("paged_kv.indptr[0]", "= 1", "expected 0",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsDecreasingIndptr) {
  PagedFixture f;
  f.indptr = {0, 3, 2, 5};
  EXPECT_INVALID("paged_kv.indptr[2]", "= 2", "expected >= 3",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsIndptrPastIndices) {
  PagedFixture f;
  f.indptr = {0, 2, 2, 6};
  EXPECT_INVALID("paged_kv.indptr[3]", "= 6", "expected <= 5 (the length of paged_kv.indices)",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsKVDtypeMismatch) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.v.dtype = DType::kBF16;
  EXPECT_INVALID("paged_kv.v.dtype", "= bf16", "expected f16 (the dtype of paged_kv.k)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsKVShapeMismatch) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.v.shape[2] = 4;
  EXPECT_INVALID("paged_kv.v.shape[2]", "= 4", "expected 2 (paged_kv.k.shape[2]",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsKVDeviceMismatch) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.device = Device::cuda(0);
  kv.v.device = Device::cuda(1);
  EXPECT_INVALID("paged_kv.v.device", "= cuda:1", "expected cuda:0 (the device of paged_kv.k)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejects3DK) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.ndim = 3;
  EXPECT_INVALID("paged_kv.k.ndim", "= 3",
                 "expected 4 (NHD [num_pages, page_size, num_kv_heads, head_dim])",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejects5DKInHND) {
  PagedFixture f;
  f.layout = Layout::kHND;
  PagedKV kv = f.build();
  kv.k = TensorView(f.storage.data(), DType::kF16, {8, 2, 2, 16, 8}, Device::cpu());
  EXPECT_INVALID("paged_kv.k.ndim", "= 5",
                 "expected 4 (HND [num_pages, num_kv_heads, page_size, head_dim])",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsStridedHeadDimInK) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.strides[3] = 2;
  EXPECT_INVALID("paged_kv.k.strides[3]", "= 2", "expected 1 (last dimension must be contiguous)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsStridedHeadDimInCombinedV) {
  PagedFixture f;
  f.combined = true;
  f.layout = Layout::kHND;
  PagedKV kv = f.build();
  kv.v.strides[3] = 3;
  EXPECT_INVALID("paged_kv.v.strides[3]", "= 3", "expected 1 (last dimension must be contiguous)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsZeroPageSizeNHD) {
  PagedFixture f;
  f.page_size = 0;
  f.indptr = {0};
  f.indices = {};
  f.last_page_len = {};
  EXPECT_INVALID("paged_kv.page_size", "= 0 (paged_kv.k.shape[1])", "expected >= 1",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsZeroPageSizeHND) {
  PagedFixture f;
  f.layout = Layout::kHND;
  f.page_size = 0;
  f.indptr = {0};
  f.indices = {};
  f.last_page_len = {};
  EXPECT_INVALID("paged_kv.page_size", "= 0 (paged_kv.k.shape[2])", "expected >= 1",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedRejectsFloatIndices) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.indices.dtype = DType::kF32;
  EXPECT_INVALID("paged_kv.indices.dtype", "= f32", "expected i32",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejects2DIndices) {
  PagedFixture f;
  f.indices = {0, 3, 1, 4, 7, 2};
  PagedKV kv = f.build();
  kv.indices = TensorView(f.indices.data(), DType::kI32, {2, 3}, Device::cpu());
  EXPECT_INVALID("paged_kv.indices.ndim", "= 2", "expected 1", validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsUnknownLayout) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.layout = static_cast<Layout>(7);
  EXPECT_INVALID("paged_kv.layout", "= 7", "expected NHD (0) or HND (1)",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsIndexDtypeForData) {
  PagedFixture f;
  f.dtype = DType::kU8;
  EXPECT_INVALID("paged_kv.k.dtype", "= u8", "expected one of {f16, bf16, f32, e4m3, e5m2}",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, PagedAcceptsEveryDataDtype) {
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32, DType::kE4M3, DType::kE5M2}) {
    SCOPED_TRACE(dtype_name(dtype));
    PagedFixture f;
    f.dtype = dtype;
    EXPECT_ACCEPTED(validate_paged_kv(f.build(), "paged_kv"));
  }
}

TEST_F(Validate, PagedRejectsNullK) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.data = nullptr;
  EXPECT_INVALID("paged_kv.k.data", "= null", "expected a pointer to 2048 elements",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsMissingLastPageLen) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.last_page_len = TensorView();
  EXPECT_INVALID("paged_kv.last_page_len", "is missing", "expected a tensor",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsNegativeStride) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.strides[0] = -256;
  EXPECT_INVALID("paged_kv.k.strides[0]", "= -256", "expected >= 0",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsIndptrOnAnotherGpu) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.k.device = kv.v.device = Device::cuda(0);
  kv.indptr.device = Device::cuda(1);
  EXPECT_INVALID("paged_kv.indptr.device", "= cuda:1",
                 "expected cuda:0 (the device of paged_kv.k) or host memory",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, PagedRejectsDeviceIndicesWithHostData) {
  PagedFixture f;
  PagedKV kv = f.build();
  kv.indices.device = Device::cuda(0);
  EXPECT_INVALID("paged_kv.indices.device", "= cuda:0",
                 "expected cpu (the device of paged_kv.k) or host memory",
                 validate_paged_kv(kv, "paged_kv"));
}

TEST_F(Validate, CombinedPagedRejectsBadPageIdInHND) {
  PagedFixture f;
  f.combined = true;
  f.layout = Layout::kHND;
  f.page_size = 3;
  f.indices = {0, 3, 1, 4, 9};
  f.last_page_len = {3, 0, 1};
  EXPECT_INVALID("paged_kv.indices[4]", "= 9", "is out of range [0, 8)",
                 validate_paged_kv(f.build(), "paged_kv"));
}

TEST_F(Validate, CombinedPagedRejectsBadLastPageLenInNHD) {
  PagedFixture f;
  f.combined = true;
  f.page_size = 3;
  f.last_page_len = {3, 0, 4};
  EXPECT_INVALID("paged_kv.last_page_len[2]", "= 4",
                 "is out of range [1, 3] for a request with 3 pages",
                 validate_paged_kv(f.build(), "paged_kv"));
}

// =============================== BlockSparse ===============================

TEST_F(Validate, BlockSparseAcceptsValid) {
  BlockSparseFixture with_flags;
  EXPECT_ACCEPTED(validate_block_sparse(with_flags.build(), "bs"));
  BlockSparseFixture without_flags;
  without_flags.with_flags = false;
  EXPECT_ACCEPTED(validate_block_sparse(without_flags.build(), "bs"));
  BlockSparseFixture vector_sparse;  // Bc = 1, Br = 1
  vector_sparse.block_rows = 1;
  vector_sparse.block_cols = 1;
  vector_sparse.num_rows = 2;
  vector_sparse.indptr = {0, 3, 4};
  vector_sparse.indices = {0, 5, 9, 2};
  vector_sparse.flags = {1, 1, 1, 1};
  EXPECT_ACCEPTED(validate_block_sparse(vector_sparse.build(), "bs"));
  BlockSparseFixture no_rows;
  no_rows.num_rows = 0;
  no_rows.indptr = {0};
  EXPECT_ACCEPTED(validate_block_sparse(no_rows.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsZeroBlockRows) {
  BlockSparseFixture f;
  f.block_rows = 0;
  EXPECT_INVALID("bs.block_rows", "= 0", "expected >= 1", validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsNegativeBlockCols) {
  BlockSparseFixture f;
  f.block_cols = -4;
  EXPECT_INVALID("bs.block_cols", "= -4", "expected >= 1", validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsNegativeRows) {
  BlockSparseFixture f;
  f.num_rows = -1;
  EXPECT_INVALID("bs.num_rows", "= -1", "expected >= 0", validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsIndptrOfWrongLength) {
  BlockSparseFixture f;
  f.num_rows = 5;  // 3 block rows, but indptr has 5 entries
  EXPECT_INVALID("bs.indptr.shape[0]", "= 5",
                 "expected 4 (ceil(num_rows / block_rows) + 1 with num_rows = 5, block_rows = 2)",
                 validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsColumnBlockPastTheEnd) {
  BlockSparseFixture f;
  f.indices = {0, 2, 0, 1, 3, 1};
  EXPECT_INVALID("bs.indices[4]", "= 3", "is out of range [0, 3)",
                 validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsRepeatedColumnBlock) {
  BlockSparseFixture f;
  f.indices = {0, 2, 1, 1, 2, 1};
  EXPECT_INVALID("bs.indices[3]", "= 1",
                 "expected > 1 (bs.indices[2]; column blocks must be strictly increasing within "
                 "block row 2)",
                 validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsDecreasingColumnBlocks) {
  BlockSparseFixture f;
  f.indices = {2, 0, 0, 1, 2, 1};
  EXPECT_INVALID("bs.indices[1]", "= 0", "expected > 2", validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseAllowsRestartAcrossRows) {
  BlockSparseFixture f;
  f.indices = {1, 2, 0, 1, 2, 0};  // each row starts over
  EXPECT_ACCEPTED(validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsFlagsOfWrongDtype) {
  BlockSparseFixture f;
  BlockSparse bs = f.build();
  std::vector<int32_t> flags(6, 1);
  bs.block_flags = host_i32(flags);
  EXPECT_INVALID("bs.block_flags.dtype", "= i32", "expected u8", validate_block_sparse(bs, "bs"));
}

TEST_F(Validate, BlockSparseRejectsFlagsOfWrongLength) {
  BlockSparseFixture f;
  f.flags = {1, 0, 1};
  EXPECT_INVALID("bs.block_flags.shape[0]", "= 3", "expected 6 (the length of bs.indices)",
                 validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejectsFlagValue) {
  BlockSparseFixture f;
  f.flags = {1, 0, 2, 1, 0, 1};
  EXPECT_INVALID("bs.block_flags[2]", "= 2", "expected 0 (partial block) or 1 (full block)",
                 validate_block_sparse(f.build(), "bs"));
}

TEST_F(Validate, BlockSparseRejects4DK) {
  BlockSparseFixture f;
  BlockSparse bs = f.build();
  bs.k = TensorView(f.storage.data(), DType::kBF16, {10, 1, 2, 8}, Device::cpu());
  EXPECT_INVALID("bs.k.ndim", "= 4", "expected 3 ([num_cols, num_kv_heads, head_dim])",
                 validate_block_sparse(bs, "bs"));
}

TEST_F(Validate, BlockSparseRejectsKVShapeMismatch) {
  BlockSparseFixture f;
  BlockSparse bs = f.build();
  bs.v.shape[0] = 9;
  EXPECT_INVALID("bs.v.shape[0]", "= 9", "expected 10 (bs.k.shape[0]",
                 validate_block_sparse(bs, "bs"));
}

// =============================== Composable ===============================

struct ComposableFixture {
  RaggedFixture prefix;
  PagedFixture suffix;
  BlockSparseFixture sparse;
  Composable build() {
    prefix.num_heads = 2;
    prefix.head_dim = 8;
    sparse.num_kv_heads = 2;
    sparse.head_dim = 8;
    Composable c;
    c.levels.emplace_back(prefix.build());
    c.levels.emplace_back(suffix.build());
    BlockSparse bs = sparse.build();
    bs.k.dtype = bs.v.dtype = DType::kF16;
    c.levels.emplace_back(bs);
    return c;
  }
};

TEST_F(Validate, ComposableAcceptsMixedLevels) {
  ComposableFixture f;
  EXPECT_ACCEPTED(validate_composable(f.build(), "composable"));
  PagedFixture single;
  Composable one;
  one.levels.emplace_back(single.build());
  EXPECT_ACCEPTED(validate_composable(one, "composable"));
}

TEST_F(Validate, ComposableRejectsNoLevels) {
  EXPECT_INVALID("composable.levels", "size() = 0", "expected at least 1 level",
                 validate_composable(Composable{}, "composable"));
}

TEST_F(Validate, ComposableRejectsInvalidLevel) {
  ComposableFixture f;
  f.suffix.indices = {0, 3, 1, 4, 8};
  EXPECT_INVALID("composable.levels[1].indices[4]", "= 8", "is out of range [0, 8)",
                 validate_composable(f.build(), "composable"));
}

TEST_F(Validate, ComposableRejectsHeadCountMismatch) {
  ComposableFixture f;
  f.suffix.num_kv_heads = 4;
  EXPECT_INVALID("composable.levels[1].num_kv_heads", "= 4",
                 "expected 2 (the num_kv_heads of composable.levels[0])",
                 validate_composable(f.build(), "composable"));
}

TEST_F(Validate, ComposableRejectsHeadDimMismatch) {
  ComposableFixture f;
  Composable c = f.build();
  BlockSparse& bs = std::get<BlockSparse>(c.levels[2]);
  bs.k.shape[2] = bs.v.shape[2] = 4;
  EXPECT_INVALID("composable.levels[2].head_dim", "= 4",
                 "expected 8 (the head_dim of composable.levels[0])",
                 validate_composable(c, "composable"));
}

TEST_F(Validate, ComposableRejectsDtypeMismatch) {
  ComposableFixture f;
  f.suffix.dtype = DType::kBF16;
  EXPECT_INVALID("composable.levels[1].dtype", "= bf16",
                 "expected f16 (the dtype of composable.levels[0])",
                 validate_composable(f.build(), "composable"));
}

TEST_F(Validate, ComposableRejectsDeviceMismatch) {
  ComposableFixture f;
  Composable c = f.build();
  PagedKV& paged = std::get<PagedKV>(c.levels[1]);
  paged.k.device = paged.v.device = Device::cuda(1);
  paged.indptr.device = paged.indices.device = paged.last_page_len.device = Device::cpu();
  EXPECT_INVALID("composable.levels[1].device", "= cuda:1",
                 "expected cpu (the device of composable.levels[0])",
                 validate_composable(c, "composable"));
}

}  // namespace
}  // namespace tessera
