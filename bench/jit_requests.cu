#include "jit_requests.h"

#include <cuda_bf16.h>

#include "src/prefill_config.h"
#include "src/prefill_launch.cuh"

namespace tessera_bench {

using tessera::detail::PrefillConfig;
using tessera::detail::QTile;
using tessera::kernels::KVFormatKind;

// The same requests as launch_prefill_config (src/prefill_launch.cuh) makes for a non-default variant.
tessera::detail::VariantKernelRequest prefill_bf16_d128_q128_ragged_request() {
  using Traits = PrefillConfig<__nv_bfloat16, 128, QTile::k128>::Traits;
  return tessera::detail::oneshot_variant_request<Traits, KVFormatKind::kRagged>();
}

tessera::detail::VariantKernelRequest decode_bf16_d128_q16_paged_request() {
  using Traits = PrefillConfig<__nv_bfloat16, 128, QTile::k16>::Traits;
  return tessera::detail::oneshot_variant_request<Traits, KVFormatKind::kPaged>();
}

}  // namespace tessera_bench
