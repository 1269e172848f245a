// Attention entry points: validate the arguments, describe them as AttentionParams and hand them
// to a kernel family (src/attention_dispatch.h). Every format reduces to one of three gathers
// (ragged, paged, block-sparse); decode picks CUDA cores or the tensor-core prefill template.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "src/attention_args.h"
#include "src/attention_dispatch.h"
#include "src/check.h"
#include "src/env.h"
#include "src/cuda_utils.h"
#include "src/dispatch.h"
#include "src/fp8_attention.h"
#include "src/prefill_config.h"
#include "src/runtime/device_errors.h"
#include "src/tensor_checks.h"
#include "src/variant/jit_variant.h"
#include "tessera/attention.h"
#include "tessera/validate.h"

namespace tessera {

using kernels::AttentionParams;
using kernels::KVFormatKind;

namespace detail {

/// A 16-bit tensor of `ndim` dims the kernels read or write in 16-byte vectors.
void check_operand(const TensorView& t, const char* name, int ndim) {
  check_ndim(t, name, ndim);
  check_dtype(t, name, {DType::kF16, DType::kBF16});
  check_on_cuda(t, name);
  check_last_dim_contiguous(t, name);
  detail::check_vector_aligned(t, name);
}

void check_prefill_query(const TensorView& q, int ndim) {
  if (!is_fp8(q.dtype)) return check_operand(q, "q", ndim);
  check_ndim(q, "q", ndim);
  check_on_cuda(q, "q");
  check_last_dim_contiguous(q, "q");
  detail::check_vector_aligned(q, "q");
}

void check_kv_operand(const TensorView& t, const char* name, int ndim, const TensorView& q) {
  check_ndim(t, name, ndim);
  check_dtype(t, name, {q.dtype, DType::kE4M3, DType::kE5M2});
  check_on_cuda(t, name);
  check_last_dim_contiguous(t, name);
  detail::check_vector_aligned(t, name);
}

void check_index_array(const TensorView& t, const char* name, const TensorView& data, int64_t length) {
  check_ndim(t, name, 1);
  check_dtype(t, name, {DType::kI32});
  check_on_cuda(t, name);
  check_same_device(data, "q", t, name);
  check_size(t, name, 0, length);
}

/// o like q ([rows, Hq, D], same dtype); lse f32 [rows, Hq] when given.
void check_outputs(const TensorView& q, const TensorView& o, const TensorView& lse, int64_t rows) {
  check_outputs(q, o, lse, rows, q.shape[q.ndim - 1]);
}

void check_outputs(const TensorView& q, const TensorView& o, const TensorView& lse, int64_t rows, int64_t head_dim_vo) {
  check_operand(o, "o", 3);
  if (is_fp8(q.dtype)) {
    check_dtype(o, "o", {DType::kF16, DType::kBF16});
  } else {
    check_dtype(o, "o", {q.dtype});
  }
  check_same_device(q, "q", o, "o");
  check_size(o, "o", 0, rows);
  check_size(o, "o", 1, q.shape[q.ndim - 2]);
  check_size(o, "o", 2, head_dim_vo);
  if (lse.data != nullptr) {
    check_ndim(lse, "lse", 2);
    check_dtype(lse, "lse", {DType::kF32});
    check_on_cuda(lse, "lse");
    check_same_device(q, "q", lse, "lse");
    check_size(lse, "lse", 0, rows);
    check_size(lse, "lse", 1, q.shape[q.ndim - 2]);
  }
}

HeadConfig check_heads(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim) {
  const HeadConfig heads{num_qo_heads, num_kv_heads, head_dim};
  validate_heads(heads, {});
  TESSERA_CHECK(std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), head_dim) !=
                    std::end(kSupportedHeadDims),
                StatusCode::kUnsupported)
      << "head_dim = " << head_dim << " is not supported (supported: " << kSupportedHeadDimsText << ")";
  TESSERA_CHECK_ARG(num_qo_heads <= 65535 && num_kv_heads <= 65535)
      << "num_qo_heads = " << num_qo_heads << ", num_kv_heads = " << num_kv_heads << ", expected <= 65535";
  return heads;
}

PrefillHeadDims check_prefill_heads(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim_qk,
                                    int64_t head_dim_vo, const char* v_name) {
  if (head_dim_vo == head_dim_qk) {
    const HeadConfig heads = check_heads(num_qo_heads, num_kv_heads, head_dim_qk);
    return PrefillHeadDims(static_cast<int>(heads.head_dim));
  }
  validate_heads(HeadConfig{num_qo_heads, num_kv_heads, head_dim_qk}, {});
  TESSERA_CHECK_ARG(num_qo_heads <= 65535 && num_kv_heads <= 65535)
      << "num_qo_heads = " << num_qo_heads << ", num_kv_heads = " << num_kv_heads << ", expected <= 65535";
  for (const auto& pair : kSupportedPrefillSplitHeadDims) {
    if (pair[0] == head_dim_qk && pair[1] == head_dim_vo) {
      return PrefillHeadDims(static_cast<int>(head_dim_qk), static_cast<int>(head_dim_vo));
    }
  }
  TESSERA_FAIL(StatusCode::kUnsupported) << v_name << ".shape[-1] = " << head_dim_vo << " with head_dim " << head_dim_qk
                                         << " (of q and k) is not supported: V's head dim must equal it, or (head_dim_qk"
                                         << " / head_dim_vo) be one of " << kPrefillSplitHeadDimsText;
}

