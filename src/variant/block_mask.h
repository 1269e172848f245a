// Host side of build_block_mask (tessera/variant.h; kernels in kernels/attention/block_mask.cuh):
// the generated translation unit, exposed so CPU tests can compile it with NVRTC without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/jit/nvrtc_compiler.h"
#include "tessera/variant.h"

namespace tessera {
namespace detail {

/// The builder's unit for one mask_mod:
///   #include "kernels/attention/block_mask.cuh"
///   namespace tessera_user { ... struct Params { alignas(8) ... }; (user_params_prologue)
///   #line 1 "user_snippet"
///   <mask.source>
///   #line N "generated"
///   }  // namespace tessera_user
///   struct TesseraBlockMaskFn { visible(slots, b, h, q_idx, kv_idx) -> <mask.function>(...) };
/// and the name expressions of its three kernels, in launch order: classify, indptr, compact.
/// `params` must have been validated (fill_param_slots).
struct BlockMaskSource {
  jit::GeneratedSource source;
  std::vector<std::string> name_expressions;  // [3]
};
BlockMaskSource block_mask_source(const MaskMod& mask, const std::vector<VariantParam>& params);

/// Lanes of a warp that classify one (block_rows, block_cols) block together: the smallest power
/// of two >= block_rows * block_cols, at most 32.
int block_mask_lanes_per_block(int64_t block_rows, int64_t block_cols);

}  // namespace detail
}  // namespace tessera
