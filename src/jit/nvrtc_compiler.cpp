#include "src/jit/nvrtc_compiler.h"

#include <nvrtc.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/check.h"
#include "src/jit/embedded_headers.h"

#ifndef TESSERA_JIT_CUDA_INCLUDE_DIR
#error "TESSERA_JIT_CUDA_INCLUDE_DIR must be defined by cmake/TesseraJit.cmake"
#endif

namespace tessera {
namespace jit {

const EmbeddedHeader* find_embedded_header(const char* name) {
  for (std::size_t i = 0; i < kNumEmbeddedHeaders; ++i) {
    if (std::strcmp(kEmbeddedHeaders[i].name, name) == 0) return &kEmbeddedHeaders[i];
  }
  return nullptr;
}

namespace {

int count_lines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

void append_with_newline(std::string& out, std::string_view s) {
  out.append(s);
  if (!s.empty() && s.back() != '\n') out.push_back('\n');
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// Destroys the program on every path out of compile_to_cubin.
struct ProgramGuard {
  nvrtcProgram program = nullptr;
  ~ProgramGuard() {
    if (program != nullptr) nvrtcDestroyProgram(&program);
  }
};

std::string program_log(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  log.resize(std::strlen(log.c_str()));
  return log;
}

/// An NVRTC API call that failed for a reason other than the program's source.
[[noreturn]] void fail_nvrtc(nvrtcResult result, const char* call, const CompileRequest& request,
                             const std::string& log) {
  const StatusCode code = result == NVRTC_ERROR_INVALID_OPTION || result == NVRTC_ERROR_INVALID_INPUT ||
                                  result == NVRTC_ERROR_INVALID_PROGRAM
                              ? StatusCode::kInternal
                              : StatusCode::kCudaError;
  std::string message = str_cat("JIT compile of '", request.name, "' for sm_", request.arch, ": ", call,
                                " failed: ", nvrtcGetErrorString(result));
  if (!log.empty()) message += str_cat("\n--- NVRTC log ---\n", log);
  throw_error(code, message);
}

}  // namespace

GeneratedSource generate_source(std::string_view prologue, std::string_view user_snippet, std::string_view epilogue) {
  GeneratedSource out;
  append_with_newline(out.text, prologue);
  if (!user_snippet.empty()) {
    out.has_user_snippet = true;
    out.text += str_cat("#line 1 \"", kUserSnippetFileName, "\"\n");
    append_with_newline(out.text, user_snippet);
    // The next physical line is line count + 2 (1-based, after this directive's own line).
    out.text += str_cat("#line ", count_lines(out.text) + 2, " \"", kGeneratedFileName, "\"\n");
  }
  append_with_newline(out.text, epilogue);
  return out;
}

void check_arch(const std::string& arch) {
  size_t digits = 0;
  while (digits < arch.size() && arch[digits] >= '0' && arch[digits] <= '9') ++digits;
  const bool ok = (digits == 2 || digits == 3) &&
                  (arch.size() == digits || (arch.size() == digits + 1 && (arch.back() == 'a' || arch.back() == 'f')));
  TESSERA_CHECK_ARG(ok) << "JIT architecture '" << arch
                        << "' is not valid, expected 2-3 digits and an optional 'a'/'f' suffix, e.g. \"80\" or \"90a\"";
}

std::vector<std::string> cuda_include_dirs() {
  const char* env = std::getenv("TESSERA_CUDA_INCLUDE_DIR");
  const std::string dir = env != nullptr && env[0] != '\0' ? env : TESSERA_JIT_CUDA_INCLUDE_DIR;
  std::vector<std::string> dirs;
  if (is_directory(dir + "/cccl")) dirs.push_back(dir + "/cccl");
  dirs.push_back(dir);
  return dirs;
}

std::vector<std::string> nvrtc_options(const std::string& arch, const std::vector<std::string>& extra) {
  std::vector<std::string> options = {"--gpu-architecture=sm_" + arch, "-std=c++17", "-default-device", "-lineinfo"};
  for (const std::string& dir : cuda_include_dirs()) options.push_back("--include-path=" + dir);
  options.insert(options.end(), extra.begin(), extra.end());
  // Experiments with NVRTC's own options (compile time against kernel speed, e.g.
  // --Ofast-compile=min) without a rebuild; the cache key includes every option, so such kernels
  // never mix with the default ones.
  if (const char* env = std::getenv("TESSERA_NVRTC_OPTIONS"); env != nullptr) {
    std::istringstream words(env);
    for (std::string word; words >> word;) options.push_back(word);
  }
  return options;
}

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  const nvrtcResult r = nvrtcVersion(&major, &minor);
  TESSERA_CHECK(r == NVRTC_SUCCESS, StatusCode::kCudaError) << "nvrtcVersion failed: " << nvrtcGetErrorString(r);
  return str_cat(major, ".", minor);
}

std::string summarize_nvrtc_errors(const std::string& log) {
  std::string out;
  size_t begin = 0;
  while (begin < log.size()) {
    size_t end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(begin, end - begin);
    begin = end + 1;
    // "file(12): error: text" / "file(12): catastrophic error: text" / "nvrtc: error: text"
    const size_t close = line.find("): ");
    const size_t open = close == std::string::npos ? std::string::npos : line.rfind('(', close);
    if (open != std::string::npos && open > 0 && close > open + 1 &&
        std::all_of(line.begin() + open + 1, line.begin() + close, [](char c) { return c >= '0' && c <= '9'; })) {
      const std::string text = line.substr(close + 3);
      if (text.rfind("error", 0) == 0 || text.rfind("catastrophic error", 0) == 0) {
        out += str_cat(line.substr(0, open), " line ", line.substr(open + 1, close - open - 1), ": ", text, "\n");
      }
    } else if (line.rfind("nvrtc: error", 0) == 0) {
      out += line + "\n";
    }
  }
  return out;
}

CompileResult compile_to_cubin(const CompileRequest& request) {
  check_arch(request.arch);
  TESSERA_CHECK_ARG(!request.name_expressions.empty())
      << "JIT compile of '" << request.name << "': no name expressions, expected at least one kernel to keep";

  // An architecture this NVRTC cannot target gets a clear message instead of an option error.
  {
    const int wanted = std::atoi(request.arch.c_str());
    int count = 0;
    if (nvrtcGetNumSupportedArchs(&count) == NVRTC_SUCCESS && count > 0) {
      std::vector<int> archs(static_cast<size_t>(count));
      if (nvrtcGetSupportedArchs(archs.data()) == NVRTC_SUCCESS &&
          std::find(archs.begin(), archs.end(), wanted) == archs.end()) {
        std::string list;
        for (int a : archs) list += str_cat(list.empty() ? "" : ", ", a);
        TESSERA_FAIL(StatusCode::kUnsupported) << "JIT architecture sm_" << request.arch
                                               << " is not supported by NVRTC " << nvrtc_version_string()
                                               << " (supported: " << list << ")";
      }
    }
  }
  {
    const std::vector<std::string> dirs = cuda_include_dirs();
    TESSERA_CHECK_ARG(is_file(dirs.back() + "/cuda_fp16.h"))
        << "CUDA include directory '" << dirs.back()
        << "' has no cuda_fp16.h: set TESSERA_CUDA_INCLUDE_DIR to the CUDA toolkit's include directory";
  }

  std::vector<const char*> header_texts, header_names;
  header_texts.reserve(kNumEmbeddedHeaders);
  header_names.reserve(kNumEmbeddedHeaders);
  for (std::size_t i = 0; i < kNumEmbeddedHeaders; ++i) {
    header_texts.push_back(kEmbeddedHeaders[i].text());
    header_names.push_back(kEmbeddedHeaders[i].name);
  }

  ProgramGuard guard;
  nvrtcResult r = nvrtcCreateProgram(&guard.program, request.source.text.c_str(), kGeneratedFileName,
                                     static_cast<int>(header_texts.size()), header_texts.data(), header_names.data());
  if (r != NVRTC_SUCCESS) fail_nvrtc(r, "nvrtcCreateProgram", request, {});
  for (const std::string& expr : request.name_expressions) {
    r = nvrtcAddNameExpression(guard.program, expr.c_str());
    if (r != NVRTC_SUCCESS) fail_nvrtc(r, "nvrtcAddNameExpression", request, {});
  }

  const std::vector<std::string> options = nvrtc_options(request.arch, request.extra_options);
  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());

