// JIT layer (docs/design.md §7): NVRTC compilation of the real kernel headers, the on-disk kernel cache
// (hits, corruption, cross-process locking) and user-snippet error reporting. NVRTC runs on the
// CPU, so everything here except the module-loading test runs without a GPU.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/jit/arch.h"
#include "src/jit/embedded_headers.h"
#include "src/jit/kernel_cache.h"
#include "src/jit/module_loader.h"
#include "src/jit/nvrtc_compiler.h"
#include "src/jit/sha256.h"
#include "tessera/error.h"

extern char** environ;

namespace tessera {
namespace jit {
namespace {

// ---- helpers ---------------------------------------------------------------------------------

/// A fresh directory under /tmp, removed (with its contents) at the end of the test.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/tessera-jit-test-XXXXXX";
    const char* p = ::mkdtemp(pattern);
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

/// The names in `dir` that do not start with a dot, sorted.
std::vector<std::string> list_names(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// The source tree, from CMake: __FILE__ may be relative (a compiler launcher such as ccache with
/// base_dir rewrites it), which would make the test depend on its working directory.
std::string source_root() { return std::string(TESSERA_SOURCE_DIR) + "/"; }

/// A small kernel for the cache tests: it includes one kernel header (so the embedded headers
/// and the toolkit include path are exercised) and carries `salt` so each test can make a source
/// no cache has seen.
CompileRequest tiny_request(const std::string& arch, const std::string& salt = "0") {
  CompileRequest r;
  r.name = "tiny";
  r.arch = arch;
  r.source = generated_only(
      "#include \"kernels/common/platform.cuh\"\n"
      "// salt " + salt + "\n"
      "template <int N>\n"
      "__global__ void tiny_kernel(float* x) { x[threadIdx.x] += N * tessera::kernels::kWarpSize; }\n");
  r.name_expressions = {"&tiny_kernel<3>"};
  return r;
}

/// The SM number an ELF CUBIN was built for. CUDA 12.8+ keeps it in bits 8-15 of e_flags, older
/// toolkits in bits 0-7; accept either.
bool cubin_is_for_sm(const std::vector<char>& cubin, int sm) {
  if (cubin.size() < 52) return false;
  uint32_t flags = 0;
  std::memcpy(&flags, cubin.data() + 48, 4);  // e_flags of a 64-bit ELF header
  return ((flags >> 8) & 0xff) == static_cast<uint32_t>(sm) || (flags & 0xff) == static_cast<uint32_t>(sm);
}

bool is_cuda_elf(const std::vector<char>& cubin) {
  if (cubin.size() < 64 || std::memcmp(cubin.data(), "\x7f" "ELF", 4) != 0) return false;
  uint16_t machine = 0;
  std::memcpy(&machine, cubin.data() + 18, 2);
  return machine == 190;  // EM_CUDA
}

bool contains(const std::vector<char>& bytes, const std::string& s) {
  return std::search(bytes.begin(), bytes.end(), s.begin(), s.end()) != bytes.end();
}

std::string cubin_sha(const std::vector<char>& cubin) {
  return sha256_hex(std::string_view(cubin.data(), cubin.size()));
}

// ---- SHA-256, sources, diagnostics, architectures ---------------------------------------------

// Every engine this build and CPU can run; the x86 SHA-extension engine is reported when missing.
std::vector<Sha256Engine> available_sha256_engines() {
  std::vector<Sha256Engine> engines = {Sha256Engine::kPortable};
  if (sha256_engine_available(Sha256Engine::kX86Sha)) {
    engines.push_back(Sha256Engine::kX86Sha);
  } else {
    std::printf("[ NOTE     ] no x86 SHA extensions in this build or CPU: "
                "only the portable SHA-256 engine is tested\n");
  }
  return engines;
}

TEST(JitSha256, KnownVectors) {
  for (const Sha256Engine engine : available_sha256_engines()) {
    SCOPED_TRACE(engine == Sha256Engine::kPortable ? "portable" : "x86 SHA extensions");
    const auto hex = [engine](std::string_view s) { return Sha256(engine).update(s).hex_digest(); };
    EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    // Incremental updates across block boundaries give the one-shot digest.
    std::string data;
    for (int i = 0; i < 1000; ++i) data += static_cast<char>(i * 7 + 1);
    Sha256 h(engine);
    for (size_t pos = 0; pos < data.size(); pos += 13) h.update(data.substr(pos, 13));
    EXPECT_EQ(h.hex_digest(), hex(data));
    // Fields are length-prefixed: no concatenation ambiguity.
    EXPECT_NE(Sha256(engine).field("ab").field("c").hex_digest(), Sha256(engine).field("a").field("bc").hex_digest());
  }
  EXPECT_EQ(sha256_hex("abc"), Sha256(default_sha256_engine()).update("abc").hex_digest());
}

TEST(JitSha256, EnginesAgreeOnRandomMessages) {
  const std::vector<Sha256Engine> engines = available_sha256_engines();
  std::mt19937 rng(20261125);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 200; ++n) lengths.push_back(n);  // every padding case around 1-3 blocks
  for (int i = 0; i < 20; ++i) lengths.push_back(std::uniform_int_distribution<size_t>(200, 400000)(rng));
  for (const size_t n : lengths) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const std::string reference = Sha256(Sha256Engine::kPortable).update(data).hex_digest();
    for (const Sha256Engine engine : engines) {
      // Uneven pieces: buffered partial blocks and multi-block runs both reach the engine.
      Sha256 h(engine);
      for (size_t pos = 0; pos < n;) {
        const size_t take = std::min(n - pos, std::uniform_int_distribution<size_t>(1, 300)(rng));
        h.update(data.data() + pos, take);
        pos += take;
      }
      ASSERT_EQ(h.hex_digest(), reference) << "length " << n;
    }
  }
}

TEST(JitSha256, UnavailableEngineIsANamedError) {
  if (sha256_engine_available(Sha256Engine::kX86Sha)) {
    GTEST_SKIP() << "this CPU has the x86 SHA extensions: no unavailable engine to ask for";
  }
  try {
    Sha256 h(Sha256Engine::kX86Sha);
    FAIL() << "expected tessera::Error";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), tessera::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("x86 SHA extensions"), std::string::npos) << e.what();
  }
}

TEST(JitHeaders, EveryKernelHeaderIsEmbeddedVerbatim) {
  ASSERT_GT(kNumEmbeddedHeaders, 0u);
  for (const char* name : {"kernels/common/platform.cuh", "kernels/attention/prefill.cuh",
                           "kernels/attention/decode.cuh", "kernels/attention/params.cuh"}) {
    const EmbeddedHeader* h = find_embedded_header(name);
    ASSERT_NE(h, nullptr) << name;
    EXPECT_EQ(std::string(h->text(), h->size), read_all(source_root() + name))
        << name << " differs from the source tree: rebuild (the embedding is regenerated on header changes)";
    EXPECT_EQ(h->text()[h->size], '\0');
  }
  EXPECT_EQ(find_embedded_header("kernels/nope.cuh"), nullptr);
  for (size_t i = 1; i < kNumEmbeddedHeaders; ++i) {
    EXPECT_LT(std::strcmp(kEmbeddedHeaders[i - 1].name, kEmbeddedHeaders[i].name), 0) << "sorted, unique";
  }
}

