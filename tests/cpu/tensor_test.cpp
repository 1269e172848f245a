// TensorView, name tables, PagedKV::from_combined and DLPack interop; host memory only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dlpack.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs `f`, expects a tessera::Error with `code`, and returns its message ("" if none was thrown).
template <typename F>
std::string error_message(F&& f, StatusCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a tessera::Error";
  return "";
}

char* byte_ptr(std::vector<char>& buffer, int64_t offset) { return buffer.data() + offset; }

TEST(TensorView, ContiguousConstructorComputesRowMajorStrides) {
  std::vector<uint16_t> data(2 * 3 * 4);
  TensorView t(data.data(), DType::kBF16, {2, 3, 4}, Device::cuda(1));
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48);
  EXPECT_EQ(t.device, Device::cuda(1));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.defined());
}

TEST(TensorView, ExplicitStrides) {
  std::vector<float> data(100);
  TensorView t(data.data(), DType::kF32, {3, 4}, {10, 1}, Device::cpu());
  EXPECT_EQ(t.stride(0), 10);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorView, DefaultIsUndefinedScalarOfOneElement) {
  TensorView t;
  EXPECT_EQ(t.ndim, 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_FALSE(t.defined());
}

TEST(TensorView, EmptyTensorWithNullDataIsDefined) {
  TensorView t(nullptr, DType::kI32, {0}, Device::cpu());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.defined());
  EXPECT_TRUE(t.is_contiguous());
  TensorView s(nullptr, DType::kI32, {5, 0, 3}, {1, 7, 100}, Device::cpu());
  EXPECT_TRUE(s.is_contiguous());
}

TEST(TensorView, TooManyDimsThrows) {
  const std::string msg = error_message(
      [] { TensorView t(nullptr, DType::kF32, {1, 1, 1, 1, 1, 1, 1}, Device::cpu()); },
      StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, AllOf(HasSubstr("shape"), HasSubstr("7"), HasSubstr("at most 6")));
}

TEST(TensorView, NegativeSizeThrows) {
  const std::string msg = error_message(
      [] { TensorView t(nullptr, DType::kF32, {2, -3}, Device::cpu()); },
      StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, AllOf(HasSubstr("shape[1]"), HasSubstr("-3"), HasSubstr(">= 0")));
}

TEST(TensorView, StridesLengthMismatchThrows) {
  const std::string msg = error_message(
      [] { TensorView t(nullptr, DType::kF32, {2, 3}, {3, 1, 1}, Device::cpu()); },
      StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, AllOf(HasSubstr("strides"), HasSubstr("3 entries"), HasSubstr("expected 2")));
}

TEST(TensorView, NegativeStrideThrows) {
  const std::string msg = error_message(
      [] { TensorView t(nullptr, DType::kF32, {2, 3}, {-3, 1}, Device::cpu()); },
      StatusCode::kInvalidArgument);
  EXPECT_THAT(msg, AllOf(HasSubstr("strides[0]"), HasSubstr("-3"), HasSubstr(">= 0")));
}

// Shapes and strides whose element count or byte extent does not fit in int64 are named errors,
// never undefined behaviour: 2^32 x 2^32 elements used to wrap to a count of 0, which made a
// null view look "defined" (no element to point to) and slipped past the null-pointer checks.
constexpr int64_t k2Pow32 = int64_t{1} << 32;