  const auto start = std::chrono::steady_clock::now();
  r = nvrtcCompileProgram(guard.program, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  CompileResult result;
  result.log = program_log(guard.program);
  if (r == NVRTC_ERROR_COMPILATION) {
    const StatusCode code = request.source.has_user_snippet ? StatusCode::kInvalidArgument : StatusCode::kInternal;
    std::string message = str_cat("JIT compile of '", request.name, "' for sm_", request.arch, " failed:\n");
    message += summarize_nvrtc_errors(result.log);
    message += str_cat("--- NVRTC log ---\n", result.log);
    throw_error(code, message);
  }
  if (r != NVRTC_SUCCESS) fail_nvrtc(r, "nvrtcCompileProgram", request, result.log);

  size_t cubin_size = 0;
  r = nvrtcGetCUBINSize(guard.program, &cubin_size);
  if (r != NVRTC_SUCCESS) fail_nvrtc(r, "nvrtcGetCUBINSize", request, result.log);
  TESSERA_CHECK(cubin_size > 0, StatusCode::kInternal)
      << "JIT compile of '" << request.name << "' for sm_" << request.arch << " produced no CUBIN";
  result.cubin.resize(cubin_size);
  r = nvrtcGetCUBIN(guard.program, result.cubin.data());
  if (r != NVRTC_SUCCESS) fail_nvrtc(r, "nvrtcGetCUBIN", request, result.log);
  result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  for (const std::string& expr : request.name_expressions) {
    const char* lowered = nullptr;
    r = nvrtcGetLoweredName(guard.program, expr.c_str(), &lowered);
    if (r != NVRTC_SUCCESS || lowered == nullptr) {
      const StatusCode code = request.source.has_user_snippet ? StatusCode::kInvalidArgument : StatusCode::kInternal;
      TESSERA_FAIL(code) << "JIT compile of '" << request.name << "': name expression '" << expr
                         << "' has no lowered name (" << nvrtcGetErrorString(r) << ")";
    }
    result.lowered_names.push_back(LoweredName{expr, lowered});
  }
  return result;
}

}  // namespace jit
}  // namespace tessera