TEST(JitSource, UserSnippetKeepsItsLineNumbers) {
  const GeneratedSource s = generate_source("// one\n// two", "int a;\nint b;\n", "// after");
  EXPECT_TRUE(s.has_user_snippet);
  std::vector<std::string> lines;
  std::stringstream ss(s.text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u) << s.text;
  EXPECT_EQ(lines[2], "#line 1 \"user_snippet\"");
  EXPECT_EQ(lines[3], "int a;");
  // The restore directive names the physical number of the line after it (line 7).
  EXPECT_EQ(lines[5], "#line 7 \"generated\"");
  EXPECT_EQ(lines[6], "// after");

  const GeneratedSource plain = generate_source("a\n", "", "b\n");
  EXPECT_FALSE(plain.has_user_snippet);
  EXPECT_EQ(plain.text, "a\nb\n");
}

TEST(JitSource, ErrorSummaryNamesFileAndLine) {
  const std::string log =
      "user_snippet(3): error: expected an expression\n"
      "    int broken = ;\n"
      "                 ^\n"
      "generated(12): warning #177-D: variable \"x\" was declared but never referenced\n"
      "kernels/attention/prefill.cuh(40): catastrophic error: cannot open source file \"x.h\"\n"
      "2 errors detected in the compilation of \"generated\".\n";
  EXPECT_EQ(summarize_nvrtc_errors(log),
            "user_snippet line 3: error: expected an expression\n"
            "kernels/attention/prefill.cuh line 40: catastrophic error: cannot open source file \"x.h\"\n");
}

TEST(JitArch, ComputeCapabilityToArchitecture) {
  EXPECT_EQ(arch_for_compute_capability(8, 0), "80");
  EXPECT_EQ(arch_for_compute_capability(8, 6), "86");
  EXPECT_EQ(arch_for_compute_capability(8, 9), "89");
  EXPECT_EQ(arch_for_compute_capability(9, 0), "90a");
  EXPECT_EQ(arch_for_compute_capability(12, 0), "120");
  EXPECT_NO_THROW(check_arch("80"));
  EXPECT_NO_THROW(check_arch("90a"));
  EXPECT_NO_THROW(check_arch("100a"));
  for (const char* bad : {"", "sm_80", "8", "90aa", "9x", "1000"}) {
    try {
      check_arch(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  // A well-formed architecture NVRTC cannot target.
  try {
    compile_to_cubin(tiny_request("35"));
    ADD_FAILURE() << "sm_35 compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("sm_35"), std::string::npos) << e.what();
  }
}

TEST(JitNvrtc, OptionsAndIncludeDirs) {
  const std::vector<std::string> o = nvrtc_options("90a", {"-DFOO=1"});
  ASSERT_GE(o.size(), 5u);
  EXPECT_EQ(o[0], "--gpu-architecture=sm_90a");
  EXPECT_NE(std::find(o.begin(), o.end(), "-std=c++17"), o.end());
  EXPECT_NE(std::find(o.begin(), o.end(), "-default-device"), o.end());
  EXPECT_EQ(std::find(o.begin(), o.end(), "--use_fast_math"), o.end());
  EXPECT_EQ(o.back(), "-DFOO=1");
  const std::vector<std::string> dirs = cuda_include_dirs();
  EXPECT_TRUE(file_exists(dirs.back() + "/cuda_fp16.h")) << dirs.back();
  bool has_libcudacxx = false;
  for (const std::string& d : dirs) has_libcudacxx |= file_exists(d + "/cuda/std/cstdint");
  EXPECT_TRUE(has_libcudacxx);
  std::cout << "NVRTC " << nvrtc_version_string() << ", CUDA headers from";
  for (const std::string& d : dirs) std::cout << " " << d;
  std::cout << std::endl;

  {  // TESSERA_NVRTC_OPTIONS: whitespace-separated words after the request's own options.
    ScopedEnv extra("TESSERA_NVRTC_OPTIONS", "  --Ofast-compile=min\t-DBAR=2 ");
    const std::vector<std::string> with = nvrtc_options("90a", {"-DFOO=1"});
    ASSERT_EQ(with.size(), o.size() + 2);
    EXPECT_EQ(with[with.size() - 3], "-DFOO=1");
    EXPECT_EQ(with[with.size() - 2], "--Ofast-compile=min");
    EXPECT_EQ(with.back(), "-DBAR=2");
  }

  // The environment variable overrides the configure-time directory.
  ScopedEnv env("TESSERA_CUDA_INCLUDE_DIR", "/nonexistent/cuda/include");
  EXPECT_EQ(cuda_include_dirs(), std::vector<std::string>{"/nonexistent/cuda/include"});
  try {
    compile_to_cubin(tiny_request("80"));
    ADD_FAILURE() << "compiled without toolkit headers";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("TESSERA_CUDA_INCLUDE_DIR"), std::string::npos) << e.what();
  }
}

// ---- the real kernels through NVRTC -------------------------------------------------------------

struct RealKernel {
  const char* family;
  const char* header;
  const char* expression;
};

const RealKernel kPrefill = {
    "prefill", "kernels/attention/prefill.cuh",
    "&tessera::kernels::attention_prefill_kernel<tessera::kernels::PrefillTraits<__nv_bfloat16, 128, 64, 64, 4, 1>, "
    "tessera::kernels::KVFormatKind::kPaged, tessera::kernels::DefaultVariant, tessera::kernels::OneShotScheduler, "
    "tessera::kernels::AttentionParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, tessera::kernels::int32_t>>"};
const RealKernel kDecode = {
    "decode", "kernels/attention/decode.cuh",
    "&tessera::kernels::batch_decode_kernel<tessera::kernels::DecodeTraits<__nv_bfloat16, 128, 8, 2, 4>, "
    "tessera::kernels::KVFormatKind::kPaged, tessera::kernels::AttentionParams<__nv_bfloat16>>"};

void compile_real_kernel(const RealKernel& k, const std::string& arch, int sm) {
  CompileRequest r;
  r.name = std::string(k.family) + " bf16 d128 paged";
  r.arch = arch;
  r.source = generated_only(std::string("#include \"") + k.header + "\"\n");
  r.name_expressions = {k.expression};
  const CompileResult res = compile_to_cubin(r);
  ASSERT_FALSE(res.cubin.empty());
  EXPECT_TRUE(is_cuda_elf(res.cubin));
  EXPECT_TRUE(cubin_is_for_sm(res.cubin, sm)) << "sm_" << arch;
  ASSERT_EQ(res.lowered_names.size(), 1u);
  EXPECT_EQ(res.lowered_names[0].expression, k.expression);
  const std::string& lowered = res.lowered_names[0].lowered;
  EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << lowered;
  EXPECT_TRUE(contains(res.cubin, lowered)) << "the kernel symbol is in the CUBIN";
  std::cout << "NVRTC " << k.family << " (bf16, d128, paged) sm_" << arch << ": " << res.compile_ms << " ms, CUBIN "
            << res.cubin.size() << " bytes, " << lowered << std::endl;
}

TEST(JitNvrtc, PrefillKernelCompilesForSm80AndSm90a) {
  compile_real_kernel(kPrefill, "80", 80);
  compile_real_kernel(kPrefill, "90a", 90);
}

TEST(JitNvrtc, DecodeKernelCompilesForSm80AndSm90a) {
  compile_real_kernel(kDecode, "80", 80);
  compile_real_kernel(kDecode, "90a", 90);
}

// ---- user snippets --------------------------------------------------------------------------

GeneratedSource variant_source(const std::string& snippet, const std::string& epilogue_extra = "") {
  return generate_source("#include \"kernels/common/platform.cuh\"\n", snippet,
                         "template <typename V>\n"
                         "__global__ void user_kernel(int* out) { *out = V::kValue; }\n" +
                             epilogue_extra);
}

TEST(JitSnippet, SyntaxErrorReportsSnippetLine) {
  CompileRequest r;
  r.name = "user variant";
  r.arch = "80";
  r.source = variant_source(
      "struct UserVariant {\n"
      "  static constexpr int kValue = 1;\n"
      "  static int twice(int x) { return x + ; }\n"  // line 3
      "};\n");
  r.name_expressions = {"&user_kernel<UserVariant>"};
  try {
    compile_to_cubin(r);
    FAIL() << "compiled a syntax error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(msg.find("user_snippet line 3: error: expected an expression"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--- NVRTC log ---"), std::string::npos) << msg;
    EXPECT_NE(msg.find("user_snippet(3): error"), std::string::npos) << "raw log kept: " << msg;
    std::cout << "--- error message ---\n" << msg << "---" << std::endl;
  }

  // The same through the cache: nothing is compiled or stored, the error is not cached.
  TempDir dir;
  KernelCache cache(dir.path());
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cache.get_or_compile(r);
      FAIL() << "compiled a syntax error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("user_snippet line 3"), std::string::npos);
    }
  }
  EXPECT_EQ(cache.stats().compiles, 0u);
  EXPECT_FALSE(file_exists(cache.cubin_path("80", KernelCache::key_of(r))));
}