/// K and V of a single request: NHD [kv_len, Hkv, D] or HND [Hkv, kv_len, D] (V's D may differ:
/// the callers check the last dims).
void check_dense_kv(const TensorView& q, const TensorView& k, const TensorView& v, Layout layout) {
  check_kv_operand(k, "k", 3, q);
  check_kv_operand(v, "v", 3, q);
  check_dtype(v, "v", {k.dtype});
  check_same_device(q, "q", k, "k");
  check_same_device(q, "q", v, "v");
  TESSERA_CHECK_ARG(layout == Layout::kNHD || layout == Layout::kHND)
      << "kv_layout = " << static_cast<int>(layout) << ", expected NHD or HND";
  for (int d = 0; d < 2; ++d) check_size(v, "v", d, k.shape[d]);
  TESSERA_CHECK_ARG(k.shape[layout == Layout::kNHD ? 0 : 1] <= INT32_MAX) << "k: kv_len exceeds 2^31 - 1";
}

void check_paged_kv(const TensorView& q, const PagedKV& kv, int64_t batch) {
  validate_paged_kv(kv, "paged_kv");
  check_kv_operand(kv.k, "paged_kv.k", 4, q);
  check_kv_operand(kv.v, "paged_kv.v", 4, q);
  check_dtype(kv.v, "paged_kv.v", {kv.k.dtype});
  check_same_device(q, "q", kv.k, "paged_kv.k");
  check_on_cuda(kv.indptr, "paged_kv.indptr");
  check_on_cuda(kv.indices, "paged_kv.indices");
  check_on_cuda(kv.last_page_len, "paged_kv.last_page_len");
  check_size(kv.indptr, "paged_kv.indptr", 0, batch + 1);
  TESSERA_CHECK_ARG(kv.num_pages() <= INT32_MAX && kv.indices.shape[0] <= INT32_MAX && kv.page_size() <= INT32_MAX)
      << "paged_kv: num_pages = " << kv.num_pages() << ", page_size = " << kv.page_size() << ", expected < 2^31";
}

/// Checks qo_indptr against q and max_qo_len (fully in checked mode) and returns the average
/// query length.
double check_qo_indptr(const TensorView& q, const TensorView& qo_indptr, int64_t batch, int64_t max_qo_len) {
  check_index_array(qo_indptr, "qo_indptr", q, batch + 1);
  const std::vector<int32_t> host = validate_indptr(qo_indptr, "qo_indptr", q.shape[0]);
  TESSERA_CHECK_ARG(max_qo_len >= 0 && max_qo_len <= INT32_MAX)
      << "max_qo_len = " << max_qo_len << ", expected in [0, 2^31)";
  for (size_t b = 0; b + 1 < host.size(); ++b) {
    TESSERA_CHECK_ARG(host[b + 1] - host[b] <= max_qo_len)
        << "qo_indptr[" << b + 1 << "] - qo_indptr[" << b << "] = " << host[b + 1] - host[b]
        << " exceeds max_qo_len = " << max_qo_len;
  }
  return batch > 0 ? static_cast<double>(q.shape[0]) / static_cast<double>(batch) : 0.0;
}

/// max_qo_len sizes the grid: the rows of a longer request would stay unwritten. check_qo_indptr
/// checks the lengths on the host when it can read them; a device-resident qo_indptr is also
/// checked on the device, next to the kernel, and a failure is raised by the next call or by
/// check_device_errors (tessera/validate.h). In checked mode the host has already checked the
/// same values, so the device check then never fires; it is queued anyway so that toggling
/// checked mode from another thread cannot leave a call checked by neither.
void check_max_qo_len_on_device(const TensorView& qo_indptr, int64_t batch, int64_t max_qo_len, DeviceCheckSite site,
                                StreamHandle stream) {
  if (qo_indptr.device.is_host()) return;
  enqueue_segment_length_check(qo_indptr.data_as<const int32_t>(), batch, max_qo_len, site, stream);
}

}  // namespace detail

