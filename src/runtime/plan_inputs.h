// The host index arrays a runtime wrapper's plan() reads, checked with errors that name them.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// A host i32 vector argument of plan(): 1-D, `length` entries (or any length when < 0).
std::vector<int32_t> read_host_array(const TensorView& t, const char* name, int64_t length);
/// A host indptr: [B + 1], starts at 0, non-decreasing (validate_indptr's checks and messages).
std::vector<int32_t> read_host_indptr(const TensorView& t, const char* name);
/// len[b] = indptr[b + 1] - indptr[b].
void fill_lengths(const std::vector<int32_t>& indptr, std::vector<int32_t>& len);

/// A paged cache's page ranges and the KV lengths they give.
struct PagedLengths {
  std::vector<int32_t> kv_indptr;      // [B + 1] pages per request
  std::vector<int32_t> last_page_len;  // [B]
  std::vector<int32_t> kv_len;         // [B] tokens: (pages - 1) * page_size + last_page_len, 0 without pages
};
/// kv_indptr: host i32 [batch + 1]; last_page_len: host i32 [batch], each in [1, page_size] for a
/// request with pages; page_size >= 1.
PagedLengths read_paged_lengths(const TensorView& kv_indptr, const TensorView& last_page_len, int64_t page_size,
                                int64_t batch);

}  // namespace detail
}  // namespace tessera
