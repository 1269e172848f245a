// Internal entry points of the state merge (src/merge.cu) for the runtime.
#pragma once

#include <cstdint>

#include "tessera/stream.h"
#include "tessera/tensor.h"

namespace tessera {
namespace detail {

/// tessera::merge_state (tessera/merge.h, the same checks) whose launch merges only the first
/// *rows_on_device rows (read on the GPU, clamped to [0, v_a.shape[0]]) when rows_on_device is
/// not null: one captured launch serves every later plan's row count.
void merge_state_rows_on_device(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                                const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                                const int32_t* rows_on_device, StreamHandle stream);

}  // namespace detail
}  // namespace tessera
