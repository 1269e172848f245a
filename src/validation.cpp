// Host-side validation of tensors and KV formats (docs/design.md §4). Every message names the argument,
// the offending value and what was expected, so a caller can fix the input from the message alone.
//
// Index arrays in host memory (kCPU, kCUDAHost) are always read and checked. Device-resident ones
// are read only in checked mode: the copy synchronises the device, which a serving loop cannot
// afford on every call, and the kernels skip out-of-range entries without it.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "check.h"
#include "tensor_checks.h"
#include "tessera/validate.h"

namespace tessera {
namespace {

// What formats may describe; kernels narrow this further when they dispatch.
constexpr DType kKVDataDTypes[] = {DType::kF16, DType::kBF16, DType::kF32, DType::kE4M3,
                                   DType::kE5M2};
constexpr size_t kNumKVDataDTypes = sizeof(kKVDataDTypes) / sizeof(kKVDataDTypes[0]);

bool checked_mode_from_env() {
  const char* value = std::getenv("TESSERA_CHECKED");
  if (value == nullptr || *value == '\0') return false;
  std::string v(value);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}

std::atomic<bool>& checked_flag() {
  static std::atomic<bool> flag{checked_mode_from_env()};
  return flag;
}

std::string pages_phrase(int64_t n) {
  return std::to_string(n) + (n == 1 ? " page" : " pages");
}

// ---- tensor checks on std::string names (the public ones take const char*) ----

using detail::check_view;

void check_present(const TensorView& t, const std::string& name) {
  check_view(t, name);
  if (t.defined()) return;
  if (t.ndim == 0) {
    TESSERA_FAIL(StatusCode::kInvalidArgument)
        << name << " is missing (an undefined TensorView), expected a tensor";
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument)
      << name << ".data = null, expected a pointer to " << t.numel() << " elements ("
      << t.describe() << ")";
}

void check_ndim_is(const TensorView& t, const std::string& name, int ndim,
                   const char* shape_meaning = nullptr) {
  if (t.ndim == ndim) return;
  detail::ErrorBuilder error(StatusCode::kInvalidArgument);
  error << name << ".ndim = " << t.ndim << ", expected " << ndim;
  if (shape_meaning != nullptr) error << " (" << shape_meaning << ")";
  error << "; " << name << " is " << t.describe();
  detail::ErrorThrower() & error;
}

std::string dtype_set(const DType* allowed, size_t count) {
  std::string s = "{";
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) s += ", ";
    s += dtype_name(allowed[i]);
  }
  return s + "}";
}

void check_dtype_in(const TensorView& t, const std::string& name, const DType* allowed,
                    size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (t.dtype == allowed[i]) return;
  }
  if (count == 1) {
    TESSERA_FAIL(StatusCode::kInvalidArgument)
        << name << ".dtype = " << t.dtype << ", expected " << allowed[0];
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument)
      << name << ".dtype = " << t.dtype << ", expected one of " << dtype_set(allowed, count);
}

void check_last_dim_unit_stride(const TensorView& t, const std::string& name) {
  if (t.ndim == 0) return;
  const int last = t.ndim - 1;
  // A size-1 last dim is never stepped through, so its stride is irrelevant (PyTorch leaves
  // arbitrary strides there).
  TESSERA_CHECK_ARG(t.shape[last] <= 1 || t.strides[last] == 1)
      << name << ".strides[" << last << "] = " << t.strides[last]
      << ", expected 1 (last dimension must be contiguous)";
}

void check_size_is(const TensorView& t, const std::string& name, int dim, int64_t expected,
                   const std::string& why = std::string()) {
  TESSERA_CHECK_ARG(t.shape[dim] == expected)
      << name << ".shape[" << dim << "] = " << t.shape[dim] << ", expected " << expected << why;
}

// Blames b: callers pass the reference tensor first.
void check_device_matches(const TensorView& a, const std::string& a_name, const TensorView& b,
                          const std::string& b_name) {
  TESSERA_CHECK_ARG(a.device == b.device)
      << b_name << ".device = " << b.device << ", expected " << a.device << " (the device of "
      << a_name << ")";
}

