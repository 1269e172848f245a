// Checks that kernels' host dispatch needs beyond the public validators.
#pragma once

#include <string>

#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// The kernels move data in 16-byte vectors: the data pointer must be 16-byte aligned and every
/// stride but the last a multiple of 16 bytes; the last dimension's size too.
void check_vector_aligned(const TensorView& t, const char* name);

}  // namespace detail
}  // namespace tessera