TEST(JitSnippet, ErrorsAfterTheSnippetKeepPhysicalLineNumbers) {
  CompileRequest r;
  r.name = "user variant";
  r.arch = "80";
  r.source = variant_source("struct UserVariant {\n  static constexpr int kValue = 1;\n};\n",
                            "int after_snippet = undefined_name;\n");
  r.name_expressions = {"&user_kernel<UserVariant>"};
  // Physical line of the bad line in the generated text.
  int line = 0, bad_line = 0;
  std::stringstream ss(r.source.text);
  for (std::string l; std::getline(ss, l);) {
    ++line;
    if (l.find("undefined_name") != std::string::npos) bad_line = line;
  }
  ASSERT_GT(bad_line, 0);
  try {
    compile_to_cubin(r);
    FAIL() << "compiled an undefined name";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("generated line " + std::to_string(bad_line) + ": error"),
              std::string::npos)
        << e.what();
  }
  // Without a user snippet, a compile error is Tessera's bug.
  r.source = generated_only("int broken = ;\n__global__ void k() {}\n");
  r.name_expressions = {"&k"};
  try {
    compile_to_cubin(r);
    FAIL() << "compiled a syntax error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("generated line 1: error"), std::string::npos) << e.what();
  }
}

// ---- kernel cache ------------------------------------------------------------------------------

TEST(JitCache, KeyCoversSourceArchOptionsAndNames) {
  const CompileRequest base = tiny_request("80");
  const std::string key = KernelCache::key_of(base);
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(KernelCache::key_of(tiny_request("80")), key) << "deterministic";
  EXPECT_NE(KernelCache::key_of(tiny_request("90a")), key);
  EXPECT_NE(KernelCache::key_of(tiny_request("80", "other salt")), key);
  CompileRequest r = base;
  r.extra_options = {"-DX=1"};
  EXPECT_NE(KernelCache::key_of(r), key);
  r = base;
  r.name_expressions.push_back("&tiny_kernel<4>");
  EXPECT_NE(KernelCache::key_of(r), key);
  r = base;
  r.name = "another display name";
  EXPECT_EQ(KernelCache::key_of(r), key) << "the display name does not change the code";
}

TEST(JitCache, MemoryHitThenDiskHitAfterRestart) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const CompileRequest r = tiny_request("80");
  const std::string key = KernelCache::key_of(r);

  KernelCache cache(dir.path());
  EXPECT_EQ(cache.dir(), dir.path());
  const auto first = cache.get_or_compile(r);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_EQ(s.memory_hits, 0u);
  EXPECT_EQ(first->key, key);
  EXPECT_TRUE(is_cuda_elf(first->cubin));
  EXPECT_FALSE(first->lowered_name("&tiny_kernel<3>").empty());
  EXPECT_THROW(first->lowered_name("&tiny_kernel<4>"), Error);
  const std::string path = dir.path() + "/80/" + key + ".cubin";
  EXPECT_EQ(first->cubin_path, path);
  EXPECT_EQ(cache.cubin_path("80", key), path);
  EXPECT_TRUE(file_exists(path));
  EXPECT_TRUE(file_exists(dir.path() + "/80/" + key + ".meta"));
  EXPECT_TRUE(file_exists(dir.path() + "/80/" + key + ".lock"));
  const std::string on_disk = read_all(path);
  EXPECT_EQ(on_disk, std::string(first->cubin.begin(), first->cubin.end())) << "the .cubin is the raw CUBIN";

  // Same process: served from memory, the disk is not read (even if the file disappears).
  ASSERT_EQ(::unlink(path.c_str()), 0);
  const auto second = cache.get_or_compile(r);
  s = cache.stats();
  EXPECT_EQ(second.get(), first.get());
  EXPECT_EQ(s.memory_hits, 1u);
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.disk_hits, 0u);
  write_all(path, on_disk);

  // A new cache object on the same directory (a restarted process): a disk hit, no compile.
  KernelCache restarted(dir.path());
  const auto third = restarted.get_or_compile(r);
  s = restarted.stats();
  EXPECT_EQ(s.disk_hits, 1u);
  EXPECT_EQ(s.compiles, 0u);
  EXPECT_EQ(s.corrupt_entries, 0u);
  EXPECT_EQ(third->cubin, first->cubin);
  EXPECT_EQ(third->lowered_names.size(), 1u);
  EXPECT_EQ(third->lowered_name("&tiny_kernel<3>"), first->lowered_name("&tiny_kernel<3>"));
  EXPECT_EQ(third->name, "tiny");

  // A different architecture is a different entry.
  KernelCache other_arch(dir.path());
  other_arch.get_or_compile(tiny_request("90a"));
  EXPECT_EQ(other_arch.stats().compiles, 1u);
  EXPECT_TRUE(file_exists(dir.path() + "/90a/" + KernelCache::key_of(tiny_request("90a")) + ".cubin"));
}