void check_extent_positive(int64_t value, const std::string& label, const std::string& source) {
  TESSERA_CHECK_ARG(value >= 1)
      << label << " = " << value << " (" << source << "), expected >= 1";
}

// K and V of one format: same dtype, device and shape but for the head dim; both with a contiguous last dim.
void check_kv_pair(const TensorView& k, const std::string& k_name, const TensorView& v,
                   const std::string& v_name, int ndim, const char* shape_meaning) {
  check_present(k, k_name);
  check_ndim_is(k, k_name, ndim, shape_meaning);
  check_dtype_in(k, k_name, kKVDataDTypes, kNumKVDataDTypes);
  check_last_dim_unit_stride(k, k_name);
  check_present(v, v_name);
  check_ndim_is(v, v_name, ndim, shape_meaning);
  TESSERA_CHECK_ARG(v.dtype == k.dtype) << v_name << ".dtype = " << v.dtype << ", expected "
                                        << k.dtype << " (the dtype of " << k_name << ")";
  // The last dim may differ: prefill takes V rows narrower than K rows (head_dim_vo); the entry
  // points check it against the head dims they run.
  for (int d = 0; d + 1 < ndim; ++d) {
    check_size_is(v, v_name, d, k.shape[d],
                  str_cat(" (", k_name, ".shape[", d, "]; K and V must have the same shape but for the head dim)"));
  }
  check_extent_positive(v.shape[ndim - 1], v_name + ".head_dim", str_cat(v_name, ".shape[", ndim - 1, "]"));
  check_device_matches(k, k_name, v, v_name);
  check_last_dim_unit_stride(v, v_name);
}

// Index arrays are read by kernels as plain arrays, hence contiguous; they may sit in host memory
// (read through pinned/mapped memory or copied by the planner) or on the data's GPU.
void check_index_array(const TensorView& t, const std::string& name, DType dtype,
                       const TensorView* data, const std::string& data_name) {
  check_present(t, name);
  check_ndim_is(t, name, 1);
  check_dtype_in(t, name, &dtype, 1);
  TESSERA_CHECK_ARG(t.shape[0] <= 1 || t.strides[0] == 1)
      << name << ".strides[0] = " << t.strides[0]
      << ", expected 1 (index arrays must be contiguous)";
  if (data != nullptr) {
    TESSERA_CHECK_ARG(t.device.is_host() || t.device == data->device)
        << name << ".device = " << t.device << ", expected " << data->device
        << " (the device of " << data_name << ") or host memory";
  }
}

bool values_readable(const TensorView& t) { return t.device.is_host() || checked_mode(); }

// Makes the array's GPU current for the copy, so that the device-wide synchronisation covers
// whatever stream wrote it.
class CurrentDeviceGuard {
 public:
  explicit CurrentDeviceGuard(int device, const std::string& name) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&previous_)) << " while reading " << name << " in checked mode";
    if (previous_ != device) {
      TESSERA_CUDA_CHECK(cudaSetDevice(device))
          << " while reading " << name << " in checked mode";
    }
    switched_ = previous_ != device;
  }
  ~CurrentDeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// The first `count` elements of a contiguous 1-D array; only called when values_readable().
template <typename T>
std::vector<T> read_values(const TensorView& t, const std::string& name, int64_t count) {
  std::vector<T> out(static_cast<size_t>(count));
  if (count == 0) return out;
  const size_t bytes = static_cast<size_t>(count) * sizeof(T);
  if (t.device.is_host()) {
    std::memcpy(out.data(), t.data, bytes);
    return out;
  }
  CurrentDeviceGuard guard(t.device.id, name);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize()) << " before reading " << name << " in checked mode";
  TESSERA_CUDA_CHECK(cudaMemcpy(out.data(), t.data, bytes, cudaMemcpyDeviceToHost))
      << " while reading " << name << " (" << t.describe() << ") in checked mode";
  return out;
}

void check_indptr_length(const TensorView& indptr, const std::string& name) {
  TESSERA_CHECK_ARG(indptr.shape[0] >= 1)
      << name << ".shape[0] = " << indptr.shape[0] << ", expected >= 1 (batch_size + 1 entries)";
}

