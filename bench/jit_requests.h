// The JIT requests libtessera makes for a non-default variant, built with the library's own
// configuration (src/prefill_config.h, src/prefill_launch.cuh) so W8 compiles exactly the kernels
// a W1/W3 call would. Defined in jit_requests.cu (nvcc: the traits live in kernel headers).
#pragma once

#include "src/variant/jit_variant.h"

namespace tessera_bench {

/// The FA2-class prefill kernel batch_prefill_ragged launches for bf16, D=128 and long queries
/// (QTile::k128), ragged KV.
tessera::detail::VariantKernelRequest prefill_bf16_d128_q128_ragged_request();

/// The tensor-core decode kernel batch_decode_paged launches for a non-default variant (the
/// prefill template with 16-row query tiles, QTile::k16), bf16, D=128, paged KV.
tessera::detail::VariantKernelRequest decode_bf16_d128_q16_paged_request();

}  // namespace tessera_bench
