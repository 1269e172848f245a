#include "src/runtime/plan_inputs.h"

#include "src/check.h"
#include "src/tensor_checks.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

/// A host i32 vector argument of plan(): 1-D, `length` entries (or any length when < 0).
std::vector<int32_t> read_host_array(const TensorView& t, const char* name, int64_t length) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {DType::kI32});
  TESSERA_CHECK_ARG(t.device.is_host()) << name << " is on " << t.device
                                        << ", expected host memory (plan() reads it on the CPU)";
  if (length >= 0) check_size(t, name, 0, length);
  std::vector<int32_t> v(static_cast<size_t>(t.shape[0]));
  const int32_t* data = t.data_as<const int32_t>();
  for (int64_t i = 0; i < t.shape[0]; ++i) v[static_cast<size_t>(i)] = data[i * t.strides[0]];
  return v;
}

/// A host indptr: [B + 1], starts at 0, non-decreasing (validate_indptr's checks and messages).
std::vector<int32_t> read_host_indptr(const TensorView& t, const char* name) {
  TESSERA_CHECK_ARG(t.device.is_host()) << name << " is on " << t.device
                                        << ", expected host memory (plan() reads it on the CPU)";
  return validate_indptr(t, name, -1);
}

void fill_lengths(const std::vector<int32_t>& indptr, std::vector<int32_t>& len) {
  len.resize(indptr.size() - 1);
  for (size_t b = 0; b + 1 < indptr.size(); ++b) len[b] = indptr[b + 1] - indptr[b];
}

PagedLengths read_paged_lengths(const TensorView& kv_indptr, const TensorView& last_page_len, int64_t page_size,
                                int64_t batch) {
  TESSERA_CHECK_ARG(page_size >= 1 && page_size < INT32_MAX) << "page_size = " << page_size << ", expected >= 1";
  PagedLengths out;
  out.kv_indptr = read_host_indptr(kv_indptr, "kv_indptr");
  TESSERA_CHECK_ARG(static_cast<int64_t>(out.kv_indptr.size()) == batch + 1)
      << "kv_indptr has " << out.kv_indptr.size() << " entries, expected batch_size + 1 = " << batch + 1;
  out.last_page_len = read_host_array(last_page_len, "last_page_len", batch);
  out.kv_len.resize(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = out.kv_indptr[b + 1] - out.kv_indptr[b];
    const int32_t last = out.last_page_len[b];
    if (pages > 0) {
      TESSERA_CHECK_ARG(last >= 1 && last <= page_size)
          << "last_page_len[" << b << "] = " << last << ", expected in [1, " << page_size << "] (request " << b
          << " has " << pages << " pages)";
    }
    const int64_t len = pages > 0 ? (pages - 1) * page_size + last : 0;
    TESSERA_CHECK_ARG(len < INT32_MAX) << "request " << b << " has " << len << " KV tokens, expected < 2^31";
    out.kv_len[b] = static_cast<int32_t>(len);
  }
  return out;
}

}  // namespace detail
}  // namespace tessera
