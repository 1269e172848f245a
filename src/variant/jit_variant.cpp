#include "src/variant/jit_variant.h"

#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "src/check.h"
#include "src/jit/arch.h"
#include "src/jit/kernel_cache.h"
#include "src/jit/module_loader.h"
#include "src/jit/nvrtc_compiler.h"

namespace tessera {
namespace detail {

template <>
const char* cuda_type_name<__half>() {
  return "__half";
}
template <>
const char* cuda_type_name<__nv_bfloat16>() {
  return "__nv_bfloat16";
}
template <>
const char* cuda_type_name<__nv_fp8_e4m3>() {
  return "__nv_fp8_e4m3";
}
template <>
const char* cuda_type_name<__nv_fp8_e5m2>() {
  return "__nv_fp8_e5m2";
}

namespace {

/// One user hook: its signature in the user's source (after `const Params& params`), the
/// arguments a call passes, what a missing hook returns, and the trait the kernels read.
struct HookDesc {
  const char* name;
  const char* ret;
  const char* params;    // declaration of the arguments after params
  const char* args;      // the same names, as a call's arguments
  const char* declvals;  // placeholder arguments for the detector
  const char* fallback;  // expression a missing hook returns
  const char* trait;     // the kernels' flag
};

// The one list of user hooks (tessera/variant.h documents the signatures).
constexpr HookDesc kHooks[] = {
    {"query_transform", "float2",
     "float2 value, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head, int dim",
     "value, batch, qo_idx, kv_idx, qo_head, kv_head, dim", "float2{}, 0, 0, 0, 0, 0, 0", "value",
     "kHasQueryTransform"},
    {"key_transform", "float2", "float2 value, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head, int dim",
     "value, batch, qo_idx, kv_idx, qo_head, kv_head, dim", "float2{}, 0, 0, 0, 0, 0, 0", "value",
     "kHasKeyTransform"},
    {"value_transform", "float2",
     "float2 value, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head, int dim",
     "value, batch, qo_idx, kv_idx, qo_head, kv_head, dim", "float2{}, 0, 0, 0, 0, 0, 0", "value",
     "kHasValueTransform"},
    {"logits_transform", "float", "float logits, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head",
     "logits, batch, qo_idx, kv_idx, qo_head, kv_head", "0.f, 0, 0, 0, 0, 0", "logits", "kHasLogitsTransform"},
    {"logits_mask", "bool", "int batch, int qo_idx, int kv_idx, int qo_head, int kv_head",
     "batch, qo_idx, kv_idx, qo_head, kv_head", "0, 0, 0, 0, 0", "true", "kHasMask"},
    {"output_transform", "float", "float value, int batch, int qo_idx, int qo_head, int dim",
     "value, batch, qo_idx, qo_head, dim", "0.f, 0, 0, 0, 0", "value", "kHasOutputTransform"},
};

const char* param_type(const VariantParam& p) {
  switch (p.kind) {
    case VariantParam::Kind::kF32: return "float";
    case VariantParam::Kind::kI32: return "int32_t";
    case VariantParam::Kind::kI64: return "int64_t";
    case VariantParam::Kind::kTensor:
      switch (p.tensor.dtype) {
        case DType::kF32: return "const float*";
        case DType::kI32: return "const int32_t*";
        case DType::kU8: return "const uint8_t*";
        case DType::kF16: return "const __half*";
        case DType::kBF16: return "const __nv_bfloat16*";
        default: break;
      }
      break;
  }
  TESSERA_FAIL(StatusCode::kInternal) << "variant param " << p.name << " has no generated type";
}

std::string user_epilogue() {
  std::ostringstream s;
  // A hook may also take the request's lengths as a last argument (`const Request& request`): the
  // detectors and callers try that form first (tag Pri2), then the plain one (Pri1), then the
  // fallback (Pri0).
  s << "struct Missing {};\n"
    << "struct Pri0 {};\nstruct Pri1 : Pri0 {};\nstruct Pri2 : Pri1 {};\n";
  for (const HookDesc& h : kHooks) {
    s << "template <class P> auto detect_" << h.name << "(const P& params, Pri2) -> decltype((void)" << h.name
      << "(params, " << h.declvals << ", tessera_declval<const Request&>()), true);\n"
      << "template <class P> auto detect_" << h.name << "(const P& params, Pri1) -> decltype((void)" << h.name
      << "(params, " << h.declvals << "), true);\n"
      << "template <class P> Missing detect_" << h.name << "(const P&, Pri0);\n"
      << "constexpr bool k_has_" << h.name << " = !TesseraSameType<decltype(detect_" << h.name
      << "(tessera_declval<const Params&>(), Pri2{})), Missing>::value;\n"
      << "template <class P> __forceinline__ auto call_" << h.name << "(const P& params, " << h.params
      << ", const Request& request, Pri2) -> decltype(" << h.name << "(params, " << h.args << ", request)) {\n"
      << "  return " << h.name << "(params, " << h.args << ", request);\n}\n"
      << "template <class P> __forceinline__ auto call_" << h.name << "(const P& params, " << h.params
      << ", const Request&, Pri1) -> decltype(" << h.name << "(params, " << h.args << ")) {\n"
      << "  return " << h.name << "(params, " << h.args << ");\n}\n"
      << "template <class P> __forceinline__ " << h.ret << " call_" << h.name << "(const P& params, " << h.params
      << ", const Request&, Pri0) {\n  return " << h.fallback << ";\n}\n";
  }
  s << "}  // namespace tessera_user\n";
  return s.str();
}

std::string adapter(const ResolvedVariant& v, const VariantKernelRequest& request) {
  std::ostringstream s;
  // A user's logits hook chains after the built-in transform and takes its result in natural
  // units: no folded scales. Without one (a mask, operand transforms) the built-in soft-cap and
  // ALiBi keep their folded forms, whose bounded logits and split key bias the kernels exploit
  // (FlexAttention's soft-cap and ALiBi mods over a mask reach them so). Whether the source
  // defines the hook is known when it compiles: the detector decides.
  const std::string base = "tessera::kernels::BuiltinVariant<" + std::to_string(v.features) + "u" +
                           (v.user != nullptr ? ", !tessera_user::k_has_logits_transform>" : ">");
  s << "struct TesseraJitVariant : " << base << " {\n";
  if (v.user == nullptr) {
    s << "};\n";
    return s.str();
  }
  s << "  using Base = " << base << ";\n"
    << "  using VP = tessera::kernels::VariantParams;\n"
    << "  using RE = tessera::kernels::RequestExtent;\n"
    << "  static constexpr bool kUseSoftmax = Base::kUseSoftmax && " << (v.user->use_softmax ? "true" : "false")
    << ";\n"
    << "  static constexpr bool kReadsPaddingRow = true;  // Request::padding_row\n";
  for (const HookDesc& h : kHooks) {
    s << "  static constexpr bool " << h.trait << " = Base::" << h.trait << " || tessera_user::k_has_" << h.name
      << ";\n";
  }
  if (request.merged_by_lse) {
    s << "  static_assert(!tessera_user::k_has_output_transform, \"variant '" << v.user->name
      << "' defines output_transform, which the plan/run runtime cannot apply: it merges split KV chunks by "
         "their log-sum-exp before the row's output is whole (use the one-shot entry points)\");\n";
  }
  s << "  static __device__ __forceinline__ const tessera_user::Params& user(const VP& vp) {\n"
    << "    return *reinterpret_cast<const tessera_user::Params*>(vp.extra);\n  }\n"
    << "  static __device__ __forceinline__ tessera_user::Request request(const RE& e) {\n"
    << "    return tessera_user::Request{e.qo_len, e.kv_len, e.padding_row};\n  }\n";
  for (const char* name : {"query_transform", "key_transform", "value_transform"}) {
    s << "  static __device__ __forceinline__ float2 " << name
      << "(const VP& vp, const RE& e, float2 x, int batch, int qo_idx, int kv_idx, int qo_head, int kv_head, int dim, "
         "int head_dim) {\n"
      << "    x = Base::" << name << "(vp, e, x, batch, qo_idx, kv_idx, qo_head, kv_head, dim, head_dim);\n"
      << "    return tessera_user::call_" << name
      << "(user(vp), x, batch, qo_idx, kv_idx, qo_head, kv_head, dim, request(e), tessera_user::Pri2{});\n"
      << "  }\n";
  }
  s << "  static __device__ __forceinline__ float logits_transform(const VP& vp, const RE& e, float x, int batch, "
       "int qo_idx, int kv_idx, int qo_head, int kv_head) {\n"
    << "    x = Base::logits_transform(vp, e, x, batch, qo_idx, kv_idx, qo_head, kv_head);\n"
    << "    return tessera_user::call_logits_transform(user(vp), x, batch, qo_idx, kv_idx, qo_head, kv_head, "
       "request(e),\n"
    << "                                               tessera_user::Pri2{});\n"
    << "  }\n"
    << "  static __device__ __forceinline__ bool logits_mask(const VP& vp, const RE& e, int batch, int qo_idx, "
       "int kv_idx, int qo_head, int kv_head) {\n"
    << "    return Base::logits_mask(vp, e, batch, qo_idx, kv_idx, qo_head, kv_head) &&\n"
    << "           tessera_user::call_logits_mask(user(vp), batch, qo_idx, kv_idx, qo_head, kv_head, request(e),\n"
    << "                                          tessera_user::Pri2{});\n"
    << "  }\n"
    << "  static __device__ __forceinline__ float output_transform(const VP& vp, const RE& e, float value, int batch, "
       "int qo_idx, int qo_head, int dim) {\n"
    << "    value = Base::output_transform(vp, e, value, batch, qo_idx, qo_head, dim);\n"
    << "    return tessera_user::call_output_transform(user(vp), value, batch, qo_idx, qo_head, dim, request(e),\n"
    << "                                               tessera_user::Pri2{});\n"
    << "  }\n"
    << "  static __device__ __forceinline__ bool tile_unmasked(const VP& vp, int q_first, int q_last, int kv_begin, "
       "int kv_last) {\n"
    << "    return !tessera_user::k_has_logits_mask && Base::tile_unmasked(vp, q_first, q_last, kv_begin, kv_last);\n"
    << "  }\n"
    << "};\n";
  return s.str();
}

struct FunctionMap {
  std::mutex mutex;
  std::map<std::string, CUfunction> functions;  // (device, unit, name expression) -> loaded kernel
};

FunctionMap& function_map() {
  static FunctionMap* m = new FunctionMap;  // never destroyed: kernels may launch during exit
  return *m;
}

}  // namespace

std::string user_params_prologue(const std::vector<VariantParam>& params) {
  std::ostringstream s;
  // The hook detectors (user_epilogue) need only is_same and declval, written out here:
  // <cuda/std/type_traits> alone costs NVRTC ~0.9 s per compile, a third or more of a variant's.
  s << "namespace tessera_user {\n"
    << "template <class A, class B> struct TesseraSameType { static constexpr bool value = false; };\n"
    << "template <class A> struct TesseraSameType<A, A> { static constexpr bool value = true; };\n"
    << "template <class T> T&& tessera_declval() noexcept;\n"
    << "using tessera::kernels::int32_t;\nusing tessera::kernels::int64_t;\nusing tessera::kernels::uint8_t;\n"
    << "using tessera::kernels::uint32_t;\nusing tessera::kernels::uint64_t;\n"
    << "// The request a hook's call is for (its optional last argument, tessera/variant.h).\n"
    << "struct Request {\n  int qo_len;\n  int kv_len;\n  bool padding_row;\n};\n"
    << "// The variant's extra parameters, one 8-byte slot each (VariantParams::extra).\n"
    << "struct Params {\n";
  for (const VariantParam& p : params) s << "  alignas(8) " << param_type(p) << " " << p.name << ";\n";
  if (params.empty()) s << "  char unused_;\n";
  s << "};\n";
  return s.str();
}

VariantSource variant_source(const ResolvedVariant& v, const VariantKernelRequest& request) {
  VariantSource out;
  const std::string include = "#include \"" + request.header + "\"\n";
  const std::string tail = adapter(v, request);
  jit::GeneratedSource gen;
  if (v.user != nullptr) {
    gen = jit::generate_source(include + user_params_prologue(v.user->params), v.user->source, user_epilogue() + tail);
  } else {
    gen = jit::generated_only(include + tail);
  }
  out.text = std::move(gen.text);
  out.has_user_snippet = gen.has_user_snippet;
  out.name_expression =
      "&" + request.kernel + "<" + request.args_before + ", TesseraJitVariant, " + request.args_after + ">";
  return out;
}

CUfunction variant_kernel(const ResolvedVariant& v, const VariantKernelRequest& request) {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device)) << " (JIT kernel for " << request.description << ")";
  VariantSource src = variant_source(v, request);
  const std::string key = std::to_string(device) + "\n" + src.name_expression + "\n" + src.text;
  FunctionMap& map = function_map();
  {
    std::lock_guard<std::mutex> lock(map.mutex);
    auto it = map.functions.find(key);
    if (it != map.functions.end()) return it->second;
  }
  jit::CompileRequest creq;
  creq.name = "variant '" + (v.user != nullptr ? v.user->name : std::string("builtin")) + "' (features " +
              std::to_string(v.features) + ") " + request.description;
  creq.source = jit::GeneratedSource{src.text, src.has_user_snippet};
  creq.arch = jit::current_device_arch();
  creq.name_expressions = {src.name_expression};
  auto compiled = jit::default_kernel_cache().get_or_compile(creq);
  CUfunction fn = jit::get_function(*compiled, src.name_expression);
  if (request.dynamic_smem_bytes > 48 * 1024) {
    jit::set_max_dynamic_shared_memory(fn, request.dynamic_smem_bytes, creq.name);
  }
  std::lock_guard<std::mutex> lock(map.mutex);
  map.functions.emplace(key, fn);
  return fn;
}

void launch_variant_kernel(CUfunction fn, const VariantKernelRequest& request, unsigned grid_x, unsigned grid_y,
                           unsigned grid_z, unsigned threads, void** args, cudaStream_t stream,
                           bool programmatic_dependent) {
  jit::launch(fn, grid_x, grid_y, grid_z, threads, request.dynamic_smem_bytes, reinterpret_cast<CUstream>(stream),
              args, request.description, programmatic_dependent);
}

}  // namespace detail
}  // namespace tessera