/// One entry compiled into a fresh cache directory: its files and their valid contents.
struct CompiledEntry {
  explicit CompiledEntry(const CompileRequest& request)
      : key(KernelCache::key_of(request)),
        cubin(dir.path() + "/" + request.arch + "/" + key + ".cubin"),
        meta(dir.path() + "/" + request.arch + "/" + key + ".meta") {
    KernelCache cache(dir.path());
    cache.get_or_compile(request);
    good_cubin = read_all(cubin);
    good_meta = read_all(meta);
  }
  TempDir dir;
  std::string key, cubin, meta;
  std::string good_cubin, good_meta;
};

TEST(JitCache, CorruptEntriesAreRecompiled) {
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const CompileRequest r = tiny_request("80");
  const CompiledEntry entry(r);
  const TempDir& dir = entry.dir;
  const std::string &key = entry.key, &cubin = entry.cubin, &meta = entry.meta;
  const std::string &good_cubin = entry.good_cubin, &good_meta = entry.good_meta;

  struct Damage {
    const char* what;
    std::string file;
    std::string content;
  };
  std::string flipped = good_cubin;
  flipped[flipped.size() / 2] ^= 0x40;
  std::string wrong_key_meta = good_meta;
  wrong_key_meta.replace(wrong_key_meta.find(key), 1, key[0] == '0' ? "1" : "0");
  const std::vector<Damage> damages = {
      {"empty cubin", cubin, ""},
      {"truncated cubin", cubin, good_cubin.substr(0, good_cubin.size() / 2)},
      {"cubin with bytes appended", cubin, good_cubin + std::string(100, '\0')},
      {"flipped byte in cubin", cubin, flipped},
      {"empty meta", meta, ""},
      {"truncated meta", meta, good_meta.substr(0, good_meta.size() - 10)},
      {"meta edited without its checksum", meta, wrong_key_meta},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    write_all(d.file, d.content);
    KernelCache cache(dir.path());
    const auto k = cache.get_or_compile(r);
    const CacheStats s = cache.stats();
    EXPECT_EQ(s.corrupt_entries, 1u);
    EXPECT_EQ(s.compiles, 1u);
    EXPECT_EQ(s.disk_hits, 0u);
    // Not compared with good_cubin byte for byte: NVRTC names internal-linkage symbols with a
    // module id made from the time and process id, so its output differs between compiles.
    EXPECT_TRUE(is_cuda_elf(k->cubin));
    EXPECT_EQ(k->lowered_name("&tiny_kernel<3>"), "_Z11tiny_kernelILi3EEvPf");
    EXPECT_EQ(read_all(cubin), std::string(k->cubin.begin(), k->cubin.end())) << "the entry is rewritten";
    KernelCache after(dir.path());
    EXPECT_EQ(after.get_or_compile(r)->cubin, k->cubin);
    EXPECT_EQ(after.stats().disk_hits, 1u) << "and valid again";
    EXPECT_EQ(after.stats().corrupt_entries, 0u);
  }

  // A missing .meta (e.g. a crash between the two renames) is a plain miss, not corruption.
  ASSERT_EQ(::unlink(meta.c_str()), 0);
  KernelCache cache(dir.path());
  cache.get_or_compile(r);
  EXPECT_EQ(cache.stats().corrupt_entries, 0u);
  EXPECT_EQ(cache.stats().compiles, 1u);
}

TEST(JitCache, DirectoryFromEnvironment) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  {
    ScopedEnv env("TESSERA_CACHE_DIR", dir.path().c_str());
    EXPECT_EQ(default_cache_dir(), dir.path());
    KernelCache cache;
    EXPECT_EQ(cache.dir(), dir.path());
    const CompileRequest r = tiny_request("80", "env");
    cache.get_or_compile(r);
    EXPECT_TRUE(file_exists(dir.path() + "/80/" + KernelCache::key_of(r) + ".cubin"));
  }
  {
    ScopedEnv env("TESSERA_CACHE_DIR", nullptr);
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_dir(), "/home/someone/.cache/tessera");
  }
  {
    ScopedEnv env("TESSERA_CACHE_DIR", "");
    ScopedEnv home("HOME", nullptr);
    EXPECT_EQ(default_cache_dir(), "/tmp/tessera-cache-" + std::to_string(::getuid()));
  }
}

TEST(JitCache, FirstCompileIsLoggedUnlessQuiet) {
  TempDir dir;
  KernelCache cache(dir.path());
  const CompileRequest r = tiny_request("80", "log");
  {
    ScopedEnv quiet("TESSERA_JIT_QUIET", nullptr);
    testing::internal::CaptureStderr();
    cache.get_or_compile(r);
    cache.get_or_compile(r);  // a hit: no second line
    const std::string err = testing::internal::GetCapturedStderr();
    const std::string expected_start = "tessera: JIT compiled tiny for sm_80 in ";
    EXPECT_EQ(err.rfind(expected_start, 0), 0u) << err;
    EXPECT_NE(err.find(" ms (cache " + cache.cubin_path("80", KernelCache::key_of(r)) + ")\n"), std::string::npos)
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  {
    ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
    testing::internal::CaptureStderr();
    cache.get_or_compile(tiny_request("80", "quiet"));
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  }
}

TEST(JitCache, UnusableDirectoryStillCompilesInMemory) {
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  KernelCache cache("/proc/tessera-jit-test-cannot-exist");
  testing::internal::CaptureStderr();
  const auto k = cache.get_or_compile(tiny_request("80", "no disk"));
  const auto again = cache.get_or_compile(tiny_request("80", "no disk"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(is_cuda_elf(k->cubin));
  EXPECT_EQ(k->cubin_path, "");
  EXPECT_EQ(again.get(), k.get());
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().memory_hits, 1u);
  EXPECT_NE(err.find("tessera: warning: JIT disk cache: cannot create directory /proc/tessera-jit-test-cannot-exist"),
            std::string::npos)
      << err;
}

TEST(JitCache, ThreadsShareOneCompile) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  KernelCache cache(dir.path());
  const CompileRequest r = tiny_request("80", "threads");
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const CachedKernel>> got(4);
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = cache.get_or_compile(r); });
  for (std::thread& t : threads) t.join();
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.memory_hits, 3u);
  for (const auto& k : got) EXPECT_EQ(k.get(), got[0].get());
}

// ---- trust: modes, owners, planted files (docs/jit-cache.md) --------------------------------------

