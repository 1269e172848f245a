// NVRTC front end of the JIT (docs/design.md §7): one generated CUDA translation unit -> one CUBIN for
// one architecture. Host code only; needs no GPU (NVRTC runs on the CPU).
//
//   GeneratedSource src = generate_source("#include \"kernels/attention/prefill.cuh\"\n",
//                                         user_variant_text, "<explicit instantiation or nothing>\n");
//   CompileResult r = compile_to_cubin({"my_variant prefill", src, "90a",
//                                       {"&tessera::kernels::attention_prefill_kernel<...>"}});
//   r.cubin, r.lowered_name("&tessera::kernels::attention_prefill_kernel<...>")
//
// The kernel headers (kernels/**/*.cuh) are compiled into libtessera (embedded_headers.h) and
// given to NVRTC as in-memory headers, so no source tree is needed at run time. The toolkit's own
// headers (cuda_fp16.h, cuda_bf16.h, <cuda/std/...>) come from the CUDA include directory found at
// configure time, or from $TESSERA_CUDA_INCLUDE_DIR.
//
// Options (nvrtc_options): --gpu-architecture=sm_<arch> (a real architecture, so NVRTC emits SASS
// and nvrtcGetCUBIN works), -std=c++17, -default-device (unannotated functions are __device__),
// -lineinfo (as the nvcc build: profilers map SASS to source lines), the include paths, the
// request's extra options and the words of $TESSERA_NVRTC_OPTIONS (experiments).
// --use_fast_math is deliberately NOT set: the ahead-of-time build does not use it either, so a
// JIT-compiled kernel rounds, divides and handles denormals exactly as its nvcc twin; the kernels
// already call the fast intrinsics (ex2.approx) where they want them. --expt-relaxed-constexpr,
// which the nvcc build passes, does not exist in NVRTC (13.0 rejects it): kernel headers must not
// rely on calling host constexpr functions from device code.
//
// NVRTC's output is not byte-for-byte reproducible: internal-linkage symbols (namespace-scope
// constexpr variables such as tessera::kernels::kWarpSize) get names with a module id made from
// the time and process id. Caching is keyed on the inputs (kernel_cache.h), never on the output.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {
namespace jit {

/// NVRTC's name for the generated translation unit; its lines show up as "generated(N)" in logs.
inline constexpr const char* kGeneratedFileName = "generated";
/// The file name the user's snippet carries in NVRTC's log (via #line).
inline constexpr const char* kUserSnippetFileName = "user_snippet";

/// A translation unit ready for NVRTC.
struct GeneratedSource {
  std::string text;
  /// Whether `text` contains user code: a compile error is then the user's (kInvalidArgument),
  /// otherwise a Tessera bug (kInternal).
  bool has_user_snippet = false;
};

/// `prologue`, then the user's snippet under `#line 1 "user_snippet"` (so NVRTC reports the
/// snippet's own line numbers), then `#line N "generated"` (N = the physical line number of the
/// next line, so the rest keeps its real numbering) and `epilogue`. Missing final newlines are
/// added. An empty snippet gives prologue + epilogue with has_user_snippet = false.
GeneratedSource generate_source(std::string_view prologue, std::string_view user_snippet, std::string_view epilogue);

/// A translation unit with no user code.
inline GeneratedSource generated_only(std::string text) { return GeneratedSource{std::move(text), false}; }

struct CompileRequest {
  std::string name;  ///< human-readable, for messages and the first-compile log line
  GeneratedSource source;
  std::string arch;  ///< "80", "86", "89", "90a", ...: compiles for sm_<arch>
  /// C++ expressions naming the kernels to keep, e.g. "&tessera::kernels::foo<int, 4>"; their
  /// templates are instantiated and their lowered (mangled) names returned.
  std::vector<std::string> name_expressions;
  std::vector<std::string> extra_options;  ///< appended to nvrtc_options()
};

struct LoweredName {
  std::string expression;  ///< as given in CompileRequest::name_expressions
  std::string lowered;     ///< the symbol in the cubin, for cuModuleGetFunction
};

struct CompileResult {
  std::vector<char> cubin;
  std::vector<LoweredName> lowered_names;  ///< in the order of the request's name_expressions
  std::string log;                         ///< NVRTC's log (warnings), usually empty
  double compile_ms = 0;                   ///< wall time of nvrtcCompileProgram + nvrtcGetCUBIN
};

/// Compiles `request` with NVRTC. Errors are tessera::Error:
/// - kInvalidArgument: malformed request (bad arch string, no name expressions), or a compile
///   error in a source with a user snippet;
/// - kUnsupported: an architecture this NVRTC cannot target;
/// - kInternal: a compile error in purely generated code (a Tessera bug);
/// - kCudaError: NVRTC itself failed (out of memory, builtins library missing, ...).
/// A compile error's message lists the errors as "user_snippet line 3: error: ..." (file, line,
/// text for every error line of the log), followed by NVRTC's full raw log.
CompileResult compile_to_cubin(const CompileRequest& request);

/// The options compile_to_cubin passes for `arch`, in order, followed by `extra`.
std::vector<std::string> nvrtc_options(const std::string& arch, const std::vector<std::string>& extra = {});

/// Include directories for the toolkit headers: the directory from $TESSERA_CUDA_INCLUDE_DIR or
/// the configure-time default, preceded by its cccl/ subdirectory where one exists (CUDA 13 keeps
/// libcu++ there).
std::vector<std::string> cuda_include_dirs();

/// "13.0": nvrtcVersion() of the NVRTC library actually loaded.
std::string nvrtc_version_string();

/// Checks an architecture string: 2-3 digits plus an optional 'a' or 'f' suffix ("80", "90a",
/// "100a"); throws kInvalidArgument otherwise.
void check_arch(const std::string& arch);

/// Rewrites NVRTC diagnostics "file(12): error: text" as "file line 12: error: text"; only the
/// error lines of `log`, one per line. Exposed for tests.
std::string summarize_nvrtc_errors(const std::string& log);

}  // namespace jit
}  // namespace tessera
