// Attention variants (DESIGN.md §1.2). A variant is a struct of static hooks the kernel
// templates call; the kernels know nothing else about masking or logit transforms. This issue
// ships the default variant (softmax attention, optional causal mask); the variants issue adds
// the full hook set (query/key/value/output transforms, soft-cap, ALiBi, windows, custom masks)
// in the same shape, and JIT-generated user variants plug in as further structs.
#pragma once

#include "kernels/attention/params.cuh"

namespace tessera {
namespace kernels {

struct DefaultVariant {
  /// The kernels may skip KV tiles that lie entirely after a tile's last query position.
  static constexpr bool kCausalSkip = true;
  /// Evaluate visible() on every tile, not only on tiles crossing the diagonal or the end.
  static constexpr bool kAlwaysMask = false;

  /// LogitsMask: may query `qo_pos` (absolute position) of head `qo_head` see key `kv_idx`?
  template <typename T>
  static TESSERA_DEVICE bool visible(const AttentionParams<T>& p, int /*batch*/, int qo_pos, int kv_idx,
                                     int /*qo_head*/, int /*kv_head*/) {
    return !p.causal || kv_idx <= qo_pos;
  }
};

}  // namespace kernels
}  // namespace tessera