/// The values of an indptr array that already passed check_index_array, checked against
/// [0] == 0, non-decreasing, last <= bound (when bound >= 0); nullopt when they cannot be read.
std::optional<std::vector<int32_t>> read_indptr(const TensorView& indptr, const std::string& name,
                                                int64_t bound, const std::string& bound_meaning) {
  check_indptr_length(indptr, name);
  if (!values_readable(indptr)) return std::nullopt;
  std::vector<int32_t> v = read_values<int32_t>(indptr, name, indptr.shape[0]);
  TESSERA_CHECK_ARG(v[0] == 0) << name << "[0] = " << v[0] << ", expected 0";
  for (size_t i = 1; i < v.size(); ++i) {
    TESSERA_CHECK_ARG(v[i] >= v[i - 1])
        << name << "[" << i << "] = " << v[i] << ", expected >= " << v[i - 1] << " (" << name
        << "[" << i - 1 << "]; indptr must be non-decreasing)";
  }
  if (bound >= 0) {
    TESSERA_CHECK_ARG(v.back() <= bound) << name << "[" << v.size() - 1 << "] = " << v.back()
                                         << ", expected <= " << bound << " (" << bound_meaning
                                         << ")";
  }
  return v;
}

struct LevelShape {
  int64_t num_kv_heads;
  int64_t head_dim;
  DType dtype;
  Device device;
};

}  // namespace

void set_checked_mode(bool enabled) { checked_flag().store(enabled); }

bool checked_mode() { return checked_flag().load(); }

void validate_heads(const HeadConfig& heads, std::initializer_list<int64_t> supported_dims) {
  TESSERA_CHECK_ARG(heads.num_qo_heads >= 1)
      << "num_qo_heads = " << heads.num_qo_heads << ", expected >= 1";
  TESSERA_CHECK_ARG(heads.num_kv_heads >= 1)
      << "num_kv_heads = " << heads.num_kv_heads << ", expected >= 1";
  TESSERA_CHECK_ARG(heads.num_qo_heads % heads.num_kv_heads == 0)
      << "num_qo_heads = " << heads.num_qo_heads << " is not a multiple of num_kv_heads = "
      << heads.num_kv_heads;
  TESSERA_CHECK_ARG(heads.head_dim >= 1) << "head_dim = " << heads.head_dim << ", expected >= 1";
  if (supported_dims.size() == 0) return;
  for (int64_t d : supported_dims) {
    if (heads.head_dim == d) return;
  }
  detail::ErrorBuilder error(StatusCode::kUnsupported);
  error << "head_dim = " << heads.head_dim << " is not supported (supported: ";
  const char* separator = "";
  for (int64_t d : supported_dims) {
    error << separator << d;
    separator = ", ";
  }
  detail::ErrorThrower() & (error << ")");
}

void check_ndim(const TensorView& t, const char* name, int ndim) {
  check_view(t, name);
  check_ndim_is(t, name, ndim);
}

void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  check_dtype_in(t, name, allowed.begin(), allowed.size());
}

void check_on_cuda(const TensorView& t, const char* name) {
  TESSERA_CHECK_ARG(t.device.type == DeviceType::kCUDA)
      << name << ".device = " << t.device << ", expected a CUDA device";
}

void check_last_dim_contiguous(const TensorView& t, const char* name) {
  check_view(t, name);
  check_last_dim_unit_stride(t, name);
}

void check_contiguous(const TensorView& t, const char* name) {
  check_view(t, name);
  if (t.is_contiguous()) return;
  int64_t expected[TensorView::kMaxDims] = {};
  int64_t running = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    expected[d] = running;
    running *= t.shape[d];
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument)
      << name << ".strides = " << detail::join_dims(t.strides, t.ndim) << ", expected "
      << detail::join_dims(expected, t.ndim) << " (row-major contiguous for shape "
      << detail::join_dims(t.shape, t.ndim) << ")";
}

void check_size(const TensorView& t, const char* name, int dim, int64_t expected) {
  check_view(t, name);
  TESSERA_CHECK_ARG(dim >= 0 && dim < t.ndim)
      << name << ".ndim = " << t.ndim << ", expected more than " << dim << " (to check " << name
      << ".shape[" << dim << "])";
  check_size_is(t, name, dim, expected);
}