TEST(TensorView, ElementCountOverflowThrows) {
  EXPECT_THAT(error_message([] { TensorView t(nullptr, DType::kF16, {k2Pow32, k2Pow32}, Device::cpu()); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("TensorView"), HasSubstr("[4294967296, 4294967296]"), HasSubstr("overflows int64")));
  EXPECT_THAT(error_message(
                  [] { TensorView t(nullptr, DType::kF16, {k2Pow32, k2Pow32}, {1, 1}, Device::cpu()); },
                  StatusCode::kInvalidArgument),
              AllOf(HasSubstr("[4294967296, 4294967296]"), HasSubstr("overflows int64")));
}

TEST(TensorView, RowMajorStrideOverflowThrowsEvenForAnEmptyShape) {
  // No element, but the stride of dim 0 would be 2^80.
  const int64_t big = int64_t{1} << 40;
  EXPECT_THAT(error_message([&] { TensorView t(nullptr, DType::kU8, {0, big, big}, Device::cpu()); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("[0, 1099511627776, 1099511627776]"), HasSubstr("overflows int64")));
}

TEST(TensorView, ByteExtentOverflowThrows) {
  // 4 elements, but the last one lies 2^62 elements (2^63 bytes of bf16) past the first.
  const int64_t stride = INT64_MAX / 2;
  EXPECT_THAT(error_message([&] { TensorView t(nullptr, DType::kBF16, {2, 2}, {stride, 1}, Device::cpu()); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("strides [4611686018427387903, 1]"), HasSubstr("bytes"), HasSubstr("overflows int64")));
  // 2^62 contiguous bf16 elements: the count fits, the byte size does not.
  EXPECT_THAT(error_message([] { TensorView t(nullptr, DType::kBF16, {int64_t{1} << 62}, Device::cpu()); },
                            StatusCode::kInvalidArgument),
              HasSubstr("overflows int64"));
}

TEST(TensorView, HandBuiltOverflowingViewThrowsFromNumelAndNbytes) {
  TensorView t;
  t.ndim = 2;
  t.shape[0] = t.shape[1] = k2Pow32;
  t.strides[0] = 1;
  t.strides[1] = 1;
  EXPECT_THAT(error_message([&] { (void)t.numel(); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("[4294967296, 4294967296]"), HasSubstr("overflows int64")));
  EXPECT_THAT(error_message([&] { (void)t.defined(); }, StatusCode::kInvalidArgument), HasSubstr("overflows int64"));
  TensorView wide;
  wide.dtype = DType::kF32;
  wide.ndim = 1;
  wide.shape[0] = int64_t{1} << 62;  // 2^64 bytes
  wide.strides[0] = 1;
  EXPECT_EQ(wide.numel(), int64_t{1} << 62);
  EXPECT_THAT(error_message([&] { (void)wide.nbytes(); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("bytes"), HasSubstr("overflows int64")));
  // A zero-size dimension makes any other count harmless.
  TensorView empty = t;
  empty.shape[0] = 0;
  EXPECT_EQ(empty.numel(), 0);
}

TEST(TensorView, ContiguityIgnoresSizeOneDims) {
  TensorView t(nullptr, DType::kF16, {4, 1, 8}, {8, 12345, 1}, Device::cpu());
  EXPECT_TRUE(t.is_contiguous());
  TensorView transposed(nullptr, DType::kF16, {4, 8}, {1, 4}, Device::cpu());
  EXPECT_FALSE(transposed.is_contiguous());
  TensorView padded_rows(nullptr, DType::kF16, {4, 8}, {16, 1}, Device::cpu());
  EXPECT_FALSE(padded_rows.is_contiguous());
  TensorView scalar(nullptr, DType::kF16, {}, Device::cpu());
  EXPECT_TRUE(scalar.is_contiguous());
}

TEST(TensorView, SelectDropsDimAndOffsetsData) {
  std::vector<char> buffer(4096);
  // [pages=3, 2, slots=4, heads=2, dim=8] bf16, padded page stride.
  TensorView kv(buffer.data(), DType::kBF16, {3, 2, 4, 2, 8}, {200, 64, 16, 8, 1}, Device::cpu());
  TensorView v = kv.select(1, 1);
  EXPECT_EQ(v.ndim, 4);
  EXPECT_EQ(v.data, byte_ptr(buffer, 64 * 2));
  EXPECT_EQ(v.size(0), 3);
  EXPECT_EQ(v.size(1), 4);
  EXPECT_EQ(v.size(3), 8);
  EXPECT_EQ(v.stride(0), 200);
  EXPECT_EQ(v.stride(1), 16);
  EXPECT_EQ(v.stride(3), 1);
  TensorView last = kv.select(-1, 5);
  EXPECT_EQ(last.ndim, 4);
  EXPECT_EQ(last.data, byte_ptr(buffer, 5 * 2));
  EXPECT_EQ(last.size(-1), 2);
  TensorView row = kv.select(0, 2);
  EXPECT_EQ(row.data, byte_ptr(buffer, 400 * 2));
}

TEST(TensorView, SelectErrorsNameDimAndIndex) {
  TensorView t(nullptr, DType::kF32, {2, 3}, Device::cpu());
  EXPECT_THAT(error_message([&] { t.select(2, 0); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("dim = 2"), HasSubstr("[-2, 2)")));
  EXPECT_THAT(error_message([&] { t.select(-3, 0); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("dim = -3"), HasSubstr("[-2, 2)")));
  EXPECT_THAT(error_message([&] { t.select(1, 3); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("index = 3"), HasSubstr("[0, 3)"), HasSubstr("dimension 1")));
  EXPECT_THAT(error_message([&] { t.select(0, -1); }, StatusCode::kInvalidArgument),
              AllOf(HasSubstr("index = -1"), HasSubstr("[0, 2)")));
  TensorView scalar(nullptr, DType::kF32, {}, Device::cpu());
  EXPECT_THAT(error_message([&] { scalar.select(0, 0); }, StatusCode::kInvalidArgument),
              HasSubstr("dim = 0"));
}

TEST(TensorView, Describe) {
  TensorView t(nullptr, DType::kBF16, {4, 16, 8, 128}, Device::cuda(0));
  EXPECT_EQ(t.describe(), "bf16[4, 16, 8, 128] strides [16384, 1024, 128, 1] on cuda:0");
  TensorView s(nullptr, DType::kI32, {}, Device::cpu());
  EXPECT_EQ(s.describe(), "i32[] strides [] on cpu");
}

TEST(Names, Devices) {
  EXPECT_EQ(to_string(Device::cpu()), "cpu");
  EXPECT_EQ(to_string(Device::cuda()), "cuda:0");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
  EXPECT_EQ(to_string(Device{DeviceType::kCUDAHost, 0}), "cuda_host");
  EXPECT_TRUE(Device::cpu().is_host());
  EXPECT_TRUE((Device{DeviceType::kCUDAHost, 0}.is_host()));
  EXPECT_FALSE(Device::cuda().is_host());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
}

TEST(Names, DTypes) {
  EXPECT_STREQ(dtype_name(DType::kF16), "f16");
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::kF32), "f32");
  EXPECT_STREQ(dtype_name(DType::kE4M3), "e4m3");
  EXPECT_STREQ(dtype_name(DType::kE5M2), "e5m2");
  EXPECT_STREQ(dtype_name(DType::kI32), "i32");
  EXPECT_STREQ(dtype_name(DType::kU8), "u8");
  EXPECT_STREQ(dtype_name(DType::kI64), "i64");
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kE4M3), 1u);
  EXPECT_TRUE(is_half_precision(DType::kBF16));
  EXPECT_FALSE(is_half_precision(DType::kF32));
}

TEST(Names, LayoutsAndStatusCodes) {
  EXPECT_STREQ(layout_name(Layout::kNHD), "NHD");
  EXPECT_STREQ(layout_name(Layout::kHND), "HND");
  EXPECT_STREQ(status_code_name(StatusCode::kOk), "ok");
  EXPECT_STREQ(status_code_name(StatusCode::kInvalidArgument), "invalid_argument");
  EXPECT_STREQ(status_code_name(StatusCode::kUnsupported), "unsupported");
  EXPECT_STREQ(status_code_name(StatusCode::kCudaError), "cuda_error");
  EXPECT_STREQ(status_code_name(StatusCode::kInternal), "internal");
}

TEST(Version, MatchesHeaderMacros) {
  const std::string expected = std::to_string(TESSERA_VERSION_MAJOR) + "." +
                               std::to_string(TESSERA_VERSION_MINOR) + "." +
                               std::to_string(TESSERA_VERSION_PATCH);
  EXPECT_EQ(version_string(), expected);
}

TEST(Status, StatusOfCatchesErrors) {
  Status ok = status_of([] {});
  EXPECT_TRUE(ok.ok());
  Status bad = status_of([] { TensorView t(nullptr, DType::kF32, {-1}, Device::cpu()); });
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code, StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message, HasSubstr("shape[0] = -1"));
}

TEST(PagedKVFromCombined, NHDSplitsKAndV) {
  std::vector<char> buffer(1 << 16);
  const int64_t pages = 5, page_size = 3, heads = 2, dim = 16;
  TensorView kv(buffer.data(), DType::kF16, {pages, 2, page_size, heads, dim}, Device::cpu());
  TensorView indptr(nullptr, DType::kI32, {0}, Device::cpu());
  PagedKV p = PagedKV::from_combined(kv, Layout::kNHD, indptr, indptr, indptr);
  EXPECT_EQ(p.k.data, buffer.data());
  EXPECT_EQ(p.v.data, byte_ptr(buffer, page_size * heads * dim * 2));
  EXPECT_EQ(p.num_pages(), pages);
  EXPECT_EQ(p.page_size(), page_size);
  EXPECT_EQ(p.num_kv_heads(), heads);
  EXPECT_EQ(p.head_dim(), dim);
  EXPECT_EQ(p.k_page_stride(), 2 * page_size * heads * dim);
  EXPECT_EQ(p.v_page_stride(), 2 * page_size * heads * dim);
  EXPECT_EQ(p.k_slot_stride(), heads * dim);
  EXPECT_EQ(p.k_head_stride(), dim);
  EXPECT_EQ(p.layout, Layout::kNHD);
}

TEST(PagedKVFromCombined, HNDSplitsKAndV) {
  std::vector<char> buffer(1 << 16);
  const int64_t pages = 4, page_size = 16, heads = 3, dim = 8;
  TensorView kv(buffer.data(), DType::kBF16, {pages, 2, heads, page_size, dim}, Device::cpu());
  TensorView none;
  PagedKV p = PagedKV::from_combined(kv, Layout::kHND, none, none, none);
  EXPECT_EQ(p.v.data, byte_ptr(buffer, heads * page_size * dim * 2));
  EXPECT_EQ(p.page_size(), page_size);
  EXPECT_EQ(p.num_kv_heads(), heads);
  EXPECT_EQ(p.v_slot_stride(), dim);
  EXPECT_EQ(p.v_head_stride(), page_size * dim);
}

TEST(PagedKVFromCombined, RejectsWrongRankOrKVAxis) {
  TensorView none;
  TensorView four_d(nullptr, DType::kF16, {4, 16, 8, 64}, Device::cpu());
  EXPECT_THAT(
      error_message([&] { PagedKV::from_combined(four_d, Layout::kNHD, none, none, none); },
                    StatusCode::kInvalidArgument),
      AllOf(HasSubstr("kv.ndim = 4"), HasSubstr("expected 5")));
  TensorView three_kv(nullptr, DType::kF16, {4, 3, 16, 8, 64}, Device::cpu());
  EXPECT_THAT(
      error_message([&] { PagedKV::from_combined(three_kv, Layout::kHND, none, none, none); },
                    StatusCode::kInvalidArgument),
      AllOf(HasSubstr("kv.shape[1] = 3"), HasSubstr("expected 2")));
}

// ---- DLPack ----

DLTensor make_dl(void* data, DLDataType dtype, int64_t* shape, int ndim, int64_t* strides,
                 DLDevice device = {kDLCPU, 0}, uint64_t byte_offset = 0) {
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = byte_offset;
  return t;
}

TEST(DLPack, NullStridesMeanRowMajor) {
  std::vector<uint16_t> data(2 * 3 * 4);
  int64_t shape[] = {2, 3, 4};
  DLTensor dl = make_dl(data.data(), {kDLFloat, 16, 1}, shape, 3, nullptr);
  TensorView t = from_dlpack(dl);
  EXPECT_EQ(t.dtype, DType::kF16);
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(t.device, Device::cpu());
  EXPECT_EQ(t.data, data.data());
}

TEST(DLPack, RoundTripKeepsStridesDtypeAndDevice) {
  std::vector<uint16_t> data(1000);
  int64_t shape[] = {3, 5, 7};
  int64_t strides[] = {80, 16, 1};
  DLTensor dl = make_dl(data.data(), {kDLBfloat, 16, 1}, shape, 3, strides, {kDLCUDA, 2});
  TensorView t = from_dlpack(dl);
  EXPECT_EQ(t.dtype, DType::kBF16);
  EXPECT_EQ(t.device, Device::cuda(2));
  EXPECT_EQ(t.stride(0), 80);
  EXPECT_EQ(t.stride(1), 16);
  DLTensor back = to_dlpack(t);
  EXPECT_EQ(back.data, data.data());
  EXPECT_EQ(back.device.device_type, kDLCUDA);
  EXPECT_EQ(back.device.device_id, 2);
  EXPECT_EQ(back.ndim, 3);
  EXPECT_EQ(back.dtype.code, kDLBfloat);
  EXPECT_EQ(back.dtype.bits, 16);
  EXPECT_EQ(back.dtype.lanes, 1);
  EXPECT_EQ(back.byte_offset, 0u);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(back.shape[d], shape[d]);
    EXPECT_EQ(back.strides[d], strides[d]);
  }
  // The DLTensor points into the view rather than copying.
  EXPECT_EQ(back.shape, t.shape);
  EXPECT_EQ(back.strides, t.strides);
}

TEST(DLPack, AllDTypesRoundTrip) {
  struct Case {
    DType dtype;
    uint8_t code;
    uint8_t bits;
  };
  const Case cases[] = {
      {DType::kF16, kDLFloat, 16},  {DType::kBF16, kDLBfloat, 16}, {DType::kF32, kDLFloat, 32},
      {DType::kE4M3, 10, 8},        {DType::kE5M2, 12, 8},         {DType::kI32, kDLInt, 32},
      {DType::kU8, kDLUInt, 8},     {DType::kI64, kDLInt, 64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(dtype_name(c.dtype));
    int64_t shape[] = {4};
    std::vector<uint64_t> data(4);
    TensorView t = from_dlpack(make_dl(data.data(), {c.code, c.bits, 1}, shape, 1, nullptr));
    EXPECT_EQ(t.dtype, c.dtype);
    TensorView view(data.data(), c.dtype, {4}, Device::cpu());
    DLTensor dl = to_dlpack(view);
    EXPECT_EQ(dl.dtype.code, c.code);
    EXPECT_EQ(dl.dtype.bits, c.bits);
    EXPECT_EQ(dl.dtype.lanes, 1);
  }
}

TEST(DLPack, CudaHostAndCpuDevices) {
  int64_t shape[] = {2};
  float data[2] = {};
  TensorView pinned = from_dlpack(make_dl(data, {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLCUDAHost, 0}));
  EXPECT_EQ(pinned.device.type, DeviceType::kCUDAHost);
  EXPECT_EQ(to_dlpack(pinned).device.device_type, kDLCUDAHost);
  TensorView cpu = from_dlpack(make_dl(data, {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLCPU, 0}));
  EXPECT_EQ(cpu.device.type, DeviceType::kCPU);
  EXPECT_EQ(to_dlpack(cpu).device.device_type, kDLCPU);
}

TEST(DLPack, ByteOffsetIsFoldedIntoData) {
  std::vector<char> buffer(256);
  int64_t shape[] = {8};
  DLTensor dl = make_dl(buffer.data(), {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLCPU, 0}, 64);
  TensorView t = from_dlpack(dl);
  EXPECT_EQ(t.data, byte_ptr(buffer, 64));
  EXPECT_EQ(to_dlpack(t).byte_offset, 0u);
}

TEST(DLPack, ScalarAndEmpty) {
  float x = 1.0f;
  TensorView s = from_dlpack(make_dl(&x, {kDLFloat, 32, 1}, nullptr, 0, nullptr));
  EXPECT_EQ(s.ndim, 0);
  EXPECT_EQ(s.numel(), 1);
  int64_t shape[] = {0, 4};
  TensorView e = from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 2, nullptr));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.defined());
}

