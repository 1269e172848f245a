// Host dispatch for the CUDA-core decode kernel (kernels/attention/decode.cuh): head dim and KV
// format pick a template instance; the grid is one CTA per (request, KV head, chunk of query heads).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/decode.cuh"
#include "src/attention_dispatch.h"
#include "src/check.h"
#include "src/cuda_utils.h"

namespace tessera {
namespace detail {
namespace {

template <typename Traits, kernels::KVFormatKind kFormat, typename T>
void launch_decode_config(const kernels::AttentionParams<T>& p, cudaStream_t stream) {
  auto kernel = kernels::batch_decode_kernel<Traits, kFormat, kernels::AttentionParams<T>>;
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  // Groups larger than one CTA's row groups are split over CTAs (grid z) so that each thread keeps
  // the state of a single query head.
  const int64_t head_chunks = (static_cast<int64_t>(p.group_size) + Traits::kGroups - 1) / Traits::kGroups;
  TESSERA_CHECK_ARG(p.num_kv_heads <= 65535 && head_chunks <= 65535)
      << "grid too large: " << p.batch_size << " requests x " << p.num_kv_heads << " KV heads x " << head_chunks
      << " head chunks (limits 2^31-1 x 65535 x 65535)";
  const dim3 grid(static_cast<unsigned>(p.batch_size), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(head_chunks));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  TESSERA_CHECK_LAUNCH();
}

template <typename T, int HEAD_DIM>
void launch_decode_head_dim(const kernels::AttentionParams<T>& p, kernels::KVFormatKind format, cudaStream_t stream) {
  using Traits = kernels::DecodeTraits<T, HEAD_DIM>;
  switch (format) {
    case kernels::KVFormatKind::kRagged:
      return launch_decode_config<Traits, kernels::KVFormatKind::kRagged>(p, stream);
    case kernels::KVFormatKind::kPaged:
      return launch_decode_config<Traits, kernels::KVFormatKind::kPaged>(p, stream);
    default:
      break;
  }
  TESSERA_FAIL(StatusCode::kUnsupported) << "decode (CUDA cores): KV format " << static_cast<int>(format)
                                         << " is not supported, expected ragged or paged";
}

}  // namespace

template <typename T>
void launch_decode_cuda_cores(const kernels::AttentionParams<T>& p, kernels::KVFormatKind format, int head_dim,
                              cudaStream_t stream) {
  // The caller (src/attention.cu) has validated the arguments; these guard the kernel's own
  // assumptions (query row b = request b, integer division by the group size).
  TESSERA_CHECK(p.qo_indptr == nullptr, StatusCode::kInternal) << "decode (CUDA cores): qo_indptr must be null";
  TESSERA_CHECK(p.group_size >= 1 && p.num_kv_heads >= 0 && p.batch_size >= 0, StatusCode::kInternal)
      << "decode (CUDA cores): group_size = " << p.group_size << ", num_kv_heads = " << p.num_kv_heads
      << ", batch_size = " << p.batch_size;
  switch (head_dim) {
    case 64:
    case 128:
    case 256:
      break;
    default:
      TESSERA_FAIL(StatusCode::kUnsupported) << "decode (CUDA cores): head_dim = " << head_dim
                                             << " is not supported, expected 64, 128 or 256";
  }
  if (p.batch_size == 0 || p.num_kv_heads == 0) return;
  switch (head_dim) {
    case 64:
      return launch_decode_head_dim<T, 64>(p, format, stream);
    case 128:
      return launch_decode_head_dim<T, 128>(p, format, stream);
    default:
      return launch_decode_head_dim<T, 256>(p, format, stream);
  }
}

template void launch_decode_cuda_cores<__half>(const kernels::AttentionParams<__half>&, kernels::KVFormatKind, int,
                                               cudaStream_t);
template void launch_decode_cuda_cores<__nv_bfloat16>(const kernels::AttentionParams<__nv_bfloat16>&,
                                                      kernels::KVFormatKind, int, cudaStream_t);

}  // namespace detail
}  // namespace tessera
