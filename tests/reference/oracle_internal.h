// Private helpers shared by the oracle's translation units. Not part of the oracle's API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/oracle.h"

namespace tessera_ref {
namespace detail {

// Throws std::invalid_argument(message) when cond is false.
void require(bool cond, const std::string& message);

// Validates a head configuration (positive sizes, Hq % Hkv == 0).
void check_heads(const HeadConfig& heads);

// Validates an indptr array: size == expected_size, indptr[0] == 0, non-decreasing, and
// indptr.back() == last (or <= last when allow_shorter).
void check_indptr(const std::vector<int32_t>& indptr, size_t expected_size, int64_t last,
                  bool allow_shorter, const char* name);

// Validates the per-request vectors of `opts` for a batch of `batch_size` requests: each is
// empty or has exactly batch_size entries (custom_mask_indptr: batch_size + 1).
void check_batch_options(const Options& opts, int64_t batch_size);

// Number of rows of a packed [rows, heads, dim] tensor, checking that its size is a multiple.
int64_t packed_rows(const std::vector<double>& t, int64_t heads, int64_t dim, const char* name);

// Extra visibility predicate: (local query row, local key index) -> visible. Used by block-sparse.
using KeyFilter = std::function<bool(int64_t, int64_t)>;

// Attention of one request. q: [qo_len, Hq, D], k, v: [kv_len, Hkv, D] (raw pointers into
// possibly larger packed tensors). Writes o [qo_len, Hq, D] and lse [qo_len, Hq] (natural log).
// `filter` may be null.
void attend_request(const double* q, const double* k, const double* v, int64_t qo_len,
                    int64_t kv_len, const HeadConfig& heads, const Options& opts,
                    int64_t request_index, const KeyFilter* filter, double* o, double* lse);

}  // namespace detail
}  // namespace tessera_ref