TEST(DLPack, RejectsUnknownDType) {
  int64_t shape[] = {4};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 64, 1}, shape, 1, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor.dtype"), HasSubstr("code 2, bits 64"),
                    HasSubstr("expected one of"), HasSubstr("bf16")));
  // fp8 codes with the wrong width, and a DLPack 1.0 fp8 flavour Tessera does not speak.
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {10, 16, 1}, shape, 1, nullptr)); },
                            StatusCode::kInvalidArgument),
              HasSubstr("code 10, bits 16"));
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {11, 8, 1}, shape, 1, nullptr)); },
                            StatusCode::kInvalidArgument),
              HasSubstr("code 11, bits 8"));
}

TEST(DLPack, RejectsVectorLanes) {
  int64_t shape[] = {4};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 4}, shape, 1, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("lanes = 4"), HasSubstr("expected 1")));
}

TEST(DLPack, RejectsUnsupportedDevice) {
  int64_t shape[] = {4};
  EXPECT_THAT(
      error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLROCM, 0})); },
                    StatusCode::kInvalidArgument),
      AllOf(HasSubstr("device_type = 10"), HasSubstr("kDLROCM"), HasSubstr("expected kDLCPU")));
  EXPECT_THAT(
      error_message(
          [&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLCUDAManaged, 0})); },
          StatusCode::kInvalidArgument),
      AllOf(HasSubstr("device_type = 13"), HasSubstr("kDLCUDAManaged")));
}

