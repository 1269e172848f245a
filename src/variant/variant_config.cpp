#include "src/variant/variant_config.h"

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "src/check.h"
#include "tessera/validate.h"

namespace tessera {
namespace detail {

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

namespace {

namespace feature = kernels::feature;

void check_device_array(const TensorView& t, const char* name, DType dtype, int64_t length, const VariantContext& ctx) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {dtype});
  check_on_cuda(t, name);
  check_same_device(*ctx.q, "q", t, name);
  check_contiguous(t, name);
  if (length >= 0) check_size(t, name, 0, length);
}

void check_finite(double v, const char* name) {
  TESSERA_CHECK_ARG(std::isfinite(v)) << name << " = " << v << ", expected a finite value";
}

}  // namespace

void fill_param_slots(const std::vector<VariantParam>& params, const std::string& owner,
                      const std::string& param_prefix, const TensorView& anchor, const char* anchor_name,
                      uint64_t* slots) {
  TESSERA_CHECK_ARG(static_cast<int>(params.size()) <= kernels::kMaxVariantParamSlots)
      << owner << ": " << params.size() << " params, expected at most " << kernels::kMaxVariantParamSlots;
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const VariantParam& prm = params[i];
    TESSERA_CHECK_ARG(is_identifier(prm.name))
        << owner << ": params[" << i << "].name = '" << prm.name << "', expected a C identifier";
    TESSERA_CHECK_ARG(names.insert(prm.name).second)
        << owner << ": params[" << i << "].name = '" << prm.name << "' is declared twice";
    const std::string name = param_prefix + prm.name;
    uint64_t slot = 0;
    switch (prm.kind) {
      case VariantParam::Kind::kF32: {
        check_finite(prm.f32, name.c_str());
        const float f = static_cast<float>(prm.f32);
        std::memcpy(&slot, &f, sizeof(f));
        break;
      }
      case VariantParam::Kind::kI32: {
        TESSERA_CHECK_ARG(prm.i64 >= INT32_MIN && prm.i64 <= INT32_MAX)
            << name << " = " << prm.i64 << ", expected a 32-bit integer";
        const int32_t v = static_cast<int32_t>(prm.i64);
        std::memcpy(&slot, &v, sizeof(v));
        break;
      }
      case VariantParam::Kind::kI64:
        std::memcpy(&slot, &prm.i64, sizeof(prm.i64));
        break;
      case VariantParam::Kind::kTensor: {
        check_dtype(prm.tensor, name.c_str(), {DType::kF32, DType::kI32, DType::kU8, DType::kF16, DType::kBF16});
        check_on_cuda(prm.tensor, name.c_str());
        check_same_device(anchor, anchor_name, prm.tensor, name.c_str());
        const void* data = prm.tensor.data;
        std::memcpy(&slot, &data, sizeof(data));
        break;
      }
      default:
        TESSERA_FAIL(StatusCode::kInvalidArgument)
            << owner << ": params[" << i << "].kind = " << static_cast<int>(prm.kind)
            << ", expected kF32, kI32, kI64 or kTensor";
    }
    slots[i] = slot;
  }
}

