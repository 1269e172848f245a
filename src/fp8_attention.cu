// The FP8 attention tiles and their launch (src/fp8_attention.h). One translation unit: two head
// dims x two output types x two formats of one kernel template.
#include "src/fp8_attention.h"

#include <type_traits>

#include "src/check.h"
#include "src/prefill_launch.cuh"

namespace tessera {
namespace detail {

namespace {

/// The FP8 attention tile of a head dim: the 16-bit wgmma tile's shape (two compute warpgroups of
/// 64 query rows, 128-key tiles; 64-key tiles at head dim 256, whose O takes 128 accumulators per
/// thread) with fp8 operands and, since an fp8 stage is half the bytes of a 16-bit one, 3 K/V
/// stages beside the three raw V stages of the transpose.
template <int HEAD_DIM>
struct Fp8AttentionTile;
template <>
struct Fp8AttentionTile<128> {
  using Traits = kernels::PrefillTraits<__nv_fp8_e4m3, 128, 128, 128, 8, 1, 3, 1, kernels::MmaKind::kWgmma>;
};
template <>
struct Fp8AttentionTile<256> {
  using Traits = kernels::PrefillTraits<__nv_fp8_e4m3, 256, 128, 64, 8, 1, 3, 1, kernels::MmaKind::kWgmma>;
};

static_assert(sizeof(kFp8AttentionHeadDims) / sizeof(int) == 2 && kFp8AttentionHeadDims[0] == 128 &&
                  kFp8AttentionHeadDims[1] == 256,
              "kFp8AttentionHeadDims lists the tiles above (and with_fp8_tile's switch)");

/// Calls f(ConfigTag<Traits>{}, FormatTag<format>{}) for the FP8 tile of head_dim and a ragged or
/// paged format (the callers have checked both).
template <typename F>
void with_fp8_tile(int head_dim, kernels::KVFormatKind format, F&& f) {
  auto with_format = [&](auto traits_tag) {
    switch (format) {
      case kernels::KVFormatKind::kRagged: return f(traits_tag, FormatTag<kernels::KVFormatKind::kRagged>{});
      case kernels::KVFormatKind::kPaged: return f(traits_tag, FormatTag<kernels::KVFormatKind::kPaged>{});
      default:
        TESSERA_FAIL(StatusCode::kInternal) << "FP8 attention: KV format " << static_cast<int>(format)
                                            << " reached the launcher (ragged and paged only)";
    }
  };
  switch (head_dim) {
    case 128: return with_format(ConfigTag<Fp8AttentionTile<128>::Traits>{});
    case 256: return with_format(ConfigTag<Fp8AttentionTile<256>::Traits>{});
    default:
      TESSERA_FAIL(StatusCode::kInternal) << "FP8 attention: head_dim " << head_dim << " reached the launcher";
  }
}

}  // namespace

template <typename F8, typename OT>
void launch_fp8_attention_persistent(const kernels::AttentionParams<F8, F8, OT>& p, kernels::KVFormatKind format,
                                     int head_dim, const PersistentLaunch& launch, cudaStream_t stream) {
  static_assert(std::is_same<F8, __nv_fp8_e4m3>::value, "FP8 attention is built for e4m3");
  TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kInternal) << "FP8 attention on a device without wgmma";
  with_fp8_tile(head_dim, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    ResolvedVariant default_variant;  // the prebuilt kernel: FP8 attention takes no variant
    launch_persistent_config<Traits, decltype(format_tag)::value>(p, default_variant, launch, stream);
  });
}

int fp8_attention_ctas_per_sm(int head_dim, kernels::KVFormatKind format) {
  int ctas = 0;
  with_fp8_tile(head_dim, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    auto kernel = kernels::attention_prefill_kernel<Traits, decltype(format_tag)::value, kernels::DefaultVariant,
                                                    kernels::PlannedScheduler,
                                                    kernels::AttentionParams<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16>>;
    ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kDefaultSmemBytes);
    TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Traits::kThreads,
                                                                     Traits::kDefaultSmemBytes))
        << " (occupancy of the FP8 attention persistent kernel)";
  });
  return ctas;
}

template <typename F8, typename OT>
void launch_fp8_attention(const kernels::AttentionParams<F8, F8, OT>& p, kernels::KVFormatKind format, int head_dim,
                          int64_t max_qo_len, cudaStream_t stream) {
  static_assert(std::is_same<F8, __nv_fp8_e4m3>::value, "FP8 attention is built for e4m3");
  TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kInternal) << "FP8 attention on a device without wgmma";
  with_fp8_tile(head_dim, format, [&](auto traits_tag, auto format_tag) {
    using Traits = typename decltype(traits_tag)::type;
    constexpr kernels::KVFormatKind kFormat = decltype(format_tag)::value;
    const OneShotLaunch<Traits> shape = one_shot_launch<Traits, kFormat>(p, max_qo_len);
    if (!shape.empty) launch_default_one_shot<Traits, kFormat>(p, kernels::VariantParams{}, shape, stream);
  });
}

template void launch_fp8_attention_persistent<__nv_fp8_e4m3, __half>(
    const kernels::AttentionParams<__nv_fp8_e4m3, __nv_fp8_e4m3, __half>&, kernels::KVFormatKind, int,
    const PersistentLaunch&, cudaStream_t);
template void launch_fp8_attention_persistent<__nv_fp8_e4m3, __nv_bfloat16>(
    const kernels::AttentionParams<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16>&, kernels::KVFormatKind, int,
    const PersistentLaunch&, cudaStream_t);
template void launch_fp8_attention<__nv_fp8_e4m3, __half>(const kernels::AttentionParams<__nv_fp8_e4m3, __nv_fp8_e4m3, __half>&,
                                                          kernels::KVFormatKind, int, int64_t, cudaStream_t);
template void launch_fp8_attention<__nv_fp8_e4m3, __nv_bfloat16>(
    const kernels::AttentionParams<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16>&, kernels::KVFormatKind, int, int64_t,
    cudaStream_t);

}  // namespace detail
}  // namespace tessera
