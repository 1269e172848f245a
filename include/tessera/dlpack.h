// DLPack interop. Include only where DLPack's header (Debian: libdlpack-dev) is available.
#pragma once

#include <dlpack/dlpack.h>

#include "tessera/export.h"
#include "tessera/tensor.h"

namespace tessera {

/// A view of a DLTensor (no copy). Throws tessera::Error for a dtype Tessera does not know,
/// vector lanes != 1, more than TensorView::kMaxDims dims, a negative size or stride, an element
/// count, byte size or byte extent beyond int64, a byte_offset that is not a multiple of the
/// element size, or a device other than CPU, CUDA or CUDA-host.
/// Null strides mean row-major contiguous; byte_offset is folded into the view's data pointer.
/// fp8 uses DLPack 1.0's codes: e4m3 = (code 10, bits 8), e5m2 = (code 12, bits 8).
TESSERA_API TensorView from_dlpack(const DLTensor& t);

/// A DLTensor describing `view`. Its shape and strides point into `view`, which must outlive it.
TESSERA_API DLTensor to_dlpack(TensorView& view);

}  // namespace tessera
