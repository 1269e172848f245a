// The parameter block every variant kernel takes by value (kernels/attention/variants.cuh), and
// the built-in feature bits. Plain data: the host (src/variant) fills it with the same layout the
// prebuilt and JIT-compiled kernels read.
#pragma once

#include "kernels/common/platform.cuh"

namespace tessera {
namespace kernels {

/// Extra-parameter slots of a user variant: each parameter takes one 8-byte slot, in declaration
/// order (the generated `Params` struct has one alignas(8) member per parameter).
constexpr int kMaxVariantParamSlots = 16;

enum class RopeKind : int32_t { kNone = 0, kLlama = 1, kLlama31 = 2 };

struct VariantParams {
  int32_t window_left;      // keys j >= qo_pos - window_left (feature kWindow)
  int32_t num_sink_tokens;  // keys j < this stay visible (feature kSinks)
  float soft_cap;           // cap (feature kSoftCap)
  float inv_soft_cap;       // 1 / cap
  float sigmoid_bias;       // feature kSigmoid
  float sm_scale;           // natural-units logit scale, for the hooks
  const float* alibi_slopes;          // [Hq] (feature kAlibi)
  const uint8_t* custom_mask;         // packed bits, little bit order (feature kCustomMask)
  const int32_t* custom_mask_indptr;  // [batch + 1] byte offsets
  const int32_t* rope_q_offset;       // [batch] or nullptr (feature kRope)
  const int32_t* rope_k_offset;       // [batch] or nullptr
  int32_t rope_kind;                  // RopeKind
  float rope_rcp_scale;               // 1 / rope_scale
  float rope_log2_theta;              // log2(theta)
  float llama31_factor;
  float llama31_low_freq_wavelen;     // original_max_position / low_freq_factor
  float llama31_high_freq_wavelen;    // original_max_position / high_freq_factor
  float llama31_smooth_scale;         // original_max_position / (high - low freq factor)
  float llama31_smooth_bias;          // low_freq_factor / (high - low freq factor)
  uint64_t extra[kMaxVariantParamSlots];  // a user variant's parameters
};

/// KV positions a query tile may see: [seg0_begin, seg0_end) (attention sinks) then
/// [begin, end); tiles are cut within each segment.
struct KVSpan {
  int32_t seg0_begin, seg0_end;
  int32_t begin, end;
};

/// Built-in feature bits (the BuiltinVariant template argument; the host's list is in
/// src/variant/variant_config.h).
namespace feature {
constexpr uint32_t kWindow = 1u << 0;
constexpr uint32_t kSinks = 1u << 1;
constexpr uint32_t kSoftCap = 1u << 2;
constexpr uint32_t kAlibi = 1u << 3;
constexpr uint32_t kSigmoid = 1u << 4;
constexpr uint32_t kCustomMask = 1u << 5;
constexpr uint32_t kRope = 1u << 6;
}  // namespace feature

}  // namespace kernels
}  // namespace tessera