/// A uid other than ours: "nobody" on Debian and Ubuntu, unless that is who runs the tests.
uid_t foreign_uid() { return ::geteuid() == 65534 ? 65533 : 65534; }

std::string octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

/// Permission bits of `path` itself (not of a symbolic link's target); "missing" if absent.
std::string mode_of(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? octal(st.st_mode) : "missing";
}

/// Gives `path` (not a link's target) to foreign_uid(), as if another user had created it. False
/// where this process may not (not root): the caller then skips what needs it.
bool give_away(const std::string& path) { return ::lchown(path.c_str(), foreign_uid(), static_cast<gid_t>(-1)) == 0; }

std::string cannot_give_away(const std::string& path) {
  return "cannot chown " + path + " to uid " + std::to_string(foreign_uid()) + " (" + std::strerror(errno) +
         "): planting a file of another user needs root";
}

std::string foreign_owner_reason() {
  return "owned by uid " + std::to_string(foreign_uid()) + ", not by this process's user (uid " +
         std::to_string(::geteuid()) + ")";
}

class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

/// Sets the modification time of `path` to `seconds_ago` seconds before now.
void set_mtime(const std::string& path, time_t seconds_ago) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;  // access time: left alone
  times[1].tv_sec = ::time(nullptr) - seconds_ago;
  times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

time_t mtime_of(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mtime : 0;
}

/// An exclusive flock on `path` (created if missing), held until release() or destruction. flock
/// locks belong to an open file description, so the cache, which opens the file itself, finds it
/// held exactly as it would if another process held it.
class HeldLock {
 public:
  explicit HeldLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    locked_ = fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
  }
  ~HeldLock() { release(); }
  bool locked() const { return locked_; }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    locked_ = false;
  }

 private:
  int fd_;
  bool locked_ = false;
};

/// Every path under `dir`, relative to it, sorted (directories too).
std::vector<std::string> list_tree(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> all;
  for (const std::string& name : list_names(dir)) {
    all.push_back(prefix + name);
    struct stat st;
    if (::lstat((dir + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      for (const std::string& sub : list_tree(dir + "/" + name, prefix + name + "/")) all.push_back(sub);
    }
  }
  return all;
}

/// Compiles two kernels (and one of them again) through a new cache over `root` and checks that
/// its disk cache was refused: one warning naming `path` and `reason`, kernels compiled and kept
/// in memory only, nothing written under `root`.
void expect_disk_refused(const std::string& root, const std::string& path, const std::string& reason) {
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const std::vector<std::string> before = list_tree(root);
  KernelCache cache(root);
  testing::internal::CaptureStderr();
  const auto a = cache.get_or_compile(tiny_request("80", "refused a"));
  const auto b = cache.get_or_compile(tiny_request("90a", "refused b"));  // another <arch>/ too
  const auto a_again = cache.get_or_compile(tiny_request("80", "refused a"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "tessera: warning: JIT disk cache: refusing " + path + ": " + reason +
                     "; using the in-memory cache only (further warnings suppressed)\n");
  EXPECT_TRUE(is_cuda_elf(a->cubin));
  EXPECT_EQ(a->cubin_path, "");
  EXPECT_EQ(b->cubin_path, "");
  EXPECT_EQ(a_again.get(), a.get());
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 2u);
  EXPECT_EQ(s.memory_hits, 1u);
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_EQ(list_tree(root), before) << "nothing is written under a refused cache";
}

TEST(JitCacheTrust, DirectoriesAre0700AndFiles0600WhateverTheUmask) {
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  // 0: a creation mode of 0755/0644 would show; 0777: the owner's own bits must be set explicitly.
  for (const mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0777}}) {
    SCOPED_TRACE("umask " + octal(mask));
    TempDir dir;
    const std::string root = dir.path() + "/a/b/cache";  // three directories to create
    const CompileRequest r = tiny_request("80", "modes");
    const std::string key = KernelCache::key_of(r);
    std::shared_ptr<const CachedKernel> k;
    {
      ScopedUmask umask(mask);
      KernelCache cache(root);
      k = cache.get_or_compile(r);
    }
    EXPECT_EQ(k->cubin_path, root + "/80/" + key + ".cubin") << "written to disk";
    for (const std::string& d : {dir.path() + "/a", dir.path() + "/a/b", root, root + "/80"}) {
      EXPECT_EQ(mode_of(d), "0700") << d;
    }
    for (const char* ext : {".cubin", ".meta", ".lock"}) {
      EXPECT_EQ(mode_of(root + "/80/" + key + ext), "0600") << ext;
    }
    KernelCache again(root);
    again.get_or_compile(r);
    EXPECT_EQ(again.stats().disk_hits, 1u) << "and loadable";
  }
}

TEST(JitCacheTrust, RootOwnedByAnotherUserIsRefused) {
  TempDir dir;  // 0700 and ours: the refusal below is about the cache root alone
  const std::string root = dir.path() + "/cache";
  ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
  if (!give_away(root)) GTEST_SKIP() << cannot_give_away(root);
  expect_disk_refused(root, root, foreign_owner_reason());
}

TEST(JitCacheTrust, RootWritableByGroupOrOthersIsRefused) {
  TempDir dir;
  const std::vector<std::pair<mode_t, std::string>> modes = {
      {0770, "group"}, {0707, "others"}, {0777, "group and others"}, {01777, "group and others"}};
  for (size_t i = 0; i < modes.size(); ++i) {
    const mode_t mode = modes[i].first;
    SCOPED_TRACE(octal(mode));
    const std::string root = dir.path() + "/cache" + std::to_string(i);
    ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(root.c_str(), mode), 0);
    expect_disk_refused(root, root, "writable by " + modes[i].second + " (mode " + octal(mode) + ")");
  }
}

TEST(JitCacheTrust, ArchDirectoryOwnedByAnotherUserIsRefused) {
  TempDir dir;
  const std::string arch_dir = dir.path() + "/80";
  ASSERT_EQ(::mkdir(arch_dir.c_str(), 0700), 0);
  if (!give_away(arch_dir)) GTEST_SKIP() << cannot_give_away(arch_dir);
  // Refused for every architecture, not only for 80: someone else could write in the root once.
  expect_disk_refused(dir.path(), arch_dir, foreign_owner_reason());
}

