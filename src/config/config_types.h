// The vocabulary of the generated configuration table (src/config/attention_configs.txt ->
// <build>/src/config/attention_configs.h): query tiles, the configuration templates the table
// specialises, and the errors of its switches.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/attention/params.cuh"

namespace tessera {
namespace detail {

/// Query rows per CTA. The rows are packed (query, head-in-group) pairs, so a decode step with
/// GQA group 4 fills 4 rows of a tile. k16Wide: 16 rows whose KV tiles 8 warps split (grids that
/// leave SMs idle); k128Wgmma: the 128-row tile computed with wgmma (sm_90a).
enum class QTile { k16, k16Wide, k64, k128, k128Wgmma };

/// "16", "16w", "64", "128", "128wg": the names TESSERA_PREFILL_QTILE and error messages use.
const char* q_tile_name(QTile q_tile);

/// The head dims of a prefill configuration: of Q and K (`qk`, Q K^T's reduction) and of V and O
/// (`vo`). From one int: both equal, as for every head dim but the split ones of the table
/// ("192x128": non-absorbed MLA prefill).
struct PrefillHeadDims {
  int qk;
  int vo;
  constexpr PrefillHeadDims(int head_dim) : qk(head_dim), vo(head_dim) {}  // NOLINT: implicit on purpose
  constexpr PrefillHeadDims(int head_dim_qk, int head_dim_vo) : qk(head_dim_qk), vo(head_dim_vo) {}
  constexpr bool split() const { return qk != vo; }
};

/// A prefill configuration's head dims as types, for the generated switches' callbacks.
template <int QK, int VO>
struct PrefillHeadDimsTag {
  static constexpr int kQk = QK;
  static constexpr int kVo = VO;
};

/// The prefill tile (PrefillTraits) of element type T, head dims HEAD_DIM (Q, K) and HEAD_DIM_VO
/// (V, O) and query tile Q, with the KV formats it is built for (kFormats); specialised by the
/// generated table only.
template <typename T, int HEAD_DIM, QTile Q, int HEAD_DIM_VO = HEAD_DIM>
struct PrefillConfig;

/// The CUDA-core decode kernel's traits (DecodeTraits) and formats; specialised by the table only.
template <typename T, int HEAD_DIM>
struct DecodeConfig;

/// A configuration as a value, for the generated switches' callbacks (C++17 has no template
/// lambdas): f(ConfigTag<C>{}) reads C::Traits and C::kFormats.
template <typename Config>
struct ConfigTag {
  using type = Config;
};

constexpr uint32_t format_bit(kernels::KVFormatKind format) { return 1u << static_cast<int>(format); }

/// How a prefill configuration's K/V are stored (the table's kv column): as its operands' dtype,
/// or as fp8 that its mainloop dequantizes.
enum class KVStorage { kSame = 0, kE4M3 = 1, kE5M2 = 2 };
constexpr uint32_t kv_storage_bit(KVStorage kv) { return 1u << static_cast<int>(kv); }
/// The KVStorage of K/V elements of type KVT under operands of type T.
template <typename KVT, typename T>
constexpr KVStorage kv_storage_of() {
  static_assert(std::is_same<KVT, T>::value || std::is_same<KVT, __nv_fp8_e4m3>::value ||
                    std::is_same<KVT, __nv_fp8_e5m2>::value,
                "K/V of the operands' type or fp8");
  return std::is_same<KVT, __nv_fp8_e4m3>::value   ? KVStorage::kE4M3
         : std::is_same<KVT, __nv_fp8_e5m2>::value ? KVStorage::kE5M2
                                                   : KVStorage::kSame;
}

[[noreturn]] void fail_unsupported_head_dim(const char* family, PrefillHeadDims head_dim, const char* supported);
/// kv_type: K/V's element type name when they are not stored as the operands' (fp8), else nullptr.
[[noreturn]] void fail_no_prefill_config(PrefillHeadDims head_dims, QTile q_tile, const char* kv_type = nullptr);
[[noreturn]] void fail_unsupported_format(const char* family, PrefillHeadDims head_dims, kernels::KVFormatKind format);

template <kernels::KVFormatKind kFormat>
using FormatTag = std::integral_constant<kernels::KVFormatKind, kFormat>;

/// Calls f(FormatTag<format>{}) when Config is built for `format`; otherwise an error naming the
/// family and head dim.
template <typename Config, typename F>
void with_config_format(kernels::KVFormatKind format, const char* family, F&& f) {
  constexpr PrefillHeadDims kHeadDims{Config::Traits::HEAD_DIM, Config::Traits::HEAD_DIM_VO};
  switch (format) {
    case kernels::KVFormatKind::kRagged:
      if constexpr ((Config::kFormats & format_bit(kernels::KVFormatKind::kRagged)) != 0) {
        return f(FormatTag<kernels::KVFormatKind::kRagged>{});
      }
      break;
    case kernels::KVFormatKind::kPaged:
      if constexpr ((Config::kFormats & format_bit(kernels::KVFormatKind::kPaged)) != 0) {
        return f(FormatTag<kernels::KVFormatKind::kPaged>{});
      }
      break;
    case kernels::KVFormatKind::kBlockSparse:
      if constexpr ((Config::kFormats & format_bit(kernels::KVFormatKind::kBlockSparse)) != 0) {
        return f(FormatTag<kernels::KVFormatKind::kBlockSparse>{});
      }
      break;
  }
  fail_unsupported_format(family, kHeadDims, format);
}

}  // namespace detail
}  // namespace tessera