namespace {

using namespace detail;
/// The call's variant, validated (the default one runs the prebuilt kernels).
ResolvedVariant call_variant(const AttentionOptions& options, const TensorView& q, const HeadConfig& heads,
                             int64_t batch, bool block_sparse) {
  VariantContext ctx;
  ctx.q = &q;
  ctx.batch_size = batch;
  ctx.num_qo_heads = heads.num_qo_heads;
  ctx.head_dim = heads.head_dim;
  ctx.sm_scale = resolved_sm_scale(options, heads.head_dim);
  ctx.block_sparse = block_sparse;
  return resolve_variant(options.variant, ctx);
}

template <typename T, typename KVT>
void run_decode(const AttentionParams<T, KVT>& p, const ResolvedVariant& variant, KVFormatKind format,
                const HeadConfig& heads, DecodeKernel kernel, StreamHandle stream) {
  constexpr bool kFp8KV = !std::is_same<KVT, T>::value;
  const int64_t group = heads.num_qo_heads / heads.num_kv_heads;
  if (kernel == DecodeKernel::kAuto) {
    // Variants are hooks of the prefill template, which is also the tensor-core decode family.
    // fp8 K/V streams at 0.85-0.96 of the copy ceiling there (bench/results/LOG.md, session 26),
    // where the CUDA-core kernel reads 16-bit K/V at ~0.6.
    kernel = group >= 4 || !variant.is_default || kFp8KV ? DecodeKernel::kTensorCores : DecodeKernel::kCudaCores;
  }
  if (kernel == DecodeKernel::kCudaCores) {
    TESSERA_CHECK(variant.is_default, StatusCode::kUnsupported)
        << "kernel = kCudaCores runs the default variant only; options.variant is set (use kAuto or kTensorCores)";
    detail::launch_decode_cuda_cores<T, KVT>(p, format, static_cast<int>(heads.head_dim), stream);
  } else {
    TESSERA_CHECK_ARG(kernel == DecodeKernel::kTensorCores) << "kernel = " << static_cast<int>(kernel)
                                                            << ", expected kAuto, kCudaCores or kTensorCores";
    detail::launch_prefill<T, KVT>(p, variant, format, static_cast<int>(heads.head_dim), 1, 1.0, stream);
  }
}

/// K/V of dtype kv_dtype for head_dim, with `options.kv_scales`: fp8 only where the table builds
/// it, and scales only for fp8 (checked against the KV's heads and device).
void check_kv_storage(const TensorView& k, const char* k_name, int64_t head_dim, int64_t num_kv_heads,
                      const AttentionOptions& options) {
  if (is_fp8(k.dtype)) {
    const KVStorage kv = k.dtype == DType::kE4M3 ? KVStorage::kE4M3 : KVStorage::kE5M2;
    TESSERA_CHECK(has_prefill_kv_storage(static_cast<int>(head_dim), kv), StatusCode::kUnsupported)
        << k_name << ".dtype = " << dtype_name(k.dtype) << ": fp8 K/V is not built for head_dim " << head_dim
        << " (src/config/attention_configs.txt lists the head dims: 64, 128, 256)";
  }
  check_kv_scales(options.kv_scales, "options.kv_scales", k.dtype, num_kv_heads, k.device);
}

/// Split head dims (q/k wider than v/o) run 16-bit K/V and the default variant only: the built-in
/// operand transforms (RoPE) rotate a whole head dim, which for these models' keys (a rotary part
/// beside a plain one) is not the model's rotation, and no tile dequantizes fp8 rows of two widths.
void check_split_head_dims_options(PrefillHeadDims dims, const TensorView& k, const char* k_name,
                                   const ResolvedVariant& variant) {
  if (!dims.split()) return;
  TESSERA_CHECK(!is_fp8(k.dtype), StatusCode::kUnsupported)
      << k_name << ".dtype = " << dtype_name(k.dtype) << ": head_dim_qk " << dims.qk << " != head_dim_vo " << dims.vo
      << " takes f16 or bf16 K/V only";
  TESSERA_CHECK(variant.is_default, StatusCode::kUnsupported)
      << "options.variant is set: head_dim_qk " << dims.qk << " != head_dim_vo " << dims.vo
      << " runs the default variant only (causal masking and sm_scale)";
}

/// FP8 attention (an fp8 q): q, k and v e4m3, o f16 or bf16 (checked with the outputs), equal head
/// dims of kFp8AttentionHeadDims, the default variant (causal masking and sm_scale), a device with
/// wgmma; options.kv_scales descales q as well as k and v. Anything else is a named error.
void check_fp8_attention(const TensorView& q, const TensorView& k, const char* k_name, PrefillHeadDims dims,
                         const ResolvedVariant& variant, const AttentionOptions& options, int64_t num_kv_heads) {
  TESSERA_CHECK(q.dtype == DType::kE4M3, StatusCode::kUnsupported)
      << "q.dtype = " << dtype_name(q.dtype) << ": FP8 attention takes e4m3 q, k and v";
  TESSERA_CHECK(k.dtype == q.dtype, StatusCode::kUnsupported)
      << k_name << ".dtype = " << dtype_name(k.dtype) << " with q.dtype = " << dtype_name(q.dtype)
      << ": FP8 attention takes k and v of q's dtype";
  TESSERA_CHECK(!dims.split() && std::find(std::begin(kFp8AttentionHeadDims), std::end(kFp8AttentionHeadDims),
                                           dims.qk) != std::end(kFp8AttentionHeadDims),
                StatusCode::kUnsupported)
      << "head_dim = " << dims.qk << (dims.split() ? str_cat(" (v: ", dims.vo, ")") : std::string())
      << " with q.dtype = e4m3: FP8 attention is built for head dims " << kFp8AttentionHeadDimsText
      << " (equal for q, k and v)";
  TESSERA_CHECK(variant.is_default, StatusCode::kUnsupported)
      << "options.variant is set with q.dtype = e4m3: FP8 attention runs the default variant only (causal masking and "
         "sm_scale)";
  TESSERA_CHECK(current_device_has_wgmma(), StatusCode::kUnsupported)
      << "q.dtype = e4m3: FP8 attention runs on sm_90a (Hopper) only; this device or build has no wgmma";
  check_kv_scales(options.kv_scales, "options.kv_scales", k.dtype, num_kv_heads, k.device, /*fp8_query=*/true);
}

/// Launches FP8 attention over `format` after set_kv(p) has described the KV (and the queries'
/// rows) in AttentionParams<e4m3, e4m3, OT>, OT o's dtype.
template <typename SetKV>
void run_fp8_attention(const TensorView& q, const TensorView& o, const TensorView& lse, const HeadConfig& heads,
                       const AttentionOptions& options, KVFormatKind format, int64_t max_qo_len, StreamHandle stream,
                       SetKV&& set_kv) {
  using F8 = __nv_fp8_e4m3;
  TESSERA_DISPATCH_HALF_DTYPE(o.dtype, "o", OT, [&] {
    AttentionParams<F8, F8, OT> p = query_params<F8, F8, OT>(q, o, lse, heads, options);
    set_kv(p);
    detail::launch_fp8_attention<F8, OT>(p, format, static_cast<int>(heads.head_dim), max_qo_len, stream);
  });
}

}  // namespace