TEST(JitCacheTrust, ArchDirectoryWritableByOthersOrLinkedIsRefused) {
  {
    TempDir dir;
    const std::string arch_dir = dir.path() + "/80";
    ASSERT_EQ(::mkdir(arch_dir.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(arch_dir.c_str(), 0775), 0);
    expect_disk_refused(dir.path(), arch_dir, "writable by group (mode 0775)");
  }
  {
    // A link to a directory of ours that the cache did not choose.
    TempDir dir, elsewhere;
    const std::string arch_dir = dir.path() + "/80";
    ASSERT_EQ(::symlink(elsewhere.path().c_str(), arch_dir.c_str()), 0);
    expect_disk_refused(dir.path(), arch_dir, "a symbolic link or not a directory");
    EXPECT_EQ(list_names(elsewhere.path()), std::vector<std::string>{});
  }
}

TEST(JitCacheTrust, PlantedEntryWithWrongOwnerOrModeIsNotLoaded) {
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const CompileRequest r = tiny_request("80", "planted");
  // Every plant below is byte for byte a valid entry with a consistent .meta: only who could
  // have written it differs.
  const CompiledEntry entry(r);
  const TempDir& dir = entry.dir;
  const std::string &cubin = entry.cubin, &meta = entry.meta;
  const std::string &good_cubin = entry.good_cubin, &good_meta = entry.good_meta;
  const std::string copy = dir.path() + "/copy.cubin";
  write_all(copy, good_cubin);
  ASSERT_EQ(::chmod(copy.c_str(), 0600), 0);

  struct Plant {
    const char* what;
    std::string file;
    std::function<bool()> apply;  // false: could not plant it (not root)
    std::string reason;
  };
  const std::vector<Plant> plants = {
      {"cubin writable by group and others", cubin, [&] { return ::chmod(cubin.c_str(), 0666) == 0; },
       "writable by group and others (mode 0666)"},
      {"cubin writable by group", cubin, [&] { return ::chmod(cubin.c_str(), 0620) == 0; },
       "writable by group (mode 0620)"},
      {"meta writable by others", meta, [&] { return ::chmod(meta.c_str(), 0602) == 0; },
       "writable by others (mode 0602)"},
      {"cubin a symbolic link to a valid copy", cubin,
       [&] { return ::unlink(cubin.c_str()) == 0 && ::symlink(copy.c_str(), cubin.c_str()) == 0; },
       "a symbolic link"},
      {"cubin owned by another user", cubin, [&] { return give_away(cubin); }, foreign_owner_reason()},
      {"meta owned by another user", meta, [&] { return give_away(meta); }, foreign_owner_reason()},
  };
  std::vector<std::string> skipped;
  for (const Plant& p : plants) {
    SCOPED_TRACE(p.what);
    // A valid private entry, then the plant.
    for (const auto& [path, content] : {std::make_pair(cubin, good_cubin), std::make_pair(meta, good_meta)}) {
      ::unlink(path.c_str());
      write_all(path, content);
      ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    }
    if (!p.apply()) {
      skipped.push_back(std::string(p.what) + ": " + cannot_give_away(p.file));
      continue;
    }
    KernelCache cache(dir.path());
    testing::internal::CaptureStderr();
    const auto k = cache.get_or_compile(r);
    const std::string err = testing::internal::GetCapturedStderr();
    const CacheStats s = cache.stats();
    EXPECT_EQ(s.disk_hits, 0u) << "the planted entry was loaded";
    EXPECT_EQ(s.compiles, 1u);
    EXPECT_EQ(s.untrusted_entries, 1u);
    EXPECT_EQ(s.corrupt_entries, 0u);
    EXPECT_EQ(err, "tessera: warning: JIT disk cache: not loading " + p.file + ": " + p.reason +
                       "; compiling the kernel again into a private file (further warnings suppressed)\n");
    // Replaced by private files of our own, which load again.
    for (const std::string& path : {cubin, meta}) {
      struct stat st;
      ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
      EXPECT_TRUE(S_ISREG(st.st_mode)) << path;
      EXPECT_EQ(st.st_uid, ::geteuid()) << path;
      EXPECT_EQ(octal(st.st_mode), "0600") << path;
    }
    EXPECT_EQ(read_all(cubin), std::string(k->cubin.begin(), k->cubin.end()));
    KernelCache after(dir.path());
    after.get_or_compile(r);
    EXPECT_EQ(after.stats().disk_hits, 1u);
    EXPECT_EQ(after.stats().untrusted_entries, 0u);
  }
  EXPECT_EQ(read_all(copy), good_cubin) << "the link's target is not written through";
  if (!skipped.empty()) {
    std::string all;
    for (const std::string& s : skipped) all += "\n  " + s;
    GTEST_SKIP() << "the mode and link cases passed; skipped:" << all;
  }
}

// ---- lock timeout, limits from the environment ---------------------------------------------------

TEST(JitCacheLock, WaitGivesUpAfterTheTimeoutWithANamedError) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const CompileRequest r = tiny_request("80", "lock timeout");
  const std::string key = KernelCache::key_of(r);
  ASSERT_EQ(::mkdir((dir.path() + "/80").c_str(), 0700), 0);
  const std::string lock_path = dir.path() + "/80/" + key + ".lock";
  HeldLock held(lock_path);  // as a process stuck while compiling this kernel would
  ASSERT_TRUE(held.locked());
  ScopedEnv timeout("TESSERA_CACHE_LOCK_TIMEOUT_MS", "300");

  KernelCache cache(dir.path());
  // On a thread, so that a wait that never ends fails this test instead of hanging it.
  std::promise<std::string> outcome;
  std::future<std::string> result = outcome.get_future();
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    try {
      cache.get_or_compile(r);
      outcome.set_value("compiled");
    } catch (const Error& e) {
      outcome.set_value(std::string(status_code_name(e.code())) + ": " + e.what());
    }
  });
  const bool gave_up = result.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  held.release();  // lets a waiter that never gave up finish, so that it can be joined
  waiter.join();
  ASSERT_TRUE(gave_up) << "still waiting for the lock after 20 s; then: " << result.get();
  const std::string got = result.get();
  EXPECT_EQ(got.rfind("internal: JIT cache lock timeout: " + lock_path +
                          " was held by another process for 300 ms (TESSERA_CACHE_LOCK_TIMEOUT_MS)",
                      0),
            0u)
      << got;
  EXPECT_GE(waited_ms, 300.0);
  EXPECT_LT(waited_ms, 10000.0);
  EXPECT_EQ(cache.stats().lock_waits, 1u);
  EXPECT_EQ(cache.stats().compiles, 0u);

  // The timeout is not cached: with the lock free, the same call compiles and writes the entry.
  const auto k = cache.get_or_compile(r);
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(k->cubin_path, cache.cubin_path("80", key));
}