void check_same_device(const TensorView& a, const char* a_name, const TensorView& b,
                       const char* b_name) {
  check_device_matches(a, a_name, b, b_name);
}

std::vector<int32_t> validate_indptr(const TensorView& indptr, const char* name,
                                     int64_t max_total) {
  check_index_array(indptr, name, DType::kI32, nullptr, std::string());
  std::optional<std::vector<int32_t>> values = read_indptr(indptr, name, max_total, "max_total");
  return values ? std::move(*values) : std::vector<int32_t>();
}

void validate_ragged(const Ragged& r, const char* name_c) {
  const std::string name(name_c);
  const std::string data_name = name + ".data";
  check_present(r.data, data_name);
  check_ndim_is(r.data, data_name, 3, "[total_rows, num_heads, head_dim]");
  check_dtype_in(r.data, data_name, kKVDataDTypes, kNumKVDataDTypes);
  check_last_dim_unit_stride(r.data, data_name);
  check_extent_positive(r.data.shape[1], name + ".num_heads", data_name + ".shape[1]");
  check_extent_positive(r.data.shape[2], name + ".head_dim", data_name + ".shape[2]");

  const std::string indptr_name = name + ".indptr";
  check_index_array(r.indptr, indptr_name, DType::kI32, &r.data, data_name);
  read_indptr(r.indptr, indptr_name, r.data.shape[0], "the number of rows of " + data_name);
}

void validate_paged_kv(const PagedKV& kv, const char* name_c) {
  const std::string name(name_c);
  TESSERA_CHECK_ARG(kv.layout == Layout::kNHD || kv.layout == Layout::kHND)
      << name << ".layout = " << static_cast<int>(kv.layout) << ", expected NHD (0) or HND (1)";
  const bool nhd = kv.layout == Layout::kNHD;
  const std::string k_name = name + ".k";
  check_kv_pair(kv.k, k_name, kv.v, name + ".v", 4,
                nhd ? "NHD [num_pages, page_size, num_kv_heads, head_dim]"
                    : "HND [num_pages, num_kv_heads, page_size, head_dim]");
  const int slot_dim = nhd ? 1 : 2;
  const int head_dim_index = nhd ? 2 : 1;
  const int64_t page_size = kv.page_size();
  check_extent_positive(page_size, name + ".page_size", str_cat(k_name, ".shape[", slot_dim, "]"));
  check_extent_positive(kv.num_kv_heads(), name + ".num_kv_heads",
                        str_cat(k_name, ".shape[", head_dim_index, "]"));
  check_extent_positive(kv.head_dim(), name + ".head_dim", k_name + ".shape[3]");

  const std::string indptr_name = name + ".indptr";
  const std::string indices_name = name + ".indices";
  const std::string last_name = name + ".last_page_len";
  check_index_array(kv.indptr, indptr_name, DType::kI32, &kv.k, k_name);
  check_index_array(kv.indices, indices_name, DType::kI32, &kv.k, k_name);
  check_index_array(kv.last_page_len, last_name, DType::kI32, &kv.k, k_name);
  check_indptr_length(kv.indptr, indptr_name);
  const int64_t batch = kv.indptr.shape[0] - 1;
  check_size_is(kv.last_page_len, last_name, 0, batch,
                str_cat(" (batch_size = ", indptr_name, ".shape[0] - 1)"));

  const std::optional<std::vector<int32_t>> indptr =
      read_indptr(kv.indptr, indptr_name, kv.indices.shape[0], "the length of " + indices_name);
  // Without the page ranges neither the used indices nor which requests are empty are known.
  if (!indptr) return;

  if (values_readable(kv.indices)) {
    const std::vector<int32_t> indices = read_values<int32_t>(kv.indices, indices_name, indptr->back());
    detail::check_page_ids(*indptr, indices.data(), kv.num_pages(), indices_name);
  }
  if (values_readable(kv.last_page_len)) {
    const std::vector<int32_t> last = read_values<int32_t>(kv.last_page_len, last_name, batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pages = (*indptr)[b + 1] - (*indptr)[b];
      if (pages == 0) continue;  // an empty request's last_page_len is ignored
      TESSERA_CHECK_ARG(last[b] >= 1 && last[b] <= page_size)
          << last_name << "[" << b << "] = " << last[b] << " is out of range [1, " << page_size
          << "] for a request with " << pages_phrase(pages);
    }
  }
}