namespace detail {

namespace {
/// "192 (v: 128)" for split head dims, "128" otherwise.
std::string head_dims_text(PrefillHeadDims head_dims) {
  return head_dims.split() ? str_cat(head_dims.qk, " (v: ", head_dims.vo, ")") : str_cat(head_dims.qk);
}

/// TESSERA_PREFILL_QTILE, when set: the configuration it names (read once per process).
bool q_tile_override(PrefillHeadDims head_dim, QTile& out, KVStorage kv) {
  static const char* override_text = std::getenv("TESSERA_PREFILL_QTILE");
  if (override_text == nullptr || *override_text == '\0') return false;
  const std::string v = override_text;
  constexpr QTile kTiles[] = {QTile::k16, QTile::k16Wide, QTile::k64, QTile::k128, QTile::k128Wgmma};
  for (QTile q : kTiles) {
    if (v != q_tile_name(q)) continue;
    TESSERA_CHECK_ARG(has_prefill_config(head_dim, q, kv) && (q != QTile::k128Wgmma || current_device_has_wgmma()))
        << "TESSERA_PREFILL_QTILE = " << v << ": head_dim " << head_dims_text(head_dim) << " has no such tile"
        << (kv != KVStorage::kSame ? " for fp8 K/V" : "") << (q == QTile::k128Wgmma ? " on this device" : "")
        << " (src/config/attention_configs.txt)";
    out = q;
    return true;
  }
  TESSERA_FAIL(StatusCode::kInvalidArgument) << "TESSERA_PREFILL_QTILE = " << v << ", expected 16, 16w, 64, 128 or 128wg";
}
}  // namespace

const char* q_tile_name(QTile q_tile) {
  switch (q_tile) {
    case QTile::k16: return "16";
    case QTile::k16Wide: return "16w";
    case QTile::k64: return "64";
    case QTile::k128: return "128";
    case QTile::k128Wgmma: return "128wg";
  }
  return "?";
}

void fail_unsupported_head_dim(const char* family, PrefillHeadDims head_dim, const char* supported) {
  TESSERA_FAIL(StatusCode::kUnsupported) << family << ": head_dim = " << head_dims_text(head_dim)
                                         << " is not supported (supported: " << supported << ")";
}

void fail_no_prefill_config(PrefillHeadDims head_dim, QTile q_tile, const char* kv_type) {
  TESSERA_FAIL(StatusCode::kInternal) << "no prefill configuration for head_dim " << head_dims_text(head_dim)
                                      << ", query tile "
                                      << q_tile_name(q_tile) << (kv_type != nullptr ? " with K/V of type " : "")
                                      << (kv_type != nullptr ? kv_type : "") << " (src/config/attention_configs.txt)";
}

void fail_unsupported_format(const char* family, PrefillHeadDims head_dim, KVFormatKind format) {
  TESSERA_FAIL(StatusCode::kUnsupported) << family << " (head_dim " << head_dims_text(head_dim) << "): KV format "
                                         << static_cast<int>(format) << " is not built for this head dim";
}

QTile choose_q_tile(PrefillHeadDims head_dim, double avg_packed_rows, KVStorage kv) {
  QTile forced;
  if (q_tile_override(head_dim, forced, kv)) return forced;
  if (avg_packed_rows <= 16.0) return QTile::k16;
  if (avg_packed_rows <= 64.0) return QTile::k64;
  return q_tile_128(head_dim, kv);
}

QTile q_tile_128(PrefillHeadDims head_dim, KVStorage kv) {
  // TESSERA_PREFILL_WGMMA=0 keeps the mma.sync tile on sm_90 (tests cover the configuration sm_80
  // devices run; benchmarks compare the two). Read once per process.
  static const bool wgmma_allowed = env_choice("TESSERA_PREFILL_WGMMA", {"1", "0"}) == "1";
  // fp8 K/V: the table builds k128Wgmma for head dims 64 and 128 (the producer converts stages).
  if (has_prefill_config(head_dim, QTile::k128Wgmma, kv) && wgmma_allowed && current_device_has_wgmma()) {
    return QTile::k128Wgmma;
  }
  return has_prefill_config(head_dim, QTile::k128, kv) ? QTile::k128 : QTile::k64;
}

QTile choose_runtime_q_tile(PrefillHeadDims head_dim, double avg_packed_rows, int64_t pairs_at_16_rows, int sm_count,
                            KVStorage kv) {
  QTile forced;
  if (q_tile_override(head_dim, forced, kv)) return forced;
  const QTile q_tile = choose_q_tile_for_grid(head_dim, avg_packed_rows, pairs_at_16_rows, sm_count, kv);
  if (q_tile == QTile::k64 && kv == KVStorage::kSame && pairs_at_16_rows >= sm_count &&
      q_tile_128(head_dim, kv) == QTile::k128Wgmma) {
    return QTile::k128Wgmma;
  }
  return q_tile;
}

PodTiles pod_tiles(PrefillHeadDims head_dim) {
  static const bool wide = env_choice("TESSERA_POD_DECODE_TILE", {"16", "16w"}) == "16w";
  const QTile prefill = q_tile_128(head_dim);
  if (wide) {
    TESSERA_CHECK(prefill == QTile::k128Wgmma && has_prefill_config(head_dim, QTile::k16Wide, KVStorage::kSame),
                  StatusCode::kInvalidArgument)
        << "TESSERA_POD_DECODE_TILE=16w: no wide 16-row tile beside the " << q_tile_name(prefill)
        << " prefill tile at head_dim " << head_dim.qk;
    return PodTiles{prefill, QTile::k16Wide};
  }
  return PodTiles{prefill, QTile::k16};
}

QTile choose_q_tile_for_grid(PrefillHeadDims head_dim, double avg_packed_rows, int64_t pairs_at_16_rows, int sm_count,
                             KVStorage kv) {
  QTile forced;
  if (q_tile_override(head_dim, forced, kv)) return forced;
  const QTile q_tile = choose_q_tile(head_dim, avg_packed_rows, kv);
  // fp8 K/V streams half the bytes per KV row through the same per-tile chain, so the 4-warp tile
  // stayed latency bound even with every SM busy (3 CTAs, 12 warps per SM); the wide tile's 2 x 8
  // warps over twice the rows read faster in every B >= 16, L >= 4k cell of W10 (one-shot B=64
  // L=16k: 0.93 against 0.81 of the copy ceiling; bench/results/LOG.md).
  const bool wide_pays = pairs_at_16_rows < sm_count || kv != KVStorage::kSame;
  if (q_tile == QTile::k16 && has_prefill_config(head_dim, QTile::k16Wide, kv) && wide_pays) return QTile::k16Wide;
  return q_tile;
}

template <typename T, typename KVT>
void launch_prefill(const AttentionParams<T, KVT>& p, const ResolvedVariant& variant, KVFormatKind format,
                    PrefillHeadDims head_dims, int64_t max_qo_len, double avg_qo_len, cudaStream_t stream) {
  const int64_t q_tiles_at_16 = (max_qo_len * p.group_size + 15) / 16;
  with_prefill_head_dim(head_dims, [&](auto head_dims_tag) {
    const QTile q_tile = choose_q_tile_for_grid(head_dims, avg_qo_len * p.group_size,
                                                q_tiles_at_16 * p.batch_size * p.num_kv_heads,
                                                current_device_sm_count(), kv_storage_of<KVT, T>());
    constexpr int kHeadDim = decltype(head_dims_tag)::kQk, kHeadDimVo = decltype(head_dims_tag)::kVo;
    if constexpr (has_prefill_kv_storage(PrefillHeadDims(kHeadDim, kHeadDimVo), kv_storage_of<KVT, T>())) {
      launch_prefill_head_dim<T, KVT, kHeadDim, kHeadDimVo>(p, variant, format, q_tile, max_qo_len, stream);
    } else {
      fail_no_prefill_config(head_dims, q_tile, cuda_type_name<KVT>());  // the entry points check first
    }
  });
}

#define TESSERA_INSTANTIATE_LAUNCH_PREFILL(T, KVT)                                                                  \
  template void launch_prefill<T, KVT>(const AttentionParams<T, KVT>&, const ResolvedVariant&, KVFormatKind, \
                                       PrefillHeadDims, \
                                       int64_t, double, cudaStream_t);
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__half, __half)
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__nv_bfloat16, __nv_bfloat16)
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__half, __nv_fp8_e4m3)
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__half, __nv_fp8_e5m2)
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__nv_bfloat16, __nv_fp8_e4m3)
TESSERA_INSTANTIATE_LAUNCH_PREFILL(__nv_bfloat16, __nv_fp8_e5m2)
#undef TESSERA_INSTANTIATE_LAUNCH_PREFILL

}  // namespace detail