namespace {

/// The sliding window and attention sinks (which need a window).
void resolve_window(const VariantOptions& o, ResolvedVariant& r) {
  kernels::VariantParams& p = r.params;
  TESSERA_CHECK_ARG(o.window_left >= -1 && o.window_left <= INT32_MAX)
      << "variant.window_left = " << o.window_left << ", expected -1 (off) or in [0, 2^31)";
  if (o.window_left >= 0) {
    r.features |= feature::kWindow;
    p.window_left = static_cast<int32_t>(o.window_left);
  }
  TESSERA_CHECK_ARG(o.num_sink_tokens >= 0 && o.num_sink_tokens <= INT32_MAX)
      << "variant.num_sink_tokens = " << o.num_sink_tokens << ", expected in [0, 2^31)";
  if (o.num_sink_tokens > 0) {
    TESSERA_CHECK_ARG(o.window_left >= 0) << "variant.num_sink_tokens = " << o.num_sink_tokens
                                          << " needs a sliding window, but variant.window_left = -1";
    r.features |= feature::kSinks;
    p.num_sink_tokens = static_cast<int32_t>(o.num_sink_tokens);
  }
}

/// A packed custom mask (not over block-sparse KV).
void resolve_custom_mask(const VariantOptions& o, const VariantContext& ctx, ResolvedVariant& r) {
  kernels::VariantParams& p = r.params;
  TESSERA_CHECK_ARG(o.custom_mask.defined() == o.custom_mask_indptr.defined())
      << "variant.custom_mask is " << (o.custom_mask.defined() ? "set" : "unset") << " but variant.custom_mask_indptr is "
      << (o.custom_mask_indptr.defined() ? "set" : "unset") << ", expected both or neither";
  if (o.custom_mask.defined()) {
    TESSERA_CHECK(!ctx.block_sparse, StatusCode::kUnsupported)
        << "variant.custom_mask is not supported with block-sparse KV (supported: prefill and decode over "
           "dense, ragged and paged KV; over block-sparse KV, mask with a user variant's logits_mask and the "
           "block flags)";
    check_device_array(o.custom_mask, "variant.custom_mask", DType::kU8, -1, ctx);
    check_device_array(o.custom_mask_indptr, "variant.custom_mask_indptr", DType::kI32, ctx.batch_size + 1, ctx);
    r.features |= feature::kCustomMask;
    p.custom_mask = o.custom_mask.data_as<const uint8_t>();
    p.custom_mask_indptr = o.custom_mask_indptr.data_as<const int32_t>();
  }
}

/// The transforms of the logits: tanh soft-cap, ALiBi, sigmoid in place of the softmax.
void resolve_logits(const VariantOptions& o, const VariantContext& ctx, ResolvedVariant& r) {
  kernels::VariantParams& p = r.params;
  TESSERA_CHECK_ARG(std::isfinite(o.logits_soft_cap) && o.logits_soft_cap >= 0.0)
      << "variant.logits_soft_cap = " << o.logits_soft_cap << ", expected 0 (off) or a finite value > 0";
  if (o.logits_soft_cap > 0.0) {
    r.features |= feature::kSoftCap;
    p.soft_cap = static_cast<float>(o.logits_soft_cap);
    p.inv_soft_cap = static_cast<float>(1.0 / o.logits_soft_cap);
  }
  if (o.alibi_slopes.defined()) {
    check_device_array(o.alibi_slopes, "variant.alibi_slopes", DType::kF32, ctx.num_qo_heads, ctx);
    r.features |= feature::kAlibi;
    p.alibi_slopes = o.alibi_slopes.data_as<const float>();
  }
  check_finite(o.sigmoid_bias, "variant.sigmoid_bias");
  if (o.sigmoid) {
    r.features |= feature::kSigmoid;
    p.sigmoid_bias = static_cast<float>(o.sigmoid_bias);
  }
}

/// Rotary embedding of q and k (Llama, Llama 3.1) with per-request position offsets.
void resolve_rope(const RopeOptions& rope, const VariantContext& ctx, ResolvedVariant& r) {
  kernels::VariantParams& p = r.params;
  TESSERA_CHECK_ARG(rope.mode == PosEncoding::kNone || rope.mode == PosEncoding::kRopeLlama ||
                    rope.mode == PosEncoding::kRopeLlama31)
      << "variant.rope.mode = " << static_cast<int>(rope.mode) << ", expected kNone, kRopeLlama or kRopeLlama31";
  if (rope.mode == PosEncoding::kNone) {
    TESSERA_CHECK_ARG(!rope.q_offset.defined() && !rope.k_offset.defined())
        << "variant.rope.q_offset / k_offset are set but variant.rope.mode = kNone";
    return;
  }
  TESSERA_CHECK_ARG(std::isfinite(rope.theta) && rope.theta > 1.0)
      << "variant.rope.theta = " << rope.theta << ", expected a finite value > 1";
  TESSERA_CHECK_ARG(std::isfinite(rope.scale) && rope.scale > 0.0)
      << "variant.rope.scale = " << rope.scale << ", expected a finite value > 0";
  r.features |= feature::kRope;
  p.rope_kind = static_cast<int32_t>(rope.mode == PosEncoding::kRopeLlama ? kernels::RopeKind::kLlama
                                                                          : kernels::RopeKind::kLlama31);
  p.rope_rcp_scale = static_cast<float>(1.0 / rope.scale);
  p.rope_log2_theta = static_cast<float>(std::log2(rope.theta));
  if (rope.mode == PosEncoding::kRopeLlama31) {
    const double f = rope.llama31_factor, lo = rope.llama31_low_freq_factor, hi = rope.llama31_high_freq_factor,
                 orig = rope.llama31_original_max_position;
    TESSERA_CHECK_ARG(std::isfinite(f) && std::isfinite(orig) && f > 0 && lo > 0 && hi > lo && orig > 0)
        << "variant.rope Llama 3.1 parameters: factor = " << f << ", low_freq_factor = " << lo
        << ", high_freq_factor = " << hi << ", original_max_position = " << orig
        << "; expected factor > 0, high_freq_factor > low_freq_factor > 0, original_max_position > 0";
    p.llama31_factor = static_cast<float>(f);
    p.llama31_low_freq_wavelen = static_cast<float>(orig / lo);
    p.llama31_high_freq_wavelen = static_cast<float>(orig / hi);
    p.llama31_smooth_scale = static_cast<float>(orig / (hi - lo));
    p.llama31_smooth_bias = static_cast<float>(lo / (hi - lo));
  }
  if (rope.q_offset.defined() || rope.k_offset.defined()) {
    TESSERA_CHECK(!ctx.block_sparse, StatusCode::kUnsupported)
        << "variant.rope.q_offset / k_offset are per request: not supported with block-sparse KV (supported: "
           "dense, ragged and paged KV; block-sparse KV is one sequence, leave them undefined)";
  }
  if (rope.q_offset.defined()) {
    check_device_array(rope.q_offset, "variant.rope.q_offset", DType::kI32, ctx.batch_size, ctx);
    p.rope_q_offset = rope.q_offset.data_as<const int32_t>();
  }
  if (rope.k_offset.defined()) {
    check_device_array(rope.k_offset, "variant.rope.k_offset", DType::kI32, ctx.batch_size, ctx);
    p.rope_k_offset = rope.k_offset.data_as<const int32_t>();
  }
}

}  // namespace

ResolvedVariant resolve_variant(const VariantOptions& o, const VariantContext& ctx) {
  ResolvedVariant r;
  if (o.is_default()) return r;
  r.is_default = false;
  r.params.sm_scale = static_cast<float>(ctx.sm_scale);
  // In the order of the checks' messages since the first release: the first bad option is named.
  resolve_window(o, r);
  resolve_logits(o, ctx, r);
  resolve_custom_mask(o, ctx, r);
  resolve_rope(o.rope, ctx, r);
  if (o.user != nullptr) {
    const VariantSpec& spec = *o.user;
    TESSERA_CHECK_ARG(!spec.name.empty()) << "variant.user->name is empty, expected a name for logs and errors";
    fill_param_slots(spec.params, "variant '" + spec.name + "'", "variant param ", *ctx.q, "q", r.params.extra);
    r.user = &spec;
  }
  r.use_softmax = !o.sigmoid && (o.user == nullptr || o.user->use_softmax);
  return r;
}

}  // namespace detail
}  // namespace tessera