TEST(DLPack, RejectsTooManyDims) {
  int64_t shape[] = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 7, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor.ndim = 7"), HasSubstr("[0, 6]")));
}

TEST(DLPack, RejectsMisalignedByteOffset) {
  std::vector<char> buffer(64);
  int64_t shape[] = {4};
  EXPECT_THAT(error_message(
                  [&] {
                    from_dlpack(make_dl(buffer.data(), {kDLFloat, 32, 1}, shape, 1, nullptr, {kDLCPU, 0}, 6));
                  },
                  StatusCode::kInvalidArgument),
              AllOf(HasSubstr("byte_offset = 6"), HasSubstr("multiple of 4")));
}

TEST(DLPack, RejectsNegativeShapeAndStrides) {
  int64_t bad_shape[] = {2, -1};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, bad_shape, 2, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor.shape[1] = -1"), HasSubstr(">= 0")));
  int64_t shape[] = {2, 3};
  int64_t strides[] = {-3, 1};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 2, strides)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor.strides[0] = -3"), HasSubstr(">= 0")));
}

TEST(DLPack, RejectsElementCountOverflow) {
  int64_t shape[] = {k2Pow32, k2Pow32};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 16, 1}, shape, 2, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor"), HasSubstr("[4294967296, 4294967296]"), HasSubstr("overflows int64")));
  int64_t empty_shape[] = {0, int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLUInt, 8, 1}, empty_shape, 3, nullptr)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor"), HasSubstr("overflows int64")));
}

TEST(DLPack, RejectsByteExtentOverflow) {
  int64_t shape[] = {3};
  int64_t strides[] = {INT64_MAX / 2};
  EXPECT_THAT(error_message([&] { from_dlpack(make_dl(nullptr, {kDLFloat, 32, 1}, shape, 1, strides)); },
                            StatusCode::kInvalidArgument),
              AllOf(HasSubstr("DLTensor"), HasSubstr("bytes"), HasSubstr("overflows int64")));
}

}  // namespace
}  // namespace tessera