void single_decode(const TensorView& q, const TensorView& k, const TensorView& v, Layout kv_layout,
                   const TensorView& o, const TensorView& lse, const AttentionOptions& options, StreamHandle stream,
                   DecodeKernel kernel) {
  check_operand(q, "q", 2);
  check_dense_kv(q, k, v, kv_layout);
  const HeadConfig heads = check_heads(q.shape[0], k.shape[kv_layout == Layout::kNHD ? 1 : 0], q.shape[1]);
  check_size(k, "k", 2, heads.head_dim);
  check_size(v, "v", 2, heads.head_dim);
  check_kv_storage(k, "k", heads.head_dim, heads.num_kv_heads, options);
  check_operand(o, "o", 2);
  check_dtype(o, "o", {q.dtype});
  check_size(o, "o", 0, q.shape[0]);
  check_size(o, "o", 1, q.shape[1]);
  if (lse.data != nullptr) {
    check_ndim(lse, "lse", 1);
    check_dtype(lse, "lse", {DType::kF32});
    check_on_cuda(lse, "lse");
    check_size(lse, "lse", 0, q.shape[0]);
  }
  const ResolvedVariant variant = call_variant(options, q, heads, 1, false);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(k.dtype, T, "k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      dense_kv_params(p, k, v, kv_layout);
      p.qo_len_single = 1;
      run_decode(p, variant, KVFormatKind::kRagged, heads, kernel, stream);
    });
  });
}

