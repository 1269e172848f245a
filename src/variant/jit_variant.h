// JIT compilation of variant kernels (docs/design.md §7): a ResolvedVariant plus a kernel template and
// its other template arguments give one generated translation unit, compiled by NVRTC for the
// current GPU through the kernel cache (memory, disk) and loaded with the driver API.
//
// The generated unit is:
//   #include "<kernel header>"
//   namespace tessera_user {
//   struct Params { alignas(8) <type> <name>; ... };   // the VariantSpec's params, one 8-byte slot each
//   #line 1 "user_snippet"
//   <the user's source>
//   #line N "generated"
//   <per hook: a detector (is it defined?) and a caller that falls back to the identity>
//   }
//   struct TesseraJitVariant : tessera::kernels::BuiltinVariant<features[, false with user hooks]> {
//     <each hook: the built-in one, then the user's>
//   };
// and the kernel is `&<kernel template><<before>, TesseraJitVariant, <after>>`.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "src/variant/variant_config.h"

namespace tessera {
namespace detail {

/// The start of the user's namespace in a generated unit: the libc++ headers the generated code
/// uses, `namespace tessera_user {` (left open), the kernels' integer types, and
/// `struct Params { alignas(8) <type> <name>; ... };` with one 8-byte slot per parameter in
/// declaration order (the layout of kernels::VariantParams::extra). The parameters must have been
/// validated (fill_param_slots): a tensor of another dtype is an internal error here.
std::string user_params_prologue(const std::vector<VariantParam>& params);

/// One kernel instantiation for a variant.
struct VariantKernelRequest {
  std::string header;         ///< kernel header to include, e.g. "kernels/attention/prefill.cuh"
  std::string kernel;         ///< template name, e.g. "tessera::kernels::attention_prefill_kernel"
  std::string args_before;    ///< template arguments before the variant
  std::string args_after;     ///< template arguments after the variant
  int dynamic_smem_bytes = 0; ///< opted in on the function once loaded
  std::string description;    ///< for the log line and errors, e.g. "prefill D128 Q128 ragged bf16"
  /// The kernel writes split KV chunks whose states a contraction merges by their log-sum-exp (the
  /// runtime's persistent kernels): a user variant with an output_transform, which must see the
  /// whole row's output, fails to compile with a message that names the hook.
  bool merged_by_lse = false;
};

/// The generated translation unit (without the kernel header's contents) and the name expression
/// of the requested kernel.
struct VariantSource {
  std::string text;
  std::string name_expression;
  bool has_user_snippet = false;
  size_t user_line_offset = 0;  ///< line of the unit where the snippet starts (for messages)
};
VariantSource variant_source(const ResolvedVariant& variant, const VariantKernelRequest& request);

/// The compiled and loaded kernel for the current device (compiled on first use, then from the
/// in-process map). Compile errors in the user's snippet are kInvalidArgument with NVRTC's log.
CUfunction variant_kernel(const ResolvedVariant& variant, const VariantKernelRequest& request);

/// Launches `fn` (from variant_kernel) on a 1-D block; programmatic_dependent: see jit::launch.
void launch_variant_kernel(CUfunction fn, const VariantKernelRequest& request, unsigned grid_x, unsigned grid_y,
                           unsigned grid_z, unsigned threads, void** args, cudaStream_t stream,
                           bool programmatic_dependent = false);

/// "__half" / "__nv_bfloat16" / "__nv_fp8_e4m3" / "__nv_fp8_e5m2" for the kernels' element types
/// (defined for those only).
template <typename T>
const char* cuda_type_name();
template <>
const char* cuda_type_name<__half>();
template <>
const char* cuda_type_name<__nv_bfloat16>();
template <>
const char* cuda_type_name<__nv_fp8_e4m3>();
template <>
const char* cuda_type_name<__nv_fp8_e5m2>();

/// The kernels' parameter type for q/o element type T and K/V element type KVT, as
/// template-argument text: "tessera::kernels::AttentionParams<T, KVT, T, tessera::kernels::int32_t>"
/// (int32 index arrays), the type the host's kernels::AttentionParams<T, KVT> is. A JIT-compiled
/// kernel receives that struct by value, so the text must name exactly the host's type.
template <typename T, typename KVT = T>
std::string params_type_name() {
  const std::string t = cuda_type_name<T>();
  return "tessera::kernels::AttentionParams<" + t + ", " + cuda_type_name<KVT>() + ", " + t +
         ", tessera::kernels::int32_t>";
}

}  // namespace detail
}  // namespace tessera