void validate_block_sparse(const BlockSparse& bs, const char* name_c) {
  const std::string name(name_c);
  TESSERA_CHECK_ARG(bs.block_rows >= 1)
      << name << ".block_rows = " << bs.block_rows << ", expected >= 1";
  TESSERA_CHECK_ARG(bs.block_cols >= 1)
      << name << ".block_cols = " << bs.block_cols << ", expected >= 1";
  TESSERA_CHECK_ARG(bs.num_rows >= 0) << name << ".num_rows = " << bs.num_rows << ", expected >= 0";
  const std::string k_name = name + ".k";
  check_kv_pair(bs.k, k_name, bs.v, name + ".v", 3, "[num_cols, num_kv_heads, head_dim]");
  check_extent_positive(bs.k.shape[1], name + ".num_kv_heads", k_name + ".shape[1]");
  check_extent_positive(bs.k.shape[2], name + ".head_dim", k_name + ".shape[2]");

  const std::string indptr_name = name + ".indptr";
  const std::string indices_name = name + ".indices";
  const std::string flags_name = name + ".block_flags";
  check_index_array(bs.indptr, indptr_name, DType::kI32, &bs.k, k_name);
  check_index_array(bs.indices, indices_name, DType::kI32, &bs.k, k_name);
  const int64_t num_row_blocks = bs.num_row_blocks();
  check_size_is(bs.indptr, indptr_name, 0, num_row_blocks + 1,
                str_cat(" (ceil(num_rows / block_rows) + 1 with num_rows = ", bs.num_rows,
                        ", block_rows = ", bs.block_rows, ")"));
  const bool has_flags = bs.block_flags.defined();
  if (has_flags) {
    check_index_array(bs.block_flags, flags_name, DType::kU8, &bs.k, k_name);
    check_size_is(bs.block_flags, flags_name, 0, bs.indices.shape[0],
                  " (the length of " + indices_name + ")");
  }

  const std::optional<std::vector<int32_t>> indptr =
      read_indptr(bs.indptr, indptr_name, bs.indices.shape[0], "the length of " + indices_name);
  if (!indptr) return;

  if (values_readable(bs.indices)) {
    const std::vector<int32_t> indices = read_values<int32_t>(bs.indices, indices_name, indptr->back());
    detail::check_column_blocks(*indptr, indices.data(), bs.num_col_blocks(), indices_name);
  }
  if (has_flags && values_readable(bs.block_flags)) {
    const std::vector<uint8_t> flags = read_values<uint8_t>(bs.block_flags, flags_name, indptr->back());
    for (size_t j = 0; j < flags.size(); ++j) {
      TESSERA_CHECK_ARG(flags[j] <= 1) << flags_name << "[" << j << "] = " << int(flags[j])
                                       << ", expected 0 (partial block) or 1 (full block)";
    }
  }
}