void batch_decode_paged(const TensorView& q, const PagedKV& kv, const TensorView& o, const TensorView& lse,
                        const AttentionOptions& options, StreamHandle stream, DecodeKernel kernel) {
  check_operand(q, "q", 3);
  check_paged_kv(q, kv, q.shape[0]);
  const HeadConfig heads = check_heads(q.shape[1], kv.num_kv_heads(), q.shape[2]);
  check_size(kv.k, "paged_kv.k", 3, heads.head_dim);
  check_size(kv.v, "paged_kv.v", 3, heads.head_dim);
  check_kv_storage(kv.k, "paged_kv.k", heads.head_dim, heads.num_kv_heads, options);
  check_outputs(q, o, lse, q.shape[0]);
  const ResolvedVariant variant = call_variant(options, q, heads, q.shape[0], false);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(kv.k.dtype, T, "paged_kv.k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      paged_kv_params(p, kv);
      p.qo_len_single = 1;
      run_decode(p, variant, KVFormatKind::kPaged, heads, kernel, stream);
    });
  });
}

void batch_decode_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& kv_indptr,
                         const TensorView& o, const TensorView& lse, const AttentionOptions& options,
                         StreamHandle stream, DecodeKernel kernel) {
  check_operand(q, "q", 3);
  check_dense_kv(q, k, v, Layout::kNHD);
  check_index_array(kv_indptr, "kv_indptr", q, q.shape[0] + 1);
  validate_indptr(kv_indptr, "kv_indptr", k.shape[0]);
  const HeadConfig heads = check_heads(q.shape[1], k.shape[1], q.shape[2]);
  check_size(k, "k", 2, heads.head_dim);
  check_size(v, "v", 2, heads.head_dim);
  check_kv_storage(k, "k", heads.head_dim, heads.num_kv_heads, options);
  check_outputs(q, o, lse, q.shape[0]);
  const ResolvedVariant variant = call_variant(options, q, heads, q.shape[0], false);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(k.dtype, T, "k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      ragged_kv_params(p, k, v, kv_indptr);
      p.qo_len_single = 1;
      run_decode(p, variant, KVFormatKind::kRagged, heads, kernel, stream);
    });
  });
}

