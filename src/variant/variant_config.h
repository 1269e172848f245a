// From the public VariantOptions to what the kernels get: validation (errors name the option, its
// value and what was expected), the built-in feature bits and the filled VariantParams block.
// Host code; the parameter block's layout comes from kernels/attention/variant_params.cuh.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/variant_params.cuh"
#include "tessera/tensor.h"
#include "tessera/variant.h"

namespace tessera {
namespace detail {

/// What the validation needs to know about the call.
struct VariantContext {
  const TensorView* q = nullptr;  ///< tensors must live on q's device
  int64_t batch_size = 0;         ///< requests (block-sparse: block rows)
  int64_t num_qo_heads = 0;
  int64_t head_dim = 0;
  double sm_scale = 0;            ///< natural units, resolved
  bool block_sparse = false;      ///< custom masks and RoPE offsets are per request: not for BSR
};

/// A validated variant.
struct ResolvedVariant {
  bool is_default = true;  ///< the prebuilt kernels run (params are then unused)
  uint32_t features = 0;   ///< kernels::feature bits
  const VariantSpec* user = nullptr;
  bool use_softmax = true;
  kernels::VariantParams params{};
};

/// Validates `options` for the call described by `ctx` and fills the kernels' parameter block.
ResolvedVariant resolve_variant(const VariantOptions& options, const VariantContext& ctx);

/// Validates a user variant's extra parameters (C identifiers, unique, scalars in range, tensors
/// of a supported dtype on the CUDA device of `anchor`) and writes one 8-byte slot per parameter,
/// in declaration order, to `slots` [kernels::kMaxVariantParamSlots] (the generated `Params`
/// layout). Messages about the list start with `owner` ("variant 'x'"); one parameter is named
/// `param_prefix` + its name ("variant param x", "params.x"). resolve_variant and
/// build_block_mask share it.
void fill_param_slots(const std::vector<VariantParam>& params, const std::string& owner,
                      const std::string& param_prefix, const TensorView& anchor, const char* anchor_name,
                      uint64_t* slots);

/// A C identifier ([A-Za-z_][A-Za-z0-9_]*).
bool is_identifier(const std::string& s);

}  // namespace detail
}  // namespace tessera