TEST(JitCacheEnv, LimitsDefaultsAndSuffixes) {
  {
    ScopedEnv max("TESSERA_CACHE_MAX_BYTES", nullptr);
    ScopedEnv timeout("TESSERA_CACHE_LOCK_TIMEOUT_MS", nullptr);
    EXPECT_EQ(cache_max_bytes(), int64_t{2} << 30);
    EXPECT_EQ(cache_lock_timeout_ms(), 60000);
  }
  {
    ScopedEnv max("TESSERA_CACHE_MAX_BYTES", "");
    ScopedEnv timeout("TESSERA_CACHE_LOCK_TIMEOUT_MS", "");
    EXPECT_EQ(cache_max_bytes(), kDefaultCacheMaxBytes) << "empty means unset";
    EXPECT_EQ(cache_lock_timeout_ms(), kDefaultCacheLockTimeoutMs);
  }
  const std::vector<std::pair<const char*, int64_t>> sizes = {
      {"1", 1}, {"12345", 12345}, {"4K", 4096}, {"3M", 3 << 20}, {"2G", int64_t{2} << 30}, {"1T", int64_t{1} << 40}};
  for (const auto& [text, bytes] : sizes) {
    ScopedEnv max("TESSERA_CACHE_MAX_BYTES", text);
    EXPECT_EQ(cache_max_bytes(), bytes) << text;
  }
  for (const auto& [text, ms] : std::vector<std::pair<const char*, int64_t>>{{"0", 0}, {"250", 250}}) {
    ScopedEnv timeout("TESSERA_CACHE_LOCK_TIMEOUT_MS", text);
    EXPECT_EQ(cache_lock_timeout_ms(), ms) << text;
  }
}

TEST(JitCacheEnv, MalformedLimitsAreRejectedByName) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"TESSERA_CACHE_MAX_BYTES", "lots"},
      {"TESSERA_CACHE_MAX_BYTES", "0"},
      {"TESSERA_CACHE_MAX_BYTES", "-1"},
      {"TESSERA_CACHE_MAX_BYTES", " 12"},
      {"TESSERA_CACHE_MAX_BYTES", "1.5G"},
      {"TESSERA_CACHE_MAX_BYTES", "4KB"},
      {"TESSERA_CACHE_MAX_BYTES", "4k"},
      {"TESSERA_CACHE_MAX_BYTES", "9223372036854775808"},  // INT64_MAX + 1
      {"TESSERA_CACHE_MAX_BYTES", "9000000000G"},          // overflows once scaled
      {"TESSERA_CACHE_LOCK_TIMEOUT_MS", "-1"},
      {"TESSERA_CACHE_LOCK_TIMEOUT_MS", "soon"},
      {"TESSERA_CACHE_LOCK_TIMEOUT_MS", "5s"},
      {"TESSERA_CACHE_LOCK_TIMEOUT_MS", "1e3"},
  };
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(std::string(name) + "=" + value);
    ScopedEnv env(name, value);
    KernelCache cache(dir.path());
    try {
      cache.get_or_compile(tiny_request("80", "malformed limit"));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()).rfind(std::string(name) + " = '" + value + "', expected ", 0), 0u) << e.what();
    }
    EXPECT_EQ(cache.stats().compiles, 0u) << "rejected before compiling";
  }
}

// ---- size cap and cleanup ------------------------------------------------------------------------

TEST(JitCacheEviction, LeastRecentlyUsedEntriesGoFirstAndLockedOnesStay) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const std::string root = dir.path();
  auto request = [](const std::string& name) { return tiny_request("80", "evict " + name); };
  auto path = [&](const std::string& name, const char* ext) {
    return root + "/80/" + KernelCache::key_of(request(name)) + ext;
  };
  auto bytes = [&](const std::string& name) {
    return static_cast<int64_t>(read_all(path(name, ".cubin")).size() + read_all(path(name, ".meta")).size());
  };
  auto set_used = [&](const std::string& name, time_t seconds_ago) {
    set_mtime(path(name, ".cubin"), seconds_ago);
    set_mtime(path(name, ".meta"), seconds_ago);
  };
  // "kept": all three files; "evicted": none of them.
  auto state = [&](const std::string& name) {
    const int n = file_exists(path(name, ".cubin")) + file_exists(path(name, ".meta")) +
                  file_exists(path(name, ".lock"));
    return n == 3 ? "kept" : n == 0 ? "evicted" : "partly there";
  };
  auto compile = [&](const std::string& name, const std::string& max_bytes) {
    ScopedEnv cap("TESSERA_CACHE_MAX_BYTES", max_bytes.c_str());
    KernelCache cache(root);
    cache.get_or_compile(request(name));
    return cache.stats();
  };

  for (const char* name : {"a", "b", "c"}) compile(name, "");
  const int64_t entry = std::max({bytes("a"), bytes("b"), bytes("c")});
  std::cout << "entry size " << entry << " bytes" << std::endl;
  set_used("a", 300);
  set_used("b", 200);
  set_used("c", 100);
  // A disk hit makes A the most recently used, whatever the file system's atime policy.
  EXPECT_EQ(compile("a", "").disk_hits, 1u);
  EXPECT_GT(mtime_of(path("a", ".cubin")), ::time(nullptr) - 60);

  // Room for three entries: writing D evicts B, the least recently used, and nothing else.
  EXPECT_EQ(compile("d", std::to_string(3 * entry + entry / 2)).evictions, 1u);
  EXPECT_STREQ(state("a"), "kept");
  EXPECT_STREQ(state("b"), "evicted");
  EXPECT_STREQ(state("c"), "kept");
  EXPECT_STREQ(state("d"), "kept");

  // C is now the least recently used but locked (being compiled or evicted elsewhere): room for
  // two entries means evicting A and D, the next ones, and keeping C and the new E.
  set_used("a", 50);
  set_used("c", 1000);
  set_used("d", 40);
  {
    HeldLock c_lock(path("c", ".lock"));
    ASSERT_TRUE(c_lock.locked());
    EXPECT_EQ(compile("e", std::to_string(2 * entry + entry / 2)).evictions, 2u);
  }
  EXPECT_STREQ(state("a"), "evicted");
  EXPECT_STREQ(state("c"), "kept");
  EXPECT_STREQ(state("d"), "evicted");
  EXPECT_STREQ(state("e"), "kept");

  // A cap below one entry keeps the entry just written and nothing else.
  EXPECT_EQ(compile("f", "1").evictions, 2u);
  EXPECT_STREQ(state("c"), "evicted");
  EXPECT_STREQ(state("e"), "evicted");
  EXPECT_STREQ(state("f"), "kept");
  EXPECT_EQ(list_names(root + "/80").size(), 3u);
}