void single_prefill(const TensorView& q, const TensorView& k, const TensorView& v, Layout kv_layout,
                    const TensorView& o, const TensorView& lse, const AttentionOptions& options, StreamHandle stream) {
  check_prefill_query(q, 3);
  check_dense_kv(q, k, v, kv_layout);
  check_size(k, "k", 2, q.shape[2]);
  const PrefillHeadDims dims = check_prefill_heads(q.shape[1], k.shape[kv_layout == Layout::kNHD ? 1 : 0],
                                                   q.shape[2], v.shape[2], "v");
  const HeadConfig heads{q.shape[1], k.shape[kv_layout == Layout::kNHD ? 1 : 0], q.shape[2]};
  check_outputs(q, o, lse, q.shape[0], dims.vo);
  TESSERA_CHECK_ARG(q.shape[0] <= INT32_MAX) << "q.shape[0] = " << q.shape[0] << " exceeds 2^31 - 1";
  if (is_fp8(q.dtype)) {
    check_fp8_attention(q, k, "k", dims, call_variant(options, q, heads, 1, false), options, heads.num_kv_heads);
    run_fp8_attention(q, o, lse, heads, options, KVFormatKind::kRagged, q.shape[0], stream, [&](auto& p) {
      dense_kv_params(p, k, v, kv_layout);
      p.qo_len_single = static_cast<int32_t>(q.shape[0]);
    });
    return;
  }
  check_kv_storage(k, "k", heads.head_dim, heads.num_kv_heads, options);
  const ResolvedVariant variant = call_variant(options, q, heads, 1, false);
  check_split_head_dims_options(dims, k, "k", variant);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(k.dtype, T, "k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      dense_kv_params(p, k, v, kv_layout);
      p.qo_len_single = static_cast<int32_t>(q.shape[0]);
      detail::launch_prefill(p, variant, KVFormatKind::kRagged, dims, q.shape[0], static_cast<double>(q.shape[0]),
                             stream);
    });
  });
}

void batch_prefill_ragged(const TensorView& q, const TensorView& qo_indptr, int64_t max_qo_len, const TensorView& k,
                          const TensorView& v, const TensorView& kv_indptr, const TensorView& o,
                          const TensorView& lse, const AttentionOptions& options, StreamHandle stream) {
  raise_device_error(q.device.id);
  check_prefill_query(q, 3);
  check_dense_kv(q, k, v, Layout::kNHD);
  const int64_t batch = qo_indptr.ndim == 1 ? qo_indptr.shape[0] - 1 : -1;
  TESSERA_CHECK_ARG(batch >= 0) << "qo_indptr must be 1-D with batch_size + 1 entries, got " << qo_indptr.describe();
  const double avg_qo_len = check_qo_indptr(q, qo_indptr, batch, max_qo_len);
  check_index_array(kv_indptr, "kv_indptr", q, batch + 1);
  validate_indptr(kv_indptr, "kv_indptr", k.shape[0]);
  check_size(k, "k", 2, q.shape[2]);
  const PrefillHeadDims dims = check_prefill_heads(q.shape[1], k.shape[1], q.shape[2], v.shape[2], "v");
  const HeadConfig heads{q.shape[1], k.shape[1], q.shape[2]};
  check_outputs(q, o, lse, q.shape[0], dims.vo);
  if (is_fp8(q.dtype)) {
    check_fp8_attention(q, k, "k", dims, call_variant(options, q, heads, batch, false), options, heads.num_kv_heads);
    run_fp8_attention(q, o, lse, heads, options, KVFormatKind::kRagged, max_qo_len, stream, [&](auto& p) {
      ragged_kv_params(p, k, v, kv_indptr);
      p.qo_indptr = qo_indptr.data_as<const int32_t>();
      check_max_qo_len_on_device(qo_indptr, batch, max_qo_len, DeviceCheckSite::kBatchPrefillRaggedQoIndptr, stream);
    });
    return;
  }
  check_kv_storage(k, "k", heads.head_dim, heads.num_kv_heads, options);
  const ResolvedVariant variant = call_variant(options, q, heads, batch, false);
  check_split_head_dims_options(dims, k, "k", variant);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(k.dtype, T, "k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      ragged_kv_params(p, k, v, kv_indptr);
      p.qo_indptr = qo_indptr.data_as<const int32_t>();
      check_max_qo_len_on_device(qo_indptr, batch, max_qo_len, DeviceCheckSite::kBatchPrefillRaggedQoIndptr, stream);
      detail::launch_prefill(p, variant, KVFormatKind::kRagged, dims, max_qo_len, avg_qo_len, stream);
    });
  });
}