void validate_composable(const Composable& c, const char* name_c) {
  const std::string name(name_c);
  TESSERA_CHECK_ARG(!c.levels.empty())
      << name << ".levels.size() = 0, expected at least 1 level";
  std::vector<LevelShape> shapes;
  shapes.reserve(c.levels.size());
  for (size_t i = 0; i < c.levels.size(); ++i) {
    const std::string level_name = str_cat(name, ".levels[", i, "]");
    const KVFormat& level = c.levels[i];
    if (const auto* ragged = std::get_if<Ragged>(&level)) {
      validate_ragged(*ragged, level_name.c_str());
      shapes.push_back({ragged->data.shape[1], ragged->data.shape[2], ragged->data.dtype,
                        ragged->data.device});
    } else if (const auto* paged = std::get_if<PagedKV>(&level)) {
      validate_paged_kv(*paged, level_name.c_str());
      shapes.push_back({paged->num_kv_heads(), paged->head_dim(), paged->k.dtype, paged->k.device});
    } else if (const auto* sparse = std::get_if<BlockSparse>(&level)) {
      validate_block_sparse(*sparse, level_name.c_str());
      shapes.push_back({sparse->k.shape[1], sparse->k.shape[2], sparse->k.dtype, sparse->k.device});
    } else {
      TESSERA_FAIL(StatusCode::kInvalidArgument)
          << level_name << " holds no format (valueless variant), expected a Ragged, PagedKV or "
          << "BlockSparse";
    }
  }
  const std::string first = name + ".levels[0]";
  for (size_t i = 1; i < shapes.size(); ++i) {
    const std::string level_name = str_cat(name, ".levels[", i, "]");
    // One kernel launch and one merge cover all levels, so they must agree on these.
    TESSERA_CHECK_ARG(shapes[i].num_kv_heads == shapes[0].num_kv_heads)
        << level_name << ".num_kv_heads = " << shapes[i].num_kv_heads << ", expected "
        << shapes[0].num_kv_heads << " (the num_kv_heads of " << first << ")";
    TESSERA_CHECK_ARG(shapes[i].head_dim == shapes[0].head_dim)
        << level_name << ".head_dim = " << shapes[i].head_dim << ", expected "
        << shapes[0].head_dim << " (the head_dim of " << first << ")";
    TESSERA_CHECK_ARG(shapes[i].dtype == shapes[0].dtype)
        << level_name << ".dtype = " << shapes[i].dtype << ", expected " << shapes[0].dtype
        << " (the dtype of " << first << ")";
    TESSERA_CHECK_ARG(shapes[i].device == shapes[0].device)
        << level_name << ".device = " << shapes[i].device << ", expected " << shapes[0].device
        << " (the device of " << first << ")";
  }
}

namespace detail {

std::vector<int32_t> read_index_values(const TensorView& t, const std::string& name, int64_t count) {
  return read_values<int32_t>(t, name, count);
}

std::vector<int64_t> read_index_values_i64(const TensorView& t, const std::string& name, int64_t count) {
  if (t.dtype == DType::kI64) return read_values<int64_t>(t, name, count);
  const std::vector<int32_t> narrow = read_values<int32_t>(t, name, count);
  return std::vector<int64_t>(narrow.begin(), narrow.end());
}

void check_page_ids(const std::vector<int32_t>& indptr, const int32_t* ids, int64_t num_pages,
                    const std::string& name) {
  for (size_t b = 0; b + 1 < indptr.size(); ++b) {
    for (int32_t j = indptr[b]; j < indptr[b + 1]; ++j) {
      TESSERA_CHECK_ARG(ids[j] >= 0 && ids[j] < num_pages)
          << name << "[" << j << "] = " << ids[j] << " is out of range [0, " << num_pages << ") (page "
          << j - indptr[b] << " of request " << b << ")";
    }
  }
}

void check_column_blocks(const std::vector<int32_t>& indptr, const int32_t* ids, int64_t num_col_blocks,
                         const std::string& name, const std::vector<int32_t>* row_bounds) {
  for (size_t r = 0; r + 1 < indptr.size(); ++r) {
    const int64_t bound = row_bounds != nullptr ? (*row_bounds)[r] : num_col_blocks;
    for (int32_t j = indptr[r]; j < indptr[r + 1]; ++j) {
      TESSERA_CHECK_ARG(ids[j] >= 0 && ids[j] < bound)
          << name << "[" << j << "] = " << ids[j] << " is out of range [0, " << bound << ") (block row " << r
          << (row_bounds != nullptr ? "; ceil(kv_len / block_cols) of its request = "
                                    : "; ceil(num_cols / block_cols) = ")
          << bound << ")";
      TESSERA_CHECK_ARG(j == indptr[r] || ids[j] > ids[j - 1])
          << name << "[" << j << "] = " << ids[j] << ", expected > " << ids[j - 1] << " (" << name << "[" << j - 1
          << "]; column blocks must be strictly increasing within block row " << r << ")";
    }
  }
}

}  // namespace detail

}  // namespace tessera
