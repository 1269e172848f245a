// Public helpers of tessera/variant.h: parameter constructors, ALiBi slopes and the
// FlexAttention-style combinators. The validation and the JIT are in variant_config.cpp and
// jit_variant.cpp.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "src/check.h"
#include "tessera/variant.h"

namespace tessera {

namespace {

VariantParam make_param(std::string name, VariantParam::Kind kind) {
  VariantParam p;
  p.name = std::move(name);
  p.kind = kind;
  return p;
}

}  // namespace

VariantParam VariantParam::scalar_f32(std::string name, float value) {
  VariantParam p = make_param(std::move(name), Kind::kF32);
  p.f32 = value;
  return p;
}

VariantParam VariantParam::scalar_i32(std::string name, int32_t value) {
  VariantParam p = make_param(std::move(name), Kind::kI32);
  p.i64 = value;
  return p;
}

VariantParam VariantParam::scalar_i64(std::string name, int64_t value) {
  VariantParam p = make_param(std::move(name), Kind::kI64);
  p.i64 = value;
  return p;
}

VariantParam VariantParam::device_tensor(std::string name, const TensorView& tensor) {
  VariantParam p = make_param(std::move(name), Kind::kTensor);
  p.tensor = tensor;
  return p;
}

bool VariantOptions::is_default() const {
  return window_left == -1 && num_sink_tokens == 0 && logits_soft_cap == 0.0 && !alibi_slopes.defined() && !sigmoid &&
         !custom_mask.defined() && !custom_mask_indptr.defined() && rope.mode == PosEncoding::kNone &&
         !rope.q_offset.defined() && !rope.k_offset.defined() && user == nullptr;
}

std::vector<float> alibi_slopes(int64_t num_heads) {
  TESSERA_CHECK_ARG(num_heads >= 1) << "num_heads = " << num_heads << ", expected >= 1";
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  std::vector<float> slopes;
  slopes.reserve(static_cast<size_t>(num_heads));
  for (int64_t k = 1; k <= n; ++k) slopes.push_back(static_cast<float>(std::exp2(-8.0 * k / n)));
  for (int64_t k = 1; k <= num_heads - n; ++k) slopes.push_back(static_cast<float>(std::exp2(-4.0 * (2 * k - 1) / n)));
  return slopes;
}

namespace {

MaskMod combine_masks(const MaskMod& a, const MaskMod& b, const char* op, const char* word) {
  TESSERA_CHECK_ARG(!a.function.empty() && !b.function.empty() && a.function != b.function)
      << word << "_masks: mask functions '" << a.function << "' and '" << b.function
      << "', expected two different non-empty names";
  MaskMod m;
  m.function = a.function + "_" + word + "_" + b.function;
  // A MaskMod built by an earlier combination already holds its parts' sources: keep one copy.
  m.source = a.source;
  if (b.source != a.source) m.source += "\n" + b.source;
  m.source += "\ninline bool " + m.function + "(const Params& params, int b, int h, int q_idx, int kv_idx) {\n  return " +
              a.function + "(params, b, h, q_idx, kv_idx) " + op + " " + b.function + "(params, b, h, q_idx, kv_idx);\n}\n";
  return m;
}

}  // namespace

MaskMod and_masks(const MaskMod& a, const MaskMod& b) { return combine_masks(a, b, "&&", "and"); }
MaskMod or_masks(const MaskMod& a, const MaskMod& b) { return combine_masks(a, b, "||", "or"); }

VariantSpec flex_variant(std::string name, const MaskMod* mask, const ScoreMod* score, std::vector<VariantParam> params) {
  VariantSpec spec;
  spec.name = std::move(name);
  spec.params = std::move(params);
  if (mask != nullptr) {
    TESSERA_CHECK_ARG(!mask->function.empty()) << "flex_variant: mask.function is empty, expected the mask_mod's name";
    spec.source += mask->source + "\ninline bool logits_mask(const Params& params, int batch, int qo_idx, int kv_idx, "
                                  "int qo_head, int kv_head) {\n  return " +
                   mask->function + "(params, batch, qo_head, qo_idx, kv_idx);\n}\n";
  }
  if (score != nullptr) {
    TESSERA_CHECK_ARG(!score->function.empty())
        << "flex_variant: score.function is empty, expected the score_mod's name";
    spec.source += score->source + "\ninline float logits_transform(const Params& params, float logits, int batch, "
                                   "int qo_idx, int kv_idx, int qo_head, int kv_head) {\n  return " +
                   score->function + "(params, logits, batch, qo_head, qo_idx, kv_idx);\n}\n";
  }
  return spec;
}

}  // namespace tessera
