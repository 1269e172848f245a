// Checks shared by TensorView, DLPack import, the public validators (src/validation.cpp) and the
// kernels' host dispatch, beyond what tessera/validate.h offers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/formats.h"
#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// The product of shape[0 .. ndim) into *count (0 when any size is 0, whatever the others);
/// false when it does not fit in int64. Sizes must be >= 0.
bool element_count(const int64_t* shape, int ndim, int64_t* count);

/// Row-major strides of `shape` (elements) into `strides`. Throws kInvalidArgument naming
/// `name` when one does not fit in int64 (possible even without elements: [0, 2^40, 2^40]).
void row_major_strides(const int64_t* shape, int ndim, int64_t* strides, const std::string& name);

/// Throws kInvalidArgument naming `name` when the element count, the byte size (count x element
/// size) or the byte extent (from the first element to one past the last, through the strides)
/// does not fit in int64. Kernels and planners compute element offsets and byte sizes in int64,
/// so a view that passes never overflows them. Sizes and strides must be >= 0.
void check_extent(const int64_t* shape, const int64_t* strides, int ndim, DType dtype, const std::string& name);

/// The first check of every validator, since every other one indexes shape[] and strides[] by
/// ndim (a hand-built view can carry anything): ndim in [0, kMaxDims], sizes and strides >= 0,
/// and check_extent.
void check_view(const TensorView& t, const std::string& name);

/// A data tensor the kernels read or write: `ndim` dims (`shape` describes them in messages, e.g.
/// "[nnz, ckv_dim]"), a data pointer unless it is empty, and a contiguous last dimension. The
/// device is left to the caller (checked last where a call must name malformed host arguments).
void check_rows_tensor(const TensorView& t, const char* name, int ndim, const char* shape);

/// The kernels move data in 16-byte vectors: the data pointer must be 16-byte aligned and every
/// stride but the last a multiple of 16 bytes; the last dimension's size too.
void check_vector_aligned(const TensorView& t, const char* name);

/// The scales of a KV cache of dtype kv_dtype with num_kv_heads heads on `device`: for f16/bf16
/// (and f32) caches the defaults only; for fp8 host factors finite and > 0, device tensors f32 on
/// `device`, contiguous, with 1 or num_kv_heads elements ([], [1] or [H_kv]). `name` prefixes the
/// messages ("options.kv_scales"). Device values are not read (a graph may change them later);
/// the kernels use whatever they hold. q's scale (q, q_device) is checked the same way when
/// `fp8_query` (FP8 attention), else it must be at its defaults.
void check_kv_scales(const KVScales& scales, const char* name, DType kv_dtype, int64_t num_kv_heads,
                     const Device& device, bool fp8_query = false);

// Defined in src/validation.cpp, next to the validators whose element-by-element checks they are.

/// The first `count` values of a contiguous 1-D i32 index array that passed check_view: a copy of
/// host memory, or, for device memory, a copy after cudaDeviceSynchronize (checked mode: the
/// caller decides that reading device memory is wanted).
std::vector<int32_t> read_index_values(const TensorView& t, const std::string& name, int64_t count);
/// The same for an i32 or i64 array (positions), widened to int64.
std::vector<int64_t> read_index_values_i64(const TensorView& t, const std::string& name, int64_t count);

/// Page ids of a paged KV cache: ids[j] in [0, num_pages) for every j in [indptr[0],
/// indptr[last]), where request b owns [indptr[b], indptr[b+1]); indptr is already validated.
/// Messages: "<name>[17] = 4096 is out of range [0, 4096) (page 3 of request 2)".
void check_page_ids(const std::vector<int32_t>& indptr, const int32_t* ids, int64_t num_pages,
                    const std::string& name);

/// Column blocks of a block-sparse format: in [0, num_col_blocks) (or, with row_bounds, [0,
/// (*row_bounds)[r]) in block row r) and strictly increasing within each block row r = [indptr[r],
/// indptr[r+1]).
void check_column_blocks(const std::vector<int32_t>& indptr, const int32_t* ids, int64_t num_col_blocks,
                         const std::string& name, const std::vector<int32_t>* row_bounds = nullptr);

}  // namespace detail
}  // namespace tessera