void batch_prefill_paged(const TensorView& q, const TensorView& qo_indptr, int64_t max_qo_len, const PagedKV& kv,
                         const TensorView& o, const TensorView& lse, const AttentionOptions& options,
                         StreamHandle stream) {
  raise_device_error(q.device.id);
  check_prefill_query(q, 3);
  const int64_t batch = qo_indptr.ndim == 1 ? qo_indptr.shape[0] - 1 : -1;
  TESSERA_CHECK_ARG(batch >= 0) << "qo_indptr must be 1-D with batch_size + 1 entries, got " << qo_indptr.describe();
  check_paged_kv(q, kv, batch);
  const double avg_qo_len = check_qo_indptr(q, qo_indptr, batch, max_qo_len);
  check_size(kv.k, "paged_kv.k", 3, q.shape[2]);
  const PrefillHeadDims dims = check_prefill_heads(q.shape[1], kv.num_kv_heads(), q.shape[2], kv.head_dim_vo(), "paged_kv.v");
  const HeadConfig heads{q.shape[1], kv.num_kv_heads(), q.shape[2]};
  check_outputs(q, o, lse, q.shape[0], dims.vo);
  if (is_fp8(q.dtype)) {
    check_fp8_attention(q, kv.k, "paged_kv.k", dims, call_variant(options, q, heads, batch, false), options,
                        heads.num_kv_heads);
    run_fp8_attention(q, o, lse, heads, options, KVFormatKind::kPaged, max_qo_len, stream, [&](auto& p) {
      paged_kv_params(p, kv);
      p.qo_indptr = qo_indptr.data_as<const int32_t>();
      check_max_qo_len_on_device(qo_indptr, batch, max_qo_len, DeviceCheckSite::kBatchPrefillPagedQoIndptr, stream);
    });
    return;
  }
  check_kv_storage(kv.k, "paged_kv.k", heads.head_dim, heads.num_kv_heads, options);
  const ResolvedVariant variant = call_variant(options, q, heads, batch, false);
  check_split_head_dims_options(dims, kv.k, "paged_kv.k", variant);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(kv.k.dtype, T, "paged_kv.k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      paged_kv_params(p, kv);
      p.qo_indptr = qo_indptr.data_as<const int32_t>();
      check_max_qo_len_on_device(qo_indptr, batch, max_qo_len, DeviceCheckSite::kBatchPrefillPagedQoIndptr, stream);
      detail::launch_prefill(p, variant, KVFormatKind::kPaged, dims, max_qo_len, avg_qo_len, stream);
    });
  });
}

void block_sparse_attention(const TensorView& q, const BlockSparse& kv, const TensorView& o, const TensorView& lse,
                            const AttentionOptions& options, StreamHandle stream) {
  check_operand(q, "q", 3);
  validate_block_sparse(kv, "block_sparse");
  check_kv_operand(kv.k, "block_sparse.k", 3, q);
  check_kv_operand(kv.v, "block_sparse.v", 3, q);
  check_dtype(kv.v, "block_sparse.v", {kv.k.dtype});
  check_same_device(q, "q", kv.k, "block_sparse.k");
  check_on_cuda(kv.indptr, "block_sparse.indptr");
  check_on_cuda(kv.indices, "block_sparse.indices");
  check_size(q, "q", 0, kv.num_rows);
  TESSERA_CHECK_ARG(kv.num_rows <= INT32_MAX && kv.num_cols() <= INT32_MAX && kv.indices.shape[0] <= INT32_MAX &&
                    kv.block_rows <= INT32_MAX && kv.block_cols <= INT32_MAX)
      << "block_sparse: num_rows = " << kv.num_rows << ", num_cols = " << kv.num_cols() << ", expected < 2^31";
  TESSERA_CHECK_ARG(kv.num_row_blocks() <= 65535)
      << "block_sparse: " << kv.num_row_blocks() << " block rows, expected <= 65535";
  const HeadConfig heads = check_heads(q.shape[1], kv.k.shape[1], q.shape[2]);
  check_size(kv.k, "block_sparse.k", 2, heads.head_dim);
  check_size(kv.v, "block_sparse.v", 2, heads.head_dim);
  check_kv_storage(kv.k, "block_sparse.k", heads.head_dim, heads.num_kv_heads, options);
  check_outputs(q, o, lse, q.shape[0]);
  const ResolvedVariant variant = call_variant(options, q, heads, kv.num_row_blocks(), true);
  TESSERA_DISPATCH_HALF_DTYPE(q.dtype, "q", T, [&] {
    TESSERA_DISPATCH_KV_DTYPE(kv.k.dtype, T, "block_sparse.k", KVT, [&] {
      AttentionParams<T, KVT> p = query_params<T, KVT>(q, o, lse, heads, options);
      block_sparse_kv_params(p, kv.k, kv.v, kv.indices.data_as<const int32_t>(), kv.indices.shape[0], kv.block_rows,
                             kv.block_cols, kv.num_rows, kv.num_cols());
      p.block_sparse.indptr = kv.indptr.data_as<const int32_t>();
      p.block_sparse.block_flags = kv.block_flags.defined() ? kv.block_flags.data_as<const uint8_t>() : nullptr;
      p.batch_size = static_cast<int32_t>(kv.num_row_blocks());
      detail::launch_prefill(p, variant, KVFormatKind::kBlockSparse, static_cast<int>(heads.head_dim), kv.block_rows,
                             static_cast<double>(kv.block_rows), stream);
    });
  });
}

}  // namespace tessera