TEST(JitCacheCleanup, StaleTemporariesAndUnheldOrphanLocksAreRemoved) {
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  const std::string arch_dir = dir.path() + "/80";
  const CompileRequest first = tiny_request("80", "cleanup first");
  {
    KernelCache cache(dir.path());
    cache.get_or_compile(first);
  }
  // A user snippet that does not compile leaves the lock it compiled under, and no entry.
  CompileRequest broken;
  broken.name = "broken variant";
  broken.arch = "80";
  broken.source = variant_source("struct UserVariant { static constexpr int kValue = ; };\n");
  broken.name_expressions = {"&user_kernel<UserVariant>"};
  {
    KernelCache cache(dir.path());
    EXPECT_THROW(cache.get_or_compile(broken), Error);
  }
  const std::string broken_lock = arch_dir + "/" + KernelCache::key_of(broken) + ".lock";
  const std::string a(64, 'a'), b(64, 'b'), c(64, 'c');
  const std::string old_cubin_tmp = arch_dir + "/" + a + ".cubin.tmp.99999.0";  // a crashed writer's
  const std::string old_meta_tmp = arch_dir + "/" + a + ".meta.tmp.99999.1";
  const std::string fresh_tmp = arch_dir + "/" + b + ".meta.tmp.99999.2";  // a writer at work
  const std::string orphan_lock = arch_dir + "/" + c + ".lock";
  const std::string held_lock = arch_dir + "/" + b + ".lock";  // its compile is under way
  const std::string foreign_name = arch_dir + "/notes.txt";   // not a cache file: left alone
  for (const std::string& f : {old_cubin_tmp, old_meta_tmp, fresh_tmp, orphan_lock, foreign_name}) write_all(f, "x");
  set_mtime(old_cubin_tmp, 3600);
  set_mtime(old_meta_tmp, 11 * 60);
  set_mtime(foreign_name, 3600);
  EXPECT_TRUE(file_exists(broken_lock));
  HeldLock held(held_lock);
  ASSERT_TRUE(held.locked());

  const CompileRequest second = tiny_request("80", "cleanup second");
  {
    KernelCache cache(dir.path());
    cache.get_or_compile(second);
    EXPECT_EQ(cache.stats().evictions, 0u) << "cleaning is not evicting";
  }
  std::vector<std::string> expected = {fresh_tmp, held_lock, foreign_name};
  for (const CompileRequest* r : {&first, &second}) {
    for (const char* ext : {".cubin", ".meta", ".lock"}) {
      expected.push_back(arch_dir + "/" + KernelCache::key_of(*r) + ext);
    }
  }
  std::vector<std::string> present;
  for (const std::string& name : list_names(arch_dir)) present.push_back(arch_dir + "/" + name);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(present, expected);
}

// ---- two processes, one cache directory ---------------------------------------------------------

constexpr const char* kWorkerEnv = "TESSERA_JIT_TEST_WORKER";  // "<cache dir>|<salt>|<out file>|<go file>"

/// Not a test of its own: the body of each process TwoProcessesCompileOnce starts. It waits for
/// the go file, compiles through the shared cache and writes its statistics and CUBIN hash.
TEST(JitCacheConcurrency, Worker) {
  const char* spec = std::getenv(kWorkerEnv);
  if (spec == nullptr) GTEST_SKIP() << "runs only as a child of JitCacheConcurrency.TwoProcessesCompileOnce";
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, '|');) parts.push_back(part);
  ASSERT_EQ(parts.size(), 4u) << spec;
  write_all(parts[2] + ".ready", "");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!file_exists(parts[3])) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no go signal";
    ::usleep(200);
  }
  KernelCache cache(parts[0]);
  const auto k = cache.get_or_compile(tiny_request("80", parts[1]));
  const CacheStats s = cache.stats();
  write_all(parts[2] + ".tmp", std::to_string(s.compiles) + " " + std::to_string(s.disk_hits) + " " +
                                   std::to_string(s.lock_waits) + " " + cubin_sha(k->cubin) + "\n");
  ASSERT_EQ(::rename((parts[2] + ".tmp").c_str(), parts[2].c_str()), 0);
}

/// Starts this test binary as a Worker; its output goes to `log`.
pid_t spawn_worker(const std::string& spec, const std::string& log) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kWorkerEnv, std::strlen(kWorkerEnv)) != 0) env_strings.push_back(*e);
  }
  env_strings.push_back(std::string(kWorkerEnv) + "=" + spec);
  env_strings.push_back("TESSERA_JIT_QUIET=1");
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = "jit_tests", arg1 = "--gtest_filter=JitCacheConcurrency.Worker";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

TEST(JitCacheConcurrency, TwoProcessesCompileOnce) {
  TempDir dir;
  const std::string cache_dir = dir.path() + "/cache";  // does not exist yet: both create it
  std::random_device rd;
  const std::string salt = std::to_string(rd()) + "-" + std::to_string(::getpid());
  const std::string go = dir.path() + "/go";
  std::vector<std::string> outs;
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(dir.path() + "/worker" + std::to_string(i));
    const pid_t pid = spawn_worker(cache_dir + "|" + salt + "|" + outs.back() + "|" + go, outs.back() + ".log");
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  // Release both at once, after both have started, so that they really race for the entry.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(file_exists(outs[0] + ".ready") && file_exists(outs[1] + ".ready")) &&
         std::chrono::steady_clock::now() < deadline) {
    ::usleep(500);
  }
  write_all(go, "");
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << i << " failed, status " << status << ", output:\n" << read_all(outs[i] + ".log");
  }
  uint64_t total_compiles = 0, total_disk_hits = 0, total_waits = 0;
  std::vector<std::string> shas;
  for (const std::string& out : outs) {
    std::stringstream in(read_all(out));
    uint64_t compiles = 0, disk_hits = 0, waits = 0;
    std::string sha;
    ASSERT_TRUE(in >> compiles >> disk_hits >> waits >> sha) << out;
    total_compiles += compiles;
    total_disk_hits += disk_hits;
    total_waits += waits;
    shas.push_back(sha);
  }
  EXPECT_EQ(total_compiles, 1u) << "the lock lets exactly one process compile";
  EXPECT_EQ(total_disk_hits, 1u) << "the other loads the entry";
  EXPECT_EQ(shas[0], shas[1]) << "identical CUBINs";
  const std::string key = KernelCache::key_of(tiny_request("80", salt));
  EXPECT_EQ(sha256_hex(read_all(cache_dir + "/80/" + key + ".cubin")), shas[0]);
  std::cout << "two processes: " << total_compiles << " compile, " << total_disk_hits << " disk hit, "
            << total_waits << " lock wait(s)" << std::endl;
  // Exactly the entry's files, no temporary files left behind.
  EXPECT_EQ(list_names(cache_dir + "/80"), (std::vector<std::string>{key + ".cubin", key + ".lock", key + ".meta"}));
}

// ---- GPU-only parts ------------------------------------------------------------------------------

bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

TEST(JitModuleLoader, LoadsOnGpuAndFailsCleanlyWithout) {
  if (!have_gpu()) {
    EXPECT_THROW(current_device_arch(), Error);
    TempDir dir;
    ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
    KernelCache cache(dir.path());
    const auto k = cache.get_or_compile(tiny_request("80"));
    try {
      get_function(*k, "&tiny_kernel<3>");
      ADD_FAILURE() << "loaded a module without a GPU";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kCudaError) << e.what();
      std::cout << "no GPU: " << e.what() << std::endl;
    }
    return;
  }
  const std::string arch = current_device_arch();
  TempDir dir;
  ScopedEnv quiet("TESSERA_JIT_QUIET", "1");
  KernelCache cache(dir.path());
  const auto k = cache.get_or_compile(tiny_request(arch));
  CUfunction f = get_function(*k, "&tiny_kernel<3>");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(load_module(*k), load_module(*k)) << "loaded once per context";
}

}  // namespace
}  // namespace jit
}  // namespace tessera
